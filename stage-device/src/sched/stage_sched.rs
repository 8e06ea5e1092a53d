//! `StageSched`: the wiring of one VM's stage scheduling — the
//! [`Controller`] (decisions), the [`Pinner`] (threads) and the stage
//! device (the channel) — the REGISTER hand-off, and the `stage-sched`
//! thread's pace ([`Pacer`]; the VMM runs the loop itself).
//!
//! The loop wakes once per policy period: it reads a counters guest's
//! counters, runs the policy, publishes and pins. It wakes more often only
//! while the rings need draining: every drain period for a guest that
//! reports through them (every event is its load signal), and, for a
//! counters guest's event trace, as often as a budget of
//! [`TRACE_CPU_BUDGET`] of a core allows (a lossy trace is not worth more:
//! a full ring drops events, counted, and the guest never waits).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use host_sched::config::StagesConfigError;
use host_sched::vm::Setup;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::controller::{Change, Controller, Decision};
use super::cpu::read_schedstat;
use super::pinner::{thread_cpu_ns, Pinner};
use crate::stage::{Blocks, Drain, Registered, StageDevice, StageMemory};

/// Most of a core the `stage-sched` thread spends on a counters guest's
/// event trace: the drain interval grows until the thread's measured CPU
/// per wake-up fits (1 %; on the project's machines a wake-up and a drain
/// of two 256-entry rings cost ~37 µs, so ~3.7 ms between drains).
pub const TRACE_CPU_BUDGET: f64 = 0.01;

/// The stage scheduling of one VM: controller, pinner and the stage device
/// they drive (none with `--no-stage-device`), over the VMM's guest memory
/// `M` (a [`StageMemory`]: `Arc<GuestMemoryMmap<B>>` for any dirty bitmap
/// `B`, or a `GuestMemoryAtomic` of it).
pub struct StageSched<M: StageMemory = Arc<GuestMemoryMmap>> {
    pub(super) controller: Mutex<Controller>,
    pub(super) pinner: Pinner,
    pub(super) device: Option<Arc<StageDevice<M>>>,
    /// Written at each REGISTER: the loop starts a policy period at once.
    registered: EventFd,
}

impl<M: StageMemory> StageSched<M> {
    /// Stage scheduling for a VM of `num_vcpus` vCPUs under `setup`,
    /// driving `device`. Errors: the "registered" `EventFd` cannot be
    /// created.
    pub fn new(
        setup: &Setup,
        num_vcpus: u32,
        device: Option<Arc<StageDevice<M>>>,
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
    pub fn device(&self) -> Option<&Arc<StageDevice<M>>> {
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
    /// several threads (policy period, REGISTER, the end): the controller's lock is held from the copies to their
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
        self.pinner.set_cpu_weight(c.vm().resolved.cpu_weight);
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

    /// The "a REGISTER was served" descriptor: readable after
    /// [`StageSched::on_register`] planned a first map, so the VMM's
    /// `stage-sched` loop starts a policy period at once
    /// ([`Pacer::wake`]); the loop reads it to clear it.
    pub fn registered_fd(&self) -> &EventFd {
        &self.registered
    }
}

/// The pace of the `stage-sched` loop, apart from the loop itself (whose
/// thread, epoll set, timer and seccomp filter belong to the VMM): it runs
/// a policy period right after a served REGISTER and then every policy
/// period, drains the rings while they need it, and says how often the
/// loop must wake (`StageSched::tick`). The VMM calls [`Pacer::wake`]
/// each time its timer or [`StageSched::registered_fd`] fires.
pub struct Pacer {
    drain_period: Duration,
    tick: Duration,
    next_period: Instant,
    periods: u64,
    buf: Blocks,
    /// The calling thread's CPU time (ns) at the last wake-up.
    cpu: u64,
    /// CPU per wake-up (ns), smoothed: the trace's drain interval follows.
    wake_cost_ns: f64,
}

impl Pacer {
    /// The pace for `sched` with rings drained every `drain_period` while
    /// they need it (a rings guest; a trace is drained less often, see
    /// [`TRACE_CPU_BUDGET`]). Call it on the thread that will call
    /// [`Pacer::wake`]: it measures that thread's CPU time.
    pub fn new<M: StageMemory>(sched: &StageSched<M>, drain_period: Duration) -> Self {
        Self {
            drain_period,
            tick: sched.tick(drain_period, 0.0),
            next_period: Instant::now() + sched.period(),
            periods: 0,
            buf: Blocks::default(),
            cpu: thread_cpu_ns(),
            wake_cost_ns: 0.0,
        }
    }

    /// The interval the loop's timer must fire at now (at most the policy
    /// period).
    pub fn tick(&self) -> Duration {
        self.tick
    }

    /// One wake-up of the loop (`registered`: a REGISTER was served since
    /// the last): drains the rings if they need it and runs a policy
    /// period if one is due. Returns the timer's new interval when it
    /// changed by more than an eighth (a re-arm is a system call), else
    /// `None`.
    pub fn wake<M: StageMemory>(
        &mut self,
        sched: &StageSched<M>,
        registered: bool,
    ) -> Option<Duration> {
        let need = sched.drain_need();
        if need != Drain::No {
            sched.drain();
        }
        // Half a tick early counts as due: the timer and the period share
        // their start, and timers fire a little late or early.
        if registered || Instant::now() + self.tick / 2 >= self.next_period {
            sched.policy_period(self.periods, &mut self.buf);
            self.periods += 1;
            // The period may have changed (`PUT /api/v1/stages.policy`).
            self.next_period = Instant::now() + sched.period();
        }
        // This wake-up's CPU (the wait's system calls included), for the
        // trace's budget.
        let now_cpu = thread_cpu_ns();
        let spent = now_cpu.saturating_sub(self.cpu) as f64;
        self.cpu = now_cpu;
        if need == Drain::Trace {
            self.wake_cost_ns = if self.wake_cost_ns == 0.0 {
                spent
            } else {
                0.8 * self.wake_cost_ns + 0.2 * spent
            };
        }
        let want = sched.tick(self.drain_period, self.wake_cost_ns);
        (want.abs_diff(self.tick) > self.tick / 8).then(|| {
            self.tick = want;
            want
        })
    }
}

/// Policy periods between two scans of `/proc/self/task` for threads the
/// VMM did not start (KVM's workers): 50, once a second at 20 ms.
const ADOPT_EVERY: u64 = 50;
