//! Unit tests of `auto`: its trials, objectives, latency bound and holds,
//! driven with constructed observations.

use super::*;
use crate::latency::Histogram;
use crate::policy::tests::ctx;
use crate::policy::{build, Observation, Plan, PolicyKind, VisitPolicy};

/// The mode a plan of `auto` over `ctx(2, 2, 2)` runs, checking that the
/// plan is exactly the `pinned` or the `static` one with FIFO visits or
/// `temporal` ones.
fn mode_of(plan: &Plan, temporal: VisitPolicy) -> Mode {
    let [pinned, partitioned] =
        [PolicyKind::Pinned, PolicyKind::Static].map(|k| build(k, ctx(2, 2, 2)).plan(&[]));
    let spatial = plan.stage_vcpus == partitioned.stage_vcpus;
    let base = if spatial { partitioned } else { pinned };
    assert_eq!(
        *plan,
        Plan {
            visit: plan.visit,
            ..base
        }
    );
    assert!(
        [VisitPolicy::Fifo, temporal].contains(&plan.visit),
        "{:?}",
        plan.visit
    );
    match (spatial, plan.visit.is_temporal()) {
        (false, false) => Mode::Unstaged,
        (false, true) => Mode::Temporal,
        (true, false) => Mode::Spatial,
        (true, true) => Mode::Both,
    }
}

/// Drives `auto` for `periods` periods, reporting `rate(mode)` requests/s
/// for the mode of each period, on an even load; returns the modes it ran.
fn drive_auto(p: &mut Auto, periods: usize, rate: impl FnMut(Mode) -> f64) -> Vec<Mode> {
    drive_auto_with(p, periods, |_| [0.5, 0.5], rate).0
}

/// [`drive_auto`] with `load(period)` as each period's stage load; returns
/// the modes and the decisions with their periods. Every plan must be the
/// one of its mode, and every decision name that mode.
fn drive_auto_with(
    p: &mut Auto,
    periods: usize,
    load: impl FnMut(usize) -> [f64; 2],
    mut rate: impl FnMut(Mode) -> f64,
) -> (Vec<Mode>, Vec<(usize, AutoDecision)>) {
    drive_observed(p, periods, load, |m, _| Observation::rate(rate(m)))
}

/// [`drive_auto_with`] with `observe(mode, period)` as what each period
/// measured.
fn drive_observed(
    p: &mut Auto,
    periods: usize,
    mut load: impl FnMut(usize) -> [f64; 2],
    mut observe: impl FnMut(Mode, usize) -> Observation,
) -> (Vec<Mode>, Vec<(usize, AutoDecision)>) {
    let mut modes = Vec::new();
    let mut decisions = Vec::new();
    let mut mode = Mode::Unstaged;
    for i in 0..periods {
        p.observe(&observe(mode, i));
        let plan = p.plan(&load(i));
        mode = mode_of(&plan, p.temporal_policy());
        if let Some(d) = p.decision() {
            assert_eq!(d.mode, mode, "period {i}: {}", d.what);
            decisions.push((i, d));
        }
        modes.push(mode);
    }
    (modes, decisions)
}

/// Requests/s per mode: unstaged, temporal, spatial, both.
fn rates(r: [f64; 4]) -> impl Fn(Mode) -> f64 {
    move |m| r[m.index()]
}

/// `auto` with its first trial at once.
fn auto_now(params: AutoParams) -> Auto {
    Auto::new(
        ctx(2, 2, 2),
        AutoParams {
            first_trial_after: 0,
            ..params
        },
    )
}

/// What a 20 ms period of an open-loop guest measures: `rate` requests/s,
/// `cpu_us` µs of CPU each, `util` utilisation, and 300 timed requests of
/// `p99_us` µs (so that p99 is that latency).
fn period(rate: f64, cpu_us: f64, util: f64, p99_us: f64) -> Observation {
    let requests = rate * 0.02;
    let mut latency = Histogram::new();
    for _ in 0..300 {
        latency.record((p99_us * 1000.0) as u64);
    }
    Observation {
        requests_per_s: rate,
        requests,
        cpu_ns: Some(cpu_us * 1000.0 * requests),
        utilisation: Some(util),
        latency: Some(latency),
    }
}

/// The decisions that ended a trial.
fn verdicts(decisions: &[(usize, AutoDecision)]) -> Vec<&AutoDecision> {
    decisions
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d.summary.is_some())
        .collect()
}

#[test]
fn auto_keeps_temporal_when_it_is_fastest_by_more_than_the_margin() {
    use Mode::*;
    let mut p = auto_now(Default::default());
    let rate = rates([1000.0, 1100.0, 900.0, 1050.0]);
    let (modes, decisions) = drive_auto_with(&mut p, 80, |_| [0.5, 0.5], rate);
    let trial = modes.iter().rposition(|m| *m != Temporal).unwrap();
    assert!(trial < 36, "{modes:?}");
    assert!(
        modes[trial + 1..].iter().all(|m| *m == Temporal),
        "{modes:?}"
    );
    for m in Mode::ALL {
        assert!(modes[..=trial].contains(&m), "{m:?} tried: {modes:?}");
    }
    // The decision names every mode's rate.
    let what: Vec<_> = decisions
        .into_iter()
        .map(|(_, d)| d.what)
        .filter(|w| w.starts_with("keep"))
        .collect();
    assert_eq!(what.len(), 1, "{what:?}");
    assert!(
        what[0].starts_with(
            "keep temporal: unstaged 1000, temporal 1100 (+10.0 %), spatial 900 dropped, both 1050"
        ),
        "{what:?}"
    );
    assert!(what[0].contains("requests/s (margin 3 %"), "{what:?}");
}

#[test]
fn auto_keeps_unstaged_when_every_mode_is_within_the_margin() {
    let params = AutoParams::default();
    let mut p = auto_now(params);
    let modes = drive_auto(&mut p, 80, rates([1000.0, 1020.0, 1010.0, 1025.0]));
    // A full trial: every mode's epochs in every round.
    let trial = 4 * (params.rounds * params.epoch_periods) as usize;
    assert!(
        modes[trial..].iter().all(|m| *m == Mode::Unstaged),
        "{modes:?}"
    );
    for m in Mode::ALL {
        let ran = modes[..trial].iter().filter(|x| **x == m).count();
        assert_eq!(
            ran,
            (params.rounds * params.epoch_periods) as usize,
            "{m:?}"
        );
    }
    let d = p.decision();
    assert!(d.is_none() || d.unwrap().mode == Mode::Unstaged);
    assert_eq!(p.stats().losing_periods, 3 * 9);
}

#[test]
fn auto_keeps_both_when_both_is_best() {
    let mut p = auto_now(Default::default());
    let modes = drive_auto(&mut p, 80, rates([1000.0, 1100.0, 1120.0, 1250.0]));
    assert!(modes[36..].iter().all(|m| *m == Mode::Both), "{modes:?}");
    // The map is partitioned and the visits temporal (asserted for every
    // period by `mode_of`): here SRPT, the default.
    assert_eq!(p.temporal_policy(), DEFAULT_TEMPORAL);
    let plan = p.plan(&[0.5, 0.5]);
    assert_eq!(plan.visit, VisitPolicy::Srpt);
    assert_eq!(plan.stage_vcpus, [0b01, 0b10]);
}

#[test]
fn auto_ties_go_to_the_simpler_mode() {
    // Spatial and both equally fast, well above unstaged: spatial.
    let mut p = auto_now(Default::default());
    let modes = drive_auto(&mut p, 80, rates([1000.0, 1000.0, 1200.0, 1200.0]));
    assert!(modes[40..].iter().all(|m| *m == Mode::Spatial), "{modes:?}");
}

#[test]
fn auto_runs_the_operators_temporal_policy() {
    let mut c = ctx(2, 2, 2);
    c.visit = VisitPolicy::Srpt;
    let params = AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    let mut p = Auto::new(c, params);
    assert_eq!(p.temporal_policy(), VisitPolicy::Srpt);
    // Temporal wins; its plans visit by SRPT (checked by `mode_of`), the
    // others FIFO although the operator named SRPT.
    let modes = drive_auto(&mut p, 60, rates([1000.0, 1300.0, 900.0, 1000.0]));
    assert_eq!(modes.last(), Some(&Mode::Temporal));
    let plan = p.plan(&[0.5, 0.5]);
    assert_eq!(plan.visit, VisitPolicy::Srpt);
    assert!(plan.stage_vcpus.iter().all(|m| *m == 0b11));
}

#[test]
fn auto_trials_only_its_candidates() {
    use Mode::*;
    let mut p = auto_now(AutoParams {
        candidates: Modes::of(&[Spatial]),
        ..Default::default()
    });
    // Temporal would win, but it is not a candidate.
    let modes = drive_auto(&mut p, 60, rates([1000.0, 2000.0, 1200.0, 2000.0]));
    assert!(modes.iter().all(|m| [Unstaged, Spatial].contains(m)));
    assert!(modes[20..].iter().all(|m| *m == Spatial), "{modes:?}");
}

#[test]
fn auto_trials_again_after_its_hold_and_records_why() {
    let params = AutoParams {
        hold_periods: 10,
        first_trial_after: 0,
        ..Default::default()
    };
    let mut p = Auto::new(ctx(2, 2, 2), params);
    let mut i = 0;
    let (_, decisions) = drive_auto_with(
        &mut p,
        100,
        |_| [0.5, 0.5],
        |m| {
            i += 1;
            // Temporal wins at first, loses later.
            match (m == Mode::Temporal, i <= 30) {
                (true, true) | (false, false) => 130.0,
                _ => 100.0,
            }
        },
    );
    let decisions: Vec<_> = decisions
        .into_iter()
        .map(|(i, d)| (i, d.mode, d.what))
        .collect();
    let keeps: Vec<_> = decisions
        .iter()
        .filter(|(_, _, w)| w.starts_with("keep"))
        .collect();
    assert!(keeps.len() >= 2, "{decisions:?}");
    assert_eq!(keeps[0].1, Mode::Temporal);
    assert_eq!(keeps.last().unwrap().1, Mode::Unstaged);
    assert!(keeps[0].2.contains("requests/s"));
    assert!(decisions.iter().any(|(_, _, w)| w.starts_with("hold over")));
    assert!(decisions.iter().any(|(_, _, w)| w.starts_with("drop ")));
}

#[test]
fn auto_ignores_periods_without_requests() {
    let mut p = auto_now(Default::default());
    // No request ever completes: it never decides, it keeps trying.
    let modes = drive_auto(&mut p, 60, |_| 0.0);
    for m in Mode::ALL {
        assert!(modes.contains(&m), "{m:?}: {modes:?}");
    }
    assert!(p.decision().is_none_or(|d| d.what.starts_with("trial")));
}

#[test]
fn auto_runs_unstaged_before_its_first_trial() {
    let params = AutoParams::default();
    let mut p = Auto::new(ctx(2, 2, 2), params);
    // Staging would win, but a run shorter than the first hold never tries it.
    let modes = drive_auto(
        &mut p,
        params.first_trial_after as usize,
        rates([100.0, 200.0, 200.0, 200.0]),
    );
    assert!(modes.iter().all(|m| *m == Mode::Unstaged), "{modes:?}");
}

#[test]
fn below_saturation_the_mode_that_costs_least_cpu_per_request_is_kept() {
    // Every mode keeps up with 30,000 requests/s; spatial costs 16 % less
    // CPU per request, temporal 3.3 %, both 10 %.
    let cpu = [30.0, 29.0, 25.0, 27.0];
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_observed(
        &mut p,
        80,
        |_| [0.5, 0.5],
        |m, _| period(30_000.0, cpu[m.index()], 0.6 * cpu[m.index()] / 30.0, 200.0),
    );
    assert!(modes[50..].iter().all(|m| *m == Mode::Spatial), "{modes:?}");
    let v = verdicts(&decisions);
    let s = v[0].summary.as_ref().unwrap();
    assert_eq!(
        (s.kept, s.objective, s.decided_by),
        ("spatial", "CPU per request", "CPU per request")
    );
    assert!(
        v[0].what
            .starts_with("keep spatial: unstaged 30.00, temporal 29.00, spatial 25.00 (-16.7 %)"),
        "{}",
        v[0].what
    );
    assert!(
        v[0].what
            .contains("by CPU per request, unstaged utilisation 60 %"),
        "{}",
        v[0].what
    );
    assert!(
        v[0].what
            .contains("rates 30000/30000/30000/30000 requests/s"),
        "{}",
        v[0].what
    );
    // By rate alone (an older guest's view) it would have been a tie.
    let mut p = auto_now(Default::default());
    let modes = drive_auto(&mut p, 80, rates([30_000.0; 4]));
    assert!(
        modes[50..].iter().all(|m| *m == Mode::Unstaged),
        "{modes:?}"
    );
}

#[test]
fn at_saturation_the_rate_decides() {
    // A closed loop: every mode busy; temporal completes 10 % more
    // requests with the same CPU each (its idle is lower).
    let rate = [1000.0, 1100.0, 900.0, 950.0];
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_observed(
        &mut p,
        80,
        |_| [0.5, 0.5],
        |m, _| period(rate[m.index()], 30.0, 0.99, 500.0),
    );
    assert!(
        modes[50..].iter().all(|m| *m == Mode::Temporal),
        "{modes:?}"
    );
    let s = verdicts(&decisions)[0].summary.clone().unwrap();
    assert_eq!((s.objective, s.decided_by), ("rate", "rate"));
    assert!(s
        .unstaged_utilisation
        .is_some_and(|u| (u - 0.99).abs() < 1e-9));
}

#[test]
fn the_latency_bound_vetoes_a_cheaper_mode() {
    // Spatial saves 20 % of CPU but doubles p99; both saves 8 % at +5 %.
    let cpu = [30.0, 30.0, 24.0, 27.6];
    let p99 = [200.0, 200.0, 400.0, 210.0];
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_observed(
        &mut p,
        80,
        |_| [0.5, 0.5],
        |m, _| period(30_000.0, cpu[m.index()], 0.6, p99[m.index()]),
    );
    assert!(modes[50..].iter().all(|m| *m == Mode::Both), "{modes:?}");
    let v = verdicts(&decisions);
    let s = v[0].summary.as_ref().unwrap();
    assert_eq!((s.kept, s.decided_by), ("both", "latency bound"));
    assert!(s.modes[2].over_latency_bound && !s.modes[3].over_latency_bound);
    assert!(
        v[0].what.contains("spatial 24.00 over the latency bound"),
        "{}",
        v[0].what
    );
    // All of a mode's requests took the same time here: its p99 is the
    // top of their bucket (213 µs for 200), and the bound 10 % above.
    assert!(
        v[0].what.contains("p99 213/213/426/213 µs (bound 234 µs)"),
        "{}",
        v[0].what
    );
    // With an SLO of 500 µs the operator accepts spatial's p99.
    let mut c = ctx(2, 2, 2);
    c.latency.slo_ns = Some(500_000.0);
    let mut p = Auto::new(
        c,
        AutoParams {
            first_trial_after: 0,
            ..Default::default()
        },
    );
    let (modes, _) = drive_observed(
        &mut p,
        80,
        |_| [0.5, 0.5],
        |m, _| period(30_000.0, cpu[m.index()], 0.6, p99[m.index()]),
    );
    assert!(modes[50..].iter().all(|m| *m == Mode::Spatial), "{modes:?}");
}

#[test]
fn noise_within_the_margin_keeps_unstaged_and_a_mode_behind_the_arrivals_is_not_kept() {
    // CPU per request within ±2 % of unstaged's, period by period.
    let mut seed = 7u64;
    let mut noise = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % 1000) as f64 / 1000.0 * 0.04 - 0.02
    };
    let mut p = auto_now(Default::default());
    let (modes, _) = drive_observed(
        &mut p,
        80,
        |_| [0.5, 0.5],
        |_, _| period(30_000.0, 30.0 * (1.0 + noise()), 0.6, 200.0),
    );
    assert!(
        modes[50..].iter().all(|m| *m == Mode::Unstaged),
        "{modes:?}"
    );
    // Spatial uses less CPU per request but completes 10 % fewer requests
    // than arrive: it does not keep up, whatever its cost.
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_observed(
        &mut p,
        80,
        |_| [0.5, 0.5],
        |m, _| match m {
            Mode::Spatial => period(27_000.0, 20.0, 0.6, 200.0),
            _ => period(30_000.0, 30.0, 0.6, 200.0),
        },
    );
    assert!(
        modes[50..].iter().all(|m| *m == Mode::Unstaged),
        "{modes:?}"
    );
    assert!(verdicts(&decisions)[0].what.contains("behind the arrivals"));
}

#[test]
fn a_slow_unstaged_epoch_cannot_make_a_losing_mode_win() {
    // Spatial completes 40 % of unstaged's requests; the first round's
    // unstaged epoch runs slow (the threads recovering, a busy neighbour).
    let params = AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    let mut p = Auto::new(ctx(2, 2, 2), params);
    let mut unstaged_periods = 0;
    let (modes, decisions) = drive_observed(
        &mut p,
        120,
        |_| [0.5, 0.5],
        |m, _| {
            Observation::rate(match m {
                Mode::Unstaged => {
                    unstaged_periods += 1;
                    if unstaged_periods <= params.epoch_periods {
                        20.0
                    } else {
                        100.0
                    }
                }
                Mode::Spatial => 40.0,
                _ => 35.0,
            })
        },
    );
    assert!(
        modes[60..].iter().all(|m| *m == Mode::Unstaged),
        "{modes:?}\n{decisions:?}"
    );
    // A mode ahead on average but behind in one round is not kept either.
    let mut p = Auto::new(ctx(2, 2, 2), params);
    let mut spatial_periods = 0;
    let (modes, _) = drive_observed(
        &mut p,
        120,
        |_| [0.5, 0.5],
        |m, _| {
            Observation::rate(match m {
                Mode::Unstaged => 100.0,
                Mode::Spatial => {
                    spatial_periods += 1;
                    if spatial_periods <= 2 * params.epoch_periods {
                        150.0
                    } else {
                        95.0
                    }
                }
                _ => 60.0,
            })
        },
    );
    assert!(
        modes[60..].iter().all(|m| *m == Mode::Unstaged),
        "{modes:?}"
    );
}

mod hold;

#[test]
fn a_mode_with_a_tail_far_beyond_the_bound_is_dropped_after_one_epoch() {
    // Spatial saves CPU but its p99 is 5× unstaged's: dropped as soon as
    // its first epoch timed enough requests, never run again.
    let cpu = [30.0, 30.0, 24.0, 29.0];
    let p99 = [200.0, 200.0, 1000.0, 200.0];
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_observed(
        &mut p,
        80,
        |_| [0.5, 0.5],
        |m, _| period(30_000.0, cpu[m.index()], 0.6, p99[m.index()]),
    );
    let spatial = modes.iter().filter(|m| **m == Mode::Spatial).count();
    assert!(
        spatial <= AutoParams::default().epoch_periods as usize,
        "{modes:?}"
    );
    assert!(
        decisions.iter().any(|(_, d)| d
            .what
            .contains("drop spatial (p99 1048 µs, over twice the latency bound of 234 µs)")),
        "{decisions:?}"
    );
    assert!(modes[50..].iter().all(|m| *m != Mode::Spatial));
}

mod noise;
