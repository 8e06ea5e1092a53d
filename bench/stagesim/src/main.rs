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
use stagesim::groups::StageGroups;
use stagesim::report::{self, Report};
use stagesim::sim::{self, CycleModel, SimConfig, SimPolicy, SimResult, VisitRule};
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
    /// Automatic stage discovery (seed 004's simulate-and-pick, at stage granularity): greedy merging of the trace's stages.
    Discover(Box<DiscoverArgs>),
    /// Per-stage (or per-group) visit lengths, code footprints, shared code and stage transitions.
    Stats {
        /// Trace file (zstd stagetrace v1).
        #[arg(long)]
        trace: PathBuf,
        /// Stage sidecar to use instead of `<trace>.stages.toml`.
        #[arg(long)]
        sidecar: Option<PathBuf>,
        /// Groupings to report (repeatable; `-` = the trace's own stages; syntax as for `replay`).
        #[arg(long = "stage-groups", default_value = "-")]
        stage_groups: Vec<String>,
        /// Cache line size for footprints, bytes.
        #[arg(long, default_value_t = 64)]
        line: u64,
        /// Also write the statistics as JSON (an array, one entry per grouping).
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Write the `bench/RESULTS.md` section (between the stagesim markers) from the JSON files of `just bench-sim`.
    Results {
        /// Folder with the JSON files (`<trace>.json`, `<trace>-sweep.json`, …, `commands.txt`, `env.txt`).
        #[arg(long, default_value = "target/stagesim")]
        dir: PathBuf,
        /// Trace names (file stems) in table order, comma-separated.
        #[arg(long, value_parser = list::<String>)]
        traces: std::vec::Vec<String>,
        /// The results file; only the text between its stagesim markers is replaced.
        #[arg(long, default_value = "bench/RESULTS.md")]
        out: PathBuf,
        /// Hand-written interpretation to include (markdown).
        #[arg(long)]
        notes: Option<PathBuf>,
        /// Checked-in plots folder (relative to the results file's folder: linked as stagesim/plots/NAME).
        #[arg(long, default_value = "bench/stagesim/plots")]
        plots: PathBuf,
        /// Print the section instead of writing it.
        #[arg(long)]
        print: bool,
    },
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

/// Cache geometry and cycle model (shared by `replay` and `discover`).
#[derive(clap::Args, Clone)]
struct ModelArgs {
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
}

impl ModelArgs {
    fn hierarchy(&self) -> anyhow::Result<Hierarchy> {
        let h = Hierarchy {
            l1i: geometry(&self.l1i, self.line).context("--l1i")?,
            l1d: geometry(&self.l1d, self.line).context("--l1d")?,
            l2: geometry(&self.l2, self.line).context("--l2")?,
            l3: if self.l3 == "none" {
                None
            } else {
                Some(geometry(&self.l3, self.line).context("--l3")?)
            },
        };
        h.validate()?;
        Ok(h)
    }

    fn cycle_model(&self) -> CycleModel {
        CycleModel {
            base_cpi: self.base_cpi,
            l2_hit: self.l2_cycles,
            l3_hit: self.l3_cycles,
            memory: self.mem_cycles,
            data_penalty_scale: self.data_penalty_scale,
        }
    }
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
    /// Replay only this many instructions (a prefix in replay order; the warm-up is --warmup-pct of it).
    #[arg(long)]
    instrs: Option<u64>,
    /// Cost of one thread migration, cycles; a comma-separated list sweeps it (staged policies only).
    #[arg(long, default_value = "4000", value_parser = list::<u64>)]
    migration_cycles: std::vec::Vec<u64>,
    /// Merge stages into coarser groups for the staged policies, e.g.
    /// `front=net_read,dispatch,parse;plan=open_lock,optimize;exec=execute,innodb;finish=commit,send`;
    /// `-` = the trace's own stages. Repeatable: each grouping is replayed. Unlisted stages stay alone.
    #[arg(long = "stage-groups", default_value = "-")]
    stage_groups: Vec<String>,
    /// Model variant, not host-sched: migrate only for stage visits expected to last at least this
    /// many instructions (comma-separated list; 0 = off, host-sched's behaviour).
    #[arg(long, default_value = "0", value_parser = list::<u64>)]
    min_visit: std::vec::Vec<u64>,
    /// How --min-visit knows a visit's length: `oracle` (read ahead in the trace; an upper bound)
    /// or `history` (the stage's mean past visit, online).
    #[arg(long, default_value = "oracle")]
    visit_rule: String,
    /// host-sched stage budgets (its TOML; `[[stage]]` entries matched by name; other sections ignored).
    #[arg(long)]
    budgets: Option<PathBuf>,
    /// Scheduling-model option for the staged policies: idle cores take queued threads whose
    /// current stage they serve (`off`, `on`, or `off,on` for both).
    #[arg(long, default_value = "off")]
    steal: String,
    /// Weights of the `static` policy: `equal` (host-sched's default without budgets) or `load`
    /// (each stage group's share of the trace's instructions, a profile); comma-separated to run both.
    #[arg(long, default_value = "equal")]
    static_weights: String,
    /// EWMA weight of the newest load sample (proportional).
    #[arg(long, default_value_t = 0.7)]
    smoothing: f64,
    /// Hysteresis in cores (proportional).
    #[arg(long, default_value_t = 0.1)]
    hysteresis: f64,
    #[command(flatten)]
    model: ModelArgs,
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
struct DiscoverArgs {
    /// Trace file (zstd stagetrace v1).
    #[arg(long)]
    trace: PathBuf,
    /// Stage sidecar to use instead of `<trace>.stages.toml`.
    #[arg(long)]
    sidecar: Option<PathBuf>,
    /// Simulated cores.
    #[arg(long, default_value_t = 4)]
    cores: usize,
    /// Time slice in instructions.
    #[arg(long, default_value_t = 100_000)]
    slice: u64,
    /// Staged policy the candidates are replayed under (static or proportional).
    #[arg(long, default_value = "static")]
    policy: String,
    /// Cost of one thread migration, cycles.
    #[arg(long, default_value_t = 4000)]
    migration_cycles: u64,
    /// Part of every thread's stream each candidate replays, % (the same instructions for every candidate).
    #[arg(long, default_value_t = 20.0)]
    prefix_pct: f64,
    /// Warm-up excluded, % of the prefix.
    #[arg(long, default_value_t = 10.0)]
    warmup_pct: f64,
    /// Policy period in instructions per core.
    #[arg(long, default_value_t = 1_000_000)]
    period: u64,
    /// Score to minimise: cpi (busy cycles per instruction), l2 (L2 misses, seed 004), tput.
    #[arg(long, default_value = "cpi")]
    objective: String,
    /// Stop merging at this many groups.
    #[arg(long, default_value_t = 1)]
    min_groups: usize,
    /// Idle cores take queued threads whose stage they serve (see `replay --steal`).
    #[arg(long)]
    steal: bool,
    /// Weights of `static` for each candidate: `load` (the groups' instruction shares) or `equal`.
    #[arg(long, default_value = "load")]
    static_weights: String,
    /// Write `K<TAB>SPEC` per group count (usable as --stage-groups).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write the steps (with each chosen replay) as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    model: ModelArgs,
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
    /// The JSON is a migration-cost sweep: plot relative throughput against the cost.
    #[arg(long)]
    sweep: bool,
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
            let files = if a.sweep {
                stagesim::plot::plot_sweep(&v, &a.out_dir, &prefix)?
            } else {
                stagesim::plot::plot_report(&v, &a.out_dir, &prefix)?
            };
            for p in files {
                println!("stagesim plot: wrote {}", p.display());
            }
            Ok(())
        }
        Cmd::Discover(a) => discover(*a),
        Cmd::Results {
            dir,
            traces,
            out,
            notes,
            plots,
            print,
        } => {
            let notes = match &notes {
                Some(p) => Some(
                    std::fs::read_to_string(p)
                        .with_context(|| format!("--notes {}", p.display()))?,
                ),
                None => None,
            };
            let mut pngs: Vec<String> = std::fs::read_dir(&plots)
                .map(|rd| {
                    rd.flatten()
                        .filter_map(|e| e.file_name().into_string().ok())
                        .filter(|n| n.ends_with(".png"))
                        .collect()
                })
                .unwrap_or_default();
            pngs.sort();
            let text = stagesim::results::section(&dir, &traces, notes.as_deref(), &pngs);
            if print {
                print!("{text}");
            } else {
                stagesim::results::write_section(&out, &text)?;
                println!(
                    "stagesim results: wrote the stagesim section of {}",
                    out.display()
                );
            }
            Ok(())
        }
        Cmd::Stats {
            trace,
            sidecar,
            stage_groups,
            line,
            json,
        } => {
            anyhow::ensure!(line.is_power_of_two(), "--line {line}: not a power of two");
            let t = load(&trace, sidecar.as_deref())?;
            let mut all = Vec::new();
            for spec in &stage_groups {
                let g = StageGroups::parse(spec, &t.stages)?;
                let st = stagesim::analysis::analyze(&t, &g, line);
                println!(
                    "stagesim stats: {} grouped as {}",
                    trace.display(),
                    g.full_spec()
                );
                print!("{}", stagesim::analysis::render(&st));
                all.push(serde_json::json!({ "grouping": g, "stats": st }));
            }
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&all)?)
                    .with_context(|| format!("{}", p.display()))?;
                println!("stagesim stats: wrote {}", p.display());
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
    groups: &StageGroups,
    n: usize,
) -> anyhow::Result<Vec<Budget>> {
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
            None => Budget {
                name: t.clone(),
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
    let caches = a.model.hierarchy()?;
    let model = a.model.cycle_model();
    let budget_cfg = match &a.budgets {
        Some(p) => Some(host_sched::config::Config::load(p)?),
        None => None,
    };
    let trace = load(&a.trace, a.sidecar.as_deref())?;
    anyhow::ensure!(trace.instrs > 0, "{}: no instructions", a.trace.display());

    let visit_rule = VisitRule::parse(&a.visit_rule)
        .with_context(|| format!("--visit-rule '{}': oracle or history", a.visit_rule))?;
    let groupings: Vec<StageGroups> = a
        .stage_groups
        .iter()
        .map(|g| StageGroups::parse(g, &trace.stages))
        .collect::<anyhow::Result<_>>()?;
    let modes = |flag: &str, arg: &str, off: &str, on: &str| -> anyhow::Result<Vec<bool>> {
        arg.split(',')
            .map(|w| match w.trim() {
                x if x == off => Ok(false),
                x if x == on => Ok(true),
                other => bail!("--{flag} '{other}': {off} or {on}"),
            })
            .collect()
    };
    let weight_modes = modes("static-weights", &a.static_weights, "equal", "load")?;
    let steal_modes = modes("steal", &a.steal, "off", "on")?;
    let per_stage = stagesim::analysis::stage_instrs(&trace);
    // Staged-policy variants: (grouping, migration cost, min-visit, steal).
    let mut variants = Vec::new();
    for g in &groupings {
        for &cost in &a.migration_cycles {
            for &mv in &a.min_visit {
                for &st in &steal_modes {
                    variants.push((g, cost, mv, st));
                }
            }
        }
    }
    let mut configs = Vec::new();
    for &n in &a.cores {
        for &slice in &a.slice {
            for &p in &policies {
                let base = |g: &StageGroups| -> anyhow::Result<SimConfig> {
                    let mut c = SimConfig::new(p, n, slice);
                    c.warmup_pct = a.warmup_pct;
                    c.period = a.period;
                    c.caches = caches;
                    c.model = model;
                    c.smoothing = a.smoothing;
                    c.hysteresis = a.hysteresis;
                    c.visit_rule = visit_rule;
                    c.limit = a.instrs;
                    c.groups = Some(g.clone());
                    if let Some(b) = &budget_cfg {
                        c.budgets = Some(budgets_for(b, g, n)?);
                    }
                    Ok(c)
                };
                if p.host_sched_kind().is_none() {
                    // baseline and pinned never migrate: one replay whatever
                    // the grouping, migration cost, min-visit or steal.
                    let mut c = base(&groupings[0])?;
                    c.migration_cycles = 0;
                    configs.push(c);
                    continue;
                }
                let weights = if p == SimPolicy::Static {
                    &weight_modes[..]
                } else {
                    &[false][..]
                };
                for &(g, cost, mv, st) in &variants {
                    for &lw in weights {
                        let mut c = base(g)?;
                        c.migration_cycles = cost;
                        c.min_visit = mv;
                        c.steal = st;
                        if lw {
                            let w = stagesim::analysis::load_weights(&per_stage, g);
                            let mut b = c.budgets.take().unwrap_or_else(|| {
                                g.names
                                    .iter()
                                    .map(|name| Budget {
                                        name: name.clone(),
                                        min_cores: 0,
                                        max_cores: n,
                                        weight: 1.0,
                                    })
                                    .collect()
                            });
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
                    "{} cores={} slice={} migr={}",
                    c.label(),
                    c.cores,
                    c.slice,
                    c.migration_cycles
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
    for g in &groupings {
        println!("  grouping {}: {}", g.label(), g.full_spec());
    }
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
            migration_cycles: a.migration_cycles.clone(),
            groupings: groupings.clone(),
            min_visit: a.min_visit.clone(),
            visit_rule: visit_rule.name().to_string(),
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

fn discover(a: DiscoverArgs) -> anyhow::Result<()> {
    use stagesim::discover::{self, Objective};
    let policy = SimPolicy::parse(&a.policy)
        .filter(|p| p.host_sched_kind().is_some())
        .with_context(|| format!("--policy '{}': static or proportional", a.policy))?;
    let objective = Objective::parse(&a.objective)
        .with_context(|| format!("--objective '{}': cpi, l2 or tput", a.objective))?;
    let trace = load(&a.trace, a.sidecar.as_deref())?;
    let mut c = SimConfig::new(policy, a.cores, a.slice);
    c.caches = a.model.hierarchy()?;
    c.model = a.model.cycle_model();
    c.migration_cycles = a.migration_cycles;
    c.warmup_pct = a.warmup_pct;
    c.period = a.period;
    anyhow::ensure!(
        a.prefix_pct > 0.0 && a.prefix_pct <= 100.0,
        "--prefix-pct {}: must be in (0, 100]",
        a.prefix_pct
    );
    c.thread_prefix = Some(a.prefix_pct / 100.0);
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
        a.objective
    );
    let pb = ProgressBar::new(total as u64);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg} [{elapsed} < {eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t0 = Instant::now();
    let load_weights = match a.static_weights.as_str() {
        "load" => policy == SimPolicy::Static,
        "equal" => false,
        other => bail!("--static-weights '{other}': equal or load"),
    };
    c.load_weights = load_weights;
    c.steal = a.steal;
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
        a.objective,
        total,
        secs,
        total as f64 * per as f64 / secs.max(1e-9) / 1e6
    );
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
    for s in &steps {
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
    if let Some(p) = &a.out {
        std::fs::write(p, &out).with_context(|| format!("{}", p.display()))?;
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
            "objective": a.objective,
            "warmup_pct": a.warmup_pct,
            "seconds": secs,
            "steps": steps,
        });
        std::fs::write(p, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("{}", p.display()))?;
        println!("stagesim discover: wrote {}", p.display());
    }
    Ok(())
}
