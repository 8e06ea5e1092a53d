//! The stage map as each vCPU sees it ([`map_on`]): every vCPU caches the
//! last map it read and re-reads it (a seqlock copy) only when the host
//! published a new epoch, so the stage switch and the scheduler test the
//! map with one epoch load.
//!
//! Depends on [`super::platform`] (the agent) only; the runtime and the
//! stage switch read the map through it.

use core::cell::UnsafeCell;

use guest_agent::{MapSnapshot, VisitPolicy};
use hypercall_abi::stage::{MAX_STAGES, MAX_VCPUS};

use super::platform::agent;

/// A stage map as one vCPU sees it: the snapshot and the stages it serves
/// (bit *s*), so the common case — this vCPU serves the next stage — is one
/// bit test.
pub(super) struct MapView {
    pub(super) snap: MapSnapshot,
    pub(super) here: u64,
}

/// Per vCPU, the last stage map it read (touched only by code on that vCPU).
#[repr(C, align(128))]
struct MapCache(UnsafeCell<Option<MapView>>);
// SAFETY: entry v is read and written only by code running on vCPU v, one
// context at a time (the cooperative runtime), never across a yield.
unsafe impl Sync for MapCache {}
static MAP_CACHE: [MapCache; MAX_VCPUS] = [const { MapCache(UnsafeCell::new(None)) }; MAX_VCPUS];

/// The current stage map as seen on `vcpu` (the caller runs there): one
/// epoch load, and a seqlock copy only when the host published a new map
/// since this vCPU's last read. `None` without a channel or before the
/// first map. The reference is valid until this vCPU's next call.
pub(super) fn map_on(vcpu: u32) -> Option<&'static MapView> {
    let a = agent();
    let epoch = a.map_epoch();
    if epoch == 0 {
        return None;
    }
    // SAFETY: this vCPU's own entry (see `MapCache`); no reference to it
    // is held across this call by code on this vCPU.
    let cache = unsafe { &mut *MAP_CACHE[vcpu as usize].0.get() };
    if cache.as_ref().is_none_or(|m| m.snap.epoch != epoch) {
        *cache = a.read_map().map(|snap| MapView {
            here: (0..MAX_STAGES as u32)
                .filter(|s| snap.serves(*s, vcpu))
                .fold(0, |m, s| m | 1 << s),
            snap,
        });
    }
    cache.as_ref()
}

/// The stage-visit policy in force on `vcpu` (the map's, ABI minor 3;
/// FIFO without a map).
pub(super) fn visit_on(vcpu: u32) -> VisitPolicy {
    map_on(vcpu).map_or(VisitPolicy::Fifo, |v| v.snap.visit)
}
