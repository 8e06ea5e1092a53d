//! What `auto` measures of a mode and judges it by: the objective
//! ([`Objective`]: the completed-request rate at saturation, the CPU a
//! request costs below it), the operator's bound on tail latency
//! ([`LatencyBound`]), one mode's measurements in a trial ([`Measured`]),
//! and the trial's summary for the report ([`TrialSummary`]).
//!
//! Why two objectives: in a closed loop (every thread runs its requests
//! back to back) or at saturation, the completed-request rate is the
//! throughput, and a mode that raises it is better. Below saturation an
//! open-loop server completes requests at their arrival rate under every
//! mode that keeps up, so the rate says nothing; what a better mode saves
//! is CPU per request — the headroom an operator can give other work or
//! more load — so it is compared instead (seed 000 §5 measures its
//! staging by request latency and CPU headroom as well as throughput).
//! Which of the two applies is read from the unstaged epochs' utilisation:
//! at or above [`super::AutoParams::saturation`] the server is saturated.

use crate::histogram::Histogram;
use crate::policy::{Observation, StageWork};

/// The largest share by which [`mix_correction`] moves a pair's log ratio
/// (e = 2.7×): stage figures come from the guest, and a correction beyond
/// it says they are not worth trusting, not that the mix moved that much.
const MAX_MIX_CORRECTION: f64 = 1.0;

/// What a trial optimises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Objective {
    /// The completed-request rate (requests/s): higher is better.
    Rate,
    /// CPU per completed request (ns): lower is better.
    CpuPerRequest,
}

impl Objective {
    /// `rate` or `CPU per request`.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Rate => "rate",
            Objective::CpuPerRequest => "CPU per request",
        }
    }
}

/// The operator's bound on a mode's p99 request latency against the
/// unstaged mode's: `[policy] max_p99_increase` (a fraction) or
/// `latency_slo_us` (an absolute p99).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyBound {
    /// The most a mode may raise p99 over unstaged's (0.10 = 10 %).
    pub max_p99_increase: f64,
    /// A p99 the operator accepts (ns): with it, a mode may raise p99 up
    /// to it, or up to unstaged's when that is higher (a mode is never
    /// refused for being no worse than unstaged); `None`: the fraction
    /// applies.
    pub slo_ns: Option<f64>,
}

impl LatencyBound {
    /// `max_p99_increase` by default: 10 %, about the run-to-run spread of
    /// a p99 measured over a few thousand requests.
    pub const DEFAULT_MAX_P99_INCREASE: f64 = 0.10;

    /// The highest p99 (ns) a mode may have when unstaged's is
    /// `unstaged_p99` (ns).
    pub fn limit_ns(&self, unstaged_p99: f64) -> f64 {
        match self.slo_ns {
            Some(slo) => slo.max(unstaged_p99),
            None => unstaged_p99 * (1.0 + self.max_p99_increase),
        }
    }
}

impl Default for LatencyBound {
    fn default() -> Self {
        Self {
            max_p99_increase: Self::DEFAULT_MAX_P99_INCREASE,
            slo_ns: None,
        }
    }
}

/// One mode's measured periods in a trial.
#[derive(Clone, Debug, Default)]
pub(super) struct Measured {
    /// Per measured period, its rate (requests/s).
    rates: Vec<f64>,
    /// Work CPU (ns) and requests of the measured periods that had CPU
    /// figures, and how many of them there were.
    cpu_ns: f64,
    cpu_requests: f64,
    cpu_periods: usize,
    /// Per measured period with one, its utilisation (0..=1).
    utilisation: Vec<f64>,
    /// The measured periods' sampled latencies.
    latency: Histogram,
    /// Per stage, the work and its time over the measured periods that
    /// gave them ([`Observation::stages`]), and how many did.
    stages: Vec<StageWork>,
    stage_periods: usize,
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

impl Measured {
    /// Adds a measured period (one with completed requests).
    pub(super) fn record(&mut self, o: &Observation) {
        self.rates.push(o.requests_per_s);
        if let Some(cpu) = o.cpu_ns.filter(|c| c.is_finite() && *c >= 0.0) {
            if o.requests > 0.0 && o.requests.is_finite() {
                self.cpu_ns += cpu;
                self.cpu_requests += o.requests;
                self.cpu_periods += 1;
            }
        }
        if let Some(u) = o.utilisation.filter(|u| u.is_finite()) {
            self.utilisation.push(u.clamp(0.0, 1.0));
        }
        if let Some(h) = &o.latency {
            self.latency.merge(h);
        }
        if let Some(stages) = &o.stages {
            if self.stages.len() < stages.len() {
                self.stages.resize(stages.len(), StageWork::default());
            }
            let valid = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
            for (sum, w) in self.stages.iter_mut().zip(stages) {
                sum.work += valid(w.work);
                sum.time += valid(w.time);
            }
            self.stage_periods += 1;
        }
    }

    /// Per stage, its share of the work, when every measured period gave
    /// stage figures and some stage did work.
    fn mix(&self) -> Option<Vec<f64>> {
        let total: f64 = self.stages.iter().map(|s| s.work).sum();
        (self.stage_periods > 0 && self.stage_periods == self.periods() && total > 0.0)
            .then(|| self.stages.iter().map(|s| s.work / total).collect())
    }

    /// Time per unit of work had the stages run in the shares `mix`:
    /// `Σ mixₛ · timeₛ ÷ workₛ`, a stage that did no work here costing the
    /// average unit.
    fn unit_cost(&self, mix: &[f64]) -> Option<f64> {
        let work: f64 = self.stages.iter().map(|s| s.work).sum();
        let time: f64 = self.stages.iter().map(|s| s.time).sum();
        if work <= 0.0 || time <= 0.0 {
            return None;
        }
        let cost: f64 = mix
            .iter()
            .enumerate()
            .map(|(i, m)| match self.stages.get(i) {
                Some(s) if s.work > 0.0 => m * s.time / s.work,
                _ => m * time / work,
            })
            .sum();
        (cost.is_finite() && cost > 0.0).then_some(cost)
    }

    /// Measured periods.
    pub(super) fn periods(&self) -> usize {
        self.rates.len()
    }

    /// Mean rate (requests/s).
    pub(super) fn rate(&self) -> Option<f64> {
        mean(&self.rates)
    }

    /// CPU per request (ns) over the measured periods, when every one of
    /// them had CPU figures.
    pub(super) fn cpu_per_request_ns(&self) -> Option<f64> {
        (self.cpu_periods > 0 && self.cpu_periods == self.periods() && self.cpu_requests > 0.0)
            .then(|| self.cpu_ns / self.cpu_requests)
    }

    /// Mean utilisation, when every measured period had one.
    pub(super) fn utilisation(&self) -> Option<f64> {
        (self.utilisation.len() == self.periods())
            .then(|| mean(&self.utilisation))
            .flatten()
    }

    /// p99 latency (ns) when at least `min_samples` requests were timed.
    pub(super) fn p99_ns(&self, min_samples: u64) -> Option<f64> {
        (self.latency.count() >= min_samples.max(1))
            .then(|| self.latency.quantile(0.99))
            .flatten()
    }

    /// The mode's score under `objective`, higher better: the rate, or
    /// minus the CPU per request.
    pub(super) fn score(&self, objective: Objective) -> Option<f64> {
        match objective {
            Objective::Rate => self.rate(),
            Objective::CpuPerRequest => self.cpu_per_request_ns().map(|c| -c),
        }
    }
}

/// What to add to a pair's log ratio (candidate `c` over incumbent `i`,
/// either objective) so that both sides are judged at one stage mix, the
/// mean of their two ([`StageWork`] says why the mix of a short slice
/// moves with the mode). A side's figure is scaled by `f = κ(ref) ÷
/// κ(own)`, where `κ(mix)` is its time per unit of work at that mix: the
/// rate divided by `f`, CPU per request multiplied by it. Either way the
/// log ratio gains `ln fᵢ − ln f꜀`, bounded by [`MAX_MIX_CORRECTION`];
/// 0 when either side has no stage figures.
pub(super) fn mix_correction(i: &Measured, c: &Measured) -> f64 {
    let (Some(mi), Some(mc)) = (i.mix(), c.mix()) else {
        return 0.0;
    };
    let n = mi.len().max(mc.len());
    let at = |m: &[f64], k: usize| m.get(k).copied().unwrap_or(0.0);
    let reference: Vec<f64> = (0..n).map(|k| (at(&mi, k) + at(&mc, k)) / 2.0).collect();
    let ln_f = |m: &Measured, own: &[f64]| -> Option<f64> {
        Some((m.unit_cost(&reference)? / m.unit_cost(own)?).ln())
    };
    match (ln_f(i, &mi), ln_f(c, &mc)) {
        (Some(fi), Some(fc)) if (fi - fc).is_finite() => {
            (fi - fc).clamp(-MAX_MIX_CORRECTION, MAX_MIX_CORRECTION)
        }
        _ => 0.0,
    }
}

/// One mode in a [`TrialSummary`].
#[derive(Clone, Debug, PartialEq)]
pub struct ModeSummary {
    /// The mode's name.
    pub mode: &'static str,
    /// Measured periods.
    pub periods: usize,
    /// Mean completed-request rate (requests/s).
    pub rate: Option<f64>,
    /// CPU per request (ns).
    pub cpu_per_request_ns: Option<f64>,
    /// p99 request latency (ns), with enough requests timed.
    pub p99_ns: Option<f64>,
    /// Mean utilisation (0..=1).
    pub utilisation: Option<f64>,
    /// Lost its duel (its test found it no better, or it was refused).
    pub dropped: bool,
    /// Not kept: its p99 was beyond the latency bound.
    pub over_latency_bound: bool,
}

/// What a finished trial measured and why it kept its mode, for the
/// report and the API.
#[derive(Clone, Debug, PartialEq)]
pub struct TrialSummary {
    /// The mode kept.
    pub kept: &'static str,
    /// The objective the trial compared ([`Objective::name`]).
    pub objective: &'static str,
    /// What decided: the objective's name, or `latency bound` when a mode
    /// better by the objective was refused for its p99.
    pub decided_by: &'static str,
    /// The unstaged slices' utilisation (the first chose the objective).
    pub unstaged_utilisation: Option<f64>,
    /// The highest p99 a mode could keep (ns), when unstaged's was known.
    pub p99_limit_ns: Option<f64>,
    /// Every mode's figures, in [`super::Mode::ALL`] order.
    pub modes: Vec<ModeSummary>,
    /// The duels, in the order they ran.
    pub duels: Vec<super::DuelSummary>,
    /// The modes not trialled, and why.
    pub skipped: Vec<(&'static str, String)>,
    /// Periods each slice skipped after a change of plan (measured).
    pub settle_periods: u32,
}
