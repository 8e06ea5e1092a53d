//! stagevm's x86-64 ring-3 boot (`hypercall_abi::boot`), shared by the
//! `stagevm` VMM and the example VMM in `examples/`:
//!
//! * [`layout`] — the guest memory layout (RAM below the 3 GiB MMIO hole
//!   and from 4 GiB up, the virtio-mmio window, the vCPU stacks) and the
//!   boot structures written into guest memory (GDT, identity page tables
//!   with user-accessible 2 MiB pages, the command line, `BootInfo`);
//! * [`memory`] — the guest RAM of the layout, mapped and registered with
//!   KVM one slot per range;
//! * [`regs`] — control-register, EFER, RFLAGS and page-table bits, and a
//!   vCPU's registers and CPUID at its first instruction.
//!
//! The Linux boot protocols, ACPI and kernel loading stay in the VMM
//! (`vmm/src/arch/x86_64/`).

#[cfg(target_arch = "x86_64")]
pub mod layout;
#[cfg(target_arch = "x86_64")]
pub mod memory;
#[cfg(target_arch = "x86_64")]
pub mod regs;
