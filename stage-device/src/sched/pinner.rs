//! The pinner: owns the VMM's thread ids and their affinities. Helper
//! threads go to the housekeeping cores when they start (and threads the VMM
//! did not start itself, such as KVM's `kvm-nx-lpage-recovery`, when they
//! are found); vCPU threads pin themselves to their first plan's cores
//! before entering the guest (as Cloud Hypervisor's `--cpus affinity`), and
//! [`Pinner::apply`] re-pins those a new plan moves. Every affinity is read
//! back with `sched_getaffinity` for the report. The VM's CPU weight on
//! cores shared with other VMs (`host.cpu_weight`), when the host daemon
//! sends one, is applied here too ([`Pinner::set_cpu_weight`]) as its vCPU
//! threads' nice ([`host_sched::cpuweight`]). The VMM opens no cgroup or
//! autogroup file: a group's weight is set by `stagevm-hostd`, which owns
//! the VMs' cgroups (issue 50, S2), and sends a weight to the VMM only
//! where it cannot write the group.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::os::{set_thread_affinity, set_thread_nice, thread_nice};
use host_sched::cpuset::CpuSet;
use host_sched::cpuweight;
use host_sched::policy::Plan;
use host_sched::topology::{gettid, thread_affinity};
use stagevm_report::{CpuWeightReport, HelperThread, VcpuThread};

struct State {
    /// The housekeeping cores now.
    housekeeping: CpuSet,
    /// Per vCPU, the cores it runs on now (as last applied).
    applied: Vec<CpuSet>,
    vcpus: Vec<VcpuThread>,
    helpers: Vec<HelperThread>,
    repins: u64,
    repin_ns: u128,
    weight: Weight,
}

/// The CPU weight applied (`host.cpu_weight`) and what it replaced.
struct Weight {
    /// The weight now; `None`: none asked, or taken back.
    now: Option<u32>,
    /// Whether one was ever asked (the report shows it from then on).
    asked: bool,
    /// The vCPU threads whose nice the calling thread may set, once
    /// [`Pinner::seal_renice`] fixed them for its seccomp filter; `None`
    /// before (every started vCPU).
    sealed: Option<Vec<i32>>,
    /// Per vCPU, its nice found before the first change.
    thread_base: Vec<Option<i32>>,
    /// The last refusal.
    error: Option<String>,
}

/// Thread ids and affinities of one VM's threads.
pub struct Pinner {
    vcpu_tids: Vec<AtomicI32>,
    state: Mutex<State>,
    /// [`Pinner::adopt_threads`] pins unknown threads (the default).
    adopt: AtomicBool,
}

fn read_back(tid: i32) -> String {
    thread_affinity(tid)
        .map(|s| s.to_string())
        .unwrap_or_else(|e| format!("error: {e}"))
}

impl Pinner {
    /// A pinner for vCPUs starting on `initial` cores (per vCPU) with helper
    /// threads on `housekeeping`.
    pub fn new(initial: Vec<CpuSet>, housekeeping: CpuSet) -> Self {
        let n = initial.len();
        Self {
            vcpu_tids: (0..n).map(|_| AtomicI32::new(0)).collect(),
            adopt: AtomicBool::new(true),
            state: Mutex::new(State {
                housekeeping,
                applied: initial,
                vcpus: (0..n as u32)
                    .map(|index| VcpuThread {
                        index,
                        ..Default::default()
                    })
                    .collect(),
                helpers: Vec::new(),
                repins: 0,
                repin_ns: 0,
                weight: Weight {
                    now: None,
                    asked: false,
                    sealed: None,
                    thread_base: vec![None; n],
                    error: None,
                },
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called by vCPU thread `index` when it starts: records its thread id
    /// and pins it to its current cores (errors are logged, not fatal), and
    /// records the index as the thread's ([`crate::stage::current_vcpu`]).
    pub fn start_vcpu_thread(&self, index: u32) {
        crate::stage::set_current_vcpu(index);
        let tid = gettid();
        let mut st = self.lock();
        let Some(cores) = st.applied.get(index as usize).cloned() else {
            return;
        };
        if let Err(e) = set_thread_affinity(0, &cores) {
            tracing::warn!(vcpu = index, "cannot pin vCPU thread to {cores}: {e}");
        }
        if st.weight.now.is_some() {
            let n = self.vcpu_tids.len();
            weigh_thread(&mut st, n, index as usize, tid);
        }
        self.vcpu_tids[index as usize].store(tid, Ordering::Release);
        st.vcpus[index as usize].tid = tid;
        st.vcpus[index as usize].affinity = read_back(0);
    }

    /// Called by a helper thread when it starts: pins it to the housekeeping
    /// cores and records it under `name`.
    pub fn start_helper_thread(&self, name: &str) {
        let tid = gettid();
        let mut st = self.lock();
        if let Err(e) = set_thread_affinity(0, &st.housekeeping) {
            tracing::warn!(
                thread = name,
                "cannot pin helper thread to {}: {e}",
                st.housekeeping
            );
        }
        // `adopt_threads` may have found this thread first.
        st.helpers.retain(|h| h.tid != tid);
        st.helpers.push(HelperThread {
            name: name.into(),
            tid,
            affinity: read_back(0),
            cpu_ms: 0.0,
        });
    }

    /// Records `cpu_ns` (ns of CPU time) as the calling thread's, a vCPU or
    /// a helper thread it knows, for the report: called as the thread ends
    /// ([`ThreadCpu`]).
    pub fn record_cpu(&self, cpu_ns: u64) {
        let tid = gettid();
        let ms = cpu_ns as f64 / 1e6;
        let mut st = self.lock();
        if let Some(v) = st.vcpus.iter_mut().find(|v| v.tid == tid) {
            v.cpu_ms = ms;
        } else if let Some(h) = st.helpers.iter_mut().find(|h| h.tid == tid) {
            h.cpu_ms = ms;
        }
    }

    fn all_vcpus_started(&self) -> bool {
        self.vcpu_tids
            .iter()
            .all(|t| t.load(Ordering::Acquire) != 0)
    }

    /// Waits (at most `timeout`) until every vCPU thread has recorded its id.
    pub fn wait_vcpus_started(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.all_vcpus_started() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Per vCPU, its thread's kernel id (0 until it started).
    pub fn vcpu_tids(&self) -> Vec<i32> {
        self.vcpu_tids
            .iter()
            .map(|t| t.load(Ordering::Acquire))
            .collect()
    }

    /// Whether [`Pinner::adopt_threads`] pins the process's unknown
    /// threads (default: yes). An embedder whose process runs threads of
    /// its own that must stay where they are (a VMM serving several VMs,
    /// a runtime's worker pool) turns it off and names its helpers with
    /// [`Pinner::start_helper_thread`] instead.
    pub fn set_adopt_threads(&self, adopt: bool) {
        self.adopt.store(adopt, Ordering::Release);
    }

    /// Pins every thread of this process that is neither a vCPU thread nor a
    /// known helper to the housekeeping cores and records it as a helper
    /// (e.g. KVM's `kvm-nx-lpage-recovery` worker). Called at start and every
    /// policy period; does nothing once [`Pinner::set_adopt_threads`] turned
    /// it off.
    pub fn adopt_threads(&self) {
        if !self.adopt.load(Ordering::Acquire) {
            return;
        }
        // A thread that has not run its start-up yet still carries the
        // process's name: wait until every vCPU thread has recorded itself.
        if !self.all_vcpus_started() {
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
            let housekeeping = self.lock().housekeeping.clone();
            if let Err(e) = set_thread_affinity(tid, &housekeeping) {
                tracing::debug!(tid, thread = %name, "cannot pin thread: {e}");
                continue;
            }
            tracing::debug!(tid, thread = %name, "helper thread moved to housekeeping cores");
            self.lock().helpers.push(HelperThread {
                name,
                tid,
                affinity: read_back(tid),
                cpu_ms: 0.0,
            });
        }
    }

    /// Re-pins every started vCPU thread whose cores differ in `plan`
    /// (`sched_setaffinity`, timed for the report); a vCPU that has not
    /// started yet pins itself to the new cores when it starts.
    pub fn apply(&self, plan: &Plan) {
        let mut st = self.lock();
        for (v, cores) in plan.vcpu_cores.iter().enumerate() {
            if st.applied.get(v) == Some(cores) {
                continue;
            }
            let tid = self
                .vcpu_tids
                .get(v)
                .map_or(0, |t| t.load(Ordering::Acquire));
            if tid != 0 {
                let t0 = Instant::now();
                if let Err(e) = set_thread_affinity(tid, cores) {
                    tracing::warn!(vcpu = v, "re-pin to {cores} failed: {e}");
                    continue;
                }
                st.repin_ns += t0.elapsed().as_nanos();
                st.repins += 1;
                st.vcpus[v].affinity = read_back(tid);
            }
            if let Some(a) = st.applied.get_mut(v) {
                *a = cores.clone();
            }
        }
    }

    /// Moves every helper thread to `housekeeping` when it differs from the
    /// housekeeping cores now (an operator's change of `host.cores` or
    /// `host.housekeeping`), reading each affinity back; a helper that has
    /// ended is dropped from the list.
    pub fn set_housekeeping(&self, housekeeping: &CpuSet) {
        let mut st = self.lock();
        if &st.housekeeping == housekeeping {
            return;
        }
        st.housekeeping = housekeeping.clone();
        st.helpers.retain_mut(|h| {
            if let Err(e) = set_thread_affinity(h.tid, housekeeping) {
                tracing::debug!(tid = h.tid, thread = %h.name, "cannot re-pin helper: {e}");
                return false;
            }
            h.affinity = read_back(h.tid);
            true
        });
    }

    /// Fixes the vCPU threads whose nice [`Pinner::set_cpu_weight`] may
    /// set from now on, and returns them: those started now (all, once
    /// [`Pinner::wait_vcpus_started`] returned). The `stage-sched` thread
    /// calls it before its seccomp filter, which allows `setpriority` and
    /// `getpriority` with `PRIO_PROCESS` on exactly these thread ids; a
    /// vCPU that starts later sets its own nice when it starts.
    pub fn seal_renice(&self) -> Vec<i32> {
        let tids: Vec<i32> = self.vcpu_tids().into_iter().filter(|t| *t != 0).collect();
        self.lock().weight.sealed = Some(tids.clone());
        tids
    }

    /// Applies the VM's CPU weight `weight` (`host.cpu_weight`, sent by
    /// `stagevm-hostd` where it cannot set the VM's group's weight itself;
    /// `None` takes a weight given before back, restoring each thread's
    /// nice found before) when it differs from the one applied, as each
    /// started vCPU thread's nice (a vCPU that starts later takes it when
    /// it starts). A refusal is logged and kept for the report.
    pub fn set_cpu_weight(&self, weight: Option<u32>) {
        let mut st = self.lock();
        if st.weight.now == weight || (!st.weight.asked && weight.is_none()) {
            return;
        }
        st.weight.now = weight;
        st.weight.asked = true;
        st.weight.error = None;
        let n = self.vcpu_tids.len();
        for (v, t) in self.vcpu_tids.iter().enumerate() {
            let tid = t.load(Ordering::Acquire);
            let allowed = st.weight.sealed.as_ref().is_none_or(|s| s.contains(&tid));
            if tid != 0 && allowed {
                weigh_thread(&mut st, n, v, tid);
            }
        }
        tracing::info!("CPU weight {weight:?} by the vCPU threads' nice");
    }

    /// The CPU weight for the report, once one was asked.
    pub fn cpu_weight_report(&self) -> Option<CpuWeightReport> {
        let st = self.lock();
        let sum: u64 = st
            .vcpus
            .iter()
            .filter_map(|t| t.nice)
            .map(|n| u64::from(cpuweight::weight_of_nice(n)))
            .sum();
        let in_force = (sum * u64::from(cpuweight::DEFAULT) / 1024) as u32;
        st.weight.asked.then(|| CpuWeightReport {
            weight: st.weight.now,
            by: "vCPU threads' nice".into(),
            group_value: None,
            error: st.weight.error.clone(),
            in_force: Some(in_force),
        })
    }

    /// The threads, re-pin count and mean re-pin latency (µs) for the report.
    pub fn report(&self) -> (Vec<VcpuThread>, Vec<HelperThread>, u64, f64) {
        let st = self.lock();
        let mean_us = if st.repins == 0 {
            0.0
        } else {
            st.repin_ns as f64 / st.repins as f64 / 1e3
        };
        (st.vcpus.clone(), st.helpers.clone(), st.repins, mean_us)
    }
}

/// Sets vCPU `v`'s thread `tid` (of `n` vCPUs) to the nice of the weight
/// now: its own nice found at the first change plus the level of weight ÷
/// `n` (a VM's threads together weigh its weight), or that nice back when
/// the weight was taken back; reads it back for the report.
fn weigh_thread(st: &mut State, n: usize, v: usize, tid: i32) {
    let Some(slot) = st.weight.thread_base.get_mut(v) else {
        return;
    };
    let base = match *slot {
        Some(b) => b,
        None => match thread_nice(tid) {
            Ok(b) => *slot.insert(b),
            Err(_) => return,
        },
    };
    let nice = match st.weight.now {
        Some(w) => (base + cpuweight::nice_for(f64::from(w) / n.max(1) as f64)).clamp(-20, 19),
        None => base,
    };
    if let Err(e) = set_thread_nice(tid, nice) {
        // Lowering a nice needs CAP_SYS_NICE or a RLIMIT_NICE that allows
        // it, which the VMM never sets itself (its supervisor does:
        // LimitNICE=+0 in stagevm@.service); the report's `in_force` says
        // what the threads' nice carries meanwhile.
        let hint = if e.raw_os_error() == Some(libc::EACCES)
            || e.raw_os_error() == Some(libc::EPERM)
        {
            " (lowering a nice needs CAP_SYS_NICE or a RLIMIT_NICE that allows it: LimitNICE=+0)"
        } else {
            ""
        };
        tracing::warn!(
            vcpu = v,
            "cannot set the vCPU thread's nice to {nice}: {e}{hint}"
        );
        st.weight.error = Some(format!("vCPU {v}: nice {nice}: {e}{hint}"));
    }
    if let Some(t) = st.vcpus.get_mut(v) {
        t.nice = thread_nice(tid).ok();
    }
}

/// CPU time the calling thread used so far (ns; `CLOCK_THREAD_CPUTIME_ID`,
/// 0 if the clock cannot be read).
pub fn thread_cpu_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Records the CPU time of the thread that holds it, from its creation to
/// its drop, in the [`Pinner`] (the report's per-thread `cpu_ms`).
pub struct ThreadCpu<'a> {
    pinner: &'a Pinner,
    start_ns: u64,
}

impl<'a> ThreadCpu<'a> {
    /// Starts counting the calling thread's CPU time for `pinner`.
    pub fn start(pinner: &'a Pinner) -> Self {
        Self {
            pinner,
            start_ns: thread_cpu_ns(),
        }
    }
}

impl Drop for ThreadCpu<'_> {
    fn drop(&mut self) {
        self.pinner
            .record_cpu(thread_cpu_ns().saturating_sub(self.start_ns));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use host_sched::topology::Topology;

    /// A thread that sleeps until told, and its kernel id.
    fn stray() -> (
        i32,
        std::sync::mpsc::Sender<()>,
        std::thread::JoinHandle<()>,
    ) {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            tid_tx.send(gettid()).unwrap();
            let _ = stop_rx.recv();
        });
        (tid_rx.recv().unwrap(), stop_tx, h)
    }

    #[test]
    fn unknown_threads_are_adopted_unless_the_embedder_opts_out() {
        let _alone = crate::os::AFFINITY_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let allowed = Topology::detect().unwrap().allowed;
        let one: CpuSet = allowed.iter().take(1).collect();
        let (tid, stop, h) = stray();
        // Off: the stray thread keeps its affinity and is not a helper.
        let off = Pinner::new(Vec::new(), one.clone());
        off.set_adopt_threads(false);
        off.adopt_threads();
        assert!(off.report().1.iter().all(|t| t.tid != tid));
        assert_eq!(thread_affinity(tid).unwrap(), allowed);
        // On (the default): pinned to the housekeeping cores, read back.
        let on = Pinner::new(Vec::new(), one.clone());
        on.adopt_threads();
        let adopted = on.report().1;
        let pinned = thread_affinity(tid).unwrap();
        // It adopted every thread of the test process (no vCPUs): give the
        // others theirs back before asserting.
        for t in &adopted {
            let _ = set_thread_affinity(t.tid, &allowed);
        }
        assert!(adopted.iter().any(|t| t.tid == tid));
        assert_eq!(pinned, one);
        stop.send(()).unwrap();
        h.join().unwrap();
    }
}
