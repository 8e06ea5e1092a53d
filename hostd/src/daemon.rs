//! The daemon's period: read every VM, share the cores
//! ([`host_sched::host::allocate`], the one place this is decided, and
//! [`host_sched::host::cpu_weights`] for the VMs whose cores are shared),
//! give each VM whose set or CPU weight changed its new one. The VMs need
//! nothing from the daemon to run: a VM it cannot reach keeps what it
//! has.
//!
//! Faults, each counted per VM and logged at most [`BURST`] times per
//! minute per kind:
//! * a socket nobody listens on: the VM ended; it is forgotten and its
//!   cores are free at this period;
//! * no answer within `timeout_ms`: skipped, its cores left as they were
//!   (taken out of the pool, as a fixed set, for this period);
//! * a refused change: logged, tried again next period.
//!
//! * a socket served by a process the daemon does not trust (another
//!   uid, another executable: [`crate::peer`]): nothing it says is
//!   believed and it gets no cores, counted as `refused`.
//!
//! Each VM's VMM is put in a cgroup of its own, where the daemon writes its
//! CPU weight and CPU set ([`crate::cgroup`], `[host] cgroups`); where it
//! cannot, the weight goes to the VMM, which sets its vCPU threads' nice.
//!
//! The first period after a start adopts the VMs as they are (their sets
//! and CPU weights become the current ones) and moves no core.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use host_sched::cpuset::CpuSet;
use stagevm_report::api::{HostView, HostVm};

use crate::cgroup::{Hierarchy, VmGroup};
use crate::config::HostConfig;
use crate::peer::Trust;
use crate::vm::{self, Vm, VmError};

/// Log lines per kind of fault per minute.
pub const BURST: u32 = 5;

/// Most VMs one daemon serves (sockets beyond, by name, are left alone and
/// logged): each costs a request per period, and anyone who may write to
/// the directory could add sockets.
pub const MAX_VMS: usize = 256;

/// VMs read at once. A period's reads take at most
/// `⌈VMs ÷ PARALLEL_READS⌉` timeouts: with [`MAX_VMS`] peers that accept
/// and never answer, 4 × 500 ms (the default `timeout_ms`), where one
/// after another they took 256 × 500 ms, past systemd's stop timeout
/// (issue 50, S7).
pub const PARALLEL_READS: usize = 64;

/// Reads every VM in `vms` within `timeout`, [`PARALLEL_READS`] at a time
/// on scoped threads (a VM whose thread cannot be started is read on this
/// one). Returns each VM's reading by name.
fn read_all(
    vms: &BTreeMap<String, Known>,
    trust: &Trust,
    timeout: std::time::Duration,
) -> BTreeMap<String, Result<vm::Reading, VmError>> {
    let list: Vec<(&String, &Vm)> = vms.iter().map(|(n, k)| (n, &k.vm)).collect();
    let mut out = BTreeMap::new();
    for chunk in list.chunks(PARALLEL_READS) {
        std::thread::scope(|s| {
            let running: Vec<_> = chunk
                .iter()
                .map(|(name, vm)| {
                    let spawned = std::thread::Builder::new()
                        .name("hostd-read".into())
                        .spawn_scoped(s, move || vm.read(trust, timeout));
                    (*name, *vm, spawned)
                })
                .collect();
            for (name, vm, spawned) in running {
                let got = match spawned {
                    // A panic is a bug: fail-stop, as on the thread itself.
                    Ok(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
                    Err(_) => vm.read(trust, timeout),
                };
                out.insert(name.clone(), got);
            }
        });
    }
    out
}

/// What the daemon knows of one VM.
struct Known {
    vm: Vm,
    cores: CpuSet,
    /// The cores of `cores` the last allocation counted as its own (not a
    /// core it only shares); `None` before one, or after the VM's set
    /// changed by other hands.
    owned: Option<CpuSet>,
    demand: f64,
    vcpus: usize,
    shared: bool,
    /// The CPU weight it applies, as its last read said (`host.cpu_weight`;
    /// `None`: none, or taken back).
    cpu_weight: Option<u32>,
    moves: u64,
    errors: u64,
    skipped: u64,
    waited: u64,
    /// The cores the daemon gave it, or found it on at its first period
    /// (adopted as they were); `None` for a VM found later that it has not
    /// given any yet. What a VM claims beyond this is never believed: a
    /// VM that stops answering keeps at most these (issue 50, S3).
    given: Option<CpuSet>,
    /// Whether the last read answered.
    answered: bool,
    /// The last read's work CPU (ns) and when it was taken.
    work: Option<(u64, Instant)>,
    /// The last read's periods and summed utilisation
    /// ([`vm::Reading::utilisation`]).
    utilisation: Option<(u64, f64)>,
    /// The last read's measured vCPU CPU (ns, [`vm::Reading::measured`])
    /// and when it was taken.
    measured: Option<(u64, Instant)>,
    /// Reads refused: its peer is not trusted.
    refused: u64,
    /// Whether the last read was of a trusted peer.
    trusted: bool,
    /// Its VMM's pid, once read.
    pid: Option<u32>,
    /// The cgroup the daemon put it in, or why there is none; `None`
    /// before its pid was known (or with `[host] cgroups = false`).
    group: Option<Result<VmGroup, String>>,
    /// The CPU weight and CPU set last written in its group.
    group_state: Option<(Option<u32>, CpuSet)>,
    /// The CPU weight in force for it (in its group or by its VMM).
    weight: Option<u32>,
}

impl Known {
    /// A VM just found: nothing read, nothing given.
    fn new(vm: Vm) -> Self {
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
        }
    }

    /// Whether the daemon writes its group.
    fn grouped(&self) -> Option<&VmGroup> {
        self.group.as_ref().and_then(|g| g.as_ref().ok())
    }
}

/// `a ∪ b`.
fn union(a: &CpuSet, b: &CpuSet) -> CpuSet {
    let mut u = a.clone();
    b.iter().for_each(|c| u.insert(c));
    u
}

/// Writes `weight` and `cpus` in group `g` where they differ from `state`
/// (what was written last), and records them. Errors: a refused write
/// (the file named).
fn enforce(
    g: &VmGroup,
    state: &mut Option<(Option<u32>, CpuSet)>,
    weight: Option<u32>,
    cpus: &CpuSet,
) -> std::io::Result<()> {
    let (w0, c0) = state
        .clone()
        .map_or((None, None), |(w, c)| (Some(w), Some(c)));
    if w0 != Some(weight) {
        g.set_weight(weight)?;
    }
    *state = Some((weight, c0.clone().unwrap_or_default()));
    if c0.as_ref() != Some(cpus) && !cpus.is_empty() {
        g.set_cpus(cpus)?;
        *state = Some((weight, cpus.clone()));
    }
    Ok(())
}

/// Rate-limits one kind of log line.
struct Limit {
    since: Instant,
    lines: u32,
}

impl Limit {
    fn allow(&mut self) -> bool {
        if self.since.elapsed().as_secs() >= 60 {
            (self.since, self.lines) = (Instant::now(), 0);
        }
        self.lines += 1;
        self.lines <= BURST
    }
}

/// The daemon's state across periods.
pub struct Daemon {
    config: HostConfig,
    dir: PathBuf,
    own_socket: Option<PathBuf>,
    vms: BTreeMap<String, Known>,
    /// Sockets found dead (a VM that ended without removing its socket),
    /// with their modification time: not tried again until it changes.
    dead: BTreeMap<String, Option<std::time::SystemTime>>,
    periods: u64,
    limits: [Limit; 3],
    trust: Trust,
    hierarchy: Hierarchy,
    /// The CPUs a VM's group may use beyond its stage cores: the
    /// housekeeping cores, or the allowed CPUs outside the pool.
    rest: CpuSet,
    /// Sockets not served (`only_listed`), logged once.
    unlisted: std::collections::BTreeSet<String>,
    /// The period of the last change of any VM's cores: the allocation
    /// holds for `hold_periods` from then ([`Daemon::plan`]).
    last_move: Option<u64>,
}

impl Daemon {
    /// A daemon for the VMs whose sockets are in `dir` (not `own_socket`,
    /// its own API socket if it is there).
    pub fn new(config: HostConfig, dir: &Path, own_socket: Option<&Path>) -> Self {
        let limit = || Limit {
            since: Instant::now(),
            lines: 0,
        };
        let rest = match &config.housekeeping {
            Some(h) => h.clone(),
            None => host_sched::topology::Topology::detect()
                .map(|t| t.allowed.difference(&config.cores))
                .unwrap_or_default(),
        };
        Self {
            trust: Trust::new(&config.vmm),
            hierarchy: if config.cgroups {
                Hierarchy::detect()
            } else {
                Hierarchy::default()
            },
            rest,
            unlisted: Default::default(),
            last_move: None,
            config,
            dir: dir.to_path_buf(),
            own_socket: own_socket.map(Path::to_path_buf),
            vms: BTreeMap::new(),
            dead: BTreeMap::new(),
            periods: 0,
            limits: [limit(), limit(), limit()],
        }
    }

    /// The configuration.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    fn warn(&mut self, kind: usize, line: &str) {
        if self.limits[kind].allow() {
            tracing::warn!("{line}");
        }
    }

    /// One period: discover, read, allocate, give. Errors: the directory
    /// cannot be read (the VMs keep their sets).
    pub fn period(&mut self) -> std::io::Result<()> {
        let timeout = self.config.timeout;
        let mut found = vm::discover(&self.dir, self.own_socket.as_deref())?;
        if found.len() > MAX_VMS {
            let line = format!(
                "{} sockets in {}: serving the first {MAX_VMS} by name",
                found.len(),
                self.dir.display()
            );
            self.warn(2, &line);
            found.truncate(MAX_VMS);
        }
        self.vms
            .retain(|name, _| found.iter().any(|(n, _)| n == name));
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        self.dead
            .retain(|name, _| found.iter().any(|(n, _)| n == name));
        for (name, socket) in &found {
            if self.dead.get(name).is_some_and(|t| *t == modified(socket)) {
                continue;
            }
            self.dead.remove(name);
            if self.config.only_listed && !self.config.vms.contains_key(name) {
                if self.unlisted.insert(name.clone()) {
                    tracing::warn!(
                        "VM '{name}' at {}: not served (only_listed, and it has no [[vm]] entry)",
                        socket.display()
                    );
                }
                continue;
            }
            if !self.vms.contains_key(name) {
                match Vm::new(name, socket) {
                    Ok(vm) => {
                        tracing::info!("VM '{name}' found at {}", socket.display());
                        self.vms.insert(name.clone(), Known::new(vm));
                    }
                    Err(e) => self.warn(2, &e.to_string()),
                }
            }
        }
        let mut gone = Vec::new();
        let mut lines = Vec::new();
        let mut readings = read_all(&self.vms, &self.trust, timeout);
        let hierarchy = self.hierarchy.clone();
        let cgroups = self.config.cgroups;
        for (name, k) in &mut self.vms {
            let Some(reading) = readings.remove(name) else {
                continue;
            };
            match reading {
                Ok(r) => {
                    // Work CPU over the daemon's own period, in cores: what
                    // its vCPU threads got by /proc, or less where the VM
                    // reports less work (a guest's idle spinning is none).
                    let now = Instant::now();
                    let span = |t0: Instant| now.duration_since(t0).as_nanos().max(1) as f64;
                    let reported = match (r.work_ns, k.work) {
                        (Some(w), Some((w0, t0))) => Some(w.saturating_sub(w0) as f64 / span(t0)),
                        _ => None,
                    };
                    let measured = match (r.measured, k.measured) {
                        (Some((m, _)), Some((m0, t0))) => {
                            Some(m.saturating_sub(m0) as f64 / span(t0))
                        }
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
                        let busy = match (r.utilisation, k.utilisation) {
                            (Some((p1, s1)), Some((p0, s0))) if p1 > p0 => {
                                Some((s1 - s0) / (p1 - p0) as f64)
                            }
                            _ => None,
                        };
                        k.demand = host_sched::host::demand(used, r.cores.len(), vcpus, busy);
                    }
                    k.work = r.work_ns.map(|w| (w, now));
                    k.measured = r.measured.map(|(m, _)| (m, now));
                    k.trusted = true;
                    if cgroups && k.pid != Some(r.peer.pid) {
                        k.pid = Some(r.peer.pid);
                        k.group_state = None;
                        let joined = hierarchy.join(name, r.peer.pid);
                        match &joined {
                            Ok(g) => tracing::info!(
                                "VM '{name}' (pid {}) in its own group: {}",
                                r.peer.pid,
                                g.describe()
                            ),
                            Err(e) => lines.push((
                                1,
                                format!(
                                    "VM '{name}' (pid {}): no group of its own ({e}); its CPU weight goes to its VMM",
                                    r.peer.pid
                                ),
                            )),
                        }
                        k.group = Some(joined.map_err(|e| e.to_string()));
                    }
                    k.pid = Some(r.peer.pid);
                    k.utilisation = r.utilisation;
                    if r.cores != k.cores {
                        k.owned = None;
                    }
                    k.cores = r.cores;
                    k.cpu_weight = r.cpu_weight;
                    if k.grouped().is_none() {
                        k.weight = r.cpu_weight;
                    }
                    k.vcpus = vcpus;
                    k.answered = true;
                    if k.demand >= k.cores.len() as f64 + 1.0 {
                        k.waited += 1;
                    }
                }
                Err(VmError::Gone(..)) => gone.push(name.clone()),
                Err(e @ VmError::Untrusted(..)) => {
                    k.refused += 1;
                    k.answered = false;
                    k.trusted = false;
                    lines.push((1, e.to_string()));
                }
                Err(e @ VmError::Hung(..)) => {
                    k.skipped += 1;
                    k.answered = false;
                    lines.push((0, e.to_string()));
                }
                Err(e) => {
                    k.errors += 1;
                    k.answered = false;
                    lines.push((1, e.to_string()));
                }
            }
        }
        for name in gone {
            tracing::info!("VM '{name}' ended: its cores are free");
            if let Some(k) = self.vms.remove(&name) {
                if let Some(g) = k.grouped() {
                    g.remove();
                }
                self.dead.insert(name, modified(k.vm.socket()));
            }
        }
        for (kind, line) in lines {
            self.warn(kind, &line);
        }
        self.periods += 1;
        if self.periods == 1 {
            for k in self.vms.values_mut().filter(|k| k.answered) {
                k.given = Some(k.cores.clone());
            }
            tracing::info!(
                "adopted {} VM(s) as they are: {}",
                self.vms.len(),
                self.vms
                    .iter()
                    .map(|(n, k)| format!("{n}={}", k.cores))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            return Ok(());
        }
        self.share();
        Ok(())
    }

    /// The allocation of this period — the one place it is decided, from
    /// what the daemon knows (no I/O): per VM taking part, its name, its
    /// cores and its CPU weight on shared cores.
    ///
    /// A VM not reached this period keeps the cores the daemon gave it
    /// ([`Known::given`]) that it still holds: they are fixed for this
    /// allocation, unless they meet a set fixed already (two hung VMs on
    /// the same cores), when it is left out and others may share its
    /// cores; a VM the daemon never gave cores to holds none it knows of,
    /// whatever it claimed; and an unlisted VM (no `[[vm]]` entry, so no
    /// `max_cores`) keeps at most the pool ÷ the VMs. A VM that answers
    /// claims nothing either: its current cores, which hysteresis keeps,
    /// are those it was given. So a peer that claims every core but one
    /// and then hangs holds nothing or its share (issue 50, S3).
    ///
    /// For `hold_periods` after a period that moved any VM's cores, the
    /// allocation holds: a guest whose demand swings every period (its idle
    /// counters are its own to set) moves other VMs' cores at most once
    /// per hold (issue 50, S5).
    ///
    /// Errors: the allocator's, as text (a stale set can meet a fixed one).
    fn plan(&self) -> Result<Vec<(String, host_sched::host::VmCores, Option<u32>)>, String> {
        if self
            .last_move
            .is_some_and(|p| self.periods < p + self.config.hold_periods)
        {
            // Within the hold after a move: every VM keeps what it has (a
            // VM with none, found meanwhile, waits for the hold's end).
            return Ok(self
                .vms
                .iter()
                .filter(|(_, k)| k.answered && !k.cores.is_empty())
                .map(|(n, k)| {
                    let cores = host_sched::host::VmCores {
                        cores: k.cores.clone(),
                        owned: k.owned.clone().unwrap_or_else(|| k.cores.clone()),
                        shared: k.shared,
                    };
                    (n.clone(), cores, k.weight)
                })
                .collect());
        }
        let mut fixed: CpuSet = self
            .config
            .vms
            .values()
            .filter_map(|b| b.cores.clone())
            .fold(CpuSet::new(), |acc, c| union(&acc, &c));
        let share = (self.config.cores.len() / self.vms.len().max(1)).max(1);
        let mut names = Vec::new();
        let mut demands = Vec::new();
        for (n, k) in &self.vms {
            if !k.trusted && k.refused > 0 {
                // Nothing it says is believed: no cores, no fixed set.
                continue;
            }
            let mut budget = self.config.budget(n);
            let given = k.given.clone().unwrap_or_default();
            let held = k.cores.intersection(&given);
            if !k.answered {
                let mut stale = held.intersection(&self.config.cores);
                if !self.config.vms.contains_key(n) {
                    stale = stale.iter().take(share).collect();
                }
                if stale.is_empty() || !stale.intersection(&fixed).is_empty() {
                    continue;
                }
                fixed = union(&fixed, &stale);
                budget.cores = Some(stale);
            }
            let mut d = self.config.demand_of(n, &budget, k.demand, held);
            d.owned = k.owned.clone();
            names.push(n.clone());
            demands.push(d);
        }
        let out = host_sched::host::allocate(&self.config.cores, &demands, self.config.hysteresis)
            .map_err(|e| e.to_string())?;
        let weights = host_sched::host::cpu_weights(
            &demands
                .iter()
                .zip(&out)
                .zip(&names)
                .map(|((d, o), n)| (d.weight, self.vms[n].vcpus, o.shared))
                .collect::<Vec<_>>(),
        );
        Ok(names
            .into_iter()
            .zip(out)
            .zip(weights)
            .map(|((n, o), w)| (n, o, w))
            .collect())
    }

    /// Allocates ([`Daemon::plan`]) and gives every changed set.
    fn share(&mut self) {
        let plan = match self.plan() {
            Ok(p) => p,
            Err(e) => {
                self.warn(1, &format!("no allocation this period: {e}"));
                return;
            }
        };
        let (timeout, hk) = (self.config.timeout, self.config.housekeeping.clone());
        let rest = self.rest.clone();
        let mut lines = Vec::new();
        let mut moved = false;
        for (name, new, weight) in plan {
            let k = self.vms.get_mut(&name).expect("planned from self.vms");
            k.shared = new.shared;
            if !k.answered {
                continue;
            }
            // In its group the daemon sets the weight; the VMM gets none.
            let vm_weight = if k.grouped().is_some() { None } else { weight };
            // Its group first widened to the old and new cores, so the
            // VMM can move its threads; narrowed to the new ones once it
            // took them.
            if let Some(Ok(g)) = &k.group {
                let wide = union(&union(&k.cores, &new.cores), &rest);
                if let Err(e) = enforce(g, &mut k.group_state, weight, &wide) {
                    lines.push(format!("VM '{name}': {e}"));
                }
            }
            if new.cores != k.cores || vm_weight != k.cpu_weight {
                if let Err(e) = k.vm.give(&new.cores, hk.as_ref(), vm_weight, timeout) {
                    k.errors += 1;
                    lines.push(e.to_string());
                    continue;
                }
                let added = new.cores.difference(&k.cores).len() as u64;
                tracing::info!(
                    "VM '{name}': cores {} -> {} (demand {:.2}), CPU weight {}{}",
                    k.cores,
                    new.cores,
                    k.demand,
                    weight.map_or("-".into(), |w| w.to_string()),
                    k.grouped()
                        .map_or(String::new(), |g| format!(" in {}", g.describe()))
                );
                k.moves += added;
                if new.cores != k.cores {
                    moved = true;
                }
                k.cores = new.cores.clone();
                k.cpu_weight = vm_weight;
            }
            if let Some(Ok(g)) = &k.group {
                if let Err(e) = enforce(g, &mut k.group_state, weight, &union(&new.cores, &rest)) {
                    lines.push(format!("VM '{name}': {e}"));
                }
            }
            k.weight = weight;
            k.given = Some(new.cores);
            k.owned = Some(new.owned);
        }
        if moved {
            self.last_move = Some(self.periods);
        }
        for line in lines {
            self.warn(1, &line);
        }
    }

    /// The operator's view of the last period.
    pub fn view(&self) -> HostView {
        HostView {
            cores: self.config.cores.to_string(),
            housekeeping: self
                .config
                .housekeeping
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            period_ms: self.config.period.as_millis() as u64,
            periods: self.periods,
            vms: self
                .vms
                .iter()
                .map(|(name, k)| {
                    let b = self.config.budget(name);
                    HostVm {
                        name: name.clone(),
                        cores: k.cores.to_string(),
                        shared: k.shared,
                        demand: k.demand,
                        vcpus: k.vcpus,
                        weight: b.weight,
                        min_cores: b.min_cores,
                        max_cores: (b.max_cores != usize::MAX).then_some(b.max_cores),
                        fixed: b.cores.map(|c| c.to_string()).unwrap_or_default(),
                        moves: k.moves,
                        errors: k.errors,
                        skipped: k.skipped,
                        waited: k.waited,
                        lend_when_idle: b.lend_when_idle,
                        cpu_weight: k.weight,
                        enforced_by: match &k.group {
                            Some(Ok(g)) => g.describe(),
                            Some(Err(e)) => format!("the VMM (vCPU threads' nice): {e}"),
                            None if k.pid.is_some() => {
                                "the VMM (vCPU threads' nice): [host] cgroups = false".into()
                            }
                            None => String::new(),
                        },
                        pid: k.pid.unwrap_or(0),
                        refused: k.refused,
                        lent: b.lend_when_idle
                            && k.shared
                            && k.owned.as_ref().is_some_and(CpuSet::is_empty),
                        owned: k
                            .owned
                            .as_ref()
                            .map(ToString::to_string)
                            .unwrap_or_default(),
                    }
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(dir: &Path, name: &str, cores: &str, given: Option<&str>, answered: bool) -> Known {
        Known {
            cores: CpuSet::parse(cores).unwrap(),
            demand: 1.0,
            vcpus: 2,
            given: given.map(|g| CpuSet::parse(g).unwrap()),
            answered,
            ..Known::new(Vm::new(name, &dir.join(format!("{name}.sock"))).unwrap())
        }
    }

    /// A daemon for `dir` on a host of CPUs `cpus` with host.toml `text`.
    fn daemon(dir: &Path, cpus: &str, text: &str) -> Daemon {
        let cpus = CpuSet::parse(cpus).unwrap();
        let topology = host_sched::topology::Topology {
            allowed: cpus.clone(),
            online: cpus,
            isolated: CpuSet::new(),
        };
        let config = HostConfig::parse(text, "host.toml", &topology).unwrap();
        Daemon::new(config, dir, None)
    }

    /// The cores of `name` in `plan`.
    fn cores_of(plan: &[(String, host_sched::host::VmCores, Option<u32>)], name: &str) -> String {
        plan.iter()
            .find(|(n, ..)| n == name)
            .map_or("-".into(), |(_, c, _)| c.cores.to_string())
    }

    /// A peer that answered once claiming every core but one, then hangs:
    /// found after the first period, it was never given cores, so it holds
    /// none; adopted at the first period with them (a daemon restarted
    /// beside it), it keeps at most its share of the pool; either way the
    /// two honest VMs get cores of their own. Before the fix its claim was
    /// fixed and both honest VMs were put on the one core left.
    #[test]
    fn a_peer_that_claims_every_core_but_one_then_hangs_holds_no_more_than_its_share() {
        let dir = std::env::temp_dir().join(format!("stagevm-hostd-liar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for adopted in [None, Some("1-3")] {
            let mut d = daemon(&dir, "0-3", "[host]\ncores = \"0-3\"\n");
            d.vms
                .insert("a".into(), known(&dir, "a", "0", Some("0"), true));
            d.vms
                .insert("b".into(), known(&dir, "b", "0", Some("0"), true));
            d.vms
                .insert("liar".into(), known(&dir, "liar", "1-3", adopted, false));
            let plan = d.plan().unwrap();
            let (a, b) = (
                CpuSet::parse(&cores_of(&plan, "a")).unwrap(),
                CpuSet::parse(&cores_of(&plan, "b")).unwrap(),
            );
            let liar = cores_of(&plan, "liar");
            assert!(
                !a.is_empty() && !b.is_empty() && a.intersection(&b).is_empty(),
                "adopted {adopted:?}: a {a}, b {b}, liar {liar}"
            );
            match adopted {
                None => assert_eq!(liar, "-", "a claim it was never given"),
                Some(_) => assert_eq!(CpuSet::parse(&liar).unwrap().len(), 1, "{liar}"),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn hung_peers_are_read_side_by_side_not_one_after_another() {
        let dir = std::env::temp_dir().join(format!("stagevm-hostd-hung-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // 128 peers that accept (the kernel's backlog) and never answer.
        let n = 128;
        let _peers: Vec<_> = (0..n)
            .map(|i| {
                std::os::unix::net::UnixListener::bind(dir.join(format!("vm{i:03}.sock"))).unwrap()
            })
            .collect();
        let me = std::env::current_exe().unwrap();
        let mut d = daemon(
            &dir,
            "0-1",
            &format!(
                "[host]\ntimeout_ms = 200\nvmm = [{:?}]\n",
                me.display().to_string()
            ),
        );
        let t0 = Instant::now();
        d.period().unwrap();
        let took = t0.elapsed();
        // One after another: 128 × 200 ms = 25.6 s; side by side: 2 × 200 ms.
        assert!(took < std::time::Duration::from_secs(3), "{took:?}");
        let v = d.view();
        assert_eq!(v.vms.len(), n);
        assert!(v.vms.iter().all(|vm| vm.skipped == 1), "{v:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A socket served by a process that is not a trusted VMM (this test's
    /// binary, not the `stagevm` beside it): refused, counted, no cores —
    /// before the fix it was read and believed.
    #[test]
    fn a_peer_that_is_not_a_trusted_vmm_is_refused() {
        let dir =
            std::env::temp_dir().join(format!("stagevm-hostd-untrusted-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let _peer = std::os::unix::net::UnixListener::bind(dir.join("impostor.sock")).unwrap();
        let mut d = daemon(&dir, "0-1", "[host]\ntimeout_ms = 200\n");
        let t0 = Instant::now();
        for _ in 0..2 {
            d.period().unwrap();
        }
        // Refused at once: no request was sent, so no timeout was waited.
        assert!(
            t0.elapsed() < std::time::Duration::from_millis(200),
            "{:?}",
            t0.elapsed()
        );
        let v = d.view();
        let vm = &v.vms[0];
        assert_eq!(
            (vm.refused, vm.skipped, vm.cores.as_str()),
            (2, 0, ""),
            "{v:?}"
        );
        assert_eq!(d.plan().unwrap().len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// After a move the allocation holds for the hold, whatever the
    /// demands say meanwhile; after it, cores may move again (issue 50,
    /// S5: a guest that swings its demand every period moves another VM's
    /// cores at most once per hold).
    #[test]
    fn cores_just_moved_are_held_for_hold_periods() {
        let dir = std::env::temp_dir().join(format!("stagevm-hostd-hold-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut d = daemon(&dir, "0-1", "[host]\ncores = \"0-1\"\nhold_periods = 3\n");
        d.periods = 10;
        d.last_move = Some(10);
        let mut a = known(&dir, "a", "0-1", Some("0-1"), true);
        a.demand = 0.0;
        let mut b = known(&dir, "b", "", Some(""), true);
        b.demand = 2.0;
        d.vms.insert("a".into(), a);
        d.vms.insert("b".into(), b);
        for (period, a_keeps) in [(10, true), (12, true), (13, false)] {
            d.periods = period;
            let plan = d.plan().unwrap();
            let (ca, cb) = (cores_of(&plan, "a"), cores_of(&plan, "b"));
            assert_eq!(ca == "0-1", a_keeps, "period {period}: a {ca}, b {cb}");
            if !a_keeps {
                assert_ne!(cb, "", "period {period}: b still has no core");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
