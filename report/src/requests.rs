//! What the report says about requests beyond their count: their latency
//! (the guest's sampled histograms, ABI minor 4: [`LatencyReport`]), the
//! CPU they cost on the host ([`CpuReport`]), and what `auto`'s last trial
//! measured of each mode ([`TrialReport`]).

use serde::{Deserialize, Serialize};

/// One cumulative bucket of the request-latency histogram (Prometheus'
/// `le`): requests that took at most `le_ns`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LatencyBucket {
    /// The bucket's upper bound (ns, inclusive).
    pub le_ns: u64,
    /// Timed requests at or below it.
    pub count: u64,
}

/// The requests the guest timed over the run (or up to now): sampled, one
/// in N (docs/stage-protocol.md §5b), from their start to their
/// `stage_exit`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencyReport {
    /// Requests timed.
    pub samples: u64,
    /// Sum of their latencies (ns).
    pub sum_ns: u64,
    /// Mean latency (µs).
    pub mean_us: f64,
    /// Median (µs), interpolated inside its bucket (≤ 12.5 % error).
    pub p50_us: f64,
    /// 90th percentile (µs).
    pub p90_us: f64,
    /// 99th percentile (µs).
    pub p99_us: f64,
    /// 99.9th percentile (µs).
    pub p999_us: f64,
    /// Impossible histogram values the host clamped (buckets going
    /// backwards, more timed requests than completed ones, a sum the
    /// buckets cannot hold).
    pub clamps: u64,
    /// Cumulative counts at every power of two of ns from 128 ns to
    /// 2^38 ns (exact bucket boundaries); the `+Inf` bucket is `samples`.
    pub buckets: Vec<LatencyBucket>,
}

/// The CPU the guest's work cost on the host over the run (or up to now):
/// its vCPU threads' CPU time minus its idle spinning, over the policy
/// periods where the host could read both (docs/design.md, "CPU per
/// request").
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuReport {
    /// Policy periods with CPU figures.
    pub periods: u64,
    /// Work CPU in them (ns).
    pub work_ns: u64,
    /// Requests completed in them.
    pub requests: f64,
    /// `work_ns` ÷ `requests` (µs); 0 without requests.
    pub cpu_per_request_us: f64,
    /// Mean utilisation of the VM's vCPU capacity in them (0..=1): work
    /// CPU ÷ (period × the cores its vCPUs may use).
    pub utilisation: f64,
    /// The last period's utilisation, per vCPU (work CPU ÷ period).
    #[serde(default)]
    pub vcpu_utilisation: Vec<f64>,
}

/// One mode in a [`TrialReport`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ModeReport {
    /// `unstaged`, `temporal`, `spatial` or `both`.
    pub mode: String,
    /// Measured periods.
    pub periods: u64,
    /// Completed requests per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_s: Option<f64>,
    /// CPU per request (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_per_request_us: Option<f64>,
    /// p99 latency (µs), when enough requests were timed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_us: Option<f64>,
    /// Mean utilisation (0..=1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilisation: Option<f64>,
    /// Lost its duel (no better, or refused).
    pub dropped: bool,
    /// Refused: p99 beyond the latency bound.
    pub over_latency_bound: bool,
}

/// `auto`'s last finished trial: each mode's figures and what decided.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TrialReport {
    /// The mode kept.
    pub kept: String,
    /// The objective compared: `rate` or `CPU per request`.
    pub objective: String,
    /// What decided: the objective, or `latency bound` when a mode better
    /// by it was refused for its p99.
    pub decided_by: String,
    /// The unstaged epochs' utilisation that chose the objective.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unstaged_utilisation: Option<f64>,
    /// The highest p99 a mode could keep (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_limit_us: Option<f64>,
    /// Per mode.
    pub modes: Vec<ModeReport>,
    /// The duels, in the order they ran.
    #[serde(default)]
    pub duels: Vec<DuelReport>,
    /// Modes not trialled, and why.
    #[serde(default)]
    pub skipped: Vec<SkippedMode>,
    /// Periods a slice skipped after a change of plan (measured).
    #[serde(default)]
    pub settle_periods: u32,
}

/// One duel of a trial: a candidate against the incumbent in paired
/// slices, stopped by a sequential test (SPRT).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DuelReport {
    /// The incumbent mode.
    pub incumbent: String,
    /// The candidate mode.
    pub candidate: String,
    /// Pairs of slices measured.
    pub pairs: u32,
    /// Mean per-pair difference of the objective (%; positive: the
    /// candidate better), and its standard error (%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_pct: Option<f64>,
    /// See `mean_pct`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub se_pct: Option<f64>,
    /// The test's log-likelihood ratio at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llr: Option<f64>,
    /// `better`, `no better`, `capped` or `over twice the latency bound`.
    pub outcome: String,
    /// One-sided confidence that the candidate is better at all (0..=1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    /// Why a candidate found better was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub veto: Option<String>,
    /// The candidate became the incumbent.
    pub won: bool,
    /// The duel stopped as futile: its first pairs fell behind by far more
    /// than the trial's noise measured by its earlier duels.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub futile: bool,
}

/// A mode a trial did not run, and why.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SkippedMode {
    /// The mode.
    pub mode: String,
    /// Why the counters ruled it out.
    pub why: String,
}
