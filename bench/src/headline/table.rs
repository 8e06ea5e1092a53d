//! The report's tables: the header (machine, background load, command),
//! the native reference, the guest per vCPU count on the footprint
//! workload, and the staged (non-i-cache-bound) workload.

use std::fmt::Write as _;
use std::process::Command;
use std::time::Duration;

use anyhow::Result;
use stagevm_bench::load::BUSY_CORES;

use crate::cells::{Cells, Work};
use crate::{Args, Point};
use stagevm_bench::stats::Spread;

/// The CPU model and caches (from `lscpu`).
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

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// The section's header: machine, background load, command and workloads.
fn header(s: &mut String, args: &Args, elapsed: Duration, others: f64) -> Result<()> {
    writeln!(
        s,
        "## Headline: stage scheduling on an i-cache-bound guest workload\n"
    )?;
    writeln!(s, "Machine: {}.", machine())?;
    writeln!(
        s,
        "Background load: other processes used {others:.2} cores on average during the sweep (from /proc/stat minus this benchmark's own CPU time){}.",
        if others > BUSY_CORES { " — the machine was not quiet; staged runs suffer most from a busy neighbour" } else { "" }
    )?;
    let staged = if args.no_staged {
        " --no-staged".to_string()
    } else {
        String::new()
    };
    writeln!(
        s,
        "Command: `just bench-headline` (= `headline-bench --footprints {} --vcpus {} --policies {} --rounds {} --threads {} --requests {} --calls {} --data-words {}{staged}`), {:.1} min; median (min–max) of {} interleaved rounds; ratios are taken per round.\n",
        join(&args.footprints),
        join(&args.vcpus),
        args.policies.join(","),
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
    Ok(())
}

/// The native reference's table.
fn native(s: &mut String, points: &[Point]) -> Result<()> {
    writeln!(s, "### Native reference (host, 2 cores)\n")?;
    writeln!(s, "| footprint | whole req/s | staged req/s | speed-up |")?;
    writeln!(s, "|---:|---:|---:|---:|")?;
    for p in points {
        writeln!(
            s,
            "| {} KiB | {} | {} | {} |",
            p.code_kib(),
            Spread::of(&p.native[0]).rate(),
            Spread::of(&p.native[1]).rate(),
            p.native_speedup().ratio()
        )?;
    }
    Ok(())
}

/// The guest's table at `v` vCPUs on the footprint workload.
fn guest(s: &mut String, args: &Args, points: &[Point], cells: &Cells, v: u32) -> Result<()> {
    writeln!(s, "\n### Guest, {v} vCPUs on 2 cores\n")?;
    writeln!(
        s,
        "| footprint | policy | req/s | vs off | vs pinned | stage events | migrations | idle % | waits | wakes | map changes |"
    )?;
    writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for (i, p) in points.iter().enumerate() {
        let w = Work::Footprint(i);
        for pol in &args.policies {
            let Some(runs) = cells.runs(w, v, pol) else {
                continue;
            };
            let last = runs.last().cloned().unwrap_or_default();
            writeln!(
                s,
                "| {} KiB | {pol} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} |",
                p.code_kib(),
                Spread::of(&cells.rps(w, v, pol)).rate(),
                cells.ratio(w, v, pol, "off").ratio(),
                cells.ratio(w, v, pol, "pinned").ratio(),
                last.stage_events,
                last.migrations,
                cells.idle(w, v, pol),
                last.waits,
                last.wakes,
                last.map_changes
            )?;
        }
    }
    Ok(())
}

/// The staged (non-i-cache-bound) workload's table.
fn staged(s: &mut String, args: &Args, cells: &Cells) -> Result<()> {
    writeln!(
        s,
        "\n### Guest, staged workload (not i-cache bound) on 2 cores\n"
    )?;
    writeln!(
        s,
        "The test guest's default staged workload (`just bench-policies`), cmdline `{}`, in the same rounds.\n",
        args.staged_cmdline
    )?;
    writeln!(
        s,
        "| vCPUs | policy | req/s | vs off | vs pinned | migrations | idle % | map changes |"
    )?;
    writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|")?;
    let w = Work::Staged;
    for &v in &args.vcpus {
        for pol in &args.policies {
            let Some(runs) = cells.runs(w, v, pol) else {
                continue;
            };
            let last = runs.last().cloned().unwrap_or_default();
            writeln!(
                s,
                "| {v} | {pol} | {} | {} | {} | {} | {:.1} | {} |",
                Spread::of(&cells.rps(w, v, pol)).rate(),
                cells.ratio(w, v, pol, "off").ratio(),
                cells.ratio(w, v, pol, "pinned").ratio(),
                last.migrations,
                cells.idle(w, v, pol),
                last.map_changes
            )?;
        }
    }
    Ok(())
}

/// The report's text up to the targets.
///
/// # Errors
/// Never in practice (formatting into a `String`).
pub fn report(
    args: &Args,
    points: &[Point],
    cells: &Cells,
    elapsed: Duration,
    others: f64,
) -> Result<String> {
    let mut s = String::new();
    header(&mut s, args, elapsed, others)?;
    native(&mut s, points)?;
    for &v in &args.vcpus {
        guest(&mut s, args, points, cells, v)?;
    }
    if !args.no_staged {
        staged(&mut s, args, cells)?;
    }
    Ok(s)
}
