//! End-to-end: synthetic traces written to disk, loaded back and replayed
//! under every scheduling model, with the real host-sched policies.

use std::path::PathBuf;

use stagesim::groups::StageGroups;
use stagesim::sim::{simulate, SimConfig, SimPolicy, SimResult, VisitRule};
use stagesim::stream::{pack_stage, StageInfo, Trace, EV_STAGE};
use stagesim::synth::{self, SynthConfig, SynthSummary};

/// `name` in a folder of its own (tests run in parallel and each removes
/// its folder when done: a shared one could vanish under another test's
/// compiler or writer).
fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stagesim-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Writes the synthetic trace of `cfg` to disk as `name`, loads it back and
/// removes the files (the trace is in memory then).
fn synth_trace(name: &str, cfg: &SynthConfig) -> (Trace, SynthSummary) {
    let path = tmp(name);
    let s = synth::write(&path, cfg).unwrap();
    let t = Trace::load(&path).unwrap();
    let _ = std::fs::remove_file(stagesim::trace::Sidecar::path_for(&path));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(path.parent().unwrap());
    (t, s)
}

/// Two stages of 320 KiB code each: one stage fits a core's 512 KiB L2, both
/// together (640 KiB) do not. Little data, so the L2 holds mostly code.
fn two_stage_trace(name: &str, weights: Vec<f64>) -> Trace {
    let cfg = SynthConfig {
        threads: 8,
        stages: 2,
        stage_kib: 320,
        common_kib: 8,
        requests: 16,
        visit_instrs: 20_000,
        visit_weights: weights,
        heap_kib: 32,
        stack_kib: 4,
        data_per_block: 0.3,
        seed: 7,
    };
    let (t, s) = synth_trace(name, &cfg);
    assert_eq!(t.instrs, s.instrs, "the loaded trace has every instruction");
    assert_eq!(t.threads.len(), 8);
    let names: Vec<&str> = t.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["parse", "plan"],
        "stage names come from the sidecar"
    );
    t
}

fn run(t: &Trace, policy: SimPolicy, cores: usize, slice: u64) -> SimResult {
    let mut c = SimConfig::new(policy, cores, slice);
    c.period = 200_000;
    simulate(t, &c, &mut |_| {}).unwrap()
}

#[test]
fn static_beats_baseline_on_l2_instruction_misses_at_two_cores() {
    let t = two_stage_trace("two.stz", vec![]);
    for slice in [10_000, 100_000] {
        let base = run(&t, SimPolicy::Baseline, 2, slice);
        let stat = run(&t, SimPolicy::Static, 2, slice);
        eprintln!(
            "slice {slice}: baseline L2i {:.2} MPKI, static {:.2} MPKI",
            base.total.l2i_mpki, stat.total.l2i_mpki
        );
        // One stage per core: each core's L2 holds its stage's code.
        assert_eq!(stat.final_requirement, [1, 1]);
        assert!(
            stat.total.l2i_mpki < 0.5 * base.total.l2i_mpki,
            "static L2i MPKI {:.2} is not below half of baseline's {:.2}",
            stat.total.l2i_mpki,
            base.total.l2i_mpki
        );
        assert!(base.total.l2i_mpki > 1.0, "baseline must thrash the L2");
        // Threads migrate at stage switches under static, never under baseline.
        assert!(stat.total.counters.migrations > 0);
        assert_eq!(base.total.counters.migrations, 0);
        // Per stage: each stage's code is served by its own core.
        for s in &stat.per_stage[..2] {
            assert!(s.metrics.l2i_mpki < 0.5 * base.total.l2i_mpki, "{}", s.name);
        }
        // Warm-up: the first 10 % of instructions are excluded, the rest counted.
        let all = stat.warmup_instrs + stat.total.counters.instrs;
        assert_eq!(all, t.instrs);
        assert!((stat.warmup_instrs as f64 - 0.1 * t.instrs as f64).abs() < 1000.0);
        assert!(stat.utilization > 0.0 && stat.utilization <= 1.0 + 1e-9);
        assert!(base.utilization > 0.0 && base.utilization <= 1.0 + 1e-9);
    }
}

#[test]
fn proportional_follows_the_load_with_the_real_host_sched_policy() {
    // Stage "parse" carries 3× the instructions of "plan".
    let t = two_stage_trace("weighted.stz", vec![3.0, 1.0]);
    let stat = run(&t, SimPolicy::Static, 4, 100_000);
    let prop = run(&t, SimPolicy::Proportional, 4, 100_000);
    // static: equal weights → 2 + 2 cores; proportional: load 3:1 → 3 + 1.
    assert_eq!(stat.final_requirement, [2, 2]);
    assert_eq!(stat.plan_changes, 0);
    assert_eq!(prop.final_requirement, [3, 1]);
    assert!(prop.plan_changes >= 1);
    assert!(prop.periods > 5);
    // Matching cores to load keeps the cores busier.
    assert!(
        prop.utilization > stat.utilization,
        "proportional {:.3} vs static {:.3}",
        prop.utilization,
        stat.utilization
    );
}

#[test]
fn pinned_never_migrates_and_one_core_models_agree() {
    let t = two_stage_trace("pinned.stz", vec![]);
    let pinned = run(&t, SimPolicy::Pinned, 4, 50_000);
    assert_eq!(pinned.total.counters.migrations, 0);
    // On one core every model is the same round robin over the same queue.
    let a = run(&t, SimPolicy::Baseline, 1, 50_000);
    let b = run(&t, SimPolicy::Pinned, 1, 50_000);
    let c = run(&t, SimPolicy::Static, 1, 50_000);
    assert_eq!(a.total.counters, b.total.counters);
    assert_eq!(a.total.counters, c.total.counters);
    // Every instruction is replayed exactly once whatever the model.
    for r in [&pinned, &a] {
        assert_eq!(r.warmup_instrs + r.total.counters.instrs, t.instrs);
    }
}

#[test]
fn bad_trace_files_are_errors_naming_the_offset() {
    let path = tmp("bad.stz");
    let mut raw = b"STGTRC01".to_vec();
    raw.extend_from_slice(&[0x01, 0, 0, 0, 0, 0x09]);
    std::fs::write(&path, zstd::encode_all(&raw[..], 3).unwrap()).unwrap();
    let e = Trace::load(&path).unwrap_err().to_string();
    assert!(e.contains("byte offset 13: unknown record tag 0x09"), "{e}");
    std::fs::write(&path, b"plain text, not zstd").unwrap();
    let e = Trace::load(&path).unwrap_err().to_string();
    assert!(e.contains("byte offset 0"), "{e}");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(path.parent().unwrap());
}

/// A synthetic trace with four stages (parse, plan, execute, commit).
fn four_stage_trace(name: &str) -> Trace {
    let cfg = SynthConfig {
        threads: 6,
        stages: 4,
        stage_kib: 96,
        common_kib: 8,
        requests: 12,
        visit_instrs: 4_000,
        visit_weights: vec![],
        heap_kib: 32,
        stack_kib: 4,
        data_per_block: 0.3,
        seed: 11,
    };
    synth_trace(name, &cfg).0
}

/// `t` as if captured with the grouping's coarser map: stage markers mapped
/// to groups, markers that do not change the group dropped.
fn recaptured(t: &Trace, g: &StageGroups) -> Trace {
    let lookup = g.lookup();
    let mut out = t.clone();
    out.stages = g
        .names
        .iter()
        .enumerate()
        .map(|(i, n)| StageInfo {
            id: i as u16,
            name: n.clone(),
        })
        .collect();
    for th in &mut out.threads {
        let mut cur = usize::MAX;
        th.events.retain_mut(|ev| {
            if *ev >> 62 != EV_STAGE {
                return true;
            }
            let grp = lookup[(*ev & 0xffff) as usize];
            *ev = pack_stage(grp as u16);
            let keep = grp != cur;
            cur = grp;
            keep
        });
    }
    out
}

#[test]
fn a_grouping_replays_exactly_like_a_trace_captured_with_the_coarser_map() {
    let t = four_stage_trace("groups.stz");
    let g = StageGroups::parse("front=parse,plan;back=execute,commit", &t.stages).unwrap();
    let coarse = recaptured(&t, &g);
    for policy in [SimPolicy::Static, SimPolicy::Proportional] {
        let mut a = SimConfig::new(policy, 2, 20_000);
        a.period = 100_000;
        a.groups = Some(g.clone());
        let mut b = SimConfig::new(policy, 2, 20_000);
        b.period = 100_000;
        let ra = simulate(&t, &a, &mut |_| {}).unwrap();
        let rb = simulate(&coarse, &b, &mut |_| {}).unwrap();
        assert_eq!(ra.total.counters, rb.total.counters, "{policy:?}");
        assert_eq!(ra.per_stage.len(), 3, "two groups and (none)");
        assert_eq!(ra.per_stage[0].name, "front");
        assert_eq!(ra.per_stage[1].name, "back");
        for (x, y) in ra.per_stage.iter().zip(&rb.per_stage) {
            assert_eq!(x.metrics.counters, y.metrics.counters, "{}", x.name);
        }
        assert_eq!(ra.groups, "front+back(2)");
        // Fewer stage changes, fewer migrations than the 4-stage map (at 4
        // cores, where every stage of the fine map has a core of its own).
        let mut a4 = a.clone();
        a4.cores = 4;
        let ra = simulate(&t, &a4, &mut |_| {}).unwrap();
        let fine = run(&t, policy, 4, 20_000);
        assert!(
            ra.total.counters.migrations < fine.total.counters.migrations,
            "{policy:?}: {} vs {}",
            ra.total.counters.migrations,
            fine.total.counters.migrations
        );
    }
}

#[test]
fn min_visit_longer_than_every_visit_never_migrates_and_equals_pinned() {
    let t = four_stage_trace("minvisit.stz");
    let pinned = run(&t, SimPolicy::Pinned, 2, 20_000);
    for rule in [VisitRule::Oracle, VisitRule::History] {
        let mut c = SimConfig::new(SimPolicy::Static, 2, 20_000);
        c.period = 200_000;
        c.min_visit = u64::MAX / 2;
        c.visit_rule = rule;
        let r = simulate(&t, &c, &mut |_| {}).unwrap();
        // History predicts a stage's first visits long: those still migrate.
        if rule == VisitRule::Oracle {
            assert_eq!(r.total.counters.migrations, 0);
            let mut a = r.total.counters;
            a.kept = 0;
            assert_eq!(
                a, pinned.total.counters,
                "no migration: the pinned placement"
            );
        } else {
            assert!(
                r.total.counters.migrations < 20,
                "{}",
                r.total.counters.migrations
            );
        }
        assert!(r.total.counters.kept > 0);
        assert_eq!(
            r.label,
            format!("static/min-visit {} {}", u64::MAX / 2, rule.name())
        );
    }
    // A threshold of 1 instruction is the plain policy.
    let mut c = SimConfig::new(SimPolicy::Static, 2, 20_000);
    c.period = 200_000;
    c.min_visit = 1;
    let a = simulate(&t, &c, &mut |_| {}).unwrap();
    let b = run(&t, SimPolicy::Static, 2, 20_000);
    assert_eq!(a.total.counters.migrations, b.total.counters.migrations);
}

#[test]
fn stealing_and_prefix_replays_keep_the_instruction_count() {
    let t = four_stage_trace("steal.stz");
    let mut c = SimConfig::new(SimPolicy::Static, 4, 20_000);
    c.period = 100_000;
    c.steal = true;
    let r = simulate(&t, &c, &mut |_| {}).unwrap();
    assert_eq!(r.warmup_instrs + r.total.counters.instrs, t.instrs);
    assert!(r.utilization > 0.0 && r.utilization <= 1.0 + 1e-9);
    assert_eq!(r.label, "static/steal");
    // baseline ignores the option; pinned steals too (issue 40: the
    // unstaged scheduler temporal staging runs on), every core serving
    // every stage.
    let mut p = SimConfig::new(SimPolicy::Pinned, 4, 20_000);
    p.steal = true;
    let rp = simulate(&t, &p, &mut |_| {}).unwrap();
    assert_eq!(rp.warmup_instrs + rp.total.counters.instrs, t.instrs);
    assert_eq!(rp.label, "pinned/steal");
    let mut b = SimConfig::new(SimPolicy::Baseline, 4, 20_000);
    b.steal = true;
    let rb = simulate(&t, &b, &mut |_| {}).unwrap();
    assert_eq!(rb.total.counters.steals, 0);
    // A prefix: the warm-up is 10 % of it, and it ends within one block.
    let mut q = SimConfig::new(SimPolicy::Baseline, 2, 20_000);
    q.limit = Some(t.instrs / 2);
    let rq = simulate(&t, &q, &mut |_| {}).unwrap();
    let done = rq.warmup_instrs + rq.total.counters.instrs;
    assert!(done >= t.instrs / 2 && done < t.instrs / 2 + 64, "{done}");
    assert!((rq.warmup_instrs as f64 - 0.05 * t.instrs as f64).abs() < 64.0);
}

#[test]
fn discovery_merges_down_to_one_group() {
    let t = four_stage_trace("discover.stz");
    let mut c = SimConfig::new(SimPolicy::Static, 2, 20_000);
    c.period = 100_000;
    c.load_weights = true;
    c.thread_prefix = Some(0.5);
    let steps = stagesim::discover::discover(
        &t,
        &c,
        stagesim::discover::Objective::Cpi,
        1,
        &mut |_, _, _| {},
    )
    .unwrap();
    // Every candidate replays the same half of every thread.
    let half: u64 = t
        .threads
        .iter()
        .map(|th| {
            th.events[..th.events.len() / 2]
                .iter()
                .filter(|e| **e >> 62 == 0)
                .map(|e| stagesim::stream::ev_instrs(*e))
                .sum::<u64>()
        })
        .sum();
    for s in &steps {
        assert_eq!(
            s.result.warmup_instrs + s.result.total.counters.instrs,
            half
        );
    }
    let ks: Vec<usize> = steps.iter().map(|s| s.k).collect();
    assert_eq!(ks, [4, 3, 2, 1]);
    assert_eq!(steps[1].candidates, 6);
    assert_eq!(
        steps[3].result.total.counters.migrations, 0,
        "one group: nothing to migrate to"
    );
    // Every step's grouping parses back and covers every stage once.
    for s in &steps {
        let g = StageGroups::parse(&s.spec, &t.stages).unwrap();
        assert_eq!(g.len(), s.k);
    }
}

/// The `captured` model against an independent simulator of the same order
/// (`bench/capture/cachesim.c`, C, timestamp LRU): every MPKI agrees.
#[test]
fn captured_order_agrees_with_the_independent_simulator() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let exe = tmp("cachesim");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/capture/cachesim.c");
    let built = std::process::Command::new(&cc)
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(src)
        .status();
    if !built.is_ok_and(|s| s.success())
        || std::process::Command::new("zstd")
            .arg("--version")
            .output()
            .is_err()
    {
        assert!(std::env::var("CI").is_err(), "cc or zstd missing under CI");
        eprintln!("skipped: needs a C compiler ({cc}) and zstd");
        return;
    }
    let cfg = SynthConfig {
        threads: 4,
        stages: 3,
        stage_kib: 200,
        common_kib: 16,
        requests: 6,
        visit_instrs: 30_000,
        ..SynthConfig::default()
    };
    let path = tmp("captured.stz");
    synth::write(&path, &cfg).unwrap();
    let t = Trace::load(&path).unwrap();
    assert!(
        t.schedule.len() > t.threads.len(),
        "the synthetic trace switches threads"
    );
    let r = simulate(
        &t,
        &SimConfig::new(SimPolicy::Captured, 1, 100_000),
        &mut |_| {},
    )
    .unwrap();
    let out = std::process::Command::new(&exe)
        .arg("--json")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let _ = std::fs::remove_file(stagesim::trace::Sidecar::path_for(&path));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&exe);
    let _ = std::fs::remove_dir(exe.parent().unwrap());
    let _ = std::fs::remove_dir(path.parent().unwrap());
    let m = &r.total;
    for (name, ours) in [
        ("l1i_mpki", m.l1i_mpki),
        ("l2i_mpki", m.l2i_mpki),
        ("l1d_mpki", m.l1d_mpki),
        ("l2d_mpki", m.l2d_mpki),
    ] {
        let theirs = c[name].as_f64().unwrap();
        eprintln!("{name}: stagesim captured {ours:.4}, cachesim {theirs:.4}");
        assert!(theirs > 0.0, "{name}: {c}");
        assert!(
            (ours / theirs - 1.0).abs() < 0.005,
            "{name}: stagesim {ours} vs cachesim {theirs}"
        );
    }
}
