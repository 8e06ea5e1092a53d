//! The issues' targets, each printed as met / not met (or why it was not
//! judged):
//!
//! * **T1** — at 2 vCPUs, at the footprint where the native spatial
//!   reference gains most, `static+fifo` and `auto` each capture G ≥ 0.8
//!   of their native gain in steady state, G = (cell ÷ better of
//!   `off`/`pinned+fifo` − 1) ÷ (native gain − 1) (judged only when that
//!   native gain is ≥ 1.05×; [`crate::table::gain_capture`]);
//! * **T2** (do no harm) — `auto` ≥ 0.97 × the better of `off` and
//!   `pinned+fifo` at every footprint, for each vCPU count, and on the
//!   staged workload, in steady state and over the whole run;
//! * **T3** — at 2 vCPUs `static+fifo` idles within 3 points of `off` at
//!   every footprint;
//! * **T4** (temporal staging) — at the footprint where the native cohort
//!   reference gains most (judged only where it gains ≥ 1.05×), the best
//!   temporal visit policy under `pinned` at 2 vCPUs captures G ≥ 0.8 of
//!   the native cohort gain, steady state;
//! * **T5** (`auto` picks well) — `auto` ≥ 0.97 × the best other cell
//!   (fixed policy + visit policy) of the same vCPU count at every
//!   footprint, steady state.
//!
//! None is judged when the background load says the machine was busy.

use std::fmt::Write as _;

use anyhow::Result;
use stagevm_bench::load::BUSY_CORES;

use crate::cells::{Cells, Measure, Work};
use crate::modes::{Staging, AUTO, OFF, STATIC};
use crate::table::{gain_capture, Sweep};
use crate::Point;
use stagevm_bench::native::Mode;

/// T1: the least native speed-up worth reaching.
pub const T1_NATIVE_MIN: f64 = 1.05;
/// T1: the share of the native gain a policy must capture (G).
const T1_CAPTURE: f64 = 0.8;
/// T2: `auto`'s least ratio to the better of `off` and `pinned+fifo`.
const T2_FLOOR: f64 = 0.97;
/// T3: how many percentage points more than `off` `static+fifo` may idle.
const T3_POINTS: f64 = 3.0;
/// T4: the share of the native cohort gain the best temporal policy under
/// `pinned` must capture (G).
const T4_CAPTURE: f64 = 0.8;
/// T5: `auto`'s least ratio to the best other cell.
const T5_FLOOR: f64 = 0.97;

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

/// The footprint where native reference `mode` gains most (by median;
/// `None` without footprints).
fn best_native(points: &[Point], mode: Mode) -> Option<usize> {
    (0..points.len()).max_by(|a, b| {
        let key = |i: usize| {
            let m = points[i].native_gain(mode).med;
            if m.is_finite() {
                m
            } else {
                f64::NEG_INFINITY
            }
        };
        key(*a).total_cmp(&key(*b))
    })
}

/// T1 at 2 vCPUs, for `static+fifo` and `auto`.
fn t1(s: &mut String, sw: &Sweep, judge: &Judge) -> Result<()> {
    let points = sw.points;
    let Some(best) = best_native(points, Mode::Spatial) else {
        writeln!(s, "- T1: not judged: no footprints")?;
        return Ok(());
    };
    let native = points[best].native_gain(Mode::Spatial);
    let kib = points[best].code_kib();
    writeln!(
        s,
        "The native spatial reference gains most at {kib} KiB: {}. G is taken on the medians, steady state: (cell ÷ better of `off`/`pinned+fifo` − 1) ÷ (native gain − 1), against the cell's native reference (table above).\n",
        native.ratio()
    )?;
    for label in [STATIC, AUTO] {
        let head = format!("- T1 (2 vCPUs, {kib} KiB): `{label}`");
        let sched = sw.scheds.iter().find(|c| c.label() == label);
        let Some(sched) = sched.filter(|_| sw.args.vcpus.contains(&2)) else {
            writeln!(s, "{head}: not judged: no 2-vCPU `{label}` runs")?;
            continue;
        };
        let Some(((r, base), (g, mode, n))) = sw
            .cells
            .vs_better(Measure::Steady, Work::Footprint(best), 2, label)
            .zip(gain_capture(sw, best, 2, sched))
        else {
            writeln!(
                s,
                "{head}: **not judged: the native reference gains < {T1_NATIVE_MIN}× here, or no steady-state figures** (nothing to capture)"
            )?;
            continue;
        };
        writeln!(
            s,
            "{head} {} vs `{base}`, native {} {:.3}×: G = {g:.2} ≥ {T1_CAPTURE}: {}",
            r.ratio(),
            mode.name(),
            n.med,
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
            let (r, base) = cells.vs_better(m, *w, v, AUTO)?;
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
            "{head}: not judged: no `auto` with `off` or `pinned+fifo` runs"
        )?,
    }
    Ok(())
}

/// T2 per vCPU count on each workload.
fn t2(s: &mut String, sw: &Sweep, judge: &Judge) -> Result<()> {
    let (args, cells) = (sw.args, sw.cells);
    let footprints: Vec<(String, Work)> = sw
        .points
        .iter()
        .enumerate()
        .map(|(i, p)| (format!(" at {} KiB", p.code_kib()), Work::Footprint(i)))
        .collect();
    for m in [Measure::Steady, Measure::Whole] {
        for &v in &args.vcpus {
            let head = format!(
                "- T2 (do no harm, {v} vCPUs, i-cache-bound workload): `auto` ≥ {T2_FLOOR} × the better of `off` and `pinned+fifo` at every footprint"
            );
            t2_line(s, &head, cells, (m, v), &footprints, judge)?;
        }
        if !args.no_staged {
            for &v in &args.vcpus {
                let head = format!(
                    "- T2 (do no harm, {v} vCPUs, staged workload): `auto` ≥ {T2_FLOOR} × the better of `off` and `pinned+fifo`"
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

/// T3: `static+fifo`'s idle at 2 vCPUs within 3 points of `off`'s.
fn t3(s: &mut String, sw: &Sweep, judge: &Judge) -> Result<()> {
    let (points, cells) = (sw.points, sw.cells);
    let head = format!(
        "- T3 (2 vCPUs): `{STATIC}` idles at most {T3_POINTS} points more than `off` at every footprint"
    );
    if !sw.args.vcpus.contains(&2) || !sw.has(STATIC) || !sw.has(OFF) {
        writeln!(s, "{head}: not judged: no 2-vCPU `{STATIC}` and `off` runs")?;
        return Ok(());
    }
    let diffs: Vec<(usize, f64, f64)> = (0..points.len())
        .map(|i| {
            let w = Work::Footprint(i);
            (i, cells.idle(w, 2, STATIC), cells.idle(w, 2, OFF))
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

/// T4: the best temporal visit policy under `pinned` at 2 vCPUs captures
/// G ≥ 0.8 of the native cohort gain where that gain is largest.
fn t4(s: &mut String, sw: &Sweep, judge: &Judge) -> Result<()> {
    let head = "- T4 (temporal staging, 2 vCPUs): the best visit policy under `pinned`";
    let best = best_native(sw.points, Mode::Cohort)
        .filter(|&i| sw.points[i].native_gain(Mode::Cohort).med >= T1_NATIVE_MIN);
    let Some(i) = best else {
        writeln!(
            s,
            "{head}: not judged: native cohort gains < {T1_NATIVE_MIN}× at every footprint"
        )?;
        return Ok(());
    };
    let (kib, native) = (
        sw.points[i].code_kib(),
        sw.points[i].native_gain(Mode::Cohort),
    );
    let head = format!(
        "{head} at {kib} KiB (native cohort gains most there: {})",
        native.ratio()
    );
    let temporal: Vec<_> = sw
        .scheds
        .iter()
        .filter(|c| c.policy == "pinned" && c.staging() == Staging::Temporal)
        .collect();
    if !sw.args.vcpus.contains(&2) || temporal.is_empty() {
        writeln!(
            s,
            "{head}: not judged: no 2-vCPU `pinned` runs with a temporal visit policy"
        )?;
        return Ok(());
    }
    let w = Work::Footprint(i);
    let gs: Vec<(String, Option<f64>)> = temporal
        .iter()
        .map(|c| (c.label(), gain_capture(sw, i, 2, c).map(|g| g.0)))
        .collect();
    let Some((label, g)) = gs
        .iter()
        .filter_map(|(l, g)| Some((l, (*g)?)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
    else {
        writeln!(s, "{head}: not judged: no steady-state figures")?;
        return Ok(());
    };
    let (r, base) = sw
        .cells
        .vs_better(Measure::Steady, w, 2, label)
        .expect("G implies a baseline");
    let others: Vec<String> = gs
        .iter()
        .filter(|(l, _)| l != label)
        .map(|(l, g)| match g {
            Some(g) => format!("`{l}` G = {g:.2}"),
            None => format!("`{l}` –"),
        })
        .collect();
    writeln!(
        s,
        "{head}: `{label}` {} vs `{base}`: G = {g:.2} ≥ {T4_CAPTURE}: {}{}",
        r.ratio(),
        judge.verdict(g >= T4_CAPTURE),
        if others.is_empty() {
            String::new()
        } else {
            format!(" (others: {})", others.join(", "))
        }
    )?;
    Ok(())
}

/// T5: `auto` ≥ 0.97 × the best other cell of its vCPU count at every
/// footprint (steady state).
fn t5(s: &mut String, sw: &Sweep, judge: &Judge) -> Result<()> {
    let labels = sw.labels();
    let others: Vec<&str> = labels
        .iter()
        .map(String::as_str)
        .filter(|l| *l != AUTO)
        .collect();
    let m = Measure::Steady;
    for &v in &sw.args.vcpus {
        let head = format!(
            "- T5 (`auto` picks well, {v} vCPUs): `auto` ≥ {T5_FLOOR} × the best other cell at every footprint, steady state"
        );
        let worst = (0..sw.points.len())
            .filter_map(|i| {
                let w = Work::Footprint(i);
                let best = sw.cells.best_of(m, w, v, others.iter().copied())?;
                let r = sw.cells.ratio(m, w, v, AUTO, best);
                r.med.is_finite().then_some((i, best, r))
            })
            .min_by(|a, b| a.2.med.total_cmp(&b.2.med));
        match worst {
            Some((i, best, r)) => writeln!(
                s,
                "{head}; worst {} vs `{best}` at {} KiB: {}",
                r.ratio(),
                sw.points[i].code_kib(),
                judge.verdict(r.med >= T5_FLOOR)
            )?,
            None => writeln!(s, "{head}: not judged: no `auto` and other runs")?,
        }
    }
    Ok(())
}

/// The targets' section.
///
/// # Errors
/// Never in practice (formatting into a `String`).
pub fn report(sw: &Sweep, others: f64) -> Result<String> {
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
    t1(&mut s, sw, &judge)?;
    t2(&mut s, sw, &judge)?;
    t3(&mut s, sw, &judge)?;
    t4(&mut s, sw, &judge)?;
    t5(&mut s, sw, &judge)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modes::scheds;
    use clap::Parser;
    use stage_workload::{funcs_for_bytes, Params};
    use stagevm_bench::guest::GuestRun;

    /// A footprint with one round of native requests/s (whole, spatial,
    /// cohort).
    fn point(kib: usize, native: [f64; 3]) -> Point {
        Point {
            kib,
            params: Params {
                stages: 2,
                funcs: funcs_for_bytes(2, kib * 1024),
                calls: 400,
                data_words: 512,
            },
            requests: 1,
            native: native.map(|x| vec![x]),
            want: Vec::new(),
        }
    }

    /// The targets' text for one round at 2 vCPUs: per footprint, the
    /// native rates and every cell's steady requests/s by label.
    fn targets(points: &[Point], rates: &[&[(&str, f64)]]) -> String {
        let args = crate::Args::parse_from(["headline-bench", "--vcpus", "2", "--no-staged"]);
        let scheds = scheds(&args.policies, &args.visits);
        let mut cells = Cells::default();
        for (i, rates) in rates.iter().enumerate() {
            for s in &scheds {
                let label = s.label();
                let rps = rates
                    .iter()
                    .find(|(l, _)| *l == label)
                    .map_or(100.0, |r| r.1);
                let run = GuestRun {
                    rps,
                    steady_rps: rps,
                    ..GuestRun::default()
                };
                cells.push(Work::Footprint(i), 2, &label, run);
            }
        }
        let sw = Sweep {
            args: &args,
            scheds: &scheds,
            points,
            cells: &cells,
        };
        report(&sw, 0.0).unwrap()
    }

    #[test]
    fn temporal_cells_are_judged_against_the_native_cohort_gain() {
        let points = [
            point(1024, [100.0, 90.0, 125.0]),
            point(4096, [100.0, 110.0, 102.0]),
        ];
        let text = targets(
            &points,
            &[
                &[
                    ("pinned+cohort", 121.0),
                    ("pinned+srpt", 110.0),
                    ("auto", 119.0),
                ],
                &[("static+fifo", 109.0), ("auto", 108.0)],
            ],
        );
        let line = |t: &str| {
            text.lines()
                .find(|l| l.starts_with(t))
                .unwrap_or_else(|| panic!("no {t} line in\n{text}"))
                .to_string()
        };
        // (1.21 − 1) ÷ (1.25 − 1) = 0.84; srpt: 0.4; color as pinned+fifo: 0.
        let t4 = line("- T4");
        assert!(t4.contains("at 1023 KiB"), "{t4}");
        assert!(t4.contains("`pinned+cohort` 1.210×"), "{t4}");
        assert!(t4.contains("G = 0.84 ≥ 0.8: **met**"), "{t4}");
        assert!(t4.contains("`pinned+srpt` G = 0.40"), "{t4}");
        // auto ÷ best other: 119 ÷ 121 at 1023 KiB, 108 ÷ 109 at 4095 KiB.
        let t5 = line("- T5");
        assert!(t5.contains("worst 0.983×"), "{t5}");
        assert!(
            t5.contains("vs `pinned+cohort` at 1023 KiB: **met**"),
            "{t5}"
        );
        // T1 takes static+fifo against the native spatial gain (1.1×).
        let t1 = line("- T1 (2 vCPUs, 4095 KiB): `static+fifo`");
        assert!(t1.contains("native spatial 1.100×: G = 0.90"), "{t1}");
    }

    #[test]
    fn t4_is_not_judged_without_a_native_cohort_gain() {
        let points = [point(1024, [100.0, 110.0, 104.0])];
        let text = targets(&points, &[&[("pinned+cohort", 103.0), ("auto", 90.0)]]);
        assert!(
            text.contains("not judged: native cohort gains < 1.05× at every footprint"),
            "{text}"
        );
        assert!(text.contains("worst 0.900×"), "{text}");
        assert!(text.contains("**not met**"), "{text}");
    }
}
