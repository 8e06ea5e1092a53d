//! Guest RAM for the layout ([`crate::layout::ram_ranges`]): anonymous
//! `vm-memory` mappings, and their registration with KVM, one memory slot
//! per range (`KVM_SET_USER_MEMORY_REGION`).

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::mmap::FromRangesError;
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryError, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress,
};

use crate::layout::ram_ranges;

/// Why a region could not be registered with KVM.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// The region's host address could not be had.
    #[error("guest memory: {0}")]
    Host(#[from] GuestMemoryError),
    /// KVM refused the slot.
    #[error("KVM_SET_USER_MEMORY_REGION: {0}")]
    Kvm(#[source] kvm_ioctls::Error),
}

/// Anonymous mappings of a `mem_size`-byte guest's RAM ranges. Errors:
/// `vm-memory`'s, when a mapping fails.
pub fn anonymous(mem_size: u64) -> Result<GuestMemoryMmap, FromRangesError> {
    let ranges: Vec<(GuestAddress, usize)> = ram_ranges(mem_size)
        .into_iter()
        .map(|(start, len)| (GuestAddress(start), len as usize))
        .collect();
    GuestMemoryMmap::<()>::from_ranges(&ranges)
}

/// Registers every region of `memory` with `vm`, slot `i` for region `i`.
/// `memory` must outlive the VM (its mappings back the guest's RAM).
/// Errors: [`SlotError`].
pub fn register(vm: &VmFd, memory: &GuestMemoryMmap) -> Result<(), SlotError> {
    for (slot, region) in memory.iter().enumerate() {
        let host = region.get_host_address(MemoryRegionAddress(0))?;
        let slot = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
            flags: 0,
        };
        // SAFETY: the region is a live mapping owned by `memory`, which the
        // caller keeps for as long as the VM fd exists.
        unsafe { vm.set_user_memory_region(slot) }.map_err(SlotError::Kvm)?;
    }
    Ok(())
}
