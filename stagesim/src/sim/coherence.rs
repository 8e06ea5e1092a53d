//! Cross-core line transfers ([`CycleModel::transfer`]): a data line last
//! written on another core is not in this core's private caches, and
//! fetching it from the writer's costs more than an L3 hit.
//!
//! The model is a last-writer directory, write-invalidate for the previous
//! writer only:
//! * every store records its core as the line's owner; when the owner
//!   changes, the line is queued for removal from the previous owner's L1d
//!   and L2, which that core applies before it next runs (its caches cannot
//!   be read in between, so applying late is exact);
//! * a data access that misses the core's L1d and L2 while the line's owner
//!   is another core is a *transfer*: counted in [`Counters::xfer_lines`]
//!   and charged `transfer` instead of `l3_hit`.
//!
//! Simplifications (stated in the README): cores that only read a line keep
//! their copy when another core writes it (a migrating thread's stack and
//! state, the case that matters for staging, are written by the thread on
//! every core it visits, so the owner is the core it left); the directory
//! is direct-mapped with [`DIRECTORY_ENTRIES`] entries, and a line whose
//! entry another line took is treated as never written (no transfer).
//!
//! [`CycleModel::transfer`]: super::CycleModel::transfer
//! [`Counters::xfer_lines`]: super::Counters::xfer_lines

use crate::cache::{CoreCaches, Level};

/// Entries of the direct-mapped directory (2^22: 32 MiB, ~4 M lines,
/// 256 MiB of written data before two lines share an entry).
pub const DIRECTORY_ENTRIES: usize = 1 << 22;

/// No owner in a directory entry.
const EMPTY: u64 = u64::MAX;

/// The last-writer directory and each core's pending invalidations.
#[derive(Debug)]
pub(super) struct Coherence {
    /// `line << 8 | core` per entry (index: the line's low bits), or [`EMPTY`].
    dir: Vec<u64>,
    /// Per core: lines another core wrote since this one last ran.
    pending: Vec<Vec<u64>>,
}

impl Coherence {
    /// An empty directory for `cores` cores (at most 256).
    pub(super) fn new(cores: usize) -> Self {
        debug_assert!(cores <= 256);
        Self {
            dir: vec![EMPTY; DIRECTORY_ENTRIES],
            pending: vec![Vec::new(); cores],
        }
    }

    /// Applies the invalidations queued for `core` before it runs.
    pub(super) fn apply_pending(&mut self, core: usize, caches: &mut CoreCaches) {
        for line in self.pending[core].drain(..) {
            caches.invalidate_data(line);
        }
    }

    /// Records data access of `line` by `core` that was served at `level`;
    /// returns whether it was a transfer from another core.
    #[inline(always)]
    pub(super) fn access(&mut self, core: usize, line: u64, store: bool, level: Level) -> bool {
        let slot = &mut self.dir[(line as usize) & (DIRECTORY_ENTRIES - 1)];
        let owner = if *slot != EMPTY && *slot >> 8 == line {
            Some((*slot & 0xff) as usize)
        } else {
            None
        };
        let remote = owner.is_some_and(|o| o != core);
        if store && owner != Some(core) {
            if let Some(o) = owner.filter(|&o| o != core) {
                self.pending[o].push(line);
            }
            *slot = line << 8 | core as u64;
        }
        remote && matches!(level, Level::L3 | Level::Memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Hierarchy;

    #[test]
    fn a_line_written_elsewhere_is_a_transfer_and_leaves_the_writer() {
        let h = Hierarchy::default();
        let mut a = CoreCaches::new(&h).unwrap();
        let mut b = CoreCaches::new(&h).unwrap();
        let mut coh = Coherence::new(2);
        let line = 0x1234;
        // Core 0 writes the line: a miss, no owner yet, no transfer.
        let lv = a.data_line(line, None);
        assert!(!coh.access(0, line, true, lv));
        // Core 1 reads it: a private miss owned by core 0 → a transfer.
        let lv = b.data_line(line, None);
        assert_eq!(lv, Level::Memory);
        assert!(coh.access(1, line, false, lv));
        // Core 1 writes it: core 0's copy is queued for removal…
        assert!(!coh.access(1, line, true, Level::L1));
        coh.apply_pending(0, &mut a);
        // …so core 0 misses and transfers it back.
        let lv = a.data_line(line, None);
        assert_eq!(lv, Level::Memory);
        assert!(coh.access(0, line, false, lv));
        // A line nobody wrote is never a transfer.
        assert!(!coh.access(1, 0x9999, false, Level::Memory));
    }
}
