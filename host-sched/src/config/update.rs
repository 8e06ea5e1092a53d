//! Changes to a running VM's stage configuration: the bodies of the
//! operator API's `PUT /api/v1/stages.policy`,
//! `PUT /api/v1/stages.budgets` and `PUT /api/v1/stages.cpu_weight`
//! (JSON), and how they are folded into a [`Config`]. The result is resolved exactly as a `--stages` file is
//! ([`super::resolve`], then [`crate::vm::replan`]), so a change is refused
//! with the same one-line messages naming key and value.

use serde::{Deserialize, Serialize};

use super::{Config, HostSection, Overrides, StageSection};
use crate::error::StagesConfigError;

/// `PUT /api/v1/stages.policy`: the policy by name and, optionally, its
/// parameters; a parameter left out keeps its current value.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyUpdate {
    /// `off`, `pinned`, `static`, `proportional` or `auto` (`policy.name`).
    pub name: String,
    /// Policy period (ms, 1..=60000; `policy.period_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_ms: Option<u64>,
    /// EWMA weight of the newest load sample, in (0, 1] (`policy.smoothing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smoothing: Option<f64>,
    /// Cores a new allocation must gain, ≥ 0 (`policy.hysteresis`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hysteresis: Option<f64>,
    /// Stage-visit policy of the guest's schedulers (`policy.visit`:
    /// `fifo`, `cohort`, `srpt`, `dbr`, `mg1`, `color`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visit: Option<String>,
    /// `auto`: the most a mode may raise p99 latency over unstaged's, a
    /// fraction ≥ 0 (`policy.max_p99_increase`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_p99_increase: Option<f64>,
    /// `auto`: a p99 latency the operator accepts (µs; 0 removes it;
    /// `policy.latency_slo_us`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_slo_us: Option<f64>,
}

/// `PUT /api/v1/stages.budgets`: replaces the `[host]` table (stage and
/// housekeeping cores) and every `[[stage]]` budget, as in a `--stages`
/// file (whose `[policy]` table is changed with [`PolicyUpdate`]). A key
/// left out of `host` takes its default (stage cores: the isolated CPUs,
/// else every allowed CPU; housekeeping: the rest), as in a file. The
/// CPU weight is not a budget: it is kept, and set by [`CpuWeightUpdate`]
/// ([`BudgetsUpdate::check`] refuses `host.cpu_weight` here).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetsUpdate {
    /// `[host]`.
    #[serde(default)]
    pub host: HostSection,
    /// `[[stage]]` entries (JSON key `stage`, as in the file); left out,
    /// the VM's current ones are kept (`stagevm-hostd` changes only the
    /// cores), `[]` removes them.
    #[serde(default, rename = "stage", skip_serializing_if = "Option::is_none")]
    pub stages: Option<Vec<StageSection>>,
}

/// `PUT /api/v1/stages.cpu_weight`: the VM's CPU weight on cores it
/// shares with other VMs (`host.cpu_weight`: 1..=10000, cgroup v2's
/// scale, 100 an ordinary process), or `null` (or `{}`) to take it back.
/// `stagevm-hostd` sends it apart from the cores: a weight changes how the
/// host splits shared cores, not the VM's plan, so the policy keeps its
/// state (no replan) and the cores their budgets.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CpuWeightUpdate {
    /// The weight; `None` takes it back (the vCPU threads' nice as found).
    #[serde(default)]
    pub weight: Option<u32>,
}

impl CpuWeightUpdate {
    /// One line for logs and the timeline: `cpu_weight W` or
    /// `cpu_weight none`.
    pub fn describe(&self) -> String {
        match self.weight {
            Some(w) => format!("cpu_weight {w}"),
            None => "cpu_weight none".into(),
        }
    }
}

impl PolicyUpdate {
    /// One line for logs and the timeline: `policy NAME` and each
    /// parameter given.
    pub fn describe(&self) -> String {
        let mut s = format!("policy {}", self.name);
        if let Some(v) = self.period_ms {
            s += &format!(", period_ms {v}");
        }
        if let Some(v) = self.smoothing {
            s += &format!(", smoothing {v}");
        }
        if let Some(v) = self.hysteresis {
            s += &format!(", hysteresis {v}");
        }
        if let Some(v) = &self.visit {
            s += &format!(", visit {v}");
        }
        if let Some(v) = self.max_p99_increase {
            s += &format!(", max_p99_increase {v}");
        }
        if let Some(v) = self.latency_slo_us {
            s += &format!(", latency_slo_us {v}");
        }
        s
    }
}

impl BudgetsUpdate {
    /// Refuses what a budgets update does not set. Errors:
    /// [`StagesConfigError::WrongChange`] for `host.cpu_weight`
    /// ([`CpuWeightUpdate`] sets it).
    pub fn check(&self) -> Result<(), StagesConfigError> {
        match self.host.cpu_weight {
            Some(_) => Err(StagesConfigError::WrongChange {
                key: "host.cpu_weight",
                change: "a budgets update",
                instead: "PUT /api/v1/stages.cpu_weight sets it",
            }),
            None => Ok(()),
        }
    }

    /// One line for logs and the timeline: the cores and each stage's
    /// budget.
    pub fn describe(&self) -> String {
        let or_default = |v: &Option<String>| v.clone().unwrap_or_else(|| "default".into());
        let stages = match &self.stages {
            Some(stages) => {
                let each: Vec<String> = stages
                    .iter()
                    .map(|s| {
                        let max = s.max_cores.map_or("all".into(), |m| m.to_string());
                        format!("{} {}..{} ×{}", s.name, s.min_cores, max, s.weight)
                    })
                    .collect();
                format!("[{}]", each.join(", "))
            }
            None => "kept".into(),
        };
        format!(
            "budgets: cores {}, housekeeping {}, stages {stages}",
            or_default(&self.host.cores),
            or_default(&self.host.housekeeping),
        )
    }
}

impl Config {
    /// This configuration with the command-line overrides folded in
    /// (`--stage-cores` as `host.cores`, `--housekeeping` as
    /// `host.housekeeping`, `--policy` as `policy.name`, `--visit` as
    /// `policy.visit`): resolving the
    /// result without overrides gives what resolving `self` with them gave.
    pub fn with_overrides(mut self, overrides: &Overrides) -> Self {
        if let Some(cores) = &overrides.cores {
            self.host.cores = Some(cores.clone());
        }
        if let Some(hk) = &overrides.housekeeping {
            self.host.housekeeping = Some(hk.clone());
        }
        if let Some(policy) = &overrides.policy {
            self.policy.name = policy.clone();
        }
        if let Some(visit) = &overrides.visit {
            self.policy.visit = visit.clone();
        }
        self
    }

    /// This configuration with `update` applied: the policy's name and each
    /// parameter the update gives.
    pub fn with_policy(mut self, update: &PolicyUpdate) -> Self {
        self.policy.name = update.name.clone();
        if let Some(v) = update.period_ms {
            self.policy.period_ms = v;
        }
        if let Some(v) = update.smoothing {
            self.policy.smoothing = v;
        }
        if let Some(v) = update.hysteresis {
            self.policy.hysteresis = v;
        }
        if let Some(v) = &update.visit {
            self.policy.visit = v.clone();
        }
        if let Some(v) = update.max_p99_increase {
            self.policy.max_p99_increase = v;
        }
        if let Some(v) = update.latency_slo_us {
            self.policy.latency_slo_us = Some(v);
        }
        self
    }

    /// This configuration with `update`'s `[host]` in place of its own
    /// (the CPU weight kept), and its `[[stage]]` entries if it gives them.
    pub fn with_budgets(mut self, update: &BudgetsUpdate) -> Self {
        let weight = self.host.cpu_weight;
        self.host = update.host.clone();
        self.host.cpu_weight = weight;
        if let Some(stages) = &update.stages {
            self.stages = stages.clone();
        }
        self
    }

    /// This configuration with the CPU weight `update` gives
    /// (`host.cpu_weight`), everything else kept.
    pub fn with_cpu_weight(mut self, update: &CpuWeightUpdate) -> Self {
        self.host.cpu_weight = update.weight;
        self
    }
}
