//! `auto` on noisy measurements: Poisson-like period rates under open loop
//! and a busy host's noise at saturation, where a difference smaller than
//! the periods' own spread must decide nothing (the sequential test's
//! false-switch bound, `BEHIND_Z`).

use super::*;

/// A period's rate of Poisson arrivals at `rate` requests/s over 20 ms
/// (normal approximation: `rate` ± √(rate × 0.02) / 0.02), drawn with the
/// xorshift state `seed`.
pub(super) fn poisson_rate(seed: &mut u64, rate: f64) -> f64 {
    let n = rate * 0.02;
    (n + normal(seed) * n.sqrt()).max(1.0) / 0.02
}

/// A standard normal draw (Irwin–Hall: the sum of 12 uniforms minus 6)
/// from the state `seed`, the uniforms by SplitMix64 (Steele, Lea and
/// Flood, OOPSLA 2014). Seed a run with `n << 32`: SplitMix64's state
/// steps by a constant, so seeds `n` and `n + 1` times that constant are
/// one stream a draw apart, and their normals share 11 of 12 uniforms
/// (runs of seeds then fail together: 29 of 200 "trials" were a few).
pub(super) fn normal(seed: &mut u64) -> f64 {
    (0..12)
        .map(|_| {
            *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = *seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 53) as f64
        })
        .sum::<f64>()
        - 6.0
}

#[test]
fn open_loop_noise_in_the_rates_does_not_refuse_a_mode_that_keeps_up() {
    // What CI met (open_loop.rs): 8,000 requests/s arrive (160 a period,
    // so each period's rate varies by ~8 %); spatial costs 2.3 µs of CPU a
    // request against unstaged's 69, temporal 66; both has a tail far
    // beyond the bound. Spatial serves every arrival: in no trial may the
    // rates' noise call it behind the arrivals.
    let cpu = [69.0, 66.0, 2.3, 6.9];
    let p99 = [130.0, 105.0, 28.0, 5800.0];
    for s in 1..=100u64 {
        let mut seed = s << 32;
        let mut p = auto_now(Default::default());
        let (modes, decisions) = drive_observed(
            &mut p,
            300,
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
            "seed {s}: {:?}",
            decisions
        );
        assert_eq!(modes[299], Mode::Spatial, "seed {s}");
    }
}

/// The mode `auto` keeps after one trial of a saturated guest (judged by
/// rate) whose periods run at 100,000 requests/s ± 14 % (a busy host),
/// each mode's rate × `factor[mode]`; the noise drawn from `seed`.
pub(super) fn kept_under_noise(seed: u64, factor: [f64; 4]) -> &'static str {
    let mut seed = seed << 32;
    let mut p = auto_now(Default::default());
    let (_, decisions) = drive_observed(
        &mut p,
        600,
        |_| [1.0, 1.0],
        |m, _| {
            let rate = 100_000.0 * (1.0 + 0.14 * normal(&mut seed)) * factor[m.index()];
            period(rate.max(1.0), 10.0, 1.0, 100.0)
        },
    );
    verdicts(&decisions)[0].summary.as_ref().unwrap().kept
}

#[test]
fn a_saturated_guest_keeps_unstaged_when_modes_are_alike() {
    // O2 in the unit tests: temporal identical to unstaged, under ±14 %
    // noise per period: the test declares no difference in ≥ 95 % of
    // trials (α = 5 %; 200 seeds).
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
