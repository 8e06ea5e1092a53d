//! A hold of `auto`: the mode a trial kept runs until its interval is over
//! or a **change point** says the workload changed; either starts a new
//! trial ([`Step::Trial`]). A hold never switches mode by itself: every
//! switch is a trial's verdict.
//!
//! After the hold settles ([`AutoParams::mix_settle`] periods: the threads
//! move to the kept plan, and the stage-load shares of those periods are
//! the reference mix), three CUSUM detectors ([`Cusum`]) watch
//!
//! * the completed-request rate (a load that rises or falls, or a mode that
//!   stopped paying at saturation),
//! * the utilisation (the load crossing saturation changes the objective),
//! * the L1 distance of each period's stage-load shares from the reference
//!   mix (upper only: a new stage mix),
//!
//! each calibrated on its own first [`CusumParams::calibrate`] periods; and,
//! when the trial knew a latency bound, the p99 of each block of
//! [`AutoParams::latency_block`] periods against it (a held mode whose tail
//! grew past the bound is re-tested, not dropped blind). The interval
//! itself grows: see [`AutoParams::max_hold_periods`].

use super::cusum::{Cusum, CusumParams, Shift};
use super::measure::Objective;
use super::{shares, AutoParams, Mode};
use crate::histogram::Histogram;
use crate::policy::Observation;

/// What a period of the hold decided.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// Go on running the held mode.
    Stay,
    /// Start a new trial: why, and whether a change point fired (else the
    /// interval ran out).
    Trial(String, bool),
}

/// A hold (see the module docs).
#[derive(Debug)]
pub(super) struct Hold {
    /// The mode held.
    pub mode: Mode,
    /// Periods left.
    pub left: u32,
    /// The deciding trial's objective.
    pub objective: Objective,
    /// Periods run, and the shares summed over the settling ones.
    ran: u32,
    sum: Vec<f64>,
    reference: Option<Vec<f64>>,
    rate: Cusum,
    utilisation: Cusum,
    mix: Cusum,
    /// The highest p99 the held mode may show (ns), and the running block.
    limit_ns: Option<f64>,
    block: Histogram,
    block_periods: u32,
}

impl Hold {
    /// A hold of `mode` for `periods`; `objective` and `limit_ns` the
    /// deciding trial's.
    pub fn new(
        mode: Mode,
        p: &AutoParams,
        periods: u32,
        objective: Objective,
        limit_ns: Option<f64>,
    ) -> Self {
        let [rate, utilisation, mix] = detectors(p);
        Self {
            mode,
            left: periods,
            objective,
            ran: 0,
            sum: Vec::new(),
            reference: None,
            rate,
            utilisation,
            mix,
            // Unstaged is the reference of the bound, not bound by it.
            limit_ns: limit_ns.filter(|_| mode != Mode::Unstaged),
            block: Histogram::new(),
            block_periods: 0,
        }
    }

    /// The hold before the first trial (unstaged, `p.first_trial_after`
    /// periods).
    pub fn first(p: &AutoParams) -> Self {
        Self::new(
            Mode::Unstaged,
            p,
            p.first_trial_after,
            Objective::Rate,
            None,
        )
    }

    /// The VM's stage cores changed in number: the rate's and the
    /// utilisation's detectors calibrate afresh at the new size (both move
    /// with the cores, by a factor no model gives: a move is not a change
    /// of workload); the stage mix's goes on.
    pub fn recalibrate(&mut self, p: &AutoParams) {
        let [rate, utilisation, _] = detectors(p);
        self.rate = rate;
        self.utilisation = utilisation;
    }

    /// Advances the hold by the period that just ended (`load`, `o`).
    pub fn step(&mut self, p: &AutoParams, load: &[f64], o: &Observation) -> Step {
        self.ran = self.ran.saturating_add(1);
        let s = shares(load);
        let busy = load.iter().any(|l| *l > 0.0);
        if let Some(why) = self.detect(p, o, &s, busy) {
            return Step::Trial(why, true);
        }
        if self.left == 0 {
            return Step::Trial("hold over".into(), false);
        }
        self.left -= 1;
        Step::Stay
    }

    fn detect(&mut self, p: &AutoParams, o: &Observation, s: &[f64], busy: bool) -> Option<String> {
        if self.ran <= p.mix_settle {
            if busy {
                self.sum.resize(s.len(), 0.0);
                for (a, x) in self.sum.iter_mut().zip(s) {
                    *a += x;
                }
            }
            return None;
        }
        if self.reference.is_none() {
            let total: f64 = self.sum.iter().sum();
            self.reference = Some(
                self.sum
                    .iter()
                    .map(|x| x / total.max(f64::MIN_POSITIVE))
                    .collect(),
            );
        }
        let mut why = Vec::new();
        let r = o.requests_per_s;
        if r.is_finite() && r > 0.0 {
            if let Some(shift) = self.rate.push(r) {
                why.push(format!(
                    "rate {} (now {r:.0} requests/s, {:.0} held)",
                    word(shift),
                    self.rate.reference().unwrap_or(0.0)
                ));
            }
        }
        if let Some(u) = o.utilisation.filter(|u| u.is_finite()) {
            if let Some(shift) = self.utilisation.push(u) {
                why.push(format!(
                    "utilisation {} (now {:.0} %, {:.0} % held)",
                    word(shift),
                    u * 100.0,
                    self.utilisation.reference().unwrap_or(0.0) * 100.0
                ));
            }
        }
        if busy {
            let reference = self.reference.as_deref().unwrap_or_default();
            let dist: f64 = reference.iter().zip(s).map(|(a, b)| (a - b).abs()).sum();
            if self.mix.push(dist).is_some() {
                why.push(format!("stage mix moved (L1 {dist:.2} from the reference)"));
            }
        }
        if let Some(limit) = self.limit_ns {
            if let Some(h) = &o.latency {
                self.block.merge(h);
            }
            self.block_periods += 1;
            if self.block_periods >= p.latency_block.max(1) {
                let p99 = (self.block.count() >= p.min_latency_samples)
                    .then(|| self.block.quantile(0.99))
                    .flatten();
                self.block = Histogram::new();
                self.block_periods = 0;
                if let Some(p99) = p99.filter(|v| *v > limit) {
                    why.push(format!(
                        "p99 {:.0} µs over the latency bound of {:.0} µs",
                        p99 / 1000.0,
                        limit / 1000.0
                    ));
                }
            }
        }
        (!why.is_empty()).then(|| format!("change point: {}", why.join(", ")))
    }
}

/// Fresh detectors of the rate, the utilisation (in its own units: σ at
/// least 0.02) and the stage mix's distance (upper only, no least shift).
fn detectors(p: &AutoParams) -> [Cusum; 3] {
    let c = p.change;
    let absolute = CusumParams {
        floor: 0.0,
        floor_abs: 0.02,
        ..c
    };
    [
        Cusum::new(c, false),
        Cusum::new(absolute, false),
        Cusum::new(
            CusumParams {
                min_shift: 0.0,
                ..absolute
            },
            true,
        ),
    ]
}

fn word(s: Shift) -> &'static str {
    match s {
        Shift::Up => "rose",
        Shift::Down => "fell",
    }
}
