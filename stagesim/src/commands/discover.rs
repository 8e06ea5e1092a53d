//! `stagesim discover`: greedy stage merging ([`stagesim::discover`]) with
//! a progress bar, the table of the chosen grouping per group count, and
//! the `--out` (`K<TAB>SPEC`) and `--json` files.

use std::time::Instant;

use anyhow::{bail, Context as _};

use stagesim::discover::{self, Objective, Step};
use stagesim::sim::{SimConfig, SimPolicy, VisitPolicy};

use super::{load, progress_bar, write_file};
use crate::cli::args::DiscoverArgs;

/// The policy and visit policy candidates are replayed under: a staged
/// policy, or `pinned` with a temporal visit policy (issue 40).
pub(super) fn candidate_policy(a: &DiscoverArgs) -> anyhow::Result<(SimPolicy, VisitPolicy)> {
    let visit = VisitPolicy::parse(&a.visit).with_context(|| {
        format!(
            "--visit '{}': fifo, cohort, srpt, dbr, mg1 or color",
            a.visit
        )
    })?;
    let policy = SimPolicy::parse(&a.policy)
        .filter(|p| {
            p.host_sched_kind().is_some_and(|_| *p != SimPolicy::Auto)
                || (*p == SimPolicy::Pinned && visit.is_temporal())
        })
        .with_context(|| {
            format!(
                "--policy '{}': static or proportional (pinned with a temporal --visit)",
                a.policy
            )
        })?;
    Ok((policy, visit))
}

/// The replay settings every candidate shares.
pub(super) fn base_config(a: &DiscoverArgs, policy: SimPolicy) -> anyhow::Result<SimConfig> {
    let mut c = SimConfig::new(policy, a.cores, a.slice);
    let (_, visit) = candidate_policy(a)?;
    c.visit = visit;
    c.switch_cycles = a.switch_cycles;
    // Temporal staging on `pinned`: idle cores steal, as in `auto`'s mode.
    c.steal = a.steal || policy == SimPolicy::Pinned;
    c.caches = a.model.hierarchy()?;
    c.model = a.model.cycle_model();
    c.migration_cycles = a.migration_cycles;
    c.migration_target_cycles = a.migration_target_cycles;
    c.migration_latency = a.migration_latency;
    c.warmup_pct = a.warmup_pct;
    c.period = a.period;
    anyhow::ensure!(
        a.prefix_pct > 0.0 && a.prefix_pct <= 100.0,
        "--prefix-pct {}: must be in (0, 100]",
        a.prefix_pct
    );
    c.thread_prefix = Some(a.prefix_pct / 100.0);
    Ok(c)
}

/// `stagesim discover`.
pub fn discover(a: DiscoverArgs) -> anyhow::Result<()> {
    if a.binary.is_some() {
        return super::points::discover_points(a);
    }
    let (policy, _) = candidate_policy(&a)?;
    let objective_name = a.objective.clone().unwrap_or_else(|| "cpi".into());
    let objective = Objective::parse(&objective_name)
        .with_context(|| format!("--objective '{objective_name}': cpi, l2 or tput"))?;
    let trace = load(&a.trace, a.sidecar.as_deref())?;
    let mut c = base_config(&a, policy)?;
    let k = trace.stages.len();
    let total: usize = 1
        + (a.min_groups.max(1)..k)
            .map(|g| g * (g + 1) / 2)
            .sum::<usize>();
    eprintln!(
        "stagesim discover: {} stages, greedy merging down to {} group(s): {} replays of the first {} % of every thread ({} at {} cores, slice {}, migration {} cycles, score {})",
        k,
        a.min_groups.max(1),
        total,
        a.prefix_pct,
        policy.name(),
        a.cores,
        a.slice,
        a.migration_cycles,
        objective_name
    );
    let pb = progress_bar(
        total as u64,
        "{bar:40} {pos}/{len} {msg} [{elapsed} < {eta}]",
    );
    let t0 = Instant::now();
    c.load_weights = match a.static_weights.as_str() {
        "load" => policy == SimPolicy::Static,
        "equal" => false,
        other => bail!("--static-weights '{other}': equal or load"),
    };
    let steps = discover::discover(&trace, &c, objective, a.min_groups, &mut |k, i, n| {
        pb.set_message(format!("{k} groups: candidate {i}/{n}"));
        pb.inc(1);
    })?;
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let per = steps.first().map_or(0, |s| {
        s.result.warmup_instrs + s.result.total.counters.instrs
    });
    println!(
        "stagesim discover: {} ({} of {} instructions per candidate, {} at {} cores, slice {}, migration {} cycles, score {}): {} replays in {:.1} s ({:.1} M instr/s)",
        a.trace.display(),
        per,
        trace.instrs,
        policy.name(),
        a.cores,
        a.slice,
        a.migration_cycles,
        objective_name,
        total,
        secs,
        total as f64 * per as f64 / secs.max(1e-9) / 1e6
    );
    let out = print_steps(&steps);
    if let Some(p) = &a.out {
        write_file(p, &out)?;
        println!("stagesim discover: wrote {}", p.display());
    }
    if let Some(p) = &a.json {
        let v = serde_json::json!({
            "trace": a.trace.display().to_string(),
            "trace_instrs": trace.instrs,
            "prefix_pct": a.prefix_pct,
            "prefix_instrs": per,
            "policy": policy.name(),
            "cores": a.cores,
            "slice": a.slice,
            "migration_cycles": a.migration_cycles,
            "objective": objective_name,
            "warmup_pct": a.warmup_pct,
            "seconds": secs,
            "steps": steps,
        });
        write_file(p, &serde_json::to_string_pretty(&v)?)?;
        println!("stagesim discover: wrote {}", p.display());
    }
    Ok(())
}

/// Prints one row per step; returns the `K<TAB>SPEC` lines of `--out`.
fn print_steps(steps: &[Step]) -> String {
    println!(
        "{:>3} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5} {:>5}  grouping",
        "k",
        "score",
        "CPI",
        "L1i-MPKI",
        "L2i-MPKI",
        "L1d-MPKI",
        "L2d-MPKI",
        "migr/kI",
        "util",
        "tput"
    );
    let mut out = String::new();
    for s in steps {
        let t = &s.result.total;
        println!(
            "{:>3} {:>8.4} {:>6.3} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7.3} {:>5.2} {:>5.2}  {}",
            s.k,
            s.score,
            if t.ipc > 0.0 { 1.0 / t.ipc } else { 0.0 },
            t.l1i_mpki,
            t.l2i_mpki,
            t.l1d_mpki,
            t.l2d_mpki,
            t.migrations_pki,
            s.result.utilization,
            s.result.throughput_ipc,
            s.spec
        );
        out.push_str(&format!("{}\t{}\n", s.k, s.spec));
    }
    out
}
