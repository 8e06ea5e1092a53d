//! `stagevm-hostd`: several VMs share the host's stage cores. Each period
//! it reads every VM of a directory over its API socket (demand: its
//! vCPUs' work CPU since the last read), shares the host's stage cores among them by
//! host-sched's allocator ([`host_sched::host`]: minimums, weights,
//! maximums, the fewest moves) and gives each VM whose set changed its new
//! one; each VM's own controller then places its stages and vCPUs within
//! its cores. Data flows one way: VM reports → demand → allocation → each
//! VM's `[host] cores`.
//!
//! * [`config`] — `host.toml`,
//! * [`vm`] — one VM's socket: read, give, discovery,
//! * [`daemon`] — the period,
//! * [`api`] — the operator's view and metrics,
//! * [`lock`] — one daemon per directory.

pub mod api;
pub mod cgroup;
pub mod config;
pub mod daemon;
pub mod lock;
pub mod peer;
pub mod vm;
