//! `stagesim replay`: checks the options, expands them into one
//! [`SimConfig`] per replay (the cross product of cores, slices, policies
//! and the staged policies' variants), runs the replays on `--jobs`
//! threads, prints the tables and writes the JSON [`Report`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context as _};
use host_sched::config::{Budget, Config};

use stagesim::discover::points::apply_map;
use stagesim::groups::StageGroups;
use stagesim::report::{self, Report};
use stagesim::sim::{
    self, default_budgets, BlockRule, SimConfig, SimPolicy, SimResult, VisitPolicy, VisitRule,
};
use stagesim::stagemap::StageMapFile;
use stagesim::stream::Trace;

use super::batch::TraceCache;
use super::{progress_bar, write_file};
use crate::cli::args::ReplayArgs;

/// Budgets for the trace's stages on `n` cores from a host-sched TOML file:
/// `[[stage]]` entries matched by name (min_cores, max_cores capped at `n`,
/// weight); stages without an entry get min 0, max `n`, weight 1.
fn budgets_for(cfg: &Config, groups: &StageGroups, n: usize) -> anyhow::Result<Vec<Budget>> {
    for s in &cfg.stages {
        if !groups.names.contains(&s.name) {
            bail!(
                "--budgets: stage '{}' is not a stage (group) of the replay: {}",
                s.name,
                groups.names.join(",")
            );
        }
    }
    Ok(groups
        .names
        .iter()
        .map(|t| match cfg.stages.iter().find(|s| s.name == *t) {
            Some(s) => Budget {
                name: t.clone(),
                min_cores: s.min_cores.min(n),
                max_cores: s.max_cores.unwrap_or(n).min(n),
                weight: s.weight,
            },
            None => sim::default_budget(t, n),
        })
        .collect())
}

/// Parses a comma-separated list of `off`/`on` words of option `--flag`.
fn modes(flag: &str, arg: &str, off: &str, on: &str) -> anyhow::Result<Vec<bool>> {
    arg.split(',')
        .map(|w| match w.trim() {
            x if x == off => Ok(false),
            x if x == on => Ok(true),
            other => bail!("--{flag} '{other}': {off} or {on}"),
        })
        .collect()
}

/// The replay options after checking, with the loaded trace.
struct Plan {
    policies: Vec<SimPolicy>,
    budget_cfg: Option<Config>,
    trace: Arc<Trace>,
    visit_rule: VisitRule,
    groupings: Vec<StageGroups>,
    weight_modes: Vec<bool>,
    steal_modes: Vec<bool>,
    /// `--visit`: the visit policies.
    visits: Vec<VisitPolicy>,
    /// The trace stage threads block at (`--block-at`), if it has it.
    block_stage: Option<usize>,
}

/// `trace` re-marked by the stage-map file at `path` (`--stage-map`), and
/// the grouping that merges the request marker into the file's request stage.
fn remark(
    a: &ReplayArgs,
    path: &std::path::Path,
    trace: &Trace,
) -> anyhow::Result<(Trace, String)> {
    anyhow::ensure!(
        a.stage_groups.iter().all(|g| g.trim() == "-"),
        "--stage-groups and --stage-map exclude each other"
    );
    let binary = a
        .binary
        .as_ref()
        .context("--stage-map needs --binary (the traced ELF binary)")?;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--stage-map {}", path.display()))?;
    let map =
        StageMapFile::parse(&text).with_context(|| format!("--stage-map {}", path.display()))?;
    let sidecar = super::read_sidecar(&a.trace, a.sidecar.as_deref())?;
    let (syms, _) = super::binary_symbols(binary, a.text_bias.as_deref(), &sidecar)?;
    let marker = super::marker_stage(trace, &a.block_at, "--stage-map")?;
    apply_map(trace, &map, &syms, marker).with_context(|| format!("--stage-map {}", path.display()))
}

/// Checks the options of `a` and loads the trace (through `cache`).
fn plan(a: &ReplayArgs, cache: &mut TraceCache) -> anyhow::Result<Plan> {
    let policies: Vec<SimPolicy> = a
        .policy
        .split(',')
        .map(|p| {
            SimPolicy::parse(p.trim()).with_context(|| {
                format!("--policy '{p}': unknown (baseline, captured, pinned, static, proportional, auto)")
            })
        })
        .collect::<anyhow::Result<_>>()?;
    for &n in &a.cores {
        if !(1..=64).contains(&n) {
            bail!("--cores {n}: must be 1..=64");
        }
    }
    if a.slice.contains(&0) {
        bail!("--slice 0: must be ≥ 1 instruction");
    }
    a.model.hierarchy()?;
    let budget_cfg = match &a.budgets {
        Some(p) => Some(Config::load(p)?),
        None => None,
    };
    let mut trace = cache.get(&a.trace, a.sidecar.as_deref())?;
    anyhow::ensure!(trace.instrs > 0, "{}: no instructions", a.trace.display());
    let mut stage_groups = a.stage_groups.clone();
    if let Some(path) = &a.stage_map {
        let base = trace.clone();
        let (t, spec) = cache.remarked(&a.trace, a.sidecar.as_deref(), path, || {
            remark(a, path, &base)
        })?;
        trace = t;
        stage_groups = vec![spec];
    }
    let visit_rule = VisitRule::parse(&a.visit_rule)
        .with_context(|| format!("--visit-rule '{}': oracle or history", a.visit_rule))?;
    anyhow::ensure!(
        (0.0..1.0).contains(&a.slice_jitter),
        "--slice-jitter {}: must be in [0, 1)",
        a.slice_jitter
    );
    let block_stage = match a.block_at.as_str() {
        "-" => None,
        name => {
            let s = trace.stages.iter().position(|s| s.name == name);
            if s.is_none() {
                eprintln!(
                    "stagesim: note: {} has no stage '{name}' (--block-at): its threads never block",
                    a.trace.display()
                );
            }
            s
        }
    };
    let groupings: Vec<StageGroups> = stage_groups
        .iter()
        .map(|g| StageGroups::parse(g, &trace.stages))
        .collect::<anyhow::Result<_>>()?;
    Ok(Plan {
        policies,
        budget_cfg,
        visit_rule,
        groupings,
        weight_modes: modes("static-weights", &a.static_weights, "equal", "load")?,
        steal_modes: modes("steal", &a.steal, "off", "on")?,
        visits: a
            .visit
            .split(',')
            .map(|v| {
                VisitPolicy::parse(v.trim()).with_context(|| {
                    format!("--visit '{v}': fifo, cohort, srpt, dbr, mg1 or color")
                })
            })
            .collect::<anyhow::Result<_>>()?,
        block_stage,
        trace,
    })
}

/// One config per replay: per (cores, slice, policy), one replay for
/// baseline and pinned, and for the staged policies one per (grouping,
/// migration cost, min-visit, steal, static weights).
fn configs(a: &ReplayArgs, p: &Plan) -> anyhow::Result<Vec<SimConfig>> {
    let caches = a.model.hierarchy()?;
    let model = a.model.cycle_model();
    let per_stage = stagesim::analysis::stage_instrs(&p.trace);
    // Staged-policy variants: (grouping, migration cost, min-visit, steal).
    let mut variants = Vec::new();
    for g in &p.groupings {
        for &cost in &a.migration_cycles {
            for &mv in &a.min_visit {
                for &st in &p.steal_modes {
                    variants.push((g, cost, mv, st));
                }
            }
        }
    }
    let mut configs = Vec::new();
    for &n in &a.cores {
        for &slice in &a.slice {
            for &pol in &p.policies {
                let base = |g: &StageGroups| -> anyhow::Result<SimConfig> {
                    let mut c = SimConfig::new(pol, n, slice);
                    c.warmup_pct = a.warmup_pct;
                    c.period = a.period;
                    c.caches = caches;
                    c.model = model;
                    c.smoothing = a.smoothing;
                    c.hysteresis = a.hysteresis;
                    c.visit_rule = p.visit_rule;
                    c.limit = a.instrs;
                    c.slice_jitter = a.slice_jitter;
                    c.seed = a.seed;
                    c.repeat = a.repeat;
                    c.block = p.block_stage.map(|s| BlockRule {
                        stage: s,
                        think_cycles: a.think_cycles,
                    });
                    c.groups = Some(g.clone());
                    if let Some(b) = &p.budget_cfg {
                        c.budgets = Some(budgets_for(b, g, n)?);
                    }
                    Ok(c)
                };
                if pol == SimPolicy::Captured {
                    // The captured schedule: one replay on one core, whatever
                    // the core counts and slices asked for.
                    if n == a.cores[0] && slice == a.slice[0] {
                        let mut c = base(&p.groupings[0])?;
                        c.cores = 1;
                        c.migration_cycles = 0;
                        c.block = None;
                        c.repeat = 1;
                        configs.push(c);
                    }
                    continue;
                }
                if pol == SimPolicy::Baseline {
                    // baseline never migrates: one replay whatever the
                    // grouping, migration cost, min-visit, steal or visit.
                    let mut c = base(&p.groupings[0])?;
                    c.migration_cycles = 0;
                    configs.push(c);
                    continue;
                }
                if pol == SimPolicy::Pinned {
                    // pinned never migrates: one replay per steal mode and
                    // visit policy (per grouping and switch cost when
                    // temporal: the groups are the stages it orders).
                    for &st in &p.steal_modes {
                        for &v in &p.visits {
                            let gs = if v.is_temporal() {
                                &p.groupings[..]
                            } else {
                                &p.groupings[..1]
                            };
                            for g in gs {
                                for &sw in switch_costs(a, v) {
                                    let mut c = base(g)?;
                                    c.migration_cycles = 0;
                                    c.steal = st;
                                    c.visit = v;
                                    c.switch_cycles = sw;
                                    configs.push(c);
                                }
                            }
                        }
                    }
                    continue;
                }
                let weights = if pol == SimPolicy::Static {
                    &p.weight_modes[..]
                } else {
                    &[false][..]
                };
                for &(g, cost, mv, st) in &variants {
                    for (&lw, &v) in weights
                        .iter()
                        .flat_map(|w| p.visits.iter().map(move |v| (w, v)))
                    {
                        for &sw in switch_costs(a, v) {
                            let mut c = base(g)?;
                            c.migration_cycles = cost;
                            c.migration_target_cycles = a.migration_target_cycles;
                            c.migration_latency = a.migration_latency;
                            c.min_visit = mv;
                            c.steal = st;
                            c.visit = v;
                            c.switch_cycles = sw;
                            c.auto_twin = a.auto_twin;
                            if lw {
                                let w = stagesim::analysis::load_weights(&per_stage, g);
                                let mut b = c
                                    .budgets
                                    .take()
                                    .unwrap_or_else(|| default_budgets(&g.names, n));
                                for (b, w) in b.iter_mut().zip(w) {
                                    b.weight = w;
                                }
                                c.budgets = Some(b);
                                c.load_weights = true;
                            }
                            configs.push(c);
                        }
                    }
                }
            }
        }
    }
    Ok(configs)
}

/// The switch costs replayed under visit policy `v`: `--switch-cycles`
/// when it is temporal, else one (unused) cost.
fn switch_costs(a: &ReplayArgs, v: VisitPolicy) -> &[u64] {
    if v.is_temporal() {
        &a.switch_cycles
    } else {
        &a.switch_cycles[..1]
    }
}

/// Runs every replay of `configs` on `jobs` threads; results in order.
fn run_all(trace: &Trace, configs: &[SimConfig], jobs: usize) -> anyhow::Result<Vec<SimResult>> {
    let pb = progress_bar(
        trace.instrs * configs.len() as u64,
        "{bar:40} {percent:>3}% {msg} [{elapsed} < {eta}] {per_sec}",
    );
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<SimResult>>> = Mutex::new(vec![None; configs.len()]);
    let failure: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, configs.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = configs.get(i) else { break };
                pb.set_message(format!(
                    "{} cores={} slice={} migr={}",
                    c.label(),
                    c.cores,
                    c.slice,
                    c.migration_cycles
                ));
                let pb2 = pb.clone();
                match sim::simulate(trace, c, &mut |d| pb2.inc(d)) {
                    Ok(r) => {
                        if let Ok(mut v) = results.lock() {
                            v[i] = Some(r);
                        }
                    }
                    Err(e) => {
                        if let Ok(mut f) = failure.lock() {
                            *f = Some(e);
                        }
                        break;
                    }
                }
            });
        }
    });
    pb.finish_and_clear();
    if let Some(e) = failure.into_inner().ok().flatten() {
        return Err(e);
    }
    Ok(results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a replay thread panicked"))?
        .into_iter()
        .flatten()
        .collect())
}

/// `stagesim replay`.
pub fn replay(a: ReplayArgs) -> anyhow::Result<()> {
    replay_with(a, &mut TraceCache::default())
}

/// `stagesim replay` on the traces of `cache` (`replay-batch`).
pub fn replay_with(a: ReplayArgs, cache: &mut TraceCache) -> anyhow::Result<()> {
    let p = plan(&a, cache)?;
    let configs = configs(&a, &p)?;
    let trace = &p.trace;
    eprintln!(
        "stagesim: {} replays of {} instructions ({} threads); warm-up: first {} % of instructions excluded; {} job(s)",
        configs.len(),
        trace.instrs,
        trace.threads.len(),
        a.warmup_pct,
        a.jobs.max(1)
    );
    let wall = Instant::now();
    let results = run_all(trace, &configs, a.jobs)?;
    let wall = wall.elapsed().as_secs_f64();
    print_results(&a, &p, &results, wall);
    if let Some(path) = &a.json {
        let rep = Report {
            trace: a.trace.display().to_string(),
            trace_instrs: trace.instrs,
            threads: trace.threads.len(),
            stages: trace.stages.iter().map(|s| s.name.clone()).collect(),
            warmup_pct: a.warmup_pct,
            period: a.period,
            migration_cycles: a.migration_cycles.clone(),
            groupings: p.groupings.clone(),
            min_visit: a.min_visit.clone(),
            visit_rule: p.visit_rule.name().to_string(),
            caches: a.model.hierarchy()?,
            model: a.model.cycle_model(),
            results,
        };
        write_file(path, &serde_json::to_string_pretty(&rep)?)?;
        println!("stagesim: wrote {}", path.display());
    }
    Ok(())
}

/// The header, the comparison table, the details (`--detail`) and the
/// replay speed.
fn print_results(a: &ReplayArgs, p: &Plan, results: &[SimResult], wall: f64) {
    let trace = &p.trace;
    println!(
        "stagesim: {} ({} instructions, {} threads, stages: {}); warm-up {} % excluded; L1i {} L1d {} L2 {} L3 {} (KiB:ways, {} B lines); migration {:?} cycles",
        a.trace.display(),
        trace.instrs,
        trace.threads.len(),
        trace
            .stages
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(","),
        a.warmup_pct,
        a.model.l1i,
        a.model.l1d,
        a.model.l2,
        a.model.l3,
        a.model.line,
        a.migration_cycles
    );
    for g in &p.groupings {
        println!("  grouping {}: {}", g.label(), g.full_spec());
    }
    print!("{}", report::table(results));
    if a.detail {
        for r in results {
            print!("{}", report::detail(r));
        }
    }
    let replayed: f64 = results.len() as f64 * trace.instrs as f64;
    let busy: f64 = results.iter().map(|r| r.replay_seconds).sum();
    let slowest = results
        .iter()
        .map(|r| r.replay_mips)
        .fold(f64::INFINITY, f64::min);
    println!(
        "stagesim: replay speed {:.1} M instr/s per replay (single-threaded; slowest replay {:.1} M instr/s), {:.0} M instructions in {:.1} s wall with {} job(s)",
        replayed / busy.max(1e-9) / 1e6,
        slowest,
        replayed / 1e6,
        wall,
        a.jobs.max(1)
    );
}
