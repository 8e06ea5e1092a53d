//! Running a built VM: the main thread's event loop and `shutdown()`.
//!
//! Threads: one per vCPU (`vcpu<N>`), one I/O thread per disk (`io-blk<N>`)
//! and per network device (`io-net<N>`),
//! `stage-sched` (with a stage device), and the main thread (`vmm-main`),
//! which waits with `epoll` on the VM's exit `EventFd` ([`crate::exit`]) and
//! a `signalfd` for SIGINT and SIGTERM (blocked in every thread). When the
//! VM ends, [`Vmm::run`] stops the vCPUs with one kick each, joins every
//! thread, drains the stage rings a last time and returns the reports.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use stagevm_report::{BlockReport, ChannelReport, NetReport, Report, SchedReport};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::signal::Killable;

use crate::devices::Bus;
use crate::error::VmmError;
use crate::exit::{ExitEvent, VmExit};
use crate::seccomp::{SeccompMode, ThreadKind};
use crate::vstate::vcpu::{self, Vcpu};
use stage_device::sched::StageSched;
use stagevm_api::poll::Poller;

/// How long `shutdown` waits for a kicked vCPU thread before giving up on
/// joining it (the process exit then ends it).
const STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// A built VM, ready to run.
/// (Built only by [`crate::builder::build`].)
pub struct Vmm {
    /// Kept open for the lifetime of the VM.
    pub(crate) _kvm: Kvm,
    /// Kept open for the lifetime of the VM.
    pub(crate) _vm_fd: VmFd,
    pub(crate) memory: GuestMemoryMmap,
    pub(crate) vcpus: Vec<VcpuFd>,
    pub(crate) bus: Arc<Bus>,
    pub(crate) sched: Arc<StageSched>,
    pub(crate) drain_period: Duration,
    /// Complete the kernel-mode `int3`/`fwait` KVM cannot emulate (Linux).
    pub(crate) assist_emulation: bool,
    pub(crate) exit: Arc<ExitEvent>,
    /// `--seccomp`.
    pub(crate) seccomp: SeccompMode,
    /// `--api-socket`: the bound listener and the VM's facts it reports.
    pub(crate) api: Option<(stagevm_api::server::Listeners, crate::api::VmFacts)>,
}

/// How a VM ended and what it counted.
#[derive(Debug)]
pub struct RunOutcome {
    /// How the VM ended.
    pub exit: VmExit,
    /// The stage channel's counters after the final drain (`None` without a
    /// stage device).
    pub channel: Option<ChannelReport>,
    /// What the scheduler did.
    pub sched: SchedReport,
    /// Per virtio-blk disk, its counters.
    pub disks: Vec<BlockReport>,
    /// Per virtio-net device, its counters.
    pub nets: Vec<NetReport>,
    /// When the VM started to run (the host's clock).
    pub started: std::time::SystemTime,
    /// How long it ran, from starting its vCPUs to its end.
    pub duration: Duration,
}

impl RunOutcome {
    /// The JSON report of this run (moves the counters and the timeline:
    /// no copy of a long run's timeline).
    pub fn into_report(self) -> Report {
        Report {
            schema: stagevm_report::REPORT_SCHEMA,
            stagevm_version: env!("CARGO_PKG_VERSION").to_string(),
            started_unix_ms: self
                .started
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            started: chrono::DateTime::<chrono::Utc>::from(self.started)
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            duration_ms: self.duration.as_millis() as u64,
            exit_code: self.exit.exit_code(),
            exit: self.exit.describe(),
            stage_channel: self.channel,
            sched: self.sched,
            disks: self.disks,
            nets: self.nets,
            log_lines_suppressed: stage_device::ratelimit::suppressed(),
            serial_dropped_bytes: crate::devices::legacy::console::DROPPED
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// The threads `run` started, joined by `shutdown`.
struct Threads {
    vcpus: Vec<JoinHandle<()>>,
    io: Vec<JoinHandle<()>>,
    stage_sched: Option<JoinHandle<()>>,
    api: Option<JoinHandle<()>>,
}

impl Vmm {
    /// Serves the operator API on the Unix socket and `GET /metrics` on the
    /// TCP listener of `listeners` while the VM runs (the `api` helper
    /// thread, see [`crate::api`]); `facts` are reported by
    /// `GET /api/v1/vm.info`. Nothing runs when both are absent.
    pub fn serve_api(
        &mut self,
        listeners: stagevm_api::server::Listeners,
        facts: crate::api::VmFacts,
    ) {
        if listeners.unix.is_some() || listeners.metrics.is_some() {
            self.api = Some((listeners, facts));
        }
    }

    /// Runs the VM to its end (see the module docs) and returns how it ended
    /// with the reports. Errors: a thread, the signalfd or the epoll set
    /// could not be created.
    pub fn run(mut self) -> Result<RunOutcome, VmmError> {
        vcpu::install_kick_handler()?;
        crate::seccomp::install_sigsys_handler()?;
        // SIGINT and SIGTERM go to the signalfd: block them before any
        // thread starts, so every thread inherits the mask.
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGINT);
        mask.add(Signal::SIGTERM);
        mask.thread_block().map_err(std::io::Error::from)?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(std::io::Error::from)?;
        // This thread is the VMM's event loop: a helper, on housekeeping cores
        // (threads spawned below inherit that until they pin themselves).
        self.sched.pinner().start_helper_thread("vmm-main");
        let sched = self.sched.clone();
        let main_cpu = stage_device::sched::ThreadCpu::start(sched.pinner());
        let stop = Arc::new(AtomicBool::new(false));
        let started = (std::time::SystemTime::now(), Instant::now());
        let threads = self.start_threads(&stop)?;
        crate::seccomp::install(ThreadKind::Main, self.seccomp).map_err(|source| {
            VmmError::Seccomp {
                thread: "main",
                source,
            }
        })?;
        self.wait_for_exit(&signals)?;
        Ok(self.shutdown(&stop, threads, main_cpu, started))
    }

    fn start_threads(&mut self, stop: &Arc<AtomicBool>) -> Result<Threads, VmmError> {
        let mut vcpus = Vec::with_capacity(self.vcpus.len());
        for (index, fd) in std::mem::take(&mut self.vcpus).into_iter().enumerate() {
            let vcpu = Vcpu {
                index: index as u32,
                fd,
                bus: self.bus.clone(),
                memory: self.memory.clone(),
                stop: stop.clone(),
                exit: self.exit.clone(),
                sched: self.sched.clone(),
                seccomp: self.seccomp,
                assist_emulation: self.assist_emulation,
                assists: Default::default(),
            };
            vcpus.push(
                std::thread::Builder::new()
                    .name(format!("vcpu{index}"))
                    .spawn(move || vcpu.run())?,
            );
        }
        // One helper I/O thread per block device, on housekeeping cores.
        let mut io = Vec::new();
        for (i, block) in self.bus.blocks().enumerate() {
            let (block, mem) = (block.clone(), self.memory.clone());
            // By index, whatever the disk's `id=`: thread names are at most
            // 15 bytes, and the seccomp kind and the tests know `io-blk`.
            io.push(
                self.spawn_helper(format!("io-blk{i}"), ThreadKind::IoBlk, move |exit| {
                    block.serve(&mem, exit)
                })?,
            );
        }
        // One per network device, the same way.
        for net in self.bus.nets() {
            let (net, mem) = (net.clone(), self.memory.clone());
            io.push(self.spawn_helper(
                format!("io-{}", net.name),
                ThreadKind::IoNet,
                move |exit| net.serve(&mem, exit),
            )?);
        }
        // The console's input, when it has one (`--serial pty`, …).
        if let Some((input, room)) = self.bus.take_console_input()? {
            let bus = self.bus.clone();
            io.push(
                self.spawn_helper("serial-in".into(), ThreadKind::SerialIn, move |exit| {
                    crate::devices::legacy::console::serve_input(input, &*bus, &room, exit)
                })?,
            );
        }
        // stdout's writer (`--serial tty`): never joined, it may be blocked
        // on a reader that stalled (devices/legacy/serial_out.rs).
        if let Some(drain) = self.bus.take_console_output() {
            drop(
                self.spawn_helper("serial-out".into(), ThreadKind::SerialOut, move |exit| {
                    drain.serve(exit)
                })?,
            );
        }
        // Threads the VMM did not start itself (KVM's workers) go to the
        // housekeeping cores too; stage-sched repeats this every period.
        let pinner = self.sched.pinner();
        pinner.wait_vcpus_started(Duration::from_secs(1));
        pinner.adopt_threads();
        let stage_sched = match self.sched.device() {
            Some(_) => {
                let (sched, exit, period, seccomp) = (
                    self.sched.clone(),
                    self.exit.clone(),
                    self.drain_period,
                    self.seccomp,
                );
                Some(
                    std::thread::Builder::new()
                        .name("stage-sched".into())
                        .spawn(move || {
                            let _cpu = stage_device::sched::ThreadCpu::start(sched.pinner());
                            if let Err(e) =
                                crate::sched_loop::run(&sched, period, exit.fd(), seccomp)
                            {
                                exit.request(VmExit::ThreadFailure {
                                    thread: "stage-sched".into(),
                                    reason: e.to_string(),
                                });
                            }
                        })?,
                )
            }
            None => None,
        };
        let api = self.start_api()?;
        Ok(Threads {
            vcpus,
            io,
            stage_sched,
            api,
        })
    }

    /// Starts the helper thread `name` on the housekeeping cores: it
    /// installs `kind`'s seccomp filter and runs `serve` with the VM's exit
    /// `EventFd` until that is readable; a filter refused or `serve`'s error
    /// ends the VM as [`VmExit::ThreadFailure`]. Errors: the thread cannot
    /// be spawned.
    fn spawn_helper(
        &self,
        name: String,
        kind: ThreadKind,
        serve: impl FnOnce(&vmm_sys_util::eventfd::EventFd) -> std::io::Result<()> + Send + 'static,
    ) -> std::io::Result<JoinHandle<()>> {
        let (sched, exit, seccomp) = (self.sched.clone(), self.exit.clone(), self.seccomp);
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                sched.pinner().start_helper_thread(&name);
                let _cpu = stage_device::sched::ThreadCpu::start(sched.pinner());
                let served = crate::seccomp::install(kind, seccomp)
                    .map_err(|e| e.to_string())
                    .and_then(|()| serve(exit.fd()).map_err(|e| e.to_string()));
                if let Err(reason) = served {
                    exit.request(VmExit::ThreadFailure {
                        thread: name,
                        reason,
                    });
                }
            })
    }

    /// Starts the `api` thread when `--api-socket` or `--metrics-listen`
    /// was given.
    fn start_api(&mut self) -> Result<Option<JoinHandle<()>>, VmmError> {
        let Some((listener, vm)) = self.api.take() else {
            return Ok(None);
        };
        let ctx = Arc::new(crate::api::ApiContext {
            sched: self.sched.clone(),
            exit: self.exit.clone(),
            vm,
            bus: self.bus.clone(),
        });
        let (exit, seccomp) = (self.exit.clone(), self.seccomp);
        let exit_fd = exit.fd().try_clone()?;
        let handle = std::thread::Builder::new()
            .name("api".into())
            .spawn(move || {
                ctx.sched.pinner().start_helper_thread("api");
                let _cpu = stage_device::sched::ThreadCpu::start(ctx.sched.pinner());
                let ready = || {
                    crate::seccomp::install(ThreadKind::Api, seccomp).map_err(std::io::Error::other)
                };
                if let Err(e) = stagevm_api::server::serve(listener, ctx.clone(), exit_fd, ready) {
                    exit.request(VmExit::ThreadFailure {
                        thread: "api".into(),
                        reason: e.to_string(),
                    });
                }
            })?;
        Ok(Some(handle))
    }

    /// The main thread's event loop: returns once the exit `EventFd` is
    /// readable; a signal on the signalfd requests the exit.
    fn wait_for_exit(&self, signals: &SignalFd) -> Result<(), VmmError> {
        const EXIT: u64 = 0;
        const SIGNAL: u64 = 1;
        let mut poller = Poller::new(&[
            (self.exit.fd().as_raw_fd(), EXIT),
            (signals.as_raw_fd(), SIGNAL),
        ])?;
        loop {
            for token in poller.wait()? {
                if token == EXIT {
                    return Ok(());
                }
                if let Ok(Some(info)) = signals.read_signal() {
                    let sig = info.ssi_signo as i32;
                    tracing::info!(signal = sig, "signal received, stopping the VM");
                    self.exit.request(VmExit::Signal(sig));
                }
            }
        }
    }

    /// Stops the VM: sets the stop flag, unparks parked vCPUs and kicks each
    /// vCPU thread once; joins every thread (the exit `EventFd` already ends
    /// `stage-sched` and the I/O threads); drains the rings a last time.
    fn shutdown(
        self,
        stop: &AtomicBool,
        threads: Threads,
        main_cpu: stage_device::sched::ThreadCpu<'_>,
        (started, t0): (std::time::SystemTime, Instant),
    ) -> RunOutcome {
        stop.store(true, Ordering::Release);
        if let Some(device) = self.sched.device() {
            // Parked vCPUs (WAIT) must see the stop too.
            device.stop();
        }
        for t in &threads.vcpus {
            // The thread may have finished already.
            let _ = t.kill(vcpu::kick_signal());
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while threads.vcpus.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        for t in threads.vcpus {
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::error!("a vCPU thread did not stop within {STOP_TIMEOUT:?}");
            }
        }
        for t in threads
            .stage_sched
            .into_iter()
            .chain(threads.io)
            .chain(threads.api)
        {
            let _ = t.join();
        }
        // The main thread's CPU time while the VM ran (the building before
        // it not counted), recorded before the report is made.
        drop(main_cpu);
        let (channel, sched) = self.sched.finish();
        self.bus.flush();
        RunOutcome {
            exit: self
                .exit
                .reason()
                .unwrap_or_else(|| VmExit::GuestFailure("the VM ended without a reason".into())),
            channel,
            sched,
            disks: self.bus.block_reports(),
            nets: self.bus.net_reports(),
            started,
            duration: t0.elapsed(),
        }
    }
}
