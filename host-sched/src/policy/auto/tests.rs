//! Unit tests of `auto`: its duels, objectives, latency bound and holds,
//! driven with constructed observations; the sequential test, the change
//! detector and the pairing order in the submodules.

use super::*;
use crate::histogram::Histogram;
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
        entries: None,
        stages: None,
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

/// The lines that ended a trial.
fn keeps(decisions: &[(usize, AutoDecision)]) -> Vec<String> {
    verdicts(decisions).iter().map(|d| d.what.clone()).collect()
}

#[test]
fn auto_keeps_temporal_when_it_is_fastest_by_more_than_the_margin() {
    use Mode::*;
    let mut p = auto_now(Default::default());
    let rate = rates([1000.0, 1100.0, 900.0, 1050.0]);
    let (modes, decisions) = drive_auto_with(&mut p, 200, |_| [0.5, 0.5], rate);
    let trial = modes.iter().rposition(|m| *m != Temporal).unwrap();
    assert!(trial < 120, "{modes:?}");
    for m in Mode::ALL {
        assert!(modes[..=trial].contains(&m), "{m:?} tried: {modes:?}");
    }
    let k = keeps(&decisions);
    assert_eq!(k.len(), 1, "{k:?}");
    assert!(k[0].starts_with("keep temporal by rate"), "{k:?}");
    assert!(
        k[0].contains("temporal vs unstaged: better (+10.0 %"),
        "{k:?}"
    );
    assert!(
        k[0].contains("spatial vs temporal: no better (-18.2 %"),
        "{k:?}"
    );
    assert!(
        k[0].contains("both vs temporal: no better (-4.5 %"),
        "{k:?}"
    );
    // Duels this clear end in 3–4 pairs: no two modes were switched to
    // three times each, so the settling is not measured and the most (3)
    // is skipped.
    assert!(k[0].contains("(settling 3 periods)"), "{k:?}");
    let s = verdicts(&decisions)[0].summary.clone().unwrap();
    assert_eq!(s.duels.len(), 3);
    // Differences this clear stop before the least pairs (decisive); no
    // duel ran its least pairs, so none measured the noise a futility
    // stop needs.
    assert!(s
        .duels
        .iter()
        .all(|d| (3..=AutoParams::default().min_pairs).contains(&d.pairs) && !d.futile));
}

#[test]
fn a_candidate_far_behind_the_noise_an_earlier_duel_measured_stops_at_once() {
    use Mode::*;
    // Temporal alike unstaged within ±2 % noise (its duel runs its least
    // pairs and measures the spread); spatial 40 % behind stops after its
    // first pair; both is skipped.
    let mut p = auto_now(Default::default());
    let (_, decisions) = drive_observed(
        &mut p,
        300,
        |_| [0.5, 0.5],
        |m, i| {
            let wobble = 1.0 + 0.01 * ((i * 7 % 5) as f64 - 2.0);
            Observation::rate([1000.0, 1000.0, 600.0, 600.0][m.index()] * wobble)
        },
    );
    let s = verdicts(&decisions)[0].summary.clone().unwrap();
    let what = &verdicts(&decisions)[0].what;
    assert_eq!(s.kept, Unstaged.name(), "{what}");
    assert!(
        s.duels[0].pairs >= AutoParams::default().min_pairs,
        "{what}"
    );
    assert!(!s.duels[0].futile);
    assert!(s.duels[1].futile && s.duels[1].pairs == 1, "{what}");
    assert!(
        what.contains("1 pair: futile beside the trial's noise"),
        "{what}"
    );
}

#[test]
fn auto_keeps_unstaged_when_every_mode_is_within_the_margin() {
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_auto_with(
        &mut p,
        200,
        |_| [0.5, 0.5],
        rates([1000.0, 1010.0, 1005.0, 1012.0]),
    );
    let k = keeps(&decisions);
    assert_eq!(k.len(), 1, "{k:?}");
    assert!(k[0].starts_with("keep unstaged"), "{k:?}");
    assert_eq!(k[0].matches("no better").count(), 2, "{k:?}");
    assert!(
        k[0].contains("both skipped (neither temporal nor spatial beat unstaged"),
        "{k:?}"
    );
    assert_eq!(modes.last(), Some(&Mode::Unstaged));
}

#[test]
fn auto_keeps_both_when_both_is_best_and_each_winner_becomes_the_incumbent() {
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_auto_with(
        &mut p,
        200,
        |_| [0.5, 0.5],
        rates([1000.0, 1050.0, 1100.0, 1200.0]),
    );
    let k = keeps(&decisions);
    assert!(k[0].starts_with("keep both"), "{k:?}");
    assert!(k[0].contains("temporal vs unstaged: better"), "{k:?}");
    assert!(k[0].contains("spatial vs temporal: better"), "{k:?}");
    assert!(k[0].contains("both vs spatial: better"), "{k:?}");
    assert_eq!(modes.last(), Some(&Mode::Both));
}

#[test]
fn identical_modes_keep_unstaged_and_each_duel_says_no_better() {
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_auto_with(&mut p, 200, |_| [0.5, 0.5], |_| 1000.0);
    let v = verdicts(&decisions);
    let s = v[0].summary.as_ref().unwrap();
    assert_eq!(s.kept, "unstaged");
    assert!(
        s.duels.iter().all(|d| d.outcome == "no better" && !d.won),
        "{s:?}"
    );
    assert_eq!(modes.last(), Some(&Mode::Unstaged));
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
    let modes = drive_auto(&mut p, 200, rates([1000.0, 1300.0, 900.0, 1000.0]));
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
    let modes = drive_auto(&mut p, 100, rates([1000.0, 2000.0, 1200.0, 2000.0]));
    assert!(modes.iter().all(|m| [Unstaged, Spatial].contains(m)));
    assert!(modes[60..].iter().all(|m| *m == Spatial), "{modes:?}");
}

#[test]
fn one_core_and_short_visits_rule_the_spatial_modes_out_and_say_why() {
    // One core: the static plan is the pinned one.
    let mut p = Auto::new(
        ctx(1, 2, 2),
        AutoParams {
            first_trial_after: 0,
            ..Default::default()
        },
    );
    let mut modes = Vec::new();
    for _ in 0..100 {
        p.observe(&Observation::rate(1000.0));
        p.plan(&[0.5, 0.5]);
        if let Some(d) = p.decision() {
            modes.push(d.mode);
            if let Some(s) = d.summary {
                assert_eq!(s.skipped.len(), 2, "{s:?}");
                assert!(d.what.contains("spatial skipped (one core"), "{}", d.what);
                assert_eq!(s.duels.len(), 1);
            }
        }
    }
    assert!(!modes.contains(&Mode::Spatial) && !modes.contains(&Mode::Both));
    assert_eq!(p.stats().modes_skipped, 2);
    // Visits of 1 µs against a 5 µs migration.
    let mut p = auto_now(AutoParams {
        migration_ns: Some(5000.0),
        ..Default::default()
    });
    let (_, decisions) = drive_observed(
        &mut p,
        100,
        |_| [0.5, 0.5],
        |m, _| Observation {
            entries: Some(1000.0),
            cpu_ns: Some(1e6),
            ..Observation::rate(if m.is_spatial() { 2000.0 } else { 1000.0 })
        },
    );
    let k = keeps(&decisions);
    assert!(k[0].starts_with("keep unstaged"), "{k:?}");
    assert!(
        k[0].contains(
            "spatial skipped (the mean visit, 1.00 µs, is shorter than a migration, 5.00 µs)"
        ),
        "{k:?}"
    );
}

#[test]
fn auto_ignores_periods_without_requests() {
    let mut p = auto_now(Default::default());
    // No request ever completes: it never decides, it keeps trying.
    let modes = drive_auto(&mut p, 200, |_| 0.0);
    assert!(modes.contains(&Mode::Temporal), "{modes:?}");
    assert!(p.decision().is_none_or(|d| !d.what.starts_with("keep")));
    assert!(p.last_trial().is_none());
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
    // Open loop at 60 % utilisation: every mode completes the arrivals;
    // spatial costs least.
    let cpu = [69.0, 66.0, 2.3, 6.9];
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_observed(
        &mut p,
        200,
        |_| [0.5, 0.5],
        |m, _| period(8000.0, cpu[m.index()], 0.6 * cpu[m.index()] / 69.0, 100.0),
    );
    let s = verdicts(&decisions)[0].summary.clone().unwrap();
    assert_eq!(
        (s.kept, s.objective),
        ("spatial", "CPU per request"),
        "{s:?}"
    );
    assert_eq!(modes.last(), Some(&Mode::Spatial));
}

#[test]
fn at_saturation_the_rate_decides() {
    // Spatial costs less CPU per request but completes fewer: saturated,
    // the rate decides.
    let mut p = auto_now(Default::default());
    let (_, decisions) = drive_observed(
        &mut p,
        200,
        |_| [0.5, 0.5],
        |m, _| {
            let (r, c) = if m.is_spatial() {
                (900.0, 10.0)
            } else {
                (1000.0, 20.0)
            };
            period(r, c, 0.99, 100.0)
        },
    );
    let s = verdicts(&decisions)[0].summary.clone().unwrap();
    assert_eq!((s.kept, s.objective), ("unstaged", "rate"), "{s:?}");
}

#[test]
fn the_latency_bound_vetoes_a_cheaper_mode() {
    // Spatial halves the CPU per request but its p99 is 50 % over
    // unstaged's (the bound allows 10 %): refused; temporal is kept.
    let cpu = [60.0, 50.0, 30.0, 60.0];
    let p99 = [200.0, 210.0, 300.0, 200.0];
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_observed(
        &mut p,
        200,
        |_| [0.5, 0.5],
        |m, _| period(8000.0, cpu[m.index()], 0.5, p99[m.index()]),
    );
    let v = verdicts(&decisions);
    let s = v[0].summary.clone().unwrap();
    assert_eq!(
        (s.kept, s.decided_by),
        ("temporal", "latency bound"),
        "{}",
        v[0].what
    );
    assert!(
        v[0].what.contains("spatial vs temporal: better"),
        "{}",
        v[0].what
    );
    assert!(
        v[0].what.contains("refused: latency bound"),
        "{}",
        v[0].what
    );
    assert!(s.modes[Mode::Spatial.index()].over_latency_bound);
    assert_eq!(modes.last(), Some(&Mode::Temporal));
}

#[test]
fn a_mode_with_a_tail_far_beyond_the_bound_is_refused_after_a_pair() {
    let cpu = [60.0, 60.0, 30.0, 60.0];
    let p99 = [200.0, 200.0, 1000.0, 200.0];
    let mut p = auto_now(AutoParams {
        candidates: Modes::of(&[Mode::Spatial]),
        ..Default::default()
    });
    let (modes, decisions) = drive_observed(
        &mut p,
        100,
        |_| [0.5, 0.5],
        |m, _| period(8000.0, cpu[m.index()], 0.5, p99[m.index()]),
    );
    let spatial = modes.iter().filter(|m| **m == Mode::Spatial).count();
    assert!(spatial <= 6, "{modes:?}");
    let k = keeps(&decisions);
    assert!(
        k[0].contains("spatial vs unstaged: over twice the latency bound"),
        "{k:?}"
    );
    assert!(modes[50..].iter().all(|m| *m == Mode::Unstaged));
}

#[test]
fn a_cheaper_mode_behind_the_arrivals_is_refused() {
    // Below saturation spatial costs half the CPU but completes 20 % fewer
    // requests: it does not keep up.
    let mut p = auto_now(AutoParams {
        candidates: Modes::of(&[Mode::Spatial]),
        ..Default::default()
    });
    let (_, decisions) = drive_observed(
        &mut p,
        100,
        |_| [0.5, 0.5],
        |m, i| {
            let jitter = 1.0 + 0.01 * (i % 3) as f64;
            if m.is_spatial() {
                period(6400.0 * jitter, 30.0, 0.5, 100.0)
            } else {
                period(8000.0 * jitter, 60.0, 0.5, 100.0)
            }
        },
    );
    let k = keeps(&decisions);
    assert!(k[0].starts_with("keep unstaged"), "{k:?}");
    assert!(k[0].contains("refused: behind the arrivals"), "{k:?}");
}

mod hold;
mod mix;
mod noise;
mod pairing;
mod stats;
