//! Seed 004's request-level stage discovery (`stagesim discover
//! --binary`): choose N = 2…4 migration points among the functions a request
//! calls at most once ([`super::points::census`]), each point starting a
//! stage on its own cores, scored by simulated cycles with the migration
//! costs (not by misses alone).
//!
//! Seed 004 simulates every choice among ~100 candidates. Here the search
//! is in two steps, both by full replays of the same prefix of every
//! thread's stream:
//! 1. **screening**: every candidate *c* after the first (by position in
//!    the request) is scored as the 2-way split {first, *c*}; the first and
//!    the `keep − 1` best stay;
//! 2. **exhaustive**: every choice of N of the kept candidates, for each N.
//!
//! A thread is in the stage of the last point it passed, across requests
//! (seed 004: "whenever the first instruction of one of these functions is
//! executed, switch to the corresponding core"). The replay sees this as a
//! grouping of the trace re-marked at every candidate
//! ([`super::points::relabel`]): ordered by position, candidates
//! `[p_j, p_{j+1})` form stage *j*, and the last stage wraps around the
//! request start (the request-marker stage, where threads wait for their
//! client) up to the first point. A candidate called out of its usual order
//! takes its thread to the stage it belongs to, as the uprobe on it would.

use std::ops::RangeInclusive;

use serde::Serialize;

use super::points::{relabel, Census};
use super::{replay_grouping, Objective};
use crate::groups::StageGroups;
use crate::sim::{SimConfig, SimResult};
use crate::stream::{Trace, EV_STAGE};

/// The best choice of points for one N.
#[derive(Clone, Debug, Serialize)]
pub struct Choice {
    /// Stages (points).
    pub parts: usize,
    /// The chosen candidates ([`Census::candidates`] indices, in request order).
    pub points: Vec<usize>,
    /// The grouping of the re-marked trace it was replayed as.
    pub spec: String,
    /// Its score ([`Objective`]; lower is better).
    pub score: f64,
    /// Stage changes per request (every thread, the whole trace).
    pub visits_per_request: f64,
    /// Mean instructions per stage visit.
    pub mean_visit: f64,
    /// Choices replayed for this N.
    pub tried: usize,
    /// The replay of the chosen points (prefix).
    pub result: SimResult,
}

/// The search's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The census it started from.
    pub census: Census,
    /// Screening scores: (candidate, score of {first, candidate}).
    pub screened: Vec<(usize, f64)>,
    /// The candidates the exhaustive step chose among.
    pub kept: Vec<usize>,
    /// The best choice per N, in increasing N.
    pub choices: Vec<Choice>,
}

/// Stage name of candidate `i` in the re-marked trace.
fn cand(i: usize) -> String {
    format!("c{i}")
}

/// The grouping of the re-marked trace (`m` candidates, then the marker
/// stage named `marker`) for the chosen sorted candidate indices `pts`.
pub(crate) fn spec_for(pts: &[usize], m: usize, marker: &str) -> String {
    let mut groups = Vec::new();
    for (j, &p) in pts.iter().enumerate() {
        let mut members: Vec<String> = if j + 1 < pts.len() {
            (p..pts[j + 1]).map(cand).collect()
        } else {
            let mut v: Vec<String> = (p..m).map(cand).collect();
            v.push(marker.to_string());
            v.extend((0..pts[0]).map(cand));
            v
        };
        members.dedup();
        groups.push(format!("s{j}={}", members.join(",")));
    }
    groups.join(";")
}

/// Stage changes (between stages, not to or from "no stage") over every
/// thread of `trace` under `groups`.
fn visits(trace: &Trace, groups: &StageGroups) -> u64 {
    let lookup = groups.lookup();
    let none = groups.len();
    let mut n = 0u64;
    for th in &trace.threads {
        let mut cur = none;
        for &ev in &th.events {
            if ev >> 62 == EV_STAGE {
                let g = lookup[((ev & 0xffff) as usize).min(lookup.len() - 1)];
                if g != cur && g != none {
                    n += 1;
                }
                cur = g;
            }
        }
    }
    n
}

/// All `k`-element subsets of `items`, in lexicographic order.
fn combinations(items: &[usize], k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    if k == 0 || k > items.len() {
        return out;
    }
    let mut idx: Vec<usize> = (0..k).collect();
    loop {
        out.push(idx.iter().map(|&i| items[i]).collect());
        let Some(i) = (0..k).rev().find(|&i| idx[i] < items.len() - k + i) else {
            return out;
        };
        idx[i] += 1;
        for j in i + 1..k {
            idx[j] = idx[j - 1] + 1;
        }
    }
}

/// Runs the search on `trace` (request marker `marker`, a dense stage
/// index) over `census`'s candidates, with the replay settings of `base`;
/// keeps `keep` candidates after screening and returns the best choice for
/// every N in `parts`. `progress(what, i, n)` is called before each replay.
///
/// Errors: fewer candidates than the smallest N; a replay's error.
pub fn search(
    trace: &Trace,
    marker: usize,
    census: Census,
    base: &SimConfig,
    objective: Objective,
    keep: usize,
    parts: RangeInclusive<usize>,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> anyhow::Result<Outcome> {
    let m = census.candidates.len();
    anyhow::ensure!(
        m >= (*parts.start()).max(2),
        "{m} candidate function(s): too few for {} stages",
        parts.start()
    );
    let names: Vec<String> = (0..m).map(cand).collect();
    let points: Vec<Vec<u64>> = census.candidates.iter().map(|c| vec![c.addr]).collect();
    let kt = relabel(trace, &points, &names, marker);
    let marker_name = trace.stages[marker].name.clone();
    let per_stage = crate::analysis::stage_instrs(&kt);
    let score = |pts: &[usize]| -> anyhow::Result<(String, f64, SimResult)> {
        let spec = spec_for(pts, m, &marker_name);
        let r = replay_grouping(&kt, base, &per_stage, &spec)?;
        Ok((spec, objective.score(&r), r))
    };

    let mut screened = Vec::new();
    let kept: Vec<usize> = if m > keep {
        for c in 1..m {
            progress("screening", c, m - 1);
            screened.push((c, score(&[0, c])?.1));
        }
        let mut best = screened.clone();
        best.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let mut k: Vec<usize> = std::iter::once(0)
            .chain(best.iter().take(keep.saturating_sub(1)).map(|x| x.0))
            .collect();
        k.sort_unstable();
        k
    } else {
        (0..m).collect()
    };

    let mut choices = Vec::new();
    for n in parts {
        let all = combinations(&kept, n);
        let mut best: Option<(Vec<usize>, String, f64, SimResult)> = None;
        for (i, pts) in all.iter().enumerate() {
            progress(&format!("{n} stages"), i + 1, all.len());
            let (spec, sc, r) = score(pts)?;
            // Ties keep the earlier choice, so the search is deterministic.
            if best.as_ref().is_none_or(|b| sc < b.2) {
                best = Some((pts.clone(), spec, sc, r));
            }
        }
        let Some((pts, spec, sc, r)) = best else {
            continue;
        };
        let g = StageGroups::parse(&spec, &kt.stages)?;
        let v = visits(&kt, &g) as f64 / census.requests as f64;
        choices.push(Choice {
            parts: n,
            points: pts,
            spec,
            score: sc,
            visits_per_request: v,
            mean_visit: if v > 0.0 {
                census.request_instrs / v
            } else {
                0.0
            },
            tried: all.len(),
            result: r,
        });
    }
    Ok(Outcome {
        census,
        screened,
        kept,
        choices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_are_every_subset_once_in_order() {
        assert_eq!(
            combinations(&[1, 3, 5, 7], 2),
            vec![
                vec![1, 3],
                vec![1, 5],
                vec![1, 7],
                vec![3, 5],
                vec![3, 7],
                vec![5, 7]
            ]
        );
        assert_eq!(combinations(&[1, 2, 3], 3), vec![vec![1, 2, 3]]);
        assert!(combinations(&[1, 2], 3).is_empty());
        assert_eq!(combinations(&(0..10).collect::<Vec<_>>(), 4).len(), 210);
    }

    #[test]
    fn the_last_stage_wraps_around_the_request_start() {
        assert_eq!(
            spec_for(&[1, 3], 5, "net_read"),
            "s0=c1,c2;s1=c3,c4,net_read,c0"
        );
        assert_eq!(spec_for(&[0, 4], 5, "m"), "s0=c0,c1,c2,c3;s1=c4,m");
    }
}
