//! Open-loop arrivals: when the requests of an open-loop client arrive,
//! whatever the server does — a fixed interval, or a Poisson process
//! (exponential gaps, the usual model of many independent clients). The
//! test guest's generator (in TSC ticks) and the host reference (in ns)
//! draw the same schedule from the same seed.
//!
//! Integer arithmetic only after construction: the test guest is built
//! soft-float (a logarithm per arrival took ~1 µs there, with the
//! generator's lock held). Exponential gaps come by inverse transform from
//! a table of −ln u at 4,096 quantiles, interpolated linearly inside a
//! quantile with 20 more random bits; the lowest quantile (u < 1/4096)
//! recurses by the exponential's memorylessness (ln 4096 plus a fresh
//! draw), so the tail is not cut. Error: the interpolation's, below 0.01 %
//! of the mean outside the lowest quantiles.

/// How the gaps between arrivals are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrivalDist {
    /// Every gap is the mean.
    Fixed,
    /// Exponential gaps of the mean (a Poisson process).
    Poisson,
}

impl ArrivalDist {
    /// `fixed` or `poisson`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fixed" => Some(Self::Fixed),
            "poisson" => Some(Self::Poisson),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fixed => "fixed",
            Self::Poisson => "poisson",
        }
    }
}

/// The seed every schedule starts from (any odd constant: the same
/// schedule in the guest and on the host).
pub const ARRIVAL_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// Bits of a quantile index.
const QBITS: u32 = 12;
const QUANTILES: usize = 1 << QBITS;
/// Fraction bits of the table's values (−ln u ≤ 8.32 < 2⁵).
const FRAC: u32 = 27;

/// The arrival times of an open-loop client.
#[derive(Clone, Debug)]
pub struct Arrivals {
    /// Mean gap in units × 2³².
    mean_q32: u64,
    dist: ArrivalDist,
    /// xorshift64 state.
    rng: u64,
    /// The next arrival (units × 2³² since the first).
    next_q32: u128,
    /// −ln(i / 4096) × 2²⁷ for i in 1..=4096 (index 0 unused).
    table: [u32; QUANTILES + 1],
}

impl Arrivals {
    /// A schedule of `rate` requests/s (≥ 1) in units of `per_second`
    /// per second (1e9: ns; the TSC rate in Hz: ticks), the first at 0.
    pub fn new(rate: u64, dist: ArrivalDist, per_second: u64) -> Self {
        let mean = per_second as f64 / rate.max(1) as f64;
        let mut table = [0u32; QUANTILES + 1];
        for (i, t) in table.iter_mut().enumerate().skip(1) {
            let v = -libm::log(i as f64 / QUANTILES as f64);
            *t = (v * (1u64 << FRAC) as f64) as u32;
        }
        Self {
            mean_q32: (mean * (1u64 << 32) as f64) as u64,
            dist,
            rng: ARRIVAL_SEED,
            next_q32: 0,
            table,
        }
    }

    fn draw(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// An exponential of mean 1, in fixed point × 2²⁷.
    fn exponential(&mut self) -> u64 {
        let mut acc = 0u64;
        loop {
            let r = self.draw();
            let i = (r >> (64 - QBITS)) as usize;
            if i == 0 {
                // u < 1/4096: −ln u = ln 4096 + −ln(u × 4096), memoryless.
                // table[1] = −ln(1/4096) = ln 4096.
                acc = acc.saturating_add(u64::from(self.table[1]));
                continue;
            }
            // u in [i/4096, (i+1)/4096): between table[i+1] and table[i].
            let (hi, lo) = (u64::from(self.table[i]), u64::from(self.table[i + 1]));
            let f = (r >> (64 - QBITS - 20)) & ((1 << 20) - 1);
            return acc + hi - (((hi - lo) * f) >> 20);
        }
    }

    /// The next arrival's time (units since the first).
    pub fn next_arrival(&mut self) -> u64 {
        let t = self.next_q32;
        let gap = match self.dist {
            ArrivalDist::Fixed => u128::from(self.mean_q32),
            ArrivalDist::Poisson => {
                (u128::from(self.mean_q32) * u128::from(self.exponential())) >> FRAC
            }
        };
        self.next_q32 = t + gap;
        (t >> 32) as u64
    }
}

/// On/off phases of an open-loop client: requests arrive only in the
/// `on` part of every `on + off` period, the first period starting at
/// `offset` (all in the schedule's units). The schedule's own times are
/// *active* time, laid out over the on windows, so the rate within a
/// window is the schedule's rate and a window holds `on` of it. Two
/// guests with the same `on` = `off` and offsets 0 and `on` are busy in
/// turn (`just bench-host`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phases {
    /// Length of a busy window (units; 0: always on).
    pub on: u64,
    /// Length of an idle window (units).
    pub off: u64,
    /// Start of the first busy window (units).
    pub offset: u64,
    /// The rate in the other windows, % of the busy windows' (0: idle;
    /// `phases=20000:20000:0:33` alternates 90 % and 30 % of a guest's
    /// capacity every 20 s when RATE is 90 % of it: `just bench-auto` O4).
    pub low_pct: u64,
}

impl Phases {
    /// The time (units since the start) at which active time `active`
    /// falls: `offset + ⌊active / on⌋ × (on + off) + active mod on`
    /// (saturating). Always on: `active` itself.
    pub fn wall(&self, active: u64) -> u64 {
        if self.on == 0 {
            return active;
        }
        // Active time per on + off period: the on window, and the off
        // window at `low_pct` of the rate (capped at 100 %).
        let pct = self.low_pct.min(100);
        let low = self.off.saturating_mul(pct) / 100;
        let per = self.on.saturating_add(low).max(1);
        let (k, a) = (active / per, active % per);
        let within = if a < self.on {
            a
        } else {
            // In the off window, active time runs at pct % of wall time.
            self.on
                .saturating_add((a - self.on).saturating_mul(100) / pct.max(1))
        };
        k.saturating_mul(self.on.saturating_add(self.off))
            .saturating_add(within)
            .saturating_add(self.offset)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    #[test]
    fn schedules_have_the_rate_and_the_shape_asked_for() {
        let mut f = Arrivals::new(1000, ArrivalDist::Fixed, 1_000_000_000);
        assert_eq!(
            (f.next_arrival(), f.next_arrival(), f.next_arrival()),
            (0, 1_000_000, 2_000_000)
        );
        let mut p = Arrivals::new(1000, ArrivalDist::Poisson, 1_000_000_000);
        let n = 200_000;
        let mut last = 0;
        let mut gaps = Vec::with_capacity(n);
        for _ in 0..n {
            let t = p.next_arrival();
            gaps.push(t - last);
            last = t;
        }
        // 200 s of a Poisson process at 1000/s: within 1 %.
        let secs = last as f64 / 1e9;
        assert!((secs / 200.0 - 1.0).abs() < 0.01, "{secs} s");
        // Exponential: P(gap > mean) = 1/e, P(gap > 5 means) = e^-5, and
        // gaps beyond ln 4096 means (the recursion) exist.
        let over = |k: f64| gaps.iter().filter(|g| **g as f64 > k * 1e6).count() as f64 / n as f64;
        assert!((over(1.0) - (-1.0f64).exp()).abs() < 0.005, "{}", over(1.0));
        assert!((over(5.0) - (-5.0f64).exp()).abs() < 0.001, "{}", over(5.0));
        assert!(over(9.0) > 0.0);
        // The same seed, the same schedule, whatever the unit.
        let mut q = Arrivals::new(1000, ArrivalDist::Poisson, 2_600_000_000);
        let mut r = Arrivals::new(1000, ArrivalDist::Poisson, 2_600_000_000);
        assert!((0..100).all(|_| q.next_arrival() == r.next_arrival()));
        assert_eq!(ArrivalDist::parse("poisson"), Some(ArrivalDist::Poisson));
        assert_eq!(ArrivalDist::parse("uniform"), None);
        let ln_q = 12.0 * core::f64::consts::LN_2 * (1u64 << FRAC) as f64;
        assert!(
            (f64::from(p.table[1]) - ln_q).abs() <= 1.0,
            "{}",
            p.table[1]
        );
    }

    #[test]
    fn phases_lay_active_time_over_the_on_windows() {
        let p = Phases {
            on: 100,
            off: 300,
            offset: 50,
            low_pct: 0,
        };
        // 0..100 active → 50..150, 100..200 → 450..550, …
        assert_eq!(
            [0, 99, 100, 250].map(|t| p.wall(t)),
            [50, 149, 450, 50 + 2 * 400 + 50]
        );
        assert_eq!(Phases::default().wall(1234), 1234);
        assert_eq!(
            Phases {
                on: 1,
                off: u64::MAX,
                offset: 0,
                low_pct: 0,
            }
            .wall(5),
            u64::MAX
        );
        // Fixed arrivals at 10/unit-second over windows: none falls in an
        // off window.
        let mut a = Arrivals::new(10, ArrivalDist::Fixed, 1000);
        assert!((0..1000).all(|_| (p.wall(a.next_arrival()) - 50) % 400 < 100));
        // A low phase at a third of the rate: 100 active units in the on
        // window, 100 spread over the 300 of the off window.
        let low = Phases { low_pct: 33, ..p };
        assert_eq!(
            [0, 99, 100, 150, 198, 199].map(|t| low.wall(t)),
            [50, 149, 150, 301, 446, 450]
        );
        let mut a = Arrivals::new(10, ArrivalDist::Fixed, 1000);
        let walls: Vec<u64> = (0..990).map(|_| low.wall(a.next_arrival()) - 50).collect();
        let busy = walls.iter().filter(|w| *w % 400 < 100).count();
        // As many arrivals in the 100 units of an on window as in the 300
        // of an off window (99 active units at a third of the rate).
        assert_eq!((busy, walls.len() - busy), (497, 493));
    }
}
