//! Draining one ring: every entry in `[tail, head)` is validated (sequence
//! number = slot index, stage id in range) and either returned as an
//! [`Event`] or counted as a drop; then the host's `tail` is published.
//!
//! `head` is guest-written and untrusted: a head behind the tail, more than
//! a ring ahead, or one that would run the free-running 64-bit index past
//! `u64::MAX` resynchronises the ring to `head` and is counted once in
//! `bad_index`. All index arithmetic is checked or wrapping; nothing a guest
//! writes can panic this code.

use std::sync::atomic::Ordering;

use hypercall_abi::stage::{Layout, RingHeader, StageEvent, STAGE_NONE};
use stagevm_report::VcpuRingStats;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::abi::Obj;

/// Offset of `tail` in a [`RingHeader`].
pub(super) const TAIL_OFFSET: u64 = core::mem::offset_of!(RingHeader, tail) as u64;
/// How many drops of each kind are logged before logging only every 1000th.
const LOG_FIRST_DROPS: u64 = 10;

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
    if count <= LOG_FIRST_DROPS || count.is_multiple_of(1000) {
        tracing::warn!(vcpu, count, "stage ring: dropped {what}: {detail}");
    }
}

/// Where one ring lives and where the host stopped reading it.
pub(super) struct Ring<'a> {
    /// Guest memory.
    pub memory: &'a GuestMemoryMmap,
    /// GPA of the registered area.
    pub area_gpa: u64,
    /// The area's validated layout.
    pub layout: Layout,
    /// vCPU index of the ring.
    pub vcpu: u32,
}

impl Ring<'_> {
    fn publish_tail(&self, tail: u64) {
        let ring = self.area_gpa + self.layout.ring_offset(self.vcpu);
        let _ = self
            .memory
            .store(tail, GuestAddress(ring + TAIL_OFFSET), Ordering::Release);
    }

    /// Drains the ring from `tail`: appends valid events to `out`, counts
    /// the rest in `stats`, publishes the new tail and returns it with
    /// whether the ring was resynchronised (events were skipped).
    pub fn drain(
        &self,
        tail: u64,
        stats: &mut VcpuRingStats,
        out: &mut Vec<Event>,
    ) -> (u64, bool) {
        let (memory, layout, vcpu) = (self.memory, self.layout, self.vcpu);
        let ring = self.area_gpa + layout.ring_offset(vcpu);
        let Ok(head) = memory.load::<u64>(GuestAddress(ring), Ordering::Acquire) else {
            return (tail, false);
        };
        if let Ok(backoffs) = memory.load::<u64>(
            GuestAddress(ring + core::mem::offset_of!(RingHeader, full_backoffs) as u64),
            Ordering::Relaxed,
        ) {
            stats.ring_full_backoffs = backoffs;
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
        for i in 0..pending {
            let index = tail.wrapping_add(i);
            let slot = self.area_gpa + layout.slot_offset(vcpu, index);
            let Ok(Obj(ev)) = memory.read_obj::<Obj<StageEvent>>(GuestAddress(slot)) else {
                continue;
            };
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
        self.publish_tail(head);
        (head, false)
    }
}
