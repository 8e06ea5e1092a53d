//! Booting Linux: the PVH entry of an ELF `vmlinux` and the 64-bit boot
//! protocol of a bzImage, as Firecracker and Cloud Hypervisor do it.
//!
//! Unlike stagevm's own ring-3 boot ([`hypercall_abi::boot`]), Linux starts in
//! kernel mode, which on the project's machines is emulated and ~2000× slower
//! (`docs/design.md`). The VMM writes the boot structures below, starts
//! vCPU 0 at the kernel's entry and leaves the other vCPUs to the kernel, which
//! wakes them with INIT/SIPI through the in-kernel local APICs.
//!
//! Guest-physical layout (all below 1 MiB except the kernel and initramfs):
//!
//! | GPA | what |
//! |---|---|
//! | `0x500` | GDT ([`GDT`]) |
//! | `0x6000` | PVH `hvm_start_info`; `0x6040` its module list (the initramfs); `0x6100` its memory map |
//! | `0x7000` | bzImage `boot_params` ("zero page") |
//! | `0x8ff0` | initial stack of the bzImage entry (grows down) |
//! | `0x9000` | bzImage identity page tables: PML4, PDPT at `0xa000`, 4 page directories from `0xb000` (2 MiB pages, 0–4 GiB) |
//! | `0x20000` | command line ([`CMDLINE_GPA`], at most [`LINUX_CMDLINE_MAX`] bytes with the NUL) |
//! | `0x9fc00`–`0x100000` | reserved (EBDA, legacy ROM area); ACPI tables from `0xe0000` ([`super::acpi`]) |
//! | kernel's own addresses | the kernel (`p_paddr` of a `vmlinux`, `code32_start` of a bzImage) |
//! | top of RAM | the initramfs, 4 KiB aligned |

use hypercall_abi::boot::{CMDLINE_GPA, GDT_GPA, PML4_GPA};
use kvm_bindings::{kvm_fpu, kvm_lapic_state, kvm_msr_entry, kvm_regs, CpuId, Msrs};
use kvm_ioctls::VcpuFd;
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

/// RAM a Linux guest needs beyond its image and initramfs (bytes): page
/// tables, slab, the unpacked initramfs' first files. A smaller `--memory`
/// is refused instead of failing deep inside the guest's boot.
pub const LINUX_MIN_FREE: u64 = 32 << 20;

use stagevm_arch::layout::{gdt_entry, segment_from_entry, PAGE_SIZE};

/// GPA of the PVH `hvm_start_info` (`EBX` at the PVH entry).
pub const START_INFO_GPA: u64 = 0x6000;
/// GPA of the PVH module list (one entry: the initramfs).
pub const MODLIST_GPA: u64 = 0x6040;
/// GPA of the PVH memory map.
pub const MEMMAP_GPA: u64 = 0x6100;
/// GPA of the bzImage `boot_params` (`RSI` at the 64-bit entry).
pub const ZERO_PAGE_GPA: u64 = 0x7000;
/// Initial `RSP` of the bzImage entry.
pub const BOOT_STACK: u64 = 0x8ff0;
/// Start of the extended BIOS data area: RAM below it is usable.
pub const EBDA_START: u64 = 0x9fc00;
/// Start of RAM above the legacy hole (1 MiB).
pub const HIMEM_START: u64 = 0x10_0000;
/// Longest Linux command line including the NUL (x86 `COMMAND_LINE_SIZE`).
pub const LINUX_CMDLINE_MAX: usize = 2048;
/// `hvm_start_info.magic` (xen/include/public/arch-x86/hvm/start_info.h).
pub const XEN_HVM_START_MAGIC: u32 = 0x336e_c578;
/// Offset of the 64-bit entry point from a bzImage's load address.
pub const BZIMAGE_ENTRY64_OFFSET: u64 = 0x200;
/// Where KVM may put its TSS (three pages just below the 4 GiB BIOS area, as
/// in Firecracker); needed on Intel hosts before the first `KVM_RUN`.
pub const KVM_TSS_ADDRESS: usize = 0xfffb_d000;
/// The serial port's interrupt line (COM1: ISA IRQ 4).
pub const SERIAL_GSI: u32 = 4;

/// e820 / PVH memory-map types.
pub const E820_RAM: u32 = 1;
/// Reserved memory.
pub const E820_RESERVED: u32 = 2;

/// Selector of the 32-bit code segment (PVH entry).
pub const CODE32_SELECTOR: u16 = 0x08;
/// Selector of the 64-bit code segment (`__BOOT_CS` of the 64-bit protocol).
pub const CODE64_SELECTOR: u16 = 0x10;
/// Selector of the flat data segment (`__BOOT_DS`).
pub const DATA_SELECTOR: u16 = 0x18;
/// Selector of the task-state segment.
pub const TSS_SELECTOR: u16 = 0x20;

/// The GDT of a Linux boot: null, 32-bit code, 64-bit code, data, TSS. Slots
/// 2 and 3 are the `__BOOT_CS` (0x10) and `__BOOT_DS` (0x18) the 64-bit boot
/// protocol asks for; the PVH entry uses slot 1.
pub const GDT: [u64; 5] = [
    0,
    gdt_entry(0xc09b, 0, 0xfffff), // 32-bit code: present, DPL0, exec/read, D=1, G=1
    gdt_entry(0xa09b, 0, 0xfffff), // 64-bit code: L=1
    gdt_entry(0xc093, 0, 0xfffff), // data: read/write, D/B=1, G=1
    gdt_entry(0x008b, 0, 0xfffff), // TSS: present, busy
];

use stagevm_arch::regs::{
    CR0_ET, CR0_PE, CR0_PG, CR4_PAE, EFER_LMA, EFER_LME, PAGE_2M, PTE_HUGE, PTE_PRESENT,
    PTE_WRITABLE,
};
/// GiBs the bzImage page tables identity-map.
const MAPPED_GIB: u64 = 4;

/// How vCPU 0 enters the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinuxEntry {
    /// PVH: 32-bit protected mode, paging off, at this GPA; `EBX` =
    /// [`START_INFO_GPA`].
    Pvh(u64),
    /// 64-bit boot protocol: long mode with identity paging, at this GPA
    /// (load address + 0x200); `RSI` = [`ZERO_PAGE_GPA`].
    BzImage64(u64),
}

/// The e820 map of a VM with `mem_size` bytes of RAM
/// ([`stagevm_arch::layout::ram_ranges`]): `(start, size, type)` with RAM below the
/// EBDA, the EBDA and legacy area reserved, RAM from 1 MiB to the 32-bit
/// MMIO hole, and the rest of RAM from 4 GiB.
pub fn e820_map(mem_size: u64) -> Vec<(u64, u64, u32)> {
    let low = stagevm_arch::layout::low_ram(mem_size);
    let mut map = vec![
        (0, EBDA_START, E820_RAM),
        (EBDA_START, HIMEM_START - EBDA_START, E820_RESERVED),
        (HIMEM_START, low - HIMEM_START, E820_RAM),
    ];
    let high = stagevm_arch::layout::high_ram(mem_size);
    if high > 0 {
        map.push((stagevm_arch::layout::HIGH_RAM_START, high, E820_RAM));
    }
    map
}

/// Where an initramfs of `len` bytes goes: as high as possible in the RAM
/// below the hole of a `mem_size`-byte guest, 4 KiB aligned, ending at or
/// below `max_end` (exclusive), and not below `lowest`. `None` when it does
/// not fit.
pub fn initramfs_gpa(mem_size: u64, len: u64, lowest: u64, max_end: u64) -> Option<u64> {
    let end = stagevm_arch::layout::low_ram(mem_size).min(max_end);
    let start = end.checked_sub(len)? & !(PAGE_SIZE - 1);
    (start >= lowest.next_multiple_of(PAGE_SIZE)).then_some(start)
}

/// Writes what both Linux entries need: the [`GDT`] and the NUL-terminated
/// command line at [`CMDLINE_GPA`].
pub fn write_common(mem: &GuestMemoryMmap, cmdline: &str) -> Result<(), GuestMemoryError> {
    for (i, entry) in GDT.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(GDT_GPA + 8 * i as u64))?;
    }
    mem.write_slice(cmdline.as_bytes(), GuestAddress(CMDLINE_GPA))?;
    mem.write_obj(0u8, GuestAddress(CMDLINE_GPA + cmdline.len() as u64))
}

/// Writes the PVH `hvm_start_info` (version 1, with memory map and the ACPI
/// RSDP at `rsdp`), its memory map and, for an `initramfs` `(gpa, len)`, a
/// one-entry module list.
pub fn write_pvh(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    initramfs: Option<(u64, u64)>,
    rsdp: u64,
) -> Result<(), GuestMemoryError> {
    let map = e820_map(mem_size);
    for (i, (addr, size, type_)) in map.iter().enumerate() {
        let entry = hvm_memmap_table_entry {
            addr: *addr,
            size: *size,
            type_: *type_,
            reserved: 0,
        };
        mem.write_obj(
            entry,
            GuestAddress(MEMMAP_GPA + (i * std::mem::size_of::<hvm_memmap_table_entry>()) as u64),
        )?;
    }
    let mut info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC,
        version: 1,
        cmdline_paddr: CMDLINE_GPA,
        memmap_paddr: MEMMAP_GPA,
        memmap_entries: map.len() as u32,
        rsdp_paddr: rsdp,
        ..Default::default()
    };
    if let Some((paddr, size)) = initramfs {
        let module = hvm_modlist_entry {
            paddr,
            size,
            ..Default::default()
        };
        mem.write_obj(module, GuestAddress(MODLIST_GPA))?;
        info.nr_modules = 1;
        info.modlist_paddr = MODLIST_GPA;
    }
    mem.write_obj(info, GuestAddress(START_INFO_GPA))
}

/// Writes the bzImage `boot_params` at [`ZERO_PAGE_GPA`] from the kernel's
/// setup header `hdr`: loader type, command line, initramfs `(gpa, len)`,
/// the ACPI RSDP at `rsdp` and the e820 map; and the identity page tables of
/// the 64-bit entry.
pub fn write_bzimage(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    hdr: setup_header,
    cmdline_len: usize,
    initramfs: Option<(u64, u64)>,
    rsdp: u64,
) -> Result<(), GuestMemoryError> {
    let mut params = boot_params {
        hdr,
        acpi_rsdp_addr: rsdp,
        ..Default::default()
    };
    // "Undefined" boot loader (boot.rst: type_of_loader 0xff).
    params.hdr.type_of_loader = 0xff;
    params.hdr.boot_flag = 0xaa55;
    params.hdr.cmd_line_ptr = CMDLINE_GPA as u32;
    params.hdr.cmdline_size = cmdline_len as u32;
    if let Some((gpa, len)) = initramfs {
        params.hdr.ramdisk_image = gpa as u32;
        params.hdr.ramdisk_size = len as u32;
    }
    let map = e820_map(mem_size);
    for (i, (addr, size, type_)) in map.iter().enumerate() {
        params.e820_table[i] = boot_e820_entry {
            addr: *addr,
            size: *size,
            r#type: *type_,
        };
    }
    params.e820_entries = map.len() as u8;
    mem.write_obj(params, GuestAddress(ZERO_PAGE_GPA))?;

    // PML4[0] -> PDPT; PDPT[g] -> PD g; PD g maps GiB g with 2 MiB pages.
    let pdpt = PML4_GPA + PAGE_SIZE;
    let rw = PTE_PRESENT | PTE_WRITABLE;
    mem.write_obj(pdpt | rw, GuestAddress(PML4_GPA))?;
    for g in 0..MAPPED_GIB {
        let pd = pdpt + PAGE_SIZE * (1 + g);
        mem.write_obj(pd | rw, GuestAddress(pdpt + 8 * g))?;
        for e in 0..512u64 {
            let page = (g << 30) + e * PAGE_2M;
            mem.write_obj(page | rw | PTE_HUGE, GuestAddress(pd + 8 * e))?;
        }
    }
    Ok(())
}

/// MSR numbers (Intel SDM Vol. 4) set at boot, as Firecracker does.
const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
/// `IA32_MISC_ENABLE`: fast string operations.
const MISC_ENABLE_FAST_STRING: u64 = 1;
/// `MTRRdefType`: MTRRs enabled, default type write-back.
const MTRR_ENABLE_WB: u64 = (1 << 11) | 6;

/// Local APIC register offsets and LVT delivery modes (Intel SDM Vol. 3A §11.5.1).
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 4;
const APIC_MODE_EXTINT: u32 = 7;
/// LVT delivery-mode field and mask bit.
const APIC_LVT_MODE_MASK: u32 = 0x700;
const APIC_LVT_MASKED: u32 = 1 << 16;

/// Sets LVT register `reg` to delivery mode `mode`, unmasked.
fn set_lvt_mode(lapic: &mut kvm_lapic_state, reg: usize, mode: u32) {
    let mut raw = [0u8; 4];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = lapic.regs[reg + i] as u8;
    }
    let value = (u32::from_le_bytes(raw) & !(APIC_LVT_MODE_MASK | APIC_LVT_MASKED)) | (mode << 8);
    for (i, b) in value.to_le_bytes().iter().enumerate() {
        lapic.regs[reg + i] = *b as _;
    }
}

/// Sets up vCPU `index` of a Linux guest: CPUID (KVM's supported set with
/// this vCPU's APIC ID), FPU, boot MSRs and the local APIC's LINT0 (ExtINT,
/// the 8259 PIC) and LINT1 (NMI), unmasked — "virtual wire" mode, as a PC's
/// BIOS leaves them. Unmasked LINT0 matters: a kernel that keeps the PIC
/// mode (`acpi=off` without MP tables disables its local APIC) never
/// programs it, and KVM passes 8259 interrupts (the timer tick) only through
/// an unmasked ExtINT LINT0 of a hardware-enabled local APIC. vCPU 0 also gets
/// the registers of `entry`; the others stay in KVM's initial
/// "uninitialized" MP state until the kernel sends them INIT/SIPI.
///
/// Needs the in-kernel irqchip. An MSR KVM refuses is logged, not fatal.
/// Errors are KVM ioctl errors.
pub fn configure_vcpu(
    fd: &VcpuFd,
    index: u32,
    cpuid: &CpuId,
    entry: LinuxEntry,
) -> Result<(), kvm_ioctls::Error> {
    fd.set_cpuid2(&stagevm_arch::regs::vcpu_cpuid(cpuid, index))?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    fd.set_fpu(&fpu)?;

    let entries: Vec<kvm_msr_entry> = [
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_TSC, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (MSR_MTRR_DEF_TYPE, MTRR_ENABLE_WB),
    ]
    .iter()
    .map(|&(index, data)| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    })
    .collect();
    let msrs = Msrs::from_entries(&entries).expect("fewer MSRs than KVM_MAX_MSR_ENTRIES");
    let set = fd.set_msrs(&msrs)?;
    if set < entries.len() {
        tracing::warn!(
            vcpu = index,
            "KVM refused boot MSR {:#x} ({set} of {} set)",
            entries[set].index,
            entries.len()
        );
    }

    let mut lapic = fd.get_lapic()?;
    set_lvt_mode(&mut lapic, APIC_LVT0, APIC_MODE_EXTINT);
    set_lvt_mode(&mut lapic, APIC_LVT1, APIC_MODE_NMI);
    fd.set_lapic(&lapic)?;

    if index != 0 {
        return Ok(());
    }
    let mut sregs = fd.get_sregs()?;
    let data = segment_from_entry(GDT[3], 3);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment_from_entry(GDT[4], 4);
    sregs.gdt.base = GDT_GPA;
    sregs.gdt.limit = (std::mem::size_of_val(&GDT) - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    let mut regs = kvm_regs {
        rflags: 0x2,
        ..Default::default()
    };
    match entry {
        LinuxEntry::Pvh(rip) => {
            sregs.cs = segment_from_entry(GDT[1], 1);
            sregs.cr0 = CR0_PE | CR0_ET;
            sregs.cr3 = 0;
            sregs.cr4 = 0;
            sregs.efer = 0;
            regs.rip = rip;
            regs.rbx = START_INFO_GPA;
        }
        LinuxEntry::BzImage64(rip) => {
            sregs.cs = segment_from_entry(GDT[2], 2);
            sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
            sregs.cr3 = PML4_GPA;
            sregs.cr4 = CR4_PAE;
            sregs.efer = EFER_LME | EFER_LMA;
            regs.rip = rip;
            regs.rsi = ZERO_PAGE_GPA;
            regs.rsp = BOOT_STACK;
            regs.rbp = BOOT_STACK;
        }
    }
    fd.set_sregs(&sregs)?;
    fd.set_regs(&regs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    #[test]
    fn selectors_match_the_gdt() {
        assert_eq!(segment_from_entry(GDT[1], 1).selector, CODE32_SELECTOR);
        let cs64 = segment_from_entry(GDT[2], 2);
        assert_eq!(cs64.selector, CODE64_SELECTOR);
        assert_eq!((cs64.l, cs64.db, cs64.dpl), (1, 0, 0));
        let cs32 = segment_from_entry(GDT[1], 1);
        assert_eq!((cs32.l, cs32.db, cs32.limit), (0, 1, 0xffff_ffff));
        assert_eq!(segment_from_entry(GDT[3], 3).selector, DATA_SELECTOR);
        let tss = segment_from_entry(GDT[4], 4);
        assert_eq!((tss.selector, tss.type_, tss.s), (TSS_SELECTOR, 0xb, 0));
    }

    #[test]
    fn lint_entries_are_unmasked() {
        let mut lapic = kvm_lapic_state::default();
        lapic.regs[APIC_LVT0 + 2] = 1; // masked, as after reset
        set_lvt_mode(&mut lapic, APIC_LVT0, APIC_MODE_EXTINT);
        let raw: Vec<u8> = lapic.regs[APIC_LVT0..APIC_LVT0 + 4]
            .iter()
            .map(|b| *b as u8)
            .collect();
        assert_eq!(u32::from_le_bytes(raw.try_into().unwrap()), 0x700);
    }

    #[test]
    fn initramfs_goes_to_the_top() {
        let mib = 1u64 << 20;
        assert_eq!(
            initramfs_gpa(256 * mib, 10 * mib + 5, 64 * mib, u64::MAX),
            Some(256 * mib - 10 * mib - PAGE_SIZE)
        );
        assert_eq!(initramfs_gpa(256 * mib, mib, 0, 128 * mib), Some(127 * mib));
        assert_eq!(initramfs_gpa(64 * mib, 10 * mib, 60 * mib, u64::MAX), None);
        assert_eq!(initramfs_gpa(mib, 2 * mib, 0, u64::MAX), None);
    }

    #[test]
    fn pvh_start_info_and_memmap() {
        let size = 64u64 << 20;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), size as usize)]).unwrap();
        write_common(&mem, "console=ttyS0").unwrap();
        write_pvh(&mem, size, Some((0x300_0000, 0x1234)), 0xe_0000).unwrap();
        let info: hvm_start_info = mem.read_obj(GuestAddress(START_INFO_GPA)).unwrap();
        assert_eq!(info.magic, XEN_HVM_START_MAGIC);
        assert_eq!((info.nr_modules, info.memmap_entries), (1, 3));
        assert_eq!(info.rsdp_paddr, 0xe_0000);
        let last: hvm_memmap_table_entry = mem
            .read_obj(GuestAddress(info.memmap_paddr + 2 * 24))
            .unwrap();
        assert_eq!((last.addr, last.addr + last.size), (HIMEM_START, size));
        let module: hvm_modlist_entry = mem.read_obj(GuestAddress(info.modlist_paddr)).unwrap();
        assert_eq!((module.paddr, module.size), (0x300_0000, 0x1234));
        let mut cmdline = [0u8; 14];
        mem.read_slice(&mut cmdline, GuestAddress(info.cmdline_paddr))
            .unwrap();
        assert_eq!(&cmdline, b"console=ttyS0\0");
    }

    #[test]
    fn zero_page_and_page_tables() {
        let size = 64u64 << 20;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), size as usize)]).unwrap();
        let hdr = setup_header {
            header: 0x5372_6448,
            ..Default::default()
        };
        write_bzimage(&mem, size, hdr, 13, None, 0xe_0000).unwrap();
        let params: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_GPA)).unwrap();
        assert_eq!(params.hdr.type_of_loader, 0xff);
        assert_eq!(params.hdr.cmd_line_ptr as u64, CMDLINE_GPA);
        assert_eq!(params.e820_entries, 3);
        assert_eq!({ params.acpi_rsdp_addr }, 0xe_0000);
        // 3 GiB + 2 MiB is mapped to itself.
        let addr = (3u64 << 30) + PAGE_2M;
        let pdpte: u64 = mem
            .read_obj(GuestAddress(PML4_GPA + PAGE_SIZE + 8 * 3))
            .unwrap();
        let pde: u64 = mem.read_obj(GuestAddress((pdpte & !0xfff) + 8)).unwrap();
        assert_eq!(pde & !0xfff, addr);
    }
}
