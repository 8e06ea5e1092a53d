//! `headline-bench`: does stage scheduling make a guest faster?
//!
//! One run sweeps the total code footprint of the generated workload
//! (`stage_workload`, 2 stages) × `--policy off, pinned, static,
//! proportional` × {2, 4} vCPUs, booting the test guest with
//! `workload=footprint` on stagevm; beside each footprint it runs the same
//! generated workload natively on two host cores, whole requests per core
//! and one stage per core with a ring hand-off (the reference, as
//! code-footprint probe (`docs/design.md`)). Every guest run's per-thread
//! checksums are compared with the native runs'.
//!
//! Runs are interleaved round by round (all footprints × vCPU counts ×
//! policies, then again) so machine noise spreads over every cell; medians
//! of the rounds are reported. It prints a table, whether the issue's
//! targets are met, writes the section of `bench/RESULTS.md` between its
//! markers and a PNG plot of speed-up vs footprint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use stage_workload::{code_bytes, funcs_for_bytes, Params};

mod native;
mod plot;
use stagevm_bench::stats::median;
use stagevm_bench::target::Target;
use stagevm_report::Report;

/// Sweeps code footprint × policy × vCPUs with the guest and the native reference.
#[derive(Parser, Debug)]
#[command(name = "headline-bench", about)]
struct Args {
    #[command(flatten)]
    target: Target,
    /// Total code footprints to sweep (KiB, over both stages).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64,128,256,512,768,1024,1536,2048,3072,4096"
    )]
    footprints: Vec<usize>,
    /// vCPU counts.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    vcpus: Vec<u32>,
    /// Policies.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "off,pinned,static,proportional"
    )]
    policies: Vec<String>,
    /// Rounds (medians are reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Guest threads (native connections) in all; each vCPU gets an equal share.
    #[arg(long, default_value_t = 32)]
    threads: u32,
    /// Requests per thread.
    #[arg(long, default_value_t = 1500)]
    requests: u64,
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
    /// Results file whose headline section is replaced (created if missing).
    #[arg(long, default_value = "bench/RESULTS.md")]
    results: PathBuf,
    /// PNG plot to write.
    #[arg(long, default_value = "bench/headline.png")]
    plot: PathBuf,
    /// Host cores for the native reference.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    native_cores: Vec<usize>,
}

/// One guest run's figures.
#[derive(Clone, Debug, Default)]
struct GuestRun {
    rps: f64,
    migrations: u64,
    stage_events: u64,
    idle_pct: f64,
    waits: u64,
    wakes: u64,
    map_changes: u64,
}

/// The number after `key` on `line`, up to a space or comma.
fn field<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split([' ', ',']).find(|w| !w.is_empty())?.parse().ok()
}

/// Boots the guest once and checks its thread checksums against `want`.
fn guest_run(args: &Args, p: &Params, vcpus: u32, policy: &str, want: &[u64]) -> Result<GuestRun> {
    let report = std::env::temp_dir().join(format!("headline-{}.json", std::process::id()));
    let cmdline = format!(
        "iters=1 workload=footprint stages={} funcs={} calls={} data={} threads={} requests={}",
        p.stages,
        p.funcs,
        p.calls,
        p.data_words,
        args.threads / vcpus,
        args.requests
    );
    let out = Command::new(&args.target.stagevm)
        .arg("--kernel")
        .arg(&args.target.kernel)
        .args([
            "--cpus",
            &format!("boot={vcpus}"),
            "--memory",
            &format!("size={}", args.memory),
        ])
        .args(["--policy", policy, "--stages"])
        .arg(&args.stages)
        .arg("--report")
        .arg(&report)
        .args(["--cmdline", &cmdline])
        .output()
        .with_context(|| format!("running {}", args.target.stagevm.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "stagevm --policy {policy} --cpus boot={vcpus} --cmdline \"{cmdline}\" failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut seen = 0;
    for line in stdout.lines().filter(|l| l.starts_with("thread ")) {
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
    let line = |prefix: &str| stdout.lines().find(|l| l.starts_with(prefix)).unwrap_or("");
    let rps = field(line("testguest: staged phase"), "ms, ")
        .with_context(|| format!("no staged-phase line in the guest output:\n{stdout}"))?;
    let json = Report::read(&report).with_context(|| format!("reading {}", report.display()))?;
    let _ = std::fs::remove_file(&report);
    // Without a stage device every channel counter is 0.
    let ch = json.stage_channel.unwrap_or_default();
    let occupancy: f64 = ch.stages.iter().map(|s| s.occupancy_ns as f64).sum();
    let busy = ch.busy_ns as f64 * f64::from(vcpus);
    Ok(GuestRun {
        rps,
        migrations: field(line("testguest: migrations "), "migrations ").unwrap_or(0),
        stage_events: ch.stages.iter().map(|s| s.events).sum(),
        idle_pct: if busy > 0.0 {
            (100.0 - occupancy * 100.0 / busy).max(0.0)
        } else {
            f64::NAN
        },
        waits: ch.waits,
        wakes: ch.wakes + ch.host_wakes,
        map_changes: json.sched.map_changes,
    })
}

/// Per footprint: the parameters and the native medians.
struct Point {
    kib: usize,
    params: Params,
    /// Native requests/s: whole, staged (one per round).
    native: [Vec<f64>; 2],
    /// The checksums every run must reproduce.
    want: Vec<u64>,
}

/// What the sweep measured, keyed (footprint index, vCPUs, policy).
type Cells = BTreeMap<(usize, u32, String), Vec<GuestRun>>;

/// Busy CPU time of the whole machine so far (s), from `/proc/stat`
/// (user + nice + system + irq + softirq + steal, USER_HZ = 100 ticks/s).
fn machine_busy_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: u64 = stat
        .lines()
        .next()
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .enumerate()
                .filter(|(k, _)| matches!(k, 0 | 1 | 2 | 5 | 6 | 7))
                .filter_map(|(_, v)| v.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    ticks as f64 / 100.0
}

/// CPU time (s) this process and its waited-for children used.
fn own_cpu_s() -> f64 {
    let mut total = 0.0;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: getrusage fills the struct we pass.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid, writable rusage.
        if unsafe { libc::getrusage(who, &mut ru) } == 0 {
            for tv in [ru.ru_utime, ru.ru_stime] {
                total += tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
            }
        }
    }
    total
}

fn machine() -> String {
    let out = Command::new("lscpu")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let text = out.unwrap_or_default();
    let get = |k: &str| {
        text.lines()
            .find(|l| l.starts_with(k))
            .map(|l| l[k.len()..].trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "{}, {} CPUs, L1i {}, L2 {}, L3 {} (lscpu)",
        get("Model name:"),
        get("CPU(s):"),
        get("L1i cache:"),
        get("L2 cache:"),
        get("L3 cache:")
    )
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(args.rounds > 0, "--rounds must be at least 1");
    ensure!(!args.footprints.is_empty(), "--footprints is empty");
    ensure!(
        args.native_cores.len() == 2,
        "--native-cores needs exactly two cores"
    );
    for v in &args.vcpus {
        ensure!(
            *v > 0 && args.threads % v == 0 && args.threads / v <= 16,
            "--threads {} must split into at most 16 threads per vCPU over {v} vCPUs",
            args.threads
        );
    }
    for p in &args.policies {
        ensure!(
            host_sched::policy::PolicyKind::parse(p).is_some(),
            "unknown policy '{p}' (off, pinned, static, proportional)"
        );
    }
    for path in [&args.target.stagevm, &args.target.kernel, &args.stages] {
        ensure!(
            path.exists(),
            "{} does not exist (run `just build`)",
            path.display()
        );
    }
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
            native: [Vec::new(), Vec::new()],
            want: Vec::new(),
        });
    }
    let cores = [args.native_cores[0], args.native_cores[1]];
    let total = args.rounds * points.len() * (2 + args.vcpus.len() * args.policies.len());
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let mut cells: Cells = BTreeMap::new();
    let started = std::time::Instant::now();
    let (busy0, own0) = (machine_busy_s(), own_cpu_s());
    for round in 0..args.rounds {
        for (i, point) in points.iter_mut().enumerate() {
            for (k, staged) in [false, true].into_iter().enumerate() {
                bar.set_message(format!(
                    "round {} native {} {} KiB",
                    round + 1,
                    if staged { "staged" } else { "whole" },
                    point.kib
                ));
                let run = native::run(&point.params, args.threads, args.requests, cores, staged)?;
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
                    // Rotate the policy order each round.
                    let policy = &args.policies[(k + round) % args.policies.len()];
                    bar.set_message(format!(
                        "round {} guest {policy} {v} vCPUs {} KiB",
                        round + 1,
                        point.kib
                    ));
                    let run = guest_run(&args, &point.params, v, policy, &point.want)?;
                    cells.entry((i, v, policy.clone())).or_default().push(run);
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish_and_clear();
    let elapsed = started.elapsed();
    // What other processes ran meanwhile, in cores: the staged runs hand
    // requests between two cores and suffer most from a busy neighbour.
    let others =
        ((machine_busy_s() - busy0) - (own_cpu_s() - own0)).max(0.0) / elapsed.as_secs_f64();
    let text = report(&args, &points, &cells, elapsed, others)?;
    print!("{text}");
    write_results(&args.results, &text)?;
    plot::write(&args.plot, &plot_series(&args, &points, &cells))?;
    println!(
        "wrote {} and {}",
        args.results.display(),
        args.plot.display()
    );
    Ok(())
}

fn cell<'a>(cells: &'a Cells, i: usize, v: u32, p: &str) -> Option<&'a Vec<GuestRun>> {
    cells.get(&(i, v, p.to_string()))
}

fn med_rps(cells: &Cells, i: usize, v: u32, p: &str) -> f64 {
    cell(cells, i, v, p).map_or(f64::NAN, |r| median(r.iter().map(|x| x.rps).collect()))
}

/// The guest's speed-up of `policy` at point `i`: the lower of its ratios
/// to `off` and to `pinned` (so neither floating nor pinning alone counts).
fn guest_speedup(cells: &Cells, i: usize, v: u32, policy: &str) -> f64 {
    let x = med_rps(cells, i, v, policy);
    let off = x / med_rps(cells, i, v, "off");
    let pinned = x / med_rps(cells, i, v, "pinned");
    match (off.is_finite(), pinned.is_finite()) {
        (true, true) => off.min(pinned),
        (true, false) => off,
        (false, true) => pinned,
        _ => f64::NAN,
    }
}

fn native_speedup(p: &Point) -> f64 {
    median(p.native[1].clone()) / median(p.native[0].clone())
}

fn report(
    args: &Args,
    points: &[Point],
    cells: &Cells,
    elapsed: std::time::Duration,
    others: f64,
) -> Result<String> {
    use std::fmt::Write as _;
    let mut s = String::new();
    writeln!(
        s,
        "## Headline: stage scheduling on an i-cache-bound guest workload\n"
    )?;
    writeln!(s, "Machine: {}.", machine())?;
    writeln!(
        s,
        "Background load: other processes used {others:.2} cores on average during the sweep (from /proc/stat minus this benchmark's own CPU time){}.",
        if others > 0.2 { " — the machine was not quiet; staged runs suffer most from a busy neighbour" } else { "" }
    )?;
    writeln!(
        s,
        "Command: `just bench-headline` (= `headline-bench --footprints {} --vcpus {} --rounds {} --threads {} --requests {} --calls {} --data-words {}`), {:.1} min; medians of {} rounds.\n",
        args.footprints.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(","),
        args.vcpus.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(","),
        args.rounds,
        args.threads,
        args.requests,
        args.calls,
        args.data_words,
        elapsed.as_secs_f64() / 60.0,
        args.rounds
    )?;
    writeln!(
        s,
        "Workload: `stage_workload`, 2 stages, {} calls per stage and request into functions chosen by the data, {} × 8 bytes of data per thread, {} threads × {} requests. All guest and native checksums agreed with the host build.\n",
        args.calls, args.data_words, args.threads, args.requests
    )?;
    writeln!(s, "### Native reference (host, 2 cores)\n")?;
    writeln!(s, "| footprint | whole req/s | staged req/s | speed-up |")?;
    writeln!(s, "|---:|---:|---:|---:|")?;
    for p in points {
        writeln!(
            s,
            "| {} KiB | {:.0} | {:.0} | {:.3}× |",
            code_bytes(2, p.params.funcs) / 1024,
            median(p.native[0].clone()),
            median(p.native[1].clone()),
            native_speedup(p)
        )?;
    }
    for &v in &args.vcpus {
        writeln!(s, "\n### Guest, {v} vCPUs on 2 cores\n")?;
        writeln!(
            s,
            "| footprint | policy | req/s | vs off | vs pinned | stage events | migrations | idle % | waits | wakes | map changes |"
        )?;
        writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        for (i, p) in points.iter().enumerate() {
            for pol in &args.policies {
                let Some(runs) = cell(cells, i, v, pol) else {
                    continue;
                };
                let last = runs.last().cloned().unwrap_or_default();
                let x = med_rps(cells, i, v, pol);
                let ratio = |b: &str| {
                    let r = x / med_rps(cells, i, v, b);
                    if r.is_finite() {
                        format!("{r:.3}×")
                    } else {
                        "-".into()
                    }
                };
                writeln!(
                    s,
                    "| {} KiB | {pol} | {x:.0} | {} | {} | {} | {} | {:.1} | {} | {} | {} |",
                    code_bytes(2, p.params.funcs) / 1024,
                    ratio("off"),
                    ratio("pinned"),
                    last.stage_events,
                    last.migrations,
                    median(runs.iter().map(|r| r.idle_pct).collect()),
                    last.waits,
                    last.wakes,
                    last.map_changes
                )?;
            }
        }
    }
    // Targets.
    let best = (0..points.len())
        .max_by(|a, b| native_speedup(&points[*a]).total_cmp(&native_speedup(&points[*b])))
        .context("no points")?;
    let host = native_speedup(&points[best]);
    let kib = code_bytes(2, points[best].params.funcs) / 1024;
    writeln!(s, "\n### Targets\n")?;
    writeln!(
        s,
        "The native reference's best speed-up is {host:.3}× at {kib} KiB. A guest policy's speed-up is the lower of its ratios to `off` and to `pinned`.\n"
    )?;
    if host <= 1.0 {
        writeln!(
            s,
            "- **not met**: the native reference shows no speed-up here (best {host:.3}×), so there is nothing to reach; rerun on a quiet machine (background load below)."
        )?;
    }
    for &v in &args.vcpus {
        let st = guest_speedup(cells, best, v, "static");
        let goal = 0.9 * host;
        writeln!(
            s,
            "- {v} vCPUs: `static` {st:.3}× ≥ 0.9 × {host:.3} = {goal:.3}×: **{}**",
            if st >= goal && host > 1.0 {
                "met"
            } else {
                "not met"
            }
        )?;
        let prop = med_rps(cells, best, v, "proportional") / med_rps(cells, best, v, "static");
        writeln!(
            s,
            "- {v} vCPUs: `proportional` / `static` = {prop:.3} (within 5 %: ≥ 0.95): **{}**",
            if prop >= 0.95 { "met" } else { "not met" }
        )?;
    }
    writeln!(s, "\nPlot: `{}`.", args.plot.display())?;
    Ok(s)
}

/// Series for the plot: per vCPU count, per policy, (footprint KiB, speed-up).
fn plot_series(args: &Args, points: &[Point], cells: &Cells) -> plot::Series {
    let xs: Vec<f64> = points
        .iter()
        .map(|p| code_bytes(2, p.params.funcs) as f64 / 1024.0)
        .collect();
    let native: Vec<(f64, f64)> = xs
        .iter()
        .zip(points)
        .map(|(x, p)| (*x, native_speedup(p)))
        .collect();
    let mut lines = Vec::new();
    for &v in &args.vcpus {
        for pol in args.policies.iter().filter(|p| *p != "off") {
            let ys: Vec<(f64, f64)> = (0..points.len())
                .map(|i| {
                    (
                        xs[i],
                        med_rps(cells, i, v, pol) / med_rps(cells, i, v, "off"),
                    )
                })
                .filter(|(_, y)| y.is_finite())
                .collect();
            lines.push((format!("{pol}, {v} vCPUs"), v, ys));
        }
    }
    plot::Series { native, lines }
}

const BEGIN: &str = "<!-- headline-bench:begin (written by `just bench-headline`) -->";
const END: &str = "<!-- headline-bench:end -->";

/// Replaces the text between the headline markers in `path` (appends the
/// section when the markers are absent; creates the file if needed).
fn write_results(path: &Path, section: &str) -> Result<()> {
    let old =
        std::fs::read_to_string(path).unwrap_or_else(|_| "# stagevm benchmark results\n".into());
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{BEGIN}\n{section}{}", &old[..b], &old[e..])
        }
        _ => format!("{}\n{BEGIN}\n{section}{END}\n", old.trim_end()),
    };
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}
