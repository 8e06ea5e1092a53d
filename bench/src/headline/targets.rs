//! The targets, each printed as met / not met (or why it was not
//! judged):
//!
//! * **T1** — at 2 vCPUs, at the footprint where the native reference gains
//!   most, `static` and `auto` each capture G ≥ 0.8 of the native gain in
//!   steady state, G = (policy ÷ better of `off`/`pinned` − 1) ÷ (native
//!   speed-up − 1) (judged only when the native reference gains ≥ 1.05×);
//! * **T2** (do no harm) — `auto` ≥ 0.97 × the better of `off` and `pinned`
//!   at every footprint, for each vCPU count, and on the staged workload,
//!   in steady state and over the whole run;
//! * **T3** — at 2 vCPUs `static` idles within 3 points of `off` at every
//!   footprint.
//!
//! None is judged when the background load says the machine was busy.

use std::fmt::Write as _;

use anyhow::Result;
use stagevm_bench::load::BUSY_CORES;

use crate::cells::{Cells, Measure, Work};
use crate::{Args, Point};

/// T1: the least native speed-up worth reaching.
pub const T1_NATIVE_MIN: f64 = 1.05;
/// T1: the share of the native gain a policy must capture (G).
const T1_CAPTURE: f64 = 0.8;
/// T2: `auto`'s least ratio to the better of `off` and `pinned`.
const T2_FLOOR: f64 = 0.97;
/// T3: how many percentage points more than `off` `static` may idle.
const T3_POINTS: f64 = 3.0;

/// Turns a comparison into a verdict, unless the machine was busy.
struct Judge {
    busy: bool,
}

impl Judge {
    fn verdict(&self, met: bool) -> &'static str {
        if self.busy {
            "**not judged: machine busy**"
        } else if met {
            "**met**"
        } else {
            "**not met**"
        }
    }
}

fn has(args: &Args, policy: &str) -> bool {
    args.policies.iter().any(|p| p == policy)
}

/// T1 at 2 vCPUs, for `static` and `auto`.
fn t1(s: &mut String, args: &Args, points: &[Point], cells: &Cells, judge: &Judge) -> Result<()> {
    let Some(best) = (0..points.len()).max_by(|a, b| {
        let key = |i: usize| {
            let m = points[i].native_speedup().med;
            if m.is_finite() {
                m
            } else {
                f64::NEG_INFINITY
            }
        };
        key(*a).total_cmp(&key(*b))
    }) else {
        writeln!(s, "- T1: not judged: no footprints")?;
        return Ok(());
    };
    let native = points[best].native_speedup();
    let (host, kib) = (native.med, points[best].code_kib());
    writeln!(
        s,
        "The native reference gains most at {kib} KiB: {}. G is taken on the medians, steady state: (policy ÷ better of `off`/`pinned` − 1) ÷ (native − 1).\n",
        native.ratio()
    )?;
    for pol in ["static", "auto"] {
        let head = format!("- T1 (2 vCPUs, {kib} KiB): `{pol}`");
        if !args.vcpus.contains(&2) || !has(args, pol) {
            writeln!(s, "{head}: not judged: no 2-vCPU `{pol}` runs")?;
            continue;
        }
        let Some(((r, base), g)) = cells
            .vs_better(Measure::Steady, Work::Footprint(best), 2, pol)
            .zip(crate::table::gain_capture(points, cells, best, 2, pol))
        else {
            writeln!(
                s,
                "{head}: **not judged: the native reference gains {host:.3}× < {T1_NATIVE_MIN}× here, or no steady-state figures** (nothing to capture)"
            )?;
            continue;
        };
        writeln!(
            s,
            "{head} {} vs `{base}`, native {host:.3}×: G = {g:.2} ≥ {T1_CAPTURE}: {}",
            r.ratio(),
            judge.verdict(g >= T1_CAPTURE)
        )?;
    }
    Ok(())
}

/// T2 for one vCPU count and workload, by `m`: the worst of `cells`
/// (label, work).
fn t2_line(
    s: &mut String,
    head: &str,
    cells: &Cells,
    (m, v): (Measure, u32),
    works: &[(String, Work)],
    judge: &Judge,
) -> Result<()> {
    let head = format!(
        "{head}, {}",
        if m == Measure::Steady {
            "steady state"
        } else {
            "whole run"
        }
    );
    let worst = works
        .iter()
        .filter_map(|(label, w)| {
            let (r, base) = cells.vs_better(m, *w, v, "auto")?;
            r.med.is_finite().then_some((label, r, base))
        })
        .min_by(|a, b| a.1.med.total_cmp(&b.1.med));
    match worst {
        Some((label, r, base)) => writeln!(
            s,
            "{head}; worst {} vs `{base}`{label}: {}",
            r.ratio(),
            judge.verdict(r.med >= T2_FLOOR)
        )?,
        None => writeln!(
            s,
            "{head}: not judged: no `auto` with `off` or `pinned` runs"
        )?,
    }
    Ok(())
}

/// T2 per vCPU count on each workload.
fn t2(s: &mut String, args: &Args, points: &[Point], cells: &Cells, judge: &Judge) -> Result<()> {
    let footprints: Vec<(String, Work)> = points
        .iter()
        .enumerate()
        .map(|(i, p)| (format!(" at {} KiB", p.code_kib()), Work::Footprint(i)))
        .collect();
    for m in [Measure::Steady, Measure::Whole] {
        for &v in &args.vcpus {
            let head = format!(
                "- T2 (do no harm, {v} vCPUs, i-cache-bound workload): `auto` ≥ {T2_FLOOR} × the better of `off` and `pinned` at every footprint"
            );
            t2_line(s, &head, cells, (m, v), &footprints, judge)?;
        }
        if !args.no_staged {
            for &v in &args.vcpus {
                let head = format!(
                    "- T2 (do no harm, {v} vCPUs, staged workload): `auto` ≥ {T2_FLOOR} × the better of `off` and `pinned`"
                );
                t2_line(
                    s,
                    &head,
                    cells,
                    (m, v),
                    &[(String::new(), Work::Staged)],
                    judge,
                )?;
            }
        }
    }
    Ok(())
}

/// T3: `static`'s idle at 2 vCPUs within 3 points of `off`'s.
fn t3(s: &mut String, args: &Args, points: &[Point], cells: &Cells, judge: &Judge) -> Result<()> {
    let head = format!(
        "- T3 (2 vCPUs): `static` idles at most {T3_POINTS} points more than `off` at every footprint"
    );
    if !args.vcpus.contains(&2) || !has(args, "static") || !has(args, "off") {
        writeln!(s, "{head}: not judged: no 2-vCPU `static` and `off` runs")?;
        return Ok(());
    }
    let diffs: Vec<(usize, f64, f64)> = (0..points.len())
        .map(|i| {
            let w = Work::Footprint(i);
            (i, cells.idle(w, 2, "static"), cells.idle(w, 2, "off"))
        })
        .collect();
    if let Some((i, ..)) = diffs
        .iter()
        .find(|(_, st, off)| !st.is_finite() || !off.is_finite())
    {
        writeln!(
            s,
            "{head}: not judged: no idle figures at {} KiB",
            points[*i].code_kib()
        )?;
        return Ok(());
    }
    let (i, st, off) = diffs
        .into_iter()
        // One-sided: `static` may idle less than `off`, not more.
        .max_by(|a, b| (a.1 - a.2).total_cmp(&(b.1 - b.2)))
        .expect("at least one footprint");
    writeln!(
        s,
        "{head}; worst {:+.1} points ({st:.1} % vs {off:.1} %) at {} KiB: {}",
        st - off,
        points[i].code_kib(),
        judge.verdict(st - off <= T3_POINTS)
    )?;
    Ok(())
}

/// The targets' section.
///
/// # Errors
/// Never in practice (formatting into a `String`).
pub fn report(args: &Args, points: &[Point], cells: &Cells, others: f64) -> Result<String> {
    let mut s = String::new();
    writeln!(s, "\n### Targets\n")?;
    let judge = Judge {
        busy: others > BUSY_CORES,
    };
    if judge.busy {
        writeln!(
            s,
            "Other processes used {others:.2} cores on average (> {BUSY_CORES}): the machine was busy, so no target is judged; rerun on a quiet machine.\n"
        )?;
    }
    t1(&mut s, args, points, cells, &judge)?;
    t2(&mut s, args, points, cells, &judge)?;
    t3(&mut s, args, points, cells, &judge)?;
    Ok(s)
}
