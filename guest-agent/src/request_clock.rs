//! Requests with a start and an end (ABI minor 4): the per-thread
//! [`RequestClock`] and the per-vCPU latency histograms
//! ([`VcpuLatency`](hypercall_abi::stage::VcpuLatency)).
//!
//! A request starts at [`Agent::request_begin`] — the TSC now, or a TSC the
//! caller passes (an open-loop client passes the request's arrival) — or,
//! when the caller never calls it, at its first stage entry
//! ([`Agent::stage_enter_request`]); it ends at
//! [`Agent::stage_exit_request`]. One request in N is timed, paced as the
//! timed visits are to about one per vCPU every
//! `hypercall_abi::stage::TIMED_INTERVAL_NS` (N from the vCPU's mean time
//! per request, [`Agent::request_pace`]), or N the fixed stride of timed
//! visits when the agent was given one: a per-vCPU countdown, decremented
//! at each begin, picks it, and only a timed request reads the TSC (at its
//! begin and at its end). Its latency goes to the histogram of
//! the vCPU it ends on, which that vCPU alone writes: plain stores, no
//! wait, no exit. The clock is the caller's, one per thread, because a
//! request may begin on one vCPU and end on another.

use core::sync::atomic::{AtomicU64, Ordering};

use hypercall_abi::stage::{
    latency_bucket, VcpuLatency, LATENCY_AGENT_OFFSET, LATENCY_BUCKETS_OFFSET,
    LATENCY_COUNTDOWN_OFFSET, LATENCY_SUM_OFFSET, TIMED_STRIDE_MAX,
};

use crate::{Agent, Platform, Report};

/// The start of one thread's request, kept by the caller (one per thread).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestClock {
    /// The guest TSC the request started at when it is timed, else 0.
    start: u64,
    /// A request is open (begun, not yet ended).
    open: bool,
}

impl RequestClock {
    /// A clock with no request open.
    pub const fn new() -> Self {
        Self {
            start: 0,
            open: false,
        }
    }

    /// Whether a request is open.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The TSC the open request started at, when it is timed.
    pub fn timed_start(&self) -> Option<u64> {
        (self.open && self.start != 0).then_some(self.start)
    }

    /// The clock as one word, for a runtime that keeps it in an atomic:
    /// 0 no request open, `u64::MAX` open and untimed, else the timed start
    /// (kept inside 1..`u64::MAX`).
    pub fn to_raw(self) -> u64 {
        match (self.open, self.start) {
            (false, _) => 0,
            (true, 0) => u64::MAX,
            (true, s) => s.min(u64::MAX - 1),
        }
    }

    /// The clock [`Self::to_raw`] gave `raw`.
    pub fn from_raw(raw: u64) -> Self {
        match raw {
            0 => Self::new(),
            u64::MAX => Self {
                start: 0,
                open: true,
            },
            s => Self {
                start: s,
                open: true,
            },
        }
    }
}

impl<P: Platform> Agent<P> {
    /// Word at byte `offset` of `vcpu`'s latency block.
    ///
    /// # Safety
    /// `vcpu < self.latency_vcpus`, and `offset` an 8-aligned offset inside
    /// the block.
    #[inline]
    unsafe fn latency_word(&self, vcpu: u32, offset: u64) -> &'static AtomicU64 {
        const BLOCK: usize = core::mem::size_of::<VcpuLatency>();
        // SAFETY: the caller's contract puts the word inside the area.
        Self::word(unsafe {
            self.latency
                .add(vcpu as usize * BLOCK + offset as usize)
                .cast::<u64>()
        })
    }

    /// Whether requests are timed (registered, counters with latency
    /// blocks, a host of minor ≥ 4 and a known TSC rate).
    pub fn latency_active(&self) -> bool {
        self.latency_vcpus > 0
    }

    /// Starts a request on `vcpu` in `clock` (one per thread): at
    /// `start_tsc` when given (an open-loop client passes the request's
    /// arrival), else now. One request in N is timed (see the module
    /// docs); only a timed one reads the TSC (for its pacing, too). A
    /// request already open is started again.
    pub fn request_begin(&self, vcpu: u32, clock: &mut RequestClock, start_tsc: Option<u64>) {
        *clock = RequestClock {
            start: 0,
            open: true,
        };
        if vcpu >= self.latency_vcpus {
            return;
        }
        // SAFETY: vcpu < latency_vcpus; the block's guest-private word,
        // written by this vCPU alone (the agent's contract).
        let countdown = unsafe { self.latency_word(vcpu, LATENCY_COUNTDOWN_OFFSET) };
        let left = countdown.load(Ordering::Relaxed);
        if left != 0 {
            countdown.store(left - 1, Ordering::Relaxed);
            return;
        }
        let now = self.platform.tsc();
        let stride = if self.timed_every != 0 {
            self.timed_every
        } else {
            // SAFETY: as above, the block's pacing words.
            unsafe { self.request_pace(vcpu, now) }
        };
        countdown.store(stride - 1, Ordering::Relaxed);
        clock.start = start_tsc.unwrap_or(now).max(1);
    }

    /// The next stride of timed requests on `vcpu`, at a timed start at
    /// `now`: [`TIMED_INTERVAL_NS`](hypercall_abi::stage::TIMED_INTERVAL_NS)
    /// over the mean TSC ticks per request (a moving average of weight 1/4
    /// of the gaps between timed starts over the requests begun between
    /// them), in 1..=[`TIMED_STRIDE_MAX`], plus up to a quarter of it (at
    /// most 3) from the TSC's low bits so the stride never locks onto a
    /// period of the workload (none below 4: every request is timed when
    /// they are 16 µs apart or more). Unlike the
    /// timed visits' pace, the average spans whole requests, whose gaps are
    /// alike, not a visit and the short hop from one request's end to the
    /// next one's start. Kept in the block's guest-private words: (last
    /// timed start, stride since, mean ticks per request).
    ///
    /// # Safety
    /// `vcpu < self.latency_vcpus`, and only one context writes this block.
    unsafe fn request_pace(&self, vcpu: u32, now: u64) -> u64 {
        // SAFETY: the caller's contract; the block's three pacing words.
        let (last, stride, mean) = unsafe {
            (
                self.latency_word(vcpu, LATENCY_AGENT_OFFSET),
                self.latency_word(vcpu, LATENCY_AGENT_OFFSET + 8),
                self.latency_word(vcpu, LATENCY_AGENT_OFFSET + 16),
            )
        };
        let (since, n, avg) = (
            last.load(Ordering::Relaxed),
            stride.load(Ordering::Relaxed),
            mean.load(Ordering::Relaxed),
        );
        let avg = match now.checked_sub(since) {
            Some(elapsed) if since != 0 && n != 0 => {
                let per = elapsed / n;
                if avg == 0 {
                    per
                } else {
                    // avg + (per − avg) / 4, in integers.
                    (avg / 4).saturating_mul(3).saturating_add(per / 4)
                }
            }
            _ => avg,
        };
        let next = self
            .pace_ticks
            .checked_div(avg)
            .map_or(1, |n| n.clamp(1, TIMED_STRIDE_MAX));
        let next = next + ((now >> 6) & 3) % (next / 4 + 1);
        last.store(now, Ordering::Relaxed);
        stride.store(next, Ordering::Relaxed);
        mean.store(avg, Ordering::Relaxed);
        next
    }

    /// [`Agent::stage_enter`], starting a request in `clock` first when
    /// none is open (a guest that never calls [`Agent::request_begin`]: its
    /// requests start at their first stage entry).
    pub fn stage_enter_request(
        &self,
        vcpu: u32,
        stage: u32,
        thread: u32,
        clock: &mut RequestClock,
    ) -> Report {
        if !clock.open {
            self.request_begin(vcpu, clock, None);
        }
        self.stage_enter(vcpu, stage, thread)
    }

    /// [`Agent::stage_exit`], ending the request of `clock`: a timed one's
    /// latency (ns, from its start to now) goes to `vcpu`'s histogram.
    /// Returns the report and the latency recorded, if any.
    pub fn stage_exit_request(
        &self,
        vcpu: u32,
        thread: u32,
        clock: &mut RequestClock,
    ) -> (Report, Option<u64>) {
        let report = self.stage_exit(vcpu, thread);
        let start = clock.timed_start();
        *clock = RequestClock::new();
        let Some(start) = start.filter(|_| vcpu < self.latency_vcpus) else {
            return (report, None);
        };
        let ns = self.ticks_to_ns(self.platform.tsc().saturating_sub(start));
        // SAFETY: vcpu < latency_vcpus; this vCPU is the block's only
        // writer.
        unsafe { self.record_latency(vcpu, ns) };
        (report, Some(ns))
    }

    /// Guest TSC ticks as ns at the host's TSC rate (`ns_mult`: ns per tick
    /// × 2³²).
    pub(crate) fn ticks_to_ns(&self, ticks: u64) -> u64 {
        let ns = (u128::from(ticks) * u128::from(self.ns_mult)) >> 32;
        ns.min(u128::from(u64::MAX)) as u64
    }

    /// Adds one request of `ns` to `vcpu`'s histogram: its bucket, the sum,
    /// then `samples` with release ordering (a host that sees the sample
    /// sees its bucket).
    ///
    /// # Safety
    /// `vcpu < self.latency_vcpus`, and only one context writes this block.
    unsafe fn record_latency(&self, vcpu: u32, ns: u64) {
        let at = LATENCY_BUCKETS_OFFSET + 8 * latency_bucket(ns) as u64;
        // SAFETY: the caller's contract; a bucket of the block.
        Self::bump(unsafe { self.latency_word(vcpu, at) }, 1);
        // SAFETY: as above, the sum.
        Self::bump(unsafe { self.latency_word(vcpu, LATENCY_SUM_OFFSET) }, ns);
        // SAFETY: as above, `samples` (offset 0).
        let samples = unsafe { self.latency_word(vcpu, 0) };
        samples.store(
            samples.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Release,
        );
    }

    /// A copy of `vcpu`'s latency histogram (`None` unless requests are
    /// timed); consistent when read on `vcpu` itself.
    pub fn latency(&self, vcpu: u32) -> Option<VcpuLatency> {
        if vcpu >= self.latency_vcpus {
            return None;
        }
        // SAFETY: vcpu's block lies inside the area and is 8-aligned; a
        // volatile copy of plain integers.
        Some(unsafe {
            core::ptr::read_volatile((self.latency_word(vcpu, 0) as *const AtomicU64).cast())
        })
    }
}
