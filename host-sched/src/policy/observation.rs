//! What the VMM (or stagesim) measured over a policy period
//! ([`Observation`]), given to the policy before it plans; only `auto`
//! uses it.

use crate::histogram::Histogram;

/// What the VMM measured over the policy period that just ended, given to
/// the policy before [`super::Policy::plan`] (only `auto` uses it).
#[derive(Clone, Debug, Default)]
pub struct Observation {
    /// Requests completed per second (requests/s; the VMM estimates them
    /// from the period's stage entries, which arrive evenly).
    pub requests_per_s: f64,
    /// Requests completed in the period (the same estimate).
    pub requests: f64,
    /// CPU the vCPU threads spent on the guest's work in the period (ns):
    /// their CPU time minus the guest's idle spinning (docs/design.md,
    /// "CPU per request"); `None` when it could not be measured.
    pub cpu_ns: Option<f64>,
    /// Share of the VM's vCPU capacity that work used in the period
    /// (0..=1: work CPU ÷ (period × the cores its vCPUs may use)).
    pub utilisation: Option<f64>,
    /// The period's sampled request latencies (ABI minor 4; `None` from an
    /// older guest).
    pub latency: Option<Histogram>,
    /// Stage entries (visits) in the period; with `cpu_ns`, the mean visit
    /// (`auto`'s candidates).
    pub entries: Option<f64>,
    /// Per guest stage, the work it did in the period and the time that
    /// took (`None`: not measured). `auto` weighs its slices' figures by
    /// one stage mix with them ([`StageWork`]).
    pub stages: Option<Vec<StageWork>>,
}

/// One stage's work in a policy period: `work` in units whose cost does
/// not depend on the mode (the VMM: the stage's entries, i.e. visits;
/// stagesim: its instructions) and the time they took, `time` (the VMM:
/// vCPU time in the stage, ns; stagesim: core cycles; only ratios of it
/// are used).
///
/// Why `auto` needs it: a visit policy changes *which* stages run in a
/// short slice, not only how fast. SRPT serves the pipeline's last stages
/// first, so a slice of it runs more of their work and leaves the first
/// stages' work queued for the slice after; when the stages' speeds
/// differ, the slice's rate then measures the mix as much as the mode. On
/// MariaDB's oltp_read_only trace (stagesim, L2 512 KiB, 2 cores) SRPT's
/// slices ran 66 % of a period in `execute` against FIFO's 50 %, and
/// measured temporal 5.5 % ahead of unstaged where full replays put it
/// 7.3 % behind (bench/RESULTS.md, issue 49).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageWork {
    /// Work done (visits or instructions).
    pub work: f64,
    /// The time it took (ns or cycles).
    pub time: f64,
}

impl Observation {
    /// An observation of the rate alone (requests/s over one period).
    pub fn rate(requests_per_s: f64) -> Self {
        Self {
            requests_per_s,
            ..Default::default()
        }
    }

    /// CPU per completed request (ns); `None` without CPU figures or
    /// requests.
    pub fn cpu_per_request_ns(&self) -> Option<f64> {
        let cpu = self.cpu_ns?;
        (self.requests > 0.0 && cpu.is_finite() && cpu >= 0.0).then(|| cpu / self.requests)
    }
}
