//! Stage scheduling in the VMM: applies host-sched's decisions.
//!
//! Data flows one way: a counters guest's per-vCPU blocks are copied once
//! per policy period ([`crate::stage::StageDevice::read_blocks`]) and
//! turned into checked deltas ([`counter_reader`]); an older guest's rings are
//! drained into validated events ([`crate::stage::StageDevice::drain`]);
//! the [`Controller`] folds either into its load window and, every policy
//! period, asks host-sched's policy for a [`Plan`](host_sched::policy::Plan); the
//! plan's stage map is published through the device and its pins applied by
//! the [`Pinner`]. [`StageSched`] wires these together; [`Pacer`] sets the
//! `stage-sched` thread's pace ([`Pacer::wake`]; the VMM owns the thread).
//!
//! * [`controller`] — the decisions (one place): policy periods and the
//!   operator's changes (`--api-socket`),
//! * [`stage_sched`] — the wiring, the REGISTER hand-off and the
//!   `stage-sched` loop's pace,
//! * [`accounting`] — per-stage counters and the load window,
//! * [`cohorts`] — the cohorts each vCPU served, from the event stream,
//! * [`counter_reader`] — a counters guest's per-vCPU blocks (ABI minor 2) turned
//!   into deltas under the untrusted-guest rules,
//! * [`latency_reader`] — its request-latency histograms (minor 4), likewise,
//! * [`cpu`] — the vCPU threads' CPU time, less idle spinning: the work
//!   CPU behind CPU per request and utilisation,
//! * [`observe`] — what each policy period gives the policy,
//! * [`timeline`] — the policy periods, a ring bounded in bytes,
//! * [`pinner`] — thread ids and affinities.
//!
//! An embedder's surface is what this module re-exports ([`StageSched`],
//! [`Pacer`], [`run_loop`], [`Pinner`], [`ThreadCpu`], [`Controller`],
//! [`Change`], [`Decision`]). The submodules above are public for the fuzz
//! targets and the VMM's tests only, hidden from the documentation: their
//! items may change without notice.

#[doc(hidden)]
pub mod accounting;
#[doc(hidden)]
pub mod cohorts;
#[doc(hidden)]
pub mod controller;
#[doc(hidden)]
pub mod counter_reader;
#[doc(hidden)]
pub mod cpu;
#[doc(hidden)]
pub mod latency_reader;
#[doc(hidden)]
pub mod observe;
#[doc(hidden)]
pub mod pinner;
mod run_loop;
#[doc(hidden)]
pub mod stage_sched;
#[doc(hidden)]
pub mod timeline;

use stagevm_report::api::StagesView;
use stagevm_report::{
    AutoReport, ChannelReport, DuelReport, ModeReport, SchedReport, SkippedMode, TrialReport,
};

#[doc(hidden)]
pub use accounting::Accounting;
pub use controller::{Change, Controller, Decision};
pub use pinner::{Pinner, ThreadCpu};
pub use run_loop::run_loop;
pub use stage_sched::{Pacer, StageSched};

impl<M: crate::stage::StageMemory> StageSched<M> {
    /// The final drain and counter read after the guest stopped, and the
    /// reports: the stage channel's counters (`None` without a device) and
    /// what the scheduler did, with the whole timeline moved out of the
    /// controller (no second copy).
    pub fn finish(&self) -> (Option<ChannelReport>, SchedReport) {
        self.drain();
        self.read_counters(&mut crate::stage::Blocks::default());
        let mut c = self.controller();
        let channel = self.device.as_ref().map(|d| {
            let mut r = d.report();
            c.fill_report(&mut r);
            r
        });
        let mut sched = self.report_locked(&c, 0);
        sched.timeline = c.take_timeline();
        (channel, sched)
    }

    /// The live report (the operator API's `GET /api/v1/stages` and
    /// `GET /metrics`): a counters guest's counters as of the last policy
    /// period's read (at most a period old), the scheduler's state with the
    /// last `timeline` entries, the last `decisions` entries that carry a
    /// decision, and the change waiting for the next period. A read is a
    /// read: it never reads the guest's blocks into the accounting, whose
    /// load windows only policy periods advance — a scrape loop (anyone on
    /// the loopback may scrape `--metrics-listen`) once shrank them to
    /// microseconds, so an honest guest's counts exceeded their windows
    /// and were clamped (issue 36).
    pub fn view(&self, timeline: usize, decisions: usize) -> StagesView {
        let c = self.controller();
        let stage_channel = self.device.as_ref().map(|d| {
            let mut r = d.report();
            c.fill_report(&mut r);
            r
        });
        StagesView {
            stage_channel,
            sched: self.report_locked(&c, timeline),
            timeline_total: c.history().1.len(),
            decisions: c.history().1.decisions(decisions),
            pending: c.pending(),
        }
    }

    /// The scheduler's report with the last `timeline` timeline entries.
    fn report_locked(&self, c: &Controller, timeline: usize) -> SchedReport {
        let r = &c.vm().resolved;
        let (vcpus, helpers, repins, repin_mean_us) = self.pinner.report();
        let (tail, (map_changes, timeline)) = (timeline, c.history());
        let share = r.helpers_share_stage_cores.then(|| {
            format!(
                "no housekeeping core left: helper threads share the stage cores {}",
                r.stage_cores
            )
        });
        SchedReport {
            policy: r.policy.name().into(),
            visit: c.plan().visit.name().into(),
            period_ms: r.period.as_millis() as u64,
            stage_cores: r.stage_cores.to_string(),
            housekeeping: r.housekeeping.to_string(),
            warnings: share
                .into_iter()
                .chain(c.vm().warnings.iter().cloned())
                .chain(c.guest_warnings().iter().cloned())
                .collect(),
            stages: c.placements(),
            vcpus,
            helpers,
            map_changes,
            policy_kept: c.policy_kept(),
            repins,
            repin_mean_us,
            timeline_dropped: timeline.dropped(),
            timeline: timeline.tail(tail),
            auto: c.auto_stats().map(|a| AutoReport {
                periods: a.periods,
                trials: a.trials,
                trial_periods: a.trial_periods,
                losing_periods: a.losing_periods,
                mode_switches: a.mode_switches,
                losing_share: a.losing_periods as f64 / a.periods.max(1) as f64,
                cost_share: a.cost_periods / a.periods.max(1) as f64,
                change_points: a.change_points,
                duels: a.duels,
                duels_capped: a.duels_capped,
                duels_better: a.duels_better,
                modes_skipped: a.modes_skipped,
                last_trial: c.last_trial().map(|t| trial_report(&t)),
            }),
            cpu: c.cpu_report(),
            max_p99_increase: r.latency.max_p99_increase,
            latency_slo_us: r.latency.slo_ns.map(|ns| ns / 1000.0),
            cpu_weight: self.pinner.cpu_weight_report(),
        }
    }
}

/// `auto`'s trial summary as the report's (ns as µs).
fn trial_report(t: &host_sched::policy::auto::TrialSummary) -> TrialReport {
    let us = |ns: Option<f64>| ns.map(|ns| ns / 1000.0);
    TrialReport {
        kept: t.kept.into(),
        objective: t.objective.into(),
        decided_by: t.decided_by.into(),
        unstaged_utilisation: t.unstaged_utilisation,
        p99_limit_us: us(t.p99_limit_ns),
        modes: t
            .modes
            .iter()
            .map(|m| ModeReport {
                mode: m.mode.into(),
                periods: m.periods as u64,
                requests_per_s: m.rate,
                cpu_per_request_us: us(m.cpu_per_request_ns),
                p99_us: us(m.p99_ns),
                utilisation: m.utilisation,
                dropped: m.dropped,
                over_latency_bound: m.over_latency_bound,
            })
            .collect(),
        duels: t
            .duels
            .iter()
            .map(|d| DuelReport {
                incumbent: d.incumbent.into(),
                candidate: d.candidate.into(),
                pairs: d.pairs,
                mean_pct: d.mean.map(|m| m * 100.0),
                se_pct: d.se.map(|s| s * 100.0),
                llr: d.llr,
                outcome: d.outcome.into(),
                confidence: d.confidence,
                veto: d.veto.map(Into::into),
                won: d.won,
                futile: d.futile,
            })
            .collect(),
        skipped: t
            .skipped
            .iter()
            .map(|(m, why)| SkippedMode {
                mode: (*m).into(),
                why: why.clone(),
            })
            .collect(),
        settle_periods: t.settle_periods,
    }
}

/// The unit tests' [`host_sched::vm::Setup`]: the configuration `toml` on a
/// made-up host whose CPUs are `cpus` (a cpulist), none isolated.
#[cfg(test)]
pub(crate) fn test_setup(cpus: &str, toml: &str) -> host_sched::vm::Setup {
    use host_sched::config::{Config, Overrides};
    let cpus = host_sched::cpuset::CpuSet::parse(cpus).unwrap();
    let topology = host_sched::topology::Topology {
        allowed: cpus.clone(),
        online: cpus,
        isolated: host_sched::cpuset::CpuSet::new(),
    };
    let config = Config::from_toml(toml, "test").unwrap();
    host_sched::vm::Setup::new(config, &Overrides::default(), topology).unwrap()
}
