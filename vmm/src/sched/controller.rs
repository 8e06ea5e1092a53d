//! The controller: the one place where the VMM turns stage events into
//! scheduling decisions, by asking host-sched.
//!
//! It owns the per-stage accounting and its load window, the VM's policy
//! (built once per registration by [`host_sched::vm::build_policy`]), the
//! plan last applied and the timeline. Its inputs are validated events
//! ([`Controller::ingest`]) and the clock ([`Controller::period`]); its
//! outputs are [`Plan`]s, which the caller publishes (stage map) and applies
//! (pins). It never touches guest memory or threads itself.

use std::time::Instant;

use host_sched::config::ConfigError;
use host_sched::policy::{Plan, Policy};
use host_sched::vm::{build_policy, VmPlan};
use stagevm_report::{ChannelReport, StagePlacement, TimelineEntry};

use super::accounting::Accounting;
use crate::stage::Drained;

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
        let load: Vec<f64> = g
            .accounting
            .take_window()
            .iter()
            .map(|ns| *ns as f64 / period_ns.max(1.0))
            .collect();
        let plan = g.policy.plan(&load);
        let map_changed = plan.stage_vcpus != self.plan.stage_vcpus;
        if map_changed {
            self.map_changes += 1;
        }
        if self.timeline.len() < MAX_TIMELINE {
            self.timeline.push(TimelineEntry {
                t_ms: now.saturating_duration_since(self.start).as_secs_f64() * 1e3,
                load,
                requirement: plan.requirement.clone(),
                map_changed,
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
                    .filter(|v| self.plan.stage_vcpus.get(s).is_some_and(|m| m & (1 << v) != 0))
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
