//! Automatic stage discovery by simulation (`stagesim discover`), after seed
//! 004 ("Towards Fully Automatic Staged Computation"): try partitions in the
//! cache simulator and keep the one with the best score.
//!
//! Seed 004 chooses *k* migration points among ~100 candidate functions and
//! simulates each choice. Here the candidates are the migration points the
//! trace already carries — the entry functions of its stages — and a
//! partition is a [`StageGroups`] grouping of those stages: merging two
//! stages removes the migrations between them. The search is greedy
//! agglomerative: start from every stage alone; at each step simulate every
//! merge of two current groups on the same prefix of every thread's stream
//! (so every candidate runs the same instructions) and keep the merge
//! with the best score; repeat down to `min_groups`. That is
//! `k(k−1)/2` replays per step (120 for 9 stages down to 1).
//!
//! It does **not** find new migration points (functions the stage map does
//! not name): that would need function boundaries in the trace.
//!
//! Scores ([`Objective`]), lower is better:
//! * `cpi` (default): busy cycles per instruction from the cycle model,
//!   migrations included: the CPU time a partition costs per instruction,
//!   independent of how well a policy balances the cores.
//! * `l2`: L2 misses (instruction + data) per instruction, seed 004's score.
//! * `tput`: the negated machine throughput (balance included).

use host_sched::config::Budget;
use serde::{Deserialize, Serialize};

use crate::groups::StageGroups;
use crate::sim::{default_budget, simulate, SimConfig, SimResult};
use crate::stream::Trace;

pub mod points;
pub mod split;

/// What the search minimises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// Busy cycles per instruction (migrations included).
    Cpi,
    /// L2 misses (instruction + data) per kilo-instruction.
    L2,
    /// Negated machine throughput.
    Tput,
}

impl Objective {
    /// Parses `cpi`, `l2` or `tput`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "cpi" => Some(Self::Cpi),
            "l2" => Some(Self::L2),
            "tput" => Some(Self::Tput),
            _ => None,
        }
    }

    /// The score of a replay (lower is better).
    pub fn score(self, r: &SimResult) -> f64 {
        let t = &r.total;
        match self {
            Self::Cpi => {
                if t.ipc > 0.0 {
                    1.0 / t.ipc
                } else {
                    f64::INFINITY
                }
            }
            Self::L2 => t.l2i_mpki + t.l2d_mpki,
            Self::Tput => -r.throughput_ipc,
        }
    }
}

/// One step of the search: the best grouping with `k` groups.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Step {
    /// Groups.
    pub k: usize,
    /// The grouping ([`StageGroups::full_spec`]).
    pub spec: String,
    /// Its score (JSON `null` when not finite).
    #[serde(deserialize_with = "crate::report::f64_or_nan")]
    pub score: f64,
    /// Candidates simulated at this step.
    pub candidates: usize,
    /// The replay of the chosen grouping (prefix).
    pub result: SimResult,
}

fn spec_of(names: &[String], parts: &[Vec<usize>]) -> String {
    parts
        .iter()
        .map(|p| {
            let members: Vec<&str> = p.iter().map(|i| names[*i].as_str()).collect();
            format!("{}={}", members.join("+"), members.join(","))
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Replays `trace` grouped by `spec` with the settings of `base` (its
/// `groups` and `budgets` replaced; with `base.load_weights` the budgets
/// weigh the groups by their instruction shares, from `per_stage`:
/// [`crate::analysis::stage_instrs`]).
pub(crate) fn replay_grouping(
    trace: &Trace,
    base: &SimConfig,
    per_stage: &[u64],
    spec: &str,
) -> anyhow::Result<SimResult> {
    let mut c = base.clone();
    let g = StageGroups::parse(spec, &trace.stages)?;
    c.budgets = if base.load_weights {
        Some(
            g.names
                .iter()
                .zip(crate::analysis::load_weights(per_stage, &g))
                .map(|(name, weight)| Budget {
                    weight,
                    ..default_budget(name, base.cores)
                })
                .collect(),
        )
    } else {
        None
    };
    c.groups = Some(g);
    simulate(trace, &c, &mut |_| {})
}

/// Runs the greedy search on `trace` with the replay settings of `base`
/// (its `groups` and `budgets` are ignored; with `base.load_weights` each
/// candidate's budgets weigh its groups by their instruction shares); `progress(step_k, candidate, candidates)` is
/// called before each replay. Returns one [`Step`] per group count, from
/// every stage alone down to `min_groups`.
pub fn discover(
    trace: &Trace,
    base: &SimConfig,
    objective: Objective,
    min_groups: usize,
    progress: &mut dyn FnMut(usize, usize, usize),
) -> anyhow::Result<Vec<Step>> {
    let names: Vec<String> = trace.stages.iter().map(|s| s.name.clone()).collect();
    anyhow::ensure!(!names.is_empty(), "the trace has no stages to group");
    let per_stage = crate::analysis::stage_instrs(trace);
    let run = |parts: &[Vec<usize>]| -> anyhow::Result<(String, SimResult)> {
        let spec = spec_of(&names, parts);
        let r = replay_grouping(trace, base, &per_stage, &spec)?;
        Ok((spec, r))
    };
    let mut parts: Vec<Vec<usize>> = (0..names.len()).map(|i| vec![i]).collect();
    progress(parts.len(), 1, 1);
    let (spec, r) = run(&parts)?;
    let mut steps = vec![Step {
        k: parts.len(),
        score: objective.score(&r),
        spec,
        candidates: 1,
        result: r,
    }];
    while parts.len() > min_groups.max(1) {
        let k = parts.len();
        let pairs: Vec<(usize, usize)> = (0..k)
            .flat_map(|a| (a + 1..k).map(move |b| (a, b)))
            .collect();
        let mut best: Option<(f64, Vec<Vec<usize>>, String, SimResult)> = None;
        for (i, (a, b)) in pairs.iter().enumerate() {
            progress(k - 1, i + 1, pairs.len());
            let mut p = parts.clone();
            let moved = p.remove(*b);
            p[*a].extend(moved);
            p[*a].sort_unstable();
            let (spec, r) = run(&p)?;
            let sc = objective.score(&r);
            // Ties keep the earlier candidate, so the search is deterministic.
            if best.as_ref().is_none_or(|(bs, ..)| sc < *bs) {
                best = Some((sc, p, spec, r));
            }
        }
        let Some((sc, p, spec, r)) = best else { break };
        parts = p;
        steps.push(Step {
            k: parts.len(),
            score: sc,
            spec,
            candidates: pairs.len(),
            result: r,
        });
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_groups_after_their_members() {
        let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        assert_eq!(spec_of(&names, &[vec![0, 2], vec![1]]), "a+c=a,c;b=b");
    }

    #[test]
    fn objectives_parse() {
        assert_eq!(Objective::parse("cpi"), Some(Objective::Cpi));
        assert_eq!(Objective::parse("l2"), Some(Objective::L2));
        assert_eq!(Objective::parse("tput"), Some(Objective::Tput));
        assert_eq!(Objective::parse("x"), None);
    }
}

#[cfg(test)]
mod tests_points;
