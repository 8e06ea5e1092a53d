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

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use host_sched::config::ConfigError;
use host_sched::policy::{Plan, Policy};
use host_sched::vm::{build_policy, VmPlan};
use hypercall_abi::stage::{IDLE_THREAD, STAGE_NONE};
use stagevm_report::{ChannelReport, StagePlacement, StageStats, TimelineEntry};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

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
    /// never sees a map the policy did not make. Errors: the configuration
    /// does not fit the guest's stages (the VM then ends).
    pub fn on_register(&self, registered: &Registered) -> Result<(), ConfigError> {
        let mut c = self.controller();
        let plan = c.register(&registered.names)?;
        if let Some(device) = &self.device {
            device.publish(&plan.stage_vcpus, plan.owned_vcpus());
        }
        self.pinner.apply(plan);
        drop(c);
        let _ = self.registered.write(1);
        Ok(())
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

    /// One policy period: adopt stray threads, ask the controller, publish a
    /// changed stage map and re-pin moved vCPUs.
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
        let period = self.period();
        let mut next_period = Instant::now() + period;
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
                next_period = Instant::now() + period;
                self.policy_period();
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
    /// A controller for a VM of `num_vcpus` vCPUs under `vm`, whose guest
    /// TSC runs at `tsc_khz` (kHz; 0 if unknown). Its first plan places the
    /// vCPUs before the guest registers any stage.
    pub fn new(vm: VmPlan, num_vcpus: u32, tsc_khz: u64) -> Self {
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
        }
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
    /// publishes before the guest resumes. Errors: a configured stage the
    /// guest did not declare, budgets that cannot use every stage core.
    pub fn register(&mut self, names: &[String]) -> Result<&Plan, ConfigError> {
        let policy = match self.guest.take() {
            Some(g) if g.names == names => g.policy,
            _ => build_policy(&self.vm.resolved, self.num_vcpus, Some(names))?,
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
        Ok(&self.plan)
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
        let g = self.guest.as_mut()?;
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
        if self.timeline.len() < MAX_TIMELINE {
            self.timeline.push(TimelineEntry {
                t_ms: now.saturating_duration_since(self.start).as_secs_f64() * 1e3,
                load,
                requirement: plan.requirement.clone(),
                map_changed,
                requests_per_s,
                mode: decision.as_ref().map(|d| d.mode.name().to_string()),
                decision: decision.map(|d| d.what),
            });
        }
        self.plan = plan.clone();
        Some(Decision { plan, map_changed })
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

/// Most guest threads tracked for migration counting (bounds the map a
/// guest can grow by inventing thread ids).
const MAX_TRACKED_THREADS: usize = 1 << 16;

/// Counters per stage since REGISTER, and the load window.
#[derive(Debug, Default)]
pub struct Accounting {
    /// Guest TSC frequency (kHz); 0 = unknown (occupancy in ticks).
    tsc_khz: u64,
    /// Per stage, its counters.
    stages: Vec<StageStats>,
    /// Per vCPU: (stage, tsc) of its last valid enter, for occupancy.
    current: Vec<Option<(u32, u64)>>,
    /// Per guest thread: (vCPU, stage or STAGE_NONE) of its last event.
    threads: HashMap<u32, (u32, u32)>,
    /// Threads not tracked because the map was full.
    untracked: u64,
    /// TSC of the first and last valid events.
    first_tsc: Option<u64>,
    last_tsc: u64,
    /// Per stage, vCPU time (ns) since the last [`Accounting::take_window`].
    window_ns: Vec<u64>,
    /// Requests completed (valid `stage_exit` events) in the same window.
    window_requests: u64,
}

impl Accounting {
    /// Accounting for a guest that registered `names` on `num_vcpus` vCPUs
    /// with TSC frequency `tsc_khz` (kHz, 0 if unknown).
    pub fn new(names: &[String], num_vcpus: u32, tsc_khz: u64) -> Self {
        Self {
            tsc_khz,
            stages: names
                .iter()
                .enumerate()
                .map(|(id, name)| StageStats {
                    id: id as u32,
                    name: name.clone(),
                    ..Default::default()
                })
                .collect(),
            current: vec![None; num_vcpus as usize],
            window_ns: vec![0; names.len()],
            ..Default::default()
        }
    }

    fn ticks_to_ns(&self, ticks: u64) -> u64 {
        if self.tsc_khz == 0 {
            ticks
        } else {
            (u128::from(ticks) * 1_000_000 / u128::from(self.tsc_khz)).min(u128::from(u64::MAX))
                as u64
        }
    }

    /// Folds one drain's events in. Stage ids were validated by the device
    /// against the registered stage count; ids past this accounting's
    /// stages (a re-registration with fewer stages) are ignored.
    pub fn ingest(&mut self, drained: &Drained) {
        for v in &drained.resynced {
            if let Some(c) = self.current.get_mut(*v as usize) {
                *c = None;
            }
        }
        for ev in &drained.events {
            let v = ev.vcpu as usize;
            if v >= self.current.len() {
                continue;
            }
            let previous = self.current[v];
            if let Some((prev_stage, since)) = previous {
                if let Some(ticks) = ev.tsc.checked_sub(since) {
                    let ns = self.ticks_to_ns(ticks);
                    if let Some(s) = self.stages.get_mut(prev_stage as usize) {
                        s.occupancy_ns = s.occupancy_ns.saturating_add(ns);
                        let w = &mut self.window_ns[prev_stage as usize];
                        *w = w.saturating_add(ns);
                    }
                }
            }
            if ev.stage == STAGE_NONE {
                self.current[v] = None;
                if ev.thread != IDLE_THREAD {
                    self.window_requests += 1;
                }
            } else if let Some(s) = self.stages.get_mut(ev.stage as usize) {
                s.events += 1;
                if previous.map(|(p, _)| p) != Some(ev.stage) {
                    s.arrivals += 1;
                }
                self.current[v] = Some((ev.stage, ev.tsc));
            }
            if ev.thread != IDLE_THREAD {
                self.track_thread(ev.vcpu, ev.thread, ev.stage, ev.tsc);
            }
        }
    }

    fn track_thread(&mut self, vcpu: u32, thread: u32, stage: u32, tsc: u64) {
        self.first_tsc.get_or_insert(tsc);
        self.last_tsc = self.last_tsc.max(tsc);
        if self.threads.len() >= MAX_TRACKED_THREADS && !self.threads.contains_key(&thread) {
            self.untracked += 1;
            return;
        }
        let previous = self.threads.insert(thread, (vcpu, stage));
        if let Some((prev_vcpu, prev_stage)) = previous {
            if prev_vcpu != vcpu && stage != STAGE_NONE {
                if let Some(s) = self.stages.get_mut(stage as usize) {
                    s.migrations_in += 1;
                }
                if let Some(s) = self.stages.get_mut(prev_stage as usize) {
                    s.migrations_out += 1;
                }
            }
        }
    }

    /// vCPU time per stage (ns) and requests completed since the previous
    /// call; starts a new window.
    pub fn take_window(&mut self) -> (Vec<u64>, u64) {
        let window = self.window_ns.clone();
        self.window_ns.iter_mut().for_each(|w| *w = 0);
        (window, std::mem::take(&mut self.window_requests))
    }

    /// Writes the per-stage part of the channel report: `stages`, `busy_ns`
    /// (guest time from the first to the last event), `requests_per_s` (of
    /// the `requests` the device counted) and `untracked_threads`.
    pub fn fill_report(&self, r: &mut ChannelReport) {
        r.stages = self.stages.clone();
        r.untracked_threads = self.untracked;
        if let Some(first) = self.first_tsc {
            r.busy_ns = self.ticks_to_ns(self.last_tsc.saturating_sub(first));
            if r.busy_ns > 0 {
                r.requests_per_s = r.requests as f64 * 1e9 / r.busy_ns as f64;
            }
        }
    }
}
