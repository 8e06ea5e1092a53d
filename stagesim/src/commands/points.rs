//! `stagesim discover --binary`: seed 004's request-level discovery
//! ([`stagesim::discover::split`]) with a progress bar, the census and the
//! chosen points printed, and the stage-map files and JSON written.

use std::time::Instant;

use anyhow::Context as _;

use stagesim::discover::points::census;
use stagesim::discover::split::{self, Limits, Outcome};
use stagesim::discover::Objective;
use stagesim::sim::SimPolicy;

use super::discover::base_config;
use super::{load, progress_bar, read_sidecar, write_file};
use crate::cli::args::DiscoverArgs;

/// `n` choose `k`.
fn choose(n: usize, k: usize) -> usize {
    if k > n {
        return 0;
    }
    (0..k).fold(1usize, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

/// A symbol shortened for a table column.
fn short(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

/// `stagesim discover --binary`.
pub fn discover_points(a: DiscoverArgs) -> anyhow::Result<()> {
    let binary = a.binary.clone().context("--binary")?;
    let (policy, visit) = super::discover::candidate_policy(&a)?;
    let objective_name = a.objective.clone().unwrap_or_else(|| "tput".into());
    let objective = Objective::parse(&objective_name)
        .with_context(|| format!("--objective '{objective_name}': cpi, l2 or tput"))?;
    anyhow::ensure!(
        (0.0..=100.0).contains(&a.min_present_pct) && (0.0..=100.0).contains(&a.max_repeat_pct),
        "--min-present-pct {} / --max-repeat-pct {}: must be in [0, 100]",
        a.min_present_pct,
        a.max_repeat_pct
    );
    anyhow::ensure!(
        (2..=stagesim::stagemap::MAX_STAGES).contains(&a.max_parts),
        "--max-parts {}: must be 2..=16",
        a.max_parts
    );
    anyhow::ensure!(
        a.keep >= a.max_parts,
        "--keep {}: must be ≥ --max-parts",
        a.keep
    );
    let sidecar = read_sidecar(&a.trace, a.sidecar.as_deref())?;
    let (syms, bias) = super::binary_symbols(&binary, a.text_bias.as_deref(), &sidecar)?;
    let trace = load(&a.trace, a.sidecar.as_deref())?;
    let marker = super::marker_stage(&trace, &a.block_at, "request-level discovery")?;
    let t0 = Instant::now();
    let c = census(
        &trace,
        &syms,
        marker,
        a.min_present_pct / 100.0,
        a.max_repeat_pct / 100.0,
    )?;
    println!(
        "stagesim discover: {}: {} requests of {:.0} instructions on average; {} functions of {} ({} symbols, bias {:#x}) called in them; {} called at most {} in ≥ {} % of requests ({:.1} s)",
        a.trace.display(),
        c.requests,
        c.request_instrs,
        c.functions,
        binary.display(),
        syms.len(),
        bias,
        c.candidates.len(),
        if a.max_repeat_pct == 0.0 { "once".to_string() } else { format!("once (repeats in ≤ {} %)", a.max_repeat_pct) },
        a.min_present_pct,
        t0.elapsed().as_secs_f64()
    );
    println!(
        "{:>4} {:>8} {:>8} {:>8}  function",
        "#", "present", "repeat", "offset"
    );
    for (i, x) in c.candidates.iter().enumerate() {
        println!(
            "{:>4} {:>7.1}% {:>7.1}% {:>8.3}  {}",
            i,
            x.present * 100.0,
            x.repeated * 100.0,
            x.offset,
            short(&x.name, 100)
        );
    }
    let m = c.candidates.len();
    let keep = a.keep.min(m);
    // At most: one screening replay per 1 % of the request, then every
    // choice (unbalanced ones are skipped, so the bar may end early).
    let screening = if m > a.keep { (m - 1).min(100) } else { 0 };
    let total = screening + (2..=a.max_parts).map(|n| choose(keep, n)).sum::<usize>();
    let mut cfg = base_config(&a, policy)?;
    cfg.load_weights = match a.static_weights.as_str() {
        "load" => policy == SimPolicy::Static,
        "equal" => false,
        other => anyhow::bail!("--static-weights '{other}': equal or load"),
    };
    eprintln!(
        "stagesim discover: ≤ {} replays: ≤ {} screening ({} % of every thread), then every choice of N = 2..={} among {} kept whose stages hold ≥ {} % of a request ({} % of every thread; {} at {} cores, migration {}+{} cycles CPU, {} latency, transfer {} cycles, score {})",
        total,
        screening,
        a.screen_pct,
        a.max_parts,
        keep,
        a.min_stage_pct,
        a.prefix_pct,
        policy.name(),
        a.cores,
        a.migration_cycles,
        a.migration_target_cycles,
        a.migration_latency,
        cfg.model.transfer,
        objective_name
    );
    let pb = progress_bar(
        total as u64,
        "{bar:40} {pos}/{len} {msg} [{elapsed} < {eta}]",
    );
    let lim = Limits {
        keep: a.keep,
        parts: 2..=a.max_parts,
        min_stage: a.min_stage_pct / 100.0,
        screen_prefix: a.screen_pct / 100.0,
    };
    let t1 = Instant::now();
    let out = split::search(
        &trace,
        marker,
        c,
        &cfg,
        objective,
        &lim,
        &mut |what, i, n| {
            pb.set_message(format!("{what}: {i}/{n}"));
            pb.inc(1);
        },
    )?;
    pb.finish_and_clear();
    let secs = t1.elapsed().as_secs_f64();
    let per = out.choices.first().map_or(0, |ch| {
        ch.result.warmup_instrs + ch.result.total.counters.instrs
    });
    let tried: usize = out.choices.iter().map(|c| c.tried).sum();
    println!(
        "stagesim discover: {} screening replays, {tried} choices of {per} instructions, {secs:.1} s in all; kept {:?}",
        out.screened.len(),
        out.kept
    );
    print_choices(&out);
    let request_symbols: Vec<String> = sidecar
        .stages
        .iter()
        .find(|s| s.name == a.block_at)
        .map(|s| s.symbols.clone())
        .unwrap_or_default();
    println!(
        "stagesim discover: the trace's own map: {:.1} visits per request, {:.0} instructions per visit",
        out.own_visits_per_request,
        out.census.request_instrs / out.own_visits_per_request.max(1e-9)
    );
    if let Some(prefix) = &a.map_out {
        let best_n = out.best().map(|b| b.parts);
        for ch in &out.choices {
            let map = out.map_file(
                ch,
                Some(binary.display().to_string()),
                request_symbols.clone(),
            );
            let p = prefix.with_file_name(format!(
                "{}-{}.stagemap",
                prefix
                    .file_name()
                    .map_or("map".into(), |f| f.to_string_lossy()),
                ch.parts
            ));
            let comment = vec![
                format!(
                    "stagesim discover --binary (seed 004 §3.1), issue 25: {} stages{}",
                    ch.parts,
                    if visit.is_temporal() {
                        format!(
                            "; scored by the temporal replay (issue 40: {} visit {}, switch {} cycles)",
                            policy.name(),
                            visit.name(),
                            a.switch_cycles
                        )
                    } else {
                        String::new()
                    }
                ),
                format!("trace {}", a.trace.display()),
                format!(
                    "{:.1} visits per request, {:.0} instructions per visit; score {:.4} ({})",
                    ch.visits_per_request, ch.mean_visit, ch.score, objective_name
                ),
            ];
            write_file(&p, &map.to_text(&comment))?;
            println!("stagesim discover: wrote {}", p.display());
            if Some(ch.parts) == best_n {
                let best = p.with_file_name(format!(
                    "{}-best.stagemap",
                    prefix
                        .file_name()
                        .map_or("map".into(), |f| f.to_string_lossy())
                ));
                write_file(&best, &map.to_text(&comment))?;
                println!(
                    "stagesim discover: wrote {} (the best score)",
                    best.display()
                );
            }
        }
    }
    if let Some(p) = &a.json {
        let v = serde_json::json!({
            "trace": a.trace.display().to_string(),
            "binary": binary.display().to_string(),
            "text_bias": bias,
            "request_marker": a.block_at,
            "prefix_pct": a.prefix_pct,
            "policy": policy.name(),
            "visit": visit.name(),
            "switch_cycles": a.switch_cycles,
            "cores": a.cores,
            "migration_cycles": a.migration_cycles,
            "migration_target_cycles": a.migration_target_cycles,
            "migration_latency": a.migration_latency,
            "transfer_cycles": cfg.model.transfer,
            "objective": objective_name,
            "seconds": secs,
            "outcome": out,
        });
        write_file(p, &serde_json::to_string_pretty(&v)?)?;
        println!("stagesim discover: wrote {}", p.display());
    }
    Ok(())
}

/// One row per N: the chosen points, score, misses and visits.
fn print_choices(out: &Outcome) {
    println!(
        "{:>2} {:>8} {:>6} {:>8} {:>8} {:>9} {:>9} {:>5}  points",
        "N", "score", "CPI", "L2i-MPKI", "migr/kI", "visits/rq", "instr/vis", "tried"
    );
    for ch in &out.choices {
        let t = &ch.result.total;
        let names: Vec<String> = ch
            .points
            .iter()
            .map(|&i| short(&out.census.candidates[i].name, 48))
            .collect();
        println!(
            "{:>2} {:>8.4} {:>6.3} {:>8.2} {:>8.3} {:>9.1} {:>9.0} {:>5}  {}",
            ch.parts,
            ch.score,
            if t.ipc > 0.0 { 1.0 / t.ipc } else { 0.0 },
            t.l2i_mpki,
            t.migrations_pki,
            ch.visits_per_request,
            ch.mean_visit,
            ch.tried,
            names.join(" | ")
        );
    }
}
