//! `boot-bench`: how fast `stagevm` boots the test guest.
//!
//! Runs `stagevm` several times and prints, as medians (with min and max): the
//! time from spawning the VMM to the first byte of guest serial output, the
//! time to the VMM's exit, and the VMM's peak resident set size (`ru_maxrss`
//! from `wait4(2)`, KiB; it includes guest pages the guest touched, since
//! guest RAM is mapped in the VMM).

use std::io::{IsTerminal, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;

use stagevm_bench::target::Target;

/// Measures stagevm boot time and peak RSS.
#[derive(Parser, Debug)]
#[command(name = "boot-bench", about)]
struct Args {
    #[command(flatten)]
    target: Target,
    /// Number of runs (the median is reported).
    #[arg(long, default_value_t = 9)]
    runs: usize,
    /// vCPUs per run.
    #[arg(long, default_value_t = 2)]
    cpus: u32,
    /// Guest command line (small work, so boot and exit dominate).
    #[arg(long, default_value = "iters=1000 requests=0")]
    cmdline: String,
    /// Guest RAM.
    #[arg(long, default_value = "256M")]
    memory: String,
}

struct Sample {
    first_byte: Duration,
    exit: Duration,
    max_rss_kib: i64,
}

fn one_run(args: &Args) -> Result<Sample> {
    let start = Instant::now();
    let mut child = args
        .target
        .launch()
        .vcpus(args.cpus)
        .memory(&args.memory)
        .cmdline(&args.cmdline)
        .stdin(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawning {}", args.target.stagevm.display()))?;
    let mut stdout = child.take_stdout().context("stdout")?;
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut first = true;
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            if first {
                let _ = tx.send(start.elapsed());
                first = false;
            }
        }
    });
    // Blocking wait4: the exit is timed when it happens.
    let reaped = child.wait_rusage(None)?;
    let exit = reaped.at.duration_since(start);
    reader.join().ok();
    if reaped.status.code() != Some(0) {
        bail!(
            "stagevm did not exit 0 (wait status {:#x})",
            reaped.status.into_raw()
        );
    }
    let first_byte = rx.try_recv().context("the guest printed nothing")?;
    Ok(Sample {
        first_byte,
        exit,
        max_rss_kib: reaped.max_rss_kib as i64,
    })
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.runs == 0 {
        bail!("--runs 0: need at least one run");
    }
    let mut samples = Vec::with_capacity(args.runs);
    let progress = std::io::stderr().is_terminal();
    for i in 0..args.runs {
        if progress {
            eprint!("\rboot-bench: run {}/{}", i + 1, args.runs);
        }
        samples.push(one_run(&args)?);
    }
    if progress {
        eprintln!();
    }
    println!(
        "stagevm boot: {} runs, {} vCPUs, memory {}, kernel {} ({} bytes), cmdline \"{}\"",
        args.runs,
        args.cpus,
        args.memory,
        args.target.kernel.display(),
        std::fs::metadata(&args.target.kernel)
            .map(|m| m.len())
            .unwrap_or(0),
        args.cmdline
    );
    println!("| metric | median | min | max |");
    println!("|---|---:|---:|---:|");
    let ms = |f: fn(&Sample) -> Duration| {
        stats(samples.iter().map(|s| f(s).as_secs_f64() * 1e3).collect())
    };
    let (m, lo, hi) = ms(|s| s.first_byte);
    println!("| start → first serial byte (ms) | {m:.2} | {lo:.2} | {hi:.2} |");
    let (m, lo, hi) = ms(|s| s.exit);
    println!("| start → guest exit (ms) | {m:.2} | {lo:.2} | {hi:.2} |");
    let (m, lo, hi) = stats(
        samples
            .iter()
            .map(|s| s.max_rss_kib as f64 / 1024.0)
            .collect(),
    );
    println!("| VMM peak RSS (MiB) | {m:.1} | {lo:.1} | {hi:.1} |");
    Ok(())
}
