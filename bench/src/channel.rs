//! `channel-bench`: cost of the stage channel's mechanisms, measured inside
//! the guest in ring 3 (the test guest's `bench=1` mode) and printed side by
//! side: one `stage_enter` (a ring write, no exit), the same loop without the
//! report, and one doorbell exit (port I/O from ring 3). Medians over runs.

use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Parser;

use stagevm_bench::stats::median;
use stagevm_bench::target::Target;

/// Measures stage_enter and doorbell costs inside the guest.
#[derive(Parser, Debug)]
#[command(name = "channel-bench", about)]
struct Args {
    #[command(flatten)]
    target: Target,
    /// Number of runs (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Ring entries per vCPU (batch size is one less).
    #[arg(long, default_value_t = 4096)]
    ring: u32,
}

/// (stage_enter ns, plain ns, doorbell µs) parsed from the guest's line.
fn parse(line: &str) -> Option<(f64, f64, f64)> {
    let num_after = |key: &str| -> Option<f64> {
        let rest = &line[line.find(key)? + key.len()..];
        rest.split_whitespace().next()?.parse().ok()
    };
    Some((
        num_after("stage_enter ")?,
        num_after("plain loop ")?,
        num_after("doorbell exit ")?,
    ))
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.runs == 0 {
        bail!("--runs 0: need at least one run");
    }
    let mut samples = Vec::new();
    for _ in 0..args.runs {
        let out = Command::new(&args.target.stagevm)
            .arg("--kernel")
            .arg(&args.target.kernel)
            .args(["--cpus", "boot=1", "--cmdline"])
            .arg(format!("iters=1000 requests=0 bench=1 ring={}", args.ring))
            .output()
            .with_context(|| format!("running {}", args.target.stagevm.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .find(|l| l.starts_with("bench: stage_enter"))
            .with_context(|| format!("no bench line in guest output:\n{stdout}"))?;
        samples.push(parse(line).with_context(|| format!("unparseable: {line}"))?);
    }
    let enter = median(samples.iter().map(|s| s.0).collect());
    let plain = median(samples.iter().map(|s| s.1).collect());
    let exit = median(samples.iter().map(|s| s.2).collect());
    println!(
        "stage channel mechanisms, measured in the guest in ring 3: {} runs, ring {} entries",
        args.runs, args.ring
    );
    println!("| mechanism | median | vs plain loop |");
    println!("|---|---:|---:|");
    println!("| plain guest loop iteration | {plain:.2} ns | 1.0× |");
    println!(
        "| stage_enter (ring write, no exit) | {enter:.2} ns | {:.1}× |",
        enter / plain
    );
    println!(
        "| doorbell exit (port I/O from ring 3) | {exit:.2} µs | {:.0}× |",
        exit * 1000.0 / plain
    );
    Ok(())
}
