//! Resolving a [`Config`] (with the command line's [`Overrides`]) against
//! the host's [`Topology`]: stage and housekeeping cores, the policy, the
//! visit policy, `auto`'s modes and the stages' budgets, each refused with
//! a [`StagesConfigError`] naming key and value.

use super::*;

fn range(key: &str, value: impl std::fmt::Display, expected: &'static str) -> StagesConfigError {
    StagesConfigError::OutOfRange {
        key: key.into(),
        value: value.to_string(),
        expected,
    }
}

fn cpulist(key: &str, text: &str) -> Result<CpuSet, StagesConfigError> {
    CpuSet::parse(text).map_err(|_| StagesConfigError::NotCpuList {
        key: key.into(),
        value: text.into(),
    })
}

/// The command-line value if given, else the file's: `(key, value)`, where
/// `key` names the one that was used (the file's key when neither is set).
fn chosen<'a>(
    cli: (&'static str, Option<&'a str>),
    file: (&'static str, Option<&'a str>),
) -> (&'static str, Option<&'a str>) {
    match cli {
        (key, Some(v)) => (key, Some(v)),
        _ => file,
    }
}

/// Parses the cpulist `text` of `key` and checks every CPU is online.
fn online_cpulist(key: &str, text: &str, topo: &Topology) -> Result<CpuSet, StagesConfigError> {
    let set = cpulist(key, text)?;
    if let Some(cpu) = set.iter().find(|c| !topo.online.contains(*c)) {
        return Err(StagesConfigError::CpuNotOnline {
            key: key.into(),
            value: text.into(),
            cpu,
            online: topo.online.to_string(),
        });
    }
    Ok(set)
}

/// Resolves `config` (with `overrides`) against `topo`. Errors name the key
/// and value: CPUs not online or not allowed, overlap of stage cores and
/// housekeeping, unknown policy, bad budgets, budgets that cannot fit.
pub fn resolve(
    config: &Config,
    overrides: &Overrides,
    topo: &Topology,
) -> Result<Resolved, StagesConfigError> {
    let (cores_key, stage_cores) = resolve_stage_cores(config, overrides, topo)?;
    let (housekeeping, helpers_share_stage_cores) =
        resolve_housekeeping(config, overrides, topo, cores_key, &stage_cores)?;
    let policy = resolve_policy(config, overrides)?;
    let visit = resolve_visit(config, overrides)?;
    let auto_modes = resolve_auto_modes(config)?;
    let budgets = resolve_budgets(config, cores_key, &stage_cores)?;
    if let Some(w) = config.host.cpu_weight {
        if !(1..=MAX_CPU_WEIGHT).contains(&w) {
            return Err(range(
                "host.cpu_weight",
                w,
                "in 1..=10000 (100: an ordinary process)",
            ));
        }
    }
    let p = &config.policy;
    Ok(Resolved {
        stage_cores,
        housekeeping,
        helpers_share_stage_cores,
        budgets,
        policy,
        period: Duration::from_millis(p.period_ms),
        smoothing: p.smoothing,
        hysteresis: p.hysteresis,
        visit,
        latency: crate::policy::LatencyBound {
            max_p99_increase: p.max_p99_increase,
            slo_ns: p
                .latency_slo_us
                .filter(|us| *us > 0.0)
                .map(|us| us * 1000.0),
        },
        cpu_weight: config.host.cpu_weight,
        auto_modes,
        auto_twin: p.auto_twin,
    })
}

/// `policy.auto_modes` as a set (unstaged always in it); every mode when
/// absent. Errors: a name that is not `unstaged`, `temporal`, `spatial` or
/// `both`, named.
fn resolve_auto_modes(config: &Config) -> Result<crate::policy::auto::Modes, StagesConfigError> {
    use crate::policy::auto::{Mode, Modes};
    let Some(names) = &config.policy.auto_modes else {
        return Ok(Modes::ALL);
    };
    let mut modes = vec![Mode::Unstaged];
    for n in names {
        let m = Mode::ALL
            .into_iter()
            .find(|m| m.name() == n)
            .ok_or_else(|| StagesConfigError::UnknownAutoMode { value: n.clone() })?;
        modes.push(m);
    }
    Ok(Modes::of(&modes))
}

/// The stage-visit policy: `--visit`, else `policy.visit`.
fn resolve_visit(config: &Config, overrides: &Overrides) -> Result<VisitPolicy, StagesConfigError> {
    let (key, text) = chosen(
        ("--visit", overrides.visit.as_deref()),
        ("policy.visit", Some(config.policy.visit.as_str())),
    );
    let text = text.unwrap_or_default();
    VisitPolicy::parse(text).ok_or_else(|| StagesConfigError::UnknownVisit {
        key: key.into(),
        value: text.into(),
    })
}

/// The stage cores: `--stage-cores`, else `host.cores`, else the isolated
/// allowed CPUs, else every allowed CPU. Returns the key that chose them.
fn resolve_stage_cores(
    config: &Config,
    overrides: &Overrides,
    topo: &Topology,
) -> Result<(&'static str, CpuSet), StagesConfigError> {
    let (cores_key, cores_text) = chosen(
        ("--stage-cores", overrides.cores.as_deref()),
        ("host.cores", config.host.cores.as_deref()),
    );
    let stage_cores = match cores_text {
        Some(text) => {
            let set = online_cpulist(cores_key, text, topo)?;
            if set.is_empty() {
                return Err(StagesConfigError::NoCpu {
                    key: cores_key.into(),
                    value: text.into(),
                });
            }
            if let Some(cpu) = set.iter().find(|c| !topo.allowed.contains(*c)) {
                return Err(StagesConfigError::CpuNotAllowed {
                    key: cores_key.into(),
                    value: text.into(),
                    cpu,
                    allowed: topo.allowed.to_string(),
                });
            }
            set
        }
        None => {
            let isolated = topo.isolated.intersection(&topo.allowed);
            if isolated.is_empty() {
                topo.allowed.clone()
            } else {
                isolated
            }
        }
    };
    Ok((cores_key, stage_cores))
}

/// The housekeeping cores: `--housekeeping`, else `host.housekeeping`, else
/// the allowed CPUs that are not stage cores; the stage cores themselves
/// when none is left (the flag says so).
fn resolve_housekeeping(
    config: &Config,
    overrides: &Overrides,
    topo: &Topology,
    cores_key: &str,
    stage_cores: &CpuSet,
) -> Result<(CpuSet, bool), StagesConfigError> {
    let (hk_key, hk_text) = chosen(
        ("--housekeeping", overrides.housekeeping.as_deref()),
        ("host.housekeeping", config.host.housekeeping.as_deref()),
    );
    let housekeeping = match hk_text {
        Some(text) => {
            let set = online_cpulist(hk_key, text, topo)?;
            let overlap = set.intersection(stage_cores);
            if !overlap.is_empty() {
                return Err(StagesConfigError::HousekeepingOverlap {
                    key: hk_key.into(),
                    value: text.into(),
                    cores_key: cores_key.into(),
                    cores: stage_cores.to_string(),
                    overlap: overlap.to_string(),
                });
            }
            set
        }
        None => topo.allowed.difference(stage_cores),
    };
    let helpers_share_stage_cores = housekeeping.is_empty();
    let housekeeping = if helpers_share_stage_cores {
        stage_cores.clone()
    } else {
        housekeeping
    };
    Ok((housekeeping, helpers_share_stage_cores))
}

/// The policy (`--policy`, else `policy.name`) and checks of its parameters.
fn resolve_policy(config: &Config, overrides: &Overrides) -> Result<PolicyKind, StagesConfigError> {
    let (policy_key, policy_text) = chosen(
        ("--policy", overrides.policy.as_deref()),
        ("policy.name", Some(config.policy.name.as_str())),
    );
    let policy_text = policy_text.unwrap_or_default();
    let policy =
        PolicyKind::parse(policy_text).ok_or_else(|| StagesConfigError::UnknownPolicy {
            key: policy_key.into(),
            value: policy_text.into(),
        })?;
    let p = &config.policy;
    if p.period_ms == 0 || p.period_ms > 60_000 {
        return Err(range("policy.period_ms", p.period_ms, "1..=60000"));
    }
    if !(p.smoothing > 0.0 && p.smoothing <= 1.0) {
        return Err(range("policy.smoothing", p.smoothing, "in (0, 1]"));
    }
    if !(p.hysteresis >= 0.0 && p.hysteresis.is_finite()) {
        return Err(range("policy.hysteresis", p.hysteresis, "≥ 0"));
    }
    if !(0.0..=MAX_P99_INCREASE).contains(&p.max_p99_increase) {
        return Err(range(
            "policy.max_p99_increase",
            p.max_p99_increase,
            "a fraction in 0..=100 (0.1 = 10 %)",
        ));
    }
    if let Some(us) = p.latency_slo_us {
        if !(0.0..=MAX_LATENCY_SLO_US).contains(&us) {
            return Err(range(
                "policy.latency_slo_us",
                us,
                "µs in 0..=1000000000 (0: none)",
            ));
        }
    }
    Ok(policy)
}

/// The `[[stage]]` budgets, checked one by one and together against the
/// number of stage cores.
fn resolve_budgets(
    config: &Config,
    cores_key: &str,
    stage_cores: &CpuSet,
) -> Result<Vec<Budget>, StagesConfigError> {
    let n = stage_cores.len();
    let mut budgets: Vec<Budget> = Vec::new();
    for (i, s) in config.stages.iter().enumerate() {
        if s.name.is_empty() || s.name.len() > 32 {
            return Err(StagesConfigError::BadStageName {
                index: i,
                name: s.name.clone(),
                reason: "must be 1 to 32 bytes",
            });
        }
        if budgets.iter().any(|b| b.name == s.name) {
            return Err(StagesConfigError::BadStageName {
                index: i,
                name: s.name.clone(),
                reason: "defined twice",
            });
        }
        let max = s.max_cores.unwrap_or(n);
        if s.min_cores > max {
            return Err(StagesConfigError::MinAboveMax {
                name: s.name.clone(),
                min: s.min_cores,
                max,
            });
        }
        if !(0.0..=MAX_WEIGHT).contains(&s.weight) {
            return Err(StagesConfigError::BadWeight {
                name: s.name.clone(),
                weight: s.weight,
            });
        }
        budgets.push(Budget {
            name: s.name.clone(),
            min_cores: s.min_cores,
            max_cores: max.min(n),
            weight: s.weight,
        });
    }
    let min_sum = budgets
        .iter()
        .fold(0usize, |sum, b| sum.saturating_add(b.min_cores));
    if min_sum > n {
        return Err(StagesConfigError::MinCoresTooMany {
            sum: min_sum,
            key: cores_key.into(),
            cores: stage_cores.to_string(),
            n,
        });
    }
    Ok(budgets)
}
