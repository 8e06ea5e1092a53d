//! `GET /metrics`: the live report ([`StagesView`]) in Prometheus' text
//! exposition format 0.0.4, encoded by the `prometheus` crate (a fresh
//! registry per scrape, filled from one view, so every counter equals the
//! JSON report's field of the same moment).
//!
//! | metric | type | labels | report field |
//! |---|---|---|---|
//! | `stagevm_stage_events_total` | counter | `stage` | `stages[].events` |
//! | `stagevm_stage_migrations_total` | counter | `stage` | `stages[].migrations_in` |
//! | `stagevm_stage_occupancy_seconds_total` | counter | `stage` | `stages[].occupancy_ns` / 1e9 |
//! | `stagevm_stage_cohorts_total`, `stagevm_stage_cohort_entries_total` | counter | `stage` | `stages[].cohorts`, `stages[].cohort_entries` (÷: the mean cohort size) |
//! | `stagevm_stage_occupancy_ratio` | gauge | `stage` | `occupancy_ns` / (`busy_ns` × vCPUs) |
//! | `stagevm_stage_vcpus` | gauge | `stage` | `sched.stages[].vcpus` (count) |
//! | `stagevm_vcpu_core_info` | gauge (1) | `vcpu`, `core` | `sched.vcpus[].affinity` |
//! | `stagevm_ring_events_total` | counter | — | `vcpus[].events` summed |
//! | `stagevm_ring_dropped_total` | counter | — | `dropped` |
//! | `stagevm_requests_total` | counter | — | `requests` |
//! | `stagevm_vcpu_idle_seconds_total` | counter | `vcpu` | `vcpus[].idle_ns` / 1e9 |
//! | `stagevm_trace_every` | gauge | — | `trace_every` |
//! | `stagevm_trace_events_total` | counter | — | `traced_events` |
//! | `stagevm_trace_dropped_total` | counter | — | `trace_dropped` |
//! | `stagevm_stage_clamps_total` | counter | — | `counter_clamps` |
//! | `stagevm_request_latency_seconds` | histogram (`le` = 2ᵏ ns) | — | `latency.buckets`, `latency.sum_ns`, `latency.samples` (the guest's timed requests, ABI minor 4) |
//! | `stagevm_latency_clamps_total` | counter | — | `latency.clamps` |
//! | `stagevm_request_cpu_seconds_total` | counter | — | `sched.cpu.work_ns` / 1e9 (÷ `stagevm_requests_total`: CPU per request) |
//! | `stagevm_vcpu_utilisation_ratio` | gauge | `vcpu` | `sched.cpu.vcpu_utilisation` (the last policy period) |
//! | `stagevm_registrations_coalesced_total` | counter | — | `registrations_coalesced` |
//! | `stagevm_waits_total`, `stagevm_wakes_total` | counter | — | `waits`, `wakes` |
//! | `stagevm_map_changes_total` | counter | — | `sched.map_changes` |
//! | `stagevm_map_epoch` | gauge | — | `map_epoch` |
//! | `stagevm_repins_total` | counter | — | `sched.repins` |
//! | `stagevm_policy_info` | gauge (1) | `policy` | `sched.policy` |
//! | `stagevm_visit_policy_info` | gauge (1) | `policy` | `sched.visit` |
//! | `stagevm_log_lines_suppressed_total` | counter | — | `log_lines_suppressed` |
//! | `stagevm_ring_full_backoffs_total` | counter | — | `ring_full_backoffs` (a rings guest's waits on a full ring) |
//! | `stagevm_net_{rx,tx}_{packets,bytes,dropped,errors,notifications}_total`, `stagevm_net_interrupts_total`, `stagevm_net_polls_skipped_total`, `stagevm_net_rx_muted_total` | counter | `device` | `nets[].rx_packets`, … (`vm.info`'s `nets`) |
//! | `stagevm_disk_{requests,errors,dropped,bad_heads,read_bytes,written_bytes}_total` | counter | `device` | the report's `disks[].ok`, `errors`, `dropped`, `bad_heads`, `bytes_read`, `bytes_written` |
//! | `stagevm_build_info` | gauge (1) | `version`, `abi` | the stagevm package version; the stage channel's ABI `major.minor` |

use host_sched::cpuset::CpuSet;
use prometheus::{
    Encoder, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use stagevm_report::api::StagesView;
use stagevm_report::{BlockReport, NetReport};

mod requests;

/// `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

struct Builder {
    registry: Registry,
}

impl Builder {
    fn counter(&self, name: &str, help: &str, value: u64) -> prometheus::Result<()> {
        let c = IntCounter::new(name, help)?;
        c.inc_by(value);
        self.registry.register(Box::new(c))
    }

    fn gauge(&self, name: &str, help: &str, value: i64) -> prometheus::Result<()> {
        let g = IntGauge::new(name, help)?;
        g.set(value);
        self.registry.register(Box::new(g))
    }

    fn counter_vec(
        &self,
        name: &str,
        help: &str,
        label: &str,
    ) -> prometheus::Result<IntCounterVec> {
        let c = IntCounterVec::new(Opts::new(name, help), &[label])?;
        self.registry.register(Box::new(c.clone()))?;
        Ok(c)
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
        let g = GaugeVec::new(Opts::new(name, help), labels)?;
        self.registry.register(Box::new(g.clone()))?;
        Ok(g)
    }
}

/// The devices' counters of one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct Devices<'a> {
    /// virtio-blk disks.
    pub disks: &'a [BlockReport],
    /// virtio-net cards.
    pub nets: &'a [NetReport],
}

/// Renders `view`, the count of suppressed guest-triggered log lines and
/// the devices' counters as Prometheus text. Errors: the `prometheus`
/// crate refused a metric (a defect) or the encoding failed.
pub fn render(
    view: &StagesView,
    log_lines_suppressed: u64,
    devices: Devices,
) -> prometheus::Result<String> {
    let b = Builder {
        registry: Registry::new(),
    };
    let build = IntGaugeVec::new(
        Opts::new(
            "stagevm_build_info",
            "The stagevm build: package version and stage-channel ABI (value 1)",
        ),
        &["version", "abi"],
    )?;
    let abi = format!(
        "{}.{}",
        hypercall_abi::stage::ABI_VERSION,
        hypercall_abi::stage::ABI_MINOR
    );
    build
        .with_label_values(&[env!("CARGO_PKG_VERSION"), abi.as_str()])
        .set(1);
    b.registry.register(Box::new(build))?;
    let s = &view.sched;
    if let Some(ch) = &view.stage_channel {
        stage_metrics(&b, view)?;
        let ring_events = ch.vcpus.iter().map(|v| v.events).sum();
        b.counter(
            "stagevm_ring_events_total",
            "Stage switches the guest reported (counted in its counters, or ring entries of a rings guest)",
            ring_events,
        )?;
        let idle = prometheus::CounterVec::new(
            Opts::new(
                "stagevm_vcpu_idle_seconds_total",
                "vCPU time with nothing to run (s; a counters guest)",
            ),
            &["vcpu"],
        )?;
        b.registry.register(Box::new(idle.clone()))?;
        for v in &ch.vcpus {
            idle.with_label_values(&[&v.index.to_string()])
                .inc_by(v.idle_ns as f64 / 1e9);
        }
        b.gauge(
            "stagevm_trace_every",
            "Event trace asked of the guest: 0 off, N every Nth event",
            ch.trace_every as i64,
        )?;
        b.counter(
            "stagevm_trace_events_total",
            "Trace events drained from the rings",
            ch.traced_events,
        )?;
        b.counter(
            "stagevm_trace_dropped_total",
            "Trace events the guest dropped on a full ring",
            ch.trace_dropped,
        )?;
        b.counter(
            "stagevm_stage_clamps_total",
            "Impossible stage-counter values clamped",
            ch.counter_clamps,
        )?;
        b.counter(
            "stagevm_registrations_coalesced_total",
            "REGISTERs within a policy period of the last one served, planned later",
            ch.registrations_coalesced,
        )?;
        b.counter(
            "stagevm_ring_full_backoffs_total",
            "Times a rings guest found its ring full and waited (its own count)",
            ch.ring_full_backoffs,
        )?;
        b.counter(
            "stagevm_ring_dropped_total",
            "Ring entries dropped by validation (bad sequence, stage or index)",
            ch.dropped,
        )?;
        b.counter(
            "stagevm_requests_total",
            "Requests the guest completed (valid stage_exit events)",
            ch.requests,
        )?;
        b.counter(
            "stagevm_waits_total",
            "WAIT doorbells (vCPUs parked)",
            ch.waits,
        )?;
        b.counter("stagevm_wakes_total", "WAKE doorbells", ch.wakes)?;
        b.gauge(
            "stagevm_map_epoch",
            "Epoch of the stage map the guest reads now",
            ch.map_epoch as i64,
        )?;
    }
    b.counter(
        "stagevm_map_changes_total",
        "Stage-map changes the policy made (the first map included)",
        s.map_changes,
    )?;
    b.counter(
        "stagevm_repins_total",
        "vCPU thread re-pins after start",
        s.repins,
    )?;
    b.counter(
        "stagevm_log_lines_suppressed_total",
        "Guest-triggered log lines suppressed by rate limiting",
        log_lines_suppressed,
    )?;
    let policy = IntGaugeVec::new(
        Opts::new("stagevm_policy_info", "The scheduling policy now (value 1)"),
        &["policy"],
    )?;
    policy.with_label_values(&[&s.policy]).set(1);
    b.registry.register(Box::new(policy))?;
    let visit = IntGaugeVec::new(
        Opts::new(
            "stagevm_visit_policy_info",
            "The stage-visit policy of the plan now, published in the stage map (value 1)",
        ),
        &["policy"],
    )?;
    visit.with_label_values(&[&s.visit]).set(1);
    b.registry.register(Box::new(visit))?;
    let core = b.gauge_vec(
        "stagevm_vcpu_core_info",
        "1 for each core a vCPU thread may run on (its affinity)",
        &["vcpu", "core"],
    )?;
    for v in &s.vcpus {
        let cores = CpuSet::parse(&v.affinity).unwrap_or_default();
        for c in cores.iter() {
            core.with_label_values(&[&v.index.to_string(), &c.to_string()])
                .set(1.0);
        }
    }
    requests::request_metrics(&b, view)?;
    net_metrics(&b, devices.nets)?;
    disk_metrics(&b, devices.disks)?;
    let mut out = Vec::new();
    TextEncoder::new().encode(&b.registry.gather(), &mut out)?;
    String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
}

/// The virtio-net devices' counters, labelled by device name.
fn net_metrics(b: &Builder, nets: &[NetReport]) -> prometheus::Result<()> {
    let fields: [Field<NetReport>; 13] = [
        ("rx_packets", "Frames delivered to the guest", |n| {
            n.rx_packets
        }),
        ("rx_bytes", "Frame bytes delivered to the guest", |n| {
            n.rx_bytes
        }),
        (
            "rx_dropped",
            "Frames from the tap not delivered (oversized, runts, no queue)",
            |n| n.rx_dropped,
        ),
        (
            "rx_errors",
            "Receive buffers refused (bad chains, too small)",
            |n| n.rx_errors,
        ),
        (
            "tx_packets",
            "Frames of the guest sent out on the tap",
            |n| n.tx_packets,
        ),
        ("tx_bytes", "Frame bytes sent out on the tap", |n| {
            n.tx_bytes
        }),
        (
            "tx_dropped",
            "Frames of the guest not sent (oversized, tap full or gone)",
            |n| n.tx_dropped,
        ),
        (
            "tx_errors",
            "Transmit chains refused (bad chains) or refused by the tap",
            |n| n.tx_errors,
        ),
        (
            "rx_notifications",
            "Receive queue notifications from the driver (each a VM exit)",
            |n| n.rx_notifications,
        ),
        (
            "tx_notifications",
            "Transmit queue notifications from the driver (each a VM exit)",
            |n| n.tx_notifications,
        ),
        ("interrupts", "Used-buffer interrupts raised", |n| {
            n.interrupts
        }),
        (
            "polls_skipped",
            "Polls of an empty queue not made (nothing new, or the poll budget spent)",
            |n| n.polls_skipped,
        ),
        (
            "rx_muted",
            "Receive notifications that brought nothing, each muting the next for 1 ms",
            |n| n.rx_muted,
        ),
    ];
    device_counters(b, "net", nets, |n| &n.name, &fields)
}

/// The virtio-blk disks' counters, labelled by device name.
fn disk_metrics(b: &Builder, disks: &[BlockReport]) -> prometheus::Result<()> {
    let fields: [Field<BlockReport>; 6] = [
        ("requests", "Requests completed without error", |d| d.ok),
        ("errors", "Requests completed with an error status", |d| {
            d.errors
        }),
        (
            "dropped",
            "Descriptor chains refused without a status (bad shape or memory)",
            |d| d.dropped,
        ),
        (
            "bad_heads",
            "Available-ring entries naming no descriptor of the queue",
            |d| d.bad_heads,
        ),
        ("read_bytes", "Bytes read for the guest", |d| d.bytes_read),
        ("written_bytes", "Bytes the guest wrote", |d| {
            d.bytes_written
        }),
    ];
    device_counters(b, "disk", disks, |d| &d.name, &fields)
}

/// A device counter: its name's middle part, its help and how to read it.
type Field<T> = (&'static str, &'static str, fn(&T) -> u64);

/// One `stagevm_{kind}_{field}_total` counter per field, labelled by the
/// device's name; nothing when there is no device of the kind.
fn device_counters<T>(
    b: &Builder,
    kind: &str,
    devices: &[T],
    name: fn(&T) -> &str,
    fields: &[Field<T>],
) -> prometheus::Result<()> {
    if devices.is_empty() {
        return Ok(());
    }
    for (field, help, get) in fields {
        let c = b.counter_vec(&format!("stagevm_{kind}_{field}_total"), help, "device")?;
        for d in devices {
            c.with_label_values(&[name(d)]).inc_by(get(d));
        }
    }
    Ok(())
}

fn stage_metrics(b: &Builder, view: &StagesView) -> prometheus::Result<()> {
    let Some(ch) = &view.stage_channel else {
        return Ok(());
    };
    let events = b.counter_vec(
        "stagevm_stage_events_total",
        "Stage-enter events per stage",
        "stage",
    )?;
    let migrations = b.counter_vec(
        "stagevm_stage_migrations_total",
        "Guest threads that entered the stage on another vCPU than their previous event's",
        "stage",
    )?;
    let seconds = prometheus::CounterVec::new(
        Opts::new(
            "stagevm_stage_occupancy_seconds_total",
            "vCPU time spent in the stage (s)",
        ),
        &["stage"],
    )?;
    b.registry.register(Box::new(seconds.clone()))?;
    let ratio = b.gauge_vec(
        "stagevm_stage_occupancy_ratio",
        "Share of all vCPUs' time spent in the stage since REGISTER",
        &["stage"],
    )?;
    let vcpus = b.gauge_vec(
        "stagevm_stage_vcpus",
        "vCPUs serving the stage in the current stage map",
        &["stage"],
    )?;
    let cohorts = b.counter_vec(
        "stagevm_stage_cohorts_total",
        "Cohorts of the stage: runs of consecutive entries into it on one vCPU by different threads",
        "stage",
    )?;
    let cohort_entries = b.counter_vec(
        "stagevm_stage_cohort_entries_total",
        "Entries the stage's cohorts held (divided by stagevm_stage_cohorts_total: the mean cohort size)",
        "stage",
    )?;
    let vcpu_time = ch.busy_ns as f64 * view.sched.vcpus.len().max(1) as f64;
    for st in &ch.stages {
        let l = [st.name.as_str()];
        events.with_label_values(&l).inc_by(st.events);
        migrations.with_label_values(&l).inc_by(st.migrations_in);
        cohorts.with_label_values(&l).inc_by(st.cohorts);
        cohort_entries
            .with_label_values(&l)
            .inc_by(st.cohort_entries);
        seconds
            .with_label_values(&l)
            .inc_by(st.occupancy_ns as f64 / 1e9);
        if vcpu_time > 0.0 {
            ratio
                .with_label_values(&l)
                .set(st.occupancy_ns as f64 / vcpu_time);
        }
    }
    for p in &view.sched.stages {
        vcpus
            .with_label_values(&[p.name.as_str()])
            .set(p.vcpus.len() as f64);
    }
    Ok(())
}
