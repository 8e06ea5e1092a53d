//! What the controller gives the policy each policy period
//! ([`Observation`]): the completed-request rate, the CPU the guest's work
//! cost ([`super::cpu`]), the utilisation and the requests the guest timed
//! ([`super::latency_reader`]); and the run's totals of them for the report.

use host_sched::policy::{Observation, StageWork};
use stagevm_report::CpuReport;

use super::accounting::Window;
use super::cpu::{CpuMeter, SchedStat};

/// The measurements of successive policy periods.
#[derive(Debug, Default)]
pub struct Observer {
    meter: CpuMeter,
    /// Periods with CPU figures, their work CPU (ns), requests and summed
    /// utilisation.
    periods: u64,
    work_ns: u64,
    requests: f64,
    utilisation_sum: f64,
    /// The last period's utilisation per vCPU.
    vcpu_utilisation: Vec<f64>,
}

impl Observer {
    /// The period that just ended: `window` (the accounting's),
    /// `window_ns` its length, `requests` completed in it (the estimate the
    /// rate is made of) at `requests_per_s`, `stats` the vCPU threads'
    /// schedstat now (`None` where unreadable), `cores` the cores the
    /// vCPUs may use.
    pub fn period(
        &mut self,
        window: &mut Window,
        window_ns: f64,
        requests: f64,
        requests_per_s: f64,
        stats: &[Option<SchedStat>],
        cores: usize,
    ) -> Observation {
        let cpu = if window.idle_ns.len() == stats.len() {
            self.meter
                .window(stats, &window.idle_ns, window_ns as u64, cores)
        } else {
            // A rings guest reports no idle time: no CPU figures.
            None
        };
        if let Some(c) = &cpu {
            self.periods += 1;
            self.work_ns = self.work_ns.saturating_add(c.work_ns);
            self.requests += requests;
            self.utilisation_sum += c.utilisation;
            self.vcpu_utilisation = c.vcpu_utilisation.clone();
        }
        Observation {
            requests_per_s,
            requests,
            cpu_ns: cpu.as_ref().map(|c| c.work_ns as f64),
            utilisation: cpu.as_ref().map(|c| c.utilisation),
            latency: window.latency.take(),
            entries: Some(window.entries as f64),
            // Per stage, its visits and the vCPU time they took.
            stages: (window.stage_entries.len() == window.busy.len()).then(|| {
                window
                    .stage_entries
                    .iter()
                    .zip(&window.busy)
                    .map(|(e, ns)| StageWork {
                        work: *e as f64,
                        time: *ns as f64,
                    })
                    .collect()
            }),
        }
    }

    /// The run's CPU figures so far (`None` before a period had them).
    pub fn report(&self) -> Option<CpuReport> {
        (self.periods > 0).then(|| CpuReport {
            periods: self.periods,
            work_ns: self.work_ns,
            requests: self.requests,
            cpu_per_request_us: if self.requests > 0.0 {
                self.work_ns as f64 / self.requests / 1000.0
            } else {
                0.0
            },
            utilisation: self.utilisation_sum / self.periods as f64,
            vcpu_utilisation: self.vcpu_utilisation.clone(),
        })
    }
}
