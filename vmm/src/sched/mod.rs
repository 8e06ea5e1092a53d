//! Stage scheduling in the VMM: applies `host-sched` decisions.
//!
//! The `stage-sched` thread drains the stage rings every drain period and,
//! every policy period, feeds the measured stage load to the configured
//! policy, publishes the resulting stage map to the guest and re-pins the vCPU
//! threads it moved. Helper threads (the VMM's main/event-loop thread, the
//! signal thread, `stage-sched` itself) pin themselves to the housekeeping
//! cores when they start; vCPU threads pin themselves to their initial cores
//! before entering the guest (as Cloud Hypervisor's `--cpus affinity`).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use host_sched::config::Resolved;
use host_sched::cpuset::CpuSet;
use host_sched::policy::{self, Plan, Policy, PolicyKind};
use host_sched::topology::{gettid, set_thread_affinity, thread_affinity};
use serde::Serialize;

use crate::stage::StageDevice;

/// Most timeline entries kept in the report (one per policy period).
const MAX_TIMELINE: usize = 100_000;

/// A helper thread of the VMM and the affinity read back after pinning it.
#[derive(Clone, Debug, Serialize)]
pub struct HelperThread {
    /// Thread name.
    pub name: String,
    /// Kernel thread id.
    pub tid: i32,
    /// Affinity read back with `sched_getaffinity` after pinning (cpulist).
    pub affinity: String,
}

/// A vCPU thread's id and its affinity as last applied and read back.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VcpuThread {
    /// vCPU index.
    pub index: u32,
    /// Kernel thread id (0 until the thread started).
    pub tid: i32,
    /// Affinity read back after the last pin (cpulist).
    pub affinity: String,
}

/// One policy period.
#[derive(Clone, Debug, Serialize)]
pub struct TimelineEntry {
    /// Time since the VM started (ms).
    pub t_ms: f64,
    /// vCPUs' worth of time spent in each stage over the period (the
    /// policy's input: busy ns / period ns).
    pub load: Vec<f64>,
    /// Mean runnable threads per stage over the period (seed 000's stage
    /// load; reported, not used: see `tick`).
    pub runnable: Vec<f64>,
    /// Cores allocated per stage (0 = rides on the victim core).
    pub requirement: Vec<usize>,
    /// Whether the stage map changed this period.
    pub map_changed: bool,
}

/// Per stage, where it runs now.
#[derive(Clone, Debug, Serialize)]
pub struct StagePlacement {
    /// Stage name.
    pub name: String,
    /// vCPUs serving it.
    pub vcpus: Vec<u32>,
    /// Cores its vCPUs run on (cpulist).
    pub cores: String,
    /// Cores allocated to it.
    pub requirement: usize,
}

/// What the scheduler did; part of the JSON report.
#[derive(Clone, Debug, Serialize)]
pub struct SchedReport {
    /// Policy name.
    pub policy: PolicyKind,
    /// Policy period (ms).
    pub period_ms: u64,
    /// Stage cores (cpulist).
    pub stage_cores: String,
    /// Housekeeping cores (cpulist).
    pub housekeeping: String,
    /// Warnings: helper threads sharing the stage cores, stage cores left
    /// unused for lack of vCPUs.
    pub warnings: Vec<String>,
    /// Per stage placement (empty before the guest registered).
    pub stages: Vec<StagePlacement>,
    /// Per vCPU thread.
    pub vcpus: Vec<VcpuThread>,
    /// Helper threads.
    pub helpers: Vec<HelperThread>,
    /// Stage-map changes the policy made (the first map included).
    pub map_changes: u64,
    /// vCPU thread re-pins after start.
    pub repins: u64,
    /// Mean `sched_setaffinity` latency of those re-pins (µs).
    pub repin_mean_us: f64,
    /// One entry per policy period.
    pub timeline: Vec<TimelineEntry>,
}

/// The scheduler's state, shared by the VM's threads.
pub struct Scheduler {
    resolved: Resolved,
    num_vcpus: u32,
    start: Instant,
    /// Per vCPU, the cores it runs on before the guest registers its stages.
    initial: Vec<CpuSet>,
    warnings: Vec<String>,
    /// When the last policy period ended.
    last_tick: Mutex<Option<Instant>>,
    vcpu_tids: Vec<AtomicI32>,
    state: Mutex<State>,
}

struct State {
    policy: Option<Box<dyn Policy>>,
    names: Vec<String>,
    plan: Option<Plan>,
    vcpus: Vec<VcpuThread>,
    helpers: Vec<HelperThread>,
    map_changes: u64,
    repins: u64,
    repin_ns: u128,
    timeline: Vec<TimelineEntry>,
}

impl crate::stage::MapSource for Scheduler {
    /// Builds the policy for the guest's stages at REGISTER and returns its
    /// first stage map, so the guest never sees a map the policy did not make
    /// (`None` if the configuration does not fit; `tick` then reports it).
    fn initial_map(&self, names: &[String]) -> Option<Vec<u64>> {
        let mut st = self.lock();
        self.build_policy(&mut st, names).ok()?;
        let plan = st.policy.as_mut()?.plan(&vec![0.0; names.len()]);
        let masks = plan.stage_vcpus.clone();
        st.map_changes += 1;
        st.plan = Some(plan);
        Some(masks)
    }
}

impl Scheduler {
    /// A scheduler for `num_vcpus` vCPUs under the resolved configuration.
    pub fn new(resolved: Resolved, num_vcpus: u32, warnings: Vec<String>) -> Arc<Self> {
        let ctx = resolved.context(num_vcpus, Vec::new());
        // The plan for a guest without stages: `off` floats over all stage
        // cores, the others pin vCPU v to stage core v mod C.
        let initial = policy::build(resolved.policy, ctx).plan(&[]).vcpu_cores;
        Arc::new(Self {
            initial,
            warnings,
            last_tick: Mutex::new(None),
            resolved,
            num_vcpus,
            start: Instant::now(),
            vcpu_tids: (0..num_vcpus).map(|_| AtomicI32::new(0)).collect(),
            state: Mutex::new(State {
                policy: None,
                names: Vec::new(),
                plan: None,
                vcpus: (0..num_vcpus)
                    .map(|index| VcpuThread {
                        index,
                        ..Default::default()
                    })
                    .collect(),
                helpers: Vec::new(),
                map_changes: 0,
                repins: 0,
                repin_ns: 0,
                timeline: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the policy exists (the guest's stages were matched).
    pub fn has_policy(&self) -> bool {
        self.lock().policy.is_some()
    }

    /// Builds the policy for the guest's stage `names` unless it exists.
    /// Errors: a configured stage the guest did not declare, budgets that
    /// cannot use every stage core.
    fn build_policy(&self, st: &mut State, names: &[String]) -> Result<(), String> {
        if st.policy.is_none() {
            let budgets = self
                .resolved
                .budgets_for(names)
                .map_err(|e| e.to_string())?;
            st.policy = Some(policy::build(
                self.resolved.policy,
                self.resolved.context(self.num_vcpus, budgets),
            ));
            st.names = names.to_vec();
        }
        Ok(())
    }

    /// The policy period.
    pub fn period(&self) -> std::time::Duration {
        self.resolved.period
    }

    /// Called by vCPU thread `index` when it starts: records its thread id
    /// and pins it to its initial cores (errors are logged, not fatal).
    pub fn start_vcpu_thread(&self, index: u32) {
        let tid = gettid();
        self.vcpu_tids[index as usize].store(tid, Ordering::Release);
        let cores = &self.initial[index as usize];
        if let Err(e) = set_thread_affinity(0, cores) {
            tracing::warn!(vcpu = index, "cannot pin vCPU thread to {cores}: {e}");
        }
        let mut st = self.lock();
        st.vcpus[index as usize].tid = tid;
        st.vcpus[index as usize].affinity = read_back(0);
    }

    /// Called by a helper thread when it starts: pins it to the housekeeping
    /// cores and records it under `name`.
    pub fn start_helper_thread(&self, name: &str) {
        let tid = gettid();
        if let Err(e) = set_thread_affinity(0, &self.resolved.housekeeping) {
            tracing::warn!(
                thread = name,
                "cannot pin helper thread to {}: {e}",
                self.resolved.housekeeping
            );
        }
        let mut st = self.lock();
        // `adopt_threads` may have found this thread first.
        st.helpers.retain(|h| h.tid != tid);
        st.helpers.push(HelperThread {
            name: name.into(),
            tid,
            affinity: read_back(0),
        });
    }

    /// Waits (at most `timeout`) until every vCPU thread has recorded its id.
    pub fn wait_vcpus_started(&self, timeout: std::time::Duration) {
        let deadline = Instant::now() + timeout;
        while self
            .vcpu_tids
            .iter()
            .any(|t| t.load(Ordering::Acquire) == 0)
            && Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    /// Pins every thread of this process that is neither a vCPU thread nor a
    /// known helper to the housekeeping cores and records it as a helper
    /// (e.g. KVM's `kvm-nx-lpage-recovery` worker, threads of devices added
    /// later). Called every policy period.
    pub fn adopt_threads(&self) {
        // A thread that has not run its start-up yet still carries the
        // process's name: wait until every vCPU thread has recorded itself.
        if self
            .vcpu_tids
            .iter()
            .any(|t| t.load(Ordering::Acquire) == 0)
        {
            return;
        }
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        let tids: Vec<i32> = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        for tid in tids {
            let known = self
                .vcpu_tids
                .iter()
                .any(|t| t.load(Ordering::Acquire) == tid)
                || self.lock().helpers.iter().any(|h| h.tid == tid);
            if known {
                continue;
            }
            let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default();
            // A vCPU thread that has not recorded its id yet pins itself.
            if name.starts_with("vcpu") {
                continue;
            }
            if let Err(e) = set_thread_affinity(tid, &self.resolved.housekeeping) {
                tracing::debug!(tid, thread = %name, "cannot pin thread: {e}");
                continue;
            }
            tracing::debug!(tid, thread = %name, "helper thread moved to housekeeping cores");
            self.lock().helpers.push(HelperThread {
                name,
                tid,
                affinity: read_back(tid),
            });
        }
    }

    /// One policy period: once the guest has registered its stages, runs the
    /// policy on the load measured by `device`, publishes a changed stage map
    /// and re-pins moved vCPU threads. Errors (a configured stage the guest
    /// does not declare, budgets that cannot fit) end the VM.
    pub fn tick(&self, device: &StageDevice) -> Result<(), String> {
        let Some((busy, runnable)) = device.take_load() else {
            return Ok(());
        };
        // Load = vCPUs' worth of time spent in each stage this period. The
        // thesis uses runnable threads per stage (seed 000 §4.5); measured
        // here, that signal swings between stages with thread convoys (all
        // 6 threads of the test guest in one stage, then in the other, every
        // other period), while busy time follows the work per stage.
        let period_ns = self
            .last_tick
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(Instant::now());
        let period_ns = period_ns.map_or(self.resolved.period.as_nanos() as f64, |t| {
            t.elapsed().as_nanos() as f64
        });
        let load: Vec<f64> = busy.iter().map(|b| b / period_ns.max(1.0)).collect();
        let mut st = self.lock();
        if st.policy.is_none() {
            let names = device.stage_names().unwrap_or_default();
            self.build_policy(&mut st, &names)?;
        }
        let Some(policy) = st.policy.as_mut() else {
            return Ok(());
        };
        let plan = policy.plan(&load);
        let map_changed = st
            .plan
            .as_ref()
            .is_none_or(|p| p.stage_vcpus != plan.stage_vcpus);
        if map_changed {
            device.publish(&plan.stage_vcpus);
            st.map_changes += 1;
        }
        for v in 0..self.num_vcpus as usize {
            let applied = st
                .plan
                .as_ref()
                .map_or(&self.initial[v], |p| &p.vcpu_cores[v]);
            if *applied == plan.vcpu_cores[v] {
                continue;
            }
            let tid = self.vcpu_tids[v].load(Ordering::Acquire);
            if tid == 0 {
                continue;
            }
            let t0 = Instant::now();
            match set_thread_affinity(tid, &plan.vcpu_cores[v]) {
                Ok(()) => {
                    st.repin_ns += t0.elapsed().as_nanos();
                    st.repins += 1;
                    st.vcpus[v].affinity = read_back(tid);
                }
                Err(e) => tracing::warn!(vcpu = v, "re-pin to {} failed: {e}", plan.vcpu_cores[v]),
            }
        }
        if st.timeline.len() < MAX_TIMELINE {
            st.timeline.push(TimelineEntry {
                t_ms: self.start.elapsed().as_secs_f64() * 1e3,
                load,
                runnable,
                requirement: plan.requirement.clone(),
                map_changed,
            });
        }
        st.plan = Some(plan);
        Ok(())
    }

    /// What the scheduler did.
    pub fn report(&self) -> SchedReport {
        let st = self.lock();
        let r = &self.resolved;
        let stages = match &st.plan {
            Some(plan) => st
                .names
                .iter()
                .enumerate()
                .map(|(s, name)| StagePlacement {
                    name: name.clone(),
                    vcpus: (0..self.num_vcpus.min(64))
                        .filter(|v| plan.stage_vcpus[s] & (1 << v) != 0)
                        .collect(),
                    cores: plan.stage_cores[s].to_string(),
                    requirement: plan.requirement[s],
                })
                .collect(),
            None => Vec::new(),
        };
        SchedReport {
            policy: r.policy,
            period_ms: r.period.as_millis() as u64,
            stage_cores: r.stage_cores.to_string(),
            housekeeping: r.housekeeping.to_string(),
            warnings: r
                .helpers_share_stage_cores
                .then(|| {
                    format!(
                        "no housekeeping core left: helper threads share the stage cores {}",
                        r.stage_cores
                    )
                })
                .into_iter()
                .chain(self.warnings.iter().cloned())
                .collect(),
            stages,
            vcpus: st.vcpus.clone(),
            helpers: st.helpers.clone(),
            map_changes: st.map_changes,
            repins: st.repins,
            repin_mean_us: if st.repins == 0 {
                0.0
            } else {
                st.repin_ns as f64 / st.repins as f64 / 1e3
            },
            timeline: st.timeline.clone(),
        }
    }
}

fn read_back(tid: i32) -> String {
    thread_affinity(tid)
        .map(|s| s.to_string())
        .unwrap_or_else(|e| format!("error: {e}"))
}
