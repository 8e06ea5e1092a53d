//! The report's tables: the header (machine, background load, command),
//! the native references (whole, spatial, cohort), the guest per vCPU
//! count on the footprint workload with each cell's gain capture G, and the
//! staged (non-i-cache-bound) workload.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;
use stagevm_bench::load::BUSY_CORES;

use crate::cells::{Cells, Measure, Work};
use crate::modes::{native_ref, Sched, OFF, PINNED};
use crate::{Args, Point};
use stagevm_bench::guest::GuestRun;
use stagevm_bench::native::Mode;
use stagevm_bench::stats::Spread;

/// Everything the sweep ran and measured.
pub struct Sweep<'a> {
    /// The command line.
    pub args: &'a Args,
    /// The guest cells, in order.
    pub scheds: &'a [Sched],
    /// The footprints with their native runs.
    pub points: &'a [Point],
    /// The guest runs.
    pub cells: &'a Cells,
}

impl Sweep<'_> {
    /// The labels of the cells, in order.
    pub fn labels(&self) -> Vec<String> {
        self.scheds.iter().map(Sched::label).collect()
    }

    /// Whether a cell labelled `label` is part of the sweep.
    pub fn has(&self, label: &str) -> bool {
        self.scheds.iter().any(|s| s.label() == label)
    }
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// The section's header: machine, background load, command and workloads.
fn header(s: &mut String, sw: &Sweep, elapsed: Duration, others: f64) -> Result<()> {
    let (args, points) = (sw.args, sw.points);
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
    writeln!(s, "Machine: {}.", stagevm_bench::machine())?;
    writeln!(
        s,
        "Background load: other processes used {others:.2} cores on average during the sweep (from /proc/stat minus this benchmark's own CPU time){}.",
        if others > BUSY_CORES { " — the machine was not quiet; staged runs suffer most from a busy neighbour" } else { "" }
    )?;
    let mut staged = if args.no_staged {
        " --no-staged".to_string()
    } else {
        String::new()
    };
    if args.workload_stages != 2 {
        staged += &format!(
            " --workload-stages {} --stages {}",
            args.workload_stages,
            args.stages.display()
        );
    }
    writeln!(
        s,
        "Command: `headline-bench --footprints {} --vcpus {} --policies {} --visits {} --rounds {} --threads {} --requests {} --seconds {} --calls {} --data-words {}{staged}{}` (`just bench-headline` runs the defaults), {:.1} min; median (min–max) of {} interleaved rounds; ratios are taken per round.\n",
        join(&args.footprints),
        join(&args.vcpus),
        args.policies.join(","),
        args.visits.join(","),
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
        "Workload: `stage_workload`, {} stages, {} calls per stage and request into functions chosen by the data, {} × 8 bytes of data per thread, {} threads; requests per thread (sized for runs of ≥ {} s at the native rate): {}. All guest and native checksums agreed with the host build.\n",
        args.workload_stages,
        args.calls,
        args.data_words,
        args.threads,
        args.seconds,
        requests.join(", ")
    )?;
    writeln!(
        s,
        "Cells: host policy + stage-visit policy (stagevm's `--policy` and `--visit`): `pinned+fifo` and `off` are unstaged, `pinned+cohort` etc. stage in time only (each vCPU serves its threads stage by stage, no migration), `static+fifo` and `proportional` in space only (stages on their own cores, threads migrate), `static+cohort` etc. both; `auto` chooses its plan and visit policy itself.\n"
    )?;
    writeln!(
        s,
        "Guest throughput is the **steady state**: requests completed between the 10 % and 90 % marks of all requests over the time between them (the guest's own TSC), which leaves out the start-up (threads spreading, `auto`'s first trial) and the tail; the whole run's figure is beside it. G = (cell ÷ better of `off`/`pinned+fifo` at the same vCPU count − 1) ÷ (native gain − 1), steady state, where that native gain is ≥ {}×: spatial cells against the native spatial gain (spatial ÷ whole), temporal cells against the native cohort gain (cohort ÷ whole), cells staging both ways and `auto` against the larger of the two.\n",
        crate::targets::T1_NATIVE_MIN
    )?;
    Ok(())
}

/// Gain capture G of cell `sched` at footprint `i`, `v` vCPUs (steady
/// state, medians), with the native reference it was taken against:
/// `None` for the unstaged cells, where the cell or a baseline did not run,
/// and where that native gain is below [`crate::targets::T1_NATIVE_MIN`].
pub fn gain_capture(sw: &Sweep, i: usize, v: u32, sched: &Sched) -> Option<(f64, Mode, Spread)> {
    let (mode, native) = native_ref(&sw.points[i], sched.staging())?;
    if !(native.med.is_finite() && native.med >= crate::targets::T1_NATIVE_MIN) {
        return None;
    }
    let (r, _) = sw
        .cells
        .vs_better(Measure::Steady, Work::Footprint(i), v, &sched.label())?;
    r.med
        .is_finite()
        .then(|| ((r.med - 1.0) / (native.med - 1.0), mode, native))
}

/// The native references' table: requests/s of each mode and the gains
/// over `whole`.
fn native(s: &mut String, points: &[Point]) -> Result<()> {
    writeln!(s, "### Native references (host, 2 cores)\n")?;
    writeln!(
        s,
        "`whole`: each core runs whole requests of its connections; `spatial`: one core runs the first stage of every request, the other the second, connections handed over through rings; `cohort`: each core runs its own connections stage by stage (stage 0 of every connection's request back to back, then stage 1), no migration.\n"
    )?;
    writeln!(
        s,
        "| footprint | whole req/s | spatial req/s | cohort req/s | spatial gain | cohort gain |"
    )?;
    writeln!(s, "|---:|---:|---:|---:|---:|---:|")?;
    for p in points {
        let rate = |m: Mode| Spread::of(&p.native[m.index()]).rate();
        writeln!(
            s,
            "| {} KiB | {} | {} | {} | {} | {} |",
            p.code_kib(),
            rate(Mode::Whole),
            rate(Mode::Spatial),
            rate(Mode::Cohort),
            p.native_gain(Mode::Spatial).ratio(),
            p.native_gain(Mode::Cohort).ratio()
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
/// key: steady req/s, vs off, vs pinned+fifo, whole-run req/s and its ratio to
/// the better unstaged policy, then the medians of migrations, steals,
/// spills, idle %, waits and map changes.
fn guest_columns(cells: &Cells, w: Work, v: u32, pol: &str) -> String {
    let (st, wh) = (Measure::Steady, Measure::Whole);
    let count = |f: fn(&GuestRun) -> u64| num(Some(cells.med_count(w, v, pol, f)), 0);
    format!(
        "{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}",
        Spread::of(&cells.rps(st, w, v, pol)).rate(),
        cells.ratio(st, w, v, pol, OFF).ratio(),
        cells.ratio(st, w, v, pol, PINNED).ratio(),
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

const GUEST_HEAD: &str = "steady req/s | vs off | vs pinned+fifo | whole-run req/s | whole vs better | migrations | steals | spills | idle % | waits | map changes |";

/// The guest's table at `v` vCPUs on the footprint workload.
fn guest(s: &mut String, sw: &Sweep, v: u32) -> Result<()> {
    writeln!(s, "\n### Guest, {v} vCPUs on 2 cores\n")?;
    writeln!(s, "| footprint | cell | G | vs native | {GUEST_HEAD}")?;
    writeln!(
        s,
        "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    for (i, p) in sw.points.iter().enumerate() {
        let w = Work::Footprint(i);
        for sched in sw.scheds {
            let label = sched.label();
            if sw.cells.runs(w, v, &label).is_none() {
                continue;
            }
            let g = gain_capture(sw, i, v, sched);
            writeln!(
                s,
                "| {} KiB | {label} | {} | {} | {} |",
                p.code_kib(),
                num(g.map(|g| g.0), 2),
                g.map_or("–".into(), |(_, m, n)| format!(
                    "{} {:.3}×",
                    m.name(),
                    n.med
                )),
                guest_columns(sw.cells, w, v, &label)
            )?;
        }
    }
    Ok(())
}

/// The staged (non-i-cache-bound) workload's table.
fn staged(s: &mut String, sw: &Sweep, cmdline: &str) -> Result<()> {
    writeln!(
        s,
        "\n### Guest, staged workload (not i-cache bound) on 2 cores\n"
    )?;
    writeln!(
        s,
        "The test guest's default staged workload (`just bench-policies`, `requests=` sized by `--seconds`), cmdline `{cmdline}`, in the same rounds.\n"
    )?;
    writeln!(s, "| vCPUs | cell | {GUEST_HEAD}")?;
    writeln!(
        s,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    let w = Work::Staged;
    for &v in &sw.args.vcpus {
        for label in sw.labels() {
            if sw.cells.runs(w, v, &label).is_none() {
                continue;
            }
            writeln!(
                s,
                "| {v} | {label} | {} |",
                guest_columns(sw.cells, w, v, &label)
            )?;
        }
    }
    Ok(())
}

/// The report's text up to the targets.
///
/// # Errors
/// Never in practice (formatting into a `String`).
pub fn report(sw: &Sweep, staged_cmdline: &str, elapsed: Duration, others: f64) -> Result<String> {
    let mut s = String::new();
    header(&mut s, sw, elapsed, others)?;
    native(&mut s, sw.points)?;
    for &v in &sw.args.vcpus {
        guest(&mut s, sw, v)?;
    }
    if !sw.args.no_staged {
        staged(&mut s, sw, staged_cmdline)?;
    }
    Ok(s)
}
