//! The staged policies' side of a replay (`static`, `proportional`,
//! `auto`): the real host-sched policy, its periods and the plan in force —
//! which cores serve which stage (group), both as per-stage masks and as
//! the guest agent's stage map ([`guest_agent::MapSnapshot`]). `auto` gets,
//! before each plan, the period's modelled throughput as its rate
//! (instructions per wall-clock second at [`CLOCK_HZ`]), as the VMM gives it
//! the guest's requests per second: it compares its staged and unstaged
//! trials on it and keeps the faster.

use guest_agent::MapSnapshot;
use host_sched::config::Budget;
use host_sched::policy::{self, Policy, PolicyKind};

use super::SimConfig;

/// Clock rate the modelled cycles are turned into seconds with (2.5 GHz,
/// the cycle model's machine); only `auto`'s rates use it, and it compares
/// them with each other, so the value does not change its decisions.
pub const CLOCK_HZ: f64 = 2.5e9;

/// The default budget of a stage (group) on `cores` cores: min 0, max all
/// cores, weight 1 (host-sched without a budgets file).
pub fn default_budget(name: &str, cores: usize) -> Budget {
    Budget {
        name: name.to_string(),
        min_cores: 0,
        max_cores: cores,
        weight: 1.0,
    }
}

/// [`default_budget`] for each of `names`.
pub fn default_budgets(names: &[String], cores: usize) -> Vec<Budget> {
    names.iter().map(|n| default_budget(n, cores)).collect()
}

/// The plan state of one replay under a staged policy.
pub(super) struct Plans {
    policy: Box<dyn Policy>,
    /// Stage groups (dense); index `stages` is "no stage".
    stages: usize,
    /// Per dense stage, the mask of cores serving it ("no stage": all).
    pub serve: Vec<u64>,
    /// The same plan as the guest agent's stage map.
    pub map: MapSnapshot,
    /// Cores per stage in the plan in force (`Plan::requirement`).
    pub requirement: Vec<usize>,
    /// (instructions replayed, requirement) at the start and at each change.
    pub history: Vec<(u64, Vec<usize>)>,
    /// Instructions over all cores per period.
    period_total: u64,
    /// Instructions replayed (in total) at which the next period ends.
    pub next_period: u64,
    /// Instructions per stage (group) in the current period.
    pub load: Vec<u64>,
    /// Cycles the cores ran each stage's instructions in, in the current
    /// period (`auto`'s [`host_sched::policy::StageWork`]; switches and
    /// migrations are in the period's time, not a stage's).
    pub cycles: Vec<f64>,
    /// Periods evaluated.
    pub periods: u64,
    /// Periods whose plan differed from the previous one.
    pub changes: u64,
    /// The replay clock (cycles of the core that ended the previous
    /// period) when the current period began.
    period_start: f64,
    /// `auto`: its decisions (instructions replayed, what it decided).
    pub decisions: Vec<(u64, String)>,
    /// The visit policy of the plan in force ([`policy::Plan::visit`]:
    /// the configured one, or `auto`'s choice for its mode).
    pub visit: policy::VisitPolicy,
    /// The mask of every core.
    all: u64,
}

impl Plans {
    /// The policy of `kind` on `n` cores for `names` (the stage groups),
    /// with its initial plan.
    pub fn new(
        kind: PolicyKind,
        cfg: &SimConfig,
        names: &[String],
        n: usize,
    ) -> anyhow::Result<Self> {
        let stages = names.len();
        let budgets = match &cfg.budgets {
            Some(b) => {
                anyhow::ensure!(b.len() == stages, "{} budgets for {stages} stages", b.len());
                b.clone()
            }
            None => default_budgets(names, n),
        };
        let map = MapSnapshot {
            epoch: 0,
            vcpus: Default::default(),
            owned: 0,
            visit: policy::VisitPolicy::Fifo,
        };
        anyhow::ensure!(
            stages <= map.vcpus.len(),
            "{stages} stages (groups): the guest agent's stage map holds at most {}",
            map.vcpus.len()
        );
        let ctx = policy::Context {
            cores: (0..n).collect(),
            num_vcpus: n as u32,
            budgets,
            smoothing: cfg.smoothing,
            hysteresis: cfg.hysteresis,
            visit: cfg.visit,
            // The replay times no request: the bound never judges.
            latency: policy::LatencyBound::default(),
            // With a temporal visit policy (issue 40) `auto` trials all
            // four modes, the temporal ones with that policy; without one,
            // unstaged against spatial only (as in issue 25's verdict): the
            // very code the VMM runs, with fewer candidates.
            auto_modes: if cfg.visit.is_temporal() {
                policy::auto::Modes::ALL
            } else {
                policy::auto::Modes::of(&[
                    policy::auto::Mode::Unstaged,
                    policy::auto::Mode::Spatial,
                ])
            },
            auto_twin: cfg.auto_twin,
        };
        let mut policy: Box<dyn policy::Policy> = if kind == policy::PolicyKind::Auto {
            use policy::auto::{Auto, AutoParams};
            let params = AutoParams::of_context(&ctx);
            Box::new(Auto::new(
                ctx,
                AutoParams {
                    // The replay's own migration cost (cycles at the
                    // model's clock): the spatial modes are not trialled
                    // where a visit is shorter (no visit figure is passed
                    // yet: the rule waits for one).
                    migration_ns: Some(cfg.migration_cycles as f64 / CLOCK_HZ * 1e9),
                    ..params
                },
            ))
        } else {
            policy::build(kind, ctx)
        };
        let plan = policy.plan(&vec![0.0; stages]);
        let period_total = cfg.period.saturating_mul(n as u64);
        let mut p = Self {
            policy,
            stages,
            serve: vec![u64::MAX; stages + 1],
            map,
            requirement: plan.requirement,
            history: Vec::new(),
            period_total,
            next_period: period_total,
            load: vec![0; stages + 1],
            cycles: vec![0.0; stages + 1],
            periods: 0,
            changes: 0,
            period_start: 0.0,
            decisions: Vec::new(),
            visit: plan.visit,
            all: if n >= 64 { u64::MAX } else { (1u64 << n) - 1 },
        };
        p.set_serve(&plan.stage_vcpus);
        p.history.push((0, p.requirement.clone()));
        Ok(p)
    }

    /// `auto`'s cost so far (its statistics), for the result.
    pub fn auto_stats(&self) -> Option<host_sched::policy::auto::AutoStats> {
        self.policy.auto_stats()
    }

    /// Whether every core serves every stage (an unstaged plan).
    pub fn unstaged(&self) -> bool {
        self.serve[..self.stages]
            .iter()
            .all(|m| m & self.all == self.all)
    }

    fn set_serve(&mut self, stage_vcpus: &[u64]) {
        self.serve[..self.stages].copy_from_slice(stage_vcpus);
        self.map.vcpus[..self.stages].copy_from_slice(stage_vcpus);
        // The seqlock epoch of a published map is even.
        self.map.epoch = 2 * self.changes;
    }

    /// Ends the period if `executed` reached it, at replay time `now`
    /// (cycles of the core running): passes the period's rate of request
    /// work (instructions inside a stage per second) and each stage's
    /// instructions and cycles (`auto`) and
    /// load (cores' worth of work: instructions / `period`) to the policy and
    /// applies its plan.
    pub fn tick(&mut self, executed: u64, period: u64, now: f64) {
        if executed < self.next_period {
            return;
        }
        // The request work: the instructions run inside a stage, as the
        // VMM's rate counts the guest's stage entries. Work outside every
        // stage is not a request's: in the traces it is mostly InnoDB's
        // background threads (no stage markers), whose streams are a
        // finite pile here where a server's come steadily, and which the
        // temporal modes run first (threads outside every stage come
        // first, as in the guest's runtime). Counted, oltp_read_write's
        // temporal slices ran nothing else and measured +24 to +43 % by
        // their IPC where full replays put temporal 7 % behind.
        let instrs: u64 = self.load[..self.stages].iter().sum();
        let seconds = (now - self.period_start).max(1.0) / CLOCK_HZ;
        self.period_start = now;
        self.next_period = executed + self.period_total;
        self.periods += 1;
        let load: Vec<f64> = self.load[..self.stages]
            .iter()
            .map(|l| *l as f64 / period as f64)
            .collect();
        let stages = self.load[..self.stages]
            .iter()
            .zip(&self.cycles)
            .map(|(i, c)| host_sched::policy::StageWork {
                work: *i as f64,
                time: *c,
            })
            .collect();
        self.load.fill(0);
        self.cycles.fill(0.0);
        self.policy.observe(&host_sched::policy::Observation {
            stages: Some(stages),
            ..host_sched::policy::Observation::rate(instrs as f64 / seconds)
        });
        let plan = self.policy.plan(&load);
        if let Some(d) = self.policy.decision() {
            self.decisions
                .push((executed, format!("{}: {}", d.mode.name(), d.what)));
        }
        if plan.stage_vcpus[..] != self.serve[..self.stages] {
            self.changes += 1;
            self.set_serve(&plan.stage_vcpus);
            self.history.push((executed, plan.requirement.clone()));
        }
        self.requirement = plan.requirement;
        self.visit = plan.visit;
    }
}
