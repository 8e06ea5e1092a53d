//! `policy-bench`: the staged test guest under each `--policy` in one run,
//! side by side, plus the host mechanisms host-sched relies on.
//!
//! * Guest throughput (requests/s of the guest's staged phase, from its own
//!   TSC) per policy, as ratios to `off` and to `pinned` (so pinning alone is
//!   not counted as stage scheduling). Runs are interleaved round by round so
//!   machine noise spreads over all policies; medians are reported.
//! * vCPU re-pin latency: `sched_setaffinity` on a busy thread that moves it
//!   to the other core, and one that does not move it (µs).
//! * Guest thread migration latency, if the guest reports it (ns).

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Parser;
use host_sched::cpuset::CpuSet;
use host_sched::topology::{gettid, thread_affinity};
use stage_device::os::set_thread_affinity;

use stagevm_bench::guest::{Boot, GuestRun, STAGED_CMDLINE};
use stagevm_bench::stats::median;
use stagevm_bench::target::Target;

/// Runs the staged guest under each policy and measures re-pin latency.
#[derive(Parser, Debug)]
#[command(name = "policy-bench", about)]
struct Args {
    #[command(flatten)]
    target: Target,
    /// Rounds (each runs every policy once; medians are reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// vCPUs.
    #[arg(long, default_value_t = 4)]
    cpus: u32,
    /// Guest command line for the staged phase.
    #[arg(long, default_value = STAGED_CMDLINE)]
    cmdline: String,
    /// Policies to compare.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "off,pinned,static,proportional"
    )]
    policies: Vec<String>,
    /// Re-pin samples.
    #[arg(long, default_value_t = 400)]
    repins: usize,
    /// Least length of a run (s): one `off` run first sizes the command
    /// line's `requests=` so that a run takes about this long; 0 keeps it.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

/// One boot of the guest under `policy` with `cmdline`.
fn boot<'a>(args: &'a Args, cmdline: &'a str, policy: &'a str) -> Boot<'a> {
    Boot {
        target: &args.target,
        vcpus: args.cpus,
        policy,
        cmdline,
        memory: None,
        stages: None,
        extra: &[],
    }
}

/// Mean µs of `sched_setaffinity` on a spinning thread: moving it between
/// the first two allowed cores, and re-applying its current core.
fn repin_latency(samples: usize) -> Result<Option<(f64, f64)>> {
    let allowed = thread_affinity(0)?;
    let cores: Vec<usize> = allowed.iter().take(2).collect();
    if cores.len() < 2 {
        return Ok(None);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let spin_stop = stop.clone();
    let spinner = std::thread::spawn(move || {
        let _ = tx.send(gettid());
        let mut x = 0u64;
        while !spin_stop.load(std::sync::atomic::Ordering::Relaxed) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    });
    let tid = rx.recv()?;
    let one = |c: usize| -> CpuSet { [c].into_iter().collect() };
    let (mut moving, mut staying) = (0u128, 0u128);
    for i in 0..samples {
        let target = one(cores[i % 2]);
        let t0 = Instant::now();
        set_thread_affinity(tid, &target)?;
        moving += t0.elapsed().as_nanos();
        let t0 = Instant::now();
        set_thread_affinity(tid, &target)?;
        staying += t0.elapsed().as_nanos();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    spinner.join().ok();
    let n = samples as f64 * 1e3;
    Ok(Some((moving as f64 / n, staying as f64 / n)))
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.rounds == 0 || args.policies.is_empty() {
        bail!("--rounds and --policies must not be empty");
    }
    let cmdline = if args.seconds > 0.0 {
        stagevm_bench::guest::sized_cmdline(&boot(&args, &args.cmdline, "off"), args.seconds)?
    } else {
        args.cmdline.clone()
    };
    let mut samples: Vec<Vec<GuestRun>> = args.policies.iter().map(|_| Vec::new()).collect();
    for round in 0..args.rounds {
        for k in 0..args.policies.len() {
            // Rotate the order each round.
            let i = (k + round) % args.policies.len();
            eprintln!(
                "policy-bench: round {}/{}: {}",
                round + 1,
                args.rounds,
                args.policies[i]
            );
            let run = boot(&args, &cmdline, &args.policies[i]).run()?;
            samples[i].push(GuestRun::parse(&run)?);
        }
    }
    let medians = |f: fn(&GuestRun) -> f64| -> Vec<f64> {
        samples
            .iter()
            .map(|s| median(s.iter().map(f).collect()))
            .collect()
    };
    let (med, whole) = (medians(|x| x.steady_rps), medians(|x| x.rps));
    let base = |name: &str| args.policies.iter().position(|p| p == name).map(|i| med[i]);
    println!(
        "staged test guest, {} vCPUs, cmdline \"{cmdline}\", {} rounds (median guest requests/s; steady: between the 10 % and 90 % marks of the requests)",
        args.cpus, args.rounds
    );
    println!("| policy | steady requests/s | vs off | vs pinned | whole-run requests/s | migrations | steals | spills | map changes |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, p) in args.policies.iter().enumerate() {
        let ratio = |b: Option<f64>| b.map_or("-".to_string(), |b| format!("{:.3}×", med[i] / b));
        let last = samples[i].last().unwrap();
        println!(
            "| {p} | {:.0} | {} | {} | {:.0} | {} | {} | {} | {} |",
            med[i],
            ratio(base("off")),
            ratio(base("pinned")),
            whole[i],
            last.migrations,
            last.steals,
            last.spills,
            last.map_changes
        );
    }
    if let Some(i) = args.policies.iter().position(|p| p == "static") {
        let lat: Vec<(f64, f64)> = samples[i].iter().filter_map(|s| s.migration_ns).collect();
        if !lat.is_empty() {
            println!(
                "guest thread migration under static (yield → running on the target vCPU, queueing included): {:.0} ns; a switch that stays on its vCPU: {:.0} ns (medians)",
                median(lat.iter().map(|l| l.0).collect()),
                median(lat.iter().map(|l| l.1).collect())
            );
        }
    }
    match repin_latency(args.repins)? {
        Some((moving, staying)) => println!(
            "vCPU re-pin (sched_setaffinity on a busy thread, {} samples): {moving:.1} µs when it moves the thread, {staying:.1} µs when it does not",
            args.repins
        ),
        None => println!("vCPU re-pin: needs two allowed cores"),
    }
    Ok(())
}
