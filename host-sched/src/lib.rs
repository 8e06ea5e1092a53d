//! stagevm host scheduler: host topology, operator stage budgets, allocation
//! policies and vCPU pinning. Empty until the host-sched work lands; see
//! `../shared/DESIGN.md`.
