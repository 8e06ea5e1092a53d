//! A change of a VM's stage cores that keeps their number (the host
//! daemon moving a VM from cores 0-1 to 2-3) keeps its policy and what
//! the policy learnt — `auto`'s trials, the EWMA of the load — and only
//! renames the cores in each plan (issue 50, S5). A change of their number
//! rebuilds the policy: the spatial modes' requirement vectors and every
//! figure `auto` measured were for the old count, so the answer may
//! differ.

use crate::cpuset::CpuSet;

use super::Plan;

/// Core ids the policy plans with → the cores the VM has now, by rank
/// (the i-th smallest of one set is the i-th smallest of the other).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Relabel {
    /// `(policy's core, core now)`, sorted by the policy's core.
    pairs: Vec<(usize, usize)>,
}

impl Relabel {
    /// The renaming for a move from `from` to `to` composed after `self`
    /// (the policy's cores → `from`, now → `to`), or `None` when the two
    /// sets differ in size (the policy must be rebuilt). `self` empty is
    /// the identity on `from`.
    pub fn then(&self, from: &CpuSet, to: &CpuSet) -> Option<Self> {
        if from.len() != to.len() {
            return None;
        }
        let step: Vec<(usize, usize)> = from.iter().zip(to.iter()).collect();
        let map = |c: usize| step.iter().find(|(f, _)| *f == c).map_or(c, |(_, t)| *t);
        let pairs = if self.pairs.is_empty() {
            step.clone()
        } else {
            self.pairs.iter().map(|(p, now)| (*p, map(*now))).collect()
        };
        Some(Self { pairs })
    }

    /// Whether it renames nothing.
    pub fn is_identity(&self) -> bool {
        self.pairs.iter().all(|(a, b)| a == b)
    }

    fn core(&self, c: usize) -> usize {
        self.pairs
            .iter()
            .find(|(p, _)| *p == c)
            .map_or(c, |(_, now)| *now)
    }

    fn set(&self, s: &CpuSet) -> CpuSet {
        s.iter().map(|c| self.core(c)).collect()
    }

    /// `plan` with its cores renamed (per stage and per vCPU); the stage
    /// map (which vCPUs serve which stage) is unchanged.
    pub fn apply(&self, mut plan: Plan) -> Plan {
        if self.is_identity() {
            return plan;
        }
        plan.stage_cores = plan.stage_cores.iter().map(|s| self.set(s)).collect();
        plan.vcpu_cores = plan.vcpu_cores.iter().map(|s| self.set(s)).collect();
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap()
    }

    #[test]
    fn cores_are_renamed_by_rank_and_moves_compose() {
        let first = Relabel::default().then(&set("0-1"), &set("2-3")).unwrap();
        let plan = Plan {
            stage_cores: vec![set("0"), set("1")],
            vcpu_cores: vec![set("0"), set("1"), set("0-1")],
            ..Default::default()
        };
        let moved = first.apply(plan.clone());
        assert_eq!(moved.vcpu_cores, vec![set("2"), set("3"), set("2-3")]);
        assert_eq!(moved.stage_cores, vec![set("2"), set("3")]);
        // 2-3 → 1,3: the policy's 0 is now 1, its 1 is 3.
        let second = first.then(&set("2-3"), &set("1,3")).unwrap();
        assert_eq!(second.apply(plan.clone()).vcpu_cores[2], set("1,3"));
        // Back where it started: the identity.
        let back = second.then(&set("1,3"), &set("0-1")).unwrap();
        assert!(back.is_identity());
        assert_eq!(back.apply(plan.clone()), plan);
        // Another number of cores: rebuild.
        assert_eq!(first.then(&set("2-3"), &set("1-3")), None);
    }
}
