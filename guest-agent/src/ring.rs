//! The per-vCPU event rings (single producer: code on the ring's vCPU).
//!
//! [`Mode::Rings`](crate::Mode::Rings): every switch is an event, and a full
//! ring is waited for ([`Agent::push`], never overwriting an unread slot,
//! counting back-offs). [`Mode::Counters`](crate::Mode::Counters): the ring
//! is the host's optional trace, and a full ring drops the event and counts
//! it in the header's `trace_dropped` ([`Agent::try_push`]): monitoring never
//! throttles the work it monitors.

use core::ptr;
use core::sync::atomic::{AtomicU64, Ordering};

use hypercall_abi::stage::{Layout, RingHeader, StageEvent};

use crate::{Agent, Platform, Report, Trace};

impl<P: Platform> Agent<P> {
    fn ring(&self, layout: &Layout, vcpu: u32) -> *mut RingHeader {
        // SAFETY: vcpu < num_vcpus is checked by callers; the ring lies in the area.
        unsafe { self.base.add(layout.ring_offset(vcpu) as usize) as *mut RingHeader }
    }

    /// `vcpu`'s ring header words: (head, tail, full_backoffs, trace_dropped).
    fn ring_words(
        &self,
        layout: &Layout,
        vcpu: u32,
    ) -> (
        &'static AtomicU64,
        &'static AtomicU64,
        &'static AtomicU64,
        &'static AtomicU64,
    ) {
        let ring = self.ring(layout, vcpu);
        // SAFETY: four fields of this ring's header, inside the area.
        unsafe {
            (
                Self::word(ptr::addr_of_mut!((*ring).head)),
                Self::word(ptr::addr_of_mut!((*ring).tail)),
                Self::word(ptr::addr_of_mut!((*ring).full_backoffs)),
                Self::word(ptr::addr_of_mut!((*ring).trace_dropped)),
            )
        }
    }

    /// Writes `event` into slot `head` with `seq = head` (unless the raw
    /// form keeps the given one) and publishes `head + 1` (release).
    ///
    /// # Safety
    /// `vcpu < layout.num_vcpus`, the only producer of the ring, and slot
    /// `head` is free (`head − tail < entries`).
    unsafe fn write_slot(
        &self,
        layout: &Layout,
        vcpu: u32,
        head_word: &AtomicU64,
        head: u64,
        mut event: StageEvent,
        fix_seq: bool,
    ) {
        if fix_seq {
            event.seq = head;
        }
        // SAFETY: the slot lies in this ring and is free (caller).
        unsafe {
            ptr::write_volatile(
                self.base.add(layout.slot_offset(vcpu, head) as usize) as *mut StageEvent,
                event,
            )
        };
        head_word.store(head.wrapping_add(1), Ordering::Release);
    }

    /// [`Mode::Rings`](crate::Mode::Rings): writes the event `{tsc, stage,
    /// thread}` into `vcpu`'s ring, waiting while it is full.
    ///
    /// # Safety
    /// `vcpu < layout.num_vcpus`, and only one context writes this ring.
    pub(crate) unsafe fn push(
        &self,
        layout: &Layout,
        vcpu: u32,
        tsc: u64,
        stage: u32,
        thread: u32,
    ) -> Report {
        let event = StageEvent {
            seq: 0,
            tsc,
            stage,
            thread,
            reserved: 0,
        };
        // SAFETY: the caller's contract.
        unsafe { self.push_event(layout, vcpu, event, true) }
    }

    /// Writes `event` into `vcpu`'s ring, waiting while it is full (counted
    /// in `full_backoffs`, back-off doubling from 64 to 65,536 PAUSEs). With
    /// `fix_seq` the sequence number is set to the slot's index (the valid
    /// form); without it the event is written as given (the `test-hooks`
    /// feature's `write_raw_event` forges bad entries this way).
    ///
    /// # Safety
    /// `vcpu < layout.num_vcpus`, and only one context writes this ring.
    unsafe fn push_event(
        &self,
        layout: &Layout,
        vcpu: u32,
        event: StageEvent,
        fix_seq: bool,
    ) -> Report {
        let (head_word, tail_word, backoff_word, _) = self.ring_words(layout, vcpu);
        let head = head_word.load(Ordering::Relaxed);
        let mut backoffs = 0u32;
        let mut spin = 64u32;
        while head.wrapping_sub(tail_word.load(Ordering::Acquire)) >= u64::from(layout.ring_entries)
        {
            // Full: never overwrite an unread entry; count and back off.
            backoffs += 1;
            backoff_word.fetch_add(1, Ordering::Relaxed);
            for _ in 0..spin {
                core::hint::spin_loop();
            }
            spin = (spin * 2).min(1 << 16);
        }
        // SAFETY: the slot is free (checked above); caller's contract.
        unsafe { self.write_slot(layout, vcpu, head_word, head, event, fix_seq) };
        Report::Written { backoffs }
    }

    /// [`Mode::Counters`](crate::Mode::Counters): writes the trace event
    /// `{tsc, stage, thread}` into `vcpu`'s ring if it has room, else drops
    /// it and counts the drop in the header's `trace_dropped`. Never waits.
    /// `tsc` is the transition's TSC when it read one; otherwise the TSC is
    /// read only for an event that fits (a dropped one costs no TSC read).
    ///
    /// # Safety
    /// `vcpu < layout.num_vcpus`, and only one context writes this ring.
    pub(crate) unsafe fn try_push(
        &self,
        layout: &Layout,
        vcpu: u32,
        tsc: Option<u64>,
        stage: u32,
        thread: u32,
    ) -> Trace {
        let (head_word, tail_word, _, dropped_word) = self.ring_words(layout, vcpu);
        let head = head_word.load(Ordering::Relaxed);
        if head.wrapping_sub(tail_word.load(Ordering::Acquire)) >= u64::from(layout.ring_entries) {
            // Single writer: a plain increment.
            dropped_word.store(
                dropped_word.load(Ordering::Relaxed).wrapping_add(1),
                Ordering::Relaxed,
            );
            return Trace::Dropped;
        }
        let event = StageEvent {
            seq: head,
            tsc: tsc.unwrap_or_else(|| self.platform.tsc()),
            stage,
            thread,
            reserved: 0,
        };
        // SAFETY: the slot is free (checked above); caller's contract.
        unsafe { self.write_slot(layout, vcpu, head_word, head, event, true) };
        Trace::Written
    }

    /// Test hook: writes `event` into `vcpu`'s ring as given, or with its
    /// sequence number fixed up when `fix_seq`, to check the host's
    /// validation (waiting while the ring is full, in either [`Mode`]).
    /// Returns `Inactive` when not registered or `vcpu` is out of range.
    /// Only with the `test-hooks` feature.
    ///
    /// [`Mode`]: crate::Mode
    #[cfg(feature = "test-hooks")]
    pub fn write_raw_event(&self, vcpu: u32, event: StageEvent, fix_seq: bool) -> Report {
        match self.layout {
            // SAFETY: vcpu checked; single producer per ring (caller's contract).
            Some(layout) if vcpu < layout.num_vcpus => unsafe {
                self.push_event(&layout, vcpu, event, fix_seq)
            },
            _ => Report::Inactive,
        }
    }

    /// True when the host has consumed everything in `vcpu`'s ring
    /// (`tail == head`); also true when inactive.
    pub fn ring_drained(&self, vcpu: u32) -> bool {
        match self.layout.filter(|l| vcpu < l.num_vcpus) {
            Some(layout) => {
                let (head, tail, _, _) = self.ring_words(&layout, vcpu);
                head.load(Ordering::Relaxed) == tail.load(Ordering::Acquire)
            }
            None => true,
        }
    }

    /// Test hook: moves `vcpu`'s published head forward by `delta` without
    /// writing slots, as a corrupt guest would. Only with the `test-hooks`
    /// feature.
    #[cfg(feature = "test-hooks")]
    pub fn corrupt_head(&self, vcpu: u32, delta: u64) {
        if let Some(layout) = self.layout.filter(|l| vcpu < l.num_vcpus) {
            self.ring_words(&layout, vcpu)
                .0
                .fetch_add(delta, Ordering::Release);
        }
    }

    /// Times `vcpu`'s ring was found full and waited for
    /// ([`Mode::Rings`](crate::Mode::Rings); from the ring header).
    pub fn ring_full_backoffs(&self, vcpu: u32) -> u64 {
        match self.layout.filter(|l| vcpu < l.num_vcpus) {
            Some(layout) => self.ring_words(&layout, vcpu).2.load(Ordering::Relaxed),
            None => 0,
        }
    }

    /// Trace events of `vcpu` dropped on a full ring
    /// ([`Mode::Counters`](crate::Mode::Counters); from the ring header).
    pub fn trace_dropped(&self, vcpu: u32) -> u64 {
        match self.layout.filter(|l| vcpu < l.num_vcpus) {
            Some(layout) => self.ring_words(&layout, vcpu).3.load(Ordering::Relaxed),
            None => 0,
        }
    }
}
