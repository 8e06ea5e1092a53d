//! The sequential test and the change detector on known distributions: the
//! documented error rates hold.

use super::super::cusum::{Cusum, CusumParams, Shift};
use super::super::sprt::{Outcome, Sprt, SprtParams};
use super::noise::normal;

/// Runs `runs` tests on pairs drawn from N(`mean`, `sd`²); returns how
/// often each outcome came, and the mean number of pairs.
fn run(p: SprtParams, mean: f64, sd: f64, runs: u32, seed: u64) -> ([u32; 3], f64) {
    let mut seed = seed << 32;
    let mut counts = [0; 3];
    let mut pairs = 0u64;
    for _ in 0..runs {
        let mut t = Sprt::new(p);
        let o = loop {
            t.push(mean + sd * normal(&mut seed));
            if let Some(o) = t.outcome() {
                break o;
            }
        };
        pairs += u64::from(t.pairs());
        counts[match o {
            Outcome::Better => 0,
            Outcome::NoBetter => 1,
            Outcome::Capped => 2,
        }] += 1;
    }
    (counts, pairs as f64 / f64::from(runs))
}

#[test]
fn no_better_candidates_are_called_better_at_most_alpha_of_the_time() {
    let p = SprtParams::default();
    for sd in [0.01, 0.03, 0.08, 0.14] {
        let ([better, no, capped], n) = run(p, 0.0, sd, 2000, 11);
        // α = 5 %; 2000 runs: ± 1 % at two standard errors. The rest stop
        // "no better", or at the cap (no better shown) when σ is large.
        assert!(
            better <= 120,
            "σ {sd}: better {better} of 2000 ({n:.1} pairs)"
        );
        assert_eq!(better + no + capped, 2000);
        if sd < 0.05 {
            assert!(capped <= 20, "σ {sd}: capped {capped}");
        }
    }
    // Worse candidates even less often.
    let ([better, ..], _) = run(p, -0.03, 0.05, 2000, 12);
    assert!(better <= 20, "{better}");
}

#[test]
fn candidates_better_by_the_margin_are_found_but_for_beta() {
    let p = SprtParams::default();
    for sd in [0.01, 0.03, 0.05] {
        let ([better, ..], n) = run(p, p.margin, sd, 2000, 13);
        // β = 10 %; the cap on pairs takes a little more at large σ.
        assert!(
            better >= 1700,
            "σ {sd}: better {better} of 2000 ({n:.1} pairs)"
        );
    }
    // A large gain stops early: decisive from 3 pairs.
    let ([better, ..], n) = run(p, 0.2, 0.02, 200, 14);
    assert_eq!(better, 200);
    assert!(n <= f64::from(p.min_pairs), "{n}");
}

#[test]
fn a_futile_candidate_stops_at_once_and_a_good_one_never_does() {
    let p = SprtParams::default();
    // Beside a prior spread of 6 %, a pair 50 % behind is futile: no better
    // after one pair; one 20 % behind waits (0.03 + 6 · 0.06 = 0.39).
    let mut t = Sprt::new(p).with_prior_sigma(Some(0.06));
    t.push(-0.5);
    assert!(t.futile());
    assert_eq!(t.outcome(), Some(Outcome::NoBetter));
    let mut t = Sprt::new(p).with_prior_sigma(Some(0.06));
    t.push(-0.2);
    assert!(!t.futile());
    assert_eq!(t.outcome(), None);
    // Without a prior, one pair never decides.
    let mut t = Sprt::new(p);
    t.push(-0.5);
    assert_eq!(t.outcome(), None);
    // A prior never makes a gain decide sooner.
    let mut t = Sprt::new(p).with_prior_sigma(Some(0.01));
    t.push(0.5);
    assert_eq!(t.outcome(), None);
    // Candidates better by the margin, their pairs' spread 1.5 times the
    // prior (it was estimated from few pairs): a futile stop is a 5σ event
    // at the first pair (less after), and none comes in 20 000 duels.
    let mut seed = 21u64 << 32;
    for _ in 0..20_000 {
        let mut t = Sprt::new(p).with_prior_sigma(Some(0.04));
        for _ in 1..p.min_pairs {
            t.push(p.margin + 0.06 * normal(&mut seed));
            assert!(!t.futile(), "mean {:?}", t.mean());
        }
    }
}

#[test]
fn the_test_waits_for_its_least_pairs_and_stops_at_its_cap() {
    let p = SprtParams::default();
    // Fewer than 3 pairs never decide; 3 that agree on a large gain do.
    let mut t = Sprt::new(p);
    for _ in 1..3 {
        t.push(0.5);
        assert_eq!(t.outcome(), None);
    }
    t.push(0.5);
    assert_eq!(t.outcome(), Some(Outcome::Better));
    // A small gain waits for the least pairs, however alike they are.
    let mut t = Sprt::new(p);
    for _ in 1..p.min_pairs {
        t.push(p.margin);
        assert_eq!(t.outcome(), None);
    }
    // Pairs in the indifference zone never decide: the cap does.
    let mut t = Sprt::new(SprtParams {
        sigma_floor: 0.05,
        ..p
    });
    for i in 0..p.max_pairs {
        t.push(p.margin / 2.0 + if i % 2 == 0 { 0.05 } else { -0.05 });
    }
    assert_eq!(t.outcome(), Some(Outcome::Capped));
    t.push(f64::NAN);
    assert_eq!(t.pairs(), p.max_pairs);
    assert!(t.confidence().unwrap() > 0.5);
}

#[test]
fn cusum_finds_a_step_and_rarely_a_stationary_change() {
    let p = CusumParams::default();
    let mut seed = 99u64;
    // Stationary: N(100, 5²) for 20,000 values; restarted after an alarm.
    let mut c = Cusum::new(p, false);
    let mut alarms = 0;
    for _ in 0..20_000 {
        if c.push(100.0 + 5.0 * normal(&mut seed)).is_some() {
            alarms += 1;
            c = Cusum::new(p, false);
        }
    }
    // ~2 × 10⁴ values between false alarms per side (module docs).
    assert!(alarms <= 6, "{alarms} false alarms in 20,000 values");
    // A shift of two σ down is found in tens of values, of ten σ at once.
    // (The allowance is at least half the least shift worth a trial: 10 %
    // of the reference, here 1 σ.)
    for (shift, within) in [(-10.0, 40), (50.0, 5)] {
        let mut c = Cusum::new(p, false);
        for _ in 0..p.calibrate {
            c.push(100.0 + 5.0 * normal(&mut seed));
        }
        let at = (1..=1000)
            .find(|_| c.push(100.0 + shift + 5.0 * normal(&mut seed)).is_some())
            .unwrap();
        assert!(at <= within, "shift {shift}: found after {at}");
    }
    // Upper only (as the stage mix's, no least shift): a fall is no
    // change, a rise is, in h / (clip − k) = 4 values; a constant signal's
    // floor holds.
    let mut c = Cusum::new(
        CusumParams {
            min_shift: 0.0,
            ..p
        },
        true,
    );
    for _ in 0..p.calibrate {
        c.push(1.0);
    }
    assert!((0..100).all(|_| c.push(0.0).is_none()));
    assert_eq!((1..=4).find(|_| c.push(2.0).is_some()), Some(4));
    assert_eq!(c.push(2.0), Some(Shift::Up));
    let mut c = Cusum::new(p, false);
    for _ in 0..p.calibrate {
        c.push(100.0);
    }
    assert!((0..100).all(|_| c.push(100.5).is_none()));
}
