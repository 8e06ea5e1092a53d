//! The controller: the one place where the VMM turns stage events into
//! scheduling decisions, by asking host-sched, and the `stage-sched` loop
//! that feeds it ([`StageSched::run`]).
//!
//! It owns the per-stage accounting and its load window, the VM's policy
//! (built once per registration by [`host_sched::vm::build_policy`]), the
//! plan last applied and the timeline. Its inputs are validated events
//! ([`Controller::ingest`]) and the clock ([`Controller::period`]); its
//! outputs are [`Plan`]s, which the caller publishes (stage map) and applies
//! (pins). It never touches guest memory or threads itself.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use host_sched::config::{BudgetsUpdate, Config, ConfigError, PolicyUpdate};
use host_sched::policy::{Plan, Policy};
use host_sched::topology::Topology;
use host_sched::vm::{build_policy, replan, Setup, VmPlan};
use stagevm_report::{ChannelReport, StagePlacement, TimelineEntry};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::accounting::Accounting;
use super::pinner::Pinner;
use crate::poll::Poller;
use crate::stage::{Drained, Registered, StageDevice};

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
    /// never sees a map the policy did not make.
    pub fn on_register(&self, registered: &Registered) {
        let mut c = self.controller();
        let plan = c.register(&registered.names);
        if let Some(device) = &self.device {
            device.publish(&plan.stage_vcpus, plan.owned_vcpus());
        }
        self.pinner.apply(plan);
        drop(c);
        let _ = self.registered.write(1);
    }

    /// One drain: validated events to the controller, parked vCPUs with
    /// queued work woken.
    pub(super) fn drain(&self) {
        if let Some(device) = &self.device {
            let drained = device.drain();
            device.wake_parked_with_work();
            self.controller().ingest(&drained);
        }
    }

    /// Validates an operator's change and queues it for the next policy
    /// period (see [`Controller::propose`]); returns what will be applied.
    /// Errors: the change does not resolve or does not fit the guest's
    /// stages (nothing is queued).
    pub fn propose(&self, change: &Change) -> Result<String, ConfigError> {
        self.controller().propose(change)
    }

    /// One policy period: adopt stray threads, ask the controller, publish a
    /// changed stage map, re-pin moved vCPUs and, after a change of the
    /// housekeeping cores, the helper threads.
    fn policy_period(&self) {
        self.pinner.adopt_threads();
        let mut c = self.controller();
        if let Some(Decision { plan, map_changed }) = c.period(Instant::now()) {
            if map_changed {
                if let Some(device) = &self.device {
                    device.publish(&plan.stage_vcpus, plan.owned_vcpus());
                }
            }
            self.pinner.apply(&plan);
            self.pinner.set_housekeeping(&c.vm().resolved.housekeeping);
        }
    }

    /// The `stage-sched` thread's loop: drains the rings every
    /// `drain_period` (a `timerfd`), runs a policy period right after each
    /// REGISTER and then every policy period, and returns as soon as `exit`
    /// is readable (it is never reset: every loop of the VM sees it).
    /// Errors: the epoll or timer descriptors cannot be set up.
    pub fn run(
        &self,
        drain_period: Duration,
        exit: &EventFd,
        seccomp: crate::seccomp::SeccompMode,
    ) -> std::io::Result<()> {
        self.pinner.start_helper_thread("stage-sched");
        crate::exit::test_panic_hook("stage-sched");
        let mut timer = TimerFd::new()?;
        timer.reset(drain_period, Some(drain_period))?;
        let mut poller = Poller::new(&[
            (exit.as_raw_fd(), TOKEN_EXIT),
            (timer.as_raw_fd(), TOKEN_TIMER),
            (self.registered.as_raw_fd(), TOKEN_REGISTERED),
        ])?;
        crate::seccomp::install(crate::seccomp::ThreadKind::StageSched, seccomp)
            .map_err(std::io::Error::other)?;
        let mut next_period = Instant::now() + self.period();
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
            self.drain();
            if now_registered || Instant::now() >= next_period {
                self.policy_period();
                // The period may have changed (`PUT /api/v1/stages.policy`).
                next_period = Instant::now() + self.period();
            }
        }
    }
}

/// Most timeline entries kept in the report (one per policy period).
const MAX_TIMELINE: usize = 100_000;

/// The scheduling state of one VM.
pub struct Controller {
    vm: VmPlan,
    num_vcpus: u32,
    tsc_khz: u64,
    start: Instant,
    /// The guest's stages, their accounting and their policy, once registered.
    guest: Option<Guest>,
    /// The plan applied now (the pre-registration plan until REGISTER).
    plan: Plan,
    /// When the current policy period started.
    period_start: Instant,
    map_changes: u64,
    timeline: Vec<TimelineEntry>,
    /// What a REGISTER's stages made host-sched adjust (for the report;
    /// bounded: one registration's lines, the latest).
    guest_warnings: Vec<String>,
    /// The configuration as the operator gave it and the host it resolves
    /// against (for [`Controller::propose`]).
    config: Config,
    topology: Topology,
    /// A change accepted by [`Controller::propose`], applied at the start
    /// of the next policy period.
    pending: Option<Pending>,
}

/// A change the operator asks for while the VM runs (the operator API).
#[derive(Clone, Debug)]
pub enum Change {
    /// `PUT /api/v1/stages.policy`.
    Policy(PolicyUpdate),
    /// `PUT /api/v1/stages.budgets`.
    Budgets(BudgetsUpdate),
}

/// Changes validated and waiting for the next policy period.
struct Pending {
    config: Config,
    vm: VmPlan,
    what: Vec<String>,
}

struct Guest {
    names: Vec<String>,
    accounting: Accounting,
    policy: Box<dyn Policy>,
}

/// What one policy period decided.
#[derive(Debug)]
pub struct Decision {
    /// The plan to apply.
    pub plan: Plan,
    /// Whether its stage map differs from the previous one (publish it).
    pub map_changed: bool,
}

impl Controller {
    /// A controller for a VM of `num_vcpus` vCPUs under `setup` (fitted to
    /// the VM by [`host_sched::vm::for_vm`]), whose guest TSC runs at
    /// `tsc_khz` (kHz; 0 if unknown). Its first plan places the vCPUs
    /// before the guest registers any stage.
    pub fn new(setup: &Setup, num_vcpus: u32, tsc_khz: u64) -> Self {
        let vm = host_sched::vm::for_vm(&setup.resolved, num_vcpus);
        for w in &vm.warnings {
            tracing::info!("{w}");
        }
        // Without guest stages the policy takes no budgets: it cannot fail.
        let plan = build_policy(&vm.resolved, num_vcpus, None)
            .map(|mut p| p.plan(&[]))
            .unwrap_or_else(|e| unreachable!("a policy without stages cannot fail: {e}"));
        Self {
            vm,
            num_vcpus,
            tsc_khz,
            start: Instant::now(),
            guest: None,
            plan,
            period_start: Instant::now(),
            map_changes: 0,
            timeline: Vec::new(),
            guest_warnings: Vec::new(),
            config: setup.config.clone(),
            topology: setup.topology.clone(),
            pending: None,
        }
    }

    /// Validates `change` exactly as a `--stages` file (host-sched's
    /// [`replan`]: resolution against the host, the VM's vCPU count and the
    /// guest's declared stages), starting from the configuration the VM
    /// will run next (the current one with the changes still pending), and
    /// queues it for the next policy period. Returns the line the timeline
    /// will record. Errors: the [`ConfigError`] naming key and value;
    /// nothing is queued then.
    pub fn propose(&mut self, change: &Change) -> Result<String, ConfigError> {
        let base = self.pending.as_ref().map_or(&self.config, |p| &p.config);
        let (config, what) = match change {
            Change::Policy(u) => (base.clone().with_policy(u), u.describe()),
            Change::Budgets(u) => (base.clone().with_budgets(u), u.describe()),
        };
        let names = self.guest.as_ref().map(|g| g.names.as_slice());
        let vm = replan(&config, &self.topology, self.num_vcpus, names)?;
        let mut all = self.pending.take().map_or_else(Vec::new, |p| p.what);
        all.push(what.clone());
        self.pending = Some(Pending {
            config,
            vm,
            what: all,
        });
        Ok(what)
    }

    /// The changes waiting for the next policy period, as one line.
    pub fn pending(&self) -> Option<String> {
        self.pending.as_ref().map(|p| p.what.join("; "))
    }

    /// Applies the pending changes, if any: the new configuration and a
    /// policy built for it (for the guest's stages once it registered).
    /// Returns the timeline's line: `applied …`, or `not applied …` when
    /// the guest re-registered stages the change no longer fits.
    fn apply_pending(&mut self) -> Option<String> {
        let p = self.pending.take()?;
        let what = p.what.join("; ");
        let names = self.guest.as_ref().map(|g| g.names.as_slice());
        let mut policy = match build_policy(&p.vm.resolved, self.num_vcpus, names) {
            Ok(policy) => policy,
            Err(e) => {
                tracing::warn!("operator change not applied: {what}: {e}");
                return Some(format!("not applied: {what}: {e}"));
            }
        };
        tracing::info!("operator change applied: {what}");
        match self.guest.as_mut() {
            Some(g) => g.policy = policy,
            None => self.plan = policy.plan(&[]),
        }
        self.vm = p.vm;
        self.config = p.config;
        Some(format!("applied: {what}"))
    }

    /// The VM's configuration (after fitting it to the vCPU count).
    pub fn vm(&self) -> &VmPlan {
        &self.vm
    }

    /// The plan applied now.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The guest registered `names`: builds the policy for them (kept if the
    /// names are those of the previous registration), starts a new
    /// accounting and returns the first plan, whose stage map the caller
    /// publishes before the guest resumes. Never fails: stage names are the
    /// untrusted guest's, and a configuration that does not fit them is
    /// adjusted by [`host_sched::vm::guest_policy`] (logged, and in the
    /// report's warnings) rather than ending the VM.
    pub fn register(&mut self, names: &[String]) -> &Plan {
        let policy = match self.guest.take() {
            Some(g) if g.names == names => g.policy,
            _ => {
                let (policy, warnings) =
                    host_sched::vm::guest_policy(&self.vm.resolved, self.num_vcpus, names);
                // A guest may REGISTER in a loop: rate-limited.
                for w in &warnings {
                    crate::guest_warn!("REGISTER: {w}");
                }
                self.guest_warnings = warnings;
                policy
            }
        };
        let mut policy = policy;
        self.plan = policy.plan(&vec![0.0; names.len()]);
        self.guest = Some(Guest {
            names: names.to_vec(),
            accounting: Accounting::new(names, self.num_vcpus, self.tsc_khz),
            policy,
        });
        self.map_changes += 1;
        self.period_start = Instant::now();
        &self.plan
    }

    /// The adjustments the last REGISTER needed (see [`Self::register`]).
    pub fn guest_warnings(&self) -> &[String] {
        &self.guest_warnings
    }

    /// Folds one drain's validated events into the accounting (ignored
    /// before REGISTER: the device returns none then).
    pub fn ingest(&mut self, drained: &Drained) {
        if let Some(g) = self.guest.as_mut() {
            g.accounting.ingest(drained);
        }
    }

    /// Ends the policy period at `now`: the load of each stage over the
    /// period (vCPUs' worth of time: busy ns / period ns) goes to the
    /// policy, and its plan is returned with whether the stage map changed.
    /// `None` before the guest registered.
    ///
    /// Load is measured vCPU time per stage rather than seed 000 §4.5's
    /// runnable threads per stage: measured here, that signal swung between
    /// stages with thread convoys every other period (docs/design.md).
    pub fn period(&mut self, now: Instant) -> Option<Decision> {
        let applied = self.apply_pending();
        let Some(g) = self.guest.as_mut() else {
            // Before REGISTER only an operator's change makes a new plan.
            let what = applied?;
            self.record(now, Vec::new(), false, 0.0, None, Some(what), true);
            return Some(Decision {
                plan: self.plan.clone(),
                map_changed: false,
            });
        };
        let period_ns = now.saturating_duration_since(self.period_start).as_nanos() as f64;
        self.period_start = now;
        let (busy, requests) = g.accounting.take_window();
        let load: Vec<f64> = busy
            .iter()
            .map(|ns| *ns as f64 / period_ns.max(1.0))
            .collect();
        let requests_per_s = requests as f64 * 1e9 / period_ns.max(1.0);
        g.policy.observe_rate(requests_per_s);
        let plan = g.policy.plan(&load);
        let decision = g.policy.decision();
        if let Some(d) = &decision {
            tracing::info!(mode = d.mode.name(), "auto: {}", d.what);
        }
        let map_changed = plan.stage_vcpus != self.plan.stage_vcpus
            || plan.owned_vcpus() != self.plan.owned_vcpus();
        if map_changed {
            self.map_changes += 1;
        }
        let mode = decision.as_ref().map(|d| d.mode.name().to_string());
        let from_api = applied.is_some();
        let what = match (applied, decision) {
            (Some(a), Some(d)) => Some(format!("{a}; auto: {}", d.what)),
            (a, d) => a.or(d.map(|d| d.what)),
        };
        self.plan = plan.clone();
        self.record(now, load, map_changed, requests_per_s, mode, what, from_api);
        Some(Decision { plan, map_changed })
    }

    /// Appends one policy period to the timeline (up to [`MAX_TIMELINE`]).
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        now: Instant,
        load: Vec<f64>,
        map_changed: bool,
        requests_per_s: f64,
        mode: Option<String>,
        decision: Option<String>,
        from_api: bool,
    ) {
        if self.timeline.len() < MAX_TIMELINE {
            self.timeline.push(TimelineEntry {
                t_ms: now.saturating_duration_since(self.start).as_secs_f64() * 1e3,
                load,
                requirement: self.plan.requirement.clone(),
                map_changed,
                requests_per_s,
                mode,
                decision,
                source: from_api.then(|| "api".to_string()),
            });
        }
    }

    /// Per stage, where it runs now (empty before REGISTER).
    pub fn placements(&self) -> Vec<StagePlacement> {
        let Some(g) = &self.guest else {
            return Vec::new();
        };
        g.names
            .iter()
            .enumerate()
            .map(|(s, name)| StagePlacement {
                name: name.clone(),
                vcpus: (0..self.num_vcpus.min(64))
                    .filter(|v| {
                        self.plan
                            .stage_vcpus
                            .get(s)
                            .is_some_and(|m| m & (1 << v) != 0)
                    })
                    .collect(),
                cores: self
                    .plan
                    .stage_cores
                    .get(s)
                    .map(|c| c.to_string())
                    .unwrap_or_default(),
                requirement: self.plan.requirement.get(s).copied().unwrap_or(0),
            })
            .collect()
    }

    /// Stage-map changes (the first map at REGISTER included) and the
    /// timeline, for the report.
    pub fn history(&self) -> (u64, &[TimelineEntry]) {
        (self.map_changes, &self.timeline)
    }

    /// Writes the per-stage part of the channel report (see
    /// [`Accounting::fill_report`]).
    pub fn fill_report(&self, r: &mut ChannelReport) {
        if let Some(g) = &self.guest {
            g.accounting.fill_report(r);
        }
    }
}
