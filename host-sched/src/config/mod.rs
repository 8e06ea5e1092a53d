//! The operator's stage configuration (TOML, `stagevm --stages PATH`) and its
//! resolution against the host topology.
//!
//! ```toml
//! [host]
//! cores = "0-1"          # stage cores; default: isolated CPUs, else all allowed
//! housekeeping = ""      # helper threads; default: allowed minus stage cores
//! cpu_weight = 100       # the VM's CPU weight on a core shared with other VMs (optional)
//!
//! [policy]
//! name = "proportional"  # off | pinned | static | proportional | auto
//! period_ms = 20         # policy period (seed 000 §4.5 "maximum assignment age")
//! smoothing = 0.7        # EWMA weight of the newest load sample (proportional)
//! hysteresis = 0.1       # cores a new allocation must gain (and hold for 2 periods)
//! max_p99_increase = 0.1 # auto: most a mode may raise p99 latency over unstaged (fraction)
//! latency_slo_us = 2000  # auto: or a p99 bound in µs (optional; 0 = none)
//!
//! [[stage]]
//! name = "parse"         # matched with the names the guest registers
//! min_cores = 0
//! max_cores = 2
//! weight = 1.0           # static allocation share; multiplies measured load
//! ```
//!
//! Every error names the key and the bad value, on one line (a TOML syntax
//! error shows the line with a caret, as the toml crate prints it).

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::error::StagesConfigError;
pub use resolve::resolve;
pub use update::{BudgetsUpdate, CpuWeightUpdate, PolicyUpdate};

mod resolve;
mod resolved;
mod update;

use crate::cpuset::CpuSet;
use crate::policy::{PolicyKind, VisitPolicy};
use crate::topology::Topology;

/// The embedded default stage configuration ([`Config::default_stages`]).
pub const DEFAULT_STAGES: &str = include_str!("../../default-stages.toml");

/// `[host]`.
#[derive(Clone, Debug, PartialEq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostSection {
    /// Stage cores as a cpulist.
    pub cores: Option<String>,
    /// Housekeeping cores as a cpulist.
    pub housekeeping: Option<String>,
    /// The VM's CPU weight where its vCPU threads share a core with other
    /// VMs' (1..=[`MAX_CPU_WEIGHT`], cgroup v2's `cpu.weight` scale: 100
    /// is one ordinary process); left out, the VMM changes no thread's
    /// weight. Applied as [`crate::cpuweight`] says; `stagevm-hostd` sets
    /// it from its `[[vm]] weight` while VMs share cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_weight: Option<u32>,
}

/// Largest `host.cpu_weight` (cgroup v2's `cpu.weight` maximum,
/// Documentation/admin-guide/cgroup-v2.rst "CPU Interface Files").
pub const MAX_CPU_WEIGHT: u32 = 10_000;

/// `[policy]`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    /// Policy name.
    #[serde(default = "default_policy")]
    pub name: String,
    /// Policy period in ms.
    #[serde(default = "default_period")]
    pub period_ms: u64,
    /// EWMA weight of the newest sample, in (0, 1].
    #[serde(default = "default_smoothing")]
    pub smoothing: f64,
    /// Minimum improvement (in cores) for a new allocation, ≥ 0.
    #[serde(default = "default_hysteresis")]
    pub hysteresis: f64,
    /// Stage-visit policy of the guest's vCPU schedulers (temporal
    /// staging: `fifo`, `cohort`, `srpt`, `dbr`, `mg1`, `color`; seed 002
    /// ch. 3); `auto` chooses its own.
    #[serde(default = "default_visit")]
    pub visit: String,
    /// `auto`: the most a mode may raise the p99 request latency over the
    /// unstaged mode's, as a fraction (0.10 = 10 %), ≥ 0.
    #[serde(default = "default_max_p99_increase")]
    pub max_p99_increase: f64,
    /// `auto`: a p99 request latency the operator accepts (µs): a mode may
    /// raise p99 up to it (or up to unstaged's, when that is higher), in
    /// place of `max_p99_increase`; absent or 0: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_slo_us: Option<f64>,
    /// `auto`: the modes it trials against unstaged (which it always
    /// runs): `temporal`, `spatial`, `both`; absent: all three. A guest
    /// staged through the preload library, whose spatial route costs a
    /// migration per stage switch, lists `["temporal"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_modes: Option<Vec<String>>,
    /// `auto`: a null experiment (false by default): its one candidate is
    /// unstaged under another name (`temporal` in its verdicts and
    /// report), so every duel should find no difference; what a switch
    /// to it costs nothing. For judging the decision procedure (bench-auto
    /// O2), not for a server.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_twin: bool,
}

fn default_max_p99_increase() -> f64 {
    crate::policy::LatencyBound::DEFAULT_MAX_P99_INCREASE
}

/// Largest `policy.max_p99_increase` (100 × unstaged's p99: no bound in
/// practice, and finite).
pub const MAX_P99_INCREASE: f64 = 100.0;
/// Largest `policy.latency_slo_us` (µs): 1,000 s.
pub const MAX_LATENCY_SLO_US: f64 = 1e9;

fn default_policy() -> String {
    "static".into()
}
fn default_period() -> u64 {
    20
}
fn default_smoothing() -> f64 {
    0.7
}
fn default_hysteresis() -> f64 {
    0.1
}
fn default_visit() -> String {
    "fifo".into()
}

impl Default for PolicySection {
    fn default() -> Self {
        Self {
            name: default_policy(),
            period_ms: default_period(),
            smoothing: default_smoothing(),
            hysteresis: default_hysteresis(),
            visit: default_visit(),
            max_p99_increase: default_max_p99_increase(),
            latency_slo_us: None,
            auto_modes: None,
            auto_twin: false,
        }
    }
}

/// One `[[stage]]`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StageSection {
    /// Stage name (as the guest registers it).
    pub name: String,
    /// Fewest cores the stage gets (default 0: it may share the victim core).
    #[serde(default)]
    pub min_cores: usize,
    /// Most cores the stage gets (default: all stage cores).
    pub max_cores: Option<usize>,
    /// Static share and load multiplier (default 1).
    #[serde(default = "default_weight")]
    pub weight: f64,
}

/// Largest `--stages` file (bytes): a configuration is a few hundred bytes;
/// a larger "file" (say `/dev/zero` behind a link) is refused unread.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Largest stage weight: far above any useful ratio, and small enough that
/// weight × load (vCPUs, ≤ 64) stays finite.
pub const MAX_WEIGHT: f64 = 1e6;

fn default_weight() -> f64 {
    1.0
}

/// The whole file.
#[derive(Clone, Debug, PartialEq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[host]`.
    #[serde(default)]
    pub host: HostSection,
    /// `[policy]`.
    #[serde(default)]
    pub policy: PolicySection,
    /// `[[stage]]` entries.
    #[serde(default, rename = "stage")]
    pub stages: Vec<StageSection>,
}

impl Config {
    /// Parses TOML text; `origin` (a path) prefixes parse errors.
    ///
    /// A syntax error, an unknown key or a wrong type gives the toml
    /// crate's own message: the line and column, the line itself with a
    /// caret under the error, and what was expected (several lines; the
    /// one error of this crate that is not one line, as a compiler's).
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, StagesConfigError> {
        toml::from_str(text).map_err(|e| StagesConfigError::Toml {
            origin: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })
    }

    /// The default stage configuration (`host-sched/default-stages.toml`,
    /// embedded): the test guest's three stages, equal weights, `static`
    /// every 20 ms. What a VMM uses when the operator gives no file.
    pub fn default_stages() -> Self {
        Self::from_toml(DEFAULT_STAGES, "default-stages.toml")
            .expect("the embedded default-stages.toml parses (tested)")
    }

    /// `path`, or without one [`Config::default_stages`]. Errors: those of
    /// [`Config::load`].
    pub fn load_or_default(path: Option<&std::path::Path>) -> Result<Self, StagesConfigError> {
        path.map_or_else(|| Ok(Self::default_stages()), Self::load)
    }

    /// Reads and parses a file.
    /// Errors: not a regular file, larger than [`MAX_CONFIG_BYTES`],
    /// unreadable, or not a valid configuration.
    pub fn load(path: &std::path::Path) -> Result<Self, StagesConfigError> {
        let read_err = |reason: String| StagesConfigError::Read {
            path: path.display().to_string(),
            reason,
        };
        let meta = std::fs::metadata(path).map_err(|e| read_err(e.to_string()))?;
        if !meta.is_file() {
            return Err(read_err("not a regular file".into()));
        }
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(read_err(format!(
                "{} bytes is larger than {MAX_CONFIG_BYTES} bytes",
                meta.len()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| read_err(e.to_string()))?;
        Self::from_toml(&text, &path.display().to_string())
    }
}

/// A stage's budget after resolution.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    /// Stage name.
    pub name: String,
    /// Fewest cores.
    pub min_cores: usize,
    /// Most cores.
    pub max_cores: usize,
    /// Weight (> 0 or 0).
    pub weight: f64,
}

/// The configuration resolved against the host: cores, budgets, policy.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// Cores that run vCPUs (stage cores), in increasing order.
    pub stage_cores: CpuSet,
    /// Cores for the VMM's helper threads; equal to `stage_cores` when
    /// `helpers_share_stage_cores`.
    pub housekeeping: CpuSet,
    /// No housekeeping core was left: helper threads share the stage cores.
    pub helpers_share_stage_cores: bool,
    /// Configured stage budgets, in file order.
    pub budgets: Vec<Budget>,
    /// Policy.
    pub policy: PolicyKind,
    /// Policy period.
    pub period: Duration,
    /// EWMA weight.
    pub smoothing: f64,
    /// Hysteresis in cores.
    pub hysteresis: f64,
    /// Stage-visit policy (temporal staging, ABI minor 3).
    pub visit: VisitPolicy,
    /// `auto`'s bound on tail latency.
    pub latency: crate::policy::LatencyBound,
    /// The modes `auto` trials (`policy.auto_modes`; unstaged always).
    pub auto_modes: crate::policy::auto::Modes,
    /// `policy.auto_twin`: `auto` runs the null experiment.
    pub auto_twin: bool,
    /// `host.cpu_weight`: the VM's CPU weight on cores it shares with
    /// other VMs (1..=[`MAX_CPU_WEIGHT`]); `None`: no thread's weight is
    /// changed.
    pub cpu_weight: Option<u32>,
}

/// Command-line overrides of the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--stage-cores`.
    pub cores: Option<String>,
    /// `--housekeeping`.
    pub housekeeping: Option<String>,
    /// `--policy`.
    pub policy: Option<String>,
    /// `--visit`.
    pub visit: Option<String>,
}

#[cfg(test)]
mod tests;
