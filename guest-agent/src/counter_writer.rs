//! The per-vCPU stage counters ([`Mode::Counters`](crate::Mode::Counters),
//! ABI minor 2): a stage switch is a transition of the vCPU's
//! [`VcpuCounters`] (`hypercall_abi::stage::transition`), made with plain
//! loads and stores because the vCPU is the block's only writer (the
//! agent's contract), reading the TSC only for timed visits (paced to about
//! one per [`TIMED_INTERVAL_NS`](hypercall_abi::stage::TIMED_INTERVAL_NS)
//! per vCPU, or one transition in
//! [`TIMED_EVERY`](hypercall_abi::stage::TIMED_EVERY) without a TSC rate;
//! and idle). The host reads the blocks once per policy period.

use core::ptr;
use core::sync::atomic::{AtomicU64, Ordering};

use hypercall_abi::stage::{
    needs_tsc, state_private, state_timed, transition, untimed_state, VcpuCounters, CODE_IDLE,
    COUNTERS_AGENT_OFFSET, COUNTERS_COUNTDOWN_OFFSET, COUNTERS_COUNTS_OFFSET,
    COUNTERS_CYCLES_OFFSET, COUNTERS_MIGRATIONS_IN_OFFSET, COUNTERS_MIGRATIONS_OUT_OFFSET,
    COUNTERS_TIMED_OFFSET, MAX_STAGES, NUM_CODES, TIMED_EVERY, TIMED_STRIDE_MAX,
};

use crate::{Agent, Platform};

impl<P: Platform> Agent<P> {
    /// Word at byte `offset` of `vcpu`'s counter block.
    ///
    /// # Safety
    /// `vcpu < self.counted_vcpus`, and `offset` an 8-aligned offset inside
    /// the block.
    #[inline]
    pub(crate) unsafe fn counter(&self, vcpu: u32, offset: u64) -> &'static AtomicU64 {
        const BLOCK: usize = core::mem::size_of::<VcpuCounters>();
        // SAFETY: the caller's contract puts the word inside the area.
        Self::word(unsafe {
            self.counters
                .add(vcpu as usize * BLOCK + offset as usize)
                .cast::<u64>()
        })
    }

    /// Adds `by` to a counter this vCPU alone writes (no atomic RMW needed).
    #[inline]
    pub(crate) fn bump(word: &AtomicU64, by: u64) -> u64 {
        let n = word.load(Ordering::Relaxed).wrapping_add(by);
        word.store(n, Ordering::Relaxed);
        n
    }

    /// The transition of `vcpu`'s counters into state `code`: the length of
    /// a timed visit that ends, one more entry of `code`, then the new state
    /// word (release, so a host that sees it sees the counts before it).
    /// Reads the TSC only when the transition ends or starts a timed visit.
    /// Returns `code`'s new count (for trace sampling), the TSC if it was
    /// read, and whether the host asked for a trace (as last looked at).
    ///
    /// The countdown to the next timed visit and the trace flag live in the
    /// guest-private bits of an untimed state word (`(countdown << 1) |
    /// trace`), so the common transition — untimed to untimed — is one load
    /// and one store of the state plus the count; during a timed visit they
    /// wait in the block's `countdown` word. The trace flag is refreshed from
    /// the map at every timed start and end (about every 16 µs).
    ///
    /// # Safety
    /// `vcpu < self.counted_vcpus`, and only one context writes this block.
    #[inline]
    pub(crate) unsafe fn transition(&self, vcpu: u32, code: u32) -> (u64, Option<u64>, bool) {
        // SAFETY: the caller's contract; the offset is the state word's.
        let state_word = unsafe { self.counter(vcpu, 0) };
        let state = state_word.load(Ordering::Relaxed);
        let count_at = COUNTERS_COUNTS_OFFSET + 8 * u64::from(code.min(NUM_CODES as u32 - 1));
        if !state_timed(state) && code != CODE_IDLE {
            let private = state_private(state);
            if private >> 1 != 0 {
                // SAFETY: as above; the code is cut to NUM_CODES − 1.
                let n = Self::bump(unsafe { self.counter(vcpu, count_at) }, 1);
                state_word.store(untimed_state(private - 2, code), Ordering::Release);
                return (n, None, private & 1 != 0);
            }
        }
        // SAFETY: the caller's contract; the block's guest-private word.
        let countdown_word = unsafe { self.counter(vcpu, COUNTERS_COUNTDOWN_OFFSET) };
        let private = if state_timed(state) {
            countdown_word.load(Ordering::Relaxed)
        } else {
            state_private(state)
        };
        let countdown = private >> 1;
        let tsc = needs_tsc(state, countdown, code).then(|| self.platform.tsc());
        let every = match tsc {
            Some(now) if countdown == 0 && self.timed_every == 0 => {
                // SAFETY: the block's guest-private words (contract above).
                unsafe { self.pace(vcpu, now) }
            }
            _ => self.timed_every.max(1),
        };
        let t = transition(state, countdown, code, tsc.unwrap_or(0), every);
        if let Some((old, len)) = t.ended.filter(|(old, _)| (*old as usize) < NUM_CODES) {
            let at = 8 * u64::from(old);
            // SAFETY: as above; `old` < NUM_CODES indexes `cycles`.
            Self::bump(
                unsafe { self.counter(vcpu, COUNTERS_CYCLES_OFFSET + at) },
                len,
            );
            // SAFETY: as above, `timed`.
            Self::bump(unsafe { self.counter(vcpu, COUNTERS_TIMED_OFFSET + at) }, 1);
        }
        // SAFETY: as above; the code is cut to NUM_CODES − 1.
        let n = Self::bump(unsafe { self.counter(vcpu, count_at) }, 1);
        // Off the common path: look at the trace the host asks for.
        let trace = self.map_word(crate::map::MAP_TRACE_EVERY) != 0;
        let private = (t.countdown << 1) | u64::from(trace);
        if state_timed(t.state) {
            countdown_word.store(private, Ordering::Relaxed);
            state_word.store(t.state, Ordering::Release);
        } else {
            state_word.store(untimed_state(private, code), Ordering::Release);
        }
        (n, tsc, trace)
    }

    /// The next stride of paced timed visits, at a paced start at `now`:
    /// the transitions the vCPU makes in
    /// [`TIMED_INTERVAL_NS`](hypercall_abi::stage::TIMED_INTERVAL_NS) at the
    /// rate since the previous paced start, in 1..=[`TIMED_STRIDE_MAX`],
    /// plus 0–3 from the TSC's low bits so a stride never locks onto a
    /// workload's period (sampling positions stay random). Kept in the
    /// block's guest-private words: (last start, stride).
    ///
    /// # Safety
    /// As [`Self::transition`].
    #[cold]
    unsafe fn pace(&self, vcpu: u32, now: u64) -> u64 {
        // SAFETY: the caller's contract; the block's first `agent` word.
        let last = unsafe { self.counter(vcpu, COUNTERS_AGENT_OFFSET) };
        // SAFETY: as above, its second.
        let stride = unsafe { self.counter(vcpu, COUNTERS_AGENT_OFFSET + 8) };
        let (since, n) = (last.load(Ordering::Relaxed), stride.load(Ordering::Relaxed));
        let next = match now.checked_sub(since) {
            Some(elapsed) if since != 0 && n != 0 && elapsed != 0 => {
                let per_transition = (elapsed / n).max(1);
                (self.pace_ticks / per_transition).clamp(1, TIMED_STRIDE_MAX)
            }
            _ => TIMED_EVERY,
        };
        let next = (next + ((now >> 6) & 3)).min(TIMED_STRIDE_MAX);
        last.store(now, Ordering::Relaxed);
        stride.store(next, Ordering::Relaxed);
        next
    }

    /// The trace the host asks for, from the stage map's `trace_every`: 0
    /// none, 1 every event, n every n-th of each kind per vCPU (0 when
    /// inactive).
    pub fn trace_every(&self) -> u64 {
        if self.layout().is_none() {
            return 0;
        }
        self.map_word(crate::map::MAP_TRACE_EVERY)
    }

    /// The fixed stride of timed visits this agent uses, or 0 when it paces
    /// them by time (see
    /// [`AreaSpec::timed_every`](crate::AreaSpec::timed_every)).
    pub fn timed_every(&self) -> u64 {
        self.timed_every
    }

    /// Counts a thread migration on `vcpu`, where the thread arrived: it
    /// left stage `from` (a stage id, or anything ≥ 16 when it was between
    /// stages) on another vCPU and enters stage `to` here. Call it on
    /// `vcpu` itself (the block's only writer). No-op unless in
    /// [`Mode::Counters`](crate::Mode::Counters).
    pub fn count_migration(&self, vcpu: u32, from: u32, to: u32) {
        if vcpu >= self.counted_vcpus {
            return;
        }
        if (to as usize) < MAX_STAGES {
            let at = COUNTERS_MIGRATIONS_IN_OFFSET + 8 * u64::from(to);
            // SAFETY: vcpu < counted_vcpus, a field of the block.
            Self::bump(unsafe { self.counter(vcpu, at) }, 1);
        }
        if (from as usize) < MAX_STAGES {
            let at = COUNTERS_MIGRATIONS_OUT_OFFSET + 8 * u64::from(from);
            // SAFETY: as above.
            Self::bump(unsafe { self.counter(vcpu, at) }, 1);
        }
    }

    /// A copy of `vcpu`'s counters (`None` unless in
    /// [`Mode::Counters`](crate::Mode::Counters)); consistent when read on `vcpu` itself.
    pub fn counters(&self, vcpu: u32) -> Option<VcpuCounters> {
        if vcpu >= self.counted_vcpus {
            return None;
        }
        // SAFETY: vcpu's block lies inside the area (vcpu < counted_vcpus)
        // and is 8-aligned; a volatile copy of plain integers.
        Some(unsafe { ptr::read_volatile((self.counter(vcpu, 0) as *const AtomicU64).cast()) })
    }
}
