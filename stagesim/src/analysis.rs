//! Trace statistics per stage (or per group of a [`StageGroups`]): stage
//! visits and their lengths, code footprints, code shared between stages and
//! stage transitions (`stagesim stats`).
//!
//! A *visit* is a maximal run of one thread's instructions in one group: it
//! starts at a STAGE marker that changes the thread's group (or at the
//! thread's first instruction) and ends at the next such marker (or at the
//! end of the thread's stream). Under a staged policy every visit of a group
//! whose core the thread is not on starts with a migration, so the visit
//! lengths bound the instructions a migration can be amortised over.

use std::collections::HashMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::groups::StageGroups;
use crate::stream::{ev_addr, ev_bytes, ev_instrs, Trace, EV_FETCH, EV_STAGE};

/// Statistics of one group (or of "no stage").
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GroupStats {
    /// Group name (`(none)` for code outside every stage).
    pub name: String,
    /// Instructions executed in the group.
    pub instrs: u64,
    /// Visits (module docs).
    pub visits: u64,
    /// Mean instructions per visit.
    pub mean_visit: f64,
    /// Median visit length (over visits), instructions.
    pub p50_visit: u64,
    /// 90th percentile visit length (over visits), instructions.
    pub p90_visit: u64,
    /// Instruction-weighted median visit length: half of the group's
    /// instructions run in visits at least this long.
    pub weighted_p50_visit: u64,
    /// Distinct instruction cache lines fetched in the group.
    pub code_lines: u64,
}

/// Statistics of a whole trace under one grouping.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TraceStats {
    /// Line size used for footprints, bytes.
    pub line_bytes: u64,
    /// Per group, then `(none)` last.
    pub groups: Vec<GroupStats>,
    /// `shared[a][b]`: instruction lines fetched in both group `a` and group
    /// `b` (diagonal: the group's own footprint); groups then `(none)`.
    pub shared: Vec<Vec<u64>>,
    /// `transitions[a][b]`: group changes from `a` to `b` (groups then
    /// `(none)`), over all threads.
    pub transitions: Vec<Vec<u64>>,
    /// Instructions over all visits (= the trace's).
    pub instrs: u64,
    /// Visits of any group, `(none)` included.
    pub visits: u64,
    /// Distinct instruction lines in the whole trace.
    pub code_lines: u64,
}

/// Instructions per trace stage (dense order), then outside every stage.
pub fn stage_instrs(trace: &Trace) -> Vec<u64> {
    let none = trace.stages.len();
    let mut v = vec![0u64; none + 1];
    for th in &trace.threads {
        let mut g = none;
        for &ev in &th.events {
            match ev >> 62 {
                EV_FETCH => v[g] += ev_instrs(ev),
                EV_STAGE => g = ((ev & 0xffff) as usize).min(none),
                _ => {}
            }
        }
    }
    v
}

/// Static-policy weights proportional to each group's share of the
/// instructions (`per_stage` from [`stage_instrs`]), scaled so they sum to
/// the number of groups; a group without instructions gets a tiny weight.
pub fn load_weights(per_stage: &[u64], groups: &StageGroups) -> Vec<f64> {
    let mut w = vec![0.0f64; groups.len()];
    for (s, n) in per_stage.iter().enumerate().take(groups.map.len()) {
        w[groups.map[s]] += *n as f64;
    }
    let sum: f64 = w.iter().sum();
    let k = groups.len() as f64;
    w.iter()
        .map(|x| {
            if sum > 0.0 {
                (x / sum * k).max(1e-6)
            } else {
                1.0
            }
        })
        .collect()
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Computes [`TraceStats`] of `trace` under `groups` with `line_bytes` lines
/// (a power of two).
pub fn analyze(trace: &Trace, groups: &StageGroups, line_bytes: u64) -> TraceStats {
    let shift = line_bytes.max(1).trailing_zeros();
    let ng = groups.len() + 1; // groups plus "no stage"
    let none = groups.len();
    let lookup = groups.lookup();
    let mut visits: Vec<Vec<u64>> = vec![Vec::new(); ng];
    let mut instrs = vec![0u64; ng];
    let mut transitions = vec![vec![0u64; ng]; ng];
    // Line → bit mask of the groups that fetched it (groups beyond 63 share bit 63).
    let mut lines: HashMap<u64, u64> = HashMap::new();
    for th in &trace.threads {
        let mut g = none;
        let mut cur = 0u64;
        let mut started = false;
        for &ev in &th.events {
            match ev >> 62 {
                EV_FETCH => {
                    let n = ev_instrs(ev);
                    cur += n;
                    instrs[g] += n;
                    started = true;
                    let a = ev_addr(ev);
                    let first = a >> shift;
                    let last = a.wrapping_add(ev_bytes(ev).max(1) - 1) >> shift;
                    let bit = 1u64 << g.min(63);
                    let mut l = first;
                    loop {
                        *lines.entry(l).or_insert(0) |= bit;
                        if l >= last {
                            break;
                        }
                        l += 1;
                    }
                }
                EV_STAGE => {
                    let s = lookup[((ev & 0xffff) as usize).min(lookup.len() - 1)];
                    if s != g {
                        if started && cur > 0 {
                            visits[g].push(cur);
                        }
                        if started {
                            transitions[g][s] += 1;
                        }
                        g = s;
                        cur = 0;
                    }
                }
                _ => {}
            }
        }
        if cur > 0 {
            visits[g].push(cur);
        }
    }
    let mut shared = vec![vec![0u64; ng]; ng];
    for mask in lines.values() {
        let mut m = *mask;
        let mut idx = Vec::with_capacity(4);
        while m != 0 {
            let b = m.trailing_zeros() as usize;
            idx.push(b.min(ng - 1));
            m &= m - 1;
        }
        for &a in &idx {
            for &b in &idx {
                shared[a][b] += 1;
            }
        }
    }
    let mut out = Vec::with_capacity(ng);
    for (gi, mut v) in visits.into_iter().enumerate() {
        v.sort_unstable();
        let total: u64 = v.iter().sum();
        let mut acc = 0u64;
        let mut wp50 = 0u64;
        for &x in &v {
            acc += x;
            if acc * 2 >= total {
                wp50 = x;
                break;
            }
        }
        out.push(GroupStats {
            name: groups
                .names
                .get(gi)
                .cloned()
                .unwrap_or_else(|| "(none)".into()),
            instrs: instrs[gi],
            visits: v.len() as u64,
            mean_visit: if v.is_empty() {
                0.0
            } else {
                total as f64 / v.len() as f64
            },
            p50_visit: percentile(&v, 0.5),
            p90_visit: percentile(&v, 0.9),
            weighted_p50_visit: wp50,
            code_lines: shared[gi][gi],
        });
    }
    TraceStats {
        line_bytes,
        instrs: instrs.iter().sum(),
        visits: out.iter().map(|g| g.visits).sum(),
        code_lines: lines.len() as u64,
        groups: out,
        shared,
        transitions,
    }
}

/// A square table with a row and a column per group (`names`, column
/// width `w`) and `cell(row, column)` in each cell.
fn square_table(o: &mut String, names: &[&str], w: usize, cell: impl Fn(usize, usize) -> String) {
    let _ = write!(o, "{:<14}", "");
    for n in names {
        let _ = write!(o, " {:>w$}", &n[..n.len().min(w)]);
    }
    let _ = writeln!(o);
    for (a, n) in names.iter().enumerate() {
        let _ = write!(o, "{n:<14}");
        for b in 0..names.len() {
            let _ = write!(o, " {:>w$}", cell(a, b));
        }
        let _ = writeln!(o);
    }
}

/// Text rendering of [`TraceStats`].
pub fn render(s: &TraceStats) -> String {
    let mut o = String::new();
    let kib = |l: u64| l as f64 * s.line_bytes as f64 / 1024.0;
    let _ = writeln!(
        o,
        "{} instructions in {} visits: {:.0} instructions per visit on average; code {:.0} KiB ({} B lines)",
        s.instrs,
        s.visits,
        s.instrs as f64 / s.visits.max(1) as f64,
        kib(s.code_lines),
        s.line_bytes
    );
    let _ = writeln!(
        o,
        "{:<14} {:>7} {:>9} {:>9} {:>8} {:>8} {:>11} {:>9}",
        "group", "share%", "visits", "mean", "p50", "p90", "instr-p50", "code KiB"
    );
    for g in &s.groups {
        let _ = writeln!(
            o,
            "{:<14} {:>7.2} {:>9} {:>9.0} {:>8} {:>8} {:>11} {:>9.1}",
            g.name,
            g.instrs as f64 * 100.0 / s.instrs.max(1) as f64,
            g.visits,
            g.mean_visit,
            g.p50_visit,
            g.p90_visit,
            g.weighted_p50_visit,
            kib(g.code_lines)
        );
    }
    let names: Vec<&str> = s.groups.iter().map(|g| g.name.as_str()).collect();
    let w = names
        .iter()
        .map(|n| n.len())
        .max()
        .unwrap_or(4)
        .clamp(6, 10);
    let _ = writeln!(
        o,
        "code shared between groups, KiB (diagonal: own footprint):"
    );
    square_table(&mut o, &names, w, |a, b| {
        format!("{:.1}", kib(s.shared[a][b]))
    });
    let _ = writeln!(o, "group changes (row: from, column: to):");
    square_table(&mut o, &names, w, |a, b| s.transitions[a][b].to_string());
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{pack_fetch, pack_stage, StageInfo, ThreadStream};

    fn trace() -> Trace {
        // Stages a (0), b (1); "no stage" = 2.
        let ev = vec![
            pack_stage(0),
            pack_fetch(0x1000, 64, 10), // a: line 0x40
            pack_stage(1),
            pack_fetch(0x2000, 128, 20), // b: lines 0x80, 0x81
            pack_stage(0),
            pack_fetch(0x1000, 64, 5), // a again
            pack_stage(2),
            pack_fetch(0x2040, 4, 1), // none: line 0x81 (shared with b)
        ];
        Trace {
            threads: vec![ThreadStream {
                tid: 1,
                instrs: 36,
                events: ev,
            }],
            stages: vec![
                StageInfo {
                    id: 0,
                    name: "a".into(),
                },
                StageInfo {
                    id: 1,
                    name: "b".into(),
                },
            ],
            instrs: 36,
            ..Default::default()
        }
    }

    #[test]
    fn visits_footprints_and_transitions() {
        let t = trace();
        let s = analyze(&t, &StageGroups::identity(&t.stages), 64);
        assert_eq!(s.instrs, 36);
        let a = &s.groups[0];
        assert_eq!((a.instrs, a.visits, a.code_lines), (15, 2, 1));
        assert_eq!((a.p50_visit, a.p90_visit), (10, 10));
        assert_eq!(a.mean_visit, 7.5);
        assert_eq!(a.weighted_p50_visit, 10);
        let b = &s.groups[1];
        assert_eq!((b.instrs, b.visits, b.code_lines), (20, 1, 2));
        assert_eq!(s.groups[2].name, "(none)");
        assert_eq!((s.groups[2].instrs, s.groups[2].visits), (1, 1));
        assert_eq!(s.shared[1][2], 1, "line 0x81 is fetched by b and outside");
        assert_eq!(s.shared[0][1], 0);
        assert_eq!(s.code_lines, 3);
        assert_eq!(s.transitions[0][1], 1);
        assert_eq!(s.transitions[1][0], 1);
        assert_eq!(s.transitions[0][2], 1);
        assert_eq!(s.visits, 4);
        assert!(render(&s).contains("group changes"));
    }

    #[test]
    fn load_weights_follow_instruction_shares() {
        let t = trace();
        assert_eq!(stage_instrs(&t), [15, 20, 1]);
        let w = load_weights(&stage_instrs(&t), &StageGroups::identity(&t.stages));
        assert!((w[0] - 2.0 * 15.0 / 35.0).abs() < 1e-12);
        assert!((w[1] - 2.0 * 20.0 / 35.0).abs() < 1e-12);
        let g = StageGroups::parse("ab=a,b", &t.stages).unwrap();
        assert_eq!(load_weights(&stage_instrs(&t), &g), [1.0]);
    }

    #[test]
    fn grouping_merges_visits() {
        let t = trace();
        let g = StageGroups::parse("ab=a,b", &t.stages).unwrap();
        let s = analyze(&t, &g, 64);
        // a → b → a is one visit of "ab" of 35 instructions.
        assert_eq!(s.groups[0].visits, 1);
        assert_eq!(s.groups[0].instrs, 35);
        assert_eq!(s.groups[0].code_lines, 3);
        assert_eq!(s.transitions[0][1], 1);
        assert_eq!(s.transitions[0][0], 0);
    }
}
