//! Building a VM from a [`VmConfig`] and running it to its end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hypercall_abi::boot::CMDLINE_MAX;
use hypercall_abi::platform::{EXIT_GUEST_FAILURE, EXIT_SIGINT, EXIT_SIGTERM};
use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use crate::config::{BootMode, VmConfig};
use crate::devices::Devices;
use crate::kernel::{self, BzImageInfo, ImageExtent, KernelError, KernelImage};
use crate::layout::{self, STACK_SIZE};
use crate::legacy::Legacy;
use crate::linux::{self, LinuxEntry};
use crate::sched::{SchedReport, Scheduler};
use crate::stage::{ChannelReport, StageDevice};
use crate::vcpu::{self, Vcpu, VmEvent};
use crate::virtio;

/// Path of the KVM device.
pub const KVM_PATH: &str = "/dev/kvm";
/// Lowest GPA free for the kernel image and the guest: everything below holds
/// the fixed boot structures of [`hypercall_abi::boot`].
const FIXED_AREA_END: u64 = hypercall_abi::boot::KERNEL_MIN_GPA;
/// How long the control loop keeps kicking vCPU threads before giving up on
/// joining them (the process exit then ends them).
const STOP_TIMEOUT: Duration = Duration::from_secs(2);
/// Interval between kicks of a vCPU thread that has not stopped yet.
const KICK_INTERVAL: Duration = Duration::from_millis(2);
/// RAM a Linux guest needs beyond its image and initramfs (bytes): page
/// tables, slab, the unpacked initramfs' first files. A smaller `--memory`
/// is refused instead of failing deep inside the guest's boot.
pub const LINUX_MIN_FREE: u64 = 32 << 20;
/// Most vCPUs of a Linux guest: its MADT names each by an 8-bit xAPIC ID.
pub const MAX_LINUX_VCPUS: u32 = 255;

/// How the guest is started, decided from `--boot-mode` and the image.
#[derive(Debug)]
enum Boot {
    /// stagevm's ring-3 boot of an ELF.
    Unikernel(std::fs::File, ImageExtent),
    /// PVH entry of an ELF `vmlinux`.
    Pvh(std::fs::File, ImageExtent, u64),
    /// 64-bit entry of a bzImage.
    BzImage(std::fs::File, BzImageInfo),
}

impl Boot {
    fn is_linux(&self) -> bool {
        !matches!(self, Boot::Unikernel(..))
    }

    /// First GPA after what the kernel occupies while it boots.
    fn image_end(&self) -> u64 {
        match self {
            Boot::Unikernel(_, e) | Boot::Pvh(_, e, _) => e.end,
            Boot::BzImage(_, info) => info.end(),
        }
    }

    /// Picks the boot protocol for `image` under `mode`; the error says why
    /// the two do not fit.
    fn choose(mode: BootMode, image: KernelImage) -> Result<Self, String> {
        match (mode, image) {
            (BootMode::Auto, KernelImage::Elf(f, e)) => Ok(match e.pvh_entry {
                Some(entry) => Boot::Pvh(f, e, entry),
                None => Boot::Unikernel(f, e),
            }),
            (BootMode::Unikernel, KernelImage::Elf(f, e)) => Ok(Boot::Unikernel(f, e)),
            (BootMode::Pvh, KernelImage::Elf(f, e)) => match e.pvh_entry {
                Some(entry) => Ok(Boot::Pvh(f, e, entry)),
                None => Err(
                    "the ELF has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): not a Linux vmlinux built with CONFIG_PVH"
                        .into(),
                ),
            },
            (BootMode::Auto | BootMode::BzImage, KernelImage::BzImage(f, info)) => {
                Ok(Boot::BzImage(f, info))
            }
            (BootMode::BzImage, KernelImage::Elf(..)) => {
                Err("the kernel is an ELF, not a bzImage (use --boot-mode pvh or auto)".into())
            }
            (BootMode::Unikernel | BootMode::Pvh, KernelImage::BzImage(..)) => {
                Err("the kernel is a bzImage, which boots only with --boot-mode bzimage or auto".into())
            }
        }
    }
}

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
    /// Guest RAM cannot hold the image plus the vCPU stacks.
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
    #[error("--disk path={path}: {reason}")]
    Disk {
        /// The path given.
        path: String,
        /// Why.
        reason: String,
    },
    /// Guest memory could not be set up.
    #[error("guest memory: {0}")]
    Memory(String),
    /// The stage configuration does not fit this VM.
    #[error("{0}")]
    Sched(String),
    /// Other host I/O failed (serial file, thread spawn).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Kvm { what, source }
}

/// The `stage-sched` thread: drains the rings every `drain_period`, wakes
/// parked vCPUs with queued work, and runs the policy right after the guest
/// registers and then every policy period, until `stop`. A configuration that
/// does not fit the guest ends the VM through `events`.
fn run_stage_sched(
    stage: &StageDevice,
    sched: &Scheduler,
    drain_period: Duration,
    stop: &AtomicBool,
    events: &mpsc::Sender<VmEvent>,
) {
    sched.start_helper_thread("stage-sched");
    let mut next_policy = Instant::now() + sched.period();
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(drain_period);
        stage.drain();
        stage.wake_parked_with_work();
        let first = !sched.has_policy() && stage.stage_names().is_some();
        if first || Instant::now() >= next_policy {
            next_policy = Instant::now() + sched.period();
            sched.adopt_threads();
            if let Err(msg) = sched.tick(stage) {
                let _ = events.send(VmEvent::ConfigError(msg));
                break;
            }
        }
    }
}

/// How a VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmExit {
    /// The guest wrote this code to the shutdown port (clamped to 0..=255).
    Guest(u8),
    /// The guest failed; the text says how and on which vCPU.
    GuestFailure(String),
    /// The VMM received this signal (SIGINT or SIGTERM).
    Signal(i32),
    /// The stage configuration did not fit the guest's stages.
    ConfigError(String),
}

impl VmExit {
    /// The process exit code `stagevm` returns for this end (see
    /// [`hypercall_abi::platform`] for the fixed codes).
    pub fn exit_code(&self) -> u8 {
        match self {
            VmExit::Guest(code) => *code,
            VmExit::GuestFailure(_) => EXIT_GUEST_FAILURE,
            VmExit::ConfigError(_) => hypercall_abi::platform::EXIT_VMM_ERROR,
            VmExit::Signal(libc::SIGINT) => EXIT_SIGINT,
            VmExit::Signal(_) => EXIT_SIGTERM,
        }
    }
}

/// A built VM: memory holds the kernel and boot structures, every vCPU is
/// configured and ready to run.
pub struct Vm {
    // Kept open for the lifetime of the VM.
    _kvm: Kvm,
    _vm_fd: VmFd,
    memory: GuestMemoryMmap,
    vcpus: Vec<VcpuFd>,
    devices: Arc<Devices>,
    stage: Option<Arc<StageDevice>>,
    drain_period: Duration,
    sched: Arc<Scheduler>,
    legacy: Option<Arc<Legacy>>,
}

/// How a VM ended and what its stage channel counted.
#[derive(Debug)]
pub struct RunOutcome {
    /// How the VM ended.
    pub exit: VmExit,
    /// The stage device's counters after the final drain (`None` without a
    /// stage device).
    pub channel: Option<ChannelReport>,
    /// What the scheduler did.
    pub sched: SchedReport,
    /// Per virtio-blk disk, its counters.
    pub disks: Vec<virtio::block::BlockReport>,
}

impl Vm {
    /// Checks the configuration, creates the KVM VM, loads the kernel and
    /// configures every vCPU. Errors name the bad value (see [`VmmError`]).
    pub fn new(config: &VmConfig) -> Result<Self, VmmError> {
        let kernel_err = |source| VmmError::Kernel {
            path: config.kernel.display().to_string(),
            source,
        };
        let image = kernel::open(&config.kernel).map_err(kernel_err)?;
        let boot = Boot::choose(config.boot_mode, image).map_err(|reason| VmmError::BootMode {
            mode: config.boot_mode.name(),
            path: config.kernel.display().to_string(),
            reason,
        })?;
        // Longest command line the kernel reads, without the NUL.
        let cmdline_max = match &boot {
            Boot::Unikernel(..) => CMDLINE_MAX - 1,
            Boot::Pvh(..) => linux::LINUX_CMDLINE_MAX - 1,
            Boot::BzImage(_, info) => match info.cmdline_size {
                0 => linux::LINUX_CMDLINE_MAX - 1,
                n => (n as usize).min(CMDLINE_MAX - 1),
            },
        };
        if config.cmdline.len() > cmdline_max {
            return Err(VmmError::CmdlineTooLong {
                len: config.cmdline.len(),
                max: cmdline_max,
            });
        }
        if boot.is_linux() && config.cpus.boot > MAX_LINUX_VCPUS {
            return Err(VmmError::BootMode {
                mode: config.boot_mode.name(),
                path: config.kernel.display().to_string(),
                reason: format!(
                    "--cpus boot={}: a Linux guest gets at most {MAX_LINUX_VCPUS} vCPUs (8-bit xAPIC IDs in the ACPI MADT)",
                    config.cpus.boot
                ),
            });
        }
        let initramfs = match (&config.initramfs, boot.is_linux()) {
            (None, _) => None,
            (Some(path), false) => {
                return Err(VmmError::Initramfs {
                    path: path.display().to_string(),
                    reason: format!(
                        "'{}' is booted as a ring-3 unikernel, which takes no initramfs; only Linux kernels (PVH vmlinux, bzImage) do",
                        config.kernel.display()
                    ),
                })
            }
            (Some(path), true) => Some(std::fs::read(path).map_err(|e| VmmError::Initramfs {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?),
        };

        let kvm = Kvm::new().map_err(|source| VmmError::KvmOpen {
            hint: match source.errno() {
                libc::ENOENT => " (is the kvm module loaded?)",
                libc::EACCES | libc::EPERM => " (run as root or join the group owning /dev/kvm)",
                _ => "",
            },
            source,
        })?;
        let num_vcpus = config.cpus.boot;
        let max = kvm.get_max_vcpus();
        if num_vcpus as usize > max {
            return Err(VmmError::TooManyVcpus {
                requested: num_vcpus,
                max,
            });
        }

        let mut sched = config.sched.clone();
        let mut sched_warnings = Vec::new();
        let staged = matches!(
            sched.policy,
            host_sched::policy::PolicyKind::Static | host_sched::policy::PolicyKind::Proportional
        );
        if staged && (num_vcpus as usize) < sched.stage_cores.len() {
            // Every stage core needs a vCPU: use the first ones only.
            let all = sched.stage_cores.clone();
            sched.stage_cores = all.iter().take(num_vcpus as usize).collect();
            if sched.helpers_share_stage_cores {
                sched.housekeeping = sched.stage_cores.clone();
            }
            let warning = format!(
                "--cpus boot={num_vcpus} is fewer than the {} stage cores '{all}': the {} policy uses stage cores '{}'",
                all.len(),
                sched.policy.name(),
                sched.stage_cores
            );
            tracing::info!("{warning}");
            sched_warnings.push(warning);
        }
        if num_vcpus as usize > hypercall_abi::stage::MAX_VCPUS && config.stage_device {
            return Err(VmmError::Sched(format!(
                "--cpus boot={num_vcpus}: the stage channel supports at most {} vCPUs (or use --no-stage-device)",
                hypercall_abi::stage::MAX_VCPUS
            )));
        }

        let size = config.memory.size;
        let image_end = boot.image_end().max(FIXED_AREA_END);
        let mut initramfs_at = None;
        if boot.is_linux() {
            let len = initramfs.as_ref().map_or(0, |b| b.len() as u64);
            let needed = image_end.next_multiple_of(layout::PAGE_SIZE)
                + len.next_multiple_of(layout::PAGE_SIZE)
                + LINUX_MIN_FREE;
            let max_end = match &boot {
                Boot::BzImage(_, info) if info.initrd_addr_max != 0 => info.initrd_addr_max + 1,
                _ => 1 << 32,
            };
            let at = linux::initramfs_gpa(size, len, image_end, max_end);
            if needed > size || at.is_none() {
                return Err(VmmError::LinuxMemoryTooSmall {
                    size,
                    image_end,
                    initramfs: len,
                    needed_mib: needed.div_ceil(1 << 20),
                });
            }
            if let (Some(bytes), Some(at)) = (&initramfs, at) {
                initramfs_at = Some((at, bytes.len() as u64));
            }
        } else {
            let extent_end = boot.image_end();
            let needed =
                image_end.next_multiple_of(layout::PAGE_SIZE) + u64::from(num_vcpus) * STACK_SIZE;
            if needed > size {
                return Err(VmmError::MemoryTooSmall {
                    size,
                    image_end: extent_end,
                    vcpus: num_vcpus,
                    stack: STACK_SIZE >> 10,
                    needed,
                    needed_mib: needed.div_ceil(1 << 20),
                });
            }
        }

        let vm_fd = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
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
            // Vm keeps for as long as the VM fd exists.
            unsafe { vm_fd.set_user_memory_region(mem_region) }
                .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
        }

        if boot.is_linux() {
            // Linux needs interrupts: the in-kernel PIC, IOAPIC and local
            // APICs (before the vCPUs) and the PIT.
            if let Err(e) = vm_fd.set_tss_address(linux::KVM_TSS_ADDRESS) {
                tracing::info!("KVM_SET_TSS_ADDR refused ({e}); not needed on this KVM");
            }
            vm_fd
                .create_irq_chip()
                .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
            let pit = kvm_bindings::kvm_pit_config {
                flags: kvm_bindings::KVM_PIT_SPEAKER_DUMMY,
                ..Default::default()
            };
            vm_fd.create_pit2(pit).map_err(kvm_err("KVM_CREATE_PIT2"))?;
        }
        let (entry, linux_entry, setup_header) = match boot {
            Boot::Unikernel(mut file, _) => {
                let (entry, _) = kernel::load(&memory, &mut file).map_err(kernel_err)?;
                (entry, None, None)
            }
            Boot::Pvh(mut file, _, note_entry) => {
                let (_, pvh) = kernel::load(&memory, &mut file).map_err(kernel_err)?;
                let entry = pvh.unwrap_or(note_entry);
                (entry, Some(LinuxEntry::Pvh(entry)), None)
            }
            Boot::BzImage(mut file, info) => {
                let hdr = kernel::load_bzimage(&memory, &mut file).map_err(kernel_err)?;
                let entry = info.load_addr + linux::BZIMAGE_ENTRY64_OFFSET;
                (entry, Some(LinuxEntry::BzImage64(entry)), Some(hdr))
            }
        };
        if let (Some(bytes), Some((at, _))) = (&initramfs, initramfs_at) {
            use vm_memory::Bytes;
            memory
                .write_slice(bytes, GuestAddress(at))
                .map_err(|e| VmmError::Memory(format!("initramfs at {at:#x}: {e}")))?;
        }
        let cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
        let mut vcpus = Vec::with_capacity(num_vcpus as usize);
        for index in 0..num_vcpus {
            let fd = vm_fd
                .create_vcpu(u64::from(index))
                .map_err(kvm_err("KVM_CREATE_VCPU"))?;
            match linux_entry {
                None => vcpu::configure(&fd, index, &cpuid, entry, layout::stack_top(size, index)),
                Some(linux_entry) => linux::configure_vcpu(&fd, index, &cpuid, linux_entry),
            }
            .map_err(kvm_err("vCPU register set-up"))?;
            vcpus.push(fd);
        }
        let tsc_khz = vcpus[0].get_tsc_khz().map(u64::from).unwrap_or(0);
        // virtio-blk disks: open the backing files, describe them on the
        // command line in Linux's format, bind their notifications.
        let mut blocks = Vec::new();
        let mut cmdline = config.cmdline.clone();
        for (i, disk) in config.disks.iter().enumerate() {
            let name = format!("blk{i}");
            let open = std::fs::OpenOptions::new()
                .read(true)
                .write(!disk.readonly)
                .open(&disk.path)
                .and_then(|f| Ok((f.metadata()?.len(), f)));
            let (len, file) = open.map_err(|e| VmmError::Disk {
                path: disk.path.display().to_string(),
                reason: e.to_string(),
            })?;
            if len < virtio::block::SECTOR_SIZE {
                return Err(VmmError::Disk {
                    path: disk.path.display().to_string(),
                    reason: format!("{len} bytes is smaller than one 512-byte sector"),
                });
            }
            let base = virtio::MMIO_BASE + i as u64 * virtio::MMIO_SIZE;
            let block = virtio::MmioBlock::new(
                name,
                disk.path.display().to_string(),
                base,
                virtio::block::Block::new(file, len, disk.readonly),
            )?;
            cmdline = format!(
                "{cmdline} {}",
                block.cmdline_word(virtio::FIRST_IRQ + i as u32)
            )
            .trim_start()
            .to_string();
            let ioeventfd = vm_fd
                .register_ioevent(
                    &block.notify,
                    &kvm_ioctls::IoEventAddress::Mmio(base + 0x50),
                    kvm_ioctls::NoDatamatch,
                )
                .map_err(|e| {
                    tracing::info!("ioeventfd refused ({e}): notifications via MMIO exits")
                })
                .is_ok();
            blocks.push((Arc::new(block), ioeventfd));
        }
        if linux_entry.is_some() && tsc_khz != 0 && !cmdline.contains("tsc_early_khz=") {
            // The kernel calibrates its TSC against the PIT, which fails when
            // its kernel mode is emulated: tell it KVM's TSC rate.
            cmdline = format!("{cmdline} tsc_early_khz={tsc_khz}")
                .trim_start()
                .to_string();
        }
        if cmdline.len() > cmdline_max {
            return Err(VmmError::CmdlineTooLong {
                len: cmdline.len(),
                max: cmdline_max,
            });
        }
        let memory_err = |e: vm_memory::GuestMemoryError| VmmError::Memory(e.to_string());
        match linux_entry {
            None => {
                let info = layout::write_boot_structures(
                    &memory, size, num_vcpus, image_end, &cmdline, tsc_khz,
                )
                .map_err(memory_err)?;
                tracing::info!(
                    kernel = %config.kernel.display(),
                    entry = format_args!("{entry:#x}"),
                    vcpus = num_vcpus,
                    memory_mib = size >> 20,
                    free = format_args!("[{:#x}, {:#x})", info.free_start, info.free_end),
                    tsc_khz,
                    "VM built (ring-3 unikernel)"
                );
            }
            Some(linux_entry) => {
                linux::write_common(&memory, &cmdline).map_err(memory_err)?;
                let rsdp = crate::acpi::write_tables(&memory, num_vcpus).map_err(memory_err)?;
                match setup_header {
                    Some(hdr) => {
                        linux::write_bzimage(&memory, size, hdr, cmdline.len(), initramfs_at, rsdp)
                    }
                    None => linux::write_pvh(&memory, size, initramfs_at, rsdp),
                }
                .map_err(memory_err)?;
                if !config.disks.is_empty() {
                    tracing::warn!(
                        "virtio-blk devices raise no interrupts yet: a Linux driver will wait for completions in vain"
                    );
                }
                tracing::info!(
                    kernel = %config.kernel.display(),
                    entry = ?linux_entry,
                    vcpus = num_vcpus,
                    memory_mib = size >> 20,
                    initramfs = ?initramfs_at,
                    tsc_khz,
                    "VM built (Linux)"
                );
            }
        }

        let stage = config.stage_device.then(|| {
            Arc::new(StageDevice::new(
                memory.clone(),
                size,
                num_vcpus,
                tsc_khz,
                config.drain_period.as_micros() as u64,
            ))
        });
        let mut devices = Devices::new(&config.serial, stage.clone())?;
        for (block, ioeventfd) in blocks {
            devices.add_block(block, ioeventfd);
        }
        let legacy = if linux_entry.is_some() {
            let fd = devices.serial_irq_fd()?;
            vm_fd
                .register_irqfd(&fd, linux::SERIAL_GSI)
                .map_err(kvm_err("KVM_IRQFD for the serial port"))?;
            Some(Arc::new(Legacy::new()))
        } else {
            None
        };
        let devices = Arc::new(devices);
        let sched = Scheduler::new(sched, num_vcpus, sched_warnings);
        if let Some(stage) = &stage {
            stage.set_map_source(sched.clone());
        }
        Ok(Self {
            _kvm: kvm,
            _vm_fd: vm_fd,
            memory,
            vcpus,
            devices,
            stage,
            drain_period: config.drain_period,
            sched,
            legacy,
        })
    }

    /// Runs the VM: one host thread per vCPU (named `vcpu<N>`), a scheduler
    /// thread (`stage-sched`) that drains the stage rings every drain period,
    /// SIGINT and SIGTERM end it. Returns how it ended once every vCPU thread
    /// has stopped (or [`STOP_TIMEOUT`] passed) and the rings were drained a
    /// last time.
    pub fn run(self) -> Result<RunOutcome, VmmError> {
        extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}
        // Interrupts KVM_RUN (EINTR) so a vCPU thread sees the stop flag.
        register_signal_handler(SIGRTMIN(), kick_handler)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;

        // This thread is the VMM's event loop: a helper, on housekeeping cores
        // (threads spawned below inherit that until they pin themselves).
        self.sched.start_helper_thread("vmm-main");
        let (tx, rx) = mpsc::channel();
        let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])?;
        let signal_handle = signals.handle();
        let signal_tx = tx.clone();
        let signal_sched = self.sched.clone();
        let signal_thread =
            std::thread::Builder::new()
                .name("signals".into())
                .spawn(move || {
                    signal_sched.start_helper_thread("signals");
                    if let Some(sig) = signals.forever().next() {
                        let _ = signal_tx.send(VmEvent::Signal(sig));
                    }
                })?;

        let stop = Arc::new(AtomicBool::new(false));
        let num_vcpus = self.vcpus.len();
        let mut threads: Vec<JoinHandle<()>> = Vec::with_capacity(num_vcpus);
        for (index, fd) in self.vcpus.into_iter().enumerate() {
            let vcpu = Vcpu {
                index: index as u32,
                fd,
                devices: self.devices.clone(),
                memory: self.memory.clone(),
                stop: stop.clone(),
                events: tx.clone(),
                sched: self.sched.clone(),
                legacy: self.legacy.clone(),
                assist_emulation: self.legacy.is_some(),
                assists: Default::default(),
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("vcpu{index}"))
                    .spawn(move || vcpu.run())?,
            );
        }
        // One helper I/O thread per block device, on housekeeping cores.
        let mut io_threads = Vec::new();
        for block in self.devices.blocks() {
            let (block, mem, sched) = (block.clone(), self.memory.clone(), self.sched.clone());
            let name = format!("io-{}", block.name);
            io_threads.push(
                std::thread::Builder::new()
                    .name(name.clone())
                    .spawn(move || {
                        sched.start_helper_thread(&name);
                        block.serve(&mem);
                    })?,
            );
        }
        // Threads the VMM did not start itself (KVM's workers) go to the
        // housekeeping cores too; stage-sched repeats this every period.
        self.sched.wait_vcpus_started(Duration::from_secs(1));
        self.sched.adopt_threads();
        let sched_stop = Arc::new(AtomicBool::new(false));
        let sched_thread = match &self.stage {
            Some(stage) => {
                let (stage, sched, stop, tx) = (
                    stage.clone(),
                    self.sched.clone(),
                    sched_stop.clone(),
                    tx.clone(),
                );
                let period = self.drain_period;
                Some(
                    std::thread::Builder::new()
                        .name("stage-sched".into())
                        .spawn(move || run_stage_sched(&stage, &sched, period, &stop, &tx))?,
                )
            }
            None => None,
        };
        drop(tx);

        let mut stopped = 0;
        let exit = loop {
            match rx.recv() {
                Ok(VmEvent::Shutdown { vcpu, code }) => {
                    let clamped = u8::try_from(code).unwrap_or_else(|_| {
                        tracing::warn!(vcpu, code, "guest exit code above 255, using 255");
                        255
                    });
                    tracing::info!(vcpu, code = clamped, "guest requested shutdown");
                    break VmExit::Guest(clamped);
                }
                Ok(VmEvent::VcpuStopped(_)) => {
                    stopped += 1;
                    if stopped == num_vcpus {
                        break VmExit::GuestFailure(
                            "every vCPU stopped without a shutdown request".into(),
                        );
                    }
                }
                Ok(VmEvent::GuestFailure { vcpu, reason }) => {
                    break VmExit::GuestFailure(format!("vCPU {vcpu}: {reason}"));
                }
                Ok(VmEvent::ConfigError(msg)) => break VmExit::ConfigError(msg),
                Ok(VmEvent::Signal(sig)) => {
                    tracing::info!(signal = sig, "signal received, stopping the VM");
                    break VmExit::Signal(sig);
                }
                Err(_) => break VmExit::GuestFailure("all vCPU threads ended".into()),
            }
        };

        stop.store(true, Ordering::Release);
        if let Some(stage) = &self.stage {
            // Parked vCPUs (WAIT) must see the stop too.
            stage.stop();
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            for t in threads.iter().filter(|t| !t.is_finished()) {
                // The thread may finish between the check and the kick.
                let _ = t.kill(SIGRTMIN());
            }
            std::thread::sleep(KICK_INTERVAL);
        }
        for t in threads {
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::error!("a vCPU thread did not stop within {STOP_TIMEOUT:?}");
            }
        }
        signal_handle.close();
        let _ = signal_thread.join();
        sched_stop.store(true, Ordering::Release);
        if let Some(t) = sched_thread {
            let _ = t.join();
        }
        for block in self.devices.blocks() {
            block.stop();
        }
        for t in io_threads {
            let _ = t.join();
        }
        // The guest no longer runs: count what is left in the rings.
        let channel = self.stage.as_ref().map(|stage| {
            stage.drain();
            stage.report()
        });
        self.devices.flush();
        Ok(RunOutcome {
            exit,
            channel,
            sched: self.sched.report(),
            disks: self.devices.block_reports(),
        })
    }
}
