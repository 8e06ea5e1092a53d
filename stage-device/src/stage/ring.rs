//! Draining one ring: every entry in `[tail, head)` is validated (sequence
//! number = slot index, stage id in range) and either returned as an
//! [`Event`] or counted as a drop; then the host's `tail` is published.
//! What a drain pass of every ring found is a [`Drained`]; whether the
//! rings need one, a [`Drain`].
//!
//! `head` is guest-written and untrusted: a head behind the tail, more than
//! a ring ahead, or one that would run the free-running 64-bit index past
//! `u64::MAX` resynchronises the ring to `head` and is counted once in
//! `bad_index`. All index arithmetic is checked or wrapping; nothing a guest
//! writes can panic this code.

use std::sync::atomic::Ordering;

use hypercall_abi::stage::{Layout, RingHeader, StageEvent, STAGE_NONE};
use stagevm_report::VcpuRingStats;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::abi::Obj;

/// Most entries one drain takes from one ring (issue 14 D6: 64 rings of
/// 65,536 pre-filled entries took 10.6 s of one drain and 248 MB): 64 vCPUs
/// × 4,096 entries bound a pass to ~262k events (~6 MiB of events).
pub const MAX_DRAIN_PER_RING: u64 = 4096;

/// Default drain period (µs): often enough that a 256-entry ring does not
/// fill at the test guest's ~64k events/s per vCPU (docs/stage-protocol.md).
pub const DEFAULT_DRAIN_PERIOD_US: u64 = 1000;

/// What one drain pass found.
#[derive(Debug, Default)]
pub struct Drained {
    /// A rings guest's valid events (its load signal) of every ring,
    /// ordered by guest TSC (stable: events of one ring keep their ring
    /// order on equal timestamps).
    pub events: Vec<Event>,
    /// A counters guest's valid trace events, in ring order per vCPU (not
    /// a load signal: counted and logged).
    pub trace: Vec<Event>,
    /// vCPUs whose ring was resynchronised (events skipped): the controller
    /// forgets what the vCPU was doing.
    pub resynced: Vec<u32>,
    /// The trace asked of the guest when drained (`trace_every`: 1 = every
    /// event, so `trace` is complete; N > 1 sampled; 0 off).
    pub trace_every: u64,
}

/// Whether and why the rings need draining ([`StageDevice::drain_need`](super::StageDevice::drain_need)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drain {
    /// Nothing to drain: no area, or a counters guest without a trace.
    No,
    /// A rings guest: every event is its load signal, and its agent waits
    /// on a full ring — drain every drain period.
    Events,
    /// A counters guest's lossy event trace.
    Trace,
}

/// Offset of `tail` in a [`RingHeader`].
const TAIL_OFFSET: u64 = core::mem::offset_of!(RingHeader, tail) as u64;

/// A validated stage event, as the controller sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// vCPU whose ring held the event.
    pub vcpu: u32,
    /// Guest thread id ([`hypercall_abi::stage::IDLE_THREAD`] for an idle
    /// marker).
    pub thread: u32,
    /// Stage entered (`< num_stages`), or [`STAGE_NONE`] for a stage exit or
    /// an idle marker.
    pub stage: u32,
    /// Guest TSC of the switch (ticks).
    pub tsc: u64,
}

fn log_drop(count: u64, vcpu: u32, what: &str, detail: std::fmt::Arguments) {
    crate::guest_warn!(vcpu, count, "stage ring: dropped {what}: {detail}");
}

/// Where one ring lives and where the host stopped reading it.
pub(super) struct Ring<'a, M: GuestMemoryBackend> {
    /// Guest memory.
    pub memory: &'a M,
    /// GPA of the registered area.
    pub area_gpa: u64,
    /// The area's validated layout.
    pub layout: Layout,
    /// vCPU index of the ring.
    pub vcpu: u32,
}

impl<M: GuestMemoryBackend> Ring<'_, M> {
    fn publish_tail(&self, tail: u64) {
        let ring = self.area_gpa + self.layout.ring_offset(self.vcpu);
        let _ = self
            .memory
            .store(tail, GuestAddress(ring + TAIL_OFFSET), Ordering::Release);
    }

    /// Copies the `n` slots from free-running index `from` into `buf`
    /// (cleared first) with at most two reads (the ring may wrap). A slot
    /// that cannot be read (cannot happen: the area was validated) reads
    /// as zeros, which fails the sequence check.
    fn read_slots(&self, from: u64, n: u64, buf: &mut Vec<Obj<StageEvent>>) {
        buf.clear();
        buf.resize(n as usize, Obj::default());
        let entries = u64::from(self.layout.ring_entries);
        let first = n.min(entries - (from & (entries - 1)));
        let (head, tail) = buf.split_at_mut(first as usize);
        for (chunk, index) in [(head, from), (tail, from.wrapping_add(first))] {
            if chunk.is_empty() {
                continue;
            }
            // SAFETY: `Obj<StageEvent>` is plain integers (ByteValued):
            // every byte pattern is a valid value, and the chunk is a live,
            // exclusively borrowed slice of them.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(
                    chunk.as_mut_ptr().cast::<u8>(),
                    std::mem::size_of_val(chunk),
                )
            };
            let at = self.area_gpa + self.layout.slot_offset(self.vcpu, index);
            if self.memory.read_slice(bytes, GuestAddress(at)).is_err() {
                bytes.fill(0);
            }
        }
    }

    /// Drains the ring from `tail`: appends valid events to `out`, counts
    /// the rest in `stats`, publishes the new tail and returns it with
    /// whether the ring was resynchronised (events were skipped). The slots
    /// are copied in bulk into `buf` (a reusable buffer).
    pub fn drain(
        &self,
        tail: u64,
        stats: &mut VcpuRingStats,
        out: &mut Vec<Event>,
        buf: &mut Vec<Obj<StageEvent>>,
    ) -> (u64, bool) {
        let (memory, layout, vcpu) = (self.memory, self.layout, self.vcpu);
        let ring = self.area_gpa + layout.ring_offset(vcpu);
        let Ok(head) = memory.load::<u64>(GuestAddress(ring), Ordering::Acquire) else {
            return (tail, false);
        };
        let header_word = |offset: usize| {
            memory.load::<u64>(GuestAddress(ring + offset as u64), Ordering::Relaxed)
        };
        if let Ok(backoffs) = header_word(core::mem::offset_of!(RingHeader, full_backoffs)) {
            stats.ring_full_backoffs = backoffs;
        }
        if let Ok(dropped) = header_word(core::mem::offset_of!(RingHeader, trace_dropped)) {
            stats.trace_dropped = dropped;
        }
        let pending = head.wrapping_sub(tail);
        if pending == 0 {
            return (tail, false);
        }
        let end = tail.checked_add(pending);
        if pending > u64::from(layout.ring_entries) || end.is_none() {
            stats.bad_index += 1;
            log_drop(
                stats.bad_index,
                vcpu,
                "ring index",
                format_args!("head {head} tail {tail} entries {}", layout.ring_entries),
            );
            self.publish_tail(head);
            return (head, true);
        }
        // Bounded work per drain: a guest that fills every ring at once is
        // drained over several passes (the rest stays for the next one).
        let take = pending.min(MAX_DRAIN_PER_RING);
        self.read_slots(tail, take, buf);
        for (i, Obj(ev)) in (0..take).zip(buf.iter()) {
            let index = tail.wrapping_add(i);
            if ev.seq != index {
                stats.dropped_bad_seq += 1;
                log_drop(
                    stats.dropped_bad_seq,
                    vcpu,
                    "sequence",
                    format_args!("slot {index} has seq {}", ev.seq),
                );
                continue;
            }
            if ev.stage != STAGE_NONE && ev.stage >= layout.num_stages {
                stats.dropped_bad_stage += 1;
                log_drop(
                    stats.dropped_bad_stage,
                    vcpu,
                    "stage id",
                    format_args!("stage {} of {}", ev.stage, layout.num_stages),
                );
                continue;
            }
            stats.events += 1;
            if ev.stage == STAGE_NONE {
                if ev.thread == hypercall_abi::stage::IDLE_THREAD {
                    stats.idles += 1;
                } else {
                    stats.exits += 1;
                }
            }
            out.push(Event {
                vcpu,
                thread: ev.thread,
                stage: ev.stage,
                tsc: ev.tsc,
            });
        }
        let new_tail = tail.wrapping_add(take);
        self.publish_tail(new_tail);
        (new_tail, false)
    }
}
