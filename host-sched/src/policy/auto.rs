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
//! The policy runs short, interleaved **trial epochs** of the modes
//! (unstaged first, then temporal, spatial, both, round after round),
//! measures in each what the VMM observes per policy period
//! ([`Observation`]: the completed-request rate, the CPU the vCPU threads
//! spent on work, their utilisation and the sampled request latencies),
//! and keeps the best mode by the trial's **objective** (the `measure`
//! submodule): the rate when the unstaged epochs ran the vCPUs saturated
//! (utilisation ≥ [`AutoParams::saturation`], as in every closed loop), the
//! CPU per request below that, where an open-loop server completes its
//! requests at their arrival rate under every mode and only their cost
//! differs. A mode other than unstaged is kept only when it beats unstaged
//! by a margin, so noise never flips it towards a mode that can lose (do
//! no harm), and never when its p99 request latency is beyond the
//! operator's bound ([`LatencyBound`], `[policy] max_p99_increase` or
//! `latency_slo_us`), nor, below saturation, when it did not keep up with
//! the arrivals. A mode clearly behind another is dropped from the rest of
//! a trial, and a clear winner ends it early (the `trial` submodule). The
//! decision is held (the `hold` submodule): a new trial starts after a
//! hold time, when the stage mix (each stage's share of the load) moves,
//! and when the load crosses saturation; while a mode other than unstaged
//! is held, its figure falling behind unstaged's of its trial, or its p99
//! passing the bound, ends the hold unstaged.
//!
//! Ties (equal mean rates) go to the simpler mode, in the order unstaged <
//! temporal < spatial < both ([`Mode::ALL`]): temporal changes only the
//! order in which each vCPU serves its own threads (a yield at each stage
//! switch, no migration, no map change); spatial moves a thread to another
//! vCPU at every stage switch (exits and wake-ups); both does both.
//!
//! Cost: a full trial runs `epoch_periods` × modes × `rounds` policy periods
//! (3 × 4 × 3 = 36 by default, against 18 with two modes), three quarters
//! of them in modes it does not keep (half with two). The early cut
//! shortens most trials (12 periods when every staging loses clearly), and
//! [`AutoParams::candidates`] can leave modes out (e.g. the temporal ones
//! for a guest without visit policies, which would run them as FIFO).
//!
//! Why trials and not a model: on these machines the cost of a migration
//! (exits, idle, hand-off) and the gain in i-cache misses both depend on the
//! workload and the host, and neither can be read from counters here (no
//! cache counters); measuring what a request costs and how long it takes
//! under each mode is what decides what the user wants. The seeds' result that staging
//! wins only when code overflows the caches (seed 000 §5, seed 004) is why
//! the unstaged plan is the default whenever the difference is in the noise.

mod hold;
mod measure;
#[cfg(test)]
mod tests;
mod trial;

use super::{build, Context, Observation, Plan, Policy, PolicyKind, VisitPolicy};
use hold::{Fallback, Guard, Hold, Step};
pub use measure::{LatencyBound, ModeSummary, Objective, TrialSummary};
use trial::{Trial, Verdict};

/// The temporal policy of the `temporal` and `both` modes when the operator
/// named none (`[policy] visit` is FIFO): SRPT (the pipeline's last stage
/// first), which needs no per-stage measurements. On the headline's
/// 4-stage shape, where temporal staging gains most (2–4 MiB of code), it
/// was the best visit policy or within 1 % of it (cohort: up to 4.7 %
/// behind; bench/RESULTS.md, "temporal"), and seed 002 (§4.3.6) found it
/// among the best on both its servers.
pub const DEFAULT_TEMPORAL: VisitPolicy = VisitPolicy::Srpt;

/// Parameters of `auto` (policy periods are the unit of time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoParams {
    /// Periods per trial epoch, the first of which is not measured (the
    /// threads move to the new plan then).
    pub epoch_periods: u32,
    /// Epochs of each mode in a full trial (interleaved: unstaged,
    /// temporal, spatial, both, unstaged, …).
    pub rounds: u32,
    /// Fraction by which a mode must beat unstaged to be kept (0.03 = 3 %).
    pub margin: f64,
    /// A gap this large (a fraction of the unstaged rate) between two
    /// modes, each measured over a full epoch, decides between them: the
    /// slower is dropped from the trial. Twice this decides on one
    /// measured period each.
    pub decisive: f64,
    /// Periods a decision holds before the next trial.
    pub hold_periods: u32,
    /// L1 distance between the stage-load shares measured early in a hold
    /// and their moving average now that counts as a new stage mix and
    /// starts a trial (0..=2).
    pub mix_change: f64,
    /// Periods of a hold whose load shares, averaged, are the reference mix
    /// (the threads settle into the chosen plan first).
    pub mix_settle: u32,
    /// Weight of the newest period in the moving average of the shares.
    pub mix_smoothing: f64,
    /// Consecutive periods the averaged shares must stay `mix_change` away
    /// from the reference before a new trial starts (a burst is not a new
    /// mix).
    pub mix_persist: u32,
    /// Periods run unstaged before the first trial: a guest that does not
    /// run that long never pays for a trial (do no harm on short runs).
    pub first_trial_after: u32,
    /// Weight of the newest period in the moving average of the rate while
    /// a mode other than unstaged is held. Once the hold settled
    /// (`mix_settle` periods), that rate falling below the unstaged rate
    /// its trial measured (by the margin) ends the hold unstaged: a trial's
    /// few periods can catch a staged transient (every core busy, caches
    /// warm, before threads queue at the busiest stage's cores) that the
    /// sustained rate does not keep.
    pub fall_back_smoothing: f64,
    /// The modes trialled against unstaged (unstaged always is).
    pub candidates: Modes,
    /// Utilisation of the unstaged epochs (work CPU ÷ the VM's CPU
    /// capacity) at or above which the guest counts as saturated: the
    /// trial then compares rates, below it CPU per request. 0.95: a closed
    /// loop measures 0.97–1.00 here (its threads always have work; what is
    /// left is idle between a request's stages), while at 90 % of the
    /// unstaged capacity an open loop measures ~0.9: below, the rate is
    /// the arrival rate under every mode that keeps up (docs/design.md,
    /// "The objective").
    pub saturation: f64,
    /// The band around `saturation` a held mode's utilisation must leave
    /// (below it by the band, or above it by a third of it) for
    /// `mix_persist` periods to start a new trial: the load crossed
    /// saturation.
    pub saturation_band: f64,
    /// Requests timed in each of two modes before their p99 latencies are
    /// compared (fewer: the latency bound does not judge). 200: the p99 is
    /// then the mean of the two slowest.
    pub min_latency_samples: u64,
    /// Periods of a hold whose timed requests form one block, whose p99 is
    /// checked against the trial's latency bound.
    pub latency_block: u32,
    /// Periods of a hold of a mode other than unstaged between two
    /// unstaged probes (one epoch each). 150 (3 s at 20 ms): a misjudged
    /// mode is held at most that long, and the probes cost 2 % of the
    /// hold's periods in unstaged.
    pub probe_every: u32,
}

impl Default for AutoParams {
    fn default() -> Self {
        Self {
            epoch_periods: 3,
            rounds: 3,
            margin: 0.03,
            decisive: 0.15,
            hold_periods: 1500,
            mix_change: 0.3,
            mix_settle: 10,
            mix_smoothing: 0.05,
            mix_persist: 10,
            first_trial_after: 10,
            fall_back_smoothing: 0.25,
            candidates: Modes::ALL,
            saturation: 0.95,
            saturation_band: 0.1,
            min_latency_samples: 200,
            latency_block: 25,
            probe_every: 150,
        }
    }
}

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AutoStats {
    /// Policy periods `auto` planned.
    pub periods: u64,
    /// Trials started (the first, hold-overs and stage-mix changes).
    pub trials: u64,
    /// Periods spent in trials (all modes).
    pub trial_periods: u64,
    /// Periods a finished trial spent in the modes it did not keep (their
    /// epochs, each with its unmeasured first period).
    pub losing_periods: u64,
    /// Holds whose mode differs from the previous hold's: switches of mode
    /// outside trials.
    pub mode_switches: u64,
    /// Holds of a staged mode ended early: its figure fell behind
    /// unstaged's, its p99 passed the latency bound, an unstaged probe beat
    /// it.
    pub fallbacks_figure: u64,
    /// See `fallbacks_figure`.
    pub fallbacks_latency: u64,
    /// See `fallbacks_figure`.
    pub fallbacks_probe: u64,
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

    fn start_trial(&mut self) -> Mode {
        self.stats.trials += 1;
        self.state = State::Trial(Box::new(Trial::new(self.params.candidates)));
        Mode::Unstaged
    }

    /// Ends the trial, if one runs, and holds `mode` (see
    /// [`AutoParams::hold_periods`]), watched by `guard` when it is not
    /// unstaged.
    fn hold(
        &mut self,
        mode: Mode,
        load: &[f64],
        guard: Option<Guard>,
        objective: Objective,
    ) -> Mode {
        if let State::Trial(trial) = &self.state {
            self.stats.losing_periods += trial.losing_periods(mode);
        }
        if self.last_hold.is_some_and(|m| m != mode) {
            self.stats.mode_switches += 1;
        }
        self.last_hold = Some(mode);
        let guard = guard.filter(|_| mode != Mode::Unstaged);
        self.state = State::Hold(Box::new(Hold::new(
            mode,
            &self.params,
            load,
            guard,
            objective,
        )));
        mode
    }

    /// Advances the trial by the period that just ended; returns the next
    /// mode, what happened and, at its end, the trial's summary.
    fn step_trial(
        &mut self,
        load: &[f64],
        o: &Observation,
    ) -> (Mode, String, Option<TrialSummary>) {
        let p = self.params;
        let State::Trial(trial) = &mut self.state else {
            unreachable!("step_trial runs in a trial");
        };
        self.stats.trial_periods += 1;
        trial.record(o);
        let dropped = trial.cut(&p, &self.bound);
        let over = trial.epoch_over(&p);
        if let Some(v) = trial.verdict(&p, over, &self.bound) {
            let Verdict {
                kept,
                what,
                summary,
                objective,
            } = v;
            let u = trial.unstaged();
            let unstaged = match objective {
                Objective::Rate => u.rate(),
                Objective::CpuPerRequest => u.cpu_per_request_ns(),
            };
            let guard = unstaged.map(|unstaged| Guard {
                objective,
                unstaged,
                limit_ns: summary.p99_limit_ns,
            });
            self.last_trial = Some(summary.clone());
            let mode = self.hold(kept, load, guard, objective);
            return (mode, what, Some(summary));
        }
        if over {
            trial.advance();
        }
        let what = format!(
            "trial {} {}/{}",
            trial.mode.name(),
            trial.period + 1,
            p.epoch_periods
        );
        let what = if dropped.is_empty() {
            what
        } else {
            format!("{dropped}; {what}")
        };
        (trial.mode, what, None)
    }

    fn step(&mut self, load: &[f64]) -> (Mode, String, Option<TrialSummary>) {
        let p = self.params;
        let o = self.observed.take().unwrap_or_default();
        self.stats.periods += 1;
        let State::Hold(hold) = &mut self.state else {
            return self.step_trial(load, &o);
        };
        let (mode, objective) = (hold.mode, hold.objective);
        match hold.step(&p, load, &o) {
            Step::Stay => (mode, String::new(), None),
            Step::FallBack(kind, why) => {
                match kind {
                    Fallback::Figure => self.stats.fallbacks_figure += 1,
                    Fallback::Latency => self.stats.fallbacks_latency += 1,
                    Fallback::Probe => self.stats.fallbacks_probe += 1,
                }
                let mode = self.hold(Mode::Unstaged, load, None, objective);
                (mode, why, None)
            }
            Step::Trial(why) => {
                let mode = self.start_trial();
                (mode, format!("{why}: trial {}", mode.name()), None)
            }
            Step::Probe(what) => (Mode::Unstaged, what, None),
        }
    }
}

impl Policy for Auto {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Auto
    }

    /// A change of the number of stage cores during a hold keeps the mode
    /// held, the periods left and the statistics; the modes plan for the
    /// new cores, and the hold's guard compares at the new capacity (under
    /// the rate objective unstaged's figure scales with the cores; the
    /// held mode's smoothed figure starts again; the unstaged probes
    /// measure afresh). During a trial it returns `false`: the trial's
    /// epochs would compare modes at two capacities, so it starts again.
    fn retarget(&mut self, ctx: Context) -> bool {
        let State::Hold(hold) = &mut self.state else {
            return false;
        };
        let (old, new) = (self.cores.max(1), ctx.cores.len().max(1));
        hold.rescale(new as f64 / old as f64);
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
        plan.visit = if mode.is_temporal() {
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
