//! The report's tables: the header (machine, background load, command),
//! the native reference, the guest per vCPU count on the footprint
//! workload, and the staged (non-i-cache-bound) workload.

use std::fmt::Write as _;
use std::process::Command;
use std::time::Duration;

use anyhow::Result;
use stagevm_bench::load::BUSY_CORES;

use crate::cells::{Cells, Measure, Work};
use crate::{Args, Point};
use stagevm_bench::guest::GuestRun;
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
fn header(
    s: &mut String,
    args: &Args,
    points: &[Point],
    elapsed: Duration,
    others: f64,
) -> Result<()> {
    if args.section == "headline" {
        writeln!(
            s,
            "## Headline: stage scheduling on an i-cache-bound guest workload\n"
        )?;
    } else {
        writeln!(
            s,
            "## Headline, shape `{}`: {} calls per stage, {} data words per thread\n",
            args.section, args.calls, args.data_words
        )?;
    }
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
        "Command: `headline-bench --footprints {} --vcpus {} --policies {} --rounds {} --threads {} --requests {} --seconds {} --calls {} --data-words {}{staged}{}` (`just bench-headline` runs the defaults), {:.1} min; median (min–max) of {} interleaved rounds; ratios are taken per round.\n",
        join(&args.footprints),
        join(&args.vcpus),
        args.policies.join(","),
        args.rounds,
        args.threads,
        args.requests,
        args.seconds,
        args.calls,
        args.data_words,
        if args.section == "headline" { String::new() } else { format!(" --section {}", args.section) },
        elapsed.as_secs_f64() / 60.0,
        args.rounds
    )?;
    let requests: Vec<String> = points
        .iter()
        .map(|p| format!("{} at {} KiB", p.requests, p.code_kib()))
        .collect();
    writeln!(
        s,
        "Workload: `stage_workload`, 2 stages, {} calls per stage and request into functions chosen by the data, {} × 8 bytes of data per thread, {} threads; requests per thread (sized for runs of ≥ {} s at the native rate): {}. All guest and native checksums agreed with the host build.\n",
        args.calls,
        args.data_words,
        args.threads,
        args.seconds,
        requests.join(", ")
    )?;
    writeln!(
        s,
        "Guest throughput is the **steady state**: requests completed between the 10 % and 90 % marks of all requests over the time between them (the guest's own TSC), which leaves out the start-up (threads spreading, `auto`'s first trial) and the tail; the whole run's figure is beside it. G = (policy ÷ better of `off`/`pinned` − 1) ÷ (native speed-up − 1), steady state, where the native reference gains ≥ 1.05×.\n"
    )?;
    Ok(())
}

/// Gain capture of `pol` at footprint `i`, `v` vCPUs (steady state), as
/// text: "–" for the unstaged policies and where the native gain is below
/// [`crate::targets::T1_NATIVE_MIN`].
pub fn gain_capture(points: &[Point], cells: &Cells, i: usize, v: u32, pol: &str) -> Option<f64> {
    let native = points[i].native_speedup().med;
    let gains = native.is_finite() && native >= crate::targets::T1_NATIVE_MIN;
    if pol == "off" || pol == "pinned" || !gains {
        return None;
    }
    let (r, _) = cells.vs_better(Measure::Steady, Work::Footprint(i), v, pol)?;
    r.med.is_finite().then(|| (r.med - 1.0) / (native - 1.0))
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

/// `x` with `digits` decimals, "–" when it is not a number.
fn num(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "–".into(),
    }
}

/// The columns shared by both workloads' guest tables, after the row's
/// key: steady req/s, vs off, vs pinned, whole-run req/s and its ratio to
/// the better unstaged policy, then the medians of migrations, steals,
/// spills, idle %, waits and map changes.
fn guest_columns(cells: &Cells, w: Work, v: u32, pol: &str) -> String {
    let (st, wh) = (Measure::Steady, Measure::Whole);
    let count = |f: fn(&GuestRun) -> u64| num(Some(cells.med_count(w, v, pol, f)), 0);
    format!(
        "{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}",
        Spread::of(&cells.rps(st, w, v, pol)).rate(),
        cells.ratio(st, w, v, pol, "off").ratio(),
        cells.ratio(st, w, v, pol, "pinned").ratio(),
        Spread::of(&cells.rps(wh, w, v, pol)).rate(),
        cells
            .vs_better(wh, w, v, pol)
            .map_or("–".into(), |(r, _)| r.ratio()),
        count(|r| r.migrations),
        count(|r| r.steals),
        count(|r| r.spills),
        num(Some(cells.idle(w, v, pol)), 1),
        count(|r| r.waits),
        count(|r| r.map_changes),
    )
}

const GUEST_HEAD: &str = "steady req/s | vs off | vs pinned | whole-run req/s | whole vs better | migrations | steals | spills | idle % | waits | map changes |";

/// The guest's table at `v` vCPUs on the footprint workload.
fn guest(s: &mut String, args: &Args, points: &[Point], cells: &Cells, v: u32) -> Result<()> {
    writeln!(s, "\n### Guest, {v} vCPUs on 2 cores\n")?;
    writeln!(s, "| footprint | policy | G | {GUEST_HEAD}")?;
    writeln!(
        s,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    for (i, p) in points.iter().enumerate() {
        let w = Work::Footprint(i);
        for pol in &args.policies {
            if cells.runs(w, v, pol).is_none() {
                continue;
            }
            writeln!(
                s,
                "| {} KiB | {pol} | {} | {} |",
                p.code_kib(),
                num(gain_capture(points, cells, i, v, pol), 2),
                guest_columns(cells, w, v, pol)
            )?;
        }
    }
    Ok(())
}

/// The staged (non-i-cache-bound) workload's table.
fn staged(s: &mut String, args: &Args, cmdline: &str, cells: &Cells) -> Result<()> {
    writeln!(
        s,
        "\n### Guest, staged workload (not i-cache bound) on 2 cores\n"
    )?;
    writeln!(
        s,
        "The test guest's default staged workload (`just bench-policies`, `requests=` sized by `--seconds`), cmdline `{cmdline}`, in the same rounds.\n"
    )?;
    writeln!(s, "| vCPUs | policy | {GUEST_HEAD}")?;
    writeln!(
        s,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    let w = Work::Staged;
    for &v in &args.vcpus {
        for pol in &args.policies {
            if cells.runs(w, v, pol).is_none() {
                continue;
            }
            writeln!(s, "| {v} | {pol} | {} |", guest_columns(cells, w, v, pol))?;
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
    staged_cmdline: &str,
    points: &[Point],
    cells: &Cells,
    elapsed: Duration,
    others: f64,
) -> Result<String> {
    let mut s = String::new();
    header(&mut s, args, points, elapsed, others)?;
    native(&mut s, points)?;
    for &v in &args.vcpus {
        guest(&mut s, args, points, cells, v)?;
    }
    if !args.no_staged {
        staged(&mut s, args, staged_cmdline, cells)?;
    }
    Ok(s)
}
