//! What a resolved configuration gives the policy: its context and the
//! guest's stages' budgets.

use super::{Budget, Resolved, StagesConfigError};

impl Resolved {
    /// The policy context for `num_vcpus` vCPUs and the guest's `budgets`.
    pub fn context(&self, num_vcpus: u32, budgets: Vec<Budget>) -> crate::policy::Context {
        crate::policy::Context {
            cores: self.stage_cores.iter().collect(),
            num_vcpus,
            budgets,
            smoothing: self.smoothing,
            hysteresis: self.hysteresis,
            visit: self.visit,
            latency: self.latency,
            auto_modes: self.auto_modes,
            auto_twin: self.auto_twin,
        }
    }

    /// Budgets for the stages the guest registered, in the guest's stage-id
    /// order. Guest stages without a `[[stage]]` get min 0, max all, weight 1.
    /// Errors for a configured stage the guest did not declare, and when the
    /// maximum budgets cannot use every stage core.
    pub fn budgets_for(&self, guest_stages: &[String]) -> Result<Vec<Budget>, StagesConfigError> {
        if let Some(b) = self
            .budgets
            .iter()
            .find(|b| !guest_stages.contains(&b.name))
        {
            return Err(StagesConfigError::UnknownStage {
                name: b.name.clone(),
                declared: guest_stages.to_vec(),
            });
        }
        let n = self.stage_cores.len();
        let out: Vec<Budget> = guest_stages
            .iter()
            .map(|name| {
                self.budgets
                    .iter()
                    .find(|b| &b.name == name)
                    .cloned()
                    .unwrap_or(Budget {
                        name: name.clone(),
                        min_cores: 0,
                        max_cores: n,
                        weight: 1.0,
                    })
            })
            .collect();
        let max_sum = out
            .iter()
            .fold(0usize, |sum, b| sum.saturating_add(b.max_cores));
        if max_sum < n {
            return Err(StagesConfigError::MaxCoresTooFew {
                sum: max_sum,
                n,
                cores: self.stage_cores.to_string(),
            });
        }
        Ok(out)
    }
}
