//! `stage-vmm`: a second embedder of the stage device (docs/embedding.md),
//! kept small on purpose. It boots stagevm's ring-3 test guest
//! (`stagevm-arch`) on `/dev/kvm` with rust-vmm crates only (`kvm-ioctls`,
//! `vm-memory`, `linux-loader`), dispatches port I/O through `vm-device`'s
//! `IoManager` (the UART and the stage channel's doorbell ports,
//! [`StagePorts`], which take no lock of their own), runs
//! `stage_device::sched::run_loop` on a thread of its own, and at the
//! guest's shutdown prints what the stage device counted:
//!
//! ```text
//! stage-vmm: stage parse events 1200
//! stage-vmm: registrations 1, map changes 3, exit 0
//! ```
//!
//! No virtio, no API, no seccomp: `stagevm` (`vmm/`) is the VMM to run.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use host_sched::config::{Config, Overrides};
use host_sched::topology::Topology;
use host_sched::vm::Setup;
use hypercall_abi::boot::KERNEL_MIN_GPA;
use hypercall_abi::platform::{
    EXIT_GUEST_FAILURE, SERIAL_LSR, SERIAL_LSR_THR_EMPTY, SERIAL_PORT_BASE, SERIAL_PORT_COUNT,
    SERIAL_THR, SHUTDOWN_PORT, VCPU_STOP_PORT,
};
use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd};
use linux_loader::loader::{elf::Elf, KernelLoader};
use stage_device::ports::StagePorts;
use stage_device::sched::StageSched;
use stage_device::stage::{StageDevice, DEFAULT_DRAIN_PERIOD_US};
use stagevm_arch::{layout, memory, regs};
use vm_device::bus::{PioAddress, PioAddressOffset, PioRange};
use vm_device::device_manager::{IoManager, PioManager};
use vm_device::DevicePio;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

/// Boots a ring-3 stagevm guest with its vCPUs staged.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The guest ELF (stagevm's test guest).
    kernel: PathBuf,
    /// The guest's command line.
    #[arg(long, default_value = "")]
    cmdline: String,
    /// vCPUs.
    #[arg(long, default_value_t = 2)]
    vcpus: u32,
    /// Guest RAM (MiB).
    #[arg(long, default_value_t = 256)]
    memory_mib: u64,
    /// The stage policy (host-sched's: static, proportional, auto, …).
    #[arg(long, default_value = "static")]
    policy: String,
}

/// COM1's transmit side: each byte the guest writes goes to stdout, and
/// the line status always says the holding register is empty.
struct Serial;

impl DevicePio for Serial {
    fn pio_read(&self, _base: PioAddress, offset: PioAddressOffset, data: &mut [u8]) {
        if let Some(b) = data.first_mut() {
            *b = if offset == SERIAL_LSR {
                SERIAL_LSR_THR_EMPTY | 0x40
            } else {
                0
            };
        }
    }

    fn pio_write(&self, _base: PioAddress, offset: PioAddressOffset, data: &[u8]) {
        if offset == SERIAL_THR {
            let _ = std::io::stdout()
                .lock()
                .write_all(&data[..data.len().min(1)]);
        }
    }
}

/// What ends the VM: the guest's shutdown code (or a failure's), and the
/// `EventFd` the main thread waits on; the vCPUs still running (the last
/// to stop without a shutdown is a guest failure, as in stagevm).
struct Exit {
    code: AtomicU32,
    fd: EventFd,
    running: AtomicU32,
}

impl Exit {
    fn request(&self, code: u32) {
        // The first reason wins.
        let _ = self
            .code
            .compare_exchange(u32::MAX, code, Ordering::AcqRel, Ordering::Acquire);
        let _ = self.fd.write(1);
    }
}

/// vCPU `index`'s thread: records itself with the pinner, then runs the
/// guest until it stops this vCPU, shuts the VM down or fails.
fn run_vcpu(mut fd: VcpuFd, index: u32, io: &IoManager, sched: &StageSched, exit: &Exit) {
    sched.pinner().start_vcpu_thread(index);
    loop {
        match fd.run() {
            Ok(VcpuExit::IoOut(VCPU_STOP_PORT, _)) => {
                if exit.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                    exit.request(u32::from(EXIT_GUEST_FAILURE));
                }
                return;
            }
            Ok(VcpuExit::IoOut(SHUTDOWN_PORT, data)) => {
                let mut raw = [0u8; 4];
                raw[..data.len().min(4)].copy_from_slice(&data[..data.len().min(4)]);
                return exit.request(u32::from_le_bytes(raw).min(255));
            }
            // Ports nothing serves read as zero and ignore writes.
            Ok(VcpuExit::IoOut(port, data)) => {
                let _ = io.pio_write(PioAddress(port), data);
            }
            Ok(VcpuExit::IoIn(port, data)) => {
                data.fill(0);
                let _ = io.pio_read(PioAddress(port), data);
            }
            Err(e) if e.errno() == libc::EINTR => {}
            Ok(other) => {
                eprintln!("stage-vmm: vCPU {index}: exit {other:?}");
                return exit.request(u32::from(EXIT_GUEST_FAILURE));
            }
            Err(e) => {
                eprintln!("stage-vmm: vCPU {index}: KVM_RUN: {e}");
                return exit.request(u32::from(EXIT_GUEST_FAILURE));
            }
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mem_size = args.memory_mib << 20;
    if args.vcpus == 0 || mem_size > layout::UNIKERNEL_MAX_MEMORY {
        bail!(
            "--vcpus {} --memory-mib {}: need at least one vCPU and at most {} MiB",
            args.vcpus,
            args.memory_mib,
            layout::UNIKERNEL_MAX_MEMORY >> 20
        );
    }

    // The VM and its memory: the layout's RAM ranges, one slot each.
    let kvm = Kvm::new().context("opening /dev/kvm")?;
    let vm = kvm.create_vm().context("KVM_CREATE_VM")?;
    let mem = memory::anonymous(mem_size).context("guest memory")?;
    memory::register(&vm, &mem)?;

    // The guest ELF, its vCPUs in ring 3 (hypercall_abi::boot), the boot
    // structures.
    let mut image =
        File::open(&args.kernel).with_context(|| format!("{}", args.kernel.display()))?;
    let loaded = Elf::load(&mem, None, &mut image, Some(GuestAddress(KERNEL_MIN_GPA)))
        .with_context(|| format!("loading {}", args.kernel.display()))?;
    let cpuid = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)?;
    let vcpus = (0..args.vcpus)
        .map(|i| {
            let fd = vm.create_vcpu(u64::from(i))?;
            regs::configure(
                &fd,
                i,
                &cpuid,
                loaded.kernel_load.0,
                layout::stack_top(mem_size, i),
            )?;
            Ok(fd)
        })
        .collect::<Result<Vec<VcpuFd>, kvm_ioctls::Error>>()
        .context("creating the vCPUs")?;
    let tsc_khz = vcpus[0].get_tsc_khz().map(u64::from).unwrap_or(0);
    layout::write_boot_structures(
        &mem,
        mem_size,
        args.vcpus,
        loaded.kernel_end,
        &args.cmdline,
        tsc_khz,
    )
    .context("writing the boot structures")?;

    // The stage device and its scheduling (the operator's budgets: a
    // policy on this host's CPUs).
    let device = Arc::new(StageDevice::new(
        Arc::new(mem.clone()),
        layout::ram_end(mem_size),
        args.vcpus,
        tsc_khz,
        DEFAULT_DRAIN_PERIOD_US,
    ));
    let overrides = Overrides {
        policy: Some(args.policy.clone()),
        ..Default::default()
    };
    let setup = Setup::new(Config::default_stages(), &overrides, Topology::detect()?)?;
    let sched = StageSched::new(&setup, args.vcpus, Some(device.clone()))?;

    // Port I/O: the UART and the doorbell ports on vm-device's manager.
    let mut io = IoManager::new();
    io.register_pio(
        PioRange::new(PioAddress(SERIAL_PORT_BASE), SERIAL_PORT_COUNT)?,
        Arc::new(Serial),
    )?;
    io.register_pio(
        StagePorts::<Arc<GuestMemoryMmap>>::range()?,
        Arc::new(StagePorts::new(sched.clone())),
    )?;
    let (io, exit) = (
        Arc::new(io),
        Arc::new(Exit {
            code: AtomicU32::new(u32::MAX),
            fd: EventFd::new(0)?,
            running: AtomicU32::new(args.vcpus),
        }),
    );

    for (i, fd) in vcpus.into_iter().enumerate() {
        let (io, sched, exit) = (io.clone(), sched.clone(), exit.clone());
        std::thread::Builder::new()
            .name(format!("vcpu{i}"))
            .spawn(move || run_vcpu(fd, i as u32, &io, &sched, &exit))?;
    }
    // The loop's own stop (main reads `exit.fd`, which resets it).
    let (looped, stop) = (sched.clone(), EventFd::new(0)?);
    let stop_fd = stop.try_clone()?;
    let scheduler = std::thread::Builder::new()
        .name("stage-sched".into())
        .spawn(move || {
            looped.pinner().start_helper_thread("stage-sched");
            let drain = Duration::from_micros(DEFAULT_DRAIN_PERIOD_US);
            stage_device::sched::run_loop(&looped, drain, &stop_fd, || Ok(()))
        })?;

    // The end: wait for it, let parked vCPUs return, stop the loop, report.
    exit.fd.read()?;
    device.stop();
    stop.write(1)?;
    let _ = scheduler.join();
    let (channel, report) = sched.finish();
    let code = exit.code.load(Ordering::Acquire);
    let mut out = std::io::stdout().lock();
    for stage in channel.iter().flat_map(|c| &c.stages) {
        writeln!(
            out,
            "stage-vmm: stage {} events {}",
            stage.name, stage.events
        )?;
    }
    let registrations = channel.as_ref().map_or(0, |c| c.registrations);
    writeln!(
        out,
        "stage-vmm: registrations {registrations}, map changes {}, exit {code}",
        report.map_changes
    )?;
    out.flush()?;
    // The vCPU threads may still be in KVM_RUN (a vCPU the guest left
    // spinning): the process's exit ends them.
    std::process::exit(code.min(255) as i32)
}
