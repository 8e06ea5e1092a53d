//! Minor 4: per-vCPU request-latency histograms.
//!
//! A request runs from its start to its `stage_exit`. The start is what the
//! guest says it is — `stage_request_begin()`, with the TSC now or a TSC
//! the caller passes (an open-loop client passes the request's arrival) —
//! or, for a guest that never says, its first stage entry after the
//! previous `stage_exit`. The agents time one request in N, paced as the
//! timed visits are to about one per vCPU every
//! [`super::TIMED_INTERVAL_NS`]: N is that interval over the vCPU's mean
//! time per request (a moving average, measured at each timed request's
//! start), at least 1 and at most [`super::TIMED_STRIDE_MAX`], plus up to a
//! quarter of it (at most 3)
//! from the TSC's low bits; a guest without the TSC rate times none. At a
//! timed request's start they note the start TSC, and at its `stage_exit`
//! they add its latency, in ns, to the [`VcpuLatency`] block of the vCPU
//! it ends on — plain stores by that vCPU alone, never a wait or an exit.
//! The host reads the blocks once per policy period, takes bucket deltas
//! and merges the vCPUs' into the period's histogram
//! (docs/stage-protocol.md §5b).
//!
//! **Buckets.** Log-linear, as HdrHistogram's (Tene): the latency in
//! units of 16 ns, `u = ns >> 4`; below 8 units (128 ns) one bucket per
//! unit; above, each power of two is split into 8 equal sub-buckets,
//! `index = 8·(e − 2) + ((u >> (e − 3)) & 7)` with `e = ⌊log₂ u⌋`.
//! [`LATENCY_BUCKETS`] = 256 buckets cover 0 to 2³⁸ ns (275 s); longer
//! latencies go to the last bucket. Error bound: a bucket at or above
//! 128 ns is at most 1/8 of its lower bound wide, so its midpoint is within
//! 6.25 % of every latency it holds (below 128 ns: within 8 ns). Every
//! power of two of ns from 128 ns up is a bucket boundary, so the
//! Prometheus buckets (`le` = 2ᵏ ns) are exact sums of these.

/// Buckets per histogram.
pub const LATENCY_BUCKETS: usize = 256;
/// Sub-buckets per power of two: 2^this.
pub const LATENCY_SUB_BITS: u32 = 3;
/// The histogram's unit: 2^this ns (16 ns).
pub const LATENCY_UNIT_SHIFT: u32 = 4;
/// Alignment of the first latency block (bytes), as the counter blocks'.
pub const LATENCY_ALIGN: u64 = 128;

const SUB: u64 = 1 << LATENCY_SUB_BITS;

/// The bucket of a latency of `ns` nanoseconds (0..[`LATENCY_BUCKETS`]).
pub const fn latency_bucket(ns: u64) -> usize {
    let u = ns >> LATENCY_UNIT_SHIFT;
    if u < SUB {
        return u as usize;
    }
    let e = 63 - u.leading_zeros();
    let index = (e as u64 - (LATENCY_SUB_BITS as u64 - 1)) * SUB
        + ((u >> (e - LATENCY_SUB_BITS)) & (SUB - 1));
    if index >= LATENCY_BUCKETS as u64 {
        LATENCY_BUCKETS - 1
    } else {
        index as usize
    }
}

/// The lowest latency (ns) bucket `index` holds; bucket `i` holds
/// `[latency_bucket_lower_ns(i), latency_bucket_lower_ns(i + 1))`, the last
/// one everything from its lower bound up. Indices past the last give
/// `u64::MAX`.
pub const fn latency_bucket_lower_ns(index: usize) -> u64 {
    if index >= LATENCY_BUCKETS {
        return u64::MAX;
    }
    let i = index as u64;
    if i < SUB {
        return i << LATENCY_UNIT_SHIFT;
    }
    let e = i / SUB + (LATENCY_SUB_BITS as u64 - 1);
    let m = i % SUB;
    ((SUB + m) << (e - LATENCY_SUB_BITS as u64)) << LATENCY_UNIT_SHIFT
}

/// One vCPU's request-latency histogram (2,176 bytes, seventeen 128-byte
/// line pairs), written only by code running on that vCPU, read by the
/// host once per policy period. All counters are totals since REGISTER;
/// the host takes deltas.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VcpuLatency {
    /// Requests whose latency was recorded here (the sum of `buckets`;
    /// stored last, with release ordering).
    pub samples: u64,
    /// Sum of the recorded latencies (ns).
    pub sum_ns: u64,
    /// Guest-private: the agents' countdown to the next timed request
    /// (the host never reads it).
    pub countdown: u64,
    /// Guest-private: the agents' pacing of timed requests (the Rust
    /// agent: the TSC of the last timed start, the stride since, the mean
    /// TSC ticks per request); the host never reads them.
    pub agent: [u64; 3],
    /// Reserved, 0 (pads the header to 128 bytes).
    pub reserved: [u64; 10],
    /// Per bucket ([`latency_bucket`]), requests whose latency fell in it.
    pub buckets: [u64; LATENCY_BUCKETS],
}

impl Default for VcpuLatency {
    fn default() -> Self {
        Self {
            samples: 0,
            sum_ns: 0,
            countdown: 0,
            agent: [0; 3],
            reserved: [0; 10],
            buckets: [0; LATENCY_BUCKETS],
        }
    }
}

impl VcpuLatency {
    /// Records one request of `ns` nanoseconds (what an agent does, in
    /// this order: the bucket, the sum, then `samples`).
    pub fn record(&mut self, ns: u64) {
        let b = &mut self.buckets[latency_bucket(ns)];
        *b = b.wrapping_add(1);
        self.sum_ns = self.sum_ns.wrapping_add(ns);
        self.samples = self.samples.wrapping_add(1);
    }
}

/// Offset of [`VcpuLatency::sum_ns`] in the block.
pub const LATENCY_SUM_OFFSET: u64 = core::mem::offset_of!(VcpuLatency, sum_ns) as u64;
/// Offset of [`VcpuLatency::countdown`] in the block.
pub const LATENCY_COUNTDOWN_OFFSET: u64 = core::mem::offset_of!(VcpuLatency, countdown) as u64;
/// Offset of [`VcpuLatency::agent`] in the block.
pub const LATENCY_AGENT_OFFSET: u64 = core::mem::offset_of!(VcpuLatency, agent) as u64;
/// Offset of [`VcpuLatency::buckets`] in the block.
pub const LATENCY_BUCKETS_OFFSET: u64 = core::mem::offset_of!(VcpuLatency, buckets) as u64;

const _: () = assert!(core::mem::size_of::<VcpuLatency>() == 2176);
const _: () = assert!(core::mem::size_of::<VcpuLatency>().is_multiple_of(LATENCY_ALIGN as usize));
const _: () = assert!(LATENCY_SUM_OFFSET == 8);
const _: () = assert!(LATENCY_COUNTDOWN_OFFSET == 16);
const _: () = assert!(LATENCY_AGENT_OFFSET == 24);
const _: () = assert!(LATENCY_BUCKETS_OFFSET == 128);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_monotonic() {
        assert_eq!(latency_bucket_lower_ns(0), 0);
        for i in 0..LATENCY_BUCKETS {
            let lo = latency_bucket_lower_ns(i);
            assert_eq!(latency_bucket(lo), i, "lower bound of {i}");
            if i + 1 < LATENCY_BUCKETS {
                let next = latency_bucket_lower_ns(i + 1);
                assert!(next > lo, "{i}");
                assert_eq!(latency_bucket(next - 1), i, "upper end of {i}");
                // The error bound: at most 1/8 wide from 128 ns up.
                if lo >= 128 {
                    assert!((next - lo) * 8 <= lo, "bucket {i}: {lo}..{next}");
                } else {
                    assert_eq!(next - lo, 16);
                }
            }
        }
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
        assert_eq!(latency_bucket_lower_ns(LATENCY_BUCKETS), u64::MAX);
        // 2^38 ns is past the last bucket's lower bound.
        assert!(latency_bucket_lower_ns(LATENCY_BUCKETS - 1) < 1 << 38);
        assert_eq!(latency_bucket((1 << 38) + 5), LATENCY_BUCKETS - 1);
    }

    #[test]
    fn powers_of_two_are_boundaries() {
        for k in 7..38 {
            let b = latency_bucket(1 << k);
            assert_eq!(latency_bucket_lower_ns(b), 1 << k, "2^{k} ns");
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(15), 0);
        assert_eq!(latency_bucket(16), 1);
        assert_eq!(latency_bucket(127), 7);
        assert_eq!(latency_bucket(128), 8);
        assert_eq!(latency_bucket(143), 8);
        assert_eq!(latency_bucket(144), 9);
        // 1 µs: u = 62, e = 5, index = 8·3 + ((62 >> 2) & 7) = 24 + 7.
        assert_eq!(latency_bucket(1000), 31);
        let mut l = VcpuLatency::default();
        l.record(1000);
        l.record(1000);
        assert_eq!((l.samples, l.sum_ns, l.buckets[31]), (2, 2000, 2));
    }
}
