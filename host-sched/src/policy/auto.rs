//! `auto`: stage scheduling that pays or steps aside.
//!
//! Staging can be spatial, temporal, both or neither, and `auto` chooses
//! among these four **modes** by trial:
//!
//! | mode       | stage map (spatial)                 | visit order (temporal) |
//! |------------|-------------------------------------|------------------------|
//! | `unstaged` | `pinned`: every vCPU, every stage   | FIFO                   |
//! | `temporal` | `pinned`                            | the temporal policy    |
//! | `spatial`  | `static`: stages partitioned        | FIFO                   |
//! | `both`     | `static`                            | the temporal policy    |
//!
//! Why four: seed 002 §3.2 weighs *replicating* every stage on every core
//! against *partitioning* the stages over the cores. Partitioning (spatial
//! staging) keeps each core's i-cache on one stage's code but moves a thread
//! at every stage switch; replicating costs no migration but mixes every
//! stage's code on each core, unless each core orders its visits so that it
//! serves one stage's threads back to back (temporal staging: replicate plus
//! a visit order, [`VisitPolicy`]). Which of the two wins, whether their
//! combination beats either, and whether any beats an OS scheduler depends
//! on the workload's code size and stage mix and on the host. The temporal
//! policy is the operator's `[policy] visit` when it names one
//! ([`Context::visit`]), else [`DEFAULT_TEMPORAL`].
//!
//! **Trials.** A trial measures what the VMM observes per policy period
//! ([`Observation`]: the completed-request rate, the CPU the vCPU threads
//! spent on work, their utilisation, the sampled request latencies) as an
//! experiment would (the `trial` submodule): unstaged is the incumbent,
//! and each candidate **duels** it in short paired slices, A B then B A,
//! so that a drift of the load cancels; the first periods after each
//! change of plan are skipped, as many as the trial measured the figures
//! take to settle. Each pair's difference of the **objective** (the
//! `measure` submodule: the rate when the incumbent ran saturated, CPU
//! per request below that, where an open-loop server completes its
//! arrivals under every mode and only their cost differs) goes to a
//! **sequential test** (the `sprt` submodule: Wald's SPRT with the noise
//! estimated from the pairs), which stops as soon as the candidate is
//! shown better by the margin (it becomes the incumbent) or not better,
//! its false-switch rate bounded by [`AutoParams::alpha`], its length by
//! [`AutoParams::max_pairs`]. The p99 is a veto: a candidate whose p99
//! passes the operator's bound ([`LatencyBound`]) is refused, and so is,
//! below saturation, one that does not keep up with the arrivals. Modes
//! the counters rule out are not trialled, and the report says why (one
//! core; a mean visit shorter than a migration, when the caller measured
//! one: [`AutoParams::migration_ns`]).
//!
//! **Holds.** The kept mode runs until a **change point** (the `cusum`
//! submodule, in the `hold` submodule: the rate, the utilisation, the
//! stage mix, or a held mode's p99 past the bound) or the end of its
//! interval, which doubles while trials keep finding the same mode
//! ([`AutoParams::max_hold_periods`]). A hold never switches by itself:
//! every switch of mode is a trial's verdict. A change of the VM's cores
//! by the host daemon keeps the hold ([`Policy::retarget`]) and what the
//! trial learnt; the answer at the new size is re-tested by the next trial
//! (the interval's end, or a change point once the detectors calibrated
//! afresh at the new size).
//!
//! Ties go to the simpler mode, in the order unstaged < temporal < spatial
//! < both ([`Mode::ALL`]): a candidate must be *better* to win. Temporal
//! changes only the order in which each vCPU serves its own threads;
//! spatial moves a thread to another vCPU at every stage switch; both
//! does both. The same code runs in stagesim, on the MariaDB traces.
//!
//! Why trials and not a model: on these machines the cost of a migration
//! (exits, idle, hand-off) and the gain in i-cache misses both depend on the
//! workload and the host, and neither can be read from counters here (no
//! cache counters); measuring what a request costs and how long it takes
//! under each mode is what decides what the user wants. The seeds' result that staging
//! wins only when code overflows the caches (seed 000 §5, seed 004) is why
//! the unstaged plan is the default whenever the difference is in the noise.

pub mod cusum;
mod hold;
mod measure;
mod params;
mod settle;
pub mod sprt;
#[cfg(test)]
mod tests;
mod trial;

use super::{build, Context, Observation, Plan, Policy, PolicyKind, VisitPolicy};
use hold::{Hold, Step};
pub use measure::{LatencyBound, ModeSummary, Objective, TrialSummary};
pub use params::AutoParams;
use settle::Settle;
pub use trial::DuelSummary;
use trial::{Trial, Verdict};

/// The temporal policy of the `temporal` and `both` modes when the operator
/// named none (`[policy] visit` is FIFO): SRPT (the pipeline's last stage
/// first), which needs no per-stage measurements. On the headline's
/// 4-stage shape, where temporal staging gains most (2–4 MiB of code), it
/// was the best visit policy or within 1 % of it (cohort: up to 4.7 %
/// behind; bench/RESULTS.md, "temporal"), and seed 002 (§4.3.6) found it
/// among the best on both its servers.
pub const DEFAULT_TEMPORAL: VisitPolicy = VisitPolicy::Srpt;

/// Which plan and visit order `auto` runs (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The `pinned` plan, FIFO visits: no staging.
    Unstaged,
    /// The `pinned` plan, the temporal visit policy.
    Temporal,
    /// The `static` plan, FIFO visits.
    Spatial,
    /// The `static` plan, the temporal visit policy.
    Both,
}

impl Mode {
    /// Every mode, simplest first: the trial order and the order ties go
    /// by.
    pub const ALL: [Mode; 4] = [Mode::Unstaged, Mode::Temporal, Mode::Spatial, Mode::Both];

    /// `unstaged`, `temporal`, `spatial` or `both`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Unstaged => "unstaged",
            Mode::Temporal => "temporal",
            Mode::Spatial => "spatial",
            Mode::Both => "both",
        }
    }

    /// Its position in [`Mode::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// True for the modes that run the `static` plan (spatial staging).
    pub fn is_spatial(self) -> bool {
        matches!(self, Mode::Spatial | Mode::Both)
    }

    /// True for the modes that run the temporal visit policy.
    pub fn is_temporal(self) -> bool {
        matches!(self, Mode::Temporal | Mode::Both)
    }
}

/// A set of [`Mode`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Modes(u8);

impl Modes {
    /// Every mode.
    pub const ALL: Modes = Modes(0b1111);

    /// The set of `modes`.
    pub fn of(modes: &[Mode]) -> Self {
        Self(modes.iter().fold(0, |s, m| s | 1 << m.index()))
    }

    /// True when `mode` is in the set.
    pub fn contains(self, mode: Mode) -> bool {
        self.0 & 1 << mode.index() != 0
    }
}

/// What `auto` decided in a period, for the timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoDecision {
    /// The mode it runs next.
    pub mode: Mode,
    /// One line: a trial step, or the decision with every mode's figures.
    pub what: String,
    /// A trial's end: what it measured and why it kept its mode.
    pub summary: Option<TrialSummary>,
}

#[derive(Debug)]
enum State {
    /// Measuring the modes (boxed: four modes' histograms).
    Trial(Box<Trial>),
    /// Running a mode (see the `hold` submodule; boxed: its probe's and
    /// latency block's histograms).
    Hold(Box<Hold>),
}

/// What `auto` has spent on trials so far (policy periods), for the report:
/// a server runs for hours, so what matters is the share of its time spent
/// in the modes that lost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AutoStats {
    /// Policy periods `auto` planned.
    pub periods: u64,
    /// Trials started (the first, change points, intervals over).
    pub trials: u64,
    /// Periods spent in trials (all modes).
    pub trial_periods: u64,
    /// Periods a finished trial spent in the modes it did not keep (their
    /// slices, settling included): the trials' cost.
    pub losing_periods: u64,
    /// The same periods priced by what their modes lost against the kept
    /// one (the `trial` submodule's `Trial::cost_periods`): the trials'
    /// cost in periods of the kept mode's objective.
    pub cost_periods: f64,
    /// Trials whose kept mode differs from the previous hold's. A hold
    /// never switches by itself, so these are all the switches.
    pub mode_switches: u64,
    /// Trials started by a change point (the rest: the first, and
    /// intervals over).
    pub change_points: u64,
    /// Duels run, and those whose test stopped at the cap on pairs.
    pub duels: u64,
    /// See `duels`.
    pub duels_capped: u64,
    /// Duels whose test found the candidate better (a veto may still have
    /// refused it): with `twin`, each is a false difference.
    pub duels_better: u64,
    /// Candidates not trialled because the counters ruled them out.
    pub modes_skipped: u64,
}

/// The `auto` policy (see the module docs).
pub struct Auto {
    spatial: Box<dyn Policy>,
    unstaged: Box<dyn Policy>,
    /// The visit policy of the temporal modes.
    temporal: VisitPolicy,
    params: AutoParams,
    /// The operator's bound on tail latency.
    bound: LatencyBound,
    state: State,
    /// What the period that just ended measured (set by `observe`).
    observed: Option<Observation>,
    decision: Option<AutoDecision>,
    stats: AutoStats,
    /// The mode of the last hold (`None` before the first decision).
    last_hold: Option<Mode>,
    /// The last finished trial's summary.
    last_trial: Option<TrialSummary>,
    /// The stage cores its modes plan for.
    cores: usize,
    /// The interval of the next hold (periods).
    interval: u32,
    /// Why the running trial started: a change point (true) or not.
    trial_on_change: bool,
    /// The settling measured by the trials.
    settle: Settle,
    /// The mean visit (work CPU per stage entry, ns), smoothed.
    visit_ns: Option<f64>,
}

fn shares(load: &[f64]) -> Vec<f64> {
    let total: f64 = load.iter().filter(|l| l.is_finite()).sum();
    load.iter()
        .map(|l| {
            if total > 0.0 && l.is_finite() {
                l / total
            } else {
                0.0
            }
        })
        .collect()
}

impl Auto {
    /// `auto` over `ctx` with `params`; the temporal modes use `ctx.visit`
    /// when it is temporal, else [`DEFAULT_TEMPORAL`]; the latency bound is
    /// `ctx.latency`.
    pub fn new(ctx: Context, params: AutoParams) -> Self {
        let temporal = if ctx.visit.is_temporal() {
            ctx.visit
        } else {
            DEFAULT_TEMPORAL
        };
        Self {
            bound: ctx.latency,
            cores: ctx.cores.len(),
            spatial: build(PolicyKind::Static, ctx.clone()),
            unstaged: build(PolicyKind::Pinned, ctx),
            temporal,
            params,
            state: State::Hold(Box::new(Hold::first(&params))),
            observed: None,
            decision: None,
            stats: AutoStats::default(),
            last_hold: None,
            last_trial: None,
            interval: params.hold_periods,
            trial_on_change: false,
            settle: Settle::default(),
            visit_ns: None,
        }
    }

    /// What trials have cost so far.
    pub fn stats(&self) -> AutoStats {
        self.stats
    }

    /// The last finished trial's summary.
    pub fn last_trial(&self) -> Option<&TrialSummary> {
        self.last_trial.as_ref()
    }

    /// The visit policy of the temporal modes.
    pub fn temporal_policy(&self) -> VisitPolicy {
        self.temporal
    }

    /// The candidates of a trial, the mode held before first, and the
    /// modes the counters rule out, with why.
    fn candidates(&self) -> (Vec<Mode>, Vec<(Mode, String)>) {
        let p = &self.params;
        let mut order: Vec<Mode> = Mode::ALL[1..]
            .iter()
            .copied()
            .filter(|m| p.candidates.contains(*m))
            .collect();
        if let Some(i) = self
            .last_hold
            .and_then(|h| order.iter().position(|m| *m == h))
        {
            let held = order.remove(i);
            order.insert(0, held);
        }
        let mut skipped = Vec::new();
        order.retain(|m| {
            let why = if !m.is_spatial() {
                return true;
            } else if self.cores < 2 {
                "one core: its plan is unstaged's".to_string()
            } else {
                match self.visit_ns.zip(p.migration_ns) {
                    Some((v, mig)) if v < mig => format!(
                        "the mean visit, {:.2} µs, is shorter than a migration, {:.2} µs",
                        v / 1000.0,
                        mig / 1000.0
                    ),
                    _ => return true,
                }
            };
            skipped.push((*m, why));
            false
        });
        (order, skipped)
    }

    /// Starts a trial (a change point started it if `on_change`; `from` ran
    /// the period before): the mode it runs first and its first candidate,
    /// or `None` when the counters ruled every candidate out.
    fn start_trial(&mut self, from: Mode, on_change: bool) -> Option<(Mode, Mode)> {
        let (candidates, skipped) = self.candidates();
        self.trial_on_change = on_change;
        if candidates.is_empty() {
            self.stats.modes_skipped += skipped.len() as u64;
            return None;
        }
        self.stats.trials += 1;
        self.stats.change_points += u64::from(on_change);
        let settle = std::mem::take(&mut self.settle);
        let trial = Trial::new(candidates, skipped, settle, from, &self.params);
        let first = (trial.mode, trial.candidate());
        self.state = State::Trial(Box::new(trial));
        Some(first)
    }

    /// Ends the trial, if one runs, and holds `mode` for the interval
    /// (doubled when a trial on schedule kept the held mode, else back to
    /// [`AutoParams::hold_periods`]).
    fn hold(&mut self, mode: Mode, objective: Objective, limit_ns: Option<f64>) -> Mode {
        let p = self.params;
        if let State::Trial(trial) = &mut self.state {
            self.stats.losing_periods += trial.losing_periods(mode);
            self.stats.cost_periods += trial.cost_periods(mode);
            self.settle = std::mem::take(&mut trial.settle);
        }
        let same = self.last_hold == Some(mode);
        if self.last_hold.is_some() && !same {
            self.stats.mode_switches += 1;
        }
        self.interval = if same && !self.trial_on_change {
            self.interval
                .saturating_mul(2)
                .min(p.max_hold_periods.max(p.hold_periods))
        } else {
            p.hold_periods
        };
        self.last_hold = Some(mode);
        self.state = State::Hold(Box::new(Hold::new(
            mode,
            &p,
            self.interval,
            objective,
            limit_ns,
        )));
        mode
    }

    /// Advances the trial by the period that just ended; returns the next
    /// mode, what happened and, at its end, the trial's summary.
    fn step_trial(&mut self, o: &Observation) -> (Mode, String, Option<TrialSummary>) {
        let p = self.params;
        let State::Trial(trial) = &mut self.state else {
            unreachable!("step_trial runs in a trial");
        };
        self.stats.trial_periods += 1;
        match trial.record(&p, o, &self.bound) {
            Ok(Verdict {
                kept,
                what,
                summary,
                objective,
            }) => {
                self.stats.duels += summary.duels.len() as u64;
                self.stats.modes_skipped += summary.skipped.len() as u64;
                self.stats.duels_capped += summary
                    .duels
                    .iter()
                    .filter(|d| d.outcome == "capped")
                    .count() as u64;
                self.stats.duels_better += summary
                    .duels
                    .iter()
                    .filter(|d| d.outcome == "better")
                    .count() as u64;
                self.last_trial = Some(summary.clone());
                let limit = summary.p99_limit_ns;
                let mode = self.hold(kept, objective, limit);
                (mode, what, Some(summary))
            }
            Err(what) => (trial.mode, what.unwrap_or_default(), None),
        }
    }

    fn step(&mut self, load: &[f64]) -> (Mode, String, Option<TrialSummary>) {
        let p = self.params;
        let o = self.observed.take().unwrap_or_default();
        self.stats.periods += 1;
        if let (Some(cpu), Some(n)) = (o.cpu_ns, o.entries) {
            if n > 0.0 && cpu.is_finite() && cpu >= 0.0 {
                let v = cpu / n;
                self.visit_ns = Some(self.visit_ns.map_or(v, |a| a + 0.05 * (v - a)));
            }
        }
        let State::Hold(hold) = &mut self.state else {
            return self.step_trial(&o);
        };
        let (mode, objective) = (hold.mode, hold.objective);
        match hold.step(&p, load, &o) {
            Step::Stay => (mode, String::new(), None),
            Step::Trial(why, on_change) => match self.start_trial(mode, on_change) {
                Some((next, first)) => {
                    (next, format!("{why}: trial, {} first", first.name()), None)
                }
                None => {
                    let m = self.hold(Mode::Unstaged, objective, None);
                    (m, format!("{why}: no candidate left, keep unstaged"), None)
                }
            },
        }
    }
}

impl Policy for Auto {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Auto
    }

    /// A change of the number of stage cores during a hold keeps the mode
    /// held, the periods left and the statistics; the modes plan for the
    /// new cores, and the rate's and utilisation's change detectors
    /// calibrate afresh. During a trial it returns `false`: the trial's
    /// slices would compare modes at two capacities, so it starts again.
    fn retarget(&mut self, ctx: Context) -> bool {
        let State::Hold(hold) = &mut self.state else {
            return false;
        };
        // The hold goes on, its rate and utilisation detectors calibrated
        // afresh at the new size; the answer at the new size is tested by
        // the next trial (a change point after that, or the interval). On
        // one core the spatial plans are unstaged's, so a held spatial
        // mode runs unstaged until the cores come back.
        hold.recalibrate(&self.params);
        self.cores = ctx.cores.len();
        self.bound = ctx.latency;
        self.spatial = build(PolicyKind::Static, ctx.clone());
        self.unstaged = build(PolicyKind::Pinned, ctx);
        true
    }

    /// The plan of the mode `auto` runs next: the `static` or `pinned`
    /// plan, with [`Plan::visit`] FIFO or the temporal policy.
    fn plan(&mut self, load: &[f64]) -> Plan {
        // Both plans follow the load, so either is ready when chosen.
        let spatial = self.spatial.plan(load);
        let unstaged = self.unstaged.plan(load);
        let (mode, what, summary) = self.step(load);
        self.decision = (!what.is_empty()).then_some(AutoDecision {
            mode,
            what,
            summary,
        });
        let mut plan = if mode.is_spatial() { spatial } else { unstaged };
        plan.visit = if mode.is_temporal() && !self.params.twin {
            self.temporal
        } else {
            VisitPolicy::Fifo
        };
        plan
    }

    fn observe(&mut self, observation: &Observation) {
        self.observed = Some(observation.clone());
    }

    fn decision(&self) -> Option<AutoDecision> {
        self.decision.clone()
    }

    fn auto_stats(&self) -> Option<AutoStats> {
        Some(self.stats)
    }

    fn last_trial(&self) -> Option<TrialSummary> {
        self.last_trial.clone()
    }
}
