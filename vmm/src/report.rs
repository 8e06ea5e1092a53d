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
//!   `vcpus[]` (`index`, `events`, `exits`, `dropped_bad_seq`,
//!   `dropped_bad_stage`, `bad_index`, `ring_full_backoffs`), `dropped` (sum),
//!   `ring_full_backoffs` (sum), `waits`, `wakes`.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

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
            },
            stage_channel: outcome.channel.clone(),
        }
    }

    /// Writes the report as pretty JSON to `path` (I/O errors returned).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(path, json + "\n")
    }
}

/// A human summary of the stage channel, one line per stage.
pub fn channel_summary(c: &ChannelReport) -> String {
    let mut s = String::new();
    let events: u64 = c.vcpus.iter().map(|v| v.events).sum();
    let _ = writeln!(
        s,
        "stagevm: stage channel: {events} events in {} drains ({} µs period), {} dropped, {} ring-full back-offs",
        c.drains, c.drain_period_us, c.dropped, c.ring_full_backoffs
    );
    for st in &c.stages {
        let _ = writeln!(
            s,
            "stagevm:   stage {} {:<12} events {:>9}  arrivals {:>9}  occupancy {:>10.3} ms",
            st.id,
            st.name,
            st.events,
            st.arrivals,
            st.occupancy_ns as f64 / 1e6
        );
    }
    s
}
