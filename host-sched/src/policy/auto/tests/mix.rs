//! Duels judged at one stage mix ([`crate::policy::StageWork`]): a mode
//! that only changes which stages run in its slices is no better.

use super::*;
use crate::policy::StageWork;

/// A saturated period of 1000 time units over two stages whose work costs
/// `cost` time units a unit, `share_a` of the work in the first: its rate
/// is the work done.
fn mixed(cost: [f64; 2], share_a: f64) -> Observation {
    let per_unit = share_a * cost[0] + (1.0 - share_a) * cost[1];
    let work = 1000.0 / per_unit;
    let stages = [share_a, 1.0 - share_a]
        .iter()
        .zip(cost)
        .map(|(s, c)| StageWork {
            work: s * work,
            time: s * work * c,
        })
        .collect();
    Observation {
        stages: Some(stages),
        ..Observation::rate(work)
    }
}

/// The only duel's summary: temporal against unstaged, each period
/// measured by `observe(mode)`.
fn duel(mut observe: impl FnMut(Mode) -> Observation) -> DuelSummary {
    let mut p = auto_now(AutoParams {
        candidates: Modes::of(&[Mode::Temporal]),
        ..Default::default()
    });
    let (_, decisions) = drive_observed(&mut p, 300, |_| [0.5, 0.5], |m, _| observe(m));
    let s = verdicts(&decisions)[0].summary.clone().unwrap();
    s.duels[0].clone()
}

#[test]
fn a_mode_that_only_runs_more_of_the_cheap_stage_is_no_better() {
    // Stage a costs twice stage b in both modes; unstaged's slices run
    // them half and half, temporal's 30/70: 15 % more work a period.
    let cost = [2.0, 1.0];
    let raw = duel(|m| {
        let o = mixed(cost, if m == Mode::Temporal { 0.3 } else { 0.5 });
        Observation { stages: None, ..o }
    });
    assert_eq!(raw.outcome, "better", "{raw:?}");
    assert!((raw.mean.unwrap() - 0.1538).abs() < 1e-3, "{raw:?}");
    let judged = duel(|m| mixed(cost, if m == Mode::Temporal { 0.3 } else { 0.5 }));
    assert_eq!(judged.outcome, "no better", "{judged:?}");
    assert!(judged.mean.unwrap().abs() < 1e-9, "{judged:?}");
    assert!(!judged.won);
}

#[test]
fn a_mode_whose_stages_run_faster_is_better_at_any_mix() {
    // Temporal runs both stages 10 % faster, and its slices' mix moves the
    // other way (more of the dear stage): at the pairs' mean mix it is
    // 1 / 0.9 - 1 = 11.1 % better.
    let judged = duel(|m| match m {
        Mode::Temporal => mixed([1.8, 0.9], 0.6),
        _ => mixed([2.0, 1.0], 0.5),
    });
    assert_eq!(judged.outcome, "better", "{judged:?}");
    assert!((judged.mean.unwrap() - 0.1111).abs() < 1e-3, "{judged:?}");
    assert!(judged.won);
}

#[test]
fn stage_figures_of_one_side_only_leave_the_ratio_as_measured() {
    // An older guest (no stage figures) on one side: no correction.
    let judged = duel(|m| {
        let o = mixed([2.0, 1.0], if m == Mode::Temporal { 0.3 } else { 0.5 });
        if m == Mode::Temporal {
            o
        } else {
            Observation { stages: None, ..o }
        }
    });
    assert_eq!(judged.outcome, "better", "{judged:?}");
    assert!((judged.mean.unwrap() - 0.1538).abs() < 1e-3, "{judged:?}");
}
