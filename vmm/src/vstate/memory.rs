//! Guest memory: one anonymous `vm-memory` mapping from GPA 0, registered
//! with KVM as memory slot 0 (`KVM_SET_USER_MEMORY_REGION`).

use kvm_ioctls::VmFd;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::error::{kvm_err, VmmError};

/// Maps `size` bytes of guest RAM at GPA 0 and registers every region with
/// `vm_fd`. Errors: the mapping fails ([`VmmError::Memory`]) or KVM refuses
/// the region ([`VmmError::Kvm`]).
pub fn create(vm_fd: &VmFd, size: u64) -> Result<GuestMemoryMmap, VmmError> {
    let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), size as usize)])
        .map_err(|e| VmmError::Memory(e.to_string()))?;
    for (slot, region) in memory.iter().enumerate() {
        let host = region
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(|e| VmmError::Memory(e.to_string()))?;
        let mem_region = kvm_bindings::kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
            flags: 0,
        };
        // SAFETY: the region is a live mmap owned by `memory`, which the
        // VM keeps for as long as the VM fd exists.
        unsafe { vm_fd.set_user_memory_region(mem_region) }
            .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(memory)
}
