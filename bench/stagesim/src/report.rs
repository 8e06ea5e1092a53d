//! Text tables and the JSON report of a set of replays.

use std::fmt::Write;

use serde::Serialize;

use crate::cache::Hierarchy;
use crate::sim::{CycleModel, Metrics, SimResult};

/// Everything `stagesim replay --json` writes.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Trace file.
    pub trace: String,
    /// Instructions in the trace.
    pub trace_instrs: u64,
    /// Threads in the trace.
    pub threads: usize,
    /// Stage names in dense order.
    pub stages: Vec<String>,
    /// Warm-up excluded, % of the trace's instructions.
    pub warmup_pct: f64,
    /// Policy period, instructions per core.
    pub period: u64,
    /// Migration cost, cycles.
    pub migration_cycles: u64,
    /// Cache geometry.
    pub caches: Hierarchy,
    /// Cycle model.
    pub model: CycleModel,
    /// One entry per (policy, cores, slice).
    pub results: Vec<SimResult>,
}

fn baseline_of<'a>(all: &'a [SimResult], r: &SimResult) -> Option<&'a SimResult> {
    all.iter()
        .find(|b| b.policy == "baseline" && b.cores == r.cores && b.slice == r.slice)
}

fn pct(new: f64, base: f64) -> String {
    if base > 0.0 {
        format!("{:+.1}%", (new / base - 1.0) * 100.0)
    } else {
        "-".into()
    }
}

/// The comparison table: one row per replay; `×base` is machine throughput
/// relative to `baseline` at the same cores and slice, `ΔL1i`/`ΔL2i` the
/// change of instruction MPKI relative to it.
pub fn table(all: &[SimResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<12} {:>5} {:>8} {:>4} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5} {:>5} {:>6} {:>6} {:>7} {:>7}",
        "policy",
        "cores",
        "slice",
        "thr",
        "L1i-MPKI",
        "L2i-MPKI",
        "L1d-MPKI",
        "L2d-MPKI",
        "migr/kI",
        "IPC",
        "util",
        "tput",
        "×base",
        "ΔL1i",
        "ΔL2i"
    );
    for r in all {
        let t = &r.total;
        let base = baseline_of(all, r);
        let (ratio, d1, d2) = match base {
            Some(b) if b.throughput_ipc > 0.0 => (
                format!("{:.3}", r.throughput_ipc / b.throughput_ipc),
                pct(t.l1i_mpki, b.total.l1i_mpki),
                pct(t.l2i_mpki, b.total.l2i_mpki),
            ),
            _ => ("-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            s,
            "{:<12} {:>5} {:>8} {:>4} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7.3} {:>5.2} {:>5.2} {:>6.2} {:>6} {:>7} {:>7}",
            r.policy,
            r.cores,
            r.slice,
            r.threads,
            t.l1i_mpki,
            t.l2i_mpki,
            t.l1d_mpki,
            t.l2d_mpki,
            t.migrations_pki,
            t.ipc,
            r.utilization,
            r.throughput_ipc,
            ratio,
            d1,
            d2
        );
    }
    s
}

fn metrics_row(s: &mut String, name: &str, m: &Metrics) {
    let _ = writeln!(
        s,
        "    {:<14} {:>12} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>10} {:>5.2}",
        name,
        m.counters.instrs,
        m.l1i_mpki,
        m.l2i_mpki,
        m.l1d_mpki,
        m.l2d_mpki,
        m.counters.migrations,
        m.ipc
    );
}

/// Per-core and per-stage breakdown of one replay.
pub fn detail(r: &SimResult) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "  {} cores={} slice={}: {} warm-up instructions excluded, {} policy periods, {} plan changes, final cores per stage {:?}, replay {:.2} s ({:.1} M instr/s)",
        r.policy,
        r.cores,
        r.slice,
        r.warmup_instrs,
        r.periods,
        r.plan_changes,
        r.final_requirement,
        r.replay_seconds,
        r.replay_mips
    );
    let _ = writeln!(
        s,
        "    {:<14} {:>12} {:>8} {:>8} {:>8} {:>8} {:>10} {:>5}",
        "", "instrs", "L1i-MPKI", "L2i-MPKI", "L1d-MPKI", "L2d-MPKI", "migrations", "IPC"
    );
    for (k, m) in r.per_core.iter().enumerate() {
        metrics_row(&mut s, &format!("core {k}"), m);
    }
    for st in &r.per_stage {
        metrics_row(&mut s, &format!("stage {}", st.name), &st.metrics);
    }
    s
}
