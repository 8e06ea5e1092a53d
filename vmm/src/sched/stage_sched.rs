//! `StageSched`: the wiring of one VM's stage scheduling — the
//! [`Controller`] (decisions), the [`Pinner`] (threads) and the stage
//! device (the channel) — the REGISTER hand-off, and the `stage-sched`
//! thread's loop ([`StageSched::run`]).
//!
//! The loop wakes once per policy period: it reads a counters guest's
//! counters, runs the policy, publishes and pins. It wakes more often only
//! while the rings need draining: every drain period for a guest that
//! reports through them (every event is its load signal), and, for a
//! counters guest's event trace, as often as a budget of
//! [`TRACE_CPU_BUDGET`] of a core allows (a lossy trace is not worth more:
//! a full ring drops events, counted, and the guest never waits).

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use host_sched::config::StagesConfigError;
use host_sched::vm::Setup;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::controller::{Change, Controller, Decision};
use super::cpu::read_schedstat;
use super::pinner::{thread_cpu_ns, Pinner};
use crate::poll::Poller;
use crate::stage::{Blocks, Drain, Registered, StageDevice};

/// Most of a core the `stage-sched` thread spends on a counters guest's
/// event trace: the drain interval grows until the thread's measured CPU
/// per wake-up fits (1 %; on the project's machines a wake-up and a drain
/// of two 256-entry rings cost ~37 µs, so ~3.7 ms between drains).
pub const TRACE_CPU_BUDGET: f64 = 0.01;

/// Epoll tokens of the `stage-sched` loop.
const TOKEN_EXIT: u64 = 0;
const TOKEN_TIMER: u64 = 1;
const TOKEN_REGISTERED: u64 = 2;

/// The stage scheduling of one VM: controller, pinner and the stage device
/// they drive (none with `--no-stage-device`).
pub struct StageSched {
    pub(super) controller: Mutex<Controller>,
    pub(super) pinner: Pinner,
    pub(super) device: Option<Arc<StageDevice>>,
    /// Written at each REGISTER: the loop starts a policy period at once.
    registered: EventFd,
}

impl StageSched {
    /// Stage scheduling for a VM of `num_vcpus` vCPUs under `setup`,
    /// driving `device`. Errors: the "registered" `EventFd` cannot be
    /// created.
    pub fn new(
        setup: &Setup,
        num_vcpus: u32,
        device: Option<Arc<StageDevice>>,
    ) -> std::io::Result<Arc<Self>> {
        let tsc_khz = device.as_ref().map_or(0, |d| d.tsc_khz());
        let controller = Controller::new(setup, num_vcpus, tsc_khz);
        let pinner = Pinner::new(
            controller.plan().vcpu_cores.clone(),
            controller.vm().resolved.housekeeping.clone(),
        );
        Ok(Arc::new(Self {
            controller: Mutex::new(controller),
            pinner,
            device,
            registered: EventFd::new(libc::EFD_NONBLOCK)?,
        }))
    }

    pub(super) fn controller(&self) -> MutexGuard<'_, Controller> {
        self.controller.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pinner (helper and vCPU threads record themselves there).
    pub fn pinner(&self) -> &Pinner {
        &self.pinner
    }

    /// The stage device, if the VM has one.
    pub fn device(&self) -> Option<&Arc<StageDevice>> {
        self.device.as_ref()
    }

    /// The policy period.
    pub fn period(&self) -> Duration {
        self.controller().vm().resolved.period
    }

    /// A REGISTER succeeded (called on the vCPU thread that rang it, before
    /// the guest resumes): the controller plans the first stage map for the
    /// declared stages, which is published and applied at once, so the guest
    /// never sees a map the policy did not make. At most one REGISTER per
    /// policy period is served so; one that comes sooner (a guest may
    /// register in a loop) gets the current map and is planned at the next
    /// policy period ([`Controller::register`]).
    pub fn on_register(&self, registered: &Registered) {
        // What the previous registration's counters saw until its
        // UNREGISTER goes to its accounting before a new one replaces it.
        self.read_counters(&mut Blocks::default());
        let mut c = self.controller();
        let served = c.register(registered, Instant::now());
        let plan = c.plan();
        if let Some(device) = &self.device {
            device.publish(&plan.stage_vcpus, plan.owned_vcpus(), plan.visit);
        }
        if served {
            self.pinner.apply(plan);
        }
        drop(c);
        if served {
            let _ = self.registered.write(1);
        }
    }

    /// One drain of the rings: validated events to the controller (a rings
    /// guest's stage events, or a counters guest's trace), and for a rings
    /// guest the safety-net wake at every drain, as before minor 2.
    pub(super) fn drain(&self) {
        if let Some(device) = &self.device {
            let drained = device.drain();
            if device.drain_need() == Drain::Events {
                device.wake_parked_with_work();
            }
            self.controller().ingest(&drained);
        }
    }

    /// One read of a counters guest's blocks into the accounting — first
    /// the blocks an UNREGISTER left, if any, then the live area's — and the
    /// host's safety-net wake of parked vCPUs with queued work. Called from
    /// several threads (policy period, REGISTER, the API's live view, the
    /// end): the controller's lock is held from the copies to their
    /// ingestion (controller before device, as everywhere), so reads are
    /// ingested in the order of their host TSCs.
    pub(super) fn read_counters(&self, buf: &mut Blocks) {
        if let Some(device) = &self.device {
            let mut c = self.controller();
            if let Some(copy) = device.take_final_blocks(buf) {
                c.ingest_counters(copy.generation, buf, copy.host_tsc);
            }
            if let Some(copy) = device.read_blocks(buf) {
                c.ingest_counters(copy.generation, buf, copy.host_tsc);
            }
            drop(c);
            device.wake_parked_with_work();
        }
    }

    /// Validates an operator's change and queues it for the next policy
    /// period (see [`Controller::propose`]); returns what will be applied.
    /// Errors: the change does not resolve or does not fit the guest's
    /// stages (nothing is queued).
    pub fn propose(&self, change: &Change) -> Result<String, StagesConfigError> {
        self.controller().propose(change)
    }

    /// One policy period: read the counters and the vCPU threads'
    /// scheduler statistics, adopt stray threads (every [`ADOPT_EVERY`]
    /// periods), ask the controller, publish a changed stage map, re-pin
    /// moved vCPUs and, after a change of the housekeeping cores, the
    /// helper threads.
    fn policy_period(&self, count: u64, buf: &mut Blocks) {
        self.read_counters(buf);
        let cpu: Vec<_> = self
            .pinner
            .vcpu_tids()
            .into_iter()
            .map(read_schedstat)
            .collect();
        if count.is_multiple_of(ADOPT_EVERY) {
            self.pinner.adopt_threads();
        }
        let mut c = self.controller();
        if let Some(Decision { plan, map_changed }) = c.period(Instant::now(), &cpu) {
            if map_changed {
                if let Some(device) = &self.device {
                    device.publish(&plan.stage_vcpus, plan.owned_vcpus(), plan.visit);
                }
            }
            self.pinner.apply(&plan);
            self.pinner.set_housekeeping(&c.vm().resolved.housekeeping);
        }
    }

    /// Asks the guest for an event trace (`--stage-trace`, `PUT
    /// /api/v1/stages.trace`): every `every`th event per vCPU (1 = all, 0 =
    /// off). The `stage-sched` loop drains the rings while it is on.
    pub fn set_trace(&self, every: u64) {
        if let Some(device) = &self.device {
            device.set_trace(every);
        }
    }

    /// What the rings need now ([`StageDevice::drain_need`]).
    fn drain_need(&self) -> Drain {
        self.device.as_ref().map_or(Drain::No, |d| d.drain_need())
    }

    /// How often the `stage-sched` loop must wake: every drain period for a
    /// rings guest; for a trace, no more often than a wake-up costing
    /// `wake_cost_ns` of CPU fits [`TRACE_CPU_BUDGET`]; else only at policy
    /// periods — no host work per event. Never longer than the policy
    /// period.
    fn tick(&self, drain_period: Duration, wake_cost_ns: f64) -> Duration {
        let period = self.period();
        match self.drain_need() {
            Drain::Events => drain_period.min(period),
            Drain::Trace => {
                let budget = Duration::from_nanos((wake_cost_ns / TRACE_CPU_BUDGET) as u64);
                drain_period.max(budget).min(period)
            }
            Drain::No => period,
        }
    }

    /// The `stage-sched` thread's loop: runs a policy period right after a
    /// served REGISTER and then every policy period, drains the rings while
    /// they need it (`StageSched::tick`; a `timerfd` whose interval
    /// follows), and returns as soon as `exit` is readable (it is never
    /// reset: every loop of the VM sees it). Errors: the epoll or timer
    /// descriptors cannot be set up.
    pub fn run(
        &self,
        drain_period: Duration,
        exit: &EventFd,
        seccomp: crate::seccomp::SeccompMode,
    ) -> std::io::Result<()> {
        self.pinner.start_helper_thread("stage-sched");
        crate::exit::test_panic_hook("stage-sched");
        let mut timer = TimerFd::new()?;
        // CPU per wake-up (ns), smoothed: the trace's drain interval follows.
        let mut wake_cost_ns = 0.0;
        let mut tick = self.tick(drain_period, wake_cost_ns);
        timer.reset(tick, Some(tick))?;
        let mut poller = Poller::new(&[
            (exit.as_raw_fd(), TOKEN_EXIT),
            (timer.as_raw_fd(), TOKEN_TIMER),
            (self.registered.as_raw_fd(), TOKEN_REGISTERED),
        ])?;
        crate::seccomp::install(crate::seccomp::ThreadKind::StageSched, seccomp)
            .map_err(std::io::Error::other)?;
        let mut next_period = Instant::now() + self.period();
        let mut periods = 0u64;
        let mut buf = Blocks::default();
        let mut cpu = thread_cpu_ns();
        loop {
            let mut now_registered = false;
            for token in poller.wait()? {
                match token {
                    TOKEN_EXIT => return Ok(()),
                    TOKEN_TIMER => {
                        let _ = timer.wait();
                    }
                    _ => {
                        let _ = self.registered.read();
                        now_registered = true;
                    }
                }
            }
            let need = self.drain_need();
            if need != Drain::No {
                self.drain();
            }
            // Half a tick early counts as due: the timer and the period
            // share their start, and timers fire a little late or early.
            if now_registered || Instant::now() + tick / 2 >= next_period {
                self.policy_period(periods, &mut buf);
                periods += 1;
                // The period may have changed (`PUT /api/v1/stages.policy`).
                next_period = Instant::now() + self.period();
            }
            // This wake-up's CPU (the wait's system calls included), for
            // the trace's budget.
            let now_cpu = thread_cpu_ns();
            let spent = now_cpu.saturating_sub(cpu) as f64;
            cpu = now_cpu;
            if need == Drain::Trace {
                wake_cost_ns = if wake_cost_ns == 0.0 {
                    spent
                } else {
                    0.8 * wake_cost_ns + 0.2 * spent
                };
            }
            let want = self.tick(drain_period, wake_cost_ns);
            // Re-arm only on a real change (a re-arm is a system call).
            if want.abs_diff(tick) > tick / 8 {
                tick = want;
                timer.reset(tick, Some(tick))?;
            }
        }
    }
}

/// Policy periods between two scans of `/proc/self/task` for threads the
/// VMM did not start (KVM's workers): 50, once a second at 20 ms.
const ADOPT_EVERY: u64 = 50;
