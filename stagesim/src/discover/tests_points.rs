//! Request-level discovery on a synthetic trace with a planted best split.

use super::points::{apply_map, census, relabel};
use super::split::{search, Limits};
use super::Objective;
use crate::cache::{Geometry, Hierarchy};
use crate::sim::{SimConfig, SimPolicy};
use crate::stream::{pack_fetch, pack_stage, StageInfo, ThreadStream, Trace};
use crate::symbols::Symbols;

const A: u64 = 0x10_0000;
const B: u64 = 0x20_0000;
const C: u64 = 0x30_0000;
const NET: u64 = 0x50_0000;
const TWICE: u64 = 0x60_0000;
const RARE: u64 = 0x70_0000;
/// Code per region: 6 KiB, which fits the 8 KiB L2 below; two do not.
const REGION: u64 = 6 * 1024;

fn symbols() -> Symbols {
    Symbols::from_pairs([
        (A, "fA"),
        (A + REGION / 2, "fA_mid"),
        (B, "fB"),
        (B + REGION / 2, "fB_mid"),
        (C, "fC"),
        (TWICE, "f_twice"),
        (RARE, "f_rare"),
        (NET, "do_command"),
    ])
}

/// Straight-line code `[at, at + bytes)` as 16-byte, 4-instruction blocks.
fn code(ev: &mut Vec<u64>, at: u64, bytes: u64) -> u64 {
    for b in (0..bytes).step_by(16) {
        ev.push(pack_fetch(at + b, 16, 4));
    }
    bytes / 16 * 4
}

/// `threads` connection threads, `requests` each: from no stage into the marker stage
/// (`net_read`, 256 bytes of code), then regions A, B and C (6 KiB each;
/// the trace's own map calls all of it stage `work`), with `f_twice`
/// called twice and `f_rare` in every other request.
fn planted(threads: u32, requests: u32) -> Trace {
    let mut t = Trace {
        stages: vec![
            StageInfo {
                id: 0,
                name: "net_read".into(),
            },
            StageInfo {
                id: 1,
                name: "work".into(),
            },
        ],
        ..Default::default()
    };
    for tid in 0..threads {
        let mut ev = Vec::new();
        let mut n = 0;
        for r in 0..requests {
            // As MariaDB's threads: from no stage (2) into the marker.
            ev.push(pack_stage(2));
            ev.push(pack_stage(0));
            n += code(&mut ev, NET, 256);
            ev.push(pack_stage(1));
            n += code(&mut ev, A, REGION);
            n += code(&mut ev, TWICE, 16);
            n += code(&mut ev, B, REGION);
            n += code(&mut ev, TWICE, 16);
            if r % 2 == 0 {
                n += code(&mut ev, RARE, 16);
            }
            n += code(&mut ev, C, REGION);
        }
        ev.push(pack_stage(2));
        ev.push(pack_stage(0));
        t.instrs += n;
        t.threads.push(ThreadStream {
            tid,
            events: ev,
            instrs: n,
        });
    }
    t
}

#[test]
fn the_census_keeps_functions_called_once_in_most_requests_in_request_order() {
    let t = planted(2, 10);
    let c = census(&t, &symbols(), 0, 0.8, 0.0).unwrap();
    assert_eq!(c.requests, 20);
    let names: Vec<&str> = c.candidates.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["do_command", "fA", "fA_mid", "fB", "fB_mid", "fC"]);
    assert!(c
        .candidates
        .iter()
        .all(|x| x.present == 1.0 && x.repeated == 0.0));
    // f_twice is called twice per request, f_rare in half of them.
    assert_eq!(c.functions, 8);
    let lenient = census(&t, &symbols(), 0, 0.5, 0.0).unwrap();
    assert_eq!(lenient.candidates.len(), 7, "f_rare at 50 %");
    assert!(census(&Trace::default(), &symbols(), 0, 0.8, 0.0).is_err());
}

#[test]
fn relabelling_marks_a_stage_at_each_point_and_keeps_the_marker() {
    let t = planted(1, 3);
    let r = relabel(&t, &[vec![A], vec![B, C]], &["x".into(), "y".into()], 0);
    let names: Vec<&str> = r.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["x", "y", "net_read"]);
    let stages: Vec<u64> = r.threads[0]
        .events
        .iter()
        .filter(|e| *e >> 62 == 2)
        .map(|e| e & 0xffff)
        .collect();
    // Per request: net_read (2), x at A, y at B (C is y too: no marker),
    // then no stage (3); a thread starts in no stage.
    assert_eq!(stages, [2, 0, 1, 3, 2, 0, 1, 3, 2, 0, 1, 3, 2]);
    assert_eq!(r.threads[0].instrs, t.threads[0].instrs);
}

#[test]
fn the_planted_split_is_found_again() {
    let t = planted(6, 30);
    let c = census(&t, &symbols(), 0, 0.8, 0.0).unwrap();
    let mut cfg = SimConfig::new(SimPolicy::Static, 3, 20_000);
    cfg.caches = Hierarchy {
        l1i: Geometry::kib(1, 2, 64),
        l1d: Geometry::kib(1, 2, 64),
        l2: Geometry::kib(8, 4, 64),
        l3: None,
    };
    cfg.migration_cycles = 200;
    cfg.migration_target_cycles = 200;
    cfg.migration_latency = 500;
    cfg.period = 50_000;
    let lim = Limits {
        keep: 8,
        parts: 3..=3,
        min_stage: 0.1,
        screen_prefix: 1.0,
    };
    let out = search(&t, 0, c, &cfg, Objective::Cpi, &lim, &mut |_, _, _| {}).unwrap();
    let best = &out.choices[0];
    let names: Vec<&str> = best
        .points
        .iter()
        .map(|&i| out.census.candidates[i].name.as_str())
        .collect();
    assert_eq!(names, ["fA", "fB", "fC"], "{:?}", out.choices);
    // C(6, 3) = 20 choices, less the 4 with both do_command and fA, whose
    // stage would hold 1.4 % of a request (under min_stage).
    assert_eq!(best.tried, 16);
    // Three stage changes per request, and each thread's first entry
    // (6 over 180 requests).
    let want = 3.0 + 6.0 / 180.0;
    assert!(
        (best.visits_per_request - want).abs() < 1e-9,
        "{}",
        best.visits_per_request
    );
}

#[test]
fn the_written_map_replays_as_the_search_scored_it() {
    let t = planted(6, 10);
    let syms = symbols();
    let c = census(&t, &syms, 0, 0.8, 0.0).unwrap();
    let mut cfg = SimConfig::new(SimPolicy::Static, 2, 20_000);
    cfg.period = 50_000;
    let lim = Limits {
        keep: 8,
        parts: 2..=2,
        min_stage: 0.1,
        screen_prefix: 1.0,
    };
    let out = search(&t, 0, c, &cfg, Objective::Cpi, &lim, &mut |_, _, _| {}).unwrap();
    let best = &out.choices[0];
    let map = out.map_file(
        best,
        Some("/bin/x".into()),
        vec!["do_command".into(), "net_x".into()],
    );
    let text = map.to_text(&[]);
    let back = crate::stagemap::StageMapFile::parse(&text).unwrap();
    assert_eq!(back, map);
    // Request symbols need not be in the binary's table (the agent attaches
    // them; the replay's request start is the trace's marker stage).
    let (remarked, spec) = apply_map(&t, &back, &syms, 0).unwrap();
    let per_stage = crate::analysis::stage_instrs(&remarked);
    let r = super::replay_grouping(&remarked, &cfg, &per_stage, &spec).unwrap();
    assert_eq!(r.total.cycles, best.result.total.cycles);
    assert_eq!(r.total.counters, best.result.total.counters);
    // A symbol the binary lacks is an error that names it.
    let mut bad = back.clone();
    bad.stages[0].symbols = vec!["nope".into()];
    let e = apply_map(&t, &bad, &syms, 0).unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
}
