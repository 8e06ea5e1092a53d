//! End-to-end: synthetic traces written to disk, loaded back and replayed
//! under every scheduling model, with the real host-sched policies.

use std::path::PathBuf;

use stagesim::sim::{simulate, SimConfig, SimPolicy, SimResult};
use stagesim::stream::Trace;
use stagesim::synth::{self, SynthConfig};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stagesim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Two stages of 320 KiB code each: one stage fits a core's 512 KiB L2, both
/// together (640 KiB) do not. Little data, so the L2 holds mostly code.
fn two_stage_trace(name: &str, weights: Vec<f64>) -> Trace {
    let path = tmp(name);
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
    let s = synth::write(&path, &cfg).unwrap();
    let t = Trace::load(&path).unwrap();
    assert_eq!(t.instrs, s.instrs, "the loaded trace has every instruction");
    assert_eq!(t.threads.len(), 8);
    let names: Vec<&str> = t.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["parse", "plan"],
        "stage names come from the sidecar"
    );
    // The trace is in memory now.
    let _ = std::fs::remove_file(stagesim::trace::Sidecar::path_for(&path));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(path.parent().unwrap());
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
