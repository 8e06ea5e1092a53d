//! Seed 004's request-level stage discovery (`stagesim discover
//! --binary`): choose N = 2…4 migration points among the functions a request
//! calls at most once ([`super::points::census`]), each point starting a
//! stage on its own cores, scored by simulated cycles with the migration
//! costs (not by misses alone).
//!
//! Seed 004 simulates every choice among ~100 candidates. Here the search
//! is in two steps, both by full replays of the same prefix of every
//! thread's stream:
//! 1. **screening** (when there are more than `keep` candidates, on a
//!    shorter prefix): candidates *c* after the first (by position in the
//!    request), one per 1 % of the request, are scored as the 2-stage
//!    choice {first, *c*}; the first and the `keep − 1` best, each at least
//!    one stage's least share away from the others, stay;
//! 2. **exhaustive**: every choice of N of the kept candidates whose stages
//!    each hold at least [`Limits::min_stage`] of a request, for each N.
//!
//! A choice is replayed on the trace re-marked at exactly its points
//! ([`super::points::relabel`]): a thread is in the stage of the last point
//! it passed (seed 004: "whenever the first instruction of one of these
//! functions is executed, switch to the corresponding core"); the request
//! start (the request-marker stage, where threads wait for their client)
//! joins the last stage, which the thread is in when a request ends.

use std::ops::RangeInclusive;

use serde::Serialize;

use super::points::{marker_grouping, prefix, relabel, Census};
use super::{replay_grouping, Objective};
use crate::groups::StageGroups;
use crate::sim::{SimConfig, SimResult};
use crate::stagemap::{MapStage, StageMapFile};
use crate::stream::{Trace, EV_STAGE};

/// The best choice of points for one N.
#[derive(Clone, Debug, Serialize)]
pub struct Choice {
    /// Stages (points).
    pub parts: usize,
    /// The chosen candidates ([`Census::candidates`] indices, in request order).
    pub points: Vec<usize>,
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

impl Outcome {
    /// The stage-map file of `choice`: stage *j* starts at its point's
    /// function; the request (`request_symbols`, the functions of the
    /// request-marker stage) joins the last stage. `binary` names the
    /// binary.
    pub fn map_file(
        &self,
        choice: &Choice,
        binary: Option<String>,
        request_symbols: Vec<String>,
    ) -> StageMapFile {
        let stages: Vec<MapStage> = stage_names(choice.parts)
            .into_iter()
            .zip(&choice.points)
            .map(|(name, &i)| MapStage {
                name,
                symbols: vec![self.census.candidates[i].name.clone()],
            })
            .collect();
        let last = stages.len() - 1;
        // A request function chosen as a point starts its own stage.
        let request_symbols: Vec<String> = request_symbols
            .into_iter()
            .filter(|s| !stages.iter().any(|st| st.symbols.contains(s)))
            .collect();
        let request = (!request_symbols.is_empty()).then_some((last, request_symbols));
        StageMapFile {
            binary,
            stages,
            request,
        }
    }
}

/// The search's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The census it started from.
    pub census: Census,
    /// Screening scores: (candidate, score of {first, candidate}) on the
    /// screening prefix.
    pub screened: Vec<(usize, f64)>,
    /// The candidates the exhaustive step chose among.
    pub kept: Vec<usize>,
    /// The best choice per N, in increasing N.
    pub choices: Vec<Choice>,
    /// Stage changes per request under the trace's own stage map.
    pub own_visits_per_request: f64,
}

impl Outcome {
    /// The choice with the best score (the first of equals).
    pub fn best(&self) -> Option<&Choice> {
        self.choices
            .iter()
            .reduce(|a, b| if b.score < a.score { b } else { a })
    }
}

/// Stage names of a choice of `n` points.
fn stage_names(n: usize) -> Vec<String> {
    (0..n).map(|j| format!("s{j}")).collect()
}

/// What the search works on: the candidates' entry addresses, the
/// request-marker stage, and the replay settings.
struct Scorer<'a> {
    census: &'a Census,
    marker: usize,
    marker_name: String,
    base: &'a SimConfig,
    objective: Objective,
}

impl Scorer<'_> {
    /// `trace` re-marked at the candidates `pts`, and its grouping.
    fn remark(&self, trace: &Trace, pts: &[usize]) -> (Trace, String) {
        let names = stage_names(pts.len());
        let points: Vec<Vec<u64>> = pts
            .iter()
            .map(|&i| vec![self.census.candidates[i].addr])
            .collect();
        let t = relabel(trace, &points, &names, self.marker);
        let spec = marker_grouping(&names, pts.len() - 1, &self.marker_name);
        (t, spec)
    }

    /// Replays the choice `pts` on `trace` (a prefix): its score and result.
    fn score(&self, trace: &Trace, pts: &[usize]) -> anyhow::Result<(f64, SimResult)> {
        let (t, spec) = self.remark(trace, pts);
        let per_stage = crate::analysis::stage_instrs(&t);
        let r = replay_grouping(&t, self.base, &per_stage, &spec)?;
        Ok((self.objective.score(&r), r))
    }
}

/// Stage changes over every thread of `trace` under `groups`: entries into
/// a stage other than the thread's last one (time in no stage in between
/// does not count: the thread is still where its last stage ran).
fn visits(trace: &Trace, groups: &StageGroups) -> u64 {
    let lookup = groups.lookup();
    let none = groups.len();
    let mut n = 0u64;
    for th in &trace.threads {
        let mut last = none;
        for &ev in &th.events {
            if ev >> 62 == EV_STAGE {
                let g = lookup[((ev & 0xffff) as usize).min(lookup.len() - 1)];
                if g != none && g != last {
                    n += 1;
                    last = g;
                }
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

/// How far the search goes.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Candidates kept after screening (seed 004 kept all ~100; every
    /// choice of N among K costs C(K, N) replays).
    pub keep: usize,
    /// The stage counts N to find the best choice for.
    pub parts: RangeInclusive<usize>,
    /// Least share of a request's instructions every stage must hold, by
    /// the points' mean positions (0–1; ours, not the seed's: a stage with
    /// 3 % of the work on its own cores is unstaged in all but name, and
    /// the cheapest choice at a high migration cost).
    pub min_stage: f64,
    /// Part of every thread's events the screening replays (0–1; the
    /// exhaustive step replays `SimConfig::thread_prefix`).
    pub screen_prefix: f64,
}

impl Limits {
    /// Whether every stage of the choice `pts` (sorted) holds at least
    /// `min_stage` of a request, the last one wrapping around its start.
    fn balanced(&self, c: &Census, pts: &[usize]) -> bool {
        let off = |i: usize| c.candidates[pts[i]].offset;
        let n = pts.len();
        (0..n).all(|j| {
            let len = if j + 1 < n {
                off(j + 1) - off(j)
            } else {
                1.0 - off(j) + off(0)
            };
            len >= self.min_stage
        })
    }
}

/// Runs the search on `trace` (request marker `marker`, a dense stage
/// index) over `census`'s candidates, with the replay settings of `base`
/// (its `thread_prefix` is the part of every thread replayed); returns the
/// best choice for every N of `limits`. `progress(what, i, n)` is called before each replay.
///
/// Errors: fewer candidates than the smallest N; a replay's error.
pub fn search(
    trace: &Trace,
    marker: usize,
    census: Census,
    base: &SimConfig,
    objective: Objective,
    limits: &Limits,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> anyhow::Result<Outcome> {
    let (keep, parts) = (limits.keep, limits.parts.clone());
    let m = census.candidates.len();
    anyhow::ensure!(
        m >= (*parts.start()).max(2),
        "{m} candidate function(s): too few for {} stages",
        parts.start()
    );
    // Every choice replays the same prefix, cut once.
    let pre = prefix(trace, base.thread_prefix.unwrap_or(1.0));
    let mut whole = base.clone();
    whole.thread_prefix = None;
    let sc = Scorer {
        census: &census,
        marker,
        marker_name: trace.stages[marker].name.clone(),
        base: &whole,
        objective,
    };

    // Screening: {first, c} for every c that leaves both stages their
    // share, one per 1 % of the request (neighbours are alike).
    let mut screened = Vec::new();
    let kept: Vec<usize> = if m > keep {
        let short = prefix(trace, limits.screen_prefix);
        let mut todo = Vec::new();
        let mut last = f64::NEG_INFINITY;
        for c in 1..m {
            let o = census.candidates[c].offset;
            if limits.balanced(&census, &[0, c]) && o - last >= 0.01 {
                todo.push(c);
                last = o;
            }
        }
        for (i, &c) in todo.iter().enumerate() {
            progress("screening", i + 1, todo.len());
            screened.push((c, sc.score(&short, &[0, c])?.0));
        }
        let mut best = screened.clone();
        best.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        // The best, each at least one stage's share away from those kept.
        let mut k = vec![0];
        for &(c, _) in &best {
            if k.len() == keep {
                break;
            }
            let o = census.candidates[c].offset;
            if k.iter()
                .all(|&x| (census.candidates[x].offset - o).abs() >= limits.min_stage)
            {
                k.push(c);
            }
        }
        k.sort_unstable();
        k
    } else {
        (0..m).collect()
    };

    let mut choices = Vec::new();
    for n in parts {
        let all: Vec<Vec<usize>> = combinations(&kept, n)
            .into_iter()
            .filter(|pts| limits.balanced(&census, pts))
            .collect();
        let mut best: Option<(Vec<usize>, f64, SimResult)> = None;
        for (i, pts) in all.iter().enumerate() {
            progress(&format!("{n} stages"), i + 1, all.len());
            let (s, r) = sc.score(&pre, pts)?;
            // Ties keep the earlier choice, so the search is deterministic.
            if best.as_ref().is_none_or(|b| s < b.1) {
                best = Some((pts.clone(), s, r));
            }
        }
        let Some((pts, s, r)) = best else {
            continue;
        };
        let (full, spec) = sc.remark(trace, &pts);
        let g = StageGroups::parse(&spec, &full.stages)?;
        let v = visits(&full, &g) as f64 / census.requests as f64;
        choices.push(Choice {
            parts: n,
            points: pts,
            score: s,
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
    let own = visits(trace, &StageGroups::identity(&trace.stages)) as f64;
    Ok(Outcome {
        own_visits_per_request: own / census.requests as f64,
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
    fn the_request_start_joins_the_last_stage() {
        assert_eq!(
            marker_grouping(&stage_names(3), 2, "net_read"),
            "s0=s0;s1=s1;s2=s2,net_read"
        );
    }
}
