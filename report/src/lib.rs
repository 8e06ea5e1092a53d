//! The report of one `stagevm` run: what `--report PATH` writes as JSON and
//! what the summary on stderr prints.
//!
//! One crate of plain data types, so that the VMM writes and the tests,
//! benchmarks and the simulator read the same typed structs (no untyped
//! JSON chains). Every counter is a total over the run.
//!
//! * [`Report`] — `exit_code`, `exit`, `stage_channel` ([`ChannelReport`],
//!   `null` without a stage device), `sched` ([`SchedReport`]), `disks`
//!   ([`BlockReport`]), `nets` ([`NetReport`]).
//! * [`api`] — the operator API's response bodies (`--api-socket`), built
//!   from the same structs while the VM runs.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub mod api;
mod cpu_weight;
mod per_stage;
mod requests;
mod summary;

pub use cpu_weight::CpuWeightReport;
pub use per_stage::PerStage;
pub use requests::{
    CpuReport, DuelReport, LatencyBucket, LatencyReport, ModeReport, SkippedMode, TrialReport,
};

/// A string from the guest as it may be shown on an operator's terminal or
/// in a log line: control characters, quotes and backslashes escaped
/// (`str::escape_debug`), so a guest cannot send escape sequences or forge
/// a `stagevm:` line. Stage names are the guest's: always print them
/// through this.
pub fn escape(guest: &str) -> String {
    guest.escape_debug().to_string()
}

pub use summary::{net_summary, summary};

/// Per-stage counters of the stage channel.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StageStats {
    /// Stage id (the guest's index into its stage descriptors).
    pub id: u32,
    /// Stage name from the guest's descriptor (lossy UTF-8).
    pub name: String,
    /// Valid enter events naming this stage.
    pub events: u64,
    /// Enter events where the vCPU switched into this stage from another one
    /// (or from no stage).
    pub arrivals: u64,
    /// vCPU time spent in this stage, from event timestamps (ns; TSC ticks
    /// converted with the guest TSC frequency, raw ticks if it is unknown).
    pub occupancy_ns: u64,
    /// Threads that entered this stage on a different vCPU than their
    /// previous event's (thread migrations into the stage).
    pub migrations_in: u64,
    /// Threads that left this stage for another stage on a different vCPU.
    pub migrations_out: u64,
    /// Cohorts of this stage: runs of consecutive entries into it on one
    /// vCPU by different threads, from the event stream (a rings guest's
    /// events, or a counters guest's complete trace: `trace_every` 1); 0
    /// without one.
    #[serde(default)]
    pub cohorts: u64,
    /// Entries those cohorts held: ÷ `cohorts` = the mean cohort size
    /// (threads per visit of the stage).
    #[serde(default)]
    pub cohort_entries: u64,
}

/// Per-vCPU ring counters.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct VcpuRingStats {
    /// vCPU index.
    pub index: u32,
    /// Stage switches reported: enters, exits and idle markers (counted
    /// transitions in counters mode, valid ring events in rings mode).
    pub events: u64,
    /// Requests completed (`stage_exit`).
    pub exits: u64,
    /// Times the vCPU went idle (idle markers).
    pub idles: u64,
    /// Entries dropped because their `seq` was not the slot's index (torn,
    /// stale or forged).
    pub dropped_bad_seq: u64,
    /// Entries dropped because their stage id was out of range.
    pub dropped_bad_stage: u64,
    /// Times `head` was behind `tail`, more than a ring ahead, or would run
    /// the 64-bit index past its end; the ring was resynchronised to `head`
    /// and the skipped range counted here once.
    pub bad_index: u64,
    /// The guest's own count of full-ring back-offs (from its ring header;
    /// rings-only mode).
    pub ring_full_backoffs: u64,
    /// Trace events the guest dropped because the ring was full (from its
    /// ring header; counters mode, ABI minor 2).
    #[serde(default)]
    pub trace_dropped: u64,
    /// Idle time of the vCPU (ns), from its counters (counters mode; 0 for
    /// a rings guest).
    #[serde(default)]
    pub idle_ns: u64,
    /// Impossible counter values the host clamped on this vCPU: counters
    /// that went backwards, a state code out of range, more time than the
    /// policy period (docs/stage-protocol.md §8).
    #[serde(default)]
    pub counter_clamps: u64,
}

impl VcpuRingStats {
    /// All drops on this ring.
    pub fn dropped(&self) -> u64 {
        self.dropped_bad_seq
            .saturating_add(self.dropped_bad_stage)
            .saturating_add(self.bad_index)
    }
}

/// Everything the stage channel counted.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChannelReport {
    /// Whether an area is registered at the end.
    pub registered: bool,
    /// How the (last) registered guest reports: `counters` (ABI minor 2:
    /// per-vCPU counters read once per policy period, rings only for the
    /// trace) or `rings` (every switch an event in the rings); empty before
    /// a registration.
    #[serde(default)]
    pub mode: String,
    /// The event trace asked of the guest now (counters mode): 0 = off,
    /// N = every Nth event of each kind per vCPU (`--stage-trace`).
    #[serde(default)]
    pub trace_every: u64,
    /// Valid trace events drained from the rings (counters mode).
    #[serde(default)]
    pub traced_events: u64,
    /// Sum of the guest's dropped trace events (full rings).
    #[serde(default)]
    pub trace_dropped: u64,
    /// Sum of the impossible counter values the host clamped.
    #[serde(default)]
    pub counter_clamps: u64,
    /// REGISTERs that came less than a policy period after the last one
    /// served: answered with the current map, their re-planning left to the
    /// next policy period (a guest may register in a loop).
    #[serde(default)]
    pub registrations_coalesced: u64,
    /// UNREGISTERs whose rings were not read because the events left by
    /// earlier ones were still waiting for a drain (the backlog is bounded
    /// to one drain pass: a guest that unregisters in a loop loses its own
    /// last events, never the VMM's memory).
    #[serde(default)]
    pub unread_at_unregister: u64,
    /// Successful registrations.
    pub registrations: u64,
    /// Refused REGISTERs, by status name.
    pub registrations_rejected: BTreeMap<String, u64>,
    /// Drain period (µs).
    pub drain_period_us: u64,
    /// Drain passes done.
    pub drains: u64,
    /// Entries per ring of the (last) registered area.
    pub ring_entries: u32,
    /// Stage-map epoch last published.
    pub map_epoch: u64,
    /// Per stage.
    pub stages: Vec<StageStats>,
    /// Per vCPU.
    pub vcpus: Vec<VcpuRingStats>,
    /// Sum of dropped entries over all rings.
    pub dropped: u64,
    /// Sum of the guest's full-ring back-offs.
    pub ring_full_backoffs: u64,
    /// WAIT commands served.
    pub waits: u64,
    /// WAKE commands served (from the guest).
    pub wakes: u64,
    /// Parked vCPUs with queued work woken by the scheduler thread.
    pub host_wakes: u64,
    /// Stage-map epochs published (the first map at REGISTER included).
    pub maps_published: u64,
    /// Requests completed (valid `stage_exit` events).
    pub requests: u64,
    /// Guest time from the first to the last valid event (ns); for a
    /// counters guest, from the start of the first policy period with a
    /// stage switch to the last switch seen (a period's resolution at the
    /// start).
    pub busy_ns: u64,
    /// `requests` per second of `busy_ns` (0 before two events).
    pub requests_per_s: f64,
    /// Threads not tracked for migrations (more than the tracking limit).
    pub untracked_threads: u64,
    /// The requests the guest timed (ABI minor 4; `None` from an older
    /// guest or before the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyReport>,
}

/// A helper thread of the VMM and the affinity read back after pinning it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HelperThread {
    /// Thread name.
    pub name: String,
    /// Kernel thread id.
    pub tid: i32,
    /// Affinity read back with `sched_getaffinity` after pinning (cpulist).
    pub affinity: String,
    /// CPU time the thread used while the VM ran (ms; from
    /// `CLOCK_THREAD_CPUTIME_ID` when it ended; for `vmm-main`, from the
    /// start of the run, after the VM was built). 0 for a thread the VMM did
    /// not start (KVM's workers) or one still running.
    #[serde(default)]
    pub cpu_ms: f64,
}

/// A vCPU thread's id and its affinity as last applied and read back.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VcpuThread {
    /// vCPU index.
    pub index: u32,
    /// Kernel thread id (0 until the thread started).
    pub tid: i32,
    /// Affinity read back after the last pin (cpulist).
    pub affinity: String,
    /// CPU time the thread used (ms; guest time in the vCPU included), 0
    /// while it runs.
    #[serde(default)]
    pub cpu_ms: f64,
    /// Its nice level read back after the VM's CPU weight was applied to
    /// it (`host.cpu_weight` on the threads); `None` while no weight was
    /// applied to this thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nice: Option<i32>,
}

/// One policy period.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TimelineEntry {
    /// Time since the VM started (ms).
    pub t_ms: f64,
    /// vCPUs' worth of time spent in each stage over the period (the
    /// policy's input: busy ns / period ns), by stage name.
    pub load: PerStage<f64>,
    /// Cores allocated per stage (0 = rides on the victim core), by stage
    /// name.
    pub requirement: PerStage<usize>,
    /// Whether the stage map changed this period.
    pub map_changed: bool,
    /// Requests completed per second in the period (valid `stage_exit`
    /// events / period length), the rate `auto` compares.
    #[serde(default)]
    pub requests_per_s: f64,
    /// `auto` only: the mode it runs next (`staged` or `unstaged`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `auto`'s trial step or decision with the rates it compared, or a
    /// configuration change applied this period (then `source` says whose).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    /// Who made `decision` when it was not the policy: `api` for a change
    /// made through the operator API (`--api-socket`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The stage-visit policy of the period's plan, published in the stage
    /// map (temporal staging: `fifo`, `cohort`, `srpt`, `dbr`, `mg1`,
    /// `color`; `auto`'s choice under `auto`). Empty in an older report.
    #[serde(default)]
    pub visit: String,
    /// CPU per completed request in the period (µs): the vCPU threads'
    /// work CPU ÷ requests (docs/design.md, "CPU per request").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_per_request_us: Option<f64>,
    /// Share of the VM's vCPU capacity work used in the period (0..=1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilisation: Option<f64>,
    /// Median latency of the period's timed requests (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_us: Option<f64>,
    /// 99th percentile of the period's timed requests (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_us: Option<f64>,
    /// Requests the guest timed in the period.
    #[serde(default)]
    pub latency_samples: u64,
}

/// Per stage, where it runs now.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StagePlacement {
    /// Stage name.
    pub name: String,
    /// vCPUs serving it.
    pub vcpus: Vec<u32>,
    /// Cores its vCPUs run on (cpulist).
    pub cores: String,
    /// Cores allocated to it.
    pub requirement: usize,
}

/// What the scheduler did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SchedReport {
    /// Policy name (`off`, `pinned`, `static`, `proportional`, `auto`).
    pub policy: String,
    /// The stage-visit policy of the plan applied now (at the end, for the
    /// final report): the operator's `[policy] visit` / `--visit`, or
    /// `auto`'s choice. Empty in an older report.
    #[serde(default)]
    pub visit: String,
    /// Policy period (ms).
    pub period_ms: u64,
    /// Stage cores (cpulist).
    pub stage_cores: String,
    /// Housekeeping cores (cpulist).
    pub housekeeping: String,
    /// Warnings: helper threads sharing the stage cores, stage cores left
    /// unused for lack of vCPUs.
    pub warnings: Vec<String>,
    /// Per stage placement (empty before the guest registered).
    pub stages: Vec<StagePlacement>,
    /// Per vCPU thread.
    pub vcpus: Vec<VcpuThread>,
    /// Helper threads.
    pub helpers: Vec<HelperThread>,
    /// Stage-map changes the policy made (the first map included).
    pub map_changes: u64,
    /// Changes of the stage cores that kept their number, and so the
    /// policy and what it learnt (its plans' cores renamed).
    #[serde(default)]
    pub policy_kept: u64,
    /// vCPU thread re-pins after start.
    pub repins: u64,
    /// Mean `sched_setaffinity` latency of those re-pins (µs).
    pub repin_mean_us: f64,
    /// One entry per policy period, oldest first (the timeline is a ring
    /// bounded in bytes: `timeline_dropped` oldest entries are gone).
    pub timeline: Vec<TimelineEntry>,
    /// Oldest timeline entries dropped to keep it within its byte budget.
    #[serde(default)]
    pub timeline_dropped: u64,
    /// `--policy auto` only: what its trials cost (whole run, unlike the
    /// timeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoReport>,
    /// The CPU the guest's work cost (whole run; `None` when the host
    /// could not read its vCPU threads' scheduler statistics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuReport>,
    /// `auto`'s latency bound now: the most a mode may raise p99 over
    /// unstaged's (a fraction; `policy.max_p99_increase`).
    #[serde(default)]
    pub max_p99_increase: f64,
    /// The operator's p99 latency SLO (µs; `policy.latency_slo_us`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_slo_us: Option<f64>,
    /// The VM's CPU weight on shared cores, once `host.cpu_weight` was
    /// set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_weight: Option<CpuWeightReport>,
}

/// What `auto`'s trials cost over the run, in policy periods.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AutoReport {
    /// Policy periods `auto` planned.
    pub periods: u64,
    /// Trials started (the first, change points, intervals over).
    pub trials: u64,
    /// Periods spent in trials, all modes.
    pub trial_periods: u64,
    /// Periods finished trials spent in the modes they did not keep.
    pub losing_periods: u64,
    /// Trials whose kept mode differs from the previous hold's (a hold
    /// never switches by itself: these are all the switches).
    pub mode_switches: u64,
    /// `losing_periods` ÷ `periods`: the share of the run spent in the
    /// losing modes of trials, however close they came to the kept one.
    pub losing_share: f64,
    /// The trials' cost as a share of the run: the losing periods, each
    /// priced at the share of the kept mode's objective (rate, or CPU per
    /// request below saturation) its mode fell short by, ÷ `periods`
    /// (issue 49: ≤ 2 %). Two modes within 0.3 % cost ~0.3 % of the
    /// periods their duel ran the loser, however long it ran.
    #[serde(default)]
    pub cost_share: f64,
    /// Trials started by a change point (rate, utilisation, stage mix, or
    /// a held mode's p99 past the bound).
    #[serde(default)]
    pub change_points: u64,
    /// Duels run (one candidate against the incumbent each).
    #[serde(default)]
    pub duels: u64,
    /// Duels whose sequential test stopped at its cap on pairs.
    #[serde(default)]
    pub duels_capped: u64,
    /// Duels whose test found the candidate better (before any veto;
    /// under `[policy] auto_twin`, each is a false difference).
    #[serde(default)]
    pub duels_better: u64,
    /// Candidates the counters ruled out, over all trials.
    #[serde(default)]
    pub modes_skipped: u64,
    /// The last finished trial: each mode's figures and what decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_trial: Option<TrialReport>,
}

/// Counters of one virtio-blk disk.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BlockReport {
    /// Device name (`blk0`, …).
    pub name: String,
    /// Backing file.
    pub path: String,
    /// Read-only.
    pub readonly: bool,
    /// How queue notifications arrive: `ioeventfd` or `mmio-exit`.
    pub notify: String,
    /// Capacity in 512-byte sectors.
    pub sectors: u64,
    /// Requests completed with OK.
    pub ok: u64,
    /// Requests answered with an error status.
    pub errors: u64,
    /// Requests without a usable status byte.
    pub dropped: u64,
    /// Available-ring entries naming no descriptor of the queue.
    pub bad_heads: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
}

/// Counters of one virtio-net device (frames without their virtio-net
/// header; bytes are frame bytes).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NetReport {
    /// Device name (`net0`, …).
    pub name: String,
    /// The tap: its interface name, or `fd=N`.
    pub tap: String,
    /// The MAC offered to the guest (`aa:bb:cc:dd:ee:ff`).
    pub mac: String,
    /// How queue notifications arrive: `ioeventfd` or `mmio-exit`.
    pub notify: String,
    /// Frames delivered to the guest.
    pub rx_packets: u64,
    /// Bytes delivered to the guest.
    pub rx_bytes: u64,
    /// Frames from the tap not delivered (oversized, runts, no queue).
    pub rx_dropped: u64,
    /// Receive buffers refused (bad chains, too small).
    pub rx_errors: u64,
    /// Frames of the guest sent out on the tap.
    pub tx_packets: u64,
    /// Bytes sent out on the tap.
    pub tx_bytes: u64,
    /// Frames of the guest not sent (oversized, tap full or gone).
    pub tx_dropped: u64,
    /// Transmit chains refused (bad chains) or refused by the tap.
    pub tx_errors: u64,
    /// Descriptor chains refused, both queues.
    pub bad_chains: u64,
    /// Frames longer than the device's largest frame (1518 bytes), both
    /// directions.
    pub oversized: u64,
    /// The driver's notifications of the receive queue (`QueueNotify`
    /// writes: each one a VM exit).
    #[serde(default)]
    pub rx_notifications: u64,
    /// The driver's notifications of the transmit queue.
    #[serde(default)]
    pub tx_notifications: u64,
    /// Used-buffer interrupts raised to the guest.
    #[serde(default)]
    pub interrupts: u64,
    /// Polls of an empty queue the device did not make: the notification
    /// brought nothing new since the last fruitless poll, or the second's
    /// poll budget (5 % of a core) was spent.
    #[serde(default)]
    pub polls_skipped: u64,
    /// Receive notifications that brought no new buffer and let no frame
    /// through; each muted the receive notification for 1 ms (a guest
    /// notifying in a loop wakes the device at most once a ms).
    #[serde(default)]
    pub rx_muted: u64,
    /// Whether the tap disappeared while the VM ran.
    pub tap_gone: bool,
}

/// The JSON report of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// Version of the report's layout ([`REPORT_SCHEMA`]); 0 in a report
    /// written before the field existed.
    #[serde(default)]
    pub schema: u32,
    /// The `stagevm` that wrote it (its package version).
    #[serde(default)]
    pub stagevm_version: String,
    /// When the VM started to run (ms since the Unix epoch, UTC; the host's
    /// clock).
    #[serde(default)]
    pub started_unix_ms: u64,
    /// The same instant in RFC 3339, UTC, to the millisecond
    /// (`2026-11-27T21:55:03.123Z`); empty in an older report.
    #[serde(default)]
    pub started: String,
    /// How long the VM ran (ms), from starting its vCPUs to its end.
    #[serde(default)]
    pub duration_ms: u64,
    /// Exit status of `stagevm`.
    pub exit_code: u8,
    /// How the VM ended, as text.
    pub exit: String,
    /// Stage-channel counters (`None` without a stage device).
    pub stage_channel: Option<ChannelReport>,
    /// Scheduling: policy, placement, pins, timeline.
    pub sched: SchedReport,
    /// virtio-blk disks.
    pub disks: Vec<BlockReport>,
    /// virtio-net devices (absent in reports written before they existed).
    #[serde(default)]
    pub nets: Vec<NetReport>,
    /// Log lines a guest triggered beyond the rate limit (10 lines per 5 s
    /// per call site), counted instead of printed.
    #[serde(default)]
    pub log_lines_suppressed: u64,
    /// Console output bytes a `--serial pty` or `socket=` console lost to a
    /// full pty or a slow client (the console never blocks a vCPU).
    #[serde(default)]
    pub serial_dropped_bytes: u64,
}

/// The report layout's version ([`Report::schema`]): 1 is the first
/// versioned layout (issue 28); 2 keys the timeline's `load` and
/// `requirement` by stage name ([`PerStage`]) instead of stage id. A field
/// added later that older readers can ignore keeps the number; a change of
/// a field's meaning raises it.
pub const REPORT_SCHEMA: u32 = 2;

/// Why a report file could not be read or written.
#[derive(Debug)]
pub enum ReportError {
    /// Reading or writing the file failed.
    Io(std::io::Error),
    /// The file is not a report of this version.
    Json(serde_json::Error),
    /// The report's layout is newer than this reader's ([`REPORT_SCHEMA`]).
    Schema(u32),
}

impl std::fmt::Display for ReportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::Json(e) => write!(f, "not a stagevm report: {e}"),
            Self::Schema(n) => write!(
                f,
                "report schema {n} is newer than this reader's ({REPORT_SCHEMA}): read it with a stagevm of that schema or later"
            ),
        }
    }
}

impl std::error::Error for ReportError {}

impl Report {
    /// Writes the report as pretty JSON to `path`. Errors: serialisation or
    /// the write.
    pub fn write(&self, path: &Path) -> Result<(), ReportError> {
        let json = serde_json::to_string_pretty(self).map_err(ReportError::Json)?;
        std::fs::write(path, json + "\n").map_err(ReportError::Io)
    }

    /// Writes the report as pretty JSON into `file` (opened by the caller,
    /// e.g. before the run). Errors: serialisation or the write.
    pub fn write_to(&self, file: &mut std::fs::File) -> Result<(), ReportError> {
        use std::io::Write as _;
        // Streamed: no copy of the report as one string.
        let mut out = std::io::BufWriter::new(file);
        serde_json::to_writer_pretty(&mut out, self).map_err(ReportError::Json)?;
        out.write_all(b"\n").map_err(ReportError::Io)?;
        out.flush().map_err(ReportError::Io)
    }

    /// Reads a report written by [`Report::write`] of this or an older
    /// schema (a schema-1 timeline's stage-indexed arrays get the report's
    /// stage names). Errors: the file cannot be read, is not a report, or
    /// is of a newer schema ([`ReportError::Schema`]).
    pub fn read(path: &Path) -> Result<Self, ReportError> {
        let text = std::fs::read_to_string(path).map_err(ReportError::Io)?;
        Self::from_json(&text)
    }

    /// [`Report::read`] of a report's text.
    pub fn from_json(text: &str) -> Result<Self, ReportError> {
        #[derive(Deserialize)]
        struct Head {
            #[serde(default)]
            schema: u32,
        }
        let head: Head = serde_json::from_str(text).map_err(ReportError::Json)?;
        if head.schema > REPORT_SCHEMA {
            return Err(ReportError::Schema(head.schema));
        }
        let mut report: Report = serde_json::from_str(text).map_err(ReportError::Json)?;
        if report.schema < 2 {
            let names: Vec<String> = match &report.stage_channel {
                Some(c) if !c.stages.is_empty() => {
                    c.stages.iter().map(|s| s.name.clone()).collect()
                }
                _ => report.sched.stages.iter().map(|s| s.name.clone()).collect(),
            };
            for e in &mut report.sched.timeline {
                e.load.name_indices(&names);
                e.requirement.name_indices(&names);
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests;
