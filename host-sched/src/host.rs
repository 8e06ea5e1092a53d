//! Host-wide allocation of the stage cores among VMs (`stagevm-hostd`):
//! a pure function from each VM's demand and current set to each VM's new
//! set, unit-tested like the policies and taken in one place.
//!
//! Each period the daemon measures every VM's demand ([`demand`]: cores of
//! work CPU since its last read) and calls [`allocate`]. The rules, in
//! order:
//!
//! 1. A VM with fixed `cores` gets exactly them; they leave the pool.
//! 2. Counts: each other VM starts at its `min_cores` (the operator's
//!    guarantee); when there are at least as many pool cores as VMs, every
//!    VM still at none gets one core while cores are left (so no core is in
//!    two VMs' sets while the minimums leave a core for each VM) — except a
//!    VM that lends when idle ([`VmDemand::lend_when_idle`], `min_cores`
//!    0) and is idle: demand below [`LEND_BELOW`] cores while it owns a
//!    core, below [`RECLAIM_AT`] once it lent it (two thresholds, so it
//!    does not flap). The
//!    remaining cores go one at a time to the VM with the largest weighted
//!    unmet demand, `weight × (demand − count)` (weighted max-min fairness
//!    in whole cores), never past `max_cores`; a VM that owns more cores
//!    than its count so far gets `hysteresis` added, so a core moves only
//!    for a clear difference (the fewest moves, as seed 000 §4.5's minimal
//!    transition does for stages). Cores nobody has demand for go to the
//!    VMs below `max_cores`, first to one that owns such a core already,
//!    then in proportion to weight, so a burst finds them (an idle lender
//!    among them: it lends only a core another VM's demand takes).
//! 3. Sets: each VM keeps as many of the cores it owns as its count allows
//!    (its lowest), then takes free cores, lowest first.
//! 4. Sharing: when there are more VMs than pool cores, the cores go by
//!    demand alone (an idle VM holds no core a busy one wants) and a VM
//!    whose count is 0 (so too an idle lender) shares one core: its
//!    current one if it had a single pool core, else the core whose VMs
//!    have the least total demand. Every VM runs somewhere; a shared core
//!    is marked so in the result, and is not the sharer's own
//!    ([`VmCores::owned`]).
//!
//! Lending is the operator's choice per VM: with one core per VM (two VMs
//! on two cores) exclusive sets leave the daemon no core to move, so a
//! busy VM can have an idle one's core only if the idle one agrees to run
//! on a shared core meanwhile; when it wakes, its demand (what it gets on
//! the shared core) reaches [`RECLAIM_AT`] within a period and it has a
//! core of its own again the next (`just bench-host` measures both).

use crate::cpuset::CpuSet;

/// One VM as the allocator sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct VmDemand {
    /// The VM's name (its API socket's stem), for errors.
    pub name: String,
    /// Its weight (> 0): how much its unmet demand counts against others'.
    pub weight: f64,
    /// Fewest cores it gets when the pool allows.
    pub min_cores: usize,
    /// Most cores it gets.
    pub max_cores: usize,
    /// A fixed set: these cores, always (they leave the pool).
    pub fixed: Option<CpuSet>,
    /// Demand in cores (work CPU ÷ period, summed over its vCPUs).
    pub demand: f64,
    /// The cores it has now (empty for a VM never seen).
    pub current: CpuSet,
    /// Those of `current` it owns: the last allocation's
    /// [`VmCores::owned`] (a core it only shared is not its own); `None`:
    /// all of them (no allocation yet).
    pub owned: Option<CpuSet>,
    /// Whether, while idle and with `min_cores` 0, it runs on a shared core
    /// so that a busy VM can have its own (rule 2).
    pub lend_when_idle: bool,
}

/// Demand (cores) below which a lending VM that owns a core lends it.
pub const LEND_BELOW: f64 = 0.05;
/// Demand (cores) from which a VM that lent its core has one of its own
/// again.
pub const RECLAIM_AT: f64 = 0.10;

impl VmDemand {
    /// Whether rule 2 leaves this VM without a core of its own in `pool`:
    /// it lends when idle, has no minimum, and its demand is below
    /// [`LEND_BELOW`] (it owns a pool core) or [`RECLAIM_AT`] (it does
    /// not).
    fn lends(&self, pool: &CpuSet) -> bool {
        let owns = !owned(self).intersection(pool).is_empty();
        self.lend_when_idle
            && self.min_cores == 0
            && self.demand < if owns { LEND_BELOW } else { RECLAIM_AT }
    }
}

/// One VM's new set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmCores {
    /// The cores it may use.
    pub cores: CpuSet,
    /// Those counted as its own (all of `cores` but a core it only shares
    /// as a VM left without one): the next period's [`VmDemand::owned`].
    pub owned: CpuSet,
    /// Whether another VM's set holds one of them too (more VMs than
    /// cores).
    pub shared: bool,
}

/// A configuration the pool cannot serve: one line naming the numbers.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AllocError {
    /// The VMs' minimums exceed the pool.
    #[error("the VMs' min_cores add up to {total} but the host has {pool} stage cores left for them ({names})")]
    Minimums {
        /// Σ min_cores.
        total: usize,
        /// Cores in the pool (the host's stage cores less fixed sets).
        pool: usize,
        /// The VMs with a minimum, `name=min`, comma-separated.
        names: String,
    },
    /// `min_cores` above `max_cores`, `max_cores` 0, or a weight that is
    /// not positive.
    #[error("VM '{name}': {reason}")]
    BadVm {
        /// The VM.
        name: String,
        /// What is wrong, with the values.
        reason: String,
    },
    /// A fixed set outside the host's cores, or two fixed sets that meet.
    #[error("VM '{name}': cores = '{cores}' {reason}")]
    BadFixed {
        /// The VM.
        name: String,
        /// Its fixed set.
        cores: String,
        /// What is wrong.
        reason: String,
    },
}

/// Checks the VMs' settings against `host` (the host's stage cores):
/// weights, minimums and maximums, fixed sets. Errors: as [`allocate`].
pub fn check(host: &CpuSet, vms: &[VmDemand]) -> Result<CpuSet, AllocError> {
    let mut pool = host.clone();
    for vm in vms {
        if !(vm.weight > 0.0 && vm.weight.is_finite()) {
            return Err(AllocError::BadVm {
                name: vm.name.clone(),
                reason: format!("weight = {} is not a positive number", vm.weight),
            });
        }
        if vm.max_cores == 0 {
            return Err(AllocError::BadVm {
                name: vm.name.clone(),
                reason: "max_cores = 0: a VM needs a core to run on".into(),
            });
        }
        if vm.min_cores > vm.max_cores {
            return Err(AllocError::BadVm {
                name: vm.name.clone(),
                reason: format!(
                    "min_cores = {} is above max_cores = {}",
                    vm.min_cores, vm.max_cores
                ),
            });
        }
        if let Some(fixed) = &vm.fixed {
            let reason = if !fixed.is_subset(host) {
                Some(format!("is not within the host's stage cores {host}"))
            } else if !fixed.is_subset(&pool) {
                Some("meets another VM's fixed cores".to_string())
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(AllocError::BadFixed {
                    name: vm.name.clone(),
                    cores: fixed.to_string(),
                    reason,
                });
            }
            pool = pool.difference(fixed);
        }
    }
    let floating = vms.iter().filter(|v| v.fixed.is_none());
    let total: usize = floating.clone().map(|v| v.min_cores).sum();
    if total > pool.len() {
        return Err(AllocError::Minimums {
            total,
            pool: pool.len(),
            names: floating
                .filter(|v| v.min_cores > 0)
                .map(|v| format!("{}={}", v.name, v.min_cores))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(pool)
}

/// The new set of each VM of `vms` (same order) on `host`, the host's
/// stage cores, moving a core only when another VM's weighted unmet demand
/// exceeds its holder's by more than `hysteresis` (cores × weight). The
/// rules are the module's. Errors: [`AllocError`] for settings the host
/// cannot serve (checked by [`check`] first).
pub fn allocate(
    host: &CpuSet,
    vms: &[VmDemand],
    hysteresis: f64,
) -> Result<Vec<VmCores>, AllocError> {
    let pool = check(host, vms)?;
    let floating: Vec<usize> = (0..vms.len()).filter(|&i| vms[i].fixed.is_none()).collect();
    let counts = counts(&pool, vms, &floating, hysteresis);
    let mut out: Vec<VmCores> = vms
        .iter()
        .map(|vm| VmCores {
            cores: vm.fixed.clone().unwrap_or_default(),
            owned: CpuSet::new(),
            shared: false,
        })
        .collect();
    // Sets: every VM keeps what it can of its current cores first (a VM
    // that shrinks keeps its lowest), then takes free ones.
    let mut free = pool.clone();
    for &i in &floating {
        let keep: Vec<usize> = owned(&vms[i])
            .intersection(&free)
            .iter()
            .take(counts[i])
            .collect();
        for c in keep {
            out[i].cores.insert(c);
            free = free.difference(&single(c));
        }
    }
    for &i in &floating {
        while out[i].cores.len() < counts[i] {
            let Some(c) = free.iter().next() else { break };
            out[i].cores.insert(c);
            free = free.difference(&single(c));
        }
    }
    for o in &mut out {
        o.owned = o.cores.clone();
    }
    share(&pool, vms, &floating, &mut out);
    Ok(out)
}

/// Rule 2: whole cores per floating VM.
fn counts(pool: &CpuSet, vms: &[VmDemand], floating: &[usize], hysteresis: f64) -> Vec<usize> {
    let mut count = vec![0usize; vms.len()];
    for &i in floating {
        count[i] = vms[i].min_cores;
    }
    let mut left = pool
        .len()
        .saturating_sub(floating.iter().map(|&i| count[i]).sum());
    // Then, when there is a core for every VM, one core each to the VMs
    // still at none (exclusive sets for all); with fewer cores than VMs
    // the cores go by demand alone and the VMs left without share.
    if floating.len() <= pool.len() {
        for &i in floating {
            if count[i] == 0 && left > 0 && !vms[i].lends(pool) {
                count[i] = 1;
                left -= 1;
            }
        }
    }
    let held = |i: usize| owned(&vms[i]).intersection(pool).len();
    // Weighted unmet demand, with the holder's advantage.
    let priority = |i: usize, c: usize| {
        let bonus = if c < held(i) { hysteresis } else { 0.0 };
        vms[i].weight * (vms[i].demand - c as f64) + bonus
    };
    while left > 0 {
        let best = floating
            .iter()
            .copied()
            .filter(|&i| count[i] < vms[i].max_cores && vms[i].demand > count[i] as f64)
            .max_by(|&a, &b| {
                priority(a, count[a])
                    .total_cmp(&priority(b, count[b]))
                    .then(held(a).cmp(&held(b)))
                    .then(b.cmp(&a))
            });
        let Some(i) = best else { break };
        count[i] += 1;
        left -= 1;
    }
    // Cores nobody needs now go to VMs below their maximum: first to a VM
    // that holds more cores than it has been counted (no move), then in
    // proportion to weight (the largest weight ÷ (count + 1), D'Hondt).
    // An idle lender is among them: a core nobody wants stays its own.
    while left > 0 {
        let best = floating
            .iter()
            .copied()
            .filter(|&i| count[i] < vms[i].max_cores)
            .max_by(|&a, &b| {
                (count[a] < held(a))
                    .cmp(&(count[b] < held(b)))
                    .then(
                        (vms[a].weight / (count[a] + 1) as f64)
                            .total_cmp(&(vms[b].weight / (count[b] + 1) as f64)),
                    )
                    .then(b.cmp(&a))
            });
        let Some(i) = best else { break };
        count[i] += 1;
        left -= 1;
    }
    count
}

/// Rule 4: a floating VM left without a core shares one.
fn share(pool: &CpuSet, vms: &[VmDemand], floating: &[usize], out: &mut [VmCores]) {
    let mut load: std::collections::BTreeMap<usize, f64> = pool.iter().map(|c| (c, 0.0)).collect();
    for &i in floating {
        for c in out[i].cores.iter() {
            *load.entry(c).or_default() += vms[i].demand;
        }
    }
    let mut sharers: Vec<usize> = floating
        .iter()
        .copied()
        .filter(|&i| out[i].cores.is_empty())
        .collect();
    sharers.sort_by(|&a, &b| vms[b].demand.total_cmp(&vms[a].demand).then(a.cmp(&b)));
    for i in sharers {
        let mine = vms[i].current.intersection(pool);
        let core = if mine.len() == 1 {
            mine.iter().next()
        } else {
            load.iter()
                .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(b.0)))
                .map(|(&c, _)| c)
        };
        let Some(core) = core else { continue };
        out[i].cores.insert(core);
        *load.entry(core).or_default() += vms[i].demand;
    }
    // Mark every set that meets another.
    let sets: Vec<CpuSet> = out.iter().map(|o| o.cores.clone()).collect();
    for (i, o) in out.iter_mut().enumerate() {
        o.shared = sets
            .iter()
            .enumerate()
            .any(|(j, s)| j != i && !s.intersection(&o.cores).is_empty());
    }
}

/// Each VM's CPU weight (`host.cpu_weight`, cgroup v2's scale) where
/// cores are shared: `vms` gives each VM's `(weight, vCPUs, shared)`. On a
/// core two VMs' sets hold, the host splits time by thread (CFS), not by
/// the allocator's weights; so each VM whose set is shared gets a CPU
/// weight in proportion to its `weight`, scaled so the heaviest per vCPU
/// gets 100 per vCPU (its vCPU threads keep nice 0: a lower nice needs
/// privilege, [`crate::cpuweight`]); a VM with cores of its own gets
/// `None` (nothing changed), and so does every VM when the sharing VMs all
/// have the same weight and vCPUs (the host's default split is then the
/// weighted one, whether it shares by thread or by group, and a change
/// the VMs need not apply is not sent). Rounded, within 1..=10000.
pub fn cpu_weights(vms: &[(f64, usize, bool)]) -> Vec<Option<u32>> {
    let per_vcpu = |w: f64, v: usize| w / v.max(1) as f64;
    let sharing: Vec<(f64, usize)> = vms
        .iter()
        .filter(|(_, _, shared)| *shared)
        .map(|&(w, v, _)| (w, v))
        .collect();
    if sharing.windows(2).all(|p| p[0] == p[1]) {
        return vec![None; vms.len()];
    }
    let top = sharing
        .iter()
        .map(|&(w, v)| per_vcpu(w, v))
        .fold(0.0f64, f64::max);
    vms.iter()
        .map(|&(w, _, shared)| {
            (shared && top > 0.0).then(|| {
                (f64::from(crate::cpuweight::DEFAULT) * w / top)
                    .round()
                    .clamp(1.0, f64::from(crate::config::MAX_CPU_WEIGHT)) as u32
            })
        })
        .collect()
}

/// The share of its cores a VM must keep busy to count as wanting one more.
pub const SATURATED: f64 = 0.85;

/// A VM's demand in cores, from `used` (the work CPU its vCPUs got over
/// the last period, in cores: work CPU ns ÷ wall ns; its report's
/// `sched.cpu.work_ns` between two reads), the `held` cores it runs on
/// now, its `vcpus`, and `utilisation`, its mean over the period where
/// the VM reports it (`sched.cpu.utilisation`: the larger of work CPU
/// over its cores and the guest's busy share): the work CPU, and one core
/// more than it holds when it is saturated — its work CPU fills at least
/// [`SATURATED`] of its cores, or its utilisation is at least
/// [`SATURATED`] — never more than one core per vCPU. A VM confined to
/// its cores cannot show more demand than they give, and on a core other
/// VMs share it gets only its CPU weight's part of it: a guest that never
/// idles there is short of CPU all the same. (A staged guest on a shared
/// core idles while its threads wait on its own preempted vCPUs, so it
/// shows less: docs/design.md, "Several VMs on one host".) A figure that
/// is not a finite non-negative number counts as 0.
pub fn demand(used: f64, held: usize, vcpus: usize, utilisation: Option<f64>) -> f64 {
    let finite = |x: f64| if x.is_finite() { x.max(0.0) } else { 0.0 };
    let used = finite(used);
    let utilisation = utilisation.map_or(0.0, finite);
    let vcpus = vcpus as f64;
    if held > 0 && (used >= SATURATED * held as f64 || utilisation >= SATURATED) {
        used.max((held + 1) as f64).min(vcpus)
    } else {
        used.min(vcpus)
    }
}

/// The cores `vm` owns now.
fn owned(vm: &VmDemand) -> &CpuSet {
    vm.owned.as_ref().unwrap_or(&vm.current)
}

fn single(c: usize) -> CpuSet {
    let mut s = CpuSet::new();
    s.insert(c);
    s
}

#[cfg(test)]
mod tests;
