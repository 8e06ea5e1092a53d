//! Stage scheduling in the VMM: applies host-sched's decisions.
//!
//! Data flows one way: the guest's rings are drained by the stage device
//! into validated events ([`crate::stage::StageDevice::drain`]), the
//! [`Controller`] folds them into its load window and, every policy period,
//! asks host-sched's policy for a [`Plan`](host_sched::policy::Plan); the
//! plan's stage map is published through the device and its pins applied by
//! the [`Pinner`]. [`StageSched`] wires these together and runs the
//! `stage-sched` thread's loop ([`StageSched::run`]).
//!
//! * [`controller`] — the decisions (one place), the per-stage accounting
//!   and load window they read, and the `stage-sched` loop,
//! * [`pinner`] — thread ids and affinities.

pub mod controller;
pub mod pinner;

use stagevm_report::{ChannelReport, SchedReport};

pub use controller::{Accounting, Controller, Decision, StageSched};
pub use pinner::Pinner;

impl StageSched {
    /// The final drain after the guest stopped and the reports: the stage
    /// channel's counters (`None` without a device) and what the scheduler
    /// did.
    pub fn finish(&self) -> (Option<ChannelReport>, SchedReport) {
        self.drain();
        let c = self.controller();
        let channel = self.device.as_ref().map(|d| {
            let mut r = d.report();
            c.fill_report(&mut r);
            r
        });
        (channel, self.report_locked(&c))
    }

    fn report_locked(&self, c: &Controller) -> SchedReport {
        let r = &c.vm().resolved;
        let (vcpus, helpers, repins, repin_mean_us) = self.pinner.report();
        let (map_changes, timeline) = c.history();
        let share = r.helpers_share_stage_cores.then(|| {
            format!(
                "no housekeeping core left: helper threads share the stage cores {}",
                r.stage_cores
            )
        });
        SchedReport {
            policy: r.policy.name().into(),
            period_ms: r.period.as_millis() as u64,
            stage_cores: r.stage_cores.to_string(),
            housekeeping: r.housekeeping.to_string(),
            warnings: share
                .into_iter()
                .chain(c.vm().warnings.iter().cloned())
                .collect(),
            stages: c.placements(),
            vcpus,
            helpers,
            map_changes,
            repins,
            repin_mean_us,
            timeline: timeline.to_vec(),
        }
    }
}
