//! The pairing order and the settling under a fake clock: the period
//! number is the clock, the figures are functions of it.

use super::*;

fn letters(modes: &[Mode]) -> String {
    modes
        .iter()
        .map(|m| match m {
            Mode::Unstaged => 'U',
            Mode::Temporal => 'T',
            Mode::Spatial => 'S',
            Mode::Both => 'B',
        })
        .collect()
}

#[test]
fn slices_alternate_in_balanced_pairs_and_skip_the_settling_after_a_switch() {
    let mut p = auto_now(AutoParams {
        candidates: Modes::of(&[Mode::Temporal]),
        ..Default::default()
    });
    let modes = drive_auto(&mut p, 60, rates([1000.0, 1000.0, 0.0, 0.0]));
    // Pair 0 is U then T, pair 1 T then U, …: the plan changes every other
    // slice; a slice after a change runs the most settling periods (3)
    // first, until the settling is measured (0 here, once each mode was
    // switched to three times: at the duel's last slice). The duel ends at
    // its least pairs (6), unstaged kept.
    let s = letters(&modes);
    let (u, t) = ("U".repeat(7), "T".repeat(7));
    let pairs = format!("UU{t}{u}{t}{u}{t}UUUUU");
    assert_eq!(s[..pairs.len()], pairs, "{s}");
    assert_eq!(s[pairs.len()..], "U".repeat(60 - pairs.len()), "{s}");
    assert_eq!(p.last_trial().unwrap().settle_periods, 0);
}

/// The first trial of temporal against unstaged, each period measuring
/// `rate(mode, moved)` requests/s (`moved`: the first period of the mode
/// after a change of plan); its verdict's summary and line.
fn trial_with_transients(rate: impl Fn(Mode, bool) -> f64) -> (TrialSummary, String) {
    let mut p = auto_now(AutoParams {
        candidates: Modes::of(&[Mode::Temporal]),
        ..Default::default()
    });
    let mut last = Mode::Unstaged;
    let (_, decisions) = drive_observed(
        &mut p,
        300,
        |_| [0.5, 0.5],
        |m, _| {
            let moved = m != last;
            last = m;
            Observation::rate(rate(m, moved))
        },
    );
    let v = verdicts(&decisions)[0];
    (v.summary.clone().unwrap(), v.what.clone())
}

#[test]
fn the_settling_is_measured_from_the_figures() {
    // The period after a change of plan runs at half the rate (the threads
    // move); the one after it is steady: one period of settling.
    let (s, what) = trial_with_transients(|_, moved| if moved { 500.0 } else { 1000.0 });
    assert_eq!(s.settle_periods, 1, "{what}");
    assert_eq!(s.kept, "unstaged");
}

#[test]
fn the_settling_is_measured_per_mode_when_the_transients_mirror() {
    // Alike modes whose first period after a change mirror each other, as
    // SRPT's slice completes the last stages' queued work (+20 %) and
    // leaves the first stages' to FIFO's (-20 %): pooled, the deviations
    // cancel and no settling is seen, so every pair finds temporal ahead.
    let (s, what) = trial_with_transients(|m, moved| match (moved, m) {
        (false, _) => 1000.0,
        (true, Mode::Unstaged) => 800.0,
        (true, _) => 1200.0,
    });
    assert_eq!(s.settle_periods, 1, "{what}");
    assert_eq!(s.kept, "unstaged", "{what}");
}

#[test]
fn a_drift_of_the_load_cancels_over_balanced_pairs() {
    // Both modes alike, the rate rising 0.5 % a period: an A-then-B order
    // would see B ahead by the drift in every pair; balanced pairs see
    // nothing.
    let mut p = auto_now(AutoParams {
        candidates: Modes::of(&[Mode::Temporal]),
        ..Default::default()
    });
    let (_, decisions) = drive_observed(
        &mut p,
        300,
        |_| [0.5, 0.5],
        |_, i| Observation::rate(1000.0 * (1.0 + 0.005 * i as f64)),
    );
    let s = verdicts(&decisions)[0].summary.clone().unwrap();
    assert_eq!(s.kept, "unstaged", "{}", verdicts(&decisions)[0].what);
    assert!(s.duels[0].mean.unwrap().abs() < 0.01, "{:?}", s.duels[0]);
}

proptest::proptest! {
    /// Whatever the modes' figures and noise, `auto` never holds a mode
    /// whose duel its own test did not find better: the kept mode is
    /// unstaged or the candidate of a won duel, and every won duel's test
    /// said "better" with no veto.
    #[test]
    fn auto_never_holds_a_mode_its_test_rejected(
        gains in proptest::array::uniform4(-0.2f64..0.2),
        noise in 0.0f64..0.15,
        seed in 1u64..u64::MAX,
    ) {
        let mut seed = seed;
        let mut p = auto_now(AutoParams { hold_periods: 100, ..Default::default() });
        let (modes, decisions) = drive_observed(
            &mut p,
            800,
            |_| [0.5, 0.5],
            |m, _| {
                let g = if m == Mode::Unstaged { 0.0 } else { gains[m.index()] };
                let n = noise * super::noise::normal(&mut seed);
                Observation::rate((1000.0 * (1.0 + g) * (1.0 + n)).max(1.0))
            },
        );
        for (i, d) in &decisions {
            let Some(s) = &d.summary else { continue };
            let won: Vec<&DuelSummary> = s.duels.iter().filter(|d| d.won).collect();
            for w in &won {
                proptest::prop_assert_eq!(w.outcome, "better");
                proptest::prop_assert!(w.veto.is_none());
            }
            if s.kept != "unstaged" {
                proptest::prop_assert_eq!(won.last().map(|w| w.candidate), Some(s.kept));
            }
            // Held from the verdict until the next trial.
            let held = &modes[*i..];
            let end = decisions
                .iter()
                .find(|(j, e)| j > i && e.what.contains("trial"))
                .map_or(held.len(), |(j, _)| j - i);
            proptest::prop_assert!(held[..end].iter().all(|m| m.name() == s.kept));
        }
    }
}

#[test]
fn a_mode_that_starves_the_guest_loses_its_duel_and_no_duel_runs_for_ever() {
    // Spatial beats unstaged; both completes no request at all.
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_auto_with(
        &mut p,
        300,
        |_| [0.5, 0.5],
        rates([1000.0, 900.0, 2000.0, 0.0]),
    );
    let v = verdicts(&decisions);
    assert!(
        v[0].what.contains("both vs spatial: no better"),
        "{}",
        v[0].what
    );
    assert_eq!(modes.last(), Some(&Mode::Spatial));
    // Nothing completes anywhere: every duel ends at the cap on pairs.
    let mut p = auto_now(Default::default());
    let (_, decisions) = drive_auto_with(&mut p, 5000, |_| [0.5, 0.5], |_| 0.0);
    let v = verdicts(&decisions);
    assert!(!v.is_empty(), "a trial never ended");
    let s = v[0].summary.as_ref().unwrap();
    assert!(
        s.duels
            .iter()
            .all(|d| d.outcome == "capped" && d.pairs == 0),
        "{s:?}"
    );
    assert_eq!(s.kept, "unstaged");
}

#[test]
fn a_mode_that_completes_next_to_nothing_loses_in_the_least_pairs() {
    // Temporal completes a millionth of unstaged's rate (not none: the
    // starved rule does not apply): each pair counts at most a 63 % loss,
    // so the pairs agree and the duel is decisive at 3 pairs.
    let (s, what) = trial_with_transients(|m, _| if m == Mode::Temporal { 0.001 } else { 1000.0 });
    let d = &s.duels[0];
    assert_eq!((d.outcome, d.pairs), ("no better", 3), "{what}");
    assert!((d.mean.unwrap() + 0.632).abs() < 1e-3, "{what}");
    assert_eq!(s.kept, "unstaged");
}
