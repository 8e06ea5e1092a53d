//! `headline-bench`: does stage scheduling make a guest faster?
//!
//! One run sweeps the total code footprint of the generated workload
//! (`stage_workload`, 2 stages) × the guest cells × {2, 4} vCPUs, booting
//! the test guest with `workload=footprint` on stagevm. The cells
//! ([`modes`]) are the host policies `off, pinned, static, proportional,
//! auto`, with `pinned` and `static` once per stage-visit policy of
//! `--visits` (`pinned+cohort`: temporal staging; `static+cohort`: spatial
//! and temporal). Beside each footprint it runs the same generated workload
//! natively on two host cores three ways ([`native`]): whole requests per
//! core, one half of the stages per core with a ring hand-off (spatial, as
//! code-footprint probe (`docs/design.md`)), and each core's connections in
//! cohorts, stage by stage (temporal). Every guest run's per-thread
//! checksums are compared with the native runs'. In the same rounds it runs
//! the test guest's default staged workload (`just bench-policies`, not
//! i-cache bound) under every cell at each vCPU count, so a policy that
//! helps one workload can be seen not to hurt the other.
//!
//! Runs are interleaved round by round (all footprints × vCPU counts ×
//! cells, then the staged workload, then again) so machine noise spreads
//! over every cell; medians and min–max of the rounds are reported (ratios
//! per round: [`cells`]). It prints the tables ([`table`]), whether the
//! issue's targets are met ([`targets`]), writes the section of
//! `bench/RESULTS.md` between its markers and a PNG plot of speed-up vs
//! footprint ([`plot`]).

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use stage_workload::{funcs_for_bytes, Params};

mod cells;
mod modes;
mod plot;
mod table;
mod targets;

use cells::{Cells, Measure, Work};
use modes::Sched;
use stagevm_bench::guest::{Boot, GuestRun, STAGED_CMDLINE};
use stagevm_bench::load::Meter;
use stagevm_bench::native::{self, Mode};
use stagevm_bench::stats::Spread;
use stagevm_bench::target::Target;

/// Sweeps code footprint × policy × visit policy × vCPUs with the guest and
/// the native references, plus the staged workload under every cell.
#[derive(Parser, Debug)]
#[command(name = "headline-bench", about)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// Total code footprints to sweep (KiB, over all the workload's stages).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64,128,256,512,768,1024,1536,2048,3072,4096"
    )]
    footprints: Vec<usize>,
    /// vCPU counts (of both workloads; `--cpus boot=N`).
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    vcpus: Vec<u32>,
    /// Host policies (of both workloads); `pinned` and `static` run once
    /// per `--visits` entry, the others with FIFO visits (`auto` chooses
    /// its own visit policy).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "off,pinned,static,proportional,auto"
    )]
    policies: Vec<String>,
    /// Stage-visit policies (temporal staging, stagevm's `--visit`) under
    /// which `pinned` and `static` run: fifo, cohort, srpt, dbr, mg1,
    /// color; `fifo` (the unstaged baseline `pinned+fifo` and spatial
    /// staging alone, `static+fifo`) always runs.
    #[arg(long, value_delimiter = ',', default_value = "fifo,cohort,srpt,color")]
    visits: Vec<String>,
    /// Rounds (medians and min–max are reported).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Guest threads (native connections) in all; each vCPU gets an equal share.
    #[arg(long, default_value_t = 32)]
    threads: u32,
    /// Requests per thread at least (raised per footprint by `--seconds`).
    #[arg(long, default_value_t = 1500)]
    requests: u64,
    /// Least length of a run (s): before the first round each footprint's
    /// native reference runs once and the requests per thread are raised so
    /// that a run takes about this long at that rate (the staged workload
    /// is sized the same way from one `off` run). Steady-state throughput
    /// is the guest's rate between the 10 % and 90 % marks of the requests;
    /// 0 keeps `--requests` (short runs, whole-run figures only).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Function calls per stage and request.
    #[arg(long, default_value_t = 400)]
    calls: u32,
    /// Stages of the footprint workload (1..=4; the footprint is shared
    /// equally). The `--stages` file must name exactly these stages, or none
    /// (`bench/headline-stages-any.toml`).
    #[arg(long, default_value_t = 2)]
    workload_stages: usize,
    /// Data working set per thread (8-byte words).
    #[arg(long, default_value_t = 512)]
    data_words: usize,
    /// Stage configuration given to stagevm (names the workload's stages).
    #[arg(long, default_value = "bench/headline-stages.toml")]
    stages: PathBuf,
    /// Guest memory.
    #[arg(long, default_value = "256M")]
    memory: String,
    /// Guest command line of the non-i-cache-bound workload (the test
    /// guest's default staged workload, as `just bench-policies`).
    #[arg(long, default_value = STAGED_CMDLINE)]
    staged_cmdline: String,
    /// Skip the non-i-cache-bound workload.
    #[arg(long)]
    no_staged: bool,
    /// Results file whose headline section is replaced (created if missing).
    #[arg(long, default_value = "bench/RESULTS.md")]
    results: PathBuf,
    /// Name of the results section (its markers carry it): a second shape
    /// run with other parameters keeps its own section, e.g. `--section
    /// temporal` for a run about the visit policies, which leaves the
    /// `headline` section as it is.
    #[arg(long, default_value = "headline")]
    section: String,
    /// PNG plot to write.
    #[arg(long, default_value = "bench/headline.png")]
    plot: PathBuf,
    /// Host cores for the native reference.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    native_cores: Vec<usize>,
}

/// Per footprint: the parameters and the native runs.
pub struct Point {
    /// The footprint asked for (KiB).
    kib: usize,
    /// The workload's parameters.
    params: Params,
    /// Requests per thread (native and guest runs alike: the checksums
    /// depend on it).
    requests: u64,
    /// Native requests/s per [`Mode`] (indexed by [`Mode::index`]: whole,
    /// spatial, cohort), one per round.
    native: [Vec<f64>; 3],
    /// The checksums every run must reproduce.
    want: Vec<u64>,
}

impl Point {
    /// The code the footprint really has (KiB).
    fn code_kib(&self) -> usize {
        stage_workload::code_bytes(self.params.stages, self.params.funcs) / 1024
    }

    /// A native reference's gain over `whole` (`mode` ÷ whole requests/s),
    /// per round (1 for `whole` itself).
    fn native_gain(&self, mode: Mode) -> Spread {
        let per_round: Vec<f64> = self.native[mode.index()]
            .iter()
            .zip(&self.native[Mode::Whole.index()])
            .map(|(s, w)| s / w)
            .collect();
        Spread::of(&per_round)
    }
}

/// Boots the guest once on the footprint workload and checks its thread
/// checksums against `want`.
fn footprint_run(
    args: &Args,
    p: &Params,
    requests: u64,
    vcpus: u32,
    sched: &Sched,
    want: &[u64],
) -> Result<GuestRun> {
    let cmdline = stagevm_bench::shape::cmdline(p, args.threads / vcpus, requests);
    let extra = sched.extra();
    let out = Boot {
        target: &args.target,
        vcpus,
        policy: &sched.policy,
        cmdline: &cmdline,
        memory: Some(&args.memory),
        stages: Some(&args.stages),
        extra: &extra,
    }
    .run()?;
    let mut seen = 0;
    for line in out.stdout.lines().filter(|l| l.starts_with("thread ")) {
        let id: usize = line["thread ".len()..]
            .split(':')
            .next()
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad thread line '{line}'"))?;
        let sum = line
            .rsplit("checksum 0x")
            .next()
            .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
            .with_context(|| format!("bad thread line '{line}'"))?;
        ensure!(
            want.get(id) == Some(&sum),
            "thread {id}: guest checksum {sum:#018x}, host build {:?} ({}, {vcpus} vCPUs, funcs {})",
            want.get(id).map(|w| format!("{w:#018x}")),
            sched.label(),
            p.funcs
        );
        seen += 1;
    }
    ensure!(
        seen == want.len(),
        "the guest printed {seen} thread checksums, expected {}",
        want.len()
    );
    GuestRun::parse(&out)
}

/// Checks the arguments and that the binaries exist.
fn check(args: &Args) -> Result<()> {
    ensure!(args.rounds > 0, "--rounds must be at least 1");
    ensure!(!args.footprints.is_empty(), "--footprints is empty");
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
    for p in &args.policies {
        ensure!(
            host_sched::policy::PolicyKind::parse(p).is_some(),
            "unknown policy '{p}' (off, pinned, static, proportional, auto)"
        );
    }
    for v in &args.visits {
        ensure!(
            host_sched::policy::VisitPolicy::parse(v).is_some(),
            "unknown visit policy '{v}' (fifo, cohort, srpt, dbr, mg1, color)"
        );
    }
    for path in [&args.target.stagevm, &args.target.kernel, &args.stages] {
        ensure!(
            path.exists(),
            "{} does not exist (run `just build`)",
            path.display()
        );
    }
    Ok(())
}

/// The sweep's footprints (a footprint giving the same code as a smaller
/// one is skipped).
fn points(args: &Args) -> Result<Vec<Point>> {
    let mut points: Vec<Point> = Vec::new();
    for &kib in &args.footprints {
        let params = Params {
            stages: args.workload_stages,
            funcs: funcs_for_bytes(args.workload_stages, kib * 1024),
            calls: args.calls,
            data_words: args.data_words,
        };
        params.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        if points.iter().any(|p| p.params.funcs == params.funcs) {
            eprintln!(
                "headline-bench: {kib} KiB gives the same code as a smaller footprint; skipped"
            );
            continue;
        }
        points.push(Point {
            kib,
            params,
            requests: args.requests,
            native: Default::default(),
            want: Vec::new(),
        });
    }
    Ok(points)
}

/// One round's runs at one footprint: the native reference every way, then
/// every vCPU count × cell (the cell order rotates each round).
fn footprint_round(
    args: &Args,
    scheds: &[Sched],
    round: usize,
    i: usize,
    point: &mut Point,
    cells: &mut Cells,
    bar: &ProgressBar,
) -> Result<()> {
    let cores = [args.native_cores[0], args.native_cores[1]];
    for mode in Mode::ALL {
        bar.set_message(format!(
            "round {} native {} {} KiB",
            round + 1,
            mode.name(),
            point.kib
        ));
        let run = native::run(&point.params, args.threads, point.requests, cores, mode)?;
        if point.want.is_empty() {
            point.want = run.checksums.clone();
        }
        ensure!(
            run.checksums == point.want,
            "native checksums differ between runs at {} KiB ({})",
            point.kib,
            mode.name()
        );
        point.native[mode.index()].push(run.rps);
        bar.inc(1);
    }
    for &v in &args.vcpus {
        for k in 0..scheds.len() {
            let sched = &scheds[(k + round) % scheds.len()];
            let label = sched.label();
            bar.set_message(format!(
                "round {} guest {label} {v} vCPUs {} KiB",
                round + 1,
                point.kib
            ));
            let run = footprint_run(args, &point.params, point.requests, v, sched, &point.want)?;
            cells.push(Work::Footprint(i), v, &label, run);
            bar.inc(1);
        }
    }
    Ok(())
}

/// One round of the staged (non-i-cache-bound) workload: every vCPU count
/// × cell (the cell order rotates each round).
fn staged_round(
    args: &Args,
    scheds: &[Sched],
    cmdline: &str,
    round: usize,
    cells: &mut Cells,
    bar: &ProgressBar,
) -> Result<()> {
    for &v in &args.vcpus {
        for k in 0..scheds.len() {
            let sched = &scheds[(k + round) % scheds.len()];
            let label = sched.label();
            bar.set_message(format!("round {} staged {label} {v} vCPUs", round + 1));
            let extra = sched.extra();
            let run = GuestRun::parse(&staged_boot(args, cmdline, v, sched, &extra).run()?)?;
            cells.push(Work::Staged, v, &label, run);
            bar.inc(1);
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    check(&args)?;
    let mut points = points(&args)?;
    let scheds = modes::scheds(&args.policies, &args.visits);
    let guest_cells = args.vcpus.len() * scheds.len();
    let per_round = points.len() * (Mode::ALL.len() + guest_cells)
        + if args.no_staged { 0 } else { guest_cells };
    let bar = ProgressBar::new((args.rounds * per_round) as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let mut cells = Cells::default();
    let meter = Meter::start();
    let started = std::time::Instant::now();
    bar.set_message("sizing the runs");
    let staged_cmdline = size_runs(&args, &mut points)?;
    for round in 0..args.rounds {
        for (i, point) in points.iter_mut().enumerate() {
            footprint_round(&args, &scheds, round, i, point, &mut cells, &bar)?;
        }
        if !args.no_staged {
            staged_round(&args, &scheds, &staged_cmdline, round, &mut cells, &bar)?;
        }
    }
    bar.finish_and_clear();
    let elapsed = started.elapsed();
    // What other processes ran meanwhile, in cores: the staged runs hand
    // requests between two cores and suffer most from a busy neighbour.
    let others = meter.others_cores();
    let sweep = table::Sweep {
        args: &args,
        scheds: &scheds,
        points: &points,
        cells: &cells,
    };
    let mut text = table::report(&sweep, &staged_cmdline, elapsed, others)?;
    text.push_str(&targets::report(&sweep, others)?);
    text.push_str(&format!("\nPlot: `{}`.\n", args.plot.display()));
    print!("{text}");
    write_results(&args.results, &args.section, &text)?;
    plot::write(&args.plot, &plot_series(&sweep))?;
    println!(
        "wrote {} and {}",
        args.results.display(),
        args.plot.display()
    );
    Ok(())
}

/// Sizes every run for `--seconds` before the first round: one native
/// whole-request run per footprint at `--requests` sets the footprint's
/// requests per thread; one `off` run of the staged workload at the first
/// vCPU count sets its `requests=`. Returns the staged workload's command
/// line.
fn size_runs(args: &Args, points: &mut [Point]) -> Result<String> {
    if args.seconds <= 0.0 {
        return Ok(args.staged_cmdline.clone());
    }
    let cores = [args.native_cores[0], args.native_cores[1]];
    for p in points.iter_mut() {
        let run = native::run(&p.params, args.threads, args.requests, cores, Mode::Whole)?;
        p.requests = stagevm_bench::guest::requests_for(
            args.seconds,
            run.rps,
            u64::from(args.threads),
            args.requests,
        );
        eprintln!(
            "headline-bench: {} KiB: native {:.0} requests/s, {} requests per thread",
            p.kib, run.rps, p.requests
        );
    }
    if args.no_staged {
        return Ok(args.staged_cmdline.clone());
    }
    let off = Sched {
        policy: "off".into(),
        visit: None,
    };
    let boot = staged_boot(args, &args.staged_cmdline, args.vcpus[0], &off, &[]);
    stagevm_bench::guest::sized_cmdline(&boot, args.seconds)
}

/// One boot of the staged (non-i-cache-bound) workload under `sched`
/// (`extra`: its [`Sched::extra`]).
fn staged_boot<'a>(
    args: &'a Args,
    cmdline: &'a str,
    vcpus: u32,
    sched: &'a Sched,
    extra: &'a [&'a str],
) -> Boot<'a> {
    Boot {
        target: &args.target,
        vcpus,
        policy: &sched.policy,
        cmdline,
        memory: None,
        stages: None,
        extra,
    }
}

/// Series for the plot: the native gains, and per vCPU count, per cell
/// but `off`, (footprint KiB, median speed-up over `off`).
fn plot_series(sw: &table::Sweep) -> plot::Series {
    let xs: Vec<f64> = sw.points.iter().map(|p| p.code_kib() as f64).collect();
    let native = |m: Mode| -> Vec<(f64, f64)> {
        xs.iter()
            .zip(sw.points)
            .map(|(x, p)| (*x, p.native_gain(m).med))
            .filter(|(_, y)| y.is_finite())
            .collect()
    };
    let mut lines = Vec::new();
    for &v in &sw.args.vcpus {
        for (k, sched) in sw.scheds.iter().enumerate() {
            let label = sched.label();
            if label == modes::OFF {
                continue;
            }
            let ys: Vec<(f64, f64)> = (0..sw.points.len())
                .map(|i| {
                    let w = Work::Footprint(i);
                    let r = sw.cells.ratio(Measure::Steady, w, v, &label, modes::OFF);
                    (xs[i], r.med)
                })
                .filter(|(_, y)| y.is_finite())
                .collect();
            lines.push(plot::Line {
                label: format!("{label}, {v} vCPUs"),
                vcpus: v,
                color: k,
                points: ys,
            });
        }
    }
    plot::Series {
        native: native(Mode::Spatial),
        cohort: native(Mode::Cohort),
        lines,
    }
}

/// The markers of section `name` (`headline`: the ones earlier runs wrote).
fn markers(name: &str) -> (String, String) {
    if name == "headline" {
        (
            "<!-- headline-bench:begin (written by `just bench-headline`) -->".into(),
            "<!-- headline-bench:end -->".into(),
        )
    } else {
        (
            format!("<!-- headline-bench:begin {name} (written by `headline-bench --section {name}`) -->"),
            format!("<!-- headline-bench:end {name} -->"),
        )
    }
}

/// Replaces the text between section `name`'s markers in `path` (appends
/// the section when the markers are absent; creates the file if needed).
fn write_results(path: &Path, name: &str, section: &str) -> Result<()> {
    let (begin, end) = markers(name);
    stagevm_bench::write_section(path, &begin, &end, section)
}
