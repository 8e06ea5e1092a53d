//! Response bodies of the operator API (`stagevm --api-socket PATH`,
//! HTTP/1.1 on a Unix socket), shared by the VMM, `stagevm-remote` and the
//! tests. The request bodies are host-sched's
//! (`host_sched::config::{PolicyUpdate, BudgetsUpdate, CpuWeightUpdate}`),
//! validated by the
//! code that validates a `--stages` file.
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `GET /api/v1/vm.info` | — | [`VmInfo`] |
//! | `GET /api/v1/stages[?timeline=N][&decisions=N]` | — | [`StagesView`] |
//! | `PUT /api/v1/stages.policy` | `PolicyUpdate` | `202` [`Accepted`] |
//! | `PUT /api/v1/stages.budgets` | `BudgetsUpdate` | `202` [`Accepted`] |
//! | `PUT /api/v1/stages.cpu_weight` | `CpuWeightUpdate` | `202` [`Accepted`] |
//! | `PUT /api/v1/stages.trace` | [`TraceUpdate`] | `202` [`Accepted`] |
//! | `PUT /api/v1/vm.shutdown` | — | `202` [`Accepted`] |
//! | `GET /metrics` | — | Prometheus text exposition 0.0.4 |
//!
//! Errors are answered with a 4xx or 5xx status and an [`ApiError`] body.

use serde::{Deserialize, Serialize};

use crate::{ChannelReport, HelperThread, NetReport, SchedReport, VcpuThread};

/// The API's path prefix (version 1).
pub const PREFIX: &str = "/api/v1";

/// Largest request body (bytes); a larger one is answered `413`.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Timeline entries `GET /api/v1/stages` returns without `?timeline=N`.
pub const DEFAULT_TIMELINE: usize = 20;

/// Decisions `GET /api/v1/stages` returns without `?decisions=N`.
pub const DEFAULT_DECISIONS: usize = 10;

/// `GET /api/v1/vm.info`: the VM's configuration, state and threads.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmInfo {
    /// `stagevm`'s version.
    pub version: String,
    /// The VMM's process id.
    pub pid: u32,
    /// `running`, or `stopping` once the VM's end was requested.
    pub state: String,
    /// Guest kernel path.
    pub kernel: String,
    /// Kernel command line.
    pub cmdline: String,
    /// vCPUs.
    pub vcpu_count: u32,
    /// Guest RAM (bytes).
    pub memory_bytes: u64,
    /// Whether the VM has the stage device.
    pub stage_device: bool,
    /// Policy name now.
    pub policy: String,
    /// Stage-visit policy of the plan applied now (`fifo`, `cohort`, `srpt`,
    /// `dbr`, `mg1`, `color`; `auto`'s choice under `auto`).
    #[serde(default)]
    pub visit: String,
    /// Policy period now (ms).
    pub period_ms: u64,
    /// Stage cores now (cpulist).
    pub stage_cores: String,
    /// Housekeeping cores now (cpulist).
    pub housekeeping: String,
    /// Per vCPU thread: id and affinity (read back after the last pin).
    pub vcpus: Vec<VcpuThread>,
    /// Helper threads (this API's thread among them) and their affinities.
    pub helpers: Vec<HelperThread>,
    /// virtio-net devices and their counters now.
    #[serde(default)]
    pub nets: Vec<NetReport>,
}

/// `GET /api/v1/stages`: the live report, as the final one would be now.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StagesView {
    /// The stage channel's counters (`null` without a stage device); its
    /// `map_epoch` is the epoch of the stage map the guest reads now.
    pub stage_channel: Option<ChannelReport>,
    /// The scheduler: policy, placements, threads and the last timeline
    /// entries (`?timeline=N`, default [`DEFAULT_TIMELINE`]).
    pub sched: SchedReport,
    /// Timeline entries in all (the view holds the last ones).
    pub timeline_total: usize,
    /// The last timeline entries that carry a decision (`auto`'s trials and
    /// choices, operator changes with `source = "api"`), oldest first
    /// (`?decisions=N`, default [`DEFAULT_DECISIONS`]).
    pub decisions: Vec<crate::TimelineEntry>,
    /// A configuration change accepted and waiting for the next policy
    /// period, if any.
    pub pending: Option<String>,
}

/// `PUT /api/v1/stages.trace`: the event trace asked of a guest that
/// reports through stage counters (as `--stage-trace`), applied at once.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TraceUpdate {
    /// 0 = off, 1 = every event, N = every Nth event of each kind per vCPU
    /// (at most [`TRACE_EVERY_MAX`]).
    pub every: u64,
}

/// Largest `every` of a trace (`--stage-trace every=N` and
/// [`TraceUpdate`]): one event in a billion.
pub const TRACE_EVERY_MAX: u64 = 1_000_000_000;

/// `202 Accepted`: a change was validated and is applied at the next
/// policy period (a trace change at once).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Accepted {
    /// What will be applied, as recorded in the timeline.
    pub accepted: String,
}

/// The body of every error answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApiError {
    /// One line: what was wrong, naming the key and value.
    pub error: String,
}

/// `stagevm-hostd`'s `GET /api/v1/host`: the host's stage cores and how
/// they are shared among the VMs of its directory, as of the last period.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HostView {
    /// The stage cores the VMs share (cpulist).
    pub cores: String,
    /// Every VM's housekeeping cores (cpulist; empty: each VM's own).
    pub housekeeping: String,
    /// The allocation period (ms).
    pub period_ms: u64,
    /// Periods run since the daemon started.
    pub periods: u64,
    /// The VMs found in the directory, by name.
    pub vms: Vec<HostVm>,
}

/// One VM in a [`HostView`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HostVm {
    /// The API socket's stem.
    pub name: String,
    /// Its stage cores now (cpulist).
    pub cores: String,
    /// Whether another VM's set holds one of its cores (more VMs than
    /// cores).
    pub shared: bool,
    /// Its demand at the last period (cores).
    pub demand: f64,
    /// Its vCPUs.
    pub vcpus: usize,
    /// Its budget: weight, `min_cores`, `max_cores` (`null`: all) and fixed
    /// cores (empty: none).
    pub weight: f64,
    /// See `weight`.
    pub min_cores: usize,
    /// See `weight`.
    pub max_cores: Option<usize>,
    /// See `weight`.
    pub fixed: String,
    /// Cores moved to it since the daemon started.
    pub moves: u64,
    /// Allocations it refused or requests that failed.
    pub errors: u64,
    /// Periods it was skipped (its socket did not answer in time).
    pub skipped: u64,
    /// Periods its demand exceeded its cores by a whole core or more.
    pub waited: u64,
    /// Whether it runs on a shared core while idle (`lend_when_idle`).
    #[serde(default)]
    pub lend_when_idle: bool,
    /// Whether it lent its core: idle, owning none, on a shared one.
    #[serde(default)]
    pub lent: bool,
    /// The cores of `cores` counted as its own by the last allocation
    /// (cpulist; empty: it owns none — a sharer — or none was made yet).
    #[serde(default)]
    pub owned: String,
    /// The CPU weight the daemon gave it for cores it shares
    /// (`host.cpu_weight`; `None` while its cores are its own).
    #[serde(default)]
    pub cpu_weight: Option<u32>,
    /// What enforces its CPU weight and CPU set: the group the daemon put
    /// its VMM in (`cgroup v1 /sys/fs/cgroup/cpu/stagevm-db/cpu.shares`),
    /// or, where the daemon cannot write one, `the VMM (vCPU threads'
    /// nice): WHY`. Empty before the daemon knew its process.
    #[serde(default)]
    pub enforced_by: String,
    /// The VMM's pid, from the socket's `SO_PEERCRED` (0: not known).
    #[serde(default)]
    pub pid: u32,
    /// Reads refused because the socket's peer is not trusted (another
    /// uid, or an executable that is not a trusted VMM): nothing it says
    /// is believed, and it gets no cores.
    #[serde(default)]
    pub refused: u64,
}
