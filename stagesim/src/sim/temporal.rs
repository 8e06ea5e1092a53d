//! Temporal staging in the replay (issue 40): the order in which each core
//! serves the threads queued on it, by the guest agent's own
//! [`Visitor`] — the code the test guest's scheduler runs
//! (`images/testguest/src/staged/runtime.rs`, `pick`), so each scheduling
//! decision is taken in one place and the simulator runs the same code.
//!
//! Model (as the test guest, docs/design.md "Temporal staging"): under a
//! temporal visit policy a thread yields at every stage switch into its
//! core's queue for the stage it enters, and the core pays the switch cost
//! ([`super::SimConfig::switch_cycles`]). When a core takes a thread from
//! its own queue, threads outside every stage (new ones) come first; else
//! the core's [`Visitor`] picks a stage from the lengths of its per-stage
//! queues (threads that have arrived by then) and the core takes that
//! stage's earliest-arrived thread. When the thread leaves the core, the
//! visitor learns how long it ran ([`Visitor::served`], cycles where the
//! guest gives TSC ticks). Color has no polling order: each core serves its
//! queue in arrival order, stage-tagged (the guest's shared queue under an
//! unstaged map is approximated by per-core queues with idle stealing).
//! An idle core that steals under a temporal policy also takes up to half
//! of the victim's other arrived threads of the stolen thread's stage (the
//! guest's rule: a lone stolen thread would visit alone, a cohort of one).
//! Not modelled: the guest's periodic rebalancing of busy vCPUs (every 64
//! picks; here only idle cores steal).

use std::collections::VecDeque;

use guest_agent::visit::Visitor;
use guest_agent::VisitPolicy;

use super::sched::{Core, ThreadState};
use super::{SimConfig, SimPolicy};

/// Stages a [`Visitor`] orders (`hypercall_abi::stage::MAX_STAGES`, the
/// guest agent's stage-map capacity; the visitor ignores stages past it).
pub const MAX_VISIT_STAGES: usize = 16;

/// The test unikernel's local switch, cycles: 65 ns (a thread yielding to
/// its vCPU's scheduler and the next thread resuming, `just
/// bench-migration`'s saturated mode; bench/RESULTS.md, "Migration
/// microbenchmark") at the cycle model's 2.5 GHz (`CLOCK_HZ` in `sim/plans.rs`).
pub const LOCAL_SWITCH_CYCLES: u64 = 163;

/// `auto`'s name for the mode a replay runs (host-sched's
/// `policy::auto::Mode`): `unstaged` (`pinned`, FIFO), `temporal`
/// (`pinned` with a visit policy), `spatial` (`static`/`proportional`,
/// FIFO), `both`; `baseline`, `captured` and `auto` are their own.
pub fn visit_mode(cfg: &SimConfig) -> &'static str {
    match (cfg.policy, cfg.temporal()) {
        (SimPolicy::Pinned, false) => "unstaged",
        (SimPolicy::Pinned, true) => "temporal",
        (SimPolicy::Static | SimPolicy::Proportional, false) => "spatial",
        (SimPolicy::Static | SimPolicy::Proportional, true) => "both",
        (p, _) => p.name(),
    }
}

/// Every core's visit state.
pub(super) struct Temporal {
    /// Per core, its visitor (over the replay's stage groups).
    visitors: Vec<Visitor>,
    /// Per core, the stage whose queue its running thread came from and
    /// the core's clock when it started (for [`Visitor::served`]).
    serving: Vec<Option<(usize, f64)>>,
    /// The "no stage" group index.
    none: usize,
    /// Scratch: per-stage queue lengths.
    lens: Vec<u32>,
    /// Tests: (core, thread, stage) of every pick a visitor made.
    #[cfg(test)]
    pub picks: Vec<(usize, usize, usize)>,
}

impl Temporal {
    /// Visitors of `policy` for `n` cores over `stages` stage groups.
    pub fn new(n: usize, stages: usize, policy: VisitPolicy) -> Self {
        Self {
            visitors: (0..n).map(|_| Visitor::new(policy, stages)).collect(),
            serving: vec![None; n],
            none: stages,
            lens: vec![0; stages],
            #[cfg(test)]
            picks: Vec::new(),
        }
    }

    /// The position in core `k`'s `queue` of the thread it starts at
    /// `start` under `policy` (`None`: the earliest-arrived one, as
    /// without temporal staging — FIFO and Color). Notes the stage served.
    pub fn pick(
        &mut self,
        k: usize,
        policy: VisitPolicy,
        queue: &VecDeque<usize>,
        threads: &[ThreadState],
        start: f64,
    ) -> Option<usize> {
        if matches!(policy, VisitPolicy::Fifo | VisitPolicy::Color) {
            return None;
        }
        // The earliest-arrived thread of `stage` among those arrived by `start`.
        let earliest = |stage: usize| {
            let mut best: Option<(usize, f64)> = None;
            for (i, t) in queue.iter().enumerate() {
                let th = &threads[*t];
                if th.stage == stage
                    && th.ready_at <= start
                    && best.is_none_or(|(_, r)| th.ready_at < r)
                {
                    best = Some((i, th.ready_at));
                }
            }
            best.map(|(i, _)| i)
        };
        // Threads outside a stage first (the guest's NO_STAGE class).
        if let Some(i) = earliest(self.none) {
            return Some(i);
        }
        self.lens.fill(0);
        for t in queue {
            let th = &threads[*t];
            if th.ready_at <= start && th.stage < self.none {
                self.lens[th.stage] += 1;
            }
        }
        let v = &mut self.visitors[k];
        v.set_policy(policy);
        let s = v.next(&self.lens)?;
        let i = earliest(s)?;
        self.serving[k] = Some((s, start));
        #[cfg(test)]
        self.picks.push((k, queue[i], s));
        Some(i)
    }

    /// Core `k`'s thread left it at `clock`: its visitor learns how long
    /// it ran (if a visitor chose it).
    pub fn left(&mut self, k: usize, clock: f64) {
        if let Some((s, t0)) = self.serving[k].take() {
            self.visitors[k].served(s, (clock - t0).max(0.0) as u64);
        }
    }
}

/// Under a temporal policy an idle core `k` that stole a thread of
/// `stage` from core `j` at `now` also takes up to half of `j`'s other
/// arrived threads of that stage (earliest first); returns how many it
/// moved.
pub(super) fn steal_cohort(
    cores: &mut [Core],
    threads: &[ThreadState],
    (j, k): (usize, usize),
    stage: usize,
    now: f64,
) -> u64 {
    let mut same: Vec<(f64, usize)> = cores[j]
        .queue
        .iter()
        .filter(|t| threads[**t].stage == stage && threads[**t].ready_at <= now)
        .map(|t| (threads[*t].ready_at, *t))
        .collect();
    same.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let take = same.len() / 2;
    for &(_, t) in &same[..take] {
        if let Some(i) = cores[j].queue.iter().position(|x| *x == t) {
            cores[j].queue.remove(i);
            cores[k].queue.push_back(t);
        }
    }
    take as u64
}
