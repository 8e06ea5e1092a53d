//! The host's stage map as the guest reads it: a consistent [`MapSnapshot`]
//! under the map's seqlock ([`Agent::read_map`]), single words of it for the
//! switch path, and the one rule that picks a vCPU for a stage from a
//! snapshot ([`choose_from_map`]).

use core::ptr;
use core::sync::atomic::{fence, Ordering};

use hypercall_abi::stage::{StageMap, MAX_STAGES, STAGE_MAP_OFFSET};

use crate::{Agent, Platform, VisitPolicy};

/// A consistent copy of the host's stage map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSnapshot {
    /// Seqlock epoch (even).
    pub epoch: u64,
    /// Per stage, the mask of vCPUs serving it.
    pub vcpus: [u64; MAX_STAGES],
    /// The vCPUs alone on their host core (ABI minor 1); 0 from a host
    /// that does not publish it (minor 0), so such a guest parks as in v1.0.
    pub owned: u64,
    /// The stage-visit policy the host asks for (ABI minor 3,
    /// [`StageMap::visit`]); [`VisitPolicy::Fifo`] from an older host or
    /// for a code this guest does not know.
    pub visit: VisitPolicy,
}

impl MapSnapshot {
    /// True if `vcpu` serves `stage` in this map.
    pub fn serves(&self, stage: u32, vcpu: u32) -> bool {
        (stage as usize) < MAX_STAGES && vcpu < 64 && self.vcpus[stage as usize] & (1 << vcpu) != 0
    }
}

impl<P: Platform> Agent<P> {
    /// Word `index` (< 24) of the stage map, read relaxed and outside the
    /// seqlock (callers are registered).
    pub(crate) fn map_word(&self, index: usize) -> u64 {
        // SAFETY: word `index` of the map, inside the registered area.
        let p = unsafe { self.base.add(STAGE_MAP_OFFSET as usize + 8 * index) } as *mut u64;
        Self::word(p).load(Ordering::Relaxed)
    }

    /// The stage map's epoch (one acquire load; 0 when inactive or before
    /// the host published a map, odd while it writes one): a reader that
    /// cached the map of an equal, even epoch holds the current map.
    pub fn map_epoch(&self) -> u64 {
        if self.layout.is_none() {
            return 0;
        }
        // SAFETY: word 0 of the map, inside the registered area.
        let p = unsafe { self.base.add(STAGE_MAP_OFFSET as usize) } as *mut u64;
        Self::word(p).load(Ordering::Acquire)
    }

    /// Reads a consistent stage map (seqlock: retries while the host writes).
    /// `None` when inactive or before the host published a map.
    pub fn read_map(&self) -> Option<MapSnapshot> {
        self.layout?;
        // SAFETY: the map lies in the registered area.
        let map = unsafe { self.base.add(STAGE_MAP_OFFSET as usize) } as *mut u64;
        let epoch_word = Self::word(map);
        loop {
            let epoch = epoch_word.load(Ordering::Acquire);
            if epoch == 0 {
                return None;
            }
            if !epoch.is_multiple_of(2) {
                core::hint::spin_loop();
                continue;
            }
            let mut vcpus = [0u64; MAX_STAGES];
            for (i, v) in vcpus.iter_mut().enumerate() {
                // SAFETY: word i + 1 of the map.
                *v = unsafe { ptr::read_volatile(map.add(1 + i)) };
            }
            // SAFETY: words of the map (`StageMap` is 24 words).
            let (owned, minor, visit) = unsafe {
                (
                    ptr::read_volatile(map.add(MAP_OWNED)),
                    ptr::read_volatile(map.add(MAP_MINOR)),
                    ptr::read_volatile(map.add(MAP_VISIT)),
                )
            };
            fence(Ordering::Acquire);
            if epoch_word.load(Ordering::Relaxed) == epoch {
                let owned = if minor >= 1 { owned } else { 0 };
                let visit = if minor >= 3 {
                    VisitPolicy::from_code(visit).unwrap_or_default()
                } else {
                    VisitPolicy::Fifo
                };
                return Some(MapSnapshot {
                    epoch,
                    vcpus,
                    owned,
                    visit,
                });
            }
        }
    }
}

/// Word indices of [`StageMap`] fields.
pub(crate) const MAP_OWNED: usize = core::mem::offset_of!(StageMap, owned) / 8;
pub(crate) const MAP_MINOR: usize = core::mem::offset_of!(StageMap, minor) / 8;
pub(crate) const MAP_VISIT: usize = core::mem::offset_of!(StageMap, visit) / 8;
pub(crate) const MAP_TRACE_EVERY: usize = core::mem::offset_of!(StageMap, trace_every) / 8;

/// Which vCPU `stage` should run on for a thread now on `current`, given a
/// map read with [`Agent::read_map`] (pure; the one place the rule lives):
/// `current` if `map` lets it serve the stage, else the vCPU with the
/// smallest `loads[v]` among those serving it (lowest index on ties; `loads`
/// is indexed by vCPU, e.g. published run-queue depths, and only its first
/// 64 entries count). Returns `current` when the stage is out of range or no
/// vCPU of `loads` serves it (the caller counts that as a fallback).
pub fn choose_from_map(map: &MapSnapshot, stage: u32, current: u32, loads: &[u32]) -> u32 {
    if (stage as usize) >= MAX_STAGES || map.serves(stage, current) {
        return current;
    }
    let mask = map.vcpus[stage as usize];
    (0..loads.len().min(64) as u32)
        .filter(|v| mask & (1 << v) != 0)
        .min_by_key(|v| loads[*v as usize])
        .unwrap_or(current)
}
