//! Building a VM from a [`VmConfig`], as a sequence of named steps
//! ([`build`]): open and check the kernel, open KVM, fit the stage
//! configuration to the vCPU count (host-sched), check the memory size,
//! create the VM and its memory, load the kernel, create the vCPUs, attach
//! the disks, write the boot structures, and wire the stage device, the
//! device bus and the stage scheduler.

use std::sync::Arc;

use hypercall_abi::boot::CMDLINE_MAX;
use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::arch::x86_64::kernel::{self, BzImageInfo, ImageExtent, KernelImage};
use crate::arch::x86_64::linux::{self, LinuxEntry};
use crate::config::{BootMode, VmConfig};
use crate::devices::virtio;
use crate::devices::Bus;
use crate::error::{kvm_err, MemoryError, VmmError};
use crate::exit::ExitEvent;
use crate::vmm::Vmm;
use stage_device::sched::StageSched;
use stage_device::stage::StageDevice;
use stagevm_arch::layout::{self, STACK_SIZE};
use stagevm_arch::regs;

mod devices;
use devices::{attach_disks, attach_nets};

use crate::arch::x86_64::linux::LINUX_MIN_FREE;

/// Lowest GPA free for the kernel image and the guest: everything below holds
/// the fixed boot structures of [`hypercall_abi::boot`].
const FIXED_AREA_END: u64 = hypercall_abi::boot::KERNEL_MIN_GPA;
/// Most vCPUs of a Linux guest: its MADT names each by an 8-bit xAPIC ID.
pub const MAX_LINUX_VCPUS: u32 = 255;
/// Largest `--initramfs` (bytes): it must fit in guest RAM (≤ 3 GiB) beside
/// the kernel, and it is read whole into the VMM first.
pub const MAX_INITRAMFS: u64 = 2 << 30;

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
    fn choose(mode: BootMode, image: KernelImage) -> Result<Self, &'static str> {
        match (mode, image) {
            (BootMode::Auto, KernelImage::Elf(f, e)) => Ok(match e.pvh_entry {
                Some(entry) => Boot::Pvh(f, e, entry),
                None => Boot::Unikernel(f, e),
            }),
            (BootMode::Unikernel, KernelImage::Elf(f, e)) => Ok(Boot::Unikernel(f, e)),
            (BootMode::Pvh, KernelImage::Elf(f, e)) => match e.pvh_entry {
                Some(entry) => Ok(Boot::Pvh(f, e, entry)),
                None => Err(
                    "the ELF has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): not a Linux vmlinux built with CONFIG_PVH",
                ),
            },
            (BootMode::Auto | BootMode::BzImage, KernelImage::BzImage(f, info)) => {
                Ok(Boot::BzImage(f, info))
            }
            (BootMode::BzImage, KernelImage::Elf(..)) => {
                Err("the kernel is an ELF, not a bzImage (use --boot-mode pvh or auto)")
            }
            (BootMode::Unikernel | BootMode::Pvh, KernelImage::BzImage(..)) => {
                Err("the kernel is a bzImage, which boots only with --boot-mode bzimage or auto")
            }
        }
    }
}

/// The kernel, the boot protocol chosen for it and its initramfs.
struct Image {
    boot: Boot,
    /// Longest command line the kernel reads, without the NUL (bytes).
    cmdline_max: usize,
    initramfs: Option<Vec<u8>>,
}

/// Step 1: opens the kernel, chooses the boot protocol, checks the command
/// line and vCPU count against it and reads the initramfs.
fn open_image(config: &VmConfig) -> Result<Image, VmmError> {
    let path = config.kernel.display().to_string();
    let image = kernel::open(&config.kernel).map_err(|source| VmmError::Kernel {
        path: path.clone(),
        source,
    })?;
    let boot_mode_err = |reason| VmmError::BootMode {
        mode: config.boot_mode.name(),
        path: path.clone(),
        reason,
    };
    let boot = Boot::choose(config.boot_mode, image).map_err(|why| boot_mode_err(why.into()))?;
    let cmdline_max = match &boot {
        Boot::Unikernel(..) => CMDLINE_MAX - 1,
        Boot::Pvh(..) => linux::LINUX_CMDLINE_MAX - 1,
        Boot::BzImage(_, info) => match info.cmdline_size {
            0 => linux::LINUX_CMDLINE_MAX - 1,
            n => (n as usize).min(CMDLINE_MAX - 1),
        },
    };
    check_cmdline(&config.cmdline, cmdline_max)?;
    if boot.is_linux() && config.cpus.boot > MAX_LINUX_VCPUS {
        return Err(boot_mode_err(format!(
            "--cpus boot={}: a Linux guest gets at most {MAX_LINUX_VCPUS} vCPUs (8-bit xAPIC IDs in the ACPI MADT)",
            config.cpus.boot
        )));
    }
    if let Some(initramfs) = &config.initramfs {
        crate::config::check_input_file(initramfs, MAX_INITRAMFS).map_err(|e| {
            VmmError::Initramfs {
                path: initramfs.display().to_string(),
                reason: e.to_string(),
            }
        })?;
    }
    let initramfs = match (&config.initramfs, boot.is_linux()) {
        (None, _) => None,
        (Some(initramfs), false) => {
            return Err(VmmError::Initramfs {
                path: initramfs.display().to_string(),
                reason: format!(
                    "'{path}' is booted as a ring-3 unikernel, which takes no initramfs; only Linux kernels (PVH vmlinux, bzImage) do"
                ),
            })
        }
        (Some(initramfs), true) => {
            Some(std::fs::read(initramfs).map_err(|e| VmmError::Initramfs {
                path: initramfs.display().to_string(),
                reason: e.to_string(),
            })?)
        }
    };
    Ok(Image {
        boot,
        cmdline_max,
        initramfs,
    })
}

fn check_cmdline(cmdline: &str, max: usize) -> Result<(), VmmError> {
    if cmdline.len() > max {
        return Err(VmmError::CmdlineTooLong {
            len: cmdline.len(),
            max,
        });
    }
    Ok(())
}

/// Step 2: opens `/dev/kvm` and checks the vCPU count against it and the
/// stage channel.
fn open_kvm(config: &VmConfig) -> Result<Kvm, VmmError> {
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
    if num_vcpus as usize > hypercall_abi::stage::MAX_VCPUS && config.stage_device {
        return Err(VmmError::StageChannelVcpus {
            vcpus: num_vcpus,
            max: hypercall_abi::stage::MAX_VCPUS,
        });
    }
    Ok(kvm)
}

/// Step 3: checks that RAM holds the image and, for Linux, the initramfs
/// and [`LINUX_MIN_FREE`], or for the unikernel the vCPU stacks; returns
/// where the initramfs goes (GPA, bytes).
fn check_memory(config: &VmConfig, image: &Image) -> Result<Option<(u64, u64)>, VmmError> {
    let size = config.memory.size;
    let boot = &image.boot;
    let image_end = boot.image_end().max(FIXED_AREA_END);
    // An image header can put its end anywhere below 2^64: round with care.
    let image_pages_end = image_end
        .checked_next_multiple_of(layout::PAGE_SIZE)
        .unwrap_or(u64::MAX);
    let num_vcpus = config.cpus.boot;
    if !boot.is_linux() {
        if size > layout::UNIKERNEL_MAX_MEMORY {
            return Err(VmmError::UnikernelMemory {
                size,
                max: layout::UNIKERNEL_MAX_MEMORY,
            });
        }
        // The image and the stacks live below the MMIO hole.
        let needed = image_pages_end.saturating_add(u64::from(num_vcpus) * STACK_SIZE);
        if needed > layout::low_ram(size) {
            return Err(VmmError::MemoryTooSmall {
                size,
                image_end: boot.image_end(),
                vcpus: num_vcpus,
                stack: STACK_SIZE >> 10,
                needed,
                needed_mib: needed.div_ceil(1 << 20),
            });
        }
        return Ok(None);
    }
    let len = image.initramfs.as_ref().map_or(0, |b| b.len() as u64);
    let needed = image_pages_end
        .saturating_add(len.next_multiple_of(layout::PAGE_SIZE))
        .saturating_add(LINUX_MIN_FREE);
    let max_end = match boot {
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
    Ok(image
        .initramfs
        .as_ref()
        .zip(at)
        .map(|(b, at)| (at, b.len() as u64)))
}

/// Step 4: creates the KVM VM; a Linux guest also gets the in-kernel PIC,
/// IOAPIC and local APICs (before the vCPUs) and the PIT.
fn create_vm(kvm: &Kvm, linux: bool) -> Result<VmFd, VmmError> {
    let vm_fd = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    if linux {
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
    Ok(vm_fd)
}

/// Step 5: loads the kernel (and the initramfs at `initramfs_at`); returns
/// the entry point, the Linux entry protocol and a bzImage's setup header.
fn load_kernel(
    config: &VmConfig,
    memory: &GuestMemoryMmap,
    image: Image,
    initramfs_at: Option<(u64, u64)>,
) -> Result<
    (
        u64,
        Option<LinuxEntry>,
        Option<linux_loader::bootparam::setup_header>,
    ),
    VmmError,
> {
    let kernel_err = |source| VmmError::Kernel {
        path: config.kernel.display().to_string(),
        source,
    };
    let loaded = match image.boot {
        Boot::Unikernel(mut file, _) => {
            let (entry, _) = kernel::load(memory, &mut file).map_err(kernel_err)?;
            (entry, None, None)
        }
        Boot::Pvh(mut file, _, note_entry) => {
            let (_, pvh) = kernel::load(memory, &mut file).map_err(kernel_err)?;
            let entry = pvh.unwrap_or(note_entry);
            (entry, Some(LinuxEntry::Pvh(entry)), None)
        }
        Boot::BzImage(mut file, info) => {
            let hdr = kernel::load_bzimage(memory, &mut file).map_err(kernel_err)?;
            let entry = info.load_addr + linux::BZIMAGE_ENTRY64_OFFSET;
            (entry, Some(LinuxEntry::BzImage64(entry)), Some(hdr))
        }
    };
    if let (Some(bytes), Some((at, _))) = (&image.initramfs, initramfs_at) {
        use vm_memory::Bytes;
        memory
            .write_slice(bytes, GuestAddress(at))
            .map_err(|source| MemoryError::Write {
                what: format!("initramfs at {at:#x}"),
                source,
            })?;
    }
    Ok(loaded)
}

/// Step 6: creates and configures every vCPU for the ring-3 boot (`linux`
/// `None`) or the Linux entry.
fn create_vcpus(
    kvm: &Kvm,
    vm_fd: &VmFd,
    config: &VmConfig,
    entry: u64,
    linux: Option<LinuxEntry>,
) -> Result<Vec<VcpuFd>, VmmError> {
    let cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
    (0..config.cpus.boot)
        .map(|index| {
            let fd = vm_fd
                .create_vcpu(u64::from(index))
                .map_err(kvm_err("KVM_CREATE_VCPU"))?;
            let rsp = layout::stack_top(config.memory.size, index);
            match linux {
                None => regs::configure(&fd, index, &cpuid, entry, rsp),
                Some(linux_entry) => linux::configure_vcpu(&fd, index, &cpuid, linux_entry),
            }
            .map_err(kvm_err("vCPU register set-up"))?;
            Ok(fd)
        })
        .collect()
}

/// Appends `word` to the kernel command line, space-separated.
fn append_word(cmdline: &mut String, word: &str) {
    if !cmdline.is_empty() {
        cmdline.push(' ');
    }
    cmdline.push_str(word);
}

/// Step 8: writes the boot structures: the ring-3 boot's GDT, page tables
/// and boot info, or Linux's zero page / PVH start info and ACPI tables.
fn write_boot_structures(
    config: &VmConfig,
    memory: &GuestMemoryMmap,
    boot: &BootPlan,
    cmdline: &str,
    tsc_khz: u64,
) -> Result<(), VmmError> {
    let memory_err = |source| MemoryError::Write {
        what: "the boot structures".into(),
        source,
    };
    let (size, num_vcpus) = (config.memory.size, config.cpus.boot);
    let Some(linux_entry) = boot.linux else {
        let info = layout::write_boot_structures(
            memory,
            size,
            num_vcpus,
            boot.image_end,
            cmdline,
            tsc_khz,
        )
        .map_err(memory_err)?;
        tracing::info!(
            kernel = %config.kernel.display(),
            entry = format_args!("{:#x}", boot.entry),
            vcpus = num_vcpus,
            memory_mib = size >> 20,
            free = format_args!("[{:#x}, {:#x})", info.free_start, info.free_end),
            tsc_khz,
            "VM built (ring-3 unikernel)"
        );
        return Ok(());
    };
    linux::write_common(memory, cmdline).map_err(memory_err)?;
    let devices = crate::arch::x86_64::acpi::Devices {
        serial: Some((hypercall_abi::platform::SERIAL_PORT_BASE, linux::SERIAL_GSI)),
        virtio_mmio: (0..config.disks.len() + config.nets.len())
            .map(|i| {
                let (base, gsi) = virtio::slot(i);
                (base, stagevm_arch::layout::MMIO_SIZE as u32, gsi)
            })
            .collect(),
    };
    let rsdp =
        crate::arch::x86_64::acpi::write_tables(memory, num_vcpus, &devices).map_err(memory_err)?;
    match boot.setup_header {
        Some(hdr) => {
            linux::write_bzimage(memory, size, hdr, cmdline.len(), boot.initramfs_at, rsdp)
        }
        None => linux::write_pvh(memory, size, boot.initramfs_at, rsdp),
    }
    .map_err(memory_err)?;
    tracing::info!(
        kernel = %config.kernel.display(),
        entry = ?linux_entry,
        vcpus = num_vcpus,
        memory_mib = size >> 20,
        initramfs = ?boot.initramfs_at,
        tsc_khz,
        "VM built (Linux)"
    );
    Ok(())
}

/// Where the kernel was loaded and how it starts.
struct BootPlan {
    entry: u64,
    linux: Option<LinuxEntry>,
    setup_header: Option<linux_loader::bootparam::setup_header>,
    image_end: u64,
    initramfs_at: Option<(u64, u64)>,
}

/// Builds a VM: every step above, in order. Errors name the bad value (see
/// [`VmmError`]).
pub fn build(config: &VmConfig) -> Result<Vmm, VmmError> {
    let image = open_image(config)?;
    let kvm = open_kvm(config)?;
    let num_vcpus = config.cpus.boot;
    let initramfs_at = check_memory(config, &image)?;
    let image_end = image.boot.image_end().max(FIXED_AREA_END);
    let (cmdline_max, linux_boot) = (image.cmdline_max, image.boot.is_linux());
    let vm_fd = create_vm(&kvm, linux_boot)?;
    let memory = crate::vstate::memory::create(&vm_fd, config.memory)?;
    let (entry, linux, setup_header) = load_kernel(config, &memory, image, initramfs_at)?;
    let vcpus = create_vcpus(&kvm, &vm_fd, config, entry, linux)?;
    let tsc_khz = vcpus[0].get_tsc_khz().map(u64::from).unwrap_or(0);
    let mut cmdline = config.cmdline.clone();
    // A Linux guest reads its devices' interrupts from the DSDT unless ACPI
    // is off (then from the command line, with the legacy PIC routing them).
    let acpi = linux.is_some() && !cmdline.split_whitespace().any(|w| w == "acpi=off");
    let blocks = attach_disks(&vm_fd, config, &mut cmdline, linux.is_some(), acpi)?;
    let nets = attach_nets(&vm_fd, config, &mut cmdline, linux.is_some(), acpi)?;
    if linux.is_some() && tsc_khz != 0 && !cmdline.contains("tsc_early_khz=") {
        // The kernel calibrates its TSC against the PIT, which fails when
        // its kernel mode is emulated: tell it KVM's TSC rate.
        append_word(&mut cmdline, &format!("tsc_early_khz={tsc_khz}"));
    }
    check_cmdline(&cmdline, cmdline_max)?;
    let boot = BootPlan {
        entry,
        linux,
        setup_header,
        image_end,
        initramfs_at,
    };
    write_boot_structures(config, &memory, &boot, &cmdline, tsc_khz)?;

    // Step 9: the stage device, the bus, the stage scheduler.
    let stage = config.stage_device.then(|| {
        let device = StageDevice::new(
            Arc::new(memory.clone()),
            layout::ram_end(config.memory.size),
            num_vcpus,
            tsc_khz,
            config.drain_period.as_micros() as u64,
        );
        device.set_trace(config.stage_trace.every);
        Arc::new(device)
    });
    let mut bus = Bus::new(&config.serial, stage.clone(), linux.is_some())?;
    for (block, ioeventfd) in blocks {
        bus.add_block(block, ioeventfd);
    }
    for (net, ioeventfd) in nets {
        bus.add_net(net, ioeventfd);
    }
    if linux.is_some() {
        let fd = bus.serial_irq_fd()?;
        vm_fd
            .register_irqfd(&fd, linux::SERIAL_GSI)
            .map_err(kvm_err("KVM_IRQFD for the serial port"))?;
    }
    let sched = StageSched::new(&config.sched, num_vcpus, stage)?;
    Ok(Vmm {
        exit: Arc::new(ExitEvent::new(num_vcpus)?),
        _kvm: kvm,
        _vm_fd: vm_fd,
        memory,
        vcpus,
        bus: Arc::new(bus),
        sched,
        drain_period: config.drain_period,
        assist_emulation: linux.is_some(),
        seccomp: config.seccomp,
        api: None,
    })
}
