//! x86-64 register and page-table constants (defined once for the whole
//! VMM) and the register set-up of stagevm's direct ring-3 boot.
//!
//! Sources: Intel SDM Vol. 3A §2.5 (CR0, CR4), §2.2.1 (EFER), §4.5 table
//! 4-15 ff. (page-table entries); reset values of the x87 control word and
//! MXCSR: Intel SDM Vol. 1 §8.1.5, §10.2.3.

use hypercall_abi::boot::{BOOT_INFO_GPA, GDT_GPA, PML4_GPA};
use kvm_bindings::{kvm_fpu, kvm_regs, CpuId};
use kvm_ioctls::VcpuFd;

use crate::layout::{segment_from_gdt, GDT};

/// CR0.PE: protected mode.
pub const CR0_PE: u64 = 1 << 0;
/// CR0.MP: monitor coprocessor.
pub const CR0_MP: u64 = 1 << 1;
/// CR0.ET: extension type (always 1 on modern CPUs).
pub const CR0_ET: u64 = 1 << 4;
/// CR0.NE: native x87 error reporting.
pub const CR0_NE: u64 = 1 << 5;
/// CR0.WP: supervisor writes honour read-only pages.
pub const CR0_WP: u64 = 1 << 16;
/// CR0.PG: paging.
pub const CR0_PG: u64 = 1 << 31;
/// CR4.PSE: 4 MiB pages under 32-bit paging.
pub const CR4_PSE: u64 = 1 << 4;
/// CR4.PAE: physical address extension.
pub const CR4_PAE: u64 = 1 << 5;
/// CR4.OSFXSR: FXSAVE/FXRSTOR and SSE enabled.
pub const CR4_OSFXSR: u64 = 1 << 9;
/// CR4.OSXMMEXCPT: unmasked SSE exceptions enabled.
pub const CR4_OSXMMEXCPT: u64 = 1 << 10;
/// CR4.LA57: 5-level paging.
pub const CR4_LA57: u64 = 1 << 12;
/// EFER.LME: long mode enable.
pub const EFER_LME: u64 = 1 << 8;
/// EFER.LMA: long mode active.
pub const EFER_LMA: u64 = 1 << 10;
/// RFLAGS of the ring-3 boot: reserved bit 1 set, IOPL = 3 (bits 12-13), IF clear.
pub const RFLAGS_BOOT: u64 = 0x3002;

/// Page-table entry: present.
pub const PTE_PRESENT: u64 = 1 << 0;
/// Page-table entry: writable.
pub const PTE_WRITABLE: u64 = 1 << 1;
/// Page-table entry: user-accessible.
pub const PTE_USER: u64 = 1 << 2;
/// Page-directory entry: maps a large page (PS bit).
pub const PTE_HUGE: u64 = 1 << 7;
/// Physical-address bits 12..52 of a PAE / long-mode entry.
pub const PTE_ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
/// Bytes in a 4 KiB page.
pub const PAGE_SIZE: u64 = 4096;
/// Bytes in a 2 MiB page.
pub const PAGE_2M: u64 = 2 << 20;
/// Bytes in a GiB (one page directory of 2 MiB pages).
pub const GIB: u64 = 1 << 30;

/// KVM's supported CPUID `cpuid` with the APIC ID fields of vCPU `index`
/// (leaf 1 `EBX[31:24]`, leaves 0xB / 0x1F `EDX`).
pub fn vcpu_cpuid(cpuid: &CpuId, index: u32) -> CpuId {
    let mut cpuid = cpuid.clone();
    for e in cpuid.as_mut_slice() {
        match e.function {
            // Leaf 1 EBX[31:24]: initial APIC ID.
            1 => e.ebx = (e.ebx & 0x00ff_ffff) | (index << 24),
            // Leaves 0xB / 0x1F EDX: x2APIC ID.
            0xb | 0x1f => e.edx = index,
            _ => {}
        }
    }
    cpuid
}

/// Sets up CPUID, FPU, segment/control registers and general registers of
/// vCPU `index` for the ring-3 boot protocol of [`hypercall_abi::boot`].
///
/// `cpuid` is KVM's supported CPUID; the APIC ID fields are patched to
/// `index`. `rsp` is the top of this vCPU's stack. Errors are KVM ioctl errors.
pub fn configure(
    fd: &VcpuFd,
    index: u32,
    cpuid: &CpuId,
    entry: u64,
    rsp: u64,
) -> Result<(), kvm_ioctls::Error> {
    fd.set_cpuid2(&vcpu_cpuid(cpuid, index))?;

    // x87 control word and MXCSR at their reset values (Intel SDM Vol. 1 §8.1.5, §10.2.3).
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    fd.set_fpu(&fpu)?;

    let mut sregs = fd.get_sregs()?;
    let code = segment_from_gdt(3);
    let data = segment_from_gdt(4);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.gdt.base = GDT_GPA;
    sregs.gdt.limit = (std::mem::size_of_val(&GDT) - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.cr3 = PML4_GPA;
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    sregs.efer = EFER_LME | EFER_LMA;
    fd.set_sregs(&sregs)?;

    let regs = kvm_regs {
        rip: entry,
        rsp,
        rdi: u64::from(index),
        rsi: BOOT_INFO_GPA,
        rflags: RFLAGS_BOOT,
        ..Default::default()
    };
    fd.set_regs(&regs)
}
