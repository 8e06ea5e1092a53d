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
    /// Dropped from the trial (decidedly behind another mode).
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
}
