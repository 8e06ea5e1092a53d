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
use crate::policy::Observation;

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
