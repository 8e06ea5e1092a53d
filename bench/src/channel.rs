//! `channel-bench`: what the stage channel costs the guest, measured side by
//! side in one run (issue 22's acceptance, printed as met / not met).
//!
//! 1. **Mechanisms**, inside the guest in ring 3 (the test guest's
//!    `bench=1`, one vCPU, median of `--micro-runs`): one `stage_enter` with
//!    per-vCPU counters (ABI minor 2) and with the rings of a v1.1 guest
//!    (`counters=0`), a TSC read alone, a plain loop and a doorbell exit.
//! 2. **Throughput**: the footprint workload with 2 stages (`funcs=64
//!    data=64 threads=8`, short stage visits) at `--calls` calls per stage
//!    and `--vcpus` vCPUs, each point run `--rounds` times, interleaved
//!    (every configuration of every point once per round, the order
//!    rotated), each run sized by a calibration to last `--seconds`:
//!    `--no-stage-device` (the agent is a no-op), the channel on with
//!    `--policy off`, the same with `--stage-trace on`, and `--policy
//!    static` at `calls=20`. Guest requests/s of the staged phase, median
//!    (min–max) of the rounds' ratios to the no-device run of the same
//!    round, and the VMM's CPU time outside the vCPU threads (every helper
//!    thread's `cpu_ms` in the report, over the run's wall time).
//!
//! Targets: channel on ≥ 0.98× of no device at every point, traced ≥
//! 0.90×, `stage_enter` ≤ 10 ns, helpers ≤ 1 % of a core at the highest
//! event rate; and `static` at `calls=20` above the 0.30× it reached with
//! 64k-entry rings before the counters (issue 22, measured at 2 vCPUs, so
//! judged there; the 4-vCPU cell is shown). The background load of
//! other processes is printed: a busy machine voids the run.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;

use stagevm_bench::guest::{Boot, Output};
use stagevm_bench::load::{Meter, BUSY_CORES};
use stagevm_bench::stats::{median, Spread};
use stagevm_bench::target::Target;
use stagevm_testkit::console::field;

/// Measures what the stage channel costs the guest.
#[derive(Parser, Debug)]
#[command(name = "channel-bench", about)]
struct Args {
    #[command(flatten)]
    target: Target,
    /// Runs of the in-guest micro-benchmark (the median is reported).
    #[arg(long, default_value_t = 5)]
    micro_runs: usize,
    /// Interleaved rounds of the throughput points.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds each throughput run lasts (sized from a calibration run).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Function calls per stage and request (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [5u32, 20, 100, 400])]
    calls: Vec<u32>,
    /// vCPU counts (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [2u32, 4])]
    vcpus: Vec<u32>,
    /// Skip the throughput points (mechanisms only).
    #[arg(long)]
    micro_only: bool,
}

/// Targets (issue 22).
const OFF_TARGET: f64 = 0.98;
const TRACE_TARGET: f64 = 0.90;
const ENTER_TARGET_NS: f64 = 10.0;
const HELPER_TARGET: f64 = 0.01;
/// `static` at `calls=20` with 64k-entry rings before the counters, and
/// the vCPU count it was measured at (issue 22's table).
const STATIC_BEFORE: f64 = 0.30;
const STATIC_BEFORE_VCPUS: u32 = 2;

/// The configurations run at every point (`static` only at `calls=20`).
const CONFIGS: [(&str, &str, &[&str]); 4] = [
    ("no device", "off", &["--no-stage-device"]),
    ("channel, off", "off", &[]),
    ("channel, off, traced", "off", &["--stage-trace", "on"]),
    ("channel, static", "static", &[]),
];

/// One throughput point.
#[derive(Clone, Copy, Debug)]
struct Point {
    calls: u32,
    vcpus: u32,
    /// Requests per guest thread (from the calibration).
    requests: u64,
}

impl Point {
    fn cmdline(&self) -> String {
        format!(
            "iters=1 workload=footprint stages=2 funcs=64 calls={} data=64 threads=8 requests={}",
            self.calls, self.requests
        )
    }

    fn configs(&self) -> impl Iterator<Item = usize> + '_ {
        (0..CONFIGS.len()).filter(|c| *c != 3 || self.calls == 20)
    }
}

/// One run's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    rps: f64,
    /// Helper threads' CPU over the run's wall time (cores).
    helpers: f64,
    /// Stage events counted (transitions) per second of the staged phase.
    events_per_s: f64,
    traced: u64,
    trace_dropped: u64,
}

fn run(target: &Target, p: &Point, config: usize) -> Result<Run> {
    let (_, policy, extra) = CONFIGS[config];
    let cmdline = p.cmdline();
    let started = Instant::now();
    let out: Output = Boot {
        target,
        vcpus: p.vcpus,
        policy,
        cmdline: &cmdline,
        memory: None,
        stages: None,
        extra,
    }
    .run()?;
    let wall_s = started.elapsed().as_secs_f64();
    let line = out.line("testguest: staged phase");
    let rps: f64 =
        field(line, "ms, ").with_context(|| format!("no staged phase:\n{}", out.stdout))?;
    let ms: f64 = field(line, "in ").unwrap_or(f64::NAN);
    let helpers_ms: f64 = out.report.sched.helpers.iter().map(|h| h.cpu_ms).sum();
    let ch = out.report.stage_channel.clone().unwrap_or_default();
    let events: u64 = ch.vcpus.iter().map(|v| v.events).sum();
    Ok(Run {
        rps,
        helpers: helpers_ms / 1e3 / wall_s.max(1e-3),
        events_per_s: events as f64 * 1e3 / ms,
        traced: ch.traced_events,
        trace_dropped: ch.trace_dropped,
    })
}

/// The micro-benchmark's figures: (stage_enter ns, plain ns, doorbell µs,
/// rdtsc ns).
fn micro(target: &Target, extra: &str) -> Result<(f64, f64, f64, f64)> {
    let cmdline = format!("iters=1000 requests=0 bench=1 ring=4096 {extra}");
    let out = Boot {
        target,
        vcpus: 1,
        policy: "static",
        cmdline: &cmdline,
        memory: None,
        stages: None,
        extra: &[],
    }
    .run()?;
    let line = out.line("bench: stage_enter");
    let get = |k: &str| field::<f64>(line, k).with_context(|| format!("no '{k}' in: {line}"));
    Ok((
        get("stage_enter ")?,
        get("plain loop ")?,
        get("doorbell exit ")?,
        get("rdtsc ")?,
    ))
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "not met"
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.rounds == 0 || args.micro_runs == 0 {
        bail!("--rounds and --micro-runs must be at least 1");
    }
    let meter = Meter::start();
    // 1. Mechanisms.
    let mut micro_rows = Vec::new();
    for (name, extra) in [
        ("counters (minor 2)", ""),
        ("rings (v1.1 guest)", "counters=0"),
    ] {
        let mut v = Vec::new();
        for _ in 0..args.micro_runs {
            v.push(micro(&args.target, extra)?);
        }
        micro_rows.push((name, v));
    }
    println!(
        "stage channel mechanisms, in the guest in ring 3 (1 vCPU, median of {} runs):",
        args.micro_runs
    );
    println!("| mechanism | median | min–max |");
    println!("|---|---:|---:|");
    let col = |v: &[(f64, f64, f64, f64)], f: fn(&(f64, f64, f64, f64)) -> f64| {
        Spread::of(&v.iter().map(f).collect::<Vec<_>>())
    };
    let enter_ns = col(&micro_rows[0].1, |r| r.0).med;
    for (name, v) in &micro_rows {
        let s = col(v, |r| r.0);
        println!(
            "| stage_enter, {name} | {:.2} ns | {:.2}–{:.2} |",
            s.med, s.min, s.max
        );
    }
    let all: Vec<_> = micro_rows
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    for (name, f, unit) in [
        (
            "TSC read alone (rdtsc)",
            (|r: &(f64, f64, f64, f64)| r.3) as fn(&_) -> f64,
            "ns",
        ),
        ("plain loop iteration", |r| r.1, "ns"),
        ("doorbell exit (port I/O)", |r| r.2, "µs"),
    ] {
        let s = col(&all, f);
        println!(
            "| {name} | {:.2} {unit} | {:.2}–{:.2} |",
            s.med, s.min, s.max
        );
    }
    if args.micro_only {
        return Ok(());
    }
    // 2. Throughput: calibrate each point so a no-device run lasts
    // `seconds`.
    let mut points = Vec::new();
    for &vcpus in &args.vcpus {
        for &calls in &args.calls {
            let probe = Point {
                calls,
                vcpus,
                requests: 2000,
            };
            let r = run(&args.target, &probe, 0)?;
            let total = r.rps * args.seconds;
            let requests = (total / (8.0 * f64::from(vcpus))).ceil().max(100.0) as u64;
            eprintln!("channel-bench: calls={calls} vcpus={vcpus}: {requests} requests per thread");
            points.push(Point {
                calls,
                vcpus,
                requests,
            });
        }
    }
    let runs_total: usize = points.iter().map(|p| p.configs().count()).sum::<usize>() * args.rounds;
    let mut results: Vec<Vec<Vec<Run>>> = points
        .iter()
        .map(|_| vec![Vec::new(); CONFIGS.len()])
        .collect();
    let mut done = 0;
    for round in 0..args.rounds {
        for (i, p) in points.iter().enumerate() {
            let configs: Vec<usize> = p.configs().collect();
            // Rotate the order each round: no configuration always first.
            for k in 0..configs.len() {
                let c = configs[(k + round + i) % configs.len()];
                results[i][c].push(run(&args.target, p, c)?);
                done += 1;
                eprint!(
                    "\rchannel-bench: round {}/{}, run {done}/{runs_total}   ",
                    round + 1,
                    args.rounds
                );
            }
        }
    }
    eprintln!();
    let background = meter.others_cores();
    println!();
    println!(
        "guest throughput, footprint workload (2 stages, funcs=64 data=64 threads=8 per vCPU), {} interleaved rounds of ~{:.0} s; ratios to --no-stage-device of the same round, median (min–max):",
        args.rounds, args.seconds
    );
    println!("| vCPUs | calls | no device req/s | channel, off | traced (on) | trace kept | static | stage events/s | VMM helpers, % of a core (off) | (traced) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    // Worst median per target: (ratio, vCPUs, calls).
    let mut off_worst = (f64::INFINITY, 0, 0);
    let mut trace_worst = (f64::INFINITY, 0, 0);
    let mut static_at_2 = f64::NAN;
    // Highest event rate: the helpers' CPU there is the target's.
    let mut busiest: Option<(f64, f64)> = None;
    for (i, p) in points.iter().enumerate() {
        let r = &results[i];
        let base: Vec<f64> = r[0].iter().map(|x| x.rps).collect();
        let ratio = |c: usize| {
            Spread::of(
                &r[c]
                    .iter()
                    .zip(&base)
                    .map(|(x, b)| x.rps / b)
                    .collect::<Vec<_>>(),
            )
        };
        let (off, traced) = (ratio(1), ratio(2));
        // NaN (a failed point) is the worst of all.
        if off.med.is_nan() || off.med < off_worst.0 {
            off_worst = (off.med, p.vcpus, p.calls);
        }
        if traced.med.is_nan() || traced.med < trace_worst.0 {
            trace_worst = (traced.med, p.vcpus, p.calls);
        }
        let stat = (p.calls == 20).then(|| ratio(3));
        if let Some(s) = stat.as_ref().filter(|_| p.vcpus == STATIC_BEFORE_VCPUS) {
            static_at_2 = s.med;
        }
        let kept: f64 = {
            let (t, d): (u64, u64) = r[2]
                .iter()
                .fold((0, 0), |(t, d), x| (t + x.traced, d + x.trace_dropped));
            t as f64 / (t + d).max(1) as f64
        };
        let events = median(r[1].iter().map(|x| x.events_per_s).collect());
        let helpers = Spread::of(&r[1].iter().map(|x| x.helpers * 100.0).collect::<Vec<_>>());
        let helpers_traced =
            Spread::of(&r[2].iter().map(|x| x.helpers * 100.0).collect::<Vec<_>>());
        if busiest.is_none_or(|(e, _)| events > e) {
            busiest = Some((events, helpers.med));
        }
        println!(
            "| {} | {} | {} | {} | {} | {:.0} % | {} | {:.0} | {} | {} |",
            p.vcpus,
            p.calls,
            Spread::of(&base).rate(),
            off.ratio(),
            traced.ratio(),
            kept * 100.0,
            stat.map_or("-".into(), |s| s.ratio()),
            events,
            helpers.plain(2),
            helpers_traced.plain(2),
        );
    }
    let (events, helpers) = busiest.unwrap_or((0.0, f64::NAN));
    println!();
    println!(
        "background load of other processes: {background:.2} cores{}",
        if background > BUSY_CORES {
            " (busy machine: the figures are void)"
        } else {
            ""
        }
    );
    let busy = background > BUSY_CORES;
    // A verdict on a busy machine means nothing: every target says so instead.
    let met = |ok: bool| {
        if busy {
            "not judged (busy machine)"
        } else {
            met(ok)
        }
    };
    println!("| target | measured | |");
    println!("|---|---|---|");
    let worst = |(r, v, c): (f64, u32, u32)| format!("worst {r:.3}× ({v} vCPUs, calls={c})");
    println!(
        "| channel on, --policy off ≥ {OFF_TARGET}× of no device at every point | {} | {} |",
        worst(off_worst),
        met(off_worst.0 >= OFF_TARGET)
    );
    println!(
        "| traced ≥ {TRACE_TARGET}× at every point | {} | {} |",
        worst(trace_worst),
        met(trace_worst.0 >= TRACE_TARGET)
    );
    println!(
        "| stage_enter ≤ {ENTER_TARGET_NS} ns | {enter_ns:.2} ns | {} |",
        met(enter_ns <= ENTER_TARGET_NS)
    );
    println!(
        "| VMM helpers ≤ {} % of a core at the highest event rate | {helpers:.2} % at {events:.0} events/s | {} |",
        HELPER_TARGET * 100.0,
        met(helpers <= HELPER_TARGET * 100.0)
    );
    let (static_measured, static_verdict) = if static_at_2.is_nan() {
        (
            "not measured (no calls=20 point at that vCPU count)".to_string(),
            "not met",
        )
    } else {
        (
            format!("{static_at_2:.3}×"),
            met(static_at_2 > STATIC_BEFORE),
        )
    };
    println!(
        "| static at calls=20, {STATIC_BEFORE_VCPUS} vCPUs, above {STATIC_BEFORE}× (64k rings before) | {static_measured} | {static_verdict} |"
    );
    Ok(())
}
