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
use known::Known;

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

/// Most periods a peer that keeps hanging goes unread: after `n` hung
/// reads in a row it is read again 2^n periods later, at most this many.
pub const MAX_BACKOFF: u64 = 32;

/// Reads every VM in `vms` due at `period` (a peer that keeps hanging is
/// read less and less often: [`MAX_BACKOFF`]) within `timeout`, [`PARALLEL_READS`] at a time
/// on scoped threads (a VM whose thread cannot be started is read on this
/// one). Returns each VM's reading by name.
fn read_all(
    vms: &BTreeMap<String, Known>,
    trust: &Trust,
    timeout: std::time::Duration,
    period: u64,
) -> BTreeMap<String, Result<vm::Reading, VmError>> {
    let list: Vec<(&String, &Vm)> = vms
        .iter()
        .filter(|(_, k)| k.next_read <= period)
        .map(|(n, k)| (n, &k.vm))
        .collect();
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
        let mut readings = read_all(&self.vms, &self.trust, timeout, self.periods);
        let period = self.periods;
        let hierarchy = self.hierarchy.clone();
        let cgroups = self.config.cgroups;
        for (name, k) in &mut self.vms {
            let Some(reading) = readings.remove(name) else {
                continue;
            };
            match reading {
                Ok(r) => {
                    if let Some(line) = k.absorb(name, r, &hierarchy, cgroups) {
                        lines.push((1, line));
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
                    k.hung = k.hung.saturating_add(1);
                    k.next_read = period + (1u64 << k.hung.min(6)).min(MAX_BACKOFF);
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
    /// cores (a VM that shared its cores stays in as it was, by its last
    /// demand); a VM the daemon never gave cores to holds none it knows of,
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
            // Within the hold after a move: the last allocation again (a
            // VM found meanwhile, with none, waits for the hold's end).
            return Ok(self
                .vms
                .iter()
                .filter(|(_, k)| k.answered)
                .filter_map(|(n, k)| Some((n.clone(), k.planned.clone()?, k.weight)))
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
            // A VM that shared its cores (more VMs than cores) and missed
            // a read stays in the allocation as it was, by its last demand
            // (measured from /proc): fixing its set would take the core
            // from the VM that owns it, and leaving it out would give the
            // others a core each, both at one slow answer.
            if !k.answered && !k.shared {
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
            // A move is a change of what the daemon decided, not of what
            // the VM reports (which lags a period, or differs for good:
            // a VMM fits its cores to its vCPUs).
            let before = k.planned.as_ref().map_or(&k.cores, |p| &p.cores);
            if *before != new.cores {
                moved = true;
            }
            k.planned = Some(new.clone());
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
                // The cores, then the weight: each its own change (a
                // weight keeps the VM's policy state).
                let given = if new.cores == k.cores {
                    Ok(())
                } else {
                    k.vm.give(&new.cores, hk.as_ref(), timeout)
                };
                let weighed = given.and_then(|()| {
                    if vm_weight == k.cpu_weight {
                        Ok(())
                    } else {
                        k.vm.weigh(vm_weight, timeout)
                    }
                });
                if let Err(e) = weighed {
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

mod known;
#[cfg(test)]
mod tests;
