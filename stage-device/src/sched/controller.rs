//! The controller: the one place where the VMM turns the guest's stage
//! counters or events into scheduling decisions, by asking host-sched. The
//! `stage-sched` loop that feeds it wakes by [`super::Pacer`].
//!
//! It owns the per-stage accounting and its load window, the VM's policy
//! (built once per registration by [`host_sched::vm::build_policy`]), the
//! plan last applied and the timeline. Its inputs are counter reads
//! ([`Controller::ingest_counters`]), validated events
//! ([`Controller::ingest`]) and the clock ([`Controller::period`]); its
//! outputs are [`Plan`]s, which the caller publishes (stage map) and applies
//! (pins). It never touches guest memory or threads itself.

use std::time::Instant;

use host_sched::config::{BudgetsUpdate, Config, CpuWeightUpdate, PolicyUpdate, StagesConfigError};
use host_sched::cpuset::CpuSet;
use host_sched::policy::relabel::Relabel;
use host_sched::policy::{Observation, Plan, Policy};
use host_sched::topology::Topology;
use host_sched::vm::{build_policy, replan, Setup, VmPlan};
use stagevm_report::{ChannelReport, CpuReport, PerStage, StagePlacement, TimelineEntry};

use super::accounting::Accounting;
use super::counter_reader::CounterReader;
use super::cpu::SchedStat;
use super::latency_reader::LatencyReader;
use super::observe::Observer;
use super::timeline::Timeline;
use crate::stage::{Blocks, Drained, Registered};

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
    timeline: Timeline,
    /// When the last REGISTER was served (planned at once).
    last_register: Option<Instant>,
    /// A REGISTER that came within a policy period of the last one served:
    /// planned at the next policy period (the latest wins).
    pending_register: Option<Registered>,
    /// REGISTERs answered with the current map and planned later.
    registrations_coalesced: u64,
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
    /// The periods' measurements for the policy and the run's CPU totals.
    observer: Observer,
    /// The policy's cores → the VM's now, after changes of the stage
    /// cores that kept their number (identity when the policy was built
    /// for the cores now).
    relabel: Relabel,
    /// Changes of the stage cores that kept the policy.
    relabels: u64,
}

/// A change the operator asks for while the VM runs (the operator API).
#[derive(Clone, Debug)]
pub enum Change {
    /// `PUT /api/v1/stages.policy`.
    Policy(PolicyUpdate),
    /// `PUT /api/v1/stages.budgets`.
    Budgets(BudgetsUpdate),
    /// `PUT /api/v1/stages.cpu_weight`: applied by the pinner; the
    /// policy and its state are kept.
    CpuWeight(CpuWeightUpdate),
}

/// Changes validated and waiting for the next policy period.
struct Pending {
    config: Config,
    vm: VmPlan,
    what: Vec<String>,
    /// Whether the configuration differs from the one applied in more
    /// than `host.cpu_weight` (which the pinner applies and no policy
    /// reads): only then is the policy rebuilt, its state (EWMA, `auto`'s
    /// trials) started afresh.
    replans: bool,
    /// Whether it differs only in `[host]` (the host daemon's cores,
    /// housekeeping, weight): then, with as many stage cores as before,
    /// the policy is kept and its cores renamed ([`Relabel`]).
    host_only: bool,
}

struct Guest {
    names: Vec<String>,
    accounting: Accounting,
    policy: Box<dyn Policy>,
}

impl Guest {
    /// The accounting for a registration: per-vCPU counters (ABI minor 2)
    /// or ring events.
    fn accounting(registered: &Registered, num_vcpus: u32, tsc_khz: u64) -> Accounting {
        let a = Accounting::new(&registered.names, num_vcpus, tsc_khz);
        if !registered.counters {
            return a;
        }
        let a = a.with_counters(CounterReader::new(
            registered.generation,
            num_vcpus,
            registered.register_tsc,
            registered.host_tsc,
            tsc_khz,
        ));
        if registered.latency {
            a.with_latency(LatencyReader::new(num_vcpus))
        } else {
            a
        }
    }
}

/// What one policy period decided.
#[derive(Debug)]
pub struct Decision {
    /// The plan to apply.
    pub plan: Plan,
    /// Whether its stage map (masks, owned vCPUs or visit policy) differs
    /// from the previous one (publish it).
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
            timeline: Timeline::default(),
            last_register: None,
            pending_register: None,
            registrations_coalesced: 0,
            guest_warnings: Vec::new(),
            config: setup.config.clone(),
            topology: setup.topology.clone(),
            pending: None,
            observer: Observer::default(),
            relabel: Relabel::default(),
            relabels: 0,
        }
    }

    /// Validates `change` exactly as a `--stages` file (host-sched's
    /// [`replan`]: resolution against the host, the VM's vCPU count and the
    /// guest's declared stages), starting from the configuration the VM
    /// will run next (the current one with the changes still pending), and
    /// queues it for the next policy period. Returns the line the timeline
    /// will record. Errors: the [`StagesConfigError`] naming key and value;
    /// nothing is queued then.
    pub fn propose(&mut self, change: &Change) -> Result<String, StagesConfigError> {
        let base = self.pending.as_ref().map_or(&self.config, |p| &p.config);
        let (config, what) = match change {
            Change::Policy(u) => (base.clone().with_policy(u), u.describe()),
            Change::Budgets(u) => {
                u.check()?;
                (base.clone().with_budgets(u), u.describe())
            }
            Change::CpuWeight(u) => (base.clone().with_cpu_weight(u), u.describe()),
        };
        let names = self.guest.as_ref().map(|g| g.names.as_slice());
        let vm = replan(&config, &self.topology, self.num_vcpus, names)?;
        let mut all = self.pending.take().map_or_else(Vec::new, |p| p.what);
        all.push(what.clone());
        let mut unweighted = config.clone();
        unweighted.host.cpu_weight = self.config.host.cpu_weight;
        let replans = unweighted != self.config;
        let mut same_host = config.clone();
        same_host.host = self.config.host.clone();
        let host_only = same_host == self.config;
        self.pending = Some(Pending {
            config,
            vm,
            what: all,
            replans,
            host_only,
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
        if !p.replans {
            // Only the CPU weight: the pinner reads it from `vm`.
            tracing::info!("operator change applied: {what}");
            self.vm = p.vm;
            self.config = p.config;
            return Some(format!("applied: {what}"));
        }
        let (old, new) = (
            self.vm.resolved.stage_cores.clone(),
            p.vm.resolved.stage_cores.clone(),
        );
        if let Some(relabel) = p.host_only.then(|| self.relabel.then(&old, &new)).flatten() {
            // As many stage cores as before: the policy and what it learnt
            // stay; its plans get the new cores' names.
            tracing::info!("operator change applied, policy kept ({old} -> {new}): {what}");
            if let Some(step) = Relabel::default().then(&old, &new) {
                self.plan = step.apply(std::mem::take(&mut self.plan));
            }
            self.relabel = relabel;
            self.relabels += 1;
            self.vm = p.vm;
            self.config = p.config;
            return Some(format!("applied: {what} (policy kept)"));
        }
        if p.host_only && self.retarget(&p.vm) {
            // Another number of cores: a policy that can (`auto` holding a
            // mode) keeps what it learnt and plans for the new cores.
            tracing::info!(
                "operator change applied, policy kept ({old} -> {new}, retargeted): {what}"
            );
            self.relabel = Relabel::default();
            self.relabels += 1;
            self.vm = p.vm;
            self.config = p.config;
            return Some(format!("applied: {what} (policy kept)"));
        }
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
        self.relabel = Relabel::default();
        self.vm = p.vm;
        self.config = p.config;
        Some(format!("applied: {what}"))
    }

    /// Asks the guest's policy to plan for `vm`'s stage cores, keeping
    /// what it learnt ([`Policy::retarget`]); false before REGISTER, when
    /// the guest's budgets do not fit `vm`, or when the policy cannot.
    fn retarget(&mut self, vm: &VmPlan) -> bool {
        let num_vcpus = self.num_vcpus;
        let Some(g) = self.guest.as_mut() else {
            return false;
        };
        let Ok(budgets) = vm.resolved.budgets_for(&g.names) else {
            return false;
        };
        g.policy.retarget(vm.resolved.context(num_vcpus, budgets))
    }

    /// The VM's configuration (after fitting it to the vCPU count).
    pub fn vm(&self) -> &VmPlan {
        &self.vm
    }

    /// The plan applied now.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The guest registered at `now`. Served when no REGISTER was served
    /// within the last policy period: `Self::plan_registration` makes
    /// the first plan, whose stage map the caller publishes before the
    /// guest resumes, and whose pins it applies; returns true. Otherwise it
    /// is coalesced: counted, kept for the next policy period (the latest
    /// wins), and the caller publishes the current plan's map; returns
    /// false. A guest that registers in a loop thus costs at most one
    /// planning, one timeline entry and one re-pin per policy period.
    pub fn register(&mut self, registered: &Registered, now: Instant) -> bool {
        let period = self.vm.resolved.period;
        let recent = self
            .last_register
            .is_some_and(|t| now.saturating_duration_since(t) < period);
        if recent && self.guest.is_some() {
            self.registrations_coalesced += 1;
            self.pending_register = Some(registered.clone());
            return false;
        }
        self.last_register = Some(now);
        self.pending_register = None;
        self.plan_registration(registered);
        true
    }

    /// Plans a registration: builds the policy for its stage names (kept if
    /// the names are those of the previous registration), starts a new
    /// accounting and makes the first plan. Never fails: stage names are the
    /// untrusted guest's, and a configuration that does not fit them is
    /// adjusted by [`host_sched::vm::guest_policy`] (logged, and in the
    /// report's warnings) rather than ending the VM.
    fn plan_registration(&mut self, registered: &Registered) {
        let names = registered.names.as_slice();
        let policy = match self.guest.take() {
            Some(g) if g.names == names => g.policy,
            _ => {
                // Built for the cores the VM has now.
                self.relabel = Relabel::default();
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
        self.plan = self.relabel.apply(policy.plan(&vec![0.0; names.len()]));
        self.guest = Some(Guest {
            names: names.to_vec(),
            accounting: Guest::accounting(registered, self.num_vcpus, self.tsc_khz),
            policy,
        });
        self.map_changes += 1;
        self.period_start = Instant::now();
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

    /// Folds one read of a counters guest's blocks (registration
    /// `generation`, read at host TSC `host_tsc`) into the accounting.
    pub fn ingest_counters(&mut self, generation: u64, blocks: &Blocks, host_tsc: u64) {
        if let Some(g) = self.guest.as_mut() {
            g.accounting.ingest_counters(generation, blocks, host_tsc);
        }
    }

    /// Ends the policy period at `now`: the load of each stage over the
    /// period (vCPUs' worth of time: busy ns / period ns) and what was
    /// measured in it ([`Observation`]: the rate, the work CPU from the vCPU
    /// threads' schedstat `cpu` read now, the utilisation, the timed
    /// requests) go to the policy, and its plan is returned with whether
    /// the stage map changed. `None` before the guest registered.
    ///
    /// Load is measured vCPU time per stage rather than seed 000 §4.5's
    /// runnable threads per stage: measured here, that signal swung between
    /// stages with thread convoys every other period (docs/design.md).
    pub fn period(&mut self, now: Instant, cpu: &[Option<SchedStat>]) -> Option<Decision> {
        let mut registered_now = false;
        if let Some(r) = self.pending_register.take() {
            // A REGISTER coalesced since the last period: plan it now.
            self.last_register = Some(now);
            self.plan_registration(&r);
            registered_now = true;
        }
        let applied = self.apply_pending();
        let Some(g) = self.guest.as_mut() else {
            // Before REGISTER only an operator's change makes a new plan.
            let what = applied?;
            let nothing = Observation::default();
            self.record(now, Vec::new(), false, &nothing, None, Some(what), true);
            return Some(Decision {
                plan: self.plan.clone(),
                map_changed: false,
            });
        };
        let elapsed_ns = now.saturating_duration_since(self.period_start).as_nanos() as f64;
        self.period_start = now;
        let mut window = g.accounting.take_window();
        let (busy, window_ns) = (&window.busy, window.length_ns);
        // A counters guest's window is the reads' own (every vCPU's time
        // sums to it); a rings guest's is the period's.
        let period_ns = window_ns.map_or(elapsed_ns, |ns| ns as f64);
        let load: Vec<f64> = busy
            .iter()
            .map(|ns| *ns as f64 / period_ns.max(1.0))
            .collect();
        // Without the guest's TSC rate the reads' window is in ticks, right
        // for the load (a ratio) but not for a rate: the period's own time.
        let rate_ns = if g.accounting.tsc_khz() == 0 {
            elapsed_ns
        } else {
            period_ns
        };
        // The rate `auto` compares, in requests/s, estimated from the
        // period's stage entries (÷ entries per request since REGISTER):
        // entries arrive evenly, while completions come in bursts under a
        // temporal visit policy (a cohort of N threads finishes its last
        // stage back to back: ±20 % per 20 ms period at 16 threads per
        // vCPU). Every request enters the same stages in every mode.
        let requests = match g.accounting.entries_per_request() {
            Some(per) if window.entries > 0 => window.entries as f64 / per,
            _ => window.requests as f64,
        };
        let requests_per_s = requests * 1e9 / rate_ns.max(1.0);
        // The cores the vCPUs may use: at most one each.
        let cores = self
            .plan
            .vcpu_cores
            .iter()
            .flat_map(|c| c.iter())
            .collect::<CpuSet>()
            .len();
        let observation =
            self.observer
                .period(&mut window, period_ns, requests, requests_per_s, cpu, cores);
        g.policy.observe(&observation);
        let plan = self.relabel.apply(g.policy.plan(&load));
        let decision = g.policy.decision();
        if let Some(d) = &decision {
            tracing::info!(mode = d.mode.name(), "auto: {}", d.what);
        }
        let map_changed = registered_now
            || plan.stage_vcpus != self.plan.stage_vcpus
            || plan.owned_vcpus() != self.plan.owned_vcpus()
            || plan.visit != self.plan.visit;
        // A REGISTER planned at this period counted its map already
        // (`plan_registration`); the caller publishes one map for both.
        if map_changed && !registered_now {
            self.map_changes += 1;
        }
        let mode = decision.as_ref().map(|d| d.mode.name().to_string());
        let from_api = applied.is_some();
        let what = match (applied, decision) {
            (Some(a), Some(d)) => Some(format!("{a}; auto: {}", d.what)),
            (a, d) => a.or(d.map(|d| d.what)),
        };
        self.plan = plan.clone();
        self.record(now, load, map_changed, &observation, mode, what, from_api);
        Some(Decision { plan, map_changed })
    }

    /// Appends one policy period to the timeline (a ring bounded in bytes).
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        now: Instant,
        load: Vec<f64>,
        map_changed: bool,
        o: &Observation,
        mode: Option<String>,
        decision: Option<String>,
        from_api: bool,
    ) {
        let names = self.guest.as_ref().map_or(&[][..], |g| &g.names[..]);
        let quantile = |q: f64| {
            o.latency
                .as_ref()
                .and_then(|h| h.quantile(q))
                .map(|ns| ns / 1000.0)
        };
        self.timeline.push(TimelineEntry {
            t_ms: now.saturating_duration_since(self.start).as_secs_f64() * 1e3,
            load: PerStage::zip(names, load),
            requirement: PerStage::zip(names, self.plan.requirement.iter().copied()),
            map_changed,
            requests_per_s: o.requests_per_s,
            mode,
            decision,
            source: from_api.then(|| "api".to_string()),
            visit: self.plan.visit.name().into(),
            cpu_per_request_us: o.cpu_per_request_ns().map(|ns| ns / 1000.0),
            utilisation: o.utilisation,
            p50_us: quantile(0.5),
            p99_us: quantile(0.99),
            latency_samples: o.latency.as_ref().map_or(0, |h| h.count()),
        });
    }

    /// The run's CPU figures so far (see [`Observer::report`]).
    pub fn cpu_report(&self) -> Option<CpuReport> {
        self.observer.report()
    }

    /// `--policy auto`: its last finished trial.
    pub fn last_trial(&self) -> Option<host_sched::policy::auto::TrialSummary> {
        self.guest.as_ref()?.policy.last_trial()
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

    /// `--policy auto`: what its trials cost so far (`None` for other
    /// policies and before the guest registered).
    pub fn auto_stats(&self) -> Option<host_sched::policy::auto::AutoStats> {
        self.guest.as_ref()?.policy.auto_stats()
    }

    /// Changes of the stage cores that kept the policy ([`Relabel`]).
    pub fn policy_kept(&self) -> u64 {
        self.relabels
    }

    /// Stage-map changes (the first map at REGISTER included) and the
    /// timeline, for the report.
    pub fn history(&self) -> (u64, &Timeline) {
        (self.map_changes, &self.timeline)
    }

    /// Moves the timeline out (the final report; the controller keeps an
    /// empty one).
    pub fn take_timeline(&mut self) -> Vec<TimelineEntry> {
        self.timeline.take()
    }

    /// Writes the accounting's part of the channel report (see
    /// [`Accounting::fill_report`]) and the REGISTERs coalesced.
    pub fn fill_report(&self, r: &mut ChannelReport) {
        if let Some(g) = &self.guest {
            g.accounting.fill_report(r);
        }
        r.registrations_coalesced = self.registrations_coalesced;
    }
}

#[cfg(test)]
mod tests;
