//! `auto` on noisy measurements: Poisson-like period rates under open loop
//! and a busy host's noise at saturation, where a difference smaller than
//! the periods' own spread must decide nothing (`BEHIND_Z`, `KEEP_Z`).

use super::*;

/// A period's rate of Poisson arrivals at `rate` requests/s over 20 ms
/// (normal approximation: `rate` ± √(rate × 0.02) / 0.02), drawn with the
/// xorshift state `seed`.
fn poisson_rate(seed: &mut u64, rate: f64) -> f64 {
    // Irwin–Hall: the sum of 12 uniforms minus 6 is ~N(0, 1).
    let z: f64 = (0..12)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed % 1_000_000) as f64 / 1_000_000.0
        })
        .sum::<f64>()
        - 6.0;
    let n = rate * 0.02;
    (n + z * n.sqrt()).max(1.0) / 0.02
}

#[test]
fn open_loop_noise_in_the_rates_does_not_refuse_a_mode_that_keeps_up() {
    // What CI met (open_loop.rs): 8,000 requests/s arrive (160 a period,
    // so each period's rate varies by ~8 %); spatial costs 2.3 µs of CPU a
    // request against unstaged's 69, temporal 66; both has a tail far
    // beyond the bound. Spatial serves every arrival: in no trial may the
    // rates' noise call it behind the arrivals, nor may a refused mode
    // drop another.
    let cpu = [69.0, 66.0, 2.3, 6.9];
    let p99 = [130.0, 105.0, 28.0, 5800.0];
    for s in 1..=200u64 {
        let mut seed = s.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut p = auto_now(Default::default());
        let (modes, decisions) = drive_observed(
            &mut p,
            80,
            |_| [0.5, 0.5],
            |m, _| {
                let rate = poisson_rate(&mut seed, 8000.0);
                period(
                    rate,
                    cpu[m.index()],
                    0.29 * cpu[m.index()] / 69.0,
                    p99[m.index()],
                )
            },
        );
        let v = verdicts(&decisions);
        assert_eq!(
            v[0].summary.as_ref().unwrap().kept,
            "spatial",
            "seed {s}: {}",
            v[0].what
        );
        assert_eq!(modes[79], Mode::Spatial, "seed {s}");
    }
}

#[test]
fn a_mode_behind_the_arrivals_drops_no_other_mode() {
    // Spatial costs a tenth of the CPU but completes 40 % fewer requests
    // than arrive; temporal keeps up at 10 % less CPU than unstaged.
    // Spatial's lead under the CPU objective must not drop temporal.
    let cpu = [30.0, 27.0, 3.0, 30.0];
    let mut p = auto_now(Default::default());
    let (modes, decisions) = drive_observed(
        &mut p,
        80,
        |_| [0.5, 0.5],
        |m, _| match m {
            Mode::Spatial => period(18_000.0, cpu[2], 0.05, 200.0),
            _ => period(30_000.0, cpu[m.index()], 0.6, 200.0),
        },
    );
    let v = verdicts(&decisions);
    let s = v[0].summary.as_ref().unwrap();
    assert_eq!(s.kept, "temporal", "{}", v[0].what);
    assert!(!s.modes[Mode::Temporal.index()].dropped, "{}", v[0].what);
    assert!(v[0].what.contains("behind the arrivals"), "{}", v[0].what);
    assert!(
        modes[50..].iter().all(|m| *m == Mode::Temporal),
        "{modes:?}"
    );
}

/// The mode `auto` keeps after one trial of a saturated guest (judged by
/// rate) whose periods run at 100,000 requests/s ± 10 % (a busy host),
/// each mode's rate × `factor[mode]`; the noise drawn from `seed`.
fn kept_under_noise(seed: u64, factor: [f64; 4]) -> &'static str {
    let mut seed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut p = auto_now(Default::default());
    let (_, decisions) = drive_observed(
        &mut p,
        40,
        |_| [1.0, 1.0],
        |m, _| {
            let noise = poisson_rate(&mut seed, 10_000.0) / 10_000.0;
            let rate = 100_000.0 * (1.0 + (noise - 1.0) * 1.41) * factor[m.index()];
            period(rate, 10.0, 1.0, 100.0)
        },
    );
    verdicts(&decisions)[0].summary.as_ref().unwrap().kept
}

#[test]
fn a_saturated_guest_keeps_unstaged_when_a_mode_leads_only_by_noise() {
    // What CI met (sched.rs, auto_steps_aside…): saturated, so judged by
    // rate; every period's rate varies by ±10 %, and temporal is in truth
    // no faster than unstaged. Kept by noise alone in at most ~2.3 % of
    // trials (KEEP_Z); 200 seeds may show a few, never many (25 without
    // the noise test).
    let kept_temporal = (1..=200u64)
        .filter(|s| kept_under_noise(*s, [1.0, 1.0, 0.5, 0.5]) == "temporal")
        .count();
    assert!(
        kept_temporal <= 10,
        "temporal kept by noise in {kept_temporal} of 200 trials"
    );
    // A real lead of 20 % over the same noise is kept.
    assert_eq!(kept_under_noise(7, [1.0, 1.2, 0.5, 0.5]), "temporal");
}
