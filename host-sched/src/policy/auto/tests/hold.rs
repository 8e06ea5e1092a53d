//! `auto`'s holds: the fall-back guard, the unstaged probes, the trial
//! costs and the triggers of a new trial.

use super::*;

#[test]
fn auto_falls_back_when_the_held_mode_drops_below_the_trial_unstaged_rate() {
    let params = AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    for held in [Mode::Temporal, Mode::Spatial, Mode::Both] {
        // The trial sees `held` 40 % faster in all its three epochs (a
        // transient); held, it runs at 60 % of unstaged: back to unstaged
        // once the hold settled.
        let mut p = Auto::new(ctx(2, 2, 2), params);
        let mut periods_held = 0;
        let modes = drive_auto(&mut p, 80, |m| {
            if m != held {
                return if m == Mode::Unstaged { 100.0 } else { 90.0 };
            }
            periods_held += 1;
            if periods_held <= 3 * params.epoch_periods {
                140.0
            } else {
                60.0
            }
        });
        let first = modes.iter().position(|m| *m == held).expect("tried");
        let last = modes.iter().rposition(|m| *m == held).unwrap();
        // Its rounds with unstaged's (the others cut after one epoch),
        // then the settled hold.
        assert!(
            last < first + 24 + 2 * params.mix_settle as usize,
            "{held:?}: {modes:?}"
        );
        assert!(modes[last - 5..=last].iter().all(|m| *m == held));
        assert!(
            modes[last + 1..].iter().all(|m| *m == Mode::Unstaged),
            "{held:?}: {modes:?}"
        );
    }
    // A held mode that keeps its rate is kept.
    let mut p = Auto::new(ctx(2, 2, 2), params);
    let modes = drive_auto(&mut p, 80, rates([100.0, 140.0, 90.0, 90.0]));
    assert!(
        modes[20..].iter().all(|m| *m == Mode::Temporal),
        "{modes:?}"
    );
}

#[test]
fn auto_counts_what_its_trials_cost() {
    let params = AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    // Every staging 20 % slower: one trial, its other modes' epochs lost,
    // no switch of mode outside it.
    let mut p = Auto::new(ctx(2, 2, 2), params);
    let modes = drive_auto(&mut p, 60, rates([100.0, 80.0, 80.0, 80.0]));
    let st = p.stats();
    assert_eq!(st.periods, 60);
    assert_eq!(st.trials, 1);
    let staged = modes.iter().filter(|m| **m != Mode::Unstaged).count() as u64;
    assert_eq!(st.losing_periods, staged, "{st:?} {modes:?}");
    assert!(st.losing_periods > 0 && st.losing_periods < st.trial_periods);
    assert!(st.trial_periods <= 4 * u64::from(params.rounds * params.epoch_periods));
    assert_eq!(st.mode_switches, 0);
    // Temporal wins, then (after the hold) loses: one switch of mode.
    let params = AutoParams {
        first_trial_after: 0,
        hold_periods: 20,
        ..Default::default()
    };
    let mut p = Auto::new(ctx(2, 2, 2), params);
    let mut i = 0;
    drive_auto(&mut p, 100, |m| {
        i += 1;
        match (m == Mode::Temporal, i < 40) {
            (true, true) | (false, false) => 130.0,
            _ => 100.0,
        }
    });
    let st = p.stats();
    assert!(st.trials >= 2, "{st:?}");
    assert_eq!(st.mode_switches, 1, "{st:?}");
}

#[test]
fn auto_starts_a_trial_on_a_lasting_stage_mix_change_not_on_a_burst() {
    let params = AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    // Unstaged wins; the mix then moves for `burst` periods and back.
    let trials_after = |burst: usize| {
        let mut p = Auto::new(ctx(2, 2, 2), params);
        let load = |i: usize| {
            if (100..100 + burst).contains(&i) {
                [0.95, 0.05]
            } else {
                [0.5, 0.5]
            }
        };
        drive_auto_with(&mut p, 400, load, rates([100.0, 80.0, 80.0, 80.0]));
        p.stats().trials
    };
    assert_eq!(trials_after(3), 1, "a 3-period burst is not a new mix");
    assert_eq!(trials_after(300), 2, "a lasting change is");
}

#[test]
fn a_held_mode_falls_back_when_its_cpu_or_its_p99_rises() {
    let params = AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    for what in ["cpu", "p99"] {
        // Spatial wins the trial (25 against 30 µs, same p99), then, held,
        // costs 33 µs or reaches a p99 of 400 µs.
        let mut p = Auto::new(ctx(2, 2, 2), params);
        let mut held = 0;
        let (modes, decisions) = drive_observed(
            &mut p,
            300,
            |_| [0.5, 0.5],
            |m, _| match m {
                Mode::Spatial => {
                    held += 1;
                    // Good through its trial epochs, then worse.
                    match (what, held > 3 * params.epoch_periods) {
                        ("cpu", true) => period(30_000.0, 33.0, 0.6, 200.0),
                        ("p99", true) => period(30_000.0, 25.0, 0.6, 400.0),
                        _ => period(30_000.0, 25.0, 0.6, 200.0),
                    }
                }
                _ => period(30_000.0, 30.0, 0.6, 200.0),
            },
        );
        let last = modes.iter().rposition(|m| *m == Mode::Spatial).unwrap();
        assert!(last < 120, "{what}: {modes:?}");
        assert!(
            modes[last + 1..].iter().all(|m| *m == Mode::Unstaged),
            "{what}"
        );
        let why = &decisions
            .iter()
            .find(|(i, _)| *i == last + 1)
            .expect("a decision at the fall-back")
            .1
            .what;
        let want = if what == "cpu" {
            "of CPU per request in its hold"
        } else {
            "p99 latency rose to 426 µs in its hold, over the latency bound of 234 µs"
        };
        assert!(why.contains(want), "{why}");
        let st = p.stats();
        let counted = if what == "cpu" {
            st.fallbacks_figure
        } else {
            st.fallbacks_latency
        };
        assert_eq!(counted, 1, "{st:?}");
    }
}

#[test]
fn a_load_that_crosses_saturation_starts_a_trial() {
    let params = AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    // Unstaged is kept at 60 % utilisation; from period 100 the load rises
    // to saturation for good.
    let mut p = Auto::new(ctx(2, 2, 2), params);
    let (_, decisions) = drive_observed(
        &mut p,
        300,
        |_| [0.5, 0.5],
        |m, i| {
            let util = if i < 100 { 0.6 } else { 1.0 };
            let cpu = if m == Mode::Unstaged { 30.0 } else { 33.0 };
            period(30_000.0, cpu, util, 200.0)
        },
    );
    let retrial: Vec<_> = decisions
        .iter()
        .filter(|(_, d)| d.what.starts_with("load changed"))
        .collect();
    assert_eq!(retrial.len(), 1, "{decisions:?}");
    assert!(retrial[0].0 > 100 && retrial[0].0 < 200, "{retrial:?}");
    assert!(
        retrial[0].1.what.contains("utilisation"),
        "{:?}",
        retrial[0]
    );
    let v = verdicts(&decisions);
    assert_eq!(v.len(), 2);
    assert_eq!(v[1].summary.as_ref().unwrap().objective, "rate");
}

#[test]
fn an_unstaged_probe_ends_a_hold_that_stopped_paying() {
    let params = AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    // Spatial wins the trial (130 against 100). From period 60 unstaged
    // would run at 130 and spatial at 98: above the guard's reference of
    // 100 × (1 − margin), so only an unstaged probe can tell.
    let mut p = Auto::new(ctx(2, 2, 2), params);
    let (modes, decisions) = drive_observed(
        &mut p,
        400,
        |_| [0.5, 0.5],
        |m, i| {
            Observation::rate(match (m, i < 60) {
                (Mode::Unstaged, true) => 100.0,
                (Mode::Unstaged, false) => 130.0,
                (Mode::Spatial, true) => 130.0,
                (Mode::Spatial, false) => 98.0,
                _ => 60.0,
            })
        },
    );
    let kept = modes.iter().position(|m| *m == Mode::Spatial).unwrap();
    let fell = decisions
        .iter()
        .find(|(_, d)| d.what.contains("an unstaged probe ran at"))
        .unwrap_or_else(|| panic!("{decisions:?}"));
    // Within one probe interval of the change (and after the hold settled).
    assert!(
        fell.0 > 60 && fell.0 <= 60 + params.probe_every as usize + 5,
        "{fell:?}"
    );
    assert!(modes[fell.0 + 1..fell.0 + 50]
        .iter()
        .all(|m| *m == Mode::Unstaged));
    assert!(kept < 60);
    // While it pays, the probes cost one epoch in `probe_every` periods.
    let mut p = Auto::new(ctx(2, 2, 2), params);
    let modes = drive_auto(&mut p, 1000, rates([100.0, 60.0, 130.0, 60.0]));
    let held = &modes[100..];
    let unstaged = held.iter().filter(|m| **m == Mode::Unstaged).count();
    let want = held.len() * params.epoch_periods as usize / params.probe_every as usize;
    assert!(
        unstaged.abs_diff(want) <= 3,
        "{unstaged} unstaged periods, {want} expected"
    );
    assert!(held.iter().filter(|m| **m == Mode::Spatial).count() > held.len() * 9 / 10);
}
