//! `stagesim`: replay stagetrace v1 traces on simulated cores under each
//! scheduling policy, write synthetic traces, plot results.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use host_sched::config::Budget;
use indicatif::{ProgressBar, ProgressStyle};

use stagesim::cache::{Geometry, Hierarchy};
use stagesim::report::{self, Report};
use stagesim::sim::{self, CycleModel, SimConfig, SimPolicy, SimResult};
use stagesim::stream::Trace;
use stagesim::synth::{self, SynthConfig};

#[derive(Parser)]
#[command(
    name = "stagesim",
    about = "Trace-driven multi-core cache simulator: replays stagetrace v1 traces under baseline, pinned and the host-sched stage policies"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Replay a trace under each (policy, cores, slice) and print a comparison table.
    Replay(Box<ReplayArgs>),
    /// Write a synthetic trace (and its .stages.toml sidecar).
    Synth(SynthArgs),
    /// Write PNG plots (MPKI and throughput per policy and core count) from a replay's JSON.
    Plot(PlotArgs),
    /// Summarise a trace: threads, instructions, stages.
    Info {
        /// Trace file (zstd stagetrace v1).
        #[arg(long)]
        trace: PathBuf,
        /// Stage sidecar to use instead of `<trace>.stages.toml`.
        #[arg(long)]
        sidecar: Option<PathBuf>,
    },
}

fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|_| format!("'{x}' is not valid"))
        })
        .collect()
}

/// `KIB:WAYS`, e.g. `512:8`.
fn geometry(s: &str, line: u32) -> anyhow::Result<Geometry> {
    let (kib, ways) = s
        .split_once(':')
        .with_context(|| format!("'{s}': expected KIB:WAYS, e.g. 512:8"))?;
    Ok(Geometry::kib(
        kib.parse().with_context(|| format!("'{s}': bad KiB"))?,
        ways.parse().with_context(|| format!("'{s}': bad ways"))?,
        line,
    ))
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// Trace file (zstd stagetrace v1); its sidecar `<trace>.stages.toml` names the stages.
    #[arg(long)]
    trace: PathBuf,
    /// Stage sidecar to use instead of `<trace>.stages.toml`.
    #[arg(long)]
    sidecar: Option<PathBuf>,
    /// Simulated core counts (1..=64), comma-separated.
    #[arg(long, default_value = "2,4,8,16", value_parser = list::<usize>)]
    cores: std::vec::Vec<usize>,
    /// Scheduling models: baseline, pinned, static, proportional.
    #[arg(long, default_value = "baseline,pinned,static,proportional")]
    policy: String,
    /// Time slices in instructions, comma-separated.
    #[arg(long, default_value = "10000,100000,1000000", value_parser = list::<u64>)]
    slice: std::vec::Vec<u64>,
    /// Warm-up prefix excluded from statistics, % of the trace's instructions (replay order).
    #[arg(long, default_value_t = 10.0)]
    warmup_pct: f64,
    /// Policy period in instructions per core (static, proportional).
    #[arg(long, default_value_t = 1_000_000)]
    period: u64,
    /// Cost of one thread migration, cycles.
    #[arg(long, default_value_t = 4000)]
    migration_cycles: u64,
    /// host-sched stage budgets (its TOML; `[[stage]]` entries matched by name; other sections ignored).
    #[arg(long)]
    budgets: Option<PathBuf>,
    /// EWMA weight of the newest load sample (proportional).
    #[arg(long, default_value_t = 0.7)]
    smoothing: f64,
    /// Hysteresis in cores (proportional).
    #[arg(long, default_value_t = 0.1)]
    hysteresis: f64,
    /// Cache line size in bytes (all levels).
    #[arg(long, default_value_t = 64)]
    line: u32,
    /// Per-core L1i as KIB:WAYS.
    #[arg(long, default_value = "32:8")]
    l1i: String,
    /// Per-core L1d as KIB:WAYS.
    #[arg(long, default_value = "32:8")]
    l1d: String,
    /// Per-core private L2 as KIB:WAYS.
    #[arg(long, default_value = "512:8")]
    l2: String,
    /// Shared L3 as KIB:WAYS, or `none`.
    #[arg(long, default_value = "none")]
    l3: String,
    /// Cycles per instruction with all-L1 hits.
    #[arg(long, default_value_t = 0.5)]
    base_cpi: f64,
    /// Penalty of an L2 hit, cycles.
    #[arg(long, default_value_t = 14.0)]
    l2_cycles: f64,
    /// Penalty of an L2 miss served by L3 (or of any L2 miss without --l3), cycles.
    #[arg(long, default_value_t = 50.0)]
    l3_cycles: f64,
    /// Penalty of an L3 miss, cycles.
    #[arg(long, default_value_t = 200.0)]
    mem_cycles: f64,
    /// Factor on data-miss penalties.
    #[arg(long, default_value_t = 1.0)]
    data_penalty_scale: f64,
    /// Write the full report (per core, per stage) as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Print per-core and per-stage breakdowns.
    #[arg(long)]
    detail: bool,
    /// Replays to run in parallel (each replay is single-threaded).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
}

#[derive(clap::Args)]
struct SynthArgs {
    /// Output trace file.
    #[arg(long)]
    out: PathBuf,
    /// Threads (connections).
    #[arg(long, default_value_t = SynthConfig::default().threads)]
    threads: u32,
    /// Stages per request.
    #[arg(long, default_value_t = SynthConfig::default().stages)]
    stages: u16,
    /// Code per stage, KiB.
    #[arg(long, default_value_t = SynthConfig::default().stage_kib)]
    stage_kib: u64,
    /// Code outside stages, KiB.
    #[arg(long, default_value_t = SynthConfig::default().common_kib)]
    common_kib: u64,
    /// Requests per thread.
    #[arg(long, default_value_t = SynthConfig::default().requests)]
    requests: u32,
    /// Instructions per stage visit (±25 %).
    #[arg(long, default_value_t = SynthConfig::default().visit_instrs)]
    visit_instrs: u64,
    /// Per-stage factors on --visit-instrs, comma-separated (e.g. 3,1: the first stage carries 3× the load).
    #[arg(long, value_parser = list::<f64>)]
    visit_weights: Option<std::vec::Vec<f64>>,
    /// Shared heap, KiB.
    #[arg(long, default_value_t = SynthConfig::default().heap_kib)]
    heap_kib: u64,
    /// Per-thread stack, KiB.
    #[arg(long, default_value_t = SynthConfig::default().stack_kib)]
    stack_kib: u64,
    /// Probability of a data access per basic block.
    #[arg(long, default_value_t = SynthConfig::default().data_per_block)]
    data_per_block: f64,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(clap::Args)]
struct PlotArgs {
    /// JSON written by `replay --json`.
    #[arg(long)]
    json: PathBuf,
    /// Output directory.
    #[arg(long)]
    out_dir: PathBuf,
    /// File name prefix (default: the JSON file's stem).
    #[arg(long)]
    prefix: Option<String>,
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("stagesim: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Replay(a) => replay(*a),
        Cmd::Synth(a) => {
            let cfg = SynthConfig {
                threads: a.threads,
                stages: a.stages,
                stage_kib: a.stage_kib,
                common_kib: a.common_kib,
                requests: a.requests,
                visit_instrs: a.visit_instrs,
                visit_weights: a.visit_weights.unwrap_or_default(),
                heap_kib: a.heap_kib,
                stack_kib: a.stack_kib,
                data_per_block: a.data_per_block,
                seed: a.seed,
            };
            let t0 = Instant::now();
            let s = synth::write(&a.out, &cfg)?;
            println!(
                "stagesim synth: {} ({} threads, {} stages × {} KiB): {} instructions, {} records, {:.1} MB raw, {:.1} MB compressed, {:.1} s",
                a.out.display(),
                cfg.threads,
                cfg.stages,
                cfg.stage_kib,
                s.instrs,
                s.records,
                s.raw_bytes as f64 / 1e6,
                std::fs::metadata(&a.out)?.len() as f64 / 1e6,
                t0.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Cmd::Plot(a) => {
            let text = std::fs::read_to_string(&a.json)
                .with_context(|| format!("{}", a.json.display()))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{}", a.json.display()))?;
            let prefix = a.prefix.unwrap_or_else(|| {
                a.json
                    .file_stem()
                    .map_or("stagesim".into(), |s| s.to_string_lossy().into_owned())
            });
            for p in stagesim::plot::plot_report(&v, &a.out_dir, &prefix)? {
                println!("stagesim plot: wrote {}", p.display());
            }
            Ok(())
        }
        Cmd::Info { trace, sidecar } => {
            let t = load(&trace, sidecar.as_deref())?;
            println!(
                "{}: {} instructions, {} records, {} threads, {:.1} MB decompressed, {:.1} MB in memory",
                trace.display(),
                t.instrs,
                t.records,
                t.threads.len(),
                t.raw_bytes as f64 / 1e6,
                t.memory_bytes() as f64 / 1e6
            );
            for s in &t.stages {
                println!("  stage id {:>5} {}", s.id, s.name);
            }
            for th in &t.threads {
                println!(
                    "  thread {:>8}: {:>12} instructions, {:>10} events",
                    th.tid,
                    th.instrs,
                    th.events.len()
                );
            }
            Ok(())
        }
    }
}

fn load(path: &Path, sidecar: Option<&Path>) -> anyhow::Result<Trace> {
    let t0 = Instant::now();
    let size = std::fs::metadata(path)
        .with_context(|| format!("{}", path.display()))?
        .len();
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("loading {msg} {bytes} decompressed [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(path.display().to_string());
    let sidecar = match sidecar {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("--sidecar {}", p.display()))?;
            stagesim::trace::Sidecar::parse(&text, &p.display().to_string())?
        }
        None => stagesim::trace::Sidecar::load_for(path)?.unwrap_or_default(),
    };
    let reader = stagesim::trace::RecordReader::open(path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let t = Trace::from_reader(reader, &sidecar, |off| pb.set_position(off))
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    pb.finish_and_clear();
    eprintln!(
        "stagesim: loaded {} ({:.1} MB compressed) in {:.1} s: {} instructions, {} threads, {} stages, {:.0} MB of events",
        path.display(),
        size as f64 / 1e6,
        t0.elapsed().as_secs_f64(),
        t.instrs,
        t.threads.len(),
        t.stages.len(),
        t.memory_bytes() as f64 / 1e6
    );
    Ok(t)
}

/// Budgets for the trace's stages on `n` cores from a host-sched TOML file:
/// `[[stage]]` entries matched by name (min_cores, max_cores capped at `n`,
/// weight); stages without an entry get min 0, max `n`, weight 1.
fn budgets_for(
    cfg: &host_sched::config::Config,
    trace: &Trace,
    n: usize,
) -> anyhow::Result<Vec<Budget>> {
    for s in &cfg.stages {
        if !trace.stages.iter().any(|t| t.name == s.name) {
            bail!("--budgets: stage '{}' is not a stage of the trace", s.name);
        }
    }
    Ok(trace
        .stages
        .iter()
        .map(|t| match cfg.stages.iter().find(|s| s.name == t.name) {
            Some(s) => Budget {
                name: t.name.clone(),
                min_cores: s.min_cores.min(n),
                max_cores: s.max_cores.unwrap_or(n).min(n),
                weight: s.weight,
            },
            None => Budget {
                name: t.name.clone(),
                min_cores: 0,
                max_cores: n,
                weight: 1.0,
            },
        })
        .collect())
}

fn replay(a: ReplayArgs) -> anyhow::Result<()> {
    let policies: Vec<SimPolicy> = a
        .policy
        .split(',')
        .map(|p| {
            SimPolicy::parse(p.trim()).with_context(|| {
                format!("--policy '{p}': unknown (baseline, pinned, static, proportional)")
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
    let caches = Hierarchy {
        l1i: geometry(&a.l1i, a.line).context("--l1i")?,
        l1d: geometry(&a.l1d, a.line).context("--l1d")?,
        l2: geometry(&a.l2, a.line).context("--l2")?,
        l3: if a.l3 == "none" {
            None
        } else {
            Some(geometry(&a.l3, a.line).context("--l3")?)
        },
    };
    caches.validate()?;
    let model = CycleModel {
        base_cpi: a.base_cpi,
        l2_hit: a.l2_cycles,
        l3_hit: a.l3_cycles,
        memory: a.mem_cycles,
        data_penalty_scale: a.data_penalty_scale,
    };
    let budget_cfg = match &a.budgets {
        Some(p) => Some(host_sched::config::Config::load(p)?),
        None => None,
    };
    let trace = load(&a.trace, a.sidecar.as_deref())?;
    anyhow::ensure!(trace.instrs > 0, "{}: no instructions", a.trace.display());

    let mut configs = Vec::new();
    for &n in &a.cores {
        for &slice in &a.slice {
            for &p in &policies {
                let mut c = SimConfig::new(p, n, slice);
                c.warmup_pct = a.warmup_pct;
                c.period = a.period;
                c.migration_cycles = a.migration_cycles;
                c.caches = caches;
                c.model = model;
                c.smoothing = a.smoothing;
                c.hysteresis = a.hysteresis;
                if let Some(b) = &budget_cfg {
                    c.budgets = Some(budgets_for(b, &trace, n)?);
                }
                configs.push(c);
            }
        }
    }
    eprintln!(
        "stagesim: {} replays of {} instructions ({} threads); warm-up: first {} % of instructions excluded; {} job(s)",
        configs.len(),
        trace.instrs,
        trace.threads.len(),
        a.warmup_pct,
        a.jobs.max(1)
    );
    let pb = ProgressBar::new(trace.instrs * configs.len() as u64);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {percent:>3}% {msg} [{elapsed} < {eta}] {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let wall = Instant::now();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<SimResult>>> = Mutex::new(vec![None; configs.len()]);
    let failure: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..a.jobs.clamp(1, configs.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = configs.get(i) else { break };
                pb.set_message(format!(
                    "{} cores={} slice={}",
                    c.policy.name(),
                    c.cores,
                    c.slice
                ));
                let pb2 = pb.clone();
                match sim::simulate(&trace, c, &mut |d| pb2.inc(d)) {
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
    let results: Vec<SimResult> = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a replay thread panicked"))?
        .into_iter()
        .flatten()
        .collect();
    let wall = wall.elapsed().as_secs_f64();
    println!(
        "stagesim: {} ({} instructions, {} threads, stages: {}); warm-up {} % excluded; L1i {} L1d {} L2 {} L3 {} (KiB:ways, {} B lines); migration {} cycles",
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
        a.l1i,
        a.l1d,
        a.l2,
        a.l3,
        a.line,
        a.migration_cycles
    );
    print!("{}", report::table(&results));
    if a.detail {
        for r in &results {
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
    if let Some(path) = &a.json {
        let rep = Report {
            trace: a.trace.display().to_string(),
            trace_instrs: trace.instrs,
            threads: trace.threads.len(),
            stages: trace.stages.iter().map(|s| s.name.clone()).collect(),
            warmup_pct: a.warmup_pct,
            period: a.period,
            migration_cycles: a.migration_cycles,
            caches,
            model,
            results,
        };
        std::fs::write(path, serde_json::to_string_pretty(&rep)?)
            .with_context(|| format!("{}", path.display()))?;
        println!("stagesim: wrote {}", path.display());
    }
    Ok(())
}
