//! What the daemon knows of one VM, and how one trusted reading updates it.

use std::time::Instant;

use host_sched::cpuset::CpuSet;

use crate::cgroup::{Hierarchy, VmGroup};
use crate::vm::{self, Vm};

/// What the daemon knows of one VM.
pub(super) struct Known {
    pub(super) vm: Vm,
    pub(super) cores: CpuSet,
    /// The cores of `cores` the last allocation counted as its own (not a
    /// core it only shares); `None` before one, or after the VM's set
    /// changed by other hands.
    pub(super) owned: Option<CpuSet>,
    pub(super) demand: f64,
    pub(super) vcpus: usize,
    pub(super) shared: bool,
    /// The CPU weight it applies, as its last read said (`host.cpu_weight`;
    /// `None`: none, or taken back).
    pub(super) cpu_weight: Option<u32>,
    pub(super) moves: u64,
    pub(super) errors: u64,
    pub(super) skipped: u64,
    pub(super) waited: u64,
    /// The cores the daemon gave it, or found it on at its first period
    /// (adopted as they were); `None` for a VM found later that it has not
    /// given any yet. What a VM claims beyond this is never believed: a
    /// VM that stops answering keeps at most these (issue 50, S3).
    pub(super) given: Option<CpuSet>,
    /// Whether the last read answered.
    pub(super) answered: bool,
    /// The last read's work CPU (ns) and when it was taken.
    pub(super) work: Option<(u64, Instant)>,
    /// The last read's periods and summed utilisation
    /// ([`vm::Reading::utilisation`]).
    pub(super) utilisation: Option<(u64, f64)>,
    /// The last read's measured vCPU CPU (ns, [`vm::Reading::measured`])
    /// and when it was taken.
    pub(super) measured: Option<(u64, Instant)>,
    /// Reads refused: its peer is not trusted.
    pub(super) refused: u64,
    /// Whether the last read was of a trusted peer.
    pub(super) trusted: bool,
    /// Its VMM's pid, once read.
    pub(super) pid: Option<u32>,
    /// The cgroup the daemon put it in, or why there is none; `None`
    /// before its pid was known (or with `[host] cgroups = false`).
    pub(super) group: Option<Result<VmGroup, String>>,
    /// The CPU weight and CPU set last written in its group.
    pub(super) group_state: Option<(Option<u32>, CpuSet)>,
    /// The CPU weight in force for it (in its group or by its VMM).
    pub(super) weight: Option<u32>,
    /// Hung reads in a row.
    pub(super) hung: u32,
    /// What the last allocation gave it (replayed while the allocation
    /// holds: what a VM reports lags what it was given by a period).
    pub(super) planned: Option<host_sched::host::VmCores>,
    /// The first period it is read again (after hung reads: backed off).
    pub(super) next_read: u64,
}

impl Known {
    /// A VM just found: nothing read, nothing given.
    pub(super) fn new(vm: Vm) -> Self {
        Self {
            vm,
            cores: CpuSet::new(),
            owned: None,
            demand: 0.0,
            vcpus: 0,
            shared: false,
            cpu_weight: None,
            moves: 0,
            errors: 0,
            skipped: 0,
            waited: 0,
            given: None,
            answered: false,
            work: None,
            utilisation: None,
            measured: None,
            refused: 0,
            trusted: false,
            pid: None,
            group: None,
            group_state: None,
            weight: None,
            hung: 0,
            planned: None,
            next_read: 0,
        }
    }

    /// Whether the daemon writes its group.
    pub(super) fn grouped(&self) -> Option<&VmGroup> {
        self.group.as_ref().and_then(|g| g.as_ref().ok())
    }

    /// Takes a trusted reading `r` of VM `name`: its demand from the CPU
    /// its vCPU threads got over the daemon's own period (measured from
    /// `/proc`, or less where the VM reports less work: a guest's idle
    /// spinning is none), its vCPUs (never more than its vCPU threads),
    /// its cores and weight; with `cgroups`, puts a VMM whose pid is new in
    /// a group of its own (`hierarchy`). Returns a line to log, if any.
    pub(super) fn absorb(
        &mut self,
        name: &str,
        r: vm::Reading,
        hierarchy: &Hierarchy,
        cgroups: bool,
    ) -> Option<String> {
        let mut line = None;
        // Work CPU over the daemon's own period, in cores: what
        // its vCPU threads got by /proc, or less where the VM
        // reports less work (a guest's idle spinning is none).
        let now = Instant::now();
        let span = |t0: Instant| now.duration_since(t0).as_nanos().max(1) as f64;
        let reported = match (r.work_ns, self.work) {
            (Some(w), Some((w0, t0))) => Some(w.saturating_sub(w0) as f64 / span(t0)),
            _ => None,
        };
        let measured = match (r.measured, self.measured) {
            (Some((m, _)), Some((m0, t0))) => Some(m.saturating_sub(m0) as f64 / span(t0)),
            _ => None,
        };
        let used = match (measured, reported) {
            (Some(m), Some(r)) => Some(m.min(r)),
            (m, r) => m.or(r),
        };
        // Never more vCPUs than it has vCPU threads.
        let vcpus = match r.measured {
            Some((_, n)) => r.vcpus.min(n.max(1)),
            None => r.vcpus,
        };
        if let Some(used) = used {
            // Mean utilisation over the same span.
            let busy = match (r.utilisation, self.utilisation) {
                (Some((p1, s1)), Some((p0, s0))) if p1 > p0 => Some((s1 - s0) / (p1 - p0) as f64),
                _ => None,
            };
            self.demand = host_sched::host::demand(used, r.cores.len(), vcpus, busy);
        }
        self.work = r.work_ns.map(|w| (w, now));
        self.measured = r.measured.map(|(m, _)| (m, now));
        self.trusted = true;
        if cgroups && self.pid != Some(r.peer.pid) {
            self.group_state = None;
            let joined = hierarchy.join(name, r.peer.pid);
            match &joined {
                Ok(g) => tracing::info!(
                    "VM '{name}' (pid {}) in its own group: {}",
                    r.peer.pid,
                    g.describe()
                ),
                Err(e) => {
                    line = Some(format!(
                        "VM '{name}' (pid {}): no group of its own ({e}); its CPU weight goes to its VMM",
                        r.peer.pid
                    ))
                }
            }
            self.group = Some(joined.map_err(|e| e.to_string()));
        }
        self.pid = Some(r.peer.pid);
        self.utilisation = r.utilisation;
        if r.cores != self.cores {
            self.owned = None;
        }
        self.cores = r.cores;
        self.cpu_weight = r.cpu_weight;
        if self.grouped().is_none() {
            self.weight = r.cpu_weight;
        }
        self.vcpus = vcpus;
        self.answered = true;
        self.hung = 0;
        if self.demand >= self.cores.len() as f64 + 1.0 {
            self.waited += 1;
        }
        line
    }
}
