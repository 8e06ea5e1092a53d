//! `headline-bench`: does stage scheduling make a guest faster?
//!
//! One run sweeps the total code footprint of the generated workload
//! (`stage_workload`, 2 stages) × `--policy off, pinned, static,
//! proportional, auto` × {2, 4} vCPUs, booting the test guest with
//! `workload=footprint` on stagevm; beside each footprint it runs the same
//! generated workload natively on two host cores, whole requests per core
//! and one stage per core with a ring hand-off (the reference, as
//! code-footprint probe (`docs/design.md`)). Every guest run's per-thread
//! checksums are compared with the native runs'. In the same rounds it runs
//! the test guest's default staged workload (`just bench-policies`, not
//! i-cache bound) under every policy at each vCPU count, so a policy that
//! helps one workload can be seen not to hurt the other.
//!
//! Runs are interleaved round by round (all footprints × vCPU counts ×
//! policies, then the staged workload, then again) so machine noise spreads
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
mod native;
mod plot;
mod table;
mod targets;

use cells::{Cells, Measure, Work};
use stagevm_bench::guest::{Boot, GuestRun, STAGED_CMDLINE};
use stagevm_bench::load::Meter;
use stagevm_bench::stats::Spread;
use stagevm_bench::target::Target;

/// Sweeps code footprint × policy × vCPUs with the guest and the native
/// reference, plus the staged workload under every policy.
#[derive(Parser, Debug)]
#[command(name = "headline-bench", about)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// Total code footprints to sweep (KiB, over both stages).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64,128,256,512,768,1024,1536,2048,3072,4096"
    )]
    footprints: Vec<usize>,
    /// vCPU counts (of both workloads).
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    vcpus: Vec<u32>,
    /// Policies (of both workloads).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "off,pinned,static,proportional,auto"
    )]
    policies: Vec<String>,
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
    /// run with other parameters keeps its own section.
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
    /// Native requests/s: whole, staged (one per round).
    native: [Vec<f64>; 2],
    /// The checksums every run must reproduce.
    want: Vec<u64>,
}

impl Point {
    /// The code the footprint really has (KiB).
    fn code_kib(&self) -> usize {
        stage_workload::code_bytes(2, self.params.funcs) / 1024
    }

    /// The native reference's speed-up (staged ÷ whole), per round.
    fn native_speedup(&self) -> Spread {
        let per_round: Vec<f64> = self.native[1]
            .iter()
            .zip(&self.native[0])
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
    policy: &str,
    want: &[u64],
) -> Result<GuestRun> {
    let cmdline = format!(
        "iters=1 workload=footprint stages={} funcs={} calls={} data={} threads={} requests={}",
        p.stages,
        p.funcs,
        p.calls,
        p.data_words,
        args.threads / vcpus,
        requests
    );
    let out = Boot {
        target: &args.target,
        vcpus,
        policy,
        cmdline: &cmdline,
        memory: Some(&args.memory),
        stages: Some(&args.stages),
        extra: &[],
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
            "thread {id}: guest checksum {sum:#018x}, host build {:?} (policy {policy}, {vcpus} vCPUs, funcs {})",
            want.get(id).map(|w| format!("{w:#018x}")),
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
            stages: 2,
            funcs: funcs_for_bytes(2, kib * 1024),
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
            native: [Vec::new(), Vec::new()],
            want: Vec::new(),
        });
    }
    Ok(points)
}

/// One round's runs at one footprint: the native reference both ways, then
/// every vCPU count × policy (the policy order rotates each round).
fn footprint_round(
    args: &Args,
    round: usize,
    i: usize,
    point: &mut Point,
    cells: &mut Cells,
    bar: &ProgressBar,
) -> Result<()> {
    let cores = [args.native_cores[0], args.native_cores[1]];
    for (k, staged) in [false, true].into_iter().enumerate() {
        bar.set_message(format!(
            "round {} native {} {} KiB",
            round + 1,
            if staged { "staged" } else { "whole" },
            point.kib
        ));
        let run = native::run(&point.params, args.threads, point.requests, cores, staged)?;
        if point.want.is_empty() {
            point.want = run.checksums.clone();
        }
        ensure!(
            run.checksums == point.want,
            "native checksums differ between runs at {} KiB (staged={staged})",
            point.kib
        );
        point.native[k].push(run.rps);
        bar.inc(1);
    }
    for &v in &args.vcpus {
        for k in 0..args.policies.len() {
            let policy = &args.policies[(k + round) % args.policies.len()];
            bar.set_message(format!(
                "round {} guest {policy} {v} vCPUs {} KiB",
                round + 1,
                point.kib
            ));
            let run = footprint_run(args, &point.params, point.requests, v, policy, &point.want)?;
            cells.push(Work::Footprint(i), v, policy, run);
            bar.inc(1);
        }
    }
    Ok(())
}

/// One round of the staged (non-i-cache-bound) workload: every vCPU count
/// × policy (the policy order rotates each round).
fn staged_round(
    args: &Args,
    cmdline: &str,
    round: usize,
    cells: &mut Cells,
    bar: &ProgressBar,
) -> Result<()> {
    for &v in &args.vcpus {
        for k in 0..args.policies.len() {
            let policy = &args.policies[(k + round) % args.policies.len()];
            bar.set_message(format!("round {} staged {policy} {v} vCPUs", round + 1));
            let run = GuestRun::parse(&staged_boot(args, cmdline, v, policy).run()?)?;
            cells.push(Work::Staged, v, policy, run);
            bar.inc(1);
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    check(&args)?;
    let mut points = points(&args)?;
    let guest_cells = args.vcpus.len() * args.policies.len();
    let per_round = points.len() * (2 + guest_cells) + if args.no_staged { 0 } else { guest_cells };
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
            footprint_round(&args, round, i, point, &mut cells, &bar)?;
        }
        if !args.no_staged {
            staged_round(&args, &staged_cmdline, round, &mut cells, &bar)?;
        }
    }
    bar.finish_and_clear();
    let elapsed = started.elapsed();
    // What other processes ran meanwhile, in cores: the staged runs hand
    // requests between two cores and suffer most from a busy neighbour.
    let others = meter.others_cores();
    let mut text = table::report(&args, &staged_cmdline, &points, &cells, elapsed, others)?;
    text.push_str(&targets::report(&args, &points, &cells, others)?);
    text.push_str(&format!("\nPlot: `{}`.\n", args.plot.display()));
    print!("{text}");
    write_results(&args.results, &args.section, &text)?;
    plot::write(&args.plot, &plot_series(&args, &points, &cells))?;
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
        let run = native::run(&p.params, args.threads, args.requests, cores, false)?;
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
    let boot = staged_boot(args, &args.staged_cmdline, args.vcpus[0], "off");
    stagevm_bench::guest::sized_cmdline(&boot, args.seconds)
}

/// One boot of the staged (non-i-cache-bound) workload.
fn staged_boot<'a>(args: &'a Args, cmdline: &'a str, vcpus: u32, policy: &'a str) -> Boot<'a> {
    Boot {
        target: &args.target,
        vcpus,
        policy,
        cmdline,
        memory: None,
        stages: None,
        extra: &[],
    }
}

/// Series for the plot: per vCPU count, per policy, (footprint KiB,
/// median speed-up over `off`).
fn plot_series(args: &Args, points: &[Point], cells: &Cells) -> plot::Series {
    let xs: Vec<f64> = points.iter().map(|p| p.code_kib() as f64).collect();
    let native: Vec<(f64, f64)> = xs
        .iter()
        .zip(points)
        .map(|(x, p)| (*x, p.native_speedup().med))
        .collect();
    let mut lines = Vec::new();
    for &v in &args.vcpus {
        for (k, pol) in args
            .policies
            .iter()
            .enumerate()
            .filter(|(_, p)| *p != "off")
        {
            let ys: Vec<(f64, f64)> = (0..points.len())
                .map(|i| {
                    let r = cells.ratio(Measure::Steady, Work::Footprint(i), v, pol, "off");
                    (xs[i], r.med)
                })
                .filter(|(_, y)| y.is_finite())
                .collect();
            lines.push(plot::Line {
                label: format!("{pol}, {v} vCPUs"),
                vcpus: v,
                color: k,
                points: ys,
            });
        }
    }
    plot::Series { native, lines }
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
    let old =
        std::fs::read_to_string(path).unwrap_or_else(|_| "# stagevm benchmark results\n".into());
    let new = match (old.find(&begin), old.find(&end)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{begin}\n{section}{}", &old[..b], &old[e..])
        }
        _ => format!("{}\n{begin}\n{section}{end}\n", old.trim_end()),
    };
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}
