//! [`simulate`]: one replay. Set-up (checks, the stage grouping, the
//! threads' streams and how many instructions to replay) and the replay
//! loop: the next core runs its thread for one slice in chunks, between
//! which come the warm-up, the policy periods and, at stage changes, the
//! migration decisions (with the min-visit variant's rule) and, under a
//! temporal visit policy, the yields ([`super::temporal`]).

use std::time::Instant;

use crate::cache::Cache;
use crate::groups::StageGroups;
use crate::stream::{ev_instrs, Trace, EV_FETCH};

use super::account::Account;
use super::chunk::{run_chunk, visit_ahead, Stop};
use super::coherence::Coherence;
use super::plans::Plans;
use super::sched::{Sched, SliceEnd, Source};
use super::temporal::{steal_cohort, Temporal, MAX_VISIT_STAGES};
use super::{Counters, SimConfig, SimPolicy, SimResult, VisitPolicy, VisitRule, HISTORY_WEIGHT};

/// Replays `trace` under `cfg`; `progress` is called with instructions
/// replayed since its previous call (about every 2^20 instructions).
pub fn simulate(
    trace: &Trace,
    cfg: &SimConfig,
    progress: &mut dyn FnMut(u64),
) -> anyhow::Result<SimResult> {
    let started = Instant::now();
    let mut r = Replay::new(trace, cfg)?;
    r.run(progress);
    let mut result = r.acct.finish(
        cfg,
        &r.groups,
        trace.threads.len(),
        &r.sched.cores,
        r.plans.as_ref(),
        started,
    );
    result.blocks = r.blocks;
    Ok(result)
}

/// Checks `cfg`'s parameters.
fn validate(cfg: &SimConfig) -> anyhow::Result<()> {
    let n = cfg.cores;
    anyhow::ensure!((1..=64).contains(&n), "cores = {n}: must be 1..=64");
    anyhow::ensure!(
        cfg.policy != SimPolicy::Captured || n == 1,
        "cores = {n}: the captured schedule runs on 1 core (the traced run's)"
    );
    anyhow::ensure!(cfg.repeat >= 1, "repeat = 0: must be ≥ 1");
    anyhow::ensure!(
        cfg.policy != SimPolicy::Captured || cfg.repeat == 1,
        "repeat = {}: the captured schedule is replayed once",
        cfg.repeat
    );
    anyhow::ensure!(cfg.slice >= 1, "slice = 0: must be ≥ 1 instruction");
    anyhow::ensure!(
        (0.0..100.0).contains(&cfg.warmup_pct),
        "warm-up = {} %: must be in [0, 100)",
        cfg.warmup_pct
    );
    anyhow::ensure!(
        cfg.period >= 1,
        "policy period = 0: must be ≥ 1 instruction"
    );
    anyhow::ensure!(
        cfg.model.transfer == 0.0 || cfg.model.transfer >= cfg.model.l3_hit,
        "transfer = {} cycles: must be 0 (off) or ≥ the L3 hit's {} cycles",
        cfg.model.transfer,
        cfg.model.l3_hit
    );
    cfg.caches.validate()?;
    Ok(())
}

/// The grouping a replay uses: `cfg.groups` or the trace's own stages.
fn grouping(trace: &Trace, cfg: &SimConfig) -> anyhow::Result<StageGroups> {
    Ok(match &cfg.groups {
        Some(g) => {
            anyhow::ensure!(
                g.map.len() == trace.stages.len(),
                "stage grouping for {} stages, trace has {}",
                g.map.len(),
                trace.stages.len()
            );
            g.clone()
        }
        None => StageGroups::identity(&trace.stages),
    })
}

/// Each thread's stream end (the whole stream, or its first
/// `thread_prefix` part) and the instructions in those streams.
fn stream_ends(trace: &Trace, cfg: &SimConfig) -> (Vec<usize>, u64) {
    let ends: Vec<usize> = trace
        .threads
        .iter()
        .map(|th| match cfg.thread_prefix {
            Some(f) => ((th.events.len() as f64 * f.clamp(0.0, 1.0)) as usize).min(th.events.len()),
            None => th.events.len(),
        })
        .collect();
    let instrs = match cfg.thread_prefix {
        Some(_) => trace
            .threads
            .iter()
            .zip(&ends)
            .map(|(th, e)| {
                th.events[..*e]
                    .iter()
                    .filter(|ev| *ev >> 62 == EV_FETCH)
                    .map(|ev| ev_instrs(*ev))
                    .sum::<u64>()
            })
            .sum(),
        None => trace.instrs,
    };
    (ends, instrs.saturating_mul(u64::from(cfg.repeat.max(1))))
}

/// The state of one replay.
pub(super) struct Replay<'a> {
    trace: &'a Trace,
    cfg: &'a SimConfig,
    groups: StageGroups,
    /// Trace stage (dense, "no stage" last) → group ("no group" last).
    lookup: Vec<usize>,
    /// The "no stage" group index.
    none: usize,
    /// log2 of the line size.
    shift: u32,
    /// Per thread, the end of the events it replays.
    ends: Vec<usize>,
    sched: Sched,
    l3: Option<Cache>,
    /// The cross-core transfer model, when [`super::CycleModel::transfer`] > 0.
    coh: Option<Coherence>,
    /// The staged policies' plans (`None`: baseline, pinned).
    plans: Option<Plans>,
    /// Idle stealing on (staged policies, and `pinned`).
    steal: bool,
    /// `pinned` with stealing: every core serves every stage.
    all_serve: Vec<u64>,
    /// Temporal staging: every core's visit order ([`SimConfig::temporal`]).
    pub(super) temporal: Option<Temporal>,
    acct: Account,
    /// Min-visit variant, history rule: per group, the weighted mean visit.
    visit_mean: Vec<Option<f64>>,
    /// xorshift64 state (slice jitter, think times).
    rng: u64,
    /// Times a thread blocked ([`super::BlockRule`]).
    blocks: u64,
    /// Tests: per thread, the event positions where its slices ended.
    #[cfg(test)]
    pub(super) slice_ends: Vec<Vec<usize>>,
}

impl<'a> Replay<'a> {
    pub(super) fn new(trace: &'a Trace, cfg: &'a SimConfig) -> anyhow::Result<Self> {
        validate(cfg)?;
        let n = cfg.cores;
        let groups = grouping(trace, cfg)?;
        let lookup = groups.lookup();
        let stages = groups.len();
        let ns = stages + 1; // dense group indices plus "no stage"
        let baseline = cfg.policy == SimPolicy::Baseline;
        let sched = Sched::new(
            trace,
            &cfg.caches,
            n,
            baseline,
            stages,
            cfg.migration_latency,
        )?;
        let l3 = match cfg.caches.l3 {
            Some(g) => Some(Cache::new(g, "L3")?),
            None => None,
        };
        // The staged policies: the real host-sched code.
        let plans = match cfg.policy.host_sched_kind() {
            Some(kind) => Some(Plans::new(kind, cfg, &groups.names, n)?),
            None => None,
        };
        anyhow::ensure!(
            !cfg.temporal() || stages <= MAX_VISIT_STAGES,
            "{stages} stages (groups): a visit policy orders at most {MAX_VISIT_STAGES}"
        );
        anyhow::ensure!(
            !cfg.visit.is_temporal() || cfg.temporal(),
            "--visit {}: only with pinned, static, proportional or auto",
            cfg.visit.name()
        );
        let (ends, stream_instrs) = stream_ends(trace, cfg);
        // Instructions to replay: the whole trace, or a prefix (in replay order).
        let total = cfg.limit.map_or(stream_instrs, |l| l.min(stream_instrs));
        Ok(Self {
            trace,
            cfg,
            shift: cfg.caches.l1i.line_bytes.trailing_zeros(),
            lookup,
            none: stages,
            ends,
            sched,
            l3,
            coh: (cfg.model.transfer > 0.0).then(|| Coherence::new(n)),
            steal: cfg.steal && (plans.is_some() || cfg.policy == SimPolicy::Pinned),
            all_serve: vec![u64::MAX; ns],
            temporal: cfg.temporal().then(|| Temporal::new(n, stages, cfg.visit)),
            plans,
            acct: Account::new(n, ns, total, cfg.warmup_pct),
            visit_mean: vec![None; ns],
            groups,
            // xorshift64 needs a non-zero state.
            rng: cfg.seed.max(1),
            blocks: 0,
            #[cfg(test)]
            slice_ends: vec![Vec::new(); trace.threads.len()],
        })
    }

    /// The visit policy in force: the plan's (`auto` changes it with its
    /// mode), else the configured one.
    fn visit(&self) -> VisitPolicy {
        match (&self.temporal, &self.plans) {
            (None, _) => VisitPolicy::Fifo,
            (Some(_), Some(p)) => p.visit,
            (Some(_), None) => self.cfg.visit,
        }
    }

    /// A uniform random number in [0, 1) (xorshift64: Marsaglia, "Xorshift
    /// RNGs", J. Stat. Softw. 2003; shifts 13, 7, 17).
    fn uniform(&mut self) -> f64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next slice's length: `slice`, or drawn from
    /// `slice × [1 − j, 1 + j]` with `slice_jitter` j > 0 (≥ 1).
    pub(super) fn slice_len(&mut self) -> u64 {
        let j = self.cfg.slice_jitter;
        if j <= 0.0 {
            return self.cfg.slice;
        }
        let f = 1.0 - j + 2.0 * j * self.uniform();
        ((self.cfg.slice as f64 * f).round() as u64).max(1)
    }

    /// The replay loop: one slice of the next core's thread at a time (the
    /// captured schedule: [`Replay::run_captured`]).
    pub(super) fn run(&mut self, progress: &mut dyn FnMut(u64)) {
        if self.cfg.policy == SimPolicy::Captured {
            self.run_captured(progress);
            self.acct.flush_progress(progress);
            return;
        }
        loop {
            // `auto` under an unstaged plan steals, as the guest runtime does.
            let auto_unstaged = self.cfg.policy == SimPolicy::Auto;
            let serve = match &self.plans {
                Some(p) if self.steal || (auto_unstaged && p.unstaged()) => Some(&p.serve[..]),
                None if self.steal => Some(&self.all_serve[..]),
                _ => None,
            };
            let Some((k, mut src)) = self.sched.next(serve) else {
                break;
            };
            if self.acct.executed >= self.acct.total {
                break;
            }
            let visit = self.visit();
            // Temporal staging: the core's visitor picks among its queue.
            if let (Source::Own(i), Some(tm)) = (src, &mut self.temporal) {
                let (core, threads) = (&self.sched.cores[k], &self.sched.threads);
                let start = core.clock.max(threads[core.queue[i]].ready_at);
                if let Some(j) = tm.pick(k, visit, &core.queue, threads, start) {
                    src = Source::Own(j);
                }
            }
            let Some(t) = self.sched.take(k, src) else {
                break;
            };
            // A thread that migrated here costs this core its share when
            // it first runs here; a steal costs the thief both shares (the
            // core it was queued on did nothing).
            let arriving = std::mem::take(&mut self.sched.threads[t].arriving);
            let stolen = match src {
                Source::Steal(j, _) if visit.is_temporal() => {
                    // A cohort, not a lone thread (module docs of `temporal`).
                    let (stage, now) = (self.sched.threads[t].stage, self.sched.cores[k].clock);
                    1 + steal_cohort(
                        &mut self.sched.cores,
                        &self.sched.threads,
                        (j, k),
                        stage,
                        now,
                    )
                }
                Source::Steal(..) => 1,
                _ => 0,
            };
            let cost = if stolen > 0 {
                stolen * (self.cfg.migration_cycles + self.cfg.migration_target_cycles)
            } else if arriving {
                self.cfg.migration_target_cycles
            } else {
                0
            };
            if stolen > 0 || cost > 0 {
                let st = self.acct.at(k, self.sched.threads[t].stage);
                st.steals += stolen;
                st.migration_cycles += cost;
                self.sched.cores[k].clock += cost as f64;
            }
            let end = self.run_slice(k, t, progress);
            if let Some(tm) = &mut self.temporal {
                tm.left(k, self.sched.cores[k].clock);
            }
            #[cfg(test)]
            self.slice_ends[t].push(self.sched.threads[t].pos);
            self.sched.end_slice(k, t, end);
        }
        self.acct.flush_progress(progress);
    }

    /// The `captured` model: core 0 runs the trace's segments in file order
    /// (each thread up to where the traced run switched away), with no
    /// slices, migrations or blocking.
    fn run_captured(&mut self, progress: &mut dyn FnMut(u64)) {
        let trace = self.trace;
        for &(t, end) in &trace.schedule {
            let t = t as usize;
            let end = end.min(self.ends[t]);
            let events = &trace.threads[t].events[..end];
            self.sched.cores[0].current = Some(t);
            while self.sched.threads[t].pos < end {
                if self.acct.executed >= self.acct.total {
                    return;
                }
                let lim = self.acct.limit(u64::MAX);
                if let (Stop::Stage(raw), ..) = self.run_step(0, t, events, lim, progress) {
                    self.sched.threads[t].stage = self.lookup[raw.min(self.lookup.len() - 1)];
                }
            }
        }
    }

    /// Runs one chunk of thread `t`'s `events` on core `k`, at most `lim`
    /// instructions (up to its next stage marker), and charges it: the
    /// core's clock and the accounting (warm-up included). Returns where the
    /// chunk stopped, its counters, the stage it ran in and the cycles it
    /// charged.
    fn run_step(
        &mut self,
        k: usize,
        t: usize,
        events: &[u64],
        lim: u64,
        progress: &mut dyn FnMut(u64),
    ) -> (Stop, Counters, usize, f64) {
        let mut delta = Counters::default();
        let thread = &mut self.sched.threads[t];
        let stage = thread.stage;
        let caches = &mut self.sched.cores[k].caches;
        if let Some(coh) = &mut self.coh {
            coh.apply_pending(k, caches);
        }
        let stop = run_chunk(
            events,
            &mut thread.pos,
            lim,
            (k, caches),
            self.l3.as_mut(),
            self.coh.as_mut(),
            self.shift,
            &mut delta,
        );
        let cycles = self.cfg.model.cycles(&delta);
        self.sched.cores[k].clock += cycles;
        self.acct.record(k, stage, &delta, progress);
        self.acct.pass_warmup(&self.sched.cores);
        (stop, delta, stage, cycles)
    }

    /// Runs thread `t` on core `k` for up to one slice, in chunks that end
    /// at stage markers, the warm-up, policy periods and the replay's end.
    fn run_slice(&mut self, k: usize, t: usize, progress: &mut dyn FnMut(u64)) -> SliceEnd {
        let trace = self.trace;
        let events = &trace.threads[t].events[..self.ends[t]];
        let mut budget = self.slice_len();
        while budget > 0 {
            let mut lim = self.acct.limit(budget);
            if let Some(p) = &self.plans {
                lim = lim.min(p.next_period.saturating_sub(self.acct.executed).max(1));
            }
            let (stop, delta, stage, cycles) = self.run_step(k, t, events, lim, progress);
            let done = delta.instrs;
            self.sched.threads[t].visit += done;
            budget = budget.saturating_sub(done);
            if let Some(p) = &mut self.plans {
                p.load[stage] += done;
                p.cycles[stage] += cycles;
                if self.acct.executed >= p.next_period {
                    // The period's end in time: the cores' mean clock. One
                    // core's clock runs up to a slice ahead of or behind
                    // the others; timed by the crossing core's, every
                    // other period's rate was 2.6× the one before, which
                    // no paired test of `auto` could see through.
                    let cores = &self.sched.cores;
                    let now =
                        cores.iter().map(|c| c.clock).sum::<f64>() / cores.len().max(1) as f64;
                    p.tick(self.acct.executed, self.cfg.period, now);
                }
            }
            if self.acct.executed >= self.acct.total {
                // A prefix replay ends here (the thread keeps its core).
                break;
            }
            match stop {
                Stop::Limit => {}
                Stop::Done if self.next_lap(t) => {}
                Stop::Done => return SliceEnd::Done,
                Stop::Stage(raw) => {
                    if let Some(end) = self.stage_marker(k, t, raw, events) {
                        return end;
                    }
                }
            }
        }
        SliceEnd::Used
    }

    /// Thread `t` on core `k` consumed the marker of trace stage `raw`:
    /// notes the visit that ended and, under a staged policy, migrates the
    /// thread if its new stage is served elsewhere (unless the min-visit
    /// rule keeps it). Returns how the slice ends, if it does.
    fn stage_marker(&mut self, k: usize, t: usize, raw: usize, events: &[u64]) -> Option<SliceEnd> {
        let s = self.lookup[raw.min(self.lookup.len() - 1)];
        let th = &mut self.sched.threads[t];
        let old = th.stage;
        if s != old {
            // A marker inside one group is no stage change.
            let v = th.visit;
            if old != self.none && v > 0 {
                let m = &mut self.visit_mean[old];
                *m = Some(match *m {
                    Some(x) => x + HISTORY_WEIGHT * (v as f64 - x),
                    None => v as f64,
                });
            }
            th.visit = 0;
        }
        th.stage = s;
        let mut migrate = None;
        if s != old && s != self.none {
            if let Some(p) = &self.plans {
                if let Some(target) = self.sched.migration_target(&p.map, s, k) {
                    if !self.long_enough(s, self.sched.threads[t].pos, events) {
                        self.acct.at(k, s).kept += 1;
                    } else {
                        let cost = self.cfg.migration_cycles;
                        let st = self.acct.at(k, s);
                        st.migrations += 1;
                        st.migration_cycles += cost;
                        self.sched.cores[k].clock += cost as f64;
                        migrate = Some(target);
                    }
                }
            }
        }
        if self.sched.threads[t].pos >= events.len() && !self.next_lap(t) {
            return Some(SliceEnd::Done);
        }
        match self.cfg.block {
            // Every marker of the trace stage is an entry into it (the
            // capture writes one at each stage change).
            Some(b) if raw == b.stage => {
                self.blocks += 1;
                let delay = -(b.think_cycles as f64) * (1.0 - self.uniform()).ln();
                Some(SliceEnd::Block {
                    delay,
                    target: migrate,
                })
            }
            _ if migrate.is_some() => migrate.map(SliceEnd::Migrate),
            // Temporal staging: a stage switch that stays on this core
            // yields into the queue of the new stage, at the switch cost.
            _ if s != old && s != self.none && self.visit().is_temporal() => {
                let cost = self.cfg.switch_cycles;
                let st = self.acct.at(k, s);
                st.switches += 1;
                st.switch_cycles += cost;
                self.sched.cores[k].clock += cost as f64;
                Some(SliceEnd::Yield)
            }
            _ => None,
        }
    }

    /// Thread `t`'s stream ended: starts it again from the beginning if it
    /// has laps left ([`SimConfig::repeat`]); whether it did.
    fn next_lap(&mut self, t: usize) -> bool {
        let th = &mut self.sched.threads[t];
        if th.laps + 1 >= self.cfg.repeat {
            return false;
        }
        th.laps += 1;
        th.pos = 0;
        true
    }

    /// The min-visit variant: whether the visit of group `s` starting at
    /// `pos` is (expected to be) long enough to migrate for.
    fn long_enough(&self, s: usize, pos: usize, events: &[u64]) -> bool {
        let min = self.cfg.min_visit;
        min == 0
            || match self.cfg.visit_rule {
                VisitRule::Oracle => visit_ahead(events, pos, s, &self.lookup, min) >= min,
                VisitRule::History => self.visit_mean[s].is_none_or(|m| m >= min as f64),
            }
    }
}
