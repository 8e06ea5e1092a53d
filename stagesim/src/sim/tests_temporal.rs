//! Tests of temporal staging (issue 40): the order of visits, the cohorts a
//! visit policy forms and what it saves, and the switch cost — with exact
//! cycle counts.

use super::replay::Replay;
use super::{CycleModel, SimConfig, SimPolicy, SimResult, VisitPolicy};
use crate::stream::{pack_fetch, pack_stage, StageInfo, ThreadStream, Trace};

/// Blocks of one visit: 2048 blocks of 16 bytes = 32 KiB of straight-line
/// code, exactly the default L1i (32 KiB, 8-way, 64 B lines: 512 lines),
/// so a visit of the other stage evicts all of it.
const BLOCKS: u64 = 2048;
/// Instructions of one visit (4 per block).
const VISIT: u64 = 4 * BLOCKS;
/// L1i lines of one visit's code.
const LINES: u64 = 512;

/// A thread that visits `stages` in order, each visit a stage marker and
/// [`BLOCKS`] blocks of that stage's own code (stage `s` at 16 MiB × (s + 1)).
fn thread(tid: u32, stages: &[u16]) -> ThreadStream {
    let mut events = Vec::new();
    for &s in stages {
        events.push(pack_stage(s));
        for b in 0..BLOCKS {
            events.push(pack_fetch(0x100_0000 * (u64::from(s) + 1) + b * 16, 16, 4));
        }
    }
    ThreadStream {
        tid,
        events,
        instrs: VISIT * stages.len() as u64,
    }
}

fn trace(threads: Vec<ThreadStream>) -> Trace {
    let instrs = threads.iter().map(|t| t.instrs).sum();
    Trace {
        threads,
        stages: ["a", "b"]
            .iter()
            .enumerate()
            .map(|(id, name)| StageInfo {
                id: id as u16,
                name: name.to_string(),
            })
            .collect(),
        instrs,
        ..Default::default()
    }
}

/// `pinned` on one core under `visit` with switch cost `switch`, one
/// cycle per instruction, an L1i miss served by L2 14 cycles, an L2 miss 50
/// (no L3), no warm-up, slices longer than the trace.
fn config(visit: VisitPolicy, switch: u64) -> SimConfig {
    let mut cfg = SimConfig::new(SimPolicy::Pinned, 1, 1 << 40);
    cfg.warmup_pct = 0.0;
    cfg.visit = visit;
    cfg.switch_cycles = switch;
    cfg.model = CycleModel {
        base_cpi: 1.0,
        l2_hit: 14.0,
        l3_hit: 50.0,
        memory: 0.0,
        data_penalty_scale: 1.0,
        transfer: 0.0,
    };
    cfg
}

/// The replay's result and the (core, thread, stage) of every pick the
/// visitors made.
fn run(t: &Trace, cfg: &SimConfig) -> (SimResult, Vec<(usize, usize, usize)>) {
    let mut r = Replay::new(t, cfg).unwrap();
    r.run(&mut |_| {});
    let picks = r
        .temporal
        .as_ref()
        .map_or_else(Vec::new, |tm| tm.picks.clone());
    let res = super::simulate(t, cfg, &mut |_| {}).unwrap();
    (res, picks)
}

/// Cycles of `instrs` instructions with `l1` L1i misses of which `l2`
/// missed L2 too, and `switches` switches of `cost` cycles.
fn cycles(instrs: u64, l1: u64, l2: u64, switches: u64, cost: u64) -> f64 {
    (instrs + (l1 - l2) * 14 + l2 * 50 + switches * cost) as f64
}

#[test]
fn two_threads_visit_a_two_stage_pipeline_in_a_known_order() {
    // Two threads, two requests of a then b each, on one core. Both yield
    // at their first marker (new threads first), then Cohort serves a's
    // queue exhaustively (T0, T1), goes up to b (T0, T1), back down to a.
    let t = trace(vec![thread(0, &[0, 1, 0, 1]), thread(1, &[0, 1, 0, 1])]);
    let (r, picks) = run(&t, &config(VisitPolicy::Cohort, 100));
    assert_eq!(
        picks,
        vec![
            (0, 0, 0),
            (0, 1, 0),
            (0, 0, 1),
            (0, 1, 1),
            (0, 0, 0),
            (0, 1, 0),
            (0, 0, 1),
            (0, 1, 1)
        ]
    );
    // Four cohorts of two visits: the first visit of each misses every line
    // of its stage's code in L1i (L2 only the first time a stage runs), the
    // second hits; 8 markers, 8 switches.
    let c = r.total.counters;
    assert_eq!(c.instrs, 8 * VISIT);
    assert_eq!((c.l1i_misses, c.l2i_misses), (4 * LINES, 2 * LINES));
    assert_eq!((c.switches, c.switch_cycles, c.migrations), (8, 800, 0));
    let want = cycles(8 * VISIT, 4 * LINES, 2 * LINES, 8, 100);
    assert_eq!(r.total.cycles, want);
    assert_eq!(r.window_cycles, want, "one core, never idle");
    // Unstaged (FIFO, no yields): each thread runs its whole stream, and
    // every visit misses all its lines.
    let (fifo, picks) = run(&t, &config(VisitPolicy::Fifo, 100));
    assert!(picks.is_empty());
    let c = fifo.total.counters;
    assert_eq!(
        (c.l1i_misses, c.l2i_misses, c.switches),
        (8 * LINES, 2 * LINES, 0)
    );
    assert_eq!(
        fifo.total.cycles,
        cycles(8 * VISIT, 8 * LINES, 2 * LINES, 0, 0)
    );
}

#[test]
fn a_polling_policy_forms_the_cohorts_arrival_order_does_not() {
    // Four threads: T0 and T2 visit a then b, T1 and T3 b then a; they
    // reach their first stages in the order a, b, a, b. Served in arrival
    // order (Color: a b a b b a b a), 7 of the 8 visits follow one of the
    // other stage: 7 × 512 L1i misses. Cohort and SRPT serve a stage's queue
    // exhaustively: a {T0, T2}, b {T1, T3, T0, T2}, a {T1, T3} — three
    // cohorts, 3 × 512 misses.
    let t = trace(vec![
        thread(0, &[0, 1]),
        thread(1, &[1, 0]),
        thread(2, &[0, 1]),
        thread(3, &[1, 0]),
    ]);
    let cohorts = vec![
        (0, 0, 0),
        (0, 2, 0),
        (0, 1, 1),
        (0, 3, 1),
        (0, 0, 1),
        (0, 2, 1),
        (0, 1, 0),
        (0, 3, 0),
    ];
    for visit in [VisitPolicy::Cohort, VisitPolicy::Srpt] {
        let (r, picks) = run(&t, &config(visit, 0));
        // SRPT starts at the last stage with threads: b first.
        if visit == VisitPolicy::Cohort {
            assert_eq!(picks, cohorts);
        }
        let c = r.total.counters;
        assert_eq!(
            (c.l1i_misses, c.l2i_misses),
            (3 * LINES, 2 * LINES),
            "{visit:?}"
        );
        assert_eq!(
            r.total.cycles,
            cycles(8 * VISIT, 3 * LINES, 2 * LINES, 8, 0)
        );
    }
    let (color, picks) = run(&t, &config(VisitPolicy::Color, 0));
    assert!(picks.is_empty(), "Color has no polling order");
    let c = color.total.counters;
    assert_eq!(
        (c.l1i_misses, c.l2i_misses, c.switches),
        (7 * LINES, 2 * LINES, 8)
    );
    assert_eq!(
        color.total.cycles,
        cycles(8 * VISIT, 7 * LINES, 2 * LINES, 8, 0)
    );
}

#[test]
fn the_switch_cost_is_charged_once_per_switch_and_never_with_a_migration() {
    let t = trace(vec![thread(0, &[0, 1, 0, 1]), thread(1, &[0, 1, 0, 1])]);
    let (free, _) = run(&t, &config(VisitPolicy::Cohort, 0));
    let (paid, _) = run(&t, &config(VisitPolicy::Cohort, 1000));
    assert_eq!(paid.total.counters.switches, 8);
    assert_eq!(paid.total.cycles - free.total.cycles, 8.0 * 1000.0);
    // Both (static + a visit policy) on 2 cores, a on core 0, b on core 1:
    // one thread enters a on core 0 (a switch: 77 cycles), then b, served
    // by core 1 only (a migration: 300 source + 200 target CPU, 5000
    // latency; no switch).
    let t = trace(vec![thread(0, &[0, 1])]);
    let mut cfg = config(VisitPolicy::Srpt, 77);
    cfg.policy = SimPolicy::Static;
    cfg.cores = 2;
    cfg.period = 1 << 40;
    cfg.migration_cycles = 300;
    cfg.migration_target_cycles = 200;
    cfg.migration_latency = 5000;
    let (r, _) = run(&t, &cfg);
    let c = r.total.counters;
    assert_eq!((c.switches, c.migrations), (1, 1));
    // Core 0: a's visit (all 512 lines miss L1i and L2), the switch, the
    // source's share; core 1: the target's share and b's visit.
    let visit = cycles(VISIT, LINES, LINES, 0, 0);
    assert_eq!(r.per_core[0].cycles, visit + 77.0 + 300.0);
    assert_eq!(r.per_core[1].cycles, 200.0 + visit);
    assert_eq!(
        r.window_cycles,
        visit + 77.0 + 300.0 + 5000.0 + 200.0 + visit
    );
    assert_eq!(r.mode, "both");
}
