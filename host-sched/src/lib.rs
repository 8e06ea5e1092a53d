//! stagevm host scheduler: host topology, the operator's stage budgets, the
//! allocation policies and vCPU pinning.
//!
//! * [`cpuset`] — CPU sets in cpulist form,
//! * [`topology`] — allowed/online/isolated CPUs, thread affinity,
//! * [`config`] — the TOML configuration and its resolution,
//! * [`error`] — [`error::StagesConfigError`], one variant per bad key or value,
//! * [`host`] — the host-wide allocation of stage cores among VMs
//!   (`stagevm-hostd`),
//! * [`histogram`] — request-latency histograms (ABI minor 4) and their
//!   quantiles,
//! * [`policy`] — `off`, `pinned`, `static`, `proportional`, `auto` as pure functions
//!   behind the [`policy::Policy`] trait (seed 000 §4.5),
//! * [`vm`] — the VM-level plan: stage cores for a VM's vCPU count and the
//!   one constructor of a VM's policy.

pub mod config;
pub mod cpuset;
pub mod cpuweight;
pub mod error;
pub mod histogram;
pub mod host;
pub mod policy;
pub mod topology;
pub mod vm;
