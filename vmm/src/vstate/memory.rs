//! Guest memory: anonymous `vm-memory` mappings for the RAM ranges of
//! [`stagevm_arch::layout::ram_ranges`] (below the 32-bit MMIO hole,
//! and from 4 GiB up for more than 3 GiB), each registered with KVM as its
//! own memory slot (`KVM_SET_USER_MEMORY_REGION`); with `hugepages=on`
//! backed by the host's huge pages (`MAP_HUGETLB`).

use kvm_ioctls::VmFd;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap};

use crate::config::{MemoryConfig, HUGE_PAGE};
use crate::error::{kvm_err, MemoryError, VmmError};
use stagevm_arch::layout::ram_ranges;
use stagevm_arch::memory::{self, SlotError};

/// Maps the guest RAM of `config` and registers every range with `vm_fd`.
/// Errors: a mapping fails ([`VmmError::Memory`]; with huge pages it names
/// what the host's pool holds) or KVM refuses a region ([`VmmError::Kvm`]).
pub fn create(vm_fd: &VmFd, config: MemoryConfig) -> Result<GuestMemoryMmap, VmmError> {
    let memory = if config.hugepages {
        huge(config.size)?
    } else {
        memory::anonymous(config.size).map_err(MemoryError::from)?
    };
    memory::register(vm_fd, &memory).map_err(|e| match e {
        SlotError::Kvm(source) => kvm_err("KVM_SET_USER_MEMORY_REGION")(source),
        SlotError::Host(source) => MemoryError::Write {
            what: "the RAM ranges' registration".into(),
            source,
        }
        .into(),
    })?;
    Ok(memory)
}

/// The RAM ranges of a `size`-byte guest in huge pages. No
/// `MAP_NORESERVE`: a pool too small fails here, not with a `SIGBUS` at
/// the guest's first touch of a page the pool cannot give.
fn huge(size: u64) -> Result<GuestMemoryMmap, MemoryError> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB;
    let regions = ram_ranges(size)
        .into_iter()
        .map(|(start, len)| {
            let region = MmapRegionBuilder::new(len as usize)
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(flags)
                .build()
                .map_err(|source| MemoryError::HugePages {
                    start,
                    len,
                    source,
                    pool: pool(),
                })?;
            GuestRegionMmap::new(region, GuestAddress(start)).ok_or(MemoryError::Overflow(start))
        })
        .collect::<Result<Vec<_>, _>>()?;
    GuestMemoryMmap::from_regions(regions).map_err(MemoryError::from)
}

/// What the host's huge-page pool holds, from `/proc/meminfo`.
fn pool() -> String {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    match (field("HugePages_Total:"), field("HugePages_Free:")) {
        (Some(total), Some(free)) => format!(
            "the host has {free} free of {total} huge pages of {} (HugePages_Free in /proc/meminfo; \
             add some with: echo N > /proc/sys/vm/nr_hugepages)",
            crate::config::format_size(HUGE_PAGE)
        ),
        _ => "the host reports no huge pages (/proc/meminfo)".into(),
    }
}
