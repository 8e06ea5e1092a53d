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

use crate::config::VmConfig;
use crate::devices::Devices;
use crate::kernel::{self, KernelError};
use crate::layout::{self, STACK_SIZE};
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
        let (mut kernel_file, extent) = kernel::inspect(&config.kernel).map_err(kernel_err)?;
        if config.cmdline.len() >= CMDLINE_MAX {
            return Err(VmmError::CmdlineTooLong {
                len: config.cmdline.len(),
                max: CMDLINE_MAX - 1,
            });
        }

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
        let image_end = extent.end.max(FIXED_AREA_END);
        let needed =
            image_end.next_multiple_of(layout::PAGE_SIZE) + u64::from(num_vcpus) * STACK_SIZE;
        if needed > size {
            return Err(VmmError::MemoryTooSmall {
                size,
                image_end: extent.end,
                vcpus: num_vcpus,
                stack: STACK_SIZE >> 10,
                needed,
                needed_mib: needed.div_ceil(1 << 20),
            });
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

        let entry = kernel::load(&memory, &mut kernel_file).map_err(kernel_err)?;
        let cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
        let mut vcpus = Vec::with_capacity(num_vcpus as usize);
        for index in 0..num_vcpus {
            let fd = vm_fd
                .create_vcpu(u64::from(index))
                .map_err(kvm_err("KVM_CREATE_VCPU"))?;
            vcpu::configure(&fd, index, &cpuid, entry, layout::stack_top(size, index))
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
        if cmdline.len() >= CMDLINE_MAX {
            return Err(VmmError::CmdlineTooLong {
                len: cmdline.len(),
                max: CMDLINE_MAX - 1,
            });
        }
        let info =
            layout::write_boot_structures(&memory, size, num_vcpus, extent.end, &cmdline, tsc_khz)
                .map_err(|e| VmmError::Memory(e.to_string()))?;
        tracing::info!(
            kernel = %config.kernel.display(),
            entry = format_args!("{entry:#x}"),
            vcpus = num_vcpus,
            memory_mib = size >> 20,
            free = format_args!("[{:#x}, {:#x})", info.free_start, info.free_end),
            tsc_khz,
            "VM built"
        );

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
