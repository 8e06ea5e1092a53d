//! Each vCPU's published scheduling state ([`VcpuState`]): run-queue depth,
//! parked flag and fallback count, which the host reads to place and wake
//! vCPUs.

use core::sync::atomic::{AtomicU32, Ordering};

use hypercall_abi::stage::{Layout, VcpuState};

use crate::{Agent, Platform};

impl<P: Platform> Agent<P> {
    /// `vcpu`'s state word at byte `offset` of its [`VcpuState`]; `None`
    /// when inactive or `vcpu` is out of range.
    fn state_u32(&self, vcpu: u32, offset: usize) -> Option<&'static AtomicU32> {
        self.layout.filter(|l| vcpu < l.num_vcpus)?;
        // SAFETY: the state block of vcpu < num_vcpus ≤ MAX_VCPUS lies in the
        // area; `offset` is a 4-aligned field offset inside VcpuState.
        Some(unsafe {
            AtomicU32::from_ptr(
                self.base
                    .add(Layout::vcpu_state_offset(vcpu) as usize + offset)
                    .cast::<u32>(),
            )
        })
    }

    /// Adds `delta` to `vcpu`'s published run-queue depth (see
    /// [`VcpuState`] for the wake-up protocol). No-op when inactive.
    pub fn runq_add(&self, vcpu: u32, delta: i32) {
        if let Some(w) = self.state_u32(vcpu, core::mem::offset_of!(VcpuState, runq_depth)) {
            w.fetch_add(delta as u32, Ordering::AcqRel);
        }
    }

    /// Publishes `depth` as `vcpu`'s run-queue depth with a plain store
    /// (for a runtime that knows its queue's length, e.g. under the queue's
    /// lock: no locked instruction on the switch path). No-op when inactive.
    pub fn set_runq_depth(&self, vcpu: u32, depth: u32) {
        if let Some(w) = self.state_u32(vcpu, core::mem::offset_of!(VcpuState, runq_depth)) {
            w.store(depth, Ordering::Release);
        }
    }

    /// `vcpu`'s published run-queue depth (0 when inactive).
    pub fn runq_depth(&self, vcpu: u32) -> u32 {
        self.state_u32(vcpu, core::mem::offset_of!(VcpuState, runq_depth))
            .map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// Publishes whether `vcpu` idles (see [`VcpuState`]).
    pub fn set_parked(&self, vcpu: u32, parked: bool) {
        if let Some(w) = self.state_u32(vcpu, core::mem::offset_of!(VcpuState, parked)) {
            w.store(u32::from(parked), Ordering::SeqCst);
        }
    }

    /// Whether `vcpu` published that it idles.
    pub fn is_parked(&self, vcpu: u32) -> bool {
        self.state_u32(vcpu, core::mem::offset_of!(VcpuState, parked))
            .is_some_and(|w| w.load(Ordering::SeqCst) != 0)
    }

    /// Counts a fallback on `vcpu`: a stage ran there although the map does not
    /// give it the stage, because no vCPU served the stage.
    pub fn count_fallback(&self, vcpu: u32) {
        if let Some(w) = self.state_u32(vcpu, core::mem::offset_of!(VcpuState, fallbacks)) {
            w.fetch_add(1, Ordering::Relaxed);
        }
    }
}
