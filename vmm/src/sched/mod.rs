//! Stage scheduling in the VMM: applies host-sched's decisions.
//!
//! Data flows one way: the guest's rings are drained by the stage device
//! into validated events ([`crate::stage::StageDevice::drain`]), the
//! [`Controller`] folds them into its load window and, every policy period,
//! asks host-sched's policy for a [`Plan`](host_sched::policy::Plan); the
//! plan's stage map is published through the device and its pins applied by
//! the [`Pinner`]. [`StageSched`] wires these together and runs the
//! `stage-sched` thread's loop ([`StageSched::run`]).
//!
//! * [`accounting`] — per-stage counters and the load window,
//! * [`controller`] — the decisions (one place),
//! * [`pinner`] — thread ids and affinities.

pub mod accounting;
pub mod controller;
pub mod pinner;

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use host_sched::config::ConfigError;
use host_sched::vm::VmPlan;
use stagevm_report::{ChannelReport, SchedReport};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

pub use controller::{Controller, Decision};
pub use pinner::Pinner;

use crate::stage::{Registered, StageDevice};

/// Epoll tokens of the `stage-sched` loop.
const TOKEN_EXIT: u64 = 0;
const TOKEN_TIMER: u64 = 1;
const TOKEN_REGISTERED: u64 = 2;

/// The stage scheduling of one VM: controller, pinner and the stage device
/// they drive (none with `--no-stage-device`).
pub struct StageSched {
    controller: Mutex<Controller>,
    pinner: Pinner,
    device: Option<Arc<StageDevice>>,
    /// Written at each REGISTER: the loop starts a policy period at once.
    registered: EventFd,
}

impl StageSched {
    /// Stage scheduling for a VM of `num_vcpus` vCPUs under `vm` (from
    /// [`host_sched::vm::for_vm`]), driving `device`. Errors: the
    /// "registered" `EventFd` cannot be created.
    pub fn new(
        vm: VmPlan,
        num_vcpus: u32,
        device: Option<Arc<StageDevice>>,
    ) -> std::io::Result<Arc<Self>> {
        let tsc_khz = device.as_ref().map_or(0, |d| d.tsc_khz());
        let controller = Controller::new(vm, num_vcpus, tsc_khz);
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

    fn controller(&self) -> MutexGuard<'_, Controller> {
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
    /// never sees a map the policy did not make. Errors: the configuration
    /// does not fit the guest's stages (the VM then ends).
    pub fn on_register(&self, registered: &Registered) -> Result<(), ConfigError> {
        let mut c = self.controller();
        let plan = c.register(&registered.names)?;
        if let Some(device) = &self.device {
            device.publish(&plan.stage_vcpus);
        }
        self.pinner.apply(plan);
        drop(c);
        let _ = self.registered.write(1);
        Ok(())
    }

    /// One drain: validated events to the controller, parked vCPUs with
    /// queued work woken.
    fn drain(&self) {
        if let Some(device) = &self.device {
            let drained = device.drain();
            device.wake_parked_with_work();
            self.controller().ingest(&drained);
        }
    }

    /// One policy period: adopt stray threads, ask the controller, publish a
    /// changed stage map and re-pin moved vCPUs.
    fn policy_period(&self) {
        self.pinner.adopt_threads();
        let mut c = self.controller();
        if let Some(Decision { plan, map_changed }) = c.period(Instant::now()) {
            if map_changed {
                if let Some(device) = &self.device {
                    device.publish(&plan.stage_vcpus);
                }
            }
            self.pinner.apply(&plan);
        }
    }

    /// The `stage-sched` thread's loop: drains the rings every
    /// `drain_period` (a `timerfd`), runs a policy period right after each
    /// REGISTER and then every policy period, and returns as soon as `exit`
    /// is readable (it is never reset: every loop of the VM sees it).
    /// Errors: the epoll or timer descriptors cannot be set up.
    pub fn run(&self, drain_period: Duration, exit: &EventFd) -> std::io::Result<()> {
        self.pinner.start_helper_thread("stage-sched");
        let mut timer = TimerFd::new()?;
        timer.reset(drain_period, Some(drain_period))?;
        let epoll = Epoll::new()?;
        for (fd, token) in [
            (exit.as_raw_fd(), TOKEN_EXIT),
            (timer.as_raw_fd(), TOKEN_TIMER),
            (self.registered.as_raw_fd(), TOKEN_REGISTERED),
        ] {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )?;
        }
        let period = self.period();
        let mut next_period = Instant::now() + period;
        let mut events = [EpollEvent::default(); 3];
        loop {
            let n = match epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let mut now_registered = false;
            for ev in &events[..n] {
                match ev.data() {
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
            self.drain();
            if now_registered || Instant::now() >= next_period {
                next_period = Instant::now() + period;
                self.policy_period();
            }
        }
    }

    /// The final drain after the guest stopped and the reports: the stage
    /// channel's counters (`None` without a device) and what the scheduler
    /// did.
    pub fn finish(&self) -> (Option<ChannelReport>, SchedReport) {
        self.drain();
        let c = self.controller();
        let channel = self.device.as_ref().map(|d| {
            let mut r = d.report();
            c.fill_report(&mut r);
            r
        });
        (channel, self.report_locked(&c))
    }

    fn report_locked(&self, c: &Controller) -> SchedReport {
        let r = &c.vm().resolved;
        let (vcpus, helpers, repins, repin_mean_us) = self.pinner.report();
        let (map_changes, timeline) = c.history();
        let share = r.helpers_share_stage_cores.then(|| {
            format!(
                "no housekeeping core left: helper threads share the stage cores {}",
                r.stage_cores
            )
        });
        SchedReport {
            policy: r.policy.name().into(),
            period_ms: r.period.as_millis() as u64,
            stage_cores: r.stage_cores.to_string(),
            housekeeping: r.housekeeping.to_string(),
            warnings: share
                .into_iter()
                .chain(c.vm().warnings.iter().cloned())
                .collect(),
            stages: c.placements(),
            vcpus,
            helpers,
            map_changes,
            repins,
            repin_mean_us,
            timeline: timeline.to_vec(),
        }
    }
}
