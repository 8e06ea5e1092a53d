//! The VM-level decisions host-sched takes for one VM: which stage cores a
//! VM of `n` vCPUs can use, and the policy for its guest's stages. The VMM
//! calls these and applies the result; it decides nothing itself.

use crate::config::{Resolved, StagesConfigError};
use crate::policy::{self, Policy, PolicyKind};

/// The configuration a VM runs under and what was changed to fit it.
#[derive(Clone, Debug)]
pub struct VmPlan {
    /// The resolved configuration, with the stage cores trimmed to the vCPU
    /// count for the staged policies.
    pub resolved: Resolved,
    /// One line per change made (for the report's warnings).
    pub warnings: Vec<String>,
}

/// Whether `kind` gives stages their own cores (every stage core then needs
/// a vCPU of its own).
pub fn is_staged(kind: PolicyKind) -> bool {
    matches!(
        kind,
        PolicyKind::Static | PolicyKind::Proportional | PolicyKind::Auto
    )
}

/// Fits `resolved` to a VM of `num_vcpus` vCPUs: a staged policy with more
/// stage cores than vCPUs uses the first `num_vcpus` stage cores (and, when
/// helpers share the stage cores, those as housekeeping too).
pub fn for_vm(resolved: &Resolved, num_vcpus: u32) -> VmPlan {
    let mut resolved = resolved.clone();
    let mut warnings = Vec::new();
    let n = num_vcpus as usize;
    if is_staged(resolved.policy) && n < resolved.stage_cores.len() {
        let all = resolved.stage_cores.clone();
        resolved.stage_cores = all.iter().take(n).collect();
        if resolved.helpers_share_stage_cores {
            resolved.housekeeping = resolved.stage_cores.clone();
        }
        warnings.push(format!(
            "--cpus boot={num_vcpus} is fewer than the {} stage cores '{all}': the {} policy uses stage cores '{}'",
            all.len(),
            resolved.policy.name(),
            resolved.stage_cores
        ));
    }
    VmPlan { resolved, warnings }
}

/// Builds the VM's policy: the only place a policy is constructed for a VM.
/// `guest_stages` is `None` before the guest registers (the plan then places
/// vCPUs only: `off` floats them over all stage cores, the others pin vCPU
/// `v` to stage core `v mod C`), else the names it declared, in stage-id
/// order, which the configured budgets are matched against.
///
/// Errors: [`StagesConfigError::UnknownStage`] for a configured stage the guest
/// did not declare, [`StagesConfigError::MaxCoresTooFew`] when the budgets cannot
/// use every stage core.
pub fn build_policy(
    resolved: &Resolved,
    num_vcpus: u32,
    guest_stages: Option<&[String]>,
) -> Result<Box<dyn Policy>, StagesConfigError> {
    let budgets = match guest_stages {
        None => Vec::new(),
        Some(names) => resolved.budgets_for(names)?,
    };
    Ok(policy::build(
        resolved.policy,
        resolved.context(num_vcpus, budgets),
    ))
}

/// The policy for the stages a guest declared at REGISTER, which never
/// fails: the guest is untrusted and its stage names are its own, so a
/// configuration that does not fit them must not end the VM.
///
/// * `[[stage]]` budgets for stages the guest did not declare are left out
///   (the guest's other stages keep theirs; undeclared-by-config guest
///   stages get the defaults of [`Resolved::budgets_for`]);
/// * if the rest still does not fit (e.g. the maximum budgets cannot use
///   every stage core), the guest is served by `off` (every vCPU floats
///   over all stage cores, stage-blind).
///
/// Returns the policy and one line per adjustment (empty when the
/// configuration fitted as it is), for the VMM's log and report.
pub fn guest_policy(
    resolved: &Resolved,
    num_vcpus: u32,
    guest_stages: &[String],
) -> (Box<dyn Policy>, Vec<String>) {
    let mut warnings = Vec::new();
    let first = match build_policy(resolved, num_vcpus, Some(guest_stages)) {
        Ok(p) => return (p, warnings),
        Err(e) => e,
    };
    let mut kept = resolved.clone();
    kept.budgets.retain(|b| guest_stages.contains(&b.name));
    if kept.budgets.len() < resolved.budgets.len() {
        let left_out: Vec<&str> = resolved
            .budgets
            .iter()
            .filter(|b| !guest_stages.contains(&b.name))
            .map(|b| b.name.as_str())
            .collect();
        warnings.push(format!(
            "{first}: the [[stage]] budgets of {} are left out",
            left_out.join(", ")
        ));
        match build_policy(&kept, num_vcpus, Some(guest_stages)) {
            Ok(p) => return (p, warnings),
            Err(e) => warnings.push(format!("{e}: the guest's stages are served by policy off")),
        }
    } else {
        warnings.push(format!(
            "{first}: the guest's stages are served by policy off"
        ));
    }
    // Default budgets (min 0, max every stage core, weight 1) always fit.
    kept.policy = PolicyKind::Off;
    kept.budgets.clear();
    let budgets = kept.budgets_for(guest_stages).unwrap_or_default();
    let off = policy::build(PolicyKind::Off, kept.context(num_vcpus, budgets));
    (off, warnings)
}

/// Validates a new configuration for a running VM of `num_vcpus` vCPUs
/// whose guest declared `guest_stages` (`None` before REGISTER): resolves
/// `config` against `topo` exactly as a `--stages` file at start, fits it
/// to the VM ([`for_vm`]) and builds (then drops) its policy, so a change
/// the VM could not run is refused before anything is applied.
///
/// Errors: every [`StagesConfigError`] of [`crate::config::resolve`] and of
/// [`build_policy`], each naming key and value.
pub fn replan(
    config: &crate::config::Config,
    topo: &crate::topology::Topology,
    num_vcpus: u32,
    guest_stages: Option<&[String]>,
) -> Result<VmPlan, StagesConfigError> {
    let resolved = crate::config::resolve(config, &Default::default(), topo)?;
    let vm = for_vm(&resolved, num_vcpus);
    build_policy(&vm.resolved, num_vcpus, guest_stages)?;
    Ok(vm)
}

/// A VM's stage configuration as the operator gave it, the host it was
/// resolved against and the result: what the VMM keeps so that a change
/// made while the VM runs ([`replan`]) is resolved exactly as the start-up
/// configuration was.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The `--stages` file (or the embedded default) with the command-line
    /// overrides folded in ([`crate::config::Config::with_overrides`]).
    pub config: crate::config::Config,
    /// The host's CPUs when the VMM started.
    pub topology: crate::topology::Topology,
    /// `config` resolved against `topology`.
    pub resolved: Resolved,
}

impl Setup {
    /// Resolves `config` with the command-line `overrides` against
    /// `topology`. Errors: every [`StagesConfigError`] of
    /// [`crate::config::resolve`], naming the option or key and its value.
    pub fn new(
        config: crate::config::Config,
        overrides: &crate::config::Overrides,
        topology: crate::topology::Topology,
    ) -> Result<Self, StagesConfigError> {
        let resolved = crate::config::resolve(&config, overrides, &topology)?;
        Ok(Self {
            config: config.with_overrides(overrides),
            topology,
            resolved,
        })
    }
}
