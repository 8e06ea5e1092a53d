//! The VM's CPU weight on cores it shares with other VMs, as the report
//! shows it.

use serde::{Deserialize, Serialize};

/// The VM's CPU weight on cores shared with other VMs (`host.cpu_weight`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuWeightReport {
    /// The weight asked (1..=10000; 100 is an ordinary process), `None`
    /// after it was taken back (the values found before are restored).
    pub weight: Option<u32>,
    /// What carries it: `vCPU threads' nice` (each vCPU's `nice`). The VMM
    /// opens no group file: a group's weight is `stagevm-hostd`'s to set,
    /// and it sends a weight to the VMM only where it cannot (issue 50,
    /// S2).
    pub by: String,
    /// Kept for readers of older reports (a group's value the VMM once
    /// wrote); always `None` now.
    #[serde(default)]
    pub group_value: Option<i64>,
    /// Why the weight is not in force (a lower nice without
    /// `CAP_SYS_NICE` or a `RLIMIT_NICE` that allows it), if it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The weight the vCPU threads' nice levels carry now, read back (Σ
    /// the CFS weight of each vCPU thread's nice × 100 ÷ 1024, so 100 per
    /// thread at nice 0) — what is in force, also when a nice could not
    /// come back down (lowering one needs `CAP_SYS_NICE`, or a
    /// `RLIMIT_NICE` its supervisor gives: `LimitNICE=+0` in
    /// `stagevm@.service`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_force: Option<u32>,
}
