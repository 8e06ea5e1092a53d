//! Request-latency histograms on the host: the guest's per-vCPU bucket
//! deltas (ABI minor 4, `hypercall_abi::stage::VcpuLatency`) merged into
//! one [`Histogram`] per policy period, per trial epoch and per run, and
//! the quantiles `auto` and the report read from them.
//!
//! Buckets are the ABI's ([`latency_bucket`]: log-linear, 8 per power of
//! two of 16-ns units, each at most 1/8 of its lower bound wide from
//! 128 ns up). A quantile is interpolated linearly inside its bucket, as
//! Prometheus' `histogram_quantile` does; its error is at most a bucket's
//! width, 12.5 % of the value (6.25 % against the bucket's midpoint).

use hypercall_abi::stage::{latency_bucket, latency_bucket_lower_ns, LATENCY_BUCKETS};

/// Request latencies, bucketed (counts per bucket of the ABI's scheme).
#[derive(Clone, PartialEq, Eq)]
pub struct Histogram {
    buckets: Box<[u64; LATENCY_BUCKETS]>,
    count: u64,
    /// Sum of the latencies (ns), exact where the guest's own sum was
    /// consistent, else the buckets' midpoints.
    sum_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: Box::new([0; LATENCY_BUCKETS]),
            count: 0,
            sum_ns: 0,
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("sum_ns", &self.sum_ns)
            .field("p50_ns", &self.quantile(0.5))
            .field("p99_ns", &self.quantile(0.99))
            .finish()
    }
}

/// The midpoint of bucket `b` (ns): half-way to the next bucket's lower
/// bound; the last bucket's lower bound plus 1/16.
pub fn bucket_mid_ns(b: usize) -> u64 {
    let lo = latency_bucket_lower_ns(b);
    if b + 1 >= LATENCY_BUCKETS {
        return lo.saturating_add(lo / 16);
    }
    let hi = latency_bucket_lower_ns(b + 1);
    lo + (hi - lo) / 2
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    /// One latency of `ns` (tests, the simulator).
    pub fn record(&mut self, ns: u64) {
        self.add_bucket(latency_bucket(ns), 1);
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    /// `n` latencies in bucket `b` (ignored past the last bucket), without
    /// their sum (see [`Self::add_sum`]).
    pub fn add_bucket(&mut self, b: usize, n: u64) {
        if let Some(slot) = self.buckets.get_mut(b) {
            *slot = slot.saturating_add(n);
            self.count = self.count.saturating_add(n);
        }
    }

    /// Adds `ns` to the sum of latencies.
    pub fn add_sum(&mut self, ns: u64) {
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    /// Adds every latency of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a = a.saturating_add(*b);
        }
        self.count = self.count.saturating_add(other.count);
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }

    /// Latencies recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Their sum (ns).
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns
    }

    /// Per bucket, the latencies in it.
    pub fn buckets(&self) -> &[u64; LATENCY_BUCKETS] {
        &self.buckets
    }

    /// Mean latency (ns); `None` when empty.
    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64)
    }

    /// The `q` quantile (0..=1) in ns, interpolated linearly inside its
    /// bucket (the last bucket, open above, gives its lower bound); `None`
    /// when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 || !q.is_finite() {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let mut below = 0u64;
        for (b, n) in self.buckets.iter().enumerate() {
            if *n == 0 {
                continue;
            }
            if (below + n) as f64 >= rank {
                let lo = latency_bucket_lower_ns(b) as f64;
                if b + 1 >= LATENCY_BUCKETS {
                    return Some(lo);
                }
                let hi = latency_bucket_lower_ns(b + 1) as f64;
                let into = ((rank - below as f64) / *n as f64).clamp(0.0, 1.0);
                return Some(lo + (hi - lo) * into);
            }
            below += n;
        }
        Some(latency_bucket_lower_ns(LATENCY_BUCKETS - 1) as f64)
    }

    /// Latencies at or below `ns` (exact when `ns + 1` is a bucket
    /// boundary, as every power of two of ns from 128 ns up is): the
    /// cumulative count of a Prometheus bucket `le`.
    pub fn count_at_or_below(&self, ns: u64) -> u64 {
        let last = latency_bucket(ns.saturating_add(1));
        let full = if latency_bucket_lower_ns(last) == ns.saturating_add(1) {
            last
        } else {
            last + 1
        };
        self.buckets[..full.min(LATENCY_BUCKETS)].iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_known_distribution_are_within_a_bucket() {
        let mut h = Histogram::new();
        // 1..=10,000 µs, once each.
        for us in 1..=10_000u64 {
            h.record(us * 1000);
        }
        assert_eq!(h.count(), 10_000);
        for (q, want) in [
            (0.5, 5_000_000.0),
            (0.99, 9_900_000.0),
            (0.999, 9_990_000.0),
        ] {
            let got = h.quantile(q).unwrap();
            assert!((got / want - 1.0).abs() < 0.0625, "q {q}: {got} vs {want}");
        }
        assert_eq!(h.mean_ns(), Some(5_000_500.0));
        assert_eq!(Histogram::new().quantile(0.5), None);
    }

    #[test]
    fn merge_adds_and_cumulative_counts_follow_power_of_two_boundaries() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        a.record(1000);
        b.record(3000);
        b.record(100);
        a.merge(&b);
        assert_eq!((a.count(), a.sum_ns()), (3, 4100));
        assert_eq!(a.count_at_or_below(127), 1);
        assert_eq!(a.count_at_or_below(1023), 2);
        assert_eq!(a.count_at_or_below(2047), 2);
        assert_eq!(a.count_at_or_below(4095), 3);
        assert_eq!(a.count_at_or_below(u64::MAX), 3);
        assert!(bucket_mid_ns(8) > 128 && bucket_mid_ns(8) < 144);
        assert!(bucket_mid_ns(LATENCY_BUCKETS - 1) > latency_bucket_lower_ns(255));
    }
}
