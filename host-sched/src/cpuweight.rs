//! A VM's CPU weight where its vCPU threads share a core with other VMs'
//! (`host.cpu_weight`, cgroup v2's scale: 100 is one ordinary process).
//!
//! The scheduler shares a core between task groups first, then between
//! the threads of a group (Documentation/scheduler/sched-design-CFS.rst
//! §7). `stagevm-hostd` puts each VM in a cgroup of its own and writes the
//! weight there: cgroup v2 `cpu.weight` = the weight, or v1 `cpu.shares`
//! = weight × 1024 ÷ 100 ([`v1_shares`]; v1's default 1024 is v2's 100).
//! Where it cannot, it sends the weight to the VMM, whose vCPU threads
//! take the nice level nearest weight ÷ vCPUs ([`nice_for`]: a VM's
//! threads together weigh its weight). The VMM opens no group file (issue
//! 50, S2). Only the weight's ratio to other VMs' matters; the daemon
//! scales the weights so the heaviest VM's vCPU threads keep nice 0 (a
//! raised nice needs no privilege; a lowered one needs `CAP_SYS_NICE` or
//! a `RLIMIT_NICE` that allows it).

/// The weight of one ordinary process (cgroup v2's default `cpu.weight`).
pub const DEFAULT: u32 = 100;

/// CFS load weight of nice −20..=19 (Linux, kernel/sched/core.c
/// `sched_prio_to_weight`): each level ≈ 1.25× the next.
const PRIO_TO_WEIGHT: [u32; 40] = [
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100, 4904,
    3906, 3121, 2501, 1991, 1586, 1277, 1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87,
    70, 56, 45, 36, 29, 23, 18, 15,
];

/// The nice level (−20..=19) whose CFS weight is nearest (in ratio) to
/// `weight` on the cgroup v2 scale (100 ↔ nice 0's 1024). A weight that
/// is not a positive finite number gives 19.
pub fn nice_for(weight: f64) -> i32 {
    if !(weight.is_finite() && weight > 0.0) {
        return 19;
    }
    let target = (weight * 1024.0 / f64::from(DEFAULT)).ln();
    let (i, _) = PRIO_TO_WEIGHT
        .iter()
        .enumerate()
        .map(|(i, w)| (i, (f64::from(*w).ln() - target).abs()))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("a non-empty table");
    i as i32 - 20
}

/// CFS load weight of nice level `nice` (clamped to −20..=19).
pub fn weight_of_nice(nice: i32) -> u32 {
    PRIO_TO_WEIGHT[(nice.clamp(-20, 19) + 20) as usize]
}

/// cgroup v1 `cpu.shares` for `weight` (v1's 1024 is v2's 100; v1's range
/// 2..=262144).
pub fn v1_shares(weight: u32) -> u64 {
    (u64::from(weight) * 1024 / u64::from(DEFAULT)).clamp(2, 262_144)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_levels_follow_the_kernels_table() {
        assert_eq!(nice_for(100.0), 0);
        assert_eq!(nice_for(50.0), 3);
        // One in eight of a default thread: 128 → nice 9 (137).
        assert_eq!(nice_for(12.5), 9);
        assert_eq!(nice_for(300.0), -5);
        assert_eq!(nice_for(1e9), -20);
        assert_eq!(nice_for(0.001), 19);
        assert_eq!(nice_for(0.0), 19);
        assert_eq!(nice_for(f64::NAN), 19);
        assert_eq!(weight_of_nice(0), 1024);
        assert_eq!(weight_of_nice(9), 137);
        assert_eq!(weight_of_nice(99), 15);
        assert_eq!(v1_shares(100), 1024);
        assert_eq!(v1_shares(1), 10);
        assert_eq!(v1_shares(10_000), 102_400);
    }
}
