//! The device's side of ABI minor 2's per-vCPU counters and minor 4's
//! latency histograms: copies of every vCPU's [`VcpuCounters`] and
//! [`VcpuLatency`] blocks ([`Blocks`]), of the live area once per policy
//! period and as UNREGISTER left them. The values are the untrusted
//! guest's, unchecked here: the scheduler's accounting
//! (`crate::sched::counter_reader`, `crate::sched::latency_reader`) applies
//! docs/stage-protocol.md §8's rules to them.

use std::sync::atomic::{fence, Ordering};

use hypercall_abi::stage::{VcpuCounters, VcpuLatency};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::{host_tsc, Inner, StageDevice};
use crate::abi::Obj;

/// Copies of a block tried before one is taken as it is (see
/// [`copy_block`]).
const COPY_TRIES: u32 = 4;

/// When and of which registration a copy of the counter blocks was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterCopy {
    /// The registration's generation ([`super::Registered::generation`]).
    pub generation: u64,
    /// The host's TSC right before the blocks were copied: the end of the
    /// read's window.
    pub host_tsc: u64,
}

/// Copies of a counters area's per-vCPU blocks.
#[derive(Clone, Debug, Default)]
pub struct Blocks {
    /// Per vCPU, its counters.
    pub counters: Vec<VcpuCounters>,
    /// Per vCPU, its latency histogram (minor 4; empty when the area has
    /// none).
    pub latency: Vec<VcpuLatency>,
}

impl<M: super::StageMemory> StageDevice<M> {
    /// Copies every vCPU's [`VcpuCounters`] into `out` (cleared first);
    /// `None` without an area or when the area has no counters. O(vCPUs ×
    /// 768 bytes).
    pub fn read_counters(&self, out: &mut Vec<VcpuCounters>) -> Option<CounterCopy> {
        let inner = self.lock();
        self.copy_counters(&inner, out)
    }

    /// Copies every vCPU's blocks into `out`: the latency histograms
    /// first (when the area has them, O(vCPUs × 2,176 bytes)), then the
    /// counters, so a request whose latency the copy holds is among the
    /// completed requests it holds. `None` without an area or when it has
    /// no counters.
    pub fn read_blocks(&self, out: &mut Blocks) -> Option<CounterCopy> {
        let inner = self.lock();
        self.copy_blocks(&inner, out)
    }

    /// The blocks as the last UNREGISTER of a counters area left them (see
    /// [`Self::read_blocks`]), once; `None` when there is none.
    pub fn take_final_blocks(&self, out: &mut Blocks) -> Option<CounterCopy> {
        let (copy, blocks) = self.lock().final_counters.take()?;
        *out = blocks;
        Some(copy)
    }

    pub(super) fn copy_blocks(&self, inner: &Inner, out: &mut Blocks) -> Option<CounterCopy> {
        out.latency.clear();
        if let Some(area) = inner.area.as_ref().filter(|a| a.layout.latency) {
            let memory = self.memory.memory();
            for vcpu in 0..area.layout.num_vcpus {
                let at = GuestAddress(area.gpa + area.layout.latency_offset(vcpu));
                out.latency.push(copy_latency(&*memory, at));
            }
        }
        self.copy_counters(inner, &mut out.counters)
    }

    pub(super) fn copy_counters(
        &self,
        inner: &Inner,
        out: &mut Vec<VcpuCounters>,
    ) -> Option<CounterCopy> {
        out.clear();
        let area = inner.area.as_ref().filter(|a| a.layout.counters)?;
        let copy = CounterCopy {
            generation: inner.report.registrations,
            host_tsc: host_tsc(),
        };
        let memory = self.memory.memory();
        for vcpu in 0..area.layout.num_vcpus {
            let at = GuestAddress(area.gpa + area.layout.counters_offset(vcpu));
            out.push(copy_block(&*memory, at));
        }
        Some(copy)
    }
}

/// One vCPU's block at `at` (inside the validated area), copied so that its
/// state word and its counts belong together where possible: the guest
/// writes the counts first and the state word last (release), so a copy
/// whose state word reads the same before and after it missed no completed
/// transition. Otherwise the copy is retried, up to [`COPY_TRIES`] times; a
/// guest that switches all the time (or a vCPU preempted mid-transition)
/// can still tear one, which shifts one visit between neighbouring reads
/// (the accounting's rules, docs/stage-protocol.md §8). A failed read
/// (cannot happen in the validated area) reads as zeros, which the
/// accounting treats as counters that went backwards.
fn copy_block<M: GuestMemoryBackend>(memory: &M, at: GuestAddress) -> VcpuCounters {
    let state = || memory.load::<u64>(at, Ordering::Acquire).unwrap_or(0);
    let mut block = VcpuCounters::default();
    for _ in 0..COPY_TRIES {
        let before = state();
        block = memory
            .read_obj::<Obj<VcpuCounters>>(at)
            .map(|b| b.0)
            .unwrap_or_default();
        fence(Ordering::Acquire);
        if block.state == before && state() == before {
            break;
        }
    }
    block
}

/// One vCPU's latency histogram at `at` (inside the validated area): the
/// guest stores a request's bucket and sum before `samples` (release), so
/// a copy whose `samples` reads the same before and after it holds every
/// recorded request whole, and at most one in flight (its bucket, perhaps
/// its sum, not yet its `samples`). Retried up to [`COPY_TRIES`] times; a
/// failed read reads as zeros (counters that went backwards).
fn copy_latency<M: GuestMemoryBackend>(memory: &M, at: GuestAddress) -> VcpuLatency {
    let samples = || memory.load::<u64>(at, Ordering::Acquire).unwrap_or(0);
    let mut block = VcpuLatency::default();
    for _ in 0..COPY_TRIES {
        let before = samples();
        block = memory
            .read_obj::<Obj<VcpuLatency>>(at)
            .map(|b| b.0)
            .unwrap_or_default();
        fence(Ordering::Acquire);
        if block.samples == before && samples() == before {
            break;
        }
    }
    block
}
