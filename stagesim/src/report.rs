//! Text tables and the JSON report of a set of replays.

use std::fmt::Write;

use serde::{Deserialize, Deserializer, Serialize};

use crate::cache::Hierarchy;
use crate::groups::StageGroups;
use crate::sim::{CycleModel, Metrics, SimResult};

/// Everything `stagesim replay --json` writes (and `stagesim plot` and
/// `stagesim results` read back).
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// Migration costs replayed, cycles (staged policies).
    pub migration_cycles: Vec<u64>,
    /// Stage groupings replayed (staged policies).
    pub groupings: Vec<StageGroups>,
    /// Min-visit thresholds replayed (0: off).
    pub min_visit: Vec<u64>,
    /// How the min-visit variant knows visit lengths.
    pub visit_rule: String,
    /// Cache geometry.
    pub caches: Hierarchy,
    /// Cycle model.
    pub model: CycleModel,
    /// One entry per (policy, cores, slice).
    pub results: Vec<SimResult>,
}

/// Reads an `f64` that JSON may hold as `null` (serde_json writes
/// non-finite numbers so) as NaN.
pub fn f64_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// The migration costs of the staged replays in `all`, sorted, each once.
pub fn staged_costs(all: &[SimResult]) -> Vec<u64> {
    let mut costs: Vec<u64> = all
        .iter()
        .filter(|r| r.policy != "baseline")
        .map(|r| r.migration_cycles)
        .collect();
    costs.sort_unstable();
    costs.dedup();
    costs
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
    let wm = all.iter().map(|r| r.label.len()).max().unwrap_or(6).max(6);
    let wg = all
        .iter()
        .map(|r| r.groups.chars().count())
        .max()
        .unwrap_or(6)
        .max(6);
    let _ = writeln!(
        s,
        "{:<wm$} {:<wg$} {:>5} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>5} {:>5} {:>6} {:>6} {:>7} {:>7}",
        "model",
        "stages",
        "cores",
        "slice",
        "migcyc",
        "L1i-MPKI",
        "L2i-MPKI",
        "L1d-MPKI",
        "L2d-MPKI",
        "migr/kI",
        "kept/kI",
        "steal/kI",
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
        let per_ki = |x: u64| {
            if t.counters.instrs > 0 {
                x as f64 * 1000.0 / t.counters.instrs as f64
            } else {
                0.0
            }
        };
        let _ = writeln!(
            s,
            "{:<wm$} {:<wg$} {:>5} {:>8} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7.3} {:>7.3} {:>8.3} {:>5.2} {:>5.2} {:>6.2} {:>6} {:>7} {:>7}",
            r.label,
            r.groups,
            r.cores,
            r.slice,
            r.migration_cycles,
            t.l1i_mpki,
            t.l2i_mpki,
            t.l1d_mpki,
            t.l2d_mpki,
            t.migrations_pki,
            per_ki(t.counters.kept),
            per_ki(t.counters.steals),
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
        "  {} [{}] cores={} slice={} migration={} cycles: {} warm-up instructions excluded, {} policy periods, {} plan changes, final cores per stage {:?}, replay {:.2} s ({:.1} M instr/s)",
        r.label,
        r.group_spec,
        r.cores,
        r.slice,
        r.migration_cycles,
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
