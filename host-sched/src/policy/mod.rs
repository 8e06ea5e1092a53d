//! Allocation policies: pure functions from observed per-stage load to a
//! [`Plan`] (stage map + vCPU → core pinning), behind one trait so the VMM and
//! the benchmarks run the very same code.
//!
//! Model (Schwarz, "Stage-aware Scheduling in a Library OS", seed 000 §4.5):
//! every stage core is allocated to exactly one stage; a stage may get zero
//! cores, and then the *victim core* — the one with the highest index — serves
//! it too. vCPU `v` is pinned to stage core `v mod C` and serves the stages of
//! that core, so each vCPU runs only on a core of the stages it serves.

pub mod auto;
mod observation;
pub mod relabel;

use crate::config::Budget;
use crate::cpuset::CpuSet;
pub use auto::LatencyBound;
pub use hypercall_abi::stage::VisitPolicy;
pub use observation::{Observation, StageWork};

/// Which policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// Every vCPU serves every stage; vCPU threads float over the stage cores.
    Off,
    /// Every vCPU serves every stage; vCPU `v` is pinned to core `v mod C`
    /// (Cloud Hypervisor's static `--cpus affinity`: pinned, not staged).
    Pinned,
    /// Cores allocated once, proportional to the configured weights within
    /// the budgets.
    Static,
    /// Cores re-allocated every policy period proportional to measured,
    /// smoothed stage load, within the budgets, with hysteresis.
    Proportional,
    /// Trials of the `static` plan against the `pinned` plan, keeping the
    /// one with the higher request rate ([`auto`]).
    Auto,
}

impl PolicyKind {
    /// Parses a policy name (`off`, `pinned`, `static`, `proportional`,
    /// `auto`).
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "off" => Self::Off,
            "pinned" => Self::Pinned,
            "static" => Self::Static,
            "proportional" => Self::Proportional,
            "auto" => Self::Auto,
            _ => return None,
        })
    }

    /// The policy's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Pinned => "pinned",
            Self::Static => "static",
            Self::Proportional => "proportional",
            Self::Auto => "auto",
        }
    }
}

/// A stage map and a pinning plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Per stage (guest stage id), the mask of vCPUs serving it.
    pub stage_vcpus: Vec<u64>,
    /// Per stage, the cores its vCPUs run on.
    pub stage_cores: Vec<CpuSet>,
    /// Per vCPU, the cores its thread may run on.
    pub vcpu_cores: Vec<CpuSet>,
    /// Per stage, cores allocated to it (its entry of the requirement vector;
    /// 0 for a stage served by the victim core).
    pub requirement: Vec<usize>,
    /// The stage-visit policy each vCPU's scheduler uses (temporal staging,
    /// ABI minor 3): the operator's `[policy] visit` ([`Context::visit`]),
    /// or `auto`'s choice.
    pub visit: VisitPolicy,
}

impl Plan {
    /// The vCPUs that are alone on their host core: pinned to exactly one
    /// core that no other vCPU of the plan may run on (bit v = vCPU v, the
    /// first 64 vCPUs). Such a vCPU can idle by polling instead of parking
    /// (ABI minor 1, `StageMap::owned`); helper threads on the same core are
    /// not counted (they sleep in epoll).
    pub fn owned_vcpus(&self) -> u64 {
        let mut owned = 0u64;
        for (v, cores) in self.vcpu_cores.iter().enumerate().take(64) {
            let Some(core) = cores.iter().next().filter(|_| cores.len() == 1) else {
                continue;
            };
            let shared = self
                .vcpu_cores
                .iter()
                .enumerate()
                .any(|(w, other)| w != v && other.contains(core));
            if !shared {
                owned |= 1 << v;
            }
        }
        owned
    }
}

/// Inputs every policy is built with.
#[derive(Clone, Debug)]
pub struct Context {
    /// Stage cores, in increasing order (`C` = its length).
    pub cores: Vec<usize>,
    /// Number of vCPUs (≥ `C` for the staged policies, ≤ 64).
    pub num_vcpus: u32,
    /// Per guest stage, its budget.
    pub budgets: Vec<Budget>,
    /// EWMA weight of the newest load sample (proportional).
    pub smoothing: f64,
    /// Improvement in cores a new allocation needs (proportional).
    pub hysteresis: f64,
    /// The operator's stage-visit policy (`[policy] visit`, default fifo),
    /// put into every plan (`auto` chooses its own, see [`auto`]).
    pub visit: VisitPolicy,
    /// The operator's bound on tail latency (`[policy] max_p99_increase`,
    /// `latency_slo_us`): `auto` keeps no mode beyond it.
    pub latency: LatencyBound,
    /// The modes `auto` trials (`[policy] auto_modes`; unstaged always).
    pub auto_modes: auto::Modes,
    /// `auto` runs the null experiment (`[policy] auto_twin`): its one
    /// candidate is unstaged named `temporal` ([`auto::AutoParams::twin`]).
    pub auto_twin: bool,
}

/// Consecutive policy periods a new allocation must be computed before the
/// proportional policy adopts it (hysteresis against noise; ours, not the
/// thesis').
pub const PERSISTENCE_PERIODS: u32 = 2;

/// Largest load a policy takes from one stage (vCPUs' worth of time; an
/// honest guest stays ≤ 64): larger values come from forged timestamps.
pub const MAX_LOAD: f64 = 1e6;

/// A policy: observed per-stage load in, plan out.
pub trait Policy: Send {
    /// Which policy this is.
    fn kind(&self) -> PolicyKind;
    /// The plan for this period given `load` (per guest stage, non-negative;
    /// the VMM passes the vCPUs' worth of time each stage used in the
    /// period). Pure apart from the policy's own smoothing state.
    fn plan(&mut self, load: &[f64]) -> Plan;
    /// What the VMM measured over the period that just ended, given before
    /// [`Policy::plan`] (only `auto` uses it).
    fn observe(&mut self, _observation: &Observation) {}
    /// What the policy decided in its last `plan` call, for the timeline
    /// (only `auto` decides anything beyond the plan).
    fn decision(&self) -> Option<auto::AutoDecision> {
        None
    }
    /// `auto` only: what its trials have cost so far.
    fn auto_stats(&self) -> Option<auto::AutoStats> {
        None
    }
    /// `auto` only: its last finished trial.
    fn last_trial(&self) -> Option<auto::TrialSummary> {
        None
    }
    /// The VM's stage cores changed in number (the host daemon moved it):
    /// adopt `ctx` and keep what was learnt, if the policy can; `false`
    /// asks the caller to build a new one (the default: the other policies
    /// keep only an EWMA of the load). A move to as many cores needs no
    /// call: [`relabel`] renames the plans' cores.
    fn retarget(&mut self, _ctx: Context) -> bool {
        false
    }
}

/// Builds a policy.
pub fn build(kind: PolicyKind, ctx: Context) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Auto => {
            let params = auto::AutoParams::of_context(&ctx);
            Box::new(auto::Auto::new(ctx, params))
        }
        PolicyKind::Off | PolicyKind::Pinned => Box::new(Unstaged { kind, ctx }),
        PolicyKind::Static => {
            let weights: Vec<f64> = ctx.budgets.iter().map(|b| b.weight).collect();
            let r = requirements(&weights, &ctx);
            let assignment = transition(&vec![None; ctx.cores.len()], &r);
            Box::new(Static {
                plan: plan_from_assignment(&ctx, &assignment),
            })
        }
        PolicyKind::Proportional => {
            let weights: Vec<f64> = ctx.budgets.iter().map(|b| b.weight).collect();
            let r = requirements(&weights, &ctx);
            let assignment = transition(&vec![None; ctx.cores.len()], &r);
            Box::new(Proportional {
                smoothed: vec![0.0; ctx.budgets.len()],
                primed: false,
                assignment,
                pending: None,
                ctx,
            })
        }
    }
}

struct Unstaged {
    kind: PolicyKind,
    ctx: Context,
}

impl Policy for Unstaged {
    fn kind(&self) -> PolicyKind {
        self.kind
    }
    fn plan(&mut self, _load: &[f64]) -> Plan {
        let ctx = &self.ctx;
        let all: CpuSet = ctx.cores.iter().copied().collect();
        let stages = ctx.budgets.len();
        let vcpu_cores = (0..ctx.num_vcpus as usize)
            .map(|v| match self.kind {
                PolicyKind::Pinned => [ctx.cores[v % ctx.cores.len()]].into_iter().collect(),
                _ => all.clone(),
            })
            .collect();
        Plan {
            stage_vcpus: vec![hypercall_abi::stage::all_vcpus_mask(ctx.num_vcpus); stages],
            stage_cores: vec![all.clone(); stages],
            vcpu_cores,
            requirement: vec![ctx.cores.len(); stages],
            visit: ctx.visit,
        }
    }
}

struct Static {
    plan: Plan,
}

impl Policy for Static {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Static
    }
    fn plan(&mut self, _load: &[f64]) -> Plan {
        self.plan.clone()
    }
}

struct Proportional {
    ctx: Context,
    smoothed: Vec<f64>,
    primed: bool,
    assignment: Vec<Option<usize>>,
    /// A candidate requirement and for how many periods in a row it was computed.
    pending: Option<(Vec<usize>, u32)>,
}

impl Policy for Proportional {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Proportional
    }
    fn plan(&mut self, load: &[f64]) -> Plan {
        let ctx = &self.ctx;
        // Seed 000 §4.5, Fig. 4.6 line 1: exponentially-decaying average.
        let a = ctx.smoothing;
        for (s, l) in self.smoothed.iter_mut().zip(load) {
            // Load is vCPUs' worth of time (≤ 64 when honest); a forged
            // timestamp cannot make it, or weight × it, infinite.
            let l = if l.is_finite() && *l > 0.0 {
                l.min(MAX_LOAD)
            } else {
                0.0
            };
            *s = if self.primed {
                a * l + (1.0 - a) * *s
            } else {
                l
            };
        }
        self.primed = true;
        let weighted: Vec<f64> = self
            .smoothed
            .iter()
            .zip(&ctx.budgets)
            .map(|(l, b)| l * b.weight)
            .collect();
        let total: f64 = weighted.iter().sum();
        if total > 0.0 {
            let new_r = requirements(&weighted, ctx);
            let cur_r = counts(&self.assignment, ctx.budgets.len());
            // Ideal fractional cores within the budgets; the hysteresis
            // compares distances to it.
            let ideal = fractional(&weighted, ctx);
            let dist = |r: &[usize]| -> f64 {
                r.iter()
                    .zip(&ideal)
                    .map(|(r, f)| (*r as f64 - f).abs())
                    .sum()
            };
            if new_r != cur_r && dist(&cur_r) - dist(&new_r) > ctx.hysteresis {
                let seen = match &self.pending {
                    Some((r, n)) if *r == new_r => n + 1,
                    _ => 1,
                };
                if seen >= PERSISTENCE_PERIODS {
                    self.assignment = transition(&self.assignment, &new_r);
                    self.pending = None;
                } else {
                    self.pending = Some((new_r, seen));
                }
            } else {
                self.pending = None;
            }
        }
        plan_from_assignment(ctx, &self.assignment)
    }
}

/// Fractional cores per stage proportional to `load`, within each stage's
/// `[min_cores, max_cores]` (water-filling: clamp, then share what is left
/// among the unclamped stages by load). Sums to the number of cores when the
/// budgets allow it.
pub fn fractional(load: &[f64], ctx: &Context) -> Vec<f64> {
    let b = &ctx.budgets;
    let c = ctx.cores.len() as f64;
    let mut fixed: Vec<Option<f64>> = vec![None; b.len()];
    for _ in 0..=b.len() {
        let left = c - fixed.iter().flatten().sum::<f64>();
        let free: f64 = (0..b.len())
            .filter(|s| fixed[*s].is_none())
            .map(|s| load.get(s).copied().unwrap_or(0.0).max(0.0))
            .sum();
        let share = |s: usize| {
            if free > 0.0 {
                load.get(s).copied().unwrap_or(0.0).max(0.0) / free * left
            } else {
                0.0
            }
        };
        let mut changed = false;
        for s in 0..b.len() {
            if fixed[s].is_some() {
                continue;
            }
            let f = share(s);
            if f < b[s].min_cores as f64 {
                fixed[s] = Some(b[s].min_cores as f64);
                changed = true;
            } else if f > b[s].max_cores as f64 {
                fixed[s] = Some(b[s].max_cores as f64);
                changed = true;
            }
        }
        if !changed {
            return (0..b.len())
                .map(|s| fixed[s].unwrap_or_else(|| share(s)))
                .collect();
        }
    }
    fixed.iter().map(|f| f.unwrap_or(0.0)).collect()
}

fn counts(assignment: &[Option<usize>], stages: usize) -> Vec<usize> {
    let mut r = vec![0; stages];
    for s in assignment.iter().flatten() {
        r[*s] += 1;
    }
    r
}

/// Distributes `c` cores proportional to `p`: seed 000 Fig. 4.6 — integer
/// parts first, then the remainders as the next priorities; when every share
/// is below one core, the smallest priority is shifted to the largest
/// ("priority shifting"). Total on any input: a negative, NaN or infinite
/// priority counts as 0 (all zero: equal shares), huge ones are scaled
/// first, and the loop is bounded; every core is always given out.
pub fn distribute(p: &[f64], mut c: usize) -> Vec<usize> {
    let mut r = vec![0usize; p.len()];
    if p.is_empty() || c == 0 {
        return r;
    }
    let clean: Vec<f64> = p
        .iter()
        .map(|x| if x.is_finite() && *x > 0.0 { *x } else { 0.0 })
        .collect();
    // Scale by the largest so the sum cannot overflow to infinity.
    let top = clean.iter().copied().fold(0.0, f64::max);
    let p: Vec<f64> = clean
        .iter()
        .map(|x| if top > 0.0 { x / top } else { 0.0 })
        .collect();
    let sum: f64 = p.iter().sum();
    let mut p: Vec<f64> = if sum > 0.0 {
        p.iter().map(|x| x / sum).collect()
    } else {
        vec![1.0 / p.len() as f64; p.len()]
    };
    // Each pass gives out at least one core or retires one priority.
    let mut passes = c + 2 * p.len() + 2;
    while c > 0 {
        passes -= 1;
        if passes == 0 {
            let imax = (0..p.len())
                .reduce(|m, i| if p[i] > p[m] { i } else { m })
                .unwrap_or(0);
            r[imax] += c;
            break;
        }
        let f: Vec<f64> = p.iter().map(|x| x * c as f64).collect();
        if f.iter().all(|x| *x < 1.0) {
            let live: Vec<usize> = (0..p.len()).filter(|i| p[*i] > 0.0).collect();
            // Ties go to the lower stage index, so results are deterministic.
            let imax = live
                .iter()
                .copied()
                .reduce(|m, i| if f[i] > f[m] { i } else { m })
                .unwrap_or(0);
            let imin = live
                .iter()
                .copied()
                .filter(|i| *i != imax)
                .reduce(|m, i| if f[i] < f[m] { i } else { m })
                .unwrap_or(imax);
            if imin == imax {
                r[imax] += c;
                break;
            }
            p[imax] += p[imin];
            p[imin] = 0.0;
            continue;
        }
        let mut assigned = 0;
        for (ri, fi) in r.iter_mut().zip(&f) {
            let whole = fi.floor() as usize;
            *ri += whole;
            assigned += whole;
        }
        c = c.saturating_sub(assigned);
        let frac: Vec<f64> = f.iter().map(|x| x - x.floor()).collect();
        let fsum: f64 = frac.iter().sum();
        if c > 0 && !(fsum >= 1e-9 && fsum.is_finite()) {
            let imax = (0..p.len())
                .reduce(|m, i| if p[i] > p[m] { i } else { m })
                .unwrap_or(0);
            r[imax] += c;
            break;
        }
        p = frac.iter().map(|x| x / fsum).collect();
    }
    r
}

/// The requirement vector (cores per stage) for `load` within the budgets:
/// every stage first gets `min_cores`, the rest is distributed with
/// [`distribute`] among stages below `max_cores`, repeatedly, until every
/// core is allocated.
pub fn requirements(load: &[f64], ctx: &Context) -> Vec<usize> {
    let b = &ctx.budgets;
    let mut r: Vec<usize> = b.iter().map(|b| b.min_cores).collect();
    let mut left = ctx.cores.len().saturating_sub(r.iter().sum());
    while left > 0 {
        let open: Vec<usize> = (0..b.len()).filter(|s| r[*s] < b[*s].max_cores).collect();
        if open.is_empty() {
            break;
        }
        let p: Vec<f64> = open
            .iter()
            .map(|s| load.get(*s).copied().unwrap_or(0.0).max(0.0))
            .collect();
        let share = distribute(&p, left);
        let mut given = 0;
        for (k, s) in open.iter().enumerate() {
            let take = share[k].min(b[*s].max_cores - r[*s]);
            r[*s] += take;
            given += take;
        }
        if given == 0 {
            break;
        }
        left -= given;
    }
    r
}

/// Minimal transition (seed 000 §4.5): from the current core→stage
/// `assignment` to one with the counts `r`, re-assigning as few cores as
/// possible and preferring lower-index cores.
pub fn transition(assignment: &[Option<usize>], r: &[usize]) -> Vec<Option<usize>> {
    let mut a = assignment.to_vec();
    let mut delta: Vec<i64> = r.iter().map(|x| *x as i64).collect();
    for s in a.iter().flatten() {
        if let Some(d) = delta.get_mut(*s) {
            *d -= 1;
        }
    }
    for slot in a.iter_mut() {
        let excess = match slot {
            Some(s) => delta.get(*s).is_none_or(|d| *d < 0),
            None => true,
        };
        if !excess {
            continue;
        }
        if let Some(t) = (0..delta.len()).find(|t| delta[*t] > 0) {
            if let Some(s) = *slot {
                if let Some(d) = delta.get_mut(s) {
                    *d += 1;
                }
            }
            delta[t] -= 1;
            *slot = Some(t);
        }
    }
    a
}

/// Turns a core→stage assignment into a [`Plan`]: stages without a core are
/// served by the victim core (the highest index, seed 000 §4.5); vCPU `v` is
/// pinned to core `v mod C` and serves that core's stages.
pub fn plan_from_assignment(ctx: &Context, assignment: &[Option<usize>]) -> Plan {
    let stages = ctx.budgets.len();
    let c = ctx.cores.len();
    let requirement = counts(assignment, stages);
    let victim = c - 1;
    let serves =
        |k: usize, s: usize| assignment[k] == Some(s) || (k == victim && requirement[s] == 0);
    let mut stage_vcpus = vec![0u64; stages];
    let mut vcpu_cores = Vec::with_capacity(ctx.num_vcpus as usize);
    for v in 0..ctx.num_vcpus as usize {
        let k = v % c;
        vcpu_cores.push([ctx.cores[k]].into_iter().collect());
        for (s, mask) in stage_vcpus.iter_mut().enumerate() {
            if serves(k, s) && v < 64 {
                *mask |= 1 << v;
            }
        }
    }
    let stage_cores = (0..stages)
        .map(|s| {
            (0..c)
                .filter(|k| serves(*k, s))
                .map(|k| ctx.cores[k])
                .collect()
        })
        .collect();
    Plan {
        stage_vcpus,
        stage_cores,
        vcpu_cores,
        requirement,
        visit: ctx.visit,
    }
}

#[cfg(test)]
mod tests;
