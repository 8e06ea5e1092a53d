//! The VMM's errors: everything that prevents a VM from being built or
//! started, each naming the bad value.

use crate::arch::x86_64::kernel::KernelError;
use crate::arch::x86_64::linux::LINUX_MIN_FREE;

/// Path of the KVM device.
pub const KVM_PATH: &str = "/dev/kvm";

/// Errors that prevent a VM from being built or started. Each message names
/// the bad value.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// `/dev/kvm` cannot be opened.
    #[error("cannot open {KVM_PATH}: {source}{hint}")]
    KvmOpen {
        /// The open error.
        source: kvm_ioctls::Error,
        /// A hint for the common causes.
        hint: &'static str,
    },
    /// The kernel image is missing or bad.
    #[error("kernel '{path}': {source}")]
    Kernel {
        /// The `--kernel` value.
        path: String,
        /// What is wrong with it.
        source: KernelError,
    },
    /// More vCPUs than KVM supports.
    #[error(
        "--cpus boot={requested}: more vCPUs than this KVM supports (KVM_CAP_MAX_VCPUS = {max})"
    )]
    TooManyVcpus {
        /// Requested vCPUs.
        requested: u32,
        /// `KVM_CAP_MAX_VCPUS`.
        max: usize,
    },
    /// `--boot-mode` does not fit the kernel image, or `--initramfs` was given
    /// for a kernel that takes none.
    #[error("--boot-mode {mode}: kernel '{path}': {reason}")]
    BootMode {
        /// The `--boot-mode` value.
        mode: &'static str,
        /// The `--kernel` value.
        path: String,
        /// Why they do not fit.
        reason: String,
    },
    /// The `--initramfs` file cannot be used.
    #[error("--initramfs {path}: {reason}")]
    Initramfs {
        /// The path given.
        path: String,
        /// Why.
        reason: String,
    },
    /// Guest RAM cannot hold a Linux kernel, its initramfs and
    /// [`LINUX_MIN_FREE`].
    #[error("--memory size={}: too small for this Linux kernel: it uses memory up to {image_end:#x}, the initramfs has {initramfs} bytes, and {} MiB more are needed to boot: at least {needed_mib} MiB in all", crate::config::format_size(*.size), LINUX_MIN_FREE >> 20)]
    LinuxMemoryTooSmall {
        /// `--memory size` in bytes.
        size: u64,
        /// First GPA after the kernel's boot-time footprint.
        image_end: u64,
        /// Initramfs size in bytes (0 without one).
        initramfs: u64,
        /// Minimum RAM in MiB, rounded up.
        needed_mib: u64,
    },
    /// More RAM than the ring-3 unikernel's page tables map.
    #[error("--memory size={}: the ring-3 unikernel maps at most {} (its page tables); a Linux guest may have more", crate::config::format_size(*.size), crate::config::format_size(*.max))]
    UnikernelMemory {
        /// `--memory size` in bytes.
        size: u64,
        /// [`stagevm_arch::layout::UNIKERNEL_MAX_MEMORY`].
        max: u64,
    },
    /// The ring-3 image and its vCPU stacks do not fit below the MMIO hole.
    #[error("--memory size={}: too small; the kernel image ends at {image_end:#x} and {vcpus} vCPU stack(s) of {stack} KiB need {needed} bytes ({needed_mib} MiB) in all", crate::config::format_size(*.size))]
    MemoryTooSmall {
        /// `--memory size` in bytes.
        size: u64,
        /// End GPA of the kernel image.
        image_end: u64,
        /// Number of vCPUs.
        vcpus: u32,
        /// Stack size in KiB.
        stack: u64,
        /// Minimum RAM in bytes.
        needed: u64,
        /// Minimum RAM in MiB, rounded up.
        needed_mib: u64,
    },
    /// The command line does not fit its area.
    #[error("--cmdline is {len} bytes; at most {max} are supported")]
    CmdlineTooLong {
        /// Length given.
        len: usize,
        /// Maximum length.
        max: usize,
    },
    /// A KVM ioctl failed.
    #[error("{what}: {source}")]
    Kvm {
        /// What was being done.
        what: &'static str,
        /// The ioctl error.
        source: kvm_ioctls::Error,
    },
    /// A `--disk` file cannot be used.
    #[error("--disk path={path}: {source}")]
    Disk {
        /// The path given.
        path: String,
        /// Why.
        #[source]
        source: crate::devices::virtio::disk::DiskError,
    },
    /// A `--net` tap cannot be used.
    #[error("--net {spec}: {source}")]
    Net {
        /// The option's tap (`tap=NAME` or `fd=N`).
        spec: String,
        /// Why.
        #[source]
        source: crate::devices::virtio::net::tap::TapError,
    },
    /// Guest memory could not be mapped, registered or written.
    #[error("guest memory: {0}")]
    Memory(#[from] MemoryError),
    /// A thread's seccomp filter could not be installed.
    #[error("seccomp filter of the {thread} thread: {source}")]
    Seccomp {
        /// The thread (`main`).
        thread: &'static str,
        /// Why.
        #[source]
        source: crate::seccomp::SeccompError,
    },
    /// The stage channel cannot serve this many vCPUs.
    #[error("--cpus boot={vcpus}: the stage channel supports at most {max} vCPUs (or use --no-stage-device)")]
    StageChannelVcpus {
        /// Requested vCPUs.
        vcpus: u32,
        /// [`hypercall_abi::stage::MAX_VCPUS`].
        max: usize,
    },
    /// Other host I/O failed (serial file, thread spawn).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Maps a KVM ioctl error to [`VmmError::Kvm`] naming `what` was being done.
pub fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Kvm { what, source }
}

/// Why guest memory could not be mapped or written ([`VmmError::Memory`]).
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The anonymous mappings of the RAM ranges failed.
    #[error("{0}")]
    Map(#[from] vm_memory::mmap::FromRangesError),
    /// A huge-page mapping failed; `pool` says what the host's pool holds.
    #[error("--memory hugepages=on: {} of huge pages for GPA {start:#x}: {source}; {pool}", crate::config::format_size(*.len))]
    HugePages {
        /// First GPA of the range.
        start: u64,
        /// Its length in bytes.
        len: u64,
        /// The `mmap` error.
        #[source]
        source: vm_memory::mmap::MmapRegionError,
        /// `/proc/meminfo`'s huge-page pool, or that it has none.
        pool: String,
    },
    /// A range ends past the top of the address space.
    #[error("a region at {0:#x} overflows")]
    Overflow(u64),
    /// The ranges do not form one guest memory (they overlap).
    #[error("{0}")]
    Regions(#[from] vm_memory::GuestRegionCollectionError),
    /// Writing `what` (an initramfs, the boot structures) failed.
    #[error("{what}: {source}")]
    Write {
        /// What was being written, and where.
        what: String,
        /// The guest-memory error.
        #[source]
        source: vm_memory::GuestMemoryError,
    },
}
