//! Request-level migration points (seed 004 §3.1): which functions a
//! request calls ([`census`]), and a trace re-marked so that a thread changes
//! stage where it enters one of chosen functions ([`relabel`]).
//!
//! A *request* is one thread's events from an entry into the trace's
//! request-marker stage (MariaDB's `net_read`: the connection thread reads
//! its next command, as `replay --block-at` uses it) *from no stage* to the
//! next such entry; the events before a thread's first one and after its
//! last are in no request. (MariaDB's `do_command` is a `net_read` function
//! that calls `dispatch_command`: the thread re-enters `net_read` from
//! `dispatch` when the command is done, returns to no stage, then enters
//! `net_read` from no stage for the next command. Only the last is a new
//! request.) A *call* is a FETCH event that starts at a function's entry
//! ([`Symbols`]).

use std::collections::HashMap;

use serde::Serialize;

use crate::stream::{ev_addr, ev_instrs, pack_stage, StageInfo, ThreadStream, Trace};
use crate::stream::{EV_FETCH, EV_STAGE};
use crate::symbols::Symbols;

/// A function that qualifies as a migration point.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// Symbol name (mangled).
    pub name: String,
    /// Entry address in the trace.
    pub addr: u64,
    /// Share of requests that call it (0–1).
    pub present: f64,
    /// Share of requests that call it more than once (0–1).
    pub repeated: f64,
    /// Mean position of its first call in a request, as a fraction of the
    /// request's instructions (0 = its start).
    pub offset: f64,
}

/// What [`census`] found.
#[derive(Clone, Debug, Serialize)]
pub struct Census {
    /// Complete requests seen.
    pub requests: u64,
    /// Mean instructions per request.
    pub request_instrs: f64,
    /// Distinct functions called in some request.
    pub functions: usize,
    /// The candidates, by increasing [`Candidate::offset`].
    pub candidates: Vec<Candidate>,
}

/// Per-function tallies over requests.
#[derive(Clone, Copy, Default)]
struct Tally {
    present: u64,
    repeated: u64,
    offset_sum: f64,
}

/// Counts, per function of `syms`, in how many requests (`marker`: the
/// dense index of the request-marker stage) it is called, how often more
/// than once, and where; keeps the functions called in at least
/// `min_present` of the requests (seed 004: 0.8) and more than once in at
/// most `max_repeated` of them (seed 004: "at most once per request", 0).
///
/// Errors: the trace has no complete request (no two markers in a thread).
pub fn census(
    trace: &Trace,
    syms: &Symbols,
    marker: usize,
    min_present: f64,
    max_repeated: f64,
) -> anyhow::Result<Census> {
    let mut tally: HashMap<u32, Tally> = HashMap::new();
    let mut requests = 0u64;
    let mut instrs_sum = 0u64;
    // Calls of the current request: symbol → (calls, first call's offset).
    let mut calls: HashMap<u32, (u32, u64)> = HashMap::new();
    let none = trace.no_stage();
    for th in &trace.threads {
        let mut cur = none;
        let mut in_req = false;
        let mut pos = 0u64;
        calls.clear();
        for &ev in &th.events {
            match ev >> 62 {
                EV_STAGE => {
                    let s = (ev & 0xffff) as usize;
                    if s == marker && cur == none {
                        if in_req && pos > 0 {
                            requests += 1;
                            instrs_sum += pos;
                            for (&f, &(n, off)) in &calls {
                                let t = tally.entry(f).or_default();
                                t.present += 1;
                                t.repeated += u64::from(n > 1);
                                t.offset_sum += off as f64 / pos as f64;
                            }
                        }
                        calls.clear();
                        in_req = true;
                        pos = 0;
                    }
                    cur = s;
                }
                EV_FETCH if in_req => {
                    if let Some(f) = syms.at(ev_addr(ev)) {
                        calls.entry(f).or_insert((0, pos)).0 += 1;
                    }
                    pos += ev_instrs(ev);
                }
                _ => {}
            }
        }
    }
    anyhow::ensure!(
        requests > 0,
        "no complete request: no thread enters the request-marker stage twice"
    );
    let r = requests as f64;
    let functions = tally.len();
    let mut candidates: Vec<Candidate> = tally
        .into_iter()
        .filter(|(_, t)| {
            t.present as f64 >= min_present * r && t.repeated as f64 <= max_repeated * r
        })
        .map(|(f, t)| Candidate {
            name: syms.name(f).to_string(),
            addr: syms.addr_of_index(f),
            present: t.present as f64 / r,
            repeated: t.repeated as f64 / r,
            offset: t.offset_sum / t.present as f64,
        })
        .collect();
    candidates.sort_by(|a, b| a.offset.total_cmp(&b.offset).then(a.name.cmp(&b.name)));
    Ok(Census {
        requests,
        request_instrs: instrs_sum as f64 / r,
        functions,
        candidates,
    })
}

/// `trace` re-marked by function entries: new stage `i` (named `names[i]`)
/// starts where a thread enters any function of `points[i]` (entry
/// addresses), and the request-marker stage (`marker`, dense index in
/// `trace`) stays a stage of its own, last (index `points.len()`, its
/// name), so a replay can still block at it and a grouping can merge it.
/// Every other marker of `trace` is dropped, except entries into "no
/// stage", which stay. A thread is in no stage until its first point or
/// marker. The captured schedule is carried over.
pub fn relabel(trace: &Trace, points: &[Vec<u64>], names: &[String], marker: usize) -> Trace {
    debug_assert_eq!(points.len(), names.len());
    let at: HashMap<u64, usize> = points
        .iter()
        .enumerate()
        .flat_map(|(i, addrs)| addrs.iter().map(move |&a| (a, i)))
        .collect();
    let new_marker = points.len();
    let new_none = points.len() + 1;
    let old_none = trace.no_stage();
    let mut stages: Vec<StageInfo> = names
        .iter()
        .enumerate()
        .map(|(i, n)| StageInfo {
            id: i as u16,
            name: n.clone(),
        })
        .collect();
    stages.push(StageInfo {
        id: new_marker as u16,
        name: trace.stages[marker].name.clone(),
    });
    // The schedule's segment ends, per thread, in order, to translate.
    let mut ends: Vec<Vec<usize>> = vec![Vec::new(); trace.threads.len()];
    for &(t, end) in &trace.schedule {
        ends[t as usize].push(end);
    }
    let mut new_ends: Vec<Vec<usize>> = vec![Vec::new(); trace.threads.len()];
    let threads = trace
        .threads
        .iter()
        .enumerate()
        .map(|(ti, th)| {
            let mut out = Vec::with_capacity(th.events.len() + th.events.len() / 64);
            let mut cur = new_none;
            let mut want = ends[ti].iter().peekable();
            let set = |out: &mut Vec<u64>, cur: &mut usize, s: usize| {
                if *cur != s {
                    out.push(pack_stage(s as u16));
                    *cur = s;
                }
            };
            for (i, &ev) in th.events.iter().enumerate() {
                while want.peek().is_some_and(|&&e| e == i) {
                    new_ends[ti].push(out.len());
                    want.next();
                }
                match ev >> 62 {
                    EV_STAGE => match (ev & 0xffff) as usize {
                        s if s == marker => set(&mut out, &mut cur, new_marker),
                        s if s == old_none => set(&mut out, &mut cur, new_none),
                        _ => {}
                    },
                    EV_FETCH => {
                        if let Some(&p) = at.get(&ev_addr(ev)) {
                            set(&mut out, &mut cur, p);
                        }
                        out.push(ev);
                    }
                    _ => out.push(ev),
                }
            }
            for _ in want {
                new_ends[ti].push(out.len());
            }
            ThreadStream {
                tid: th.tid,
                events: out,
                instrs: th.instrs,
            }
        })
        .collect();
    let mut next = vec![0usize; trace.threads.len()];
    let schedule = trace
        .schedule
        .iter()
        .map(|&(t, _)| {
            let e = new_ends[t as usize][next[t as usize]];
            next[t as usize] += 1;
            (t, e)
        })
        .collect();
    Trace {
        threads,
        stages,
        instrs: trace.instrs,
        schedule,
        records: trace.records,
        raw_bytes: trace.raw_bytes,
    }
}

/// The first `frac` (0–1] of every thread's events (as `SimConfig::thread_prefix`
/// cuts them), without the captured schedule.
pub fn prefix(trace: &Trace, frac: f64) -> Trace {
    let threads: Vec<ThreadStream> = trace
        .threads
        .iter()
        .map(|th| {
            let end =
                ((th.events.len() as f64 * frac.clamp(0.0, 1.0)) as usize).min(th.events.len());
            let events = th.events[..end].to_vec();
            let instrs = events
                .iter()
                .filter(|e| *e >> 62 == EV_FETCH)
                .map(|e| ev_instrs(*e))
                .sum();
            ThreadStream {
                tid: th.tid,
                events,
                instrs,
            }
        })
        .collect();
    Trace {
        instrs: threads.iter().map(|t| t.instrs).sum(),
        threads,
        stages: trace.stages.clone(),
        schedule: Vec::new(),
        records: trace.records,
        raw_bytes: trace.raw_bytes,
    }
}

/// The grouping that merges the request-marker stage (last, named `marker`)
/// of a [`relabel`]ed trace into stage `joins` of `names`.
pub fn marker_grouping(names: &[String], joins: usize, marker: &str) -> String {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            if i == joins {
                format!("{n}={n},{marker}")
            } else {
                format!("{n}={n}")
            }
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// `trace` re-marked by a stage-map file ([`relabel`] at the entries of
/// each stage's symbols, resolved in `syms`) and the grouping that merges the
/// request-marker stage (`marker`) into the file's request stage (the last
/// stage when it names none).
///
/// Errors: a symbol of the file that `syms` lacks; a stage named like the
/// marker stage.
pub fn apply_map(
    trace: &Trace,
    map: &crate::stagemap::StageMapFile,
    syms: &Symbols,
    marker: usize,
) -> anyhow::Result<(Trace, String)> {
    let marker_name = &trace.stages[marker].name;
    let mut points = Vec::new();
    let mut names = Vec::new();
    for st in &map.stages {
        anyhow::ensure!(
            &st.name != marker_name,
            "stage '{}' has the name of the request-marker stage",
            st.name
        );
        let addrs = st
            .symbols
            .iter()
            .map(|s| {
                syms.addr_of(s).ok_or_else(|| {
                    anyhow::anyhow!("stage '{}': symbol {s} is not in the binary", st.name)
                })
            })
            .collect::<anyhow::Result<Vec<u64>>>()?;
        points.push(addrs);
        names.push(st.name.clone());
    }
    let joins = map.request.as_ref().map_or(names.len() - 1, |(i, _)| *i);
    let t = relabel(trace, &points, &names, marker);
    Ok((t, marker_grouping(&names, joins, marker_name)))
}
