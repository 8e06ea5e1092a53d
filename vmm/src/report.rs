//! The run report: printed as a summary on stderr and written as JSON with
//! `--report PATH`.
//!
//! JSON fields (all counters are totals over the run):
//! * `exit_code` — the VMM's exit status; `exit` — how the VM ended, as text,
//! * `stage_channel` — `null` without a stage device, else:
//!   `registered`, `registrations`, `registrations_rejected` (status name →
//!   count), `drain_period_us`, `drains`, `ring_entries`, `map_epoch`,
//!   `stages[]` (`id`, `name`, `events` = valid enter events, `arrivals` =
//!   enters from another stage, `occupancy_ns` = vCPU time in the stage),
//!   `vcpus[]` (`index`, `events`, `exits`, `idles`, `dropped_bad_seq`,
//!   `dropped_bad_stage`, `bad_index`, `ring_full_backoffs`), `dropped` (sum),
//!   `ring_full_backoffs` (sum), `waits`, `wakes`, `host_wakes`,
//!   `maps_published`, `requests` (valid `stage_exit` events), `busy_ns`
//!   (guest time from first to last event), `requests_per_s`,
//!   `untracked_threads`; per stage also `migrations_in` / `migrations_out`,
//! * `sched` — `policy`, `period_ms`, `stage_cores`, `housekeeping` (cpulists),
//!   `warnings` (helpers share stage cores, stage cores left without a vCPU), `stages[]` (`name`, `vcpus`,
//!   `cores`, `requirement` = cores allocated), `vcpus[]` (`index`, `tid`,
//!   `affinity` read back after the last pin), `helpers[]` (`name`, `tid`,
//!   `affinity`), `map_changes`, `repins`, `repin_mean_us`, `timeline[]`
//!   (`t_ms`, `load` = vCPUs' worth of time per stage (the policy's input),
//!   `runnable` = mean runnable threads per stage, `requirement`,
//!   `map_changed`), one entry per policy period,
//! * `disks[]` — `name`, `path`, `readonly`, `notify` (`ioeventfd` or
//!   `mmio-exit`), `sectors`, `ok`, `errors`
//!   (requests answered with an error status), `dropped` (no usable status
//!   byte), `bad_heads` (available entries naming no descriptor),
//!   `bytes_read`, `bytes_written`.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::sched::SchedReport;
use crate::stage::ChannelReport;
use crate::vm::{RunOutcome, VmExit};

/// The JSON report of one run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Exit status of `stagevm`.
    pub exit_code: u8,
    /// How the VM ended.
    pub exit: String,
    /// Stage-channel counters.
    pub stage_channel: Option<ChannelReport>,
    /// Scheduling: policy, placement, pins, timeline.
    pub sched: SchedReport,
    /// virtio-blk disks.
    pub disks: Vec<crate::virtio::block::BlockReport>,
}

impl Report {
    /// Builds the report of a finished run.
    pub fn new(outcome: &RunOutcome) -> Self {
        Self {
            exit_code: outcome.exit.exit_code(),
            exit: match &outcome.exit {
                VmExit::Guest(code) => format!("guest shutdown with code {code}"),
                VmExit::GuestFailure(why) => format!("guest failure: {why}"),
                VmExit::Signal(sig) => format!("signal {sig}"),
                VmExit::ConfigError(msg) => format!("configuration error: {msg}"),
            },
            stage_channel: outcome.channel.clone(),
            sched: outcome.sched.clone(),
            disks: outcome.disks.clone(),
        }
    }

    /// Writes the report as pretty JSON to `path` (I/O errors returned).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(path, json + "\n")
    }
}

/// A human summary: scheduling, per stage, per thread, per disk.
pub fn summary(
    c: Option<&ChannelReport>,
    sc: &SchedReport,
    disks: &[crate::virtio::block::BlockReport],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "stagevm: policy {} (period {} ms), stage cores {}, housekeeping {}",
        sc.policy.name(),
        sc.period_ms,
        sc.stage_cores,
        sc.housekeeping
    );
    for w in &sc.warnings {
        let _ = writeln!(s, "stagevm: warning: {w}");
    }
    if let Some(c) = c.filter(|c| c.registrations > 0) {
        let events: u64 = c.vcpus.iter().map(|v| v.events).sum();
        let _ = writeln!(
            s,
            "stagevm: stage channel: {events} events in {} drains ({} µs period), {} dropped, {} ring-full back-offs, {} requests ({:.0} requests/s)",
            c.drains, c.drain_period_us, c.dropped, c.ring_full_backoffs, c.requests, c.requests_per_s
        );
        let vcpu_ns = (c.busy_ns as f64 * c.vcpus.len() as f64).max(1.0);
        for st in &c.stages {
            let place = sc.stages.iter().find(|p| p.name == st.name);
            let _ = writeln!(
                s,
                "stagevm:   stage {:<8} events {:>8}  migrations in {:>7} out {:>7}  occupancy {:>5.1} %  vCPUs {:<10} cores {}",
                st.name,
                st.events,
                st.migrations_in,
                st.migrations_out,
                st.occupancy_ns as f64 * 100.0 / vcpu_ns,
                place.map_or("-".into(), |p| format!("{:?}", p.vcpus)),
                place.map_or("-", |p| p.cores.as_str()),
            );
        }
    }
    for v in &sc.vcpus {
        let _ = writeln!(
            s,
            "stagevm:   vcpu{} tid {} affinity {}",
            v.index, v.tid, v.affinity
        );
    }
    for h in &sc.helpers {
        let _ = writeln!(
            s,
            "stagevm:   helper {} tid {} affinity {}",
            h.name, h.tid, h.affinity
        );
    }
    for d in disks {
        let _ = writeln!(
            s,
            "stagevm:   disk {} ({}{}, notify {}): {} requests ok, {} errors, {} dropped, {} bytes read, {} written",
            d.name,
            d.path,
            if d.readonly { ", read-only" } else { "" },
            d.notify,
            d.ok,
            d.errors,
            d.dropped + d.bad_heads,
            d.bytes_read,
            d.bytes_written
        );
    }
    let _ = writeln!(
        s,
        "stagevm: {} map changes, {} vCPU re-pins (mean {:.1} µs)",
        sc.map_changes, sc.repins, sc.repin_mean_us
    );
    s
}
