//! `auto`'s holds: change points start trials, the interval grows, a hold
//! never switches by itself, and the trials' cost is counted.

use super::noise::normal;
use super::*;

/// The periods at which trials started, and why.
fn trial_starts(decisions: &[(usize, AutoDecision)]) -> Vec<(usize, String)> {
    decisions
        .iter()
        .filter(|(_, d)| d.what.contains(": trial, "))
        .map(|(i, d)| (*i, d.what.clone()))
        .collect()
}

#[test]
fn the_interval_doubles_while_trials_keep_the_mode() {
    let mut p = auto_now(AutoParams {
        hold_periods: 100,
        ..Default::default()
    });
    let (_, decisions) = drive_auto_with(
        &mut p,
        1500,
        |_| [0.5, 0.5],
        rates([1000.0, 1200.0, 900.0, 900.0]),
    );
    let starts = trial_starts(&decisions);
    let verdicts: Vec<usize> = decisions
        .iter()
        .filter(|(_, d)| d.summary.is_some())
        .map(|(i, _)| *i)
        .collect();
    assert!(
        starts
            .iter()
            .all(|(_, w)| w.starts_with("hold over: trial, temporal first")),
        "{starts:?}"
    );
    // Held 100, 200, 400 … periods between a verdict and the next trial.
    let gaps: Vec<usize> = starts[1..]
        .iter()
        .zip(&verdicts)
        .map(|((s, _), v)| s - v)
        .collect();
    assert_eq!(gaps[..3], [101, 201, 401], "{gaps:?}");
    assert_eq!(p.stats().change_points, 0);
    assert_eq!(p.stats().mode_switches, 0);
}

#[test]
fn a_change_of_load_starts_one_trial_and_resets_the_interval() {
    // Open loop at 30 % load for 1000 periods, then 90 %: the rate and the
    // utilisation step; one trial, at once, with the change named.
    let params = AutoParams {
        hold_periods: 5000,
        ..Default::default()
    };
    let mut p = auto_now(params);
    let mut seed = 5u64;
    let (modes, decisions) = drive_observed(
        &mut p,
        2000,
        |_| [0.5, 0.5],
        |m, i| {
            let load = if i < 1000 { 0.3 } else { 0.9 };
            let rate = 10_000.0 * load * (1.0 + 0.05 * normal(&mut seed));
            let cpu = if m == Mode::Unstaged { 60.0 } else { 70.0 };
            period(rate, cpu, load * cpu / 60.0, 100.0)
        },
    );
    let starts = trial_starts(&decisions);
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert!(starts[1].0 >= 1000 && starts[1].0 < 1010, "{starts:?}");
    assert!(
        starts[1].1.starts_with("change point: ") && starts[1].1.contains(" rose"),
        "{starts:?}"
    );
    assert_eq!(p.stats().change_points, 1);
    // No switch outside trials: the mode changes only inside them.
    let in_trial = |i: usize| {
        starts.iter().any(|(s, _)| {
            let end = decisions
                .iter()
                .find(|(j, d)| j >= s && d.summary.is_some())
                .map_or(usize::MAX, |(j, _)| *j);
            i > *s && i <= end
        })
    };
    for i in 1..modes.len() {
        if modes[i] != modes[i - 1] {
            assert!(
                in_trial(i) || starts.iter().any(|(s, _)| *s == i),
                "period {i}"
            );
        }
    }
}

#[test]
fn stationary_noise_starts_no_trial_and_a_new_stage_mix_does() {
    let mut p = auto_now(AutoParams {
        hold_periods: 20_000,
        ..Default::default()
    });
    let mut seed = 8u64;
    let (_, decisions) = drive_observed(
        &mut p,
        6000,
        |i| if i < 4000 { [0.5, 0.5] } else { [0.9, 0.1] },
        |_, _| period(8000.0 * (1.0 + 0.08 * normal(&mut seed)), 60.0, 0.5, 100.0),
    );
    let starts = trial_starts(&decisions);
    // The first trial, then none in 3,800 periods of noise, then the mix.
    assert_eq!(starts.len(), 2, "{starts:?}");
    let mix: Vec<_> = decisions
        .iter()
        .filter(|(_, d)| d.what.starts_with("change point: stage mix moved"))
        .collect();
    assert_eq!(mix.len(), 1, "{decisions:?}");
    assert!(mix[0].0 >= 4000 && mix[0].0 < 4020, "{mix:?}");
}

#[test]
fn a_held_modes_tail_past_the_bound_is_a_change_point() {
    // Spatial wins by CPU with a tail like unstaged's; in the hold its p99
    // doubles: a trial re-tests it (and refuses it), no blind fall-back.
    let mut p = auto_now(AutoParams {
        candidates: Modes::of(&[Mode::Spatial]),
        ..Default::default()
    });
    let mut verdicts_seen = 0;
    let (_, decisions) = drive_observed(
        &mut p,
        400,
        |_| [0.5, 0.5],
        |m, i| {
            let p99 = if m == Mode::Spatial && i > 150 {
                400.0
            } else {
                200.0
            };
            let cpu = if m == Mode::Spatial { 30.0 } else { 60.0 };
            period(8000.0, cpu, 0.5, p99)
        },
    );
    for (_, d) in &decisions {
        verdicts_seen += usize::from(d.summary.is_some());
    }
    assert!(verdicts_seen >= 2, "{decisions:?}");
    assert!(
        decisions
            .iter()
            .any(|(_, d)| d.what.starts_with("change point: p99 ")
                && d.what.contains("over the latency bound of 234 µs")),
        "{decisions:?}"
    );
    let last = verdicts(&decisions)
        .last()
        .unwrap()
        .summary
        .clone()
        .unwrap();
    assert_eq!(last.kept, "unstaged");
}

#[test]
fn auto_counts_what_its_trials_cost() {
    // Every staging 20 % slower: one trial, its staged slices lost.
    let mut p = auto_now(Default::default());
    let modes = drive_auto(&mut p, 200, rates([100.0, 80.0, 80.0, 80.0]));
    let st = p.stats();
    assert_eq!(st.periods, 200);
    // Both is skipped: neither of its parts beat unstaged.
    assert_eq!(
        (st.trials, st.duels, st.duels_capped, st.modes_skipped),
        (1, 2, 0, 1)
    );
    let staged = modes.iter().filter(|m| **m != Mode::Unstaged).count() as u64;
    assert_eq!(st.losing_periods, staged, "{st:?} {modes:?}");
    assert!(st.losing_periods > 0 && st.losing_periods < st.trial_periods);
    // Priced: each staged period lost 20 % of unstaged's rate.
    let cost = 0.2 * staged as f64;
    assert!((st.cost_periods - cost).abs() < 1e-9, "{st:?}: {cost}");
    assert_eq!(st.mode_switches, 0);
}

#[test]
fn a_trial_between_modes_that_do_alike_costs_nothing() {
    // Every mode at unstaged's rate: the trial runs them all (losing
    // periods), and none of those periods lost anything.
    let mut p = auto_now(Default::default());
    drive_auto(&mut p, 300, rates([100.0; 4]));
    let st = p.stats();
    assert!(st.trials >= 1 && st.losing_periods > 0, "{st:?}");
    assert_eq!(st.cost_periods, 0.0, "{st:?}");
}

#[test]
fn a_change_of_cores_keeps_the_hold_and_the_detectors_calibrate_afresh() {
    use crate::policy::tests::ctx;
    let mut p = auto_now(Default::default());
    let (_, decisions) = drive_auto_with(
        &mut p,
        200,
        |_| [0.5, 0.5],
        rates([1000.0, 1000.0, 1500.0, 1000.0]),
    );
    assert_eq!(p.last_trial().unwrap().kept, "spatial", "{decisions:?}");
    assert!(p.retarget(ctx(4, 4, 2)));
    assert!(p.retarget(ctx(1, 2, 2)));
    assert!(p.retarget(ctx(2, 2, 2)));
    assert_eq!(p.stats().trials, 1);
    // The detectors calibrate afresh at the new size (150 periods); a
    // change of rate after that is a change point, a trial.
    let mut modes = Vec::new();
    for _ in 0..400 {
        p.observe(&Observation::rate(if modes.len() < 200 {
            1500.0
        } else {
            700.0
        }));
        p.plan(&[0.5, 0.5]);
        modes.push(p.decision().map(|d| d.what));
    }
    assert!(
        modes
            .iter()
            .flatten()
            .any(|w| w.starts_with("change point: rate fell")),
        "{modes:?}"
    );
}
