//! `open-bench` (`just bench-open`): stage scheduling judged by what a
//! server's users feel — CPU per request below saturation, throughput at
//! it, tail latency always.
//!
//! For each workload shape (the headline's generated i-cache-bound
//! workload at a code footprint, calls per stage and data words) and vCPU
//! count, it first measures the unstaged capacity in this run (one closed
//! loop each of `off` and `pinned`, the better), then, round after round,
//! runs every cell (`off`, `pinned`, `pinned+srpt` — temporal staging —,
//! `static`, `proportional`, `auto`, …) closed-loop and open-loop at each
//! load (a percentage of that capacity, Poisson arrivals), beside the
//! native references (whole and spatial, closed and open). Cells rotate
//! within a round and rounds interleave, so ratios are taken per round
//! (run `r` of a cell against run `r` of the better unstaged cell). Closed
//! loop it compares steady throughput; open loop the achieved rate, the
//! CPU per request (the VMM's work CPU over the middle of the run), p50
//! and p99 latency from arrival (the guest's, every steady request) and
//! drops. It prints the tables ([`table`]) and the targets A1–A5
//! ([`targets`]), writes its section of `bench/RESULTS.md` and a plot of
//! CPU per request and p99 against load ([`plot`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{ensure, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use stage_workload::arrivals::ArrivalDist;
use stage_workload::Params;
use stagevm_bench::guest::{requests_for, Boot};
use stagevm_bench::load::Meter;
use stagevm_bench::native::{self, Load, Mode};
use stagevm_bench::target::Target;

mod plot;
mod runs;
mod table;
mod targets;

use runs::Run;

/// Open-loop and closed-loop sweep of the cells over shapes × vCPUs ×
/// loads.
#[derive(Parser, Debug)]
#[command(
    name = "open-bench",
    about = "Stage scheduling under open and closed loop: CPU per request, throughput, p50/p99 latency, targets A1-A5"
)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// Workload shapes, `KIB:CALLS:DATA` each: total code footprint (KiB),
    /// function calls per stage and request, data words per thread.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "128:400:512,4096:400:512"
    )]
    shapes: Vec<String>,
    /// vCPU counts.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    vcpus: Vec<u32>,
    /// Open-loop loads, % of the unstaged capacity measured in this run.
    #[arg(long, value_delimiter = ',', default_value = "30,60,90")]
    loads: Vec<u32>,
    /// Cells: a policy, or `policy+visit` (stagevm's `--policy` and
    /// `--visit`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "off,pinned,pinned+srpt,static,proportional,auto"
    )]
    cells: Vec<String>,
    /// Skip the closed-loop runs.
    #[arg(long)]
    no_closed: bool,
    /// Rounds (medians, min–max and worst rounds are reported).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Length of a closed-loop run (s) at the unstaged capacity.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Length of an open-loop run (s) at the offered load: long enough
    /// that `auto`'s first trial (its first ~1 s) ends before the steady
    /// 10 % mark of the requests.
    #[arg(long, default_value_t = 10.0)]
    open_seconds: f64,
    /// Guest threads in all (native connections); each vCPU gets an equal
    /// share.
    #[arg(long, default_value_t = 32)]
    threads: u32,
    /// The queue of arrived requests (the guest's `queue=`).
    #[arg(long, default_value_t = 1024)]
    queue: u64,
    /// Stages of the footprint workload.
    #[arg(long, default_value_t = 2)]
    workload_stages: usize,
    /// Stage configuration given to stagevm.
    #[arg(long, default_value = "bench/headline-stages.toml")]
    stages: PathBuf,
    /// Guest memory.
    #[arg(long, default_value = "256M")]
    memory: String,
    /// Host cores of the native references.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    native_cores: Vec<usize>,
    /// Results file whose section is replaced.
    #[arg(long, default_value = "bench/RESULTS.md")]
    results: PathBuf,
    /// Name of the results section (its markers carry it; `open-loop` is
    /// the main one).
    #[arg(long, default_value = "open-loop")]
    section: String,
    /// PNG plot to write.
    #[arg(long, default_value = "bench/open-loop.png")]
    plot: PathBuf,
}

/// One workload shape.
#[derive(Clone, Debug)]
pub struct Shape {
    /// `KIB:CALLS:DATA` as given.
    pub name: String,
    /// The workload's parameters.
    pub params: Params,
    /// Closed loop: requests per thread (sized for `--seconds`).
    pub requests: u64,
    /// Native closed-loop requests/s, whole and spatial, per round.
    pub native: [Vec<f64>; 2],
}

impl Shape {
    /// The code the shape really has (KiB).
    pub fn code_kib(&self) -> usize {
        stage_workload::code_bytes(self.params.stages, self.params.funcs) / 1024
    }
}

/// A cell: `--policy` and `--visit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    /// `policy` or `policy+visit`.
    pub label: String,
    policy: String,
    visit: Option<String>,
}

impl Cell {
    fn parse(s: &str) -> Result<Self> {
        let (policy, visit) = match s.split_once('+') {
            Some((p, v)) => (p.to_string(), Some(v.to_string())),
            None => (s.to_string(), None),
        };
        ensure!(
            host_sched::policy::PolicyKind::parse(&policy).is_some(),
            "--cells {s}: unknown policy '{policy}' (off, pinned, static, proportional, auto)"
        );
        if let Some(v) = &visit {
            ensure!(
                host_sched::policy::VisitPolicy::parse(v).is_some(),
                "--cells {s}: unknown visit policy '{v}' (fifo, cohort, srpt, dbr, mg1, color)"
            );
        }
        Ok(Self {
            label: s.to_string(),
            policy,
            visit,
        })
    }

    /// Whether the cell stages nothing (`off`, `pinned`, `…+fifo`).
    pub fn unstaged(&self) -> bool {
        matches!(self.policy.as_str(), "off" | "pinned")
            && self.visit.as_deref().is_none_or(|v| v == "fifo")
    }
}

/// Where a run belongs: shape index, vCPUs, load (% of capacity; 0 for
/// the closed loop) and cell label.
pub type Key = (usize, u32, u32, String);

/// Everything the sweep measured.
#[derive(Debug, Default)]
pub struct Sweep {
    /// Guest runs, one per round.
    pub runs: BTreeMap<Key, Vec<Run>>,
    /// Per (shape, vCPUs), the unstaged capacity measured (requests/s).
    pub capacity: BTreeMap<(usize, u32), f64>,
    /// Native open-loop runs per (shape, vCPUs, load, mode: 0 whole, 1
    /// spatial), one per round.
    pub native_open: BTreeMap<(usize, u32, u32, usize), Vec<native::OpenRun>>,
}

fn check(args: &Args) -> Result<Vec<Shape>> {
    ensure!(args.rounds > 0, "--rounds must be at least 1");
    ensure!(
        args.native_cores.len() == 2,
        "--native-cores needs exactly two cores"
    );
    for v in &args.vcpus {
        ensure!(
            *v > 0 && args.threads.is_multiple_of(*v) && args.threads / v <= 16,
            "--threads {} must split into at most 16 threads per vCPU over {v} vCPUs",
            args.threads
        );
    }
    ensure!(
        args.loads.iter().all(|l| (1..=200).contains(l)),
        "--loads are percentages of the unstaged capacity, 1..=200"
    );
    for path in [&args.target.stagevm, &args.target.kernel, &args.stages] {
        ensure!(
            path.exists(),
            "{} does not exist (run `just build`)",
            path.display()
        );
    }
    args.shapes
        .iter()
        .map(|s| {
            let params = stagevm_bench::shape::parse("--shapes", s, args.workload_stages)?;
            Ok(Shape {
                name: s.clone(),
                params,
                requests: 0,
                native: Default::default(),
            })
        })
        .collect()
}

/// The guest command line of `shape` with `threads` per vCPU and
/// `requests` each, open-loop at `rate` when given.
fn cmdline(shape: &Shape, threads: u32, requests: u64, rate: Option<u64>, queue: u64) -> String {
    let mut c = stagevm_bench::shape::cmdline(&shape.params, threads, requests);
    if let Some(r) = rate {
        c += &format!(" arrival={r} arrival_dist=poisson queue={queue}");
    }
    c
}

/// One guest run of `cell`.
fn guest(
    args: &Args,
    shape: &Shape,
    vcpus: u32,
    cell: &Cell,
    requests: u64,
    rate: Option<u64>,
) -> Result<Run> {
    let cmd = cmdline(shape, args.threads / vcpus, requests, rate, args.queue);
    let extra: Vec<&str> = cell
        .visit
        .as_deref()
        .map_or_else(Vec::new, |v| vec!["--visit", v]);
    let boot = Boot {
        target: &args.target,
        vcpus,
        policy: &cell.policy,
        cmdline: &cmd,
        memory: Some(&args.memory),
        stages: Some(&args.stages),
        extra: &extra,
    };
    runs::run(&boot, rate.is_some())
}

/// Sizes the runs before the first round: each shape's closed-loop
/// requests per thread from a native whole run, and each (shape, vCPUs)'s
/// unstaged capacity from one closed run of `off` and one of `pinned`.
fn size(args: &Args, shapes: &mut [Shape], sweep: &mut Sweep, bar: &ProgressBar) -> Result<()> {
    let cores = [args.native_cores[0], args.native_cores[1]];
    for (i, shape) in shapes.iter_mut().enumerate() {
        bar.set_message(format!("sizing {}", shape.name));
        let r = native::run(&shape.params, args.threads, 1500, cores, Mode::Whole)?;
        shape.requests = requests_for(args.seconds, r.rps, u64::from(args.threads), 200);
        for &v in &args.vcpus {
            let mut best: f64 = 0.0;
            for policy in ["off", "pinned"] {
                let cell = Cell::parse(policy)?;
                let run = guest(args, shape, v, &cell, shape.requests, None)?;
                best = best.max(run.rps);
            }
            ensure!(
                best > 0.0,
                "{}: no unstaged capacity at {v} vCPUs",
                shape.name
            );
            sweep.capacity.insert((i, v), best);
            eprintln!(
                "open-bench: {} ({} KiB), {v} vCPUs: unstaged capacity {best:.0} requests/s",
                shape.name,
                shape.code_kib()
            );
        }
    }
    Ok(())
}

/// One round of one shape: native references, then every vCPU count ×
/// (closed loop, each load) × cell, the cells rotating by round.
fn round(
    args: &Args,
    cells: &[Cell],
    r: usize,
    i: usize,
    shape: &mut Shape,
    sweep: &mut Sweep,
    bar: &ProgressBar,
) -> Result<()> {
    let cores = [args.native_cores[0], args.native_cores[1]];
    for (m, mode) in [Mode::Whole, Mode::Spatial].into_iter().enumerate() {
        bar.set_message(format!(
            "round {} native {} {}",
            r + 1,
            mode.name(),
            shape.name
        ));
        let run = native::run(&shape.params, args.threads, shape.requests, cores, mode)?;
        shape.native[m].push(run.rps);
    }
    let loads: Vec<u32> = (!args.no_closed)
        .then_some(0)
        .into_iter()
        .chain(args.loads.iter().copied())
        .collect();
    for &v in &args.vcpus {
        let cap = sweep.capacity[&(i, v)];
        for &load in &loads {
            let rate = (load > 0).then(|| (cap * f64::from(load) / 100.0).round().max(1.0) as u64);
            let requests = match rate {
                Some(rate) => {
                    requests_for(args.open_seconds, rate as f64, u64::from(args.threads), 50)
                }
                None => shape.requests,
            };
            // The native references at the first vCPU count's loads (they
            // have no trial to leave out: runs of `--seconds`).
            if let Some(rate) = rate.filter(|_| v == args.vcpus[0]) {
                let native = requests_for(args.seconds, rate as f64, u64::from(args.threads), 50);
                for (m, mode) in [Mode::Whole, Mode::Spatial].into_iter().enumerate() {
                    let l = Load {
                        rate,
                        dist: ArrivalDist::Poisson,
                        total: native * u64::from(args.threads),
                        queue: args.queue,
                    };
                    let run = native::run_open(&shape.params, args.threads, l, cores, mode)?;
                    sweep
                        .native_open
                        .entry((i, v, load, m))
                        .or_default()
                        .push(run);
                }
            }
            for k in 0..cells.len() {
                let cell = &cells[(k + r) % cells.len()];
                let what = if load == 0 {
                    "closed".into()
                } else {
                    format!("{load} %")
                };
                bar.set_message(format!(
                    "round {} {} {v} vCPUs {what} {}",
                    r + 1,
                    shape.name,
                    cell.label
                ));
                let run = guest(args, shape, v, cell, requests, rate)?;
                sweep
                    .runs
                    .entry((i, v, load, cell.label.clone()))
                    .or_default()
                    .push(run);
                bar.inc(1);
            }
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut shapes = check(&args)?;
    let cells: Vec<Cell> = args
        .cells
        .iter()
        .map(|c| Cell::parse(c))
        .collect::<Result<_>>()?;
    ensure!(
        cells
            .iter()
            .any(|c| c.label == "off" || c.label == "pinned"),
        "--cells needs an unstaged baseline (off or pinned)"
    );
    let loads = args.loads.len() + usize::from(!args.no_closed);
    let per_round = shapes.len() * args.vcpus.len() * loads * cells.len();
    let bar = ProgressBar::new((args.rounds * per_round) as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let meter = Meter::start();
    let started = std::time::Instant::now();
    let mut sweep = Sweep::default();
    size(&args, &mut shapes, &mut sweep, &bar)?;
    for r in 0..args.rounds {
        for (i, shape) in shapes.iter_mut().enumerate() {
            round(&args, &cells, r, i, shape, &mut sweep, &bar)?;
        }
    }
    bar.finish_and_clear();
    let others = meter.others_cores();
    let view = table::View {
        args: &args,
        shapes: &shapes,
        cells: &cells,
        sweep: &sweep,
    };
    let mut text = table::report(&view, started.elapsed(), others);
    text.push_str(&targets::report(&view, others));
    text.push_str(&format!("\nPlot: `{}`.\n", args.plot.display()));
    print!("{text}");
    stagevm_bench::write_section(
        &args.results,
        &format!(
            "<!-- open-bench:begin {} (written by `just bench-open`) -->",
            args.section
        ),
        &format!("<!-- open-bench:end {} -->", args.section),
        &text,
    )?;
    plot::write(&args.plot, &view)?;
    println!(
        "wrote {} and {}",
        args.results.display(),
        args.plot.display()
    );
    Ok(())
}
