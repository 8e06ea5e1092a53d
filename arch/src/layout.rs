//! Guest memory layout and the boot-time structures the VMM writes into it:
//! GDT, identity page tables, the [`BootInfo`] page and the command line.
//!
//! The protocol (register values, addresses) is defined in
//! [`hypercall_abi::boot`]; this module implements the host side of it.

use hypercall_abi::boot::{
    BootInfo, BOOT_INFO_GPA, BOOT_INFO_MAGIC, BOOT_INFO_VERSION, CMDLINE_GPA, GDT_GPA, PML4_GPA,
};
use kvm_bindings::kvm_segment;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use stage_device::abi::Obj;

/// Bytes of stack the VMM reserves for each vCPU at the top of guest RAM.
pub const STACK_SIZE: u64 = 128 << 10;
pub use crate::regs::PAGE_SIZE;
use crate::regs::{GIB, PAGE_2M, PTE_HUGE, PTE_PRESENT, PTE_USER, PTE_WRITABLE};

/// The GDT stagevm installs: null, kernel code/data, user code/data. Flags are
/// the access byte plus the G/D/L nibble (Intel SDM Vol. 3A §3.4.5), as in
/// Firecracker's `arch::x86_64::gdt`.
pub const GDT: [u64; 5] = [
    0,
    gdt_entry(0xa09b, 0, 0xfffff), // kernel code: present, DPL0, exec/read, L=1
    gdt_entry(0xc093, 0, 0xfffff), // kernel data: present, DPL0, read/write, D/B=1
    gdt_entry(0xa0fb, 0, 0xfffff), // user code: present, DPL3, exec/read, L=1
    gdt_entry(0xc0f3, 0, 0xfffff), // user data: present, DPL3, read/write, D/B=1
];

/// Encodes one segment descriptor from its flags (access byte in bits 0..8,
/// flags nibble in bits 12..16), base and 20-bit limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((flags as u64 & 0x0000_f0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// The `kvm_segment` (hidden descriptor cache) for GDT entry `index`.
pub fn segment_from_gdt(index: u16) -> kvm_segment {
    segment_from_entry(GDT[index as usize], index)
}

/// The `kvm_segment` for descriptor `entry` (encoded by [`gdt_entry`]) at GDT
/// slot `index` (selector `index * 8` with RPL = the descriptor's DPL).
pub fn segment_from_entry(entry: u64, index: u16) -> kvm_segment {
    let flags = (entry >> 40) & 0xf0ff;
    let access = flags & 0xff;
    kvm_segment {
        base: ((entry >> 16) & 0xff_ffff) | ((entry >> 32) & 0xff00_0000),
        limit: {
            let raw = ((entry & 0xffff) | ((entry >> 32) & 0xf_0000)) as u32;
            // With G=1 the limit counts 4 KiB units.
            if flags & 0x8000 != 0 {
                (raw << 12) | 0xfff
            } else {
                raw
            }
        },
        selector: (index * 8) | ((access >> 5) & 3) as u16,
        type_: (access & 0xf) as u8,
        present: ((access >> 7) & 1) as u8,
        dpl: ((access >> 5) & 3) as u8,
        db: ((flags >> 14) & 1) as u8,
        s: ((access >> 4) & 1) as u8,
        l: ((flags >> 13) & 1) as u8,
        g: ((flags >> 15) & 1) as u8,
        avl: ((flags >> 12) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

/// Start of the 32-bit MMIO hole: guest RAM lies below it, and what does
/// not fit continues at [`HIGH_RAM_START`] (the x86-64 layout of Cloud
/// Hypervisor and Firecracker). The virtio-mmio window, the I/O APIC and the
/// local APIC are in the hole.
pub const MMIO_HOLE_START: u64 = 3 << 30;

/// GPA of the first virtio-mmio device's register window, in the MMIO
/// hole; the devices follow it ([`MMIO_SIZE`] each, `devices::virtio::slot`).
pub const MMIO_BASE: u64 = 0xd000_0000;
/// Bytes of MMIO space per virtio-mmio device.
pub const MMIO_SIZE: u64 = 0x1000;
/// First GPA of RAM above the hole: 4 GiB.
pub const HIGH_RAM_START: u64 = 4 << 30;
/// Largest RAM of the ring-3 unikernel (bytes): its page directories sit
/// between the PDPT and the command line (`PML4_GPA` + 8 KiB …
/// `CMDLINE_GPA`), room for 20 of them, each mapping 1 GiB of GPAs; with the
/// hole that is 3 GiB below 4 GiB and 17 GiB above.
pub const UNIKERNEL_MAX_MEMORY: u64 = 20 << 30;

/// Bytes of RAM below the hole for a guest of `mem_size` bytes.
pub fn low_ram(mem_size: u64) -> u64 {
    mem_size.min(MMIO_HOLE_START)
}

/// Bytes of RAM from [`HIGH_RAM_START`] up.
pub fn high_ram(mem_size: u64) -> u64 {
    mem_size.saturating_sub(MMIO_HOLE_START)
}

/// The guest's RAM as `(GPA, bytes)` ranges: one below the hole, and one
/// from 4 GiB when `mem_size` exceeds 3 GiB.
pub fn ram_ranges(mem_size: u64) -> Vec<(u64, u64)> {
    let mut ranges = vec![(0, low_ram(mem_size))];
    if high_ram(mem_size) > 0 {
        ranges.push((HIGH_RAM_START, high_ram(mem_size)));
    }
    ranges
}

/// The GPA after the last byte of RAM.
pub fn ram_end(mem_size: u64) -> u64 {
    match high_ram(mem_size) {
        0 => mem_size,
        high => HIGH_RAM_START + high,
    }
}

/// GPA where vCPU `index`'s stack ends (its initial `RSP`): the stacks are
/// at the top of the RAM below the hole.
pub fn stack_top(mem_size: u64, index: u32) -> u64 {
    low_ram(mem_size) - u64::from(index) * STACK_SIZE
}

/// Lowest GPA used by the vCPU stacks (`BootInfo::free_end`).
pub fn stacks_bottom(mem_size: u64, num_vcpus: u32) -> u64 {
    low_ram(mem_size) - u64::from(num_vcpus) * STACK_SIZE
}

/// Number of page directories needed to map the RAM of a `mem_size`-byte
/// guest (one per GiB of GPAs up to [`ram_end`]).
pub fn page_directories(mem_size: u64) -> u64 {
    ram_end(mem_size).div_ceil(GIB)
}

/// Writes the GDT, the identity page tables covering `mem_size` bytes with
/// user-accessible 2 MiB pages (plus the 2 MiB virtio-mmio window at
/// [`MMIO_BASE`]), the command line and the [`BootInfo`].
///
/// `kernel_end` is the first GPA after the loaded image. Errors are
/// `vm_memory` write errors (guest RAM too small for the fixed structures).
pub fn write_boot_structures(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    num_vcpus: u32,
    kernel_end: u64,
    cmdline: &str,
    tsc_khz: u64,
) -> Result<BootInfo, vm_memory::GuestMemoryError> {
    for (i, entry) in GDT.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(GDT_GPA + 8 * i as u64))?;
    }

    // PML4[0] -> PDPT; PDPT[g] -> PD g; PD g maps GiB g with 2 MiB pages.
    let pdpt = PML4_GPA + PAGE_SIZE;
    let user_rw = PTE_PRESENT | PTE_WRITABLE | PTE_USER;
    mem.write_obj(pdpt | user_rw, GuestAddress(PML4_GPA))?;
    let ranges = ram_ranges(mem_size);
    for g in 0..page_directories(mem_size) {
        let pd = pdpt + PAGE_SIZE * (1 + g);
        mem.write_obj(pd | user_rw, GuestAddress(pdpt + 8 * g))?;
        for e in 0..512u64 {
            let page = g * GIB + e * PAGE_2M;
            if !ranges
                .iter()
                .any(|&(start, len)| (start..start + len).contains(&page))
            {
                continue;
            }
            mem.write_obj(page | user_rw | PTE_HUGE, GuestAddress(pd + 8 * e))?;
        }
    }

    // The virtio-mmio window (one 2 MiB page above RAM), so ring-3 drivers
    // can reach the device registers; accesses exit to the VMM.
    let window = MMIO_BASE;
    let g = window / GIB;
    let pd = pdpt + PAGE_SIZE * (1 + g);
    if g >= page_directories(mem_size) {
        mem.write_obj(pd | user_rw, GuestAddress(pdpt + 8 * g))?;
    }
    mem.write_obj(
        window | user_rw | PTE_HUGE,
        GuestAddress(pd + 8 * ((window % GIB) / PAGE_2M)),
    )?;

    mem.write_slice(cmdline.as_bytes(), GuestAddress(CMDLINE_GPA))?;
    mem.write_obj(0u8, GuestAddress(CMDLINE_GPA + cmdline.len() as u64))?;

    let info = BootInfo {
        magic: BOOT_INFO_MAGIC,
        version: BOOT_INFO_VERSION,
        num_vcpus,
        mem_size,
        high_mem_start: if high_ram(mem_size) > 0 {
            HIGH_RAM_START
        } else {
            0
        },
        high_mem_size: high_ram(mem_size),
        cmdline_gpa: CMDLINE_GPA,
        cmdline_len: cmdline.len() as u64,
        free_start: kernel_end.next_multiple_of(PAGE_SIZE),
        free_end: stacks_bottom(mem_size, num_vcpus),
        stack_size: STACK_SIZE,
        tsc_khz,
    };
    mem.write_obj(Obj(info), GuestAddress(BOOT_INFO_GPA))?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_segments_have_dpl3_and_rpl3() {
        let cs = segment_from_gdt(3);
        assert_eq!(cs.selector, hypercall_abi::boot::USER_CS);
        assert_eq!((cs.dpl, cs.l, cs.db, cs.present, cs.s), (3, 1, 0, 1, 1));
        assert_eq!(cs.type_, 0xb);
        let ds = segment_from_gdt(4);
        assert_eq!(ds.selector, hypercall_abi::boot::USER_DS);
        assert_eq!((ds.dpl, ds.l, ds.db), (3, 0, 1));
        assert_eq!(ds.limit, 0xffff_ffff);
        assert_eq!(segment_from_gdt(1).selector, hypercall_abi::boot::KERNEL_CS);
    }

    #[test]
    fn page_tables_identity_map_all_ram() {
        let size = (GIB + 6 * PAGE_2M) as usize;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), size)]).unwrap();
        let info = write_boot_structures(&mem, size as u64, 2, 0x20_1234, "iters=5", 0).unwrap();
        assert_eq!(info.free_start, 0x20_2000);
        assert_eq!(info.free_end, size as u64 - 2 * STACK_SIZE);
        // Walk the tables for a few addresses.
        for addr in [0u64, 0x20_0000, GIB - PAGE_2M, GIB, GIB + 5 * PAGE_2M] {
            let pml4e: u64 = mem.read_obj(GuestAddress(PML4_GPA)).unwrap();
            let pdpte: u64 = mem
                .read_obj(GuestAddress((pml4e & !0xfff) + 8 * (addr >> 30)))
                .unwrap();
            let pde: u64 = mem
                .read_obj(GuestAddress((pdpte & !0xfff) + 8 * ((addr >> 21) & 511)))
                .unwrap();
            assert_eq!(pde & !0xfff, addr, "identity map of {addr:#x}");
            assert_eq!(pde & 0x87, 0x87);
        }
        // Nothing is mapped past the end of RAM.
        let pdpte: u64 = mem
            .read_obj(GuestAddress(PML4_GPA + PAGE_SIZE + 8))
            .unwrap();
        let past: u64 = mem
            .read_obj(GuestAddress((pdpte & !0xfff) + 8 * 6))
            .unwrap();
        assert_eq!(past, 0);
    }
}
