//! The settling of a trial's slices ([`Settle`]): how many periods after a
//! change of plan a slice skips, measured from the figures.

use super::{AutoParams, Mode};

/// Switched slices of a mode that measure its settling before the
/// estimate is used (two modes' worth: as many as a duel of the least
/// pairs switches to each side).
const SETTLE_SAMPLES: usize = 3;

/// Measures how many periods after a change of plan differ from the
/// slice's steady figure: per mode switched to and per position after the
/// change (0 = the period the threads move), the relative deviations of
/// the period's score from the mean of the slice's measured periods. A
/// position is settled when, for every mode with [`SETTLE_SAMPLES`] of
/// them, its mean deviation is within the larger of half the margin and
/// two standard errors; the settling is the number of positions up to the
/// last unsettled one. Until two modes were measured that often it is the
/// most ([`AutoParams::max_settle`]).
///
/// Per mode, because a transient is often one mode's gain and the other's
/// loss: a visit policy that serves the last stages first completes their
/// queued work in its first period (+19 % on MariaDB's oltp_read_only in
/// stagesim) and leaves the first stages' to FIFO's first period (−10 %);
/// pooled, the two cancelled and the settling measured 0.
#[derive(Clone, Debug, Default)]
pub(super) struct Settle {
    dev: [Vec<Vec<f64>>; 4],
    estimate: Option<u32>,
}

impl Settle {
    /// Periods a slice that begins with a change of plan skips.
    pub fn periods(&self, p: &AutoParams) -> u32 {
        self.estimate.unwrap_or(p.max_settle).min(p.max_settle)
    }

    /// A switched slice of `mode`: its per-period scores (`None`: no
    /// requests) ended with `skipped` periods unmeasured: adds the
    /// deviations.
    pub(super) fn add(
        &mut self,
        p: &AutoParams,
        mode: Mode,
        scores: &[Option<f64>],
        skipped: usize,
    ) {
        if self.estimate.is_some() {
            return;
        }
        let steady: Vec<f64> = scores[skipped.min(scores.len())..]
            .iter()
            .flatten()
            .copied()
            .collect();
        if steady.is_empty() {
            return;
        }
        let m = steady.iter().sum::<f64>() / steady.len() as f64;
        if m == 0.0 || !m.is_finite() {
            return;
        }
        let max = p.max_settle as usize;
        let dev = &mut self.dev[mode.index()];
        dev.resize_with(max, Vec::new);
        for (i, s) in scores.iter().take(max).enumerate() {
            if let Some(s) = s {
                dev[i].push((s - m) / m.abs());
            }
        }
        let sampled =
            |d: &Vec<Vec<f64>>| d.len() == max && d.iter().all(|d| d.len() >= SETTLE_SAMPLES);
        if self.dev.iter().filter(|d| sampled(d)).count() >= 2 {
            let unsettled = (0..max).rposition(|i| {
                self.dev.iter().filter(|d| sampled(d)).any(|d| {
                    let d = &d[i];
                    let n = d.len() as f64;
                    let mean = d.iter().sum::<f64>() / n;
                    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
                    mean.abs() > (p.margin / 2.0).max(2.0 * (var / n).sqrt())
                })
            });
            self.estimate = Some(unsettled.map_or(0, |i| i as u32 + 1));
        }
    }
}
