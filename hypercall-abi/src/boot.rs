//! Direct ring-3 boot protocol.
//!
//! On the project's machines guest kernel-mode (CPL0) code is emulated and
//! ~2000× slower than guest user-mode code (`docs/design.md`, "Machine facts"). stagevm therefore does the whole of a kernel's early set-up
//! itself and starts every vCPU directly in 64-bit ring 3; there is no
//! firmware and no INIT/SIPI.
//!
//! State of each vCPU at its first instruction:
//!
//! | what | value |
//! |---|---|
//! | mode | 64-bit long mode, paging on, CPL 3 (`CS` = [`USER_CS`], `SS`/`DS`/`ES`/`FS`/`GS` = [`USER_DS`]) |
//! | paging | `CR3` = [`PML4_GPA`]; all guest memory identity-mapped (GPA = guest virtual address) with 2 MiB pages, writable and user-accessible (RAM below 3 GiB, RAM from 4 GiB up when there is more, and the virtio-mmio window) |
//! | `RIP` | the ELF entry point |
//! | `RSP` | top of this vCPU's own stack, 16-byte aligned, no return address pushed; each stack is [`BootInfo::stack_size`] bytes |
//! | `RDI` | this vCPU's index, `0..num_vcpus` |
//! | `RSI` | GPA of the [`BootInfo`] page ([`BOOT_INFO_GPA`]) |
//! | `RFLAGS` | `0x3002`: IOPL 3 (ring 3 may use port I/O), interrupts off |
//! | `CR4` | PAE, OSFXSR, OSXMMEXCPT; TSD clear, so `rdtsc` works in ring 3 |
//! | IDT | empty: any exception is a triple fault, which ends the VM |
//!
//! The guest ELF must load at or above [`KERNEL_MIN_GPA`].

/// GPA of the global descriptor table the VMM writes (entries below).
pub const GDT_GPA: u64 = 0x500;
/// Kernel 64-bit code segment selector (GDT entry 1).
pub const KERNEL_CS: u16 = 0x08;
/// Kernel data segment selector (GDT entry 2).
pub const KERNEL_DS: u16 = 0x10;
/// User 64-bit code segment selector (GDT entry 3, RPL 3).
pub const USER_CS: u16 = 0x18 | 3;
/// User data segment selector (GDT entry 4, RPL 3).
pub const USER_DS: u16 = 0x20 | 3;

/// GPA of the [`BootInfo`] structure.
pub const BOOT_INFO_GPA: u64 = 0x7000;
/// GPA of the top-level page table (PML4); the PDPT follows at +4 KiB and the
/// page directories after it.
pub const PML4_GPA: u64 = 0x9000;
/// GPA of the NUL-terminated kernel command line.
pub const CMDLINE_GPA: u64 = 0x20000;
/// Largest command line in bytes, including the terminating NUL.
pub const CMDLINE_MAX: usize = 0x1000;
/// Lowest GPA a guest ELF segment (and its entry point) may use: 1 MiB, as
/// for Linux (`CONFIG_PHYSICAL_START` is never lower).
pub const KERNEL_MIN_GPA: u64 = 0x10_0000;

/// `BootInfo::magic`: ASCII "STAGEVM1" read as a little-endian u64.
pub const BOOT_INFO_MAGIC: u64 = u64::from_le_bytes(*b"STAGEVM1");
/// Current `BootInfo::version`: 2 added RAM above 4 GiB
/// (`high_mem_start`, `high_mem_size`).
pub const BOOT_INFO_VERSION: u32 = 2;

/// What the VMM tells the guest at boot, at [`BOOT_INFO_GPA`].
///
/// All addresses are GPAs; all sizes are in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BootInfo {
    /// [`BOOT_INFO_MAGIC`].
    pub magic: u64,
    /// [`BOOT_INFO_VERSION`].
    pub version: u32,
    /// Number of vCPUs started (each gets its index in `RDI`).
    pub num_vcpus: u32,
    /// Size of guest RAM in bytes. RAM below 3 GiB is one range from GPA 0
    /// of `mem_size - high_mem_size` bytes; the rest is at `high_mem_start`.
    pub mem_size: u64,
    /// GPA of the command line ([`CMDLINE_GPA`]).
    pub cmdline_gpa: u64,
    /// Length of the command line in bytes, without the terminating NUL.
    pub cmdline_len: u64,
    /// First free GPA after the loaded image, 4 KiB aligned.
    pub free_start: u64,
    /// End (exclusive) of free memory: the lowest vCPU stack starts here.
    pub free_end: u64,
    /// Size of each vCPU's stack in bytes. With `low = mem_size -
    /// high_mem_size`, vCPU `i`'s stack is `[low - (i + 1) * stack_size,
    /// low - i * stack_size)`.
    pub stack_size: u64,
    /// Guest TSC frequency in kHz as KVM reports it, 0 if unknown.
    pub tsc_khz: u64,
    /// GPA of the RAM above the 32-bit MMIO hole (4 GiB), 0 without any.
    pub high_mem_start: u64,
    /// Bytes of RAM at `high_mem_start` (0 with at most 3 GiB of RAM).
    pub high_mem_size: u64,
}

const _: () = assert!(core::mem::size_of::<BootInfo>() == 88);
const _: () = assert!(core::mem::offset_of!(BootInfo, mem_size) == 16);
const _: () = assert!(core::mem::offset_of!(BootInfo, tsc_khz) == 64);

impl BootInfo {
    /// True when `magic` and `version` are the ones this crate describes.
    pub fn is_valid(&self) -> bool {
        self.magic == BOOT_INFO_MAGIC && self.version == BOOT_INFO_VERSION
    }
}
