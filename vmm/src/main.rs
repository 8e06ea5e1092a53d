//! `stagevm` command-line entry point.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use hypercall_abi::platform::EXIT_VMM_ERROR;
use stagevm::config::{BootMode, CpusConfig, MemoryConfig, SerialConfig, VmConfig};

/// Boots a guest kernel on /dev/kvm.
///
/// Kernels: stagevm's ring-3 test unikernel (an ELF64 without a PVH note,
/// started directly in ring 3), a Linux vmlinux (an ELF64 with a PVH entry
/// note, started in 32-bit protected mode at that entry) or a Linux bzImage
/// (started in 64-bit mode at its 64-bit entry). Linux guests get an in-kernel
/// interrupt controller and PIT, the serial port on IRQ 4, a CMOS clock, and
/// a reboot (i8042 reset) ends the VM with exit status 0. For Linux, stagevm
/// appends tsc_early_khz=<KVM's TSC rate> to the command line and completes
/// a kernel-mode int3 (injecting #BP) or fwait that KVM fails to emulate.
///
/// Exit status: the code the guest wrote to its shutdown port (0-255);
/// 1 for a configuration or start-up error; 2 when the guest fails (triple
/// fault, KVM internal error such as an emulation failure -- reported with
/// vCPU, RIP and the instruction bytes --, every vCPU stopped); 130 after
/// SIGINT; 143 after SIGTERM.
#[derive(Parser, Debug)]
#[command(name = "stagevm", version, about, long_about)]
struct Cli {
    /// Guest kernel: an ELF64 x86-64 image loaded at or above 1 MiB (the ring-3
    /// unikernel, or a Linux vmlinux with a PVH note), or a Linux bzImage.
    #[arg(long, value_name = "PATH")]
    kernel: PathBuf,

    /// Boot protocol: auto (from the image: ELF without PVH note = unikernel,
    /// ELF with PVH note = pvh, "HdrS" header = bzimage), unikernel (ring-3
    /// boot, ignoring a PVH note), pvh, or bzimage.
    #[arg(
        long,
        value_name = "auto|unikernel|pvh|bzimage",
        default_value = "auto"
    )]
    boot_mode: BootMode,

    /// Initial RAM disk (cpio archive, optionally compressed) for a Linux
    /// kernel, loaded at the top of guest RAM.
    #[arg(long, value_name = "FILE")]
    initramfs: Option<PathBuf>,

    /// Kernel command line (at most 4095 bytes; 2047 for Linux).
    #[arg(long, value_name = "STRING", default_value = "")]
    cmdline: String,

    /// vCPUs: boot=N (1 up to KVM_CAP_MAX_VCPUS; more vCPUs than host cores is fine).
    #[arg(long, value_name = "boot=N", default_value = "boot=1")]
    cpus: CpusConfig,

    /// Guest RAM: size=SIZE with an optional K, M or G suffix (4 KiB multiple, at most
    /// 256G; above 3G it continues from 4 GiB, past the MMIO hole); hugepages=on backs it
    /// with the host's 2 MiB huge pages (size a multiple of 2M; an error names what the
    /// host has when its pool is too small).
    #[arg(
        long,
        value_name = "size=SIZE[,hugepages=on]",
        default_value = "size=256M"
    )]
    memory: MemoryConfig,

    /// Serial console (COM1): tty (stdout, and stdin when it is a terminal), pty (a new
    /// pseudo-terminal, its path printed), socket=PATH (a Unix socket, one client at a
    /// time), null, or file=PATH (output appended).
    #[arg(
        long,
        value_name = "tty|pty|null|file=PATH|socket=PATH",
        default_value = "tty"
    )]
    serial: SerialConfig,

    /// A virtio-blk disk (repeatable): a regular file or a block device;
    /// readonly=on refuses guest writes, direct=on opens it O_DIRECT, id=NAME names it
    /// (default blk<N>). Each appears on the guest command line as
    /// virtio_mmio.device=4K@ADDR:IRQ (Linux guests with ACPI: in the DSDT).
    #[arg(long, value_name = "path=FILE[,readonly=on][,direct=on][,id=NAME]")]
    disk: Vec<stagevm::config::DiskConfig>,

    /// A virtio-net device over a tap (repeatable): tap=NAME[,mac=MAC][,fd=N].
    /// fd= hands over an open tap queue (IFF_TAP|IFF_NO_PI|IFF_VNET_HDR);
    /// without mac= a random locally administered MAC is used. Devices are
    /// placed after the disks.
    #[arg(long, value_name = "tap=NAME[,mac=MAC][,fd=N]")]
    net: Vec<stagevm::config::NetConfig>,

    /// Run without the stage device: the guest's REGISTER fails and its agent
    /// falls back to a no-op.
    #[arg(long)]
    no_stage_device: bool,

    /// How often the scheduler thread drains the stage rings, in µs, while
    /// they need draining (a guest that reports through its rings, or a
    /// trace); otherwise it wakes once per policy period.
    #[arg(long, value_name = "US", default_value_t = stage_device::stage::DEFAULT_DRAIN_PERIOD_US,
          value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    drain_period_us: u64,

    /// Event trace of a guest that reports through stage counters (ABI
    /// minor 2): off, on (every event also goes to its vCPU's ring; a full
    /// ring drops it, counted) or every=N (every Nth event of each kind per
    /// vCPU). The operator API changes it live (PUT /api/v1/stages.trace).
    #[arg(long, value_name = "off|on|every=N", default_value = "off")]
    stage_trace: stagevm::config::TraceConfig,

    /// Per-thread seccomp filters: true (a forbidden syscall ends the VM
    /// with status 2), log (allowed and logged by the kernel) or false.
    #[arg(long, value_name = "true|false|log", default_value = "true")]
    seccomp: stagevm::seccomp::SeccompMode,

    /// Landlock once the VM is built: true (the VMM can then reach only
    /// /proc/self and its API socket's directory in the file system, and
    /// no TCP port; best effort on older kernels, said in the log) or false.
    #[arg(long, value_name = "true|false", default_value = "true")]
    landlock: stagevm::sandbox::LandlockMode,

    /// Stage configuration (TOML: host cores, policy, stage budgets); without it
    /// the embedded default (host-sched/default-stages.toml) is used.
    #[arg(long, value_name = "PATH")]
    stages: Option<PathBuf>,

    /// Scheduling policy, overriding the configuration's: off, pinned, static, proportional, auto.
    #[arg(long, value_name = "NAME")]
    policy: Option<String>,

    /// Stage-visit policy of the guest's vCPU schedulers (temporal staging),
    /// overriding policy.visit: fifo, cohort, srpt, dbr, mg1, color.
    #[arg(long, value_name = "NAME")]
    visit: Option<String>,

    /// Stage cores as a CPU list (e.g. 0-1), overriding host.cores.
    #[arg(long, value_name = "CPUS")]
    stage_cores: Option<String>,

    /// Housekeeping cores for helper threads, overriding host.housekeeping.
    #[arg(long, value_name = "CPUS")]
    housekeeping: Option<String>,

    /// Write the run's report (exit, stage-channel counters) as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    report: Option<PathBuf>,

    /// Serve the operator API on this Unix socket while the VM runs (HTTP/1.1,
    /// mode 0600, removed at exit; refused if a running process serves on it):
    /// GET /api/v1/vm.info, GET /api/v1/stages, PUT /api/v1/stages.policy,
    /// PUT /api/v1/stages.budgets, PUT /api/v1/vm.shutdown, GET /metrics.
    /// stagevm-remote is its client.
    #[arg(long, value_name = "PATH")]
    api_socket: Option<PathBuf>,

    /// Serve GET /metrics (Prometheus text, the API socket's /metrics) over
    /// HTTP on TCP for a Prometheus server to scrape: PORT listens on
    /// 127.0.0.1; ADDR:PORT on that address, which may be reachable from
    /// other machines (SECURITY.md). Nothing else is served there.
    #[arg(long, value_name = "[ADDR:]PORT")]
    metrics_listen: Option<String>,

    /// Log filter for the VMM's own messages on stderr (tracing env-filter syntax,
    /// e.g. "debug" or "stagevm=trace"); RUST_LOG overrides it.
    #[arg(long, value_name = "FILTER", default_value = "warn")]
    log_level: String,
}

/// Loads `--stages` (or the default) and resolves it against this host with
/// the command-line overrides. The error is one line naming key and value.
fn resolve_sched(cli: &Cli) -> anyhow::Result<host_sched::vm::Setup> {
    use host_sched::config::{Config, Overrides};
    let config =
        Config::load_or_default(cli.stages.as_deref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let topo = host_sched::topology::Topology::detect()
        .map_err(|e| anyhow::anyhow!("reading the host CPU topology: {e}"))?;
    let overrides = Overrides {
        cores: cli.stage_cores.clone(),
        housekeeping: cli.housekeeping.clone(),
        policy: cli.policy.clone(),
        visit: cli.visit.clone(),
    };
    host_sched::vm::Setup::new(config, &overrides, topo).map_err(|e| {
        // A value from the file is named with the file; one from a
        // command-line option names the option (`--policy = …`).
        let e = e.to_string();
        match &cli.stages {
            Some(path) if !e.starts_with("--") => {
                anyhow::anyhow!("--stages {}: {e}", path.display())
            }
            _ => anyhow::anyhow!(e),
        }
    })
}

/// Opens `--report PATH` for writing: created with mode 0600 (or
/// truncated), refused if PATH is a symbolic link or not a regular file.
/// The error names the option and the path.
fn open_report(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => anyhow::anyhow!("--report {}: is a symbolic link", path.display()),
            _ => anyhow::anyhow!(
                "--report {}: {}",
                path.display(),
                stagevm_api::paths::describe_path_error(path, &e)
            ),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| anyhow::anyhow!("--report {}: {e}", path.display()))?;
    if !meta.is_file() {
        anyhow::bail!("--report {}: not a regular file", path.display());
    }
    file.set_len(0)
        .map_err(|e| anyhow::anyhow!("--report {}: {e}", path.display()))?;
    Ok(file)
}

/// Fail-stop: a panic on any thread (a vCPU, `stage-sched`, an I/O thread)
/// ends the VMM at once with exit status 2 and the panic message, instead
/// of leaving a VM whose other threads wait for it forever.
fn install_fail_stop() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        eprintln!("stagevm: error: thread '{name}' {info}; ending the VM");
        std::process::exit(i32::from(hypercall_abi::platform::EXIT_GUEST_FAILURE));
    }));
}

/// The stage device is part of the VMM for its operator: a `stagevm=LEVEL`
/// directive without one of its own for the `stage_device` crate covers it
/// too (its warnings, a guest's bad counters among them, went missing when
/// it became a crate of its own).
fn with_stage_device(filter: tracing_subscriber::EnvFilter) -> tracing_subscriber::EnvFilter {
    let text = filter.to_string();
    if text.contains("stage_device") {
        return filter;
    }
    let level = text
        .split(',')
        .find_map(|d| d.trim().strip_prefix("stagevm="))
        .map(str::to_owned);
    match level.and_then(|l| format!("stage_device={l}").parse().ok()) {
        Some(directive) => filter.add_directive(directive),
        None => filter,
    }
}

fn main() -> ExitCode {
    install_fail_stop();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not errors; everything else exits 1,
            // keeping 2 for guest failures.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_VMM_ERROR } else { 0 });
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cli.log_level));
    let filter = match filter {
        // virtio-queue logs every bad queue set-up a guest makes, without a
        // limit; the transport logs the same rate-limited (ratelimit.rs).
        // An explicit virtio_queue directive still wins.
        Ok(f) if !f.to_string().contains("virtio_queue") => with_stage_device(
            f.add_directive("virtio_queue=off".parse().expect("a valid directive")),
        ),
        Ok(f) => with_stage_device(f),
        Err(e) => {
            eprintln!("stagevm: invalid --log-level '{}': {e}", cli.log_level);
            return ExitCode::from(EXIT_VMM_ERROR);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let sched = match resolve_sched(&cli) {
        Ok(sched) => sched,
        Err(e) => {
            eprintln!("stagevm: error: {e}");
            return ExitCode::from(EXIT_VMM_ERROR);
        }
    };
    // Open the report before boot, so a bad path fails now and not after the
    // guest ran; never through a symbolic link, readable by the owner only.
    let mut report_file = match cli.report.as_deref().map(open_report) {
        Some(Err(e)) => {
            eprintln!("stagevm: error: {e}");
            return ExitCode::from(EXIT_VMM_ERROR);
        }
        Some(Ok(file)) => Some(file),
        None => None,
    };
    // Bind the API socket before boot (a path in use fails now), while this
    // process has one thread (the bind sets the umask).
    let mut api_socket = match cli
        .api_socket
        .as_deref()
        .map(stagevm_api::socket::ApiSocket::bind)
    {
        Some(Err(e)) => {
            eprintln!("stagevm: error: {e}");
            return ExitCode::from(EXIT_VMM_ERROR);
        }
        Some(Ok(socket)) => Some(socket),
        None => None,
    };
    let metrics = match cli
        .metrics_listen
        .as_deref()
        .map(stagevm_api::socket::bind_metrics)
    {
        Some(Err(e)) => {
            eprintln!("stagevm: error: {e}");
            return ExitCode::from(EXIT_VMM_ERROR);
        }
        Some(Ok(listener)) => {
            if let Ok(addr) = listener.local_addr() {
                eprintln!("stagevm: metrics on http://{addr}/metrics");
            }
            Some(listener)
        }
        None => None,
    };
    let facts = stagevm::api::VmFacts {
        kernel: cli.kernel.display().to_string(),
        cmdline: cli.cmdline.clone(),
        vcpu_count: cli.cpus.boot,
        memory_bytes: cli.memory.size,
    };
    let config = VmConfig {
        kernel: cli.kernel,
        cmdline: cli.cmdline,
        cpus: cli.cpus,
        memory: cli.memory,
        serial: cli.serial,
        stage_device: !cli.no_stage_device,
        drain_period: std::time::Duration::from_micros(cli.drain_period_us),
        stage_trace: cli.stage_trace,
        sched,
        disks: cli.disk.clone(),
        nets: cli.net.clone(),
        boot_mode: cli.boot_mode,
        initramfs: cli.initramfs,
        seccomp: cli.seccomp,
    };
    let result = stagevm::builder::build(&config).and_then(|mut vmm| {
        let listeners = stagevm_api::server::Listeners {
            unix: api_socket.as_mut().and_then(|s| s.take_listener()),
            metrics,
        };
        vmm.serve_api(listeners, facts);
        // Before the first thread starts: every thread inherits it.
        if cli.landlock == stagevm::sandbox::LandlockMode::On {
            match stagevm::sandbox::restrict(cli.api_socket.as_deref()) {
                Ok(line) if line.contains("fully") => tracing::info!("{line}"),
                Ok(line) => tracing::warn!("{line}"),
                Err(e) => tracing::warn!("landlock: not applied: {e}"),
            }
        }
        vmm.run()
    });
    // The socket's path goes as soon as the VM ended.
    drop(api_socket);
    match result {
        Ok(outcome) => {
            if let stagevm::exit::VmExit::GuestFailure(reason) = &outcome.exit {
                eprintln!("stagevm: guest failed: {reason}");
            }
            match &outcome.exit {
                stagevm::exit::VmExit::ConfigError(msg) => eprintln!("stagevm: error: {msg}"),
                stagevm::exit::VmExit::ThreadFailure { thread, reason } => {
                    eprintln!("stagevm: error: VMM thread {thread} failed: {reason}")
                }
                _ => {}
            }
            eprint!(
                "{}",
                stagevm_report::summary(outcome.channel.as_ref(), &outcome.sched, &outcome.disks)
            );
            eprint!("{}", stagevm_report::net_summary(&outcome.nets));
            let suppressed = stage_device::ratelimit::suppressed();
            if suppressed > 0 {
                eprintln!("stagevm: {suppressed} guest-triggered log lines suppressed (at most {} per {} s per message)", stage_device::ratelimit::BURST, stage_device::ratelimit::WINDOW_NS / 1_000_000_000);
            }
            let code = outcome.exit.exit_code();
            if let (Some(path), Some(file)) = (&cli.report, report_file.as_mut()) {
                if let Err(e) = outcome.into_report().write_to(file) {
                    eprintln!("stagevm: error: --report {}: {e}", path.display());
                    return ExitCode::from(EXIT_VMM_ERROR);
                }
            }
            ExitCode::from(code)
        }
        Err(e) => {
            eprintln!("stagevm: error: {e}");
            ExitCode::from(EXIT_VMM_ERROR)
        }
    }
}
