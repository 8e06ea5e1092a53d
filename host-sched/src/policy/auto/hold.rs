//! A hold of `auto`: the mode a trial kept runs for
//! [`AutoParams::hold_periods`], unless
//!
//! * **it stops paying** (a mode other than unstaged, once the hold
//!   settled): its smoothed figure under the trial's objective falls
//!   behind what unstaged measured in the trial by the margin — a rate
//!   below, or a CPU per request above — or the p99 latency of a block of
//!   [`AutoParams::latency_block`] periods passes the trial's latency
//!   bound, or an **unstaged probe** — one epoch of unstaged every
//!   [`AutoParams::probe_every`] periods of the hold ([`Step::Probe`]) —
//!   beats it by [`AutoParams::decisive`]: it falls back to unstaged
//!   ([`Step::FallBack`]). The probes bound how long a mode that a trial
//!   misjudged, or that stopped paying while its figure stayed above the
//!   trial's unstaged reference, can be held: one probe interval. A probe
//!   that does not decide refreshes the reference (the mean of the
//!   trial's and the probe's);
//! * **the stage mix moves**: the stage-load shares, averaged, stay
//!   [`AutoParams::mix_change`] away from those early in the hold for
//!   [`AutoParams::mix_persist`] periods, or
//! * **the load crosses saturation**: the smoothed utilisation stays on
//!   the other side of [`AutoParams::saturation`] (by a band) from where
//!   the trial found it for as long: a new trial ([`Step::Trial`]).

use super::measure::{Measured, Objective};
use super::{shares, AutoParams, Mode};
use crate::latency::Histogram;
use crate::policy::Observation;

/// What the trial measured that a hold of another mode than unstaged is
/// watched against.
#[derive(Clone, Debug)]
pub(super) struct Guard {
    /// The trial's objective.
    pub objective: Objective,
    /// Unstaged's figure in the trial under it: requests/s, or ns of CPU
    /// per request.
    pub unstaged: f64,
    /// The highest p99 the held mode may show (ns), when known.
    pub limit_ns: Option<f64>,
}

/// The running state of a guard.
#[derive(Debug)]
struct Watch {
    guard: Guard,
    /// The held mode's smoothed figure.
    avg: Option<f64>,
    /// The current block's latencies and periods.
    block: Histogram,
    block_periods: u32,
    /// Periods since the last unstaged probe (or the start of the hold),
    /// the running probe (its period and measurements), and periods left
    /// whose figures the guard skips (the move back after a probe).
    since_probe: u32,
    probe: Option<(u32, Measured)>,
    skip: u32,
}

/// What ended a hold of a staged mode early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fallback {
    /// Its figure fell behind unstaged's of its trial.
    Figure,
    /// Its p99 passed the latency bound.
    Latency,
    /// An unstaged probe beat it.
    Probe,
}

/// What a period of the hold decided.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// Go on running the held mode.
    Stay,
    /// Hold unstaged instead (what ended the hold, why).
    FallBack(Fallback, String),
    /// Start a new trial (why).
    Trial(String),
    /// Run unstaged this period: an unstaged probe (its step, or empty).
    Probe(String),
}

/// A hold (see the module docs).
#[derive(Debug)]
pub(super) struct Hold {
    /// The mode held.
    pub mode: Mode,
    /// Periods left.
    pub left: u32,
    /// The stage-load shares: the plain mean over the hold's first
    /// periods (which becomes `reference`), then a moving average.
    average: Vec<f64>,
    reference: Option<Vec<f64>>,
    /// Consecutive periods the shares have been away from `reference`.
    away: u32,
    watch: Option<Watch>,
    /// The trial's objective; then the smoothed utilisation since, and the
    /// consecutive periods it has been across saturation from it.
    pub objective: Objective,
    utilisation: Option<f64>,
    load_away: u32,
}

impl Hold {
    /// The VM's stage cores changed in number by `factor` (new ÷ old):
    /// the guard's unstaged figure scales with them under the rate
    /// objective (a CPU-per-request figure does not), the held mode's
    /// smoothed figure, a probe in flight and the periods to skip start
    /// again.
    pub fn rescale(&mut self, factor: f64) {
        if let Some(w) = self.watch.as_mut() {
            if w.guard.objective == Objective::Rate && factor.is_finite() && factor > 0.0 {
                w.guard.unstaged *= factor;
            }
            w.avg = None;
            w.probe = None;
            w.skip = 0;
        }
    }

    /// A hold of `mode` for `p.hold_periods`, from the stage loads `load`
    /// of the period that decided it; `guard` for a mode other than
    /// unstaged; `objective` the deciding trial's.
    pub fn new(
        mode: Mode,
        p: &AutoParams,
        load: &[f64],
        guard: Option<Guard>,
        objective: Objective,
    ) -> Self {
        Self {
            mode,
            left: p.hold_periods,
            average: shares(load),
            reference: None,
            away: 0,
            watch: guard.map(|guard| Watch {
                guard,
                avg: None,
                block: Histogram::new(),
                block_periods: 0,
                since_probe: 0,
                probe: None,
                skip: 0,
            }),
            objective,
            utilisation: None,
            load_away: 0,
        }
    }

    /// The hold before the first trial (unstaged, `p.first_trial_after`
    /// periods).
    pub fn first(p: &AutoParams) -> Self {
        let mut h = Self::new(Mode::Unstaged, p, &[], None, Objective::Rate);
        h.left = p.first_trial_after;
        h
    }

    /// Advances the hold by the period that just ended (`load`, `o`).
    pub fn step(&mut self, p: &AutoParams, load: &[f64], o: &Observation) -> Step {
        let settled = p.hold_periods.saturating_sub(self.left) >= p.mix_settle;
        match self.probe(p, o, settled) {
            Some(Step::Stay) => {}
            Some(step) => {
                self.left = self.left.saturating_sub(1);
                return step;
            }
            None => {
                if let Some((kind, why)) = self.watch(p, o, settled) {
                    return Step::FallBack(kind, why);
                }
            }
        }
        if let Some(why) = self.load_changed(p, o, settled) {
            return Step::Trial(why);
        }
        if load.iter().any(|l| *l > 0.0) {
            // Until the hold settles, the plain mean of its periods (with
            // the trial's last one): the reference must not be one noisy
            // period, and under a temporal visit policy a period's shares
            // swing by ±0.2 (a vCPU serves one stage for milliseconds).
            // After that, the moving average.
            let weight = if self.reference.is_none() {
                1.0 / f64::from(p.hold_periods.saturating_sub(self.left) + 2)
            } else {
                p.mix_smoothing
            };
            for (a, s) in self.average.iter_mut().zip(shares(load)) {
                *a += weight * (s - *a);
            }
        }
        if self.reference.is_none() && settled {
            self.reference = Some(self.average.clone());
        }
        let moved: f64 = self.reference.as_ref().map_or(0.0, |r| {
            r.iter()
                .zip(self.average.iter())
                .map(|(a, b)| (a - b).abs())
                .sum()
        });
        self.away = if moved > p.mix_change {
            self.away + 1
        } else {
            0
        };
        if self.left == 0 {
            return Step::Trial("hold over".into());
        }
        if self.away >= p.mix_persist.max(1) {
            return Step::Trial("stage mix changed".into());
        }
        self.left -= 1;
        Step::Stay
    }

    /// The unstaged probes of a held mode other than unstaged (see the
    /// module docs): `None` when the period ran the held mode and the guard
    /// judges it; `Some(Stay)` for a period the guard skips; else the probe's
    /// step or its verdict.
    fn probe(&mut self, p: &AutoParams, o: &Observation, settled: bool) -> Option<Step> {
        let mode = self.mode.name();
        let w = self.watch.as_mut()?;
        let Some((period, measured)) = w.probe.as_mut() else {
            w.since_probe += 1;
            if w.skip > 0 {
                w.skip -= 1;
                return Some(Step::Stay);
            }
            if !settled || w.since_probe < p.probe_every.max(1) || w.avg.is_none() {
                return None;
            }
            w.probe = Some((0, Measured::default()));
            return Some(Step::Probe(format!("probe unstaged 1/{}", p.epoch_periods)));
        };
        // The period that just ended ran unstaged (its first is the move).
        if *period > 0 && o.requests_per_s.is_finite() && o.requests_per_s > 0.0 {
            measured.record(o);
        }
        *period += 1;
        if *period < p.epoch_periods {
            return Some(Step::Probe(format!(
                "probe unstaged {}/{}",
                *period + 1,
                p.epoch_periods
            )));
        }
        let (_, measured) = w.probe.take()?;
        w.since_probe = 0;
        // The move back to the held mode is not its figure.
        w.skip = 1;
        let g = &mut w.guard;
        let (probe, held) = match g.objective {
            Objective::Rate => (measured.rate(), w.avg),
            Objective::CpuPerRequest => (measured.cpu_per_request_ns(), w.avg),
        };
        let (Some(probe), Some(held)) = (probe, held) else {
            return Some(Step::Stay);
        };
        // By how much unstaged leads, as a fraction of the reference.
        let lead = match g.objective {
            Objective::Rate => (probe - held) / g.unstaged.max(f64::MIN_POSITIVE),
            Objective::CpuPerRequest => (held - probe) / g.unstaged.max(f64::MIN_POSITIVE),
        };
        if settled && lead >= p.decisive {
            let unit = match g.objective {
                Objective::Rate => "requests/s",
                Objective::CpuPerRequest => "ns of CPU per request",
            };
            return Some(Step::FallBack(Fallback::Probe, format!(
                "keep unstaged: an unstaged probe ran at {probe:.0} {unit}, {:.1} % ahead of {mode}'s {held:.0} in its hold",
                lead * 100.0
            )));
        }
        g.unstaged = (g.unstaged + probe) / 2.0;
        Some(Step::Stay)
    }

    /// The guard of a held mode other than unstaged: why it falls back, if
    /// it does.
    fn watch(
        &mut self,
        p: &AutoParams,
        o: &Observation,
        settled: bool,
    ) -> Option<(Fallback, String)> {
        let mode = self.mode.name();
        let w = self.watch.as_mut()?;
        let g = &w.guard;
        let value = match g.objective {
            Objective::Rate => Some(o.requests_per_s).filter(|r| r.is_finite() && *r > 0.0),
            Objective::CpuPerRequest => o.cpu_per_request_ns(),
        };
        if let Some(v) = value {
            let a = w.avg.map_or(v, |a| a + p.fall_back_smoothing * (v - a));
            w.avg = Some(a);
            if settled {
                match g.objective {
                    Objective::Rate if a < g.unstaged * (1.0 - p.margin) => {
                        return Some((Fallback::Figure, format!(
                            "keep unstaged: {mode} fell to {a:.0} requests/s in its hold, below the {:.0} unstaged ran at in the trial",
                            g.unstaged
                        )));
                    }
                    Objective::CpuPerRequest if a > g.unstaged * (1.0 + p.margin) => {
                        return Some((Fallback::Figure, format!(
                            "keep unstaged: {mode} rose to {:.2} µs of CPU per request in its hold, above the {:.2} unstaged used in the trial",
                            a / 1000.0,
                            g.unstaged / 1000.0
                        )));
                    }
                    _ => {}
                }
            }
        }
        let limit = g.limit_ns?;
        if let Some(h) = &o.latency {
            w.block.merge(h);
        }
        w.block_periods += 1;
        if w.block_periods < p.latency_block.max(1) {
            return None;
        }
        let p99 = (w.block.count() >= p.min_latency_samples)
            .then(|| w.block.quantile(0.99))
            .flatten();
        w.block = Histogram::new();
        w.block_periods = 0;
        let p99 = p99.filter(|v| *v > limit)?;
        Some((Fallback::Latency, format!(
            "keep unstaged: {mode}'s p99 latency rose to {:.0} µs in its hold, over the latency bound of {:.0} µs",
            p99 / 1000.0,
            limit / 1000.0
        )))
    }

    /// Whether the load crossed saturation for good since the trial (see
    /// the module docs): why, if it did.
    fn load_changed(&mut self, p: &AutoParams, o: &Observation, settled: bool) -> Option<String> {
        let u = o.utilisation.filter(|u| u.is_finite())?;
        let a = self
            .utilisation
            .map_or(u, |a| a + p.mix_smoothing * (u - a));
        self.utilisation = Some(a);
        let across = match self.objective {
            Objective::CpuPerRequest => a >= p.saturation + p.saturation_band / 3.0,
            Objective::Rate => a <= p.saturation - p.saturation_band,
        };
        self.load_away = if settled && across {
            self.load_away + 1
        } else {
            0
        };
        (self.load_away >= p.mix_persist.max(1)).then(|| {
            format!(
                "load changed (utilisation {:.0} %, {} saturation)",
                a * 100.0,
                if across && self.objective == Objective::Rate {
                    "below"
                } else {
                    "at"
                }
            )
        })
    }
}
