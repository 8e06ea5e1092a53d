//! Open-loop arrivals: when the requests of an open-loop client arrive,
//! whatever the server does — a fixed interval, or a Poisson process
//! (exponential gaps, the usual model of many independent clients). The
//! test guest's generator and the host reference draw the same schedule
//! from the same seed, so both see the same requests at the same times.

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

/// The arrival times of an open-loop client of `rate` requests/s.
#[derive(Clone, Debug)]
pub struct Arrivals {
    /// Mean gap (ns).
    mean_ns: f64,
    dist: ArrivalDist,
    /// xorshift64 state.
    rng: u64,
    /// The next arrival (ns since the first).
    next_ns: f64,
}

impl Arrivals {
    /// A schedule of `rate` requests/s (≥ 1), the first at 0.
    pub fn new(rate: u64, dist: ArrivalDist) -> Self {
        Self {
            mean_ns: 1e9 / rate.max(1) as f64,
            dist,
            rng: ARRIVAL_SEED,
            next_ns: 0.0,
        }
    }

    /// The next arrival's time (ns since the first).
    pub fn next_ns(&mut self) -> u64 {
        let t = self.next_ns;
        let gap = match self.dist {
            ArrivalDist::Fixed => self.mean_ns,
            ArrivalDist::Poisson => {
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                // Uniform in (0, 1]: 53 bits, never 0.
                let u = ((self.rng >> 11) + 1) as f64 / (1u64 << 53) as f64;
                -self.mean_ns * libm::log(u)
            }
        };
        self.next_ns = t + gap;
        t as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_have_the_rate_asked_for() {
        let mut f = Arrivals::new(1000, ArrivalDist::Fixed);
        assert_eq!(
            (f.next_ns(), f.next_ns(), f.next_ns()),
            (0, 1_000_000, 2_000_000)
        );
        let mut p = Arrivals::new(1000, ArrivalDist::Poisson);
        let n = 100_000;
        let mut last = 0;
        for _ in 0..n {
            last = p.next_ns();
        }
        // 100 s of a Poisson process at 1000/s: within 1 %.
        let secs = last as f64 / 1e9;
        assert!((secs / 100.0 - 1.0).abs() < 0.01, "{secs} s");
        // The same seed, the same schedule.
        let mut q = Arrivals::new(1000, ArrivalDist::Poisson);
        let mut r = Arrivals::new(1000, ArrivalDist::Poisson);
        assert!((0..100).all(|_| q.next_ns() == r.next_ns()));
        assert_eq!(ArrivalDist::parse("poisson"), Some(ArrivalDist::Poisson));
        assert_eq!(ArrivalDist::parse("uniform"), None);
    }
}
