//! The change-point detector of a hold (the `hold` submodule): Page's
//! CUSUM (E. S. Page, *Continuous Inspection Schemes*, Biometrika 41,
//! 1954) on a standardised signal, two-sided or upper only.
//!
//! The first [`CusumParams::calibrate`] values give the signal's reference
//! mean μ and standard deviation σ (floored at [`CusumParams::floor`] × |μ|
//! and at [`CusumParams::floor_abs`], so a near-constant signal does not
//! make every wiggle a change). After that each value `x` adds
//! `z = (x − μ) / σ` to the sums `S⁺ = max(0, S⁺ + z − k)` and
//! `S⁻ = max(0, S⁻ − z − k)`, and a sum passing `h` is a change. With
//! `k = 0.5`, `h = 12` (the defaults) a shift of one σ is found in ~26
//! values on average (`(h + 1.166) / (δ − k)`), and a stationary normal
//! signal raises a false alarm once in ~10⁶ values per side (Siegmund's
//! approximation of the average run length,
//! `(e^{2k(h+1.166)} − 2k(h + 1.166) − 1) / 2k²`; D. Siegmund, *Sequential
//! Analysis*, 1985, §X.2). The reference is itself estimated: after 150
//! values of a signal with 8 % noise per value (open-loop arrivals over a
//! 20 ms period) its mean is off by ~0.1 σ, which shortens the run length
//! towards ~4 × 10⁴ values (13 minutes of policy periods) on the side it
//! leans to; with `h = 8` and 20 values of calibration the unit tests met
//! a false alarm every ~1,000 periods. A shift of many σ (a load stepping
//! from 30 % to 90 %) is found
//! in one or two values.

/// A detector's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CusumParams {
    /// Values that calibrate μ and σ before any is judged.
    pub calibrate: u32,
    /// The allowance `k` (σ): drifts smaller than it are not accumulated.
    pub k: f64,
    /// The decision threshold `h` (σ).
    pub h: f64,
    /// The least σ as a fraction of |μ|.
    pub floor: f64,
    /// The least σ in the signal's own units.
    pub floor_abs: f64,
    /// The smallest shift worth finding, a fraction of |μ|: the allowance
    /// is at least half of it (a rate 5 % off its reference for ever is
    /// noise to a trial, whose margin is 3 %, not a new workload).
    pub min_shift: f64,
    /// The most one value adds to a sum (σ): a single outlier (a period in
    /// which the guest stalled) is not a change; a step is, in
    /// `h / (clip − k)` values.
    pub clip: f64,
}

impl Default for CusumParams {
    fn default() -> Self {
        Self {
            calibrate: 150,
            k: 0.5,
            h: 12.0,
            floor: 0.02,
            floor_abs: 1e-3,
            min_shift: 0.1,
            clip: 4.0,
        }
    }
}

/// Which way a signal moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shift {
    /// Above its reference.
    Up,
    /// Below its reference.
    Down,
}

/// A running detector.
#[derive(Clone, Debug)]
pub struct Cusum {
    p: CusumParams,
    /// Upper only (a distance, which can only grow when something moves).
    upper_only: bool,
    /// Calibration: values seen, their mean and sum of squared deviations
    /// (Welford).
    n: u32,
    mean: f64,
    m2: f64,
    sigma: f64,
    hi: f64,
    lo: f64,
}

impl Cusum {
    /// A detector that calibrates on its first values; `upper_only` for a
    /// signal whose change shows only as a rise.
    pub fn new(p: CusumParams, upper_only: bool) -> Self {
        Self {
            p,
            upper_only,
            n: 0,
            mean: 0.0,
            m2: 0.0,
            sigma: 0.0,
            hi: 0.0,
            lo: 0.0,
        }
    }

    /// The reference mean, once calibrated.
    pub fn reference(&self) -> Option<f64> {
        self.calibrated().then_some(self.mean)
    }

    fn calibrated(&self) -> bool {
        self.n >= self.p.calibrate.max(2)
    }

    /// Adds a value (a non-finite one is skipped); a change, if the sums
    /// passed `h`.
    pub fn push(&mut self, x: f64) -> Option<Shift> {
        if !x.is_finite() {
            return None;
        }
        if !self.calibrated() {
            self.n += 1;
            let d = x - self.mean;
            self.mean += d / f64::from(self.n);
            self.m2 += d * (x - self.mean);
            if self.calibrated() {
                let sd = (self.m2 / f64::from(self.n - 1)).sqrt();
                self.sigma = sd.max(self.p.floor * self.mean.abs()).max(self.p.floor_abs);
            }
            return None;
        }
        let z = ((x - self.mean) / self.sigma).clamp(-self.p.clip, self.p.clip);
        let k = self
            .p
            .k
            .max(self.p.min_shift * self.mean.abs() / 2.0 / self.sigma);
        self.hi = (self.hi + z - k).max(0.0);
        self.lo = if self.upper_only {
            0.0
        } else {
            (self.lo - z - k).max(0.0)
        };
        if self.hi > self.p.h {
            Some(Shift::Up)
        } else if self.lo > self.p.h {
            Some(Shift::Down)
        } else {
            None
        }
    }
}
