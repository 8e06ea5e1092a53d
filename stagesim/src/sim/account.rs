//! Accounting of a replay: the counters per (core, stage group), the
//! warm-up (every counter is reset when the replay passes it), progress
//! reports, and the final [`SimResult`] with its per-core and per-stage
//! metrics and the machine window (module docs of [`crate::sim`]).

use std::time::Instant;

use crate::groups::StageGroups;

use super::plans::Plans;
use super::sched::Core;
use super::{Counters, Metrics, SimConfig, SimResult, StageResult};

/// Counters and progress of one replay.
pub(super) struct Account {
    /// Cores.
    n: usize,
    /// Stage groups plus "no stage".
    ns: usize,
    /// Per (core, stage): `stats[k * ns + s]`.
    stats: Vec<Counters>,
    /// Instructions to replay.
    pub total: u64,
    /// Instructions replayed when the warm-up ends.
    warm_at: u64,
    /// Whether the warm-up is over.
    measuring: bool,
    /// Per core, its clock when statistics started.
    warm_clock: Vec<f64>,
    /// Instructions replayed before statistics started.
    warmup_instrs: u64,
    /// Instructions replayed so far.
    pub executed: u64,
    /// Instructions already passed to `progress`.
    reported: u64,
}

impl Account {
    /// Accounting for `total` instructions on `n` cores and `ns` stage
    /// indices, the first `warmup_pct` % of them warm-up.
    pub fn new(n: usize, ns: usize, total: u64, warmup_pct: f64) -> Self {
        let warm_at = (total as f64 * warmup_pct / 100.0) as u64;
        Self {
            n,
            ns,
            stats: vec![Counters::default(); n * ns],
            total,
            warm_at,
            measuring: warm_at == 0,
            warm_clock: vec![0.0; n],
            warmup_instrs: 0,
            executed: 0,
            reported: 0,
        }
    }

    /// The counters of core `k` in stage `s`.
    pub fn at(&mut self, k: usize, s: usize) -> &mut Counters {
        &mut self.stats[k * self.ns + s]
    }

    /// The instruction limit of the next chunk within `budget`: it ends at
    /// the end of the replay and at the end of the warm-up.
    pub fn limit(&self, budget: u64) -> u64 {
        let mut lim = budget.min(self.total.saturating_sub(self.executed).max(1));
        if !self.measuring {
            lim = lim.min(self.warm_at.saturating_sub(self.executed).max(1));
        }
        lim
    }

    /// Counts a chunk `delta` run on core `k` in stage `s`; reports progress
    /// about every 2^20 instructions.
    pub fn record(&mut self, k: usize, s: usize, delta: &Counters, progress: &mut dyn FnMut(u64)) {
        self.executed += delta.instrs;
        self.at(k, s).add(delta);
        if self.executed - self.reported >= 1 << 20 {
            progress(self.executed - self.reported);
            self.reported = self.executed;
        }
    }

    /// Ends the warm-up if the replay passed it: notes every core's clock
    /// and resets every counter.
    pub fn pass_warmup(&mut self, cores: &[Core]) {
        if self.measuring || self.executed < self.warm_at {
            return;
        }
        self.measuring = true;
        for (w, c) in self.warm_clock.iter_mut().zip(cores) {
            *w = c.clock;
        }
        self.warmup_instrs = self.executed;
        self.stats.iter_mut().for_each(|s| *s = Counters::default());
    }

    /// Reports the instructions not yet reported.
    pub fn flush_progress(&mut self, progress: &mut dyn FnMut(u64)) {
        progress(self.executed - self.reported);
        self.reported = self.executed;
    }

    /// The replay's result. Each core's window runs from its own clock at
    /// the warm-up point to the last core's finish; the machine window is
    /// their mean.
    pub fn finish(
        &self,
        cfg: &SimConfig,
        groups: &StageGroups,
        threads: usize,
        cores: &[Core],
        plans: Option<&Plans>,
        started: Instant,
    ) -> SimResult {
        let (n, ns) = (self.n, self.ns);
        let end = cores.iter().map(|c| c.clock).fold(0.0, f64::max);
        let window_sum: f64 = self.warm_clock.iter().map(|w| (end - w).max(0.0)).sum();
        let window = window_sum / n as f64;
        let mut total = Counters::default();
        let mut per_core = Vec::with_capacity(n);
        for k in 0..n {
            let mut c = Counters::default();
            for s in 0..ns {
                c.add(&self.stats[k * ns + s]);
            }
            total.add(&c);
            per_core.push(Metrics::new(c, &cfg.model));
        }
        let per_stage = (0..ns)
            .map(|s| {
                let mut c = Counters::default();
                for k in 0..n {
                    c.add(&self.stats[k * ns + s]);
                }
                StageResult {
                    name: groups
                        .names
                        .get(s)
                        .map_or("(none)".to_string(), |n| n.clone()),
                    metrics: Metrics::new(c, &cfg.model),
                }
            })
            .collect();
        let total = Metrics::new(total, &cfg.model);
        let secs = started.elapsed().as_secs_f64();
        SimResult {
            policy: cfg.policy.name().to_string(),
            label: cfg.label(),
            groups: groups.label(),
            group_spec: groups.full_spec(),
            migration_cycles: cfg.migration_cycles,
            min_visit: cfg.min_visit,
            visit: if cfg.temporal() {
                cfg.visit.name().to_string()
            } else {
                "fifo".to_string()
            },
            switch_cycles: if cfg.temporal() { cfg.switch_cycles } else { 0 },
            steal: cfg.steal,
            mode: super::visit_mode(cfg).to_string(),
            cores: n,
            slice: cfg.slice,
            slice_jitter: cfg.slice_jitter,
            think_cycles: cfg.block.map_or(0, |b| b.think_cycles),
            blocks: 0,
            repeat: cfg.repeat,
            threads,
            warmup_instrs: self.warmup_instrs,
            utilization: if window > 0.0 {
                total.cycles / window_sum
            } else {
                0.0
            },
            throughput_ipc: if window > 0.0 {
                total.counters.instrs as f64 / window
            } else {
                0.0
            },
            total,
            per_core,
            per_stage,
            window_cycles: window,
            periods: plans.map_or(0, |p| p.periods),
            plan_changes: plans.map_or(0, |p| p.changes),
            final_requirement: plans.map_or_else(Vec::new, |p| p.requirement.clone()),
            plan_history: plans.map_or_else(Vec::new, |p| p.history.clone()),
            auto_decisions: plans.map_or_else(Vec::new, |p| p.decisions.clone()),
            auto_cost: plans
                .and_then(|p| p.auto_stats())
                .map(|a| (a.periods, a.trial_periods, a.losing_periods, a.cost_periods)),
            replay_seconds: secs,
            replay_mips: self.executed as f64 / secs.max(1e-9) / 1e6,
        }
    }
}
