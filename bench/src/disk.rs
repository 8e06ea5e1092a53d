//! `disk-bench`: virtio-blk read throughput (MiB/s) and per-request latency
//! (µs) measured by the guest in ring 3 for 4 KiB and 64 KiB requests, next
//! to `dd` of the same file on the host (page cache warm, as for the guest),
//! plus the cost of one MMIO read exit from ring 3. Medians over runs.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;

use stagevm_bench::stats::median;
use stagevm_bench::target::Target;
use stagevm_testkit::console::number_after;

/// Measures virtio-blk reads against dd.
#[derive(Parser, Debug)]
#[command(name = "disk-bench", about)]
struct Args {
    #[command(flatten)]
    target: Target,
    /// Disk size in MiB.
    #[arg(long, default_value_t = 16)]
    mib: usize,
    /// Runs per request size.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

struct Guest {
    us: f64,
    requests: f64,
    mmio_ns: f64,
}

fn guest_read(args: &Args, disk: &std::path::Path, chunk: usize) -> Result<Guest> {
    let out = args
        .target
        .launch()
        .disk(format!("path={},readonly=on", disk.display()))
        .cmdline(&format!("iters=1000 requests=0 diskchunk={chunk}"))
        .output()
        .context("running stagevm")?;
    let stdout = out.stdout;
    let line = stdout
        .lines()
        .find(|l| l.starts_with("testguest: disk "))
        .with_context(|| format!("no disk line in the guest output:\n{stdout}"))?;
    Ok(Guest {
        requests: line
            .split(", ")
            .find_map(|part| part.split_once(" requests of ")?.0.parse().ok())
            .context("request count")?,
        us: number_after(line, " bytes in ").context("time")?,
        mmio_ns: number_after(line, "mmio read exit ").context("mmio")?,
    })
}

fn dd(disk: &std::path::Path, chunk: usize) -> Result<f64> {
    let t0 = Instant::now();
    let st = Command::new("dd")
        .arg(format!("if={}", disk.display()))
        .arg("of=/dev/null")
        .arg(format!("bs={chunk}"))
        .arg("status=none")
        .status()
        .context("running dd")?;
    if !st.success() {
        bail!("dd failed: {st}");
    }
    Ok(t0.elapsed().as_secs_f64() * 1e6)
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.runs == 0 || args.mib == 0 {
        bail!("--runs and --mib must be positive");
    }
    let disk = std::env::temp_dir().join(format!("disk-bench-{}.img", std::process::id()));
    let bytes = args.mib << 20;
    std::fs::write(&disk, stagevm_mkdisk::generate(bytes))?;
    dd(&disk, 1 << 20)?; // warm the page cache
    println!("virtio-blk reads of a {} MiB disk, {} runs each (medians); host dd of the same file, page cache warm", args.mib, args.runs);
    println!(
        "| request | guest MiB/s | guest µs/request | dd MiB/s | dd µs/request | guest/dd time |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut mmio = Vec::new();
    for chunk in [4096usize, 65536] {
        let mut g_us = Vec::new();
        let mut reqs = 0.0;
        let mut d_us = Vec::new();
        for _ in 0..args.runs {
            let g = guest_read(&args, &disk, chunk)?;
            reqs = g.requests;
            g_us.push(g.us);
            mmio.push(g.mmio_ns);
            d_us.push(dd(&disk, chunk)?);
        }
        let (g, d) = (median(g_us), median(d_us));
        let mib = args.mib as f64;
        println!(
            "| {} KiB | {:.1} | {:.1} | {:.1} | {:.1} | {:.1}× |",
            chunk / 1024,
            mib / (g / 1e6),
            g / reqs,
            mib / (d / 1e6),
            d / (bytes / chunk) as f64,
            g / d
        );
    }
    println!(
        "one MMIO read exit from guest ring 3: {:.1} µs (median)",
        median(mmio) / 1e3
    );
    let _ = std::fs::remove_file(&disk);
    Ok(())
}
