//! `auto`'s parameters ([`AutoParams`]).

use super::cusum::CusumParams;
use super::sprt::SprtParams;
use super::{Mode, Modes};
use crate::policy::Context;

/// Parameters of `auto` (policy periods are the unit of time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoParams {
    /// Measured periods per slice of a duel (see the `trial` submodule).
    pub slice_periods: u32,
    /// The most periods a slice skips after a change of plan; the trial
    /// measures how many it needs (fewer when the figures settle sooner).
    pub max_settle: u32,
    /// Fraction by which a candidate must beat the incumbent to be kept
    /// (0.03 = 3 %): the sequential test's H1 ([`SprtParams::margin`]).
    pub margin: f64,
    /// The sequential test's false-switch rate bound.
    pub alpha: f64,
    /// The sequential test's miss rate at a gain of the margin.
    pub beta: f64,
    /// Pairs before a duel may stop (the noise is estimated from them).
    pub min_pairs: u32,
    /// The cap on a duel's pairs: at it, no better shown.
    pub max_pairs: u32,
    /// Periods of the first hold after a trial: the interval to the next
    /// trial when no change point fires first.
    pub hold_periods: u32,
    /// The interval doubles after every trial on schedule that keeps the
    /// mode held (nothing changed: re-testing it often only costs), up to
    /// this; a change point or a new mode resets it to `hold_periods`.
    pub max_hold_periods: u32,
    /// Periods of a hold before its change-point detectors start (the
    /// threads settle into the kept plan; the stage-load shares of these
    /// periods are the reference mix).
    pub mix_settle: u32,
    /// The change-point detectors' parameters (`cusum` submodule).
    pub change: CusumParams,
    /// Periods run unstaged before the first trial: a guest that does not
    /// run that long never pays for a trial (do no harm on short runs).
    pub first_trial_after: u32,
    /// The modes trialled against unstaged (unstaged always is).
    pub candidates: Modes,
    /// Utilisation of the trial's first unstaged slice (work CPU ÷ the
    /// VM's CPU capacity) at or above which the guest counts as saturated:
    /// the trial then compares rates, below it CPU per request. 0.95: a
    /// closed loop measures 0.97–1.00 here (its threads always have work;
    /// what is left is idle between a request's stages), while at 90 % of
    /// the unstaged capacity an open loop measures ~0.9: below, the rate is
    /// the arrival rate under every mode that keeps up (docs/design.md,
    /// "The objective").
    pub saturation: f64,
    /// Requests timed in each side of a duel before their p99 latencies
    /// are compared (fewer: the latency bound does not judge). 200: the
    /// p99 is then the mean of the two slowest.
    pub min_latency_samples: u64,
    /// Periods of a hold whose timed requests form one block, whose p99 is
    /// checked against the trial's latency bound.
    pub latency_block: u32,
    /// What moving a thread to another vCPU costs (ns), measured by the
    /// caller (the simulator's migration cost; `None`: unknown). With it,
    /// the spatial modes are not trialled while the mean visit (work CPU
    /// per stage entry) is shorter: each visit would cost more in moving
    /// than it runs (seed 000 §4: staging pays when a stage's code runs
    /// long enough to amortise the migration).
    pub migration_ns: Option<f64>,
    /// A null experiment (`just bench-auto` O2): the `temporal` candidate
    /// runs unstaged's plan and visit order under its own name, so every
    /// duel of it is between two identical modes and should find no
    /// difference.
    pub twin: bool,
}

impl AutoParams {
    /// The defaults with what the operator's context chooses: the
    /// candidates (`[policy] auto_modes`) or, for the null experiment
    /// (`[policy] auto_twin`), unstaged and its twin named `temporal`.
    pub fn of_context(ctx: &Context) -> Self {
        Self {
            candidates: if ctx.auto_twin {
                Modes::of(&[Mode::Unstaged, Mode::Temporal])
            } else {
                ctx.auto_modes
            },
            twin: ctx.auto_twin,
            ..Self::default()
        }
    }

    /// The sequential test's parameters.
    pub fn sprt(&self) -> SprtParams {
        SprtParams {
            margin: self.margin,
            alpha: self.alpha,
            beta: self.beta,
            min_pairs: self.min_pairs,
            max_pairs: self.max_pairs,
            ..SprtParams::default()
        }
    }
}

impl Default for AutoParams {
    fn default() -> Self {
        let sprt = SprtParams::default();
        Self {
            slice_periods: 2,
            max_settle: 3,
            margin: sprt.margin,
            alpha: sprt.alpha,
            beta: sprt.beta,
            min_pairs: sprt.min_pairs,
            max_pairs: sprt.max_pairs,
            hold_periods: 1500,
            max_hold_periods: 24_000,
            mix_settle: 10,
            change: CusumParams::default(),
            first_trial_after: 10,
            candidates: Modes::ALL,
            saturation: 0.95,
            min_latency_samples: 200,
            latency_block: 25,
            migration_ns: None,
            twin: false,
        }
    }
}
