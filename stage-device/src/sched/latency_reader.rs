//! From the guest's per-vCPU request-latency histograms (ABI minor 4) to
//! the requests timed between two reads, merged into one [`Histogram`],
//! under the untrusted-guest rules of docs/stage-protocol.md §8.
//!
//! The device copies each vCPU's block so that it holds every recorded
//! request whole and at most one in flight (its bucket, not yet its
//! `samples`), and copies the latency blocks before the counters, so that
//! every request a copy holds is among the completed requests
//! (`counts[none]`) of the counters read after it. Rules, per vCPU and
//! window, each applied and counted in the clamps it returns (a guest that
//! breaks them only loses its own latency figures):
//! * `samples`, `sum_ns` or a bucket below its last value: the window
//!   takes nothing from the vCPU, and the new values become the baseline;
//! * the buckets' growth differs from `samples`' by more than the one
//!   request in flight, or the vCPU's timed requests so far would exceed
//!   its completed requests so far (+1): likewise. So far, not in the
//!   window: a read's counters are copied after its latency blocks, so
//!   requests that completed in between are in this window's completions
//!   and the next window's timed requests (the `stage-sched` thread,
//!   preempted between the two copies on a busy host, saw 2 of them). The
//!   reader keeps each vCPU's credit: completed requests less timed ones
//!   (-1 at the least: the +1 is lent once, not once per window);
//! * a sum outside what the buckets allow (each request between its
//!   bucket's bounds): the window's sum is the buckets' midpoints instead.
//!
//! With one request in flight the window's sum is the midpoints' too (not
//! a clamp). Every operation is O(vCPUs × 256 buckets), never panics.

use host_sched::histogram::{bucket_mid_ns, Histogram};
use hypercall_abi::stage::{latency_bucket_lower_ns, VcpuLatency, LATENCY_BUCKETS};

/// Reads of one registration's latency blocks: per-vCPU baselines.
#[derive(Debug)]
pub struct LatencyReader {
    last: Vec<VcpuLatency>,
    /// Per vCPU, requests completed less requests timed since REGISTER:
    /// how many timed requests a window may add beyond its completions;
    /// -1 when one request was timed before its completion was read (the
    /// one in flight), which the next window's completions pay back.
    credit: Vec<i64>,
}

impl LatencyReader {
    /// Reads for `num_vcpus` vCPUs whose blocks start at zero (REGISTER).
    pub fn new(num_vcpus: u32) -> Self {
        Self {
            last: vec![VcpuLatency::default(); num_vcpus as usize],
            credit: vec![0; num_vcpus as usize],
        }
    }

    /// The requests timed since the previous read: `blocks` (one per vCPU;
    /// those past the vCPU count are ignored) against the baselines, with
    /// `requests[v]` the completed requests of vCPU `v` in the same window
    /// (missing: 0). Returns the window's histogram and, per vCPU, the
    /// impossible values clamped.
    pub fn update(&mut self, blocks: &[VcpuLatency], requests: &[u64]) -> (Histogram, Vec<u64>) {
        let mut window = Histogram::new();
        let mut clamps = vec![0u64; self.last.len()];
        for (v, ((block, base), credit)) in blocks
            .iter()
            .zip(self.last.iter_mut())
            .zip(self.credit.iter_mut())
            .enumerate()
        {
            let completed = requests.get(v).copied().unwrap_or(0);
            // At least -1 + 0: `limit` is never negative.
            let avail = i128::from(*credit) + i128::from(completed);
            let limit = u64::try_from(avail + 1).unwrap_or(u64::MAX);
            let (timed, clamped) = delta(base, block, limit, &mut window);
            clamps[v] = clamped;
            // timed ≤ limit: at least -1.
            *credit = i64::try_from(avail - i128::from(timed)).unwrap_or(i64::MAX);
            *base = *block;
        }
        (window, clamps)
    }
}

/// Adds one vCPU's window (`new` against `base`; at most `limit` timed
/// requests: the completions not timed so far, plus the one in flight) to
/// `window`; returns the requests it took and the clamps (0 or 1).
fn delta(base: &VcpuLatency, new: &VcpuLatency, limit: u64, window: &mut Histogram) -> (u64, u64) {
    let (Some(samples), Some(sum)) = (
        new.samples.checked_sub(base.samples),
        new.sum_ns.checked_sub(base.sum_ns),
    ) else {
        return (0, 1);
    };
    let mut growth = [0u64; LATENCY_BUCKETS];
    let mut timed = 0u64;
    for (g, (n, b)) in growth.iter_mut().zip(new.buckets.iter().zip(&base.buckets)) {
        let Some(d) = n.checked_sub(*b) else {
            return (0, 1);
        };
        *g = d;
        timed = timed.saturating_add(d);
    }
    if timed.abs_diff(samples) > 1 || timed > limit {
        return (0, 1);
    }
    // What the buckets allow the sum to be (u128: nothing a guest writes
    // overflows it), and their midpoints.
    let (mut lo, mut hi, mut mid) = (0u128, 0u128, 0u128);
    let mut open_above = false;
    for (b, count) in growth.iter().enumerate().filter(|(_, n)| **n > 0) {
        let n = u128::from(*count);
        lo += n * u128::from(latency_bucket_lower_ns(b));
        mid += n * u128::from(bucket_mid_ns(b));
        if b + 1 < LATENCY_BUCKETS {
            hi += n * u128::from(latency_bucket_lower_ns(b + 1));
        } else {
            open_above = true;
        }
        window.add_bucket(b, *count);
    }
    let sum = u128::from(sum);
    let consistent = timed == samples;
    let in_bounds = sum >= lo && (open_above || sum <= hi);
    if consistent && in_bounds {
        window.add_sum(sum as u64);
        return (timed, 0);
    }
    window.add_sum(mid.min(u128::from(u64::MAX)) as u64);
    (timed, u64::from(consistent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn block(latencies: &[u64]) -> VcpuLatency {
        let mut b = VcpuLatency::default();
        for ns in latencies {
            b.record(*ns);
        }
        b
    }

    #[test]
    fn an_honest_guest_is_read_exactly_and_merged_over_vcpus() {
        let mut r = LatencyReader::new(2);
        let (h, clamps) = r.update(&[block(&[1000, 2000]), block(&[50_000])], &[2, 1]);
        assert_eq!((h.count(), h.sum_ns(), clamps), (3, 53_000, vec![0, 0]));
        // The next window holds only what was recorded since.
        let (h, _) = r.update(&[block(&[1000, 2000, 3000]), block(&[50_000])], &[1, 0]);
        assert_eq!((h.count(), h.sum_ns()), (1, 3000));
    }

    #[test]
    fn one_request_in_flight_is_not_a_clamp() {
        let mut r = LatencyReader::new(1);
        // Its bucket is stored, its sum and samples not yet.
        let mut b = block(&[1000]);
        b.buckets[hypercall_abi::stage::latency_bucket(7000)] += 1;
        let (h, clamps) = r.update(&[b], &[2]);
        assert_eq!((h.count(), clamps[0]), (2, 0));
        // The next read completes it: the sums add up over the two.
        let (h2, clamps) = r.update(&[block(&[1000, 7000])], &[0]);
        assert_eq!((h2.count(), clamps[0]), (0, 0));
    }

    /// The one request in flight is lent once: a guest that times one
    /// more request than it completes in every window is clamped from the
    /// second window on, until its completions pay the first back.
    #[test]
    fn the_request_in_flight_is_not_granted_every_window() {
        let mut r = LatencyReader::new(1);
        let (h, clamps) = r.update(&[block(&[1000])], &[0]);
        assert_eq!((h.count(), clamps[0]), (1, 0));
        let (h, clamps) = r.update(&[block(&[1000; 2])], &[0]);
        assert_eq!((h.count(), clamps[0]), (0, 1));
        // Two completions: one pays the loan back, one is timed.
        let (h, clamps) = r.update(&[block(&[1000; 3])], &[2]);
        assert_eq!((h.count(), clamps[0]), (1, 0));
    }

    #[test]
    fn completions_copied_after_the_latency_blocks_carry_over() {
        let mut r = LatencyReader::new(1);
        // The counters, copied after the latency block, hold 2 more
        // completions than it has timed requests (both timed: stride 1).
        let (h, clamps) = r.update(&[block(&[1000; 3])], &[5]);
        assert_eq!((h.count(), clamps[0]), (3, 0));
        // The next read has their latencies and no new completion.
        let (h, clamps) = r.update(&[block(&[1000; 5])], &[0]);
        assert_eq!((h.count(), clamps[0]), (2, 0));
        // But no more than were completed, so far (+1 in flight).
        let (h, clamps) = r.update(&[block(&[1000; 8])], &[1]);
        assert_eq!((h.count(), clamps[0]), (0, 1));
    }

    #[test]
    fn impossible_values_are_clamped_not_trusted() {
        let mut r = LatencyReader::new(1);
        r.update(&[block(&[1000, 1000])], &[2]);
        // Going backwards.
        let (h, clamps) = r.update(&[block(&[1000])], &[5]);
        assert_eq!((h.count(), clamps[0]), (0, 1));
        // More timed requests than completed ones.
        let mut r = LatencyReader::new(1);
        let (h, clamps) = r.update(&[block(&[1000; 10])], &[3]);
        assert_eq!((h.count(), clamps[0]), (0, 1));
        // `samples` far from the buckets.
        let mut b = block(&[1000]);
        b.samples = 1 << 40;
        let mut r = LatencyReader::new(1);
        assert_eq!(r.update(&[b], &[1]).1[0], 1);
        // A sum the buckets cannot hold: midpoints instead, counted.
        let mut b = block(&[1000, 1000]);
        b.sum_ns = 1 << 50;
        let mut r = LatencyReader::new(1);
        let (h, clamps) = r.update(&[b], &[2]);
        assert_eq!(clamps[0], 1);
        assert_eq!(h.count(), 2);
        assert!(h.sum_ns() > 1900 && h.sum_ns() < 2100, "{}", h.sum_ns());
    }

    proptest! {
        /// Any sequence of blocks a guest may write: never a panic, never
        /// more timed requests than completed ones so far (+1 per window),
        /// and an honest sequence is read without a clamp.
        #[test]
        fn reads_are_total_and_bounded(
            writes in proptest::collection::vec(
                (any::<u64>(), any::<u64>(), proptest::collection::vec((0usize..256, any::<u64>()), 0..8), 0u64..50),
                1..12,
            ),
            honest in proptest::collection::vec(proptest::collection::vec(0u64..1 << 40, 0..20), 1..12),
        ) {
            let mut r = LatencyReader::new(1);
            let (mut timed, mut completed, mut windows) = (0u64, 0u64, 0u64);
            for (samples, sum, buckets, done) in writes {
                let mut b = VcpuLatency { samples, sum_ns: sum, ..Default::default() };
                for (i, n) in buckets {
                    b.buckets[i] = n;
                }
                let (h, _) = r.update(&[b], &[done]);
                timed += h.count();
                completed += done;
                windows += 1;
                prop_assert!(timed <= completed + windows, "{} timed, {} completed", timed, completed);
            }
            let mut r = LatencyReader::new(1);
            let mut b = VcpuLatency::default();
            let mut merged = Histogram::new();
            for window in honest {
                for ns in &window {
                    b.record(*ns);
                }
                let (h, clamps) = r.update(&[b], &[window.len() as u64]);
                prop_assert_eq!(clamps[0], 0);
                prop_assert_eq!(h.count(), window.len() as u64);
                prop_assert_eq!(h.sum_ns(), window.iter().sum::<u64>());
                merged.merge(&h);
            }
            prop_assert_eq!(merged.count(), b.samples);
            prop_assert_eq!(merged.sum_ns(), b.sum_ns);
        }
    }
}
