//! Tests of the scheduling model's OS-like baseline: randomised slices and
//! threads that block.

use super::replay::Replay;
use super::{BlockRule, SimConfig, SimPolicy};
use crate::stream::{pack_data, pack_fetch, pack_stage, StageInfo, ThreadStream, Trace};

/// The trace's stage table for `names` (ids in order).
fn stage_infos(names: &[&str]) -> Vec<StageInfo> {
    names
        .iter()
        .enumerate()
        .map(|(id, name)| StageInfo {
            id: id as u16,
            name: name.to_string(),
        })
        .collect()
}

/// `threads` identical threads of `blocks` basic blocks (4 instructions,
/// 16 bytes each, sequential code); with `stage_every`, a `net_read` marker
/// (stage 0) before every `stage_every`-th block and `work` (stage 1) after.
fn trace(threads: u32, blocks: u64, stage_every: Option<u64>) -> Trace {
    let mut events = Vec::new();
    let mut instrs = 0;
    for b in 0..blocks {
        if let Some(n) = stage_every {
            if b % n == 0 {
                events.push(pack_stage(0));
            }
            if b % n == 1 {
                events.push(pack_stage(1));
            }
        }
        events.push(pack_fetch(0x40_0000 + (b % 4096) * 16, 16, 4));
        instrs += 4;
    }
    Trace {
        threads: (0..threads)
            .map(|tid| ThreadStream {
                tid,
                events: events.clone(),
                instrs,
            })
            .collect(),
        stages: stage_infos(&["net_read", "work"]),
        instrs: instrs * u64::from(threads),
        ..Default::default()
    }
}

/// Per thread, the event positions where its slices ended.
fn slice_ends(trace: &Trace, cfg: &SimConfig) -> Vec<Vec<usize>> {
    let mut r = Replay::new(trace, cfg).unwrap();
    r.run(&mut |_| {});
    r.slice_ends
}

#[test]
fn identical_threads_leave_lockstep_with_randomised_slices() {
    let t = trace(2, 20_000, None);
    for cores in [1, 2] {
        let mut cfg = SimConfig::new(SimPolicy::Baseline, cores, 1000);
        let fixed = slice_ends(&t, &cfg);
        assert_eq!(
            fixed[0], fixed[1],
            "fixed slices: the threads run in lockstep"
        );
        cfg.slice_jitter = 0.5;
        let jittered = slice_ends(&t, &cfg);
        assert_ne!(
            jittered[0], jittered[1],
            "{cores} cores: slice boundaries should differ"
        );
        // The same seed replays the same schedule; another seed another.
        assert_eq!(slice_ends(&t, &cfg), jittered);
        cfg.seed = 2;
        assert_ne!(slice_ends(&t, &cfg), jittered);
    }
}

#[test]
fn jittered_slices_stay_within_their_range() {
    let t = trace(1, 1, None);
    let mut cfg = SimConfig::new(SimPolicy::Baseline, 1, 1000);
    cfg.slice_jitter = 0.5;
    let mut r = Replay::new(&t, &cfg).unwrap();
    let lens: Vec<u64> = (0..10_000).map(|_| r.slice_len()).collect();
    assert!(
        lens.iter().all(|l| (500..=1500).contains(l)),
        "{:?}",
        &lens[..10]
    );
    let mean = lens.iter().sum::<u64>() as f64 / lens.len() as f64;
    assert!((mean - 1000.0).abs() < 20.0, "mean {mean}");
}

#[test]
fn threads_block_at_their_request_marker_and_cores_wait() {
    // One thread, a net_read marker every 100 blocks: 200 requests.
    let t = trace(1, 20_000, Some(100));
    let mut cfg = SimConfig::new(SimPolicy::Baseline, 1, 1_000_000);
    cfg.warmup_pct = 0.0;
    let free = super::simulate(&t, &cfg, &mut |_| {}).unwrap();
    cfg.block = Some(BlockRule {
        stage: 0,
        think_cycles: 10_000,
    });
    let blocked = super::simulate(&t, &cfg, &mut |_| {}).unwrap();
    assert_eq!((free.blocks, blocked.blocks), (0, 200));
    // The core waits for the client: ~200 × 10,000 idle cycles more.
    let idle = blocked.window_cycles - free.window_cycles;
    assert!((1.0e6..3.0e6).contains(&idle), "idle {idle}");
    assert!(blocked.utilization < free.utilization);
    // Every instruction still runs.
    assert_eq!(blocked.total.counters.instrs, free.total.counters.instrs);
    // The request marker is the trace's stage: merging it with others in a
    // group does not make threads block at the other stages' entries.
    cfg.groups = Some(crate::groups::StageGroups::parse("all=net_read,work", &t.stages).unwrap());
    let grouped = super::simulate(&t, &cfg, &mut |_| {}).unwrap();
    assert_eq!(grouped.blocks, 200);
}

/// Two stages of `kib` KiB of code each (distinct addresses), visited in
/// turn for `visit` blocks by each of `threads` threads, `requests` times.
fn two_stage_trace(threads: u32, requests: u64, visit: u64, kib: u64) -> Trace {
    let lines = kib * 1024 / 16;
    let mut events = Vec::new();
    let mut instrs = 0;
    let mut at = [0u64; 2];
    for _ in 0..requests {
        for s in 0..2u16 {
            events.push(pack_stage(s));
            for _ in 0..visit {
                let i = s as usize;
                events.push(pack_fetch(
                    0x100_0000 * (u64::from(s) + 1) + at[i] * 16,
                    16,
                    4,
                ));
                at[i] = (at[i] + 1) % lines;
                instrs += 4;
            }
        }
    }
    Trace {
        threads: (0..threads)
            .map(|tid| ThreadStream {
                tid,
                events: events.clone(),
                instrs,
            })
            .collect(),
        stages: stage_infos(&["a", "b"]),
        instrs: instrs * u64::from(threads),
        ..Default::default()
    }
}

#[test]
fn auto_runs_host_sched_trials_and_decides() {
    // Stages of 384 KiB each: both fit one 512 KiB L2 apart, not together,
    // so staging pays when migrations are cheap and not when they are dear.
    // 2400 requests a thread: the hold-over and a duel of paired slices
    // (at least 6 pairs of 2 + 2 periods and the settling) fit with room
    // to decide.
    let t = two_stage_trace(4, 2400, 400, 384);
    let mut decided = Vec::new();
    for cost in [100, 1_000_000] {
        let mut cfg = SimConfig::new(SimPolicy::Auto, 2, 100_000);
        cfg.period = 100_000;
        cfg.migration_cycles = cost;
        cfg.warmup_pct = 0.0;
        let r = super::simulate(&t, &cfg, &mut |_| {}).unwrap();
        let last = r
            .auto_decisions
            .iter()
            .rev()
            .find(|(_, d)| d.contains("keep"))
            .unwrap_or_else(|| {
                panic!(
                    "no decision at cost {cost} in {} periods: {:?}",
                    r.periods, r.auto_decisions
                )
            });
        decided.push(last.1.clone());
    }
    assert!(
        decided[0].starts_with("spatial: keep spatial"),
        "{decided:?}"
    );
    assert!(
        decided[1].starts_with("unstaged: keep unstaged"),
        "{decided:?}"
    );
}

#[test]
fn repeated_streams_run_every_lap() {
    let t = trace(2, 5_000, None);
    let mut cfg = SimConfig::new(SimPolicy::Baseline, 2, 1000);
    cfg.warmup_pct = 0.0;
    let once = super::simulate(&t, &cfg, &mut |_| {}).unwrap();
    cfg.repeat = 3;
    let thrice = super::simulate(&t, &cfg, &mut |_| {}).unwrap();
    assert_eq!(thrice.total.counters.instrs, 3 * once.total.counters.instrs);
    // The code is warm after the first lap: fewer misses per instruction.
    assert!(thrice.total.l1i_mpki < once.total.l1i_mpki);
    cfg.policy = SimPolicy::Captured;
    cfg.cores = 1;
    assert!(
        super::simulate(&t, &cfg, &mut |_| {}).is_err(),
        "captured is replayed once"
    );
}

/// A thread of `visits`: per (stage, blocks) a stage marker and that many
/// 4-instruction blocks of straight-line code.
fn thread_of(tid: u32, visits: &[(u16, u64)]) -> ThreadStream {
    let mut events = Vec::new();
    let mut instrs = 0;
    for &(stage, blocks) in visits {
        events.push(pack_stage(stage));
        for b in 0..blocks {
            events.push(pack_fetch(
                0x100_0000 * (u64::from(stage) + 1) + b * 16,
                16,
                4,
            ));
            instrs += 4;
        }
    }
    ThreadStream {
        tid,
        events,
        instrs,
    }
}

/// `static` on 2 cores (stage `a` on core 0, `b` on core 1) with a cycle
/// model of exactly one cycle per instruction and free caches, so every
/// cycle of a replay is accounted for: instructions, the migration's source
/// and target CPU, and its latency.
fn exact_static(threads: Vec<ThreadStream>) -> super::SimResult {
    exact_static_with(threads, 0.0)
}

/// [`exact_static`] with a cross-core transfer cost of `transfer` cycles
/// (misses themselves free).
fn exact_static_with(threads: Vec<ThreadStream>, transfer: f64) -> super::SimResult {
    let instrs = threads.iter().map(|t| t.instrs).sum();
    let trace = Trace {
        threads,
        stages: stage_infos(&["a", "b"]),
        instrs,
        ..Default::default()
    };
    let mut cfg = SimConfig::new(SimPolicy::Static, 2, 1 << 40);
    cfg.warmup_pct = 0.0;
    cfg.period = 1 << 40;
    cfg.migration_cycles = 300;
    cfg.migration_target_cycles = 200;
    cfg.migration_latency = 5000;
    cfg.model = super::CycleModel {
        base_cpi: 1.0,
        l2_hit: 0.0,
        l3_hit: 0.0,
        memory: 0.0,
        data_penalty_scale: 1.0,
        transfer,
    };
    super::simulate(&trace, &cfg, &mut |_| {}).unwrap()
}

#[test]
fn a_migration_costs_source_and_target_cpu_and_its_latency_idles_the_target() {
    // One thread, 1000 instructions in `a` on core 0, then 1000 in `b` on
    // core 1: core 0 busy 1000 + 300 (source), the thread runnable on core
    // 1 at 1300 + 5000 (latency), core 1 busy 200 (target) + 1000 from
    // then on: the last core ends at 1300 + 5000 + 200 + 1000 = 7500.
    let r = exact_static(vec![thread_of(0, &[(0, 250), (1, 250)])]);
    assert_eq!(r.total.counters.migrations, 1);
    assert_eq!(r.total.counters.migration_cycles, 500);
    assert_eq!(r.total.cycles, 2500.0);
    assert_eq!(r.per_core[0].cycles, 1300.0);
    assert_eq!(r.per_core[1].cycles, 1200.0);
    assert_eq!(r.window_cycles, 7500.0);
    assert_eq!(r.throughput_ipc, 2000.0 / 7500.0);
}

#[test]
fn a_busy_target_hides_the_latency_but_not_the_cpu() {
    // Thread 1 keeps core 1 busy for 8000 cycles in `b`; thread 0 leaves
    // core 0 at 1300 and is runnable at 6300, while core 1 is still busy:
    // core 1 runs it at 8000 + 200 (target), ends at 9200. The latency
    // costs nothing; the CPU does.
    let r = exact_static(vec![
        thread_of(0, &[(0, 250), (1, 250)]),
        thread_of(1, &[(1, 2000)]),
    ]);
    assert_eq!(r.total.counters.migrations, 1);
    assert_eq!(r.per_core[0].cycles, 1300.0);
    assert_eq!(r.per_core[1].cycles, 8000.0 + 200.0 + 1000.0);
    assert_eq!(r.window_cycles, 9200.0);
}

#[test]
fn a_line_written_on_the_core_a_thread_left_costs_a_transfer_each_way() {
    // Stage a on core 0 stores line X; stage b on core 1 loads it (an L2
    // miss owned by core 0: a transfer) and stores it (core 0's copy is
    // dropped); back in stage a, core 0 loads it again: a second transfer.
    // With 1 cycle per instruction, free misses and a 100-cycle transfer,
    // each transfer adds exactly 100 cycles to its core.
    let thread = || {
        let x = 0x7000_0000;
        let mut events = Vec::new();
        for (stage, store) in [(0u16, true), (1, true), (0, false)] {
            events.push(pack_stage(stage));
            events.push(pack_fetch(0x100_0000 * (u64::from(stage) + 1), 16, 4));
            events.push(pack_data(x, 8, false));
            if store {
                events.push(pack_data(x, 8, true));
            }
            // The replay stops at its last instruction: data after it would
            // not be replayed.
            events.push(pack_fetch(0x100_0000 * (u64::from(stage) + 1) + 16, 16, 4));
        }
        ThreadStream {
            tid: 0,
            events,
            instrs: 24,
        }
    };
    let r = exact_static_with(vec![thread()], 100.0);
    assert_eq!(r.total.counters.xfer_lines, 2);
    assert_eq!(r.per_core[1].counters.xfer_lines, 1);
    // Core 0: 16 instructions, the source's 300 of the first migration,
    // the target's 200 of the second, 1 transfer; core 1 the other halves.
    assert_eq!(r.per_core[0].cycles, 16.0 + 300.0 + 200.0 + 100.0);
    assert_eq!(r.per_core[1].cycles, 8.0 + 200.0 + 300.0 + 100.0);
    // Without the transfer model the same replay has no transfers.
    let r = exact_static(vec![thread()]);
    assert_eq!(r.total.counters.xfer_lines, 0);
    assert_eq!(r.per_core[0].cycles, 16.0 + 300.0 + 200.0);
}
