//! Unit and property tests of the policies.

use super::*;
use proptest::prelude::*;

fn ctx(cores: usize, vcpus: u32, stages: usize) -> Context {
    Context {
        cores: (0..cores).collect(),
        num_vcpus: vcpus,
        budgets: (0..stages)
            .map(|i| Budget {
                name: format!("s{i}"),
                min_cores: 0,
                max_cores: cores,
                weight: 1.0,
            })
            .collect(),
        smoothing: 0.7,
        hysteresis: 0.1,
        visit: VisitPolicy::Fifo,
    }
}

#[test]
fn figure_4_6_examples() {
    assert_eq!(distribute(&[0.8, 0.2], 2), [2, 0]);
    assert_eq!(distribute(&[0.5, 0.5], 2), [1, 1]);
    assert_eq!(distribute(&[1.0, 1.0, 1.0], 6), [2, 2, 2]);
    assert_eq!(distribute(&[3.0, 2.0, 1.0], 6), [3, 2, 1]);
    assert_eq!(distribute(&[1.0, 1.0, 1.0], 2).iter().sum::<usize>(), 2);
    assert_eq!(distribute(&[0.0, 0.0], 3), [2, 1]);
    assert_eq!(distribute(&[0.2, 0.8], 2), [0, 2]);
    // Three equal stages on two cores: the middle one rides along.
    assert_eq!(distribute(&[1.0, 1.0, 1.0], 2), [1, 0, 1]);
}

#[test]
fn static_two_stages_on_two_cores_with_four_vcpus() {
    let mut p = build(PolicyKind::Static, ctx(2, 4, 2));
    let plan = p.plan(&[]);
    assert_eq!(plan.stage_vcpus, [0b0101, 0b1010]);
    assert_eq!(
        plan.vcpu_cores
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>(),
        ["0", "1", "0", "1"]
    );
    assert_eq!(plan.stage_cores[0].to_string(), "0");
    assert_eq!(plan.stage_cores[1].to_string(), "1");
}

#[test]
fn zero_core_stage_rides_on_the_victim_core() {
    let mut c = ctx(2, 2, 3);
    c.budgets[1].weight = 0.0;
    let plan = build(PolicyKind::Static, c).plan(&[]);
    assert_eq!(plan.requirement, [1, 0, 1]);
    assert_eq!(plan.stage_vcpus, [0b01, 0b10, 0b10]);
}

#[test]
fn off_and_pinned_serve_everything() {
    let off = build(PolicyKind::Off, ctx(2, 4, 3)).plan(&[]);
    assert!(off.stage_vcpus.iter().all(|m| *m == 0b1111));
    assert!(off.vcpu_cores.iter().all(|c| c.to_string() == "0-1"));
    let pinned = build(PolicyKind::Pinned, ctx(2, 4, 3)).plan(&[]);
    assert!(pinned.stage_vcpus.iter().all(|m| *m == 0b1111));
    assert_eq!(pinned.vcpu_cores[3].to_string(), "1");
}

#[test]
fn proportional_follows_a_phase_change_within_five_periods() {
    let mut p = build(PolicyKind::Proportional, ctx(2, 4, 2));
    for _ in 0..10 {
        p.plan(&[4.0, 1.0]);
    }
    assert_eq!(p.plan(&[4.0, 1.0]).requirement, [2, 0]);
    let moved = (1..=5).find(|_| p.plan(&[1.0, 4.0]).requirement == [0, 2]);
    assert!(moved.is_some(), "no move within 5 periods");
    // The static policy never moves.
    let mut s = build(PolicyKind::Static, ctx(2, 4, 2));
    let before = s.plan(&[4.0, 1.0]);
    assert_eq!(s.plan(&[1.0, 4.0]), before);
}

#[test]
fn a_stage_without_cores_does_not_hold_back_the_others() {
    // plan may not have a core (max 0): parse vs execute at 0.7 : 0.2
    // must still give parse both cores, although plan's load is 0.25.
    let mut c = ctx(2, 2, 3);
    c.budgets[1].max_cores = 0;
    let f = fractional(&[0.7, 0.25, 0.2], &c);
    assert!((f[0] - 1.5556).abs() < 1e-3 && f[1] == 0.0, "{f:?}");
    let mut p = build(PolicyKind::Proportional, c);
    assert_eq!(p.plan(&[0.0; 3]).requirement, [1, 0, 1]);
    let mut last = Vec::new();
    for _ in 0..5 {
        last = p.plan(&[0.7, 0.25, 0.2]).requirement;
    }
    assert_eq!(last, [2, 0, 0]);
}

#[test]
fn budgets_are_respected() {
    let mut c = ctx(4, 4, 2);
    c.budgets[0].max_cores = 1;
    c.budgets[1].min_cores = 1;
    let mut p = build(PolicyKind::Proportional, c);
    for _ in 0..5 {
        let plan = p.plan(&[100.0, 1.0]);
        assert_eq!(plan.requirement, [1, 3]);
    }
}

/// A small deterministic generator (xorshift64) for load noise.
fn noise(seed: &mut u64) -> f64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed % 1000) as f64 / 1000.0
}

#[test]
fn no_flapping_under_twenty_percent_noise() {
    for (cores, stages, base) in [
        (2, 2, vec![1.0, 1.0]),
        (6, 3, vec![3.0, 2.0, 1.0]),
        (4, 2, vec![3.0, 1.0]),
        (8, 4, vec![1.0, 1.0, 1.0, 1.0]),
    ] {
        let mut p = build(PolicyKind::Proportional, ctx(cores, cores as u32, stages));
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut last = p.plan(&base);
        let mut changes = Vec::new();
        for period in 0..1000 {
            let load: Vec<f64> = base
                .iter()
                .map(|l| l * (0.8 + 0.4 * noise(&mut seed)))
                .collect();
            let plan = p.plan(&load);
            if plan.stage_vcpus != last.stage_vcpus {
                changes.push(period);
            }
            last = plan;
        }
        // At most one map change in any window of 10 periods.
        for w in changes.windows(2) {
            assert!(
                w[1] - w[0] >= 10,
                "{cores} cores {stages} stages: changes at {changes:?}"
            );
        }
    }
}

proptest! {
    /// Every core is allocated whatever the load; budgets hold; each vCPU
    /// runs on a core of every stage it serves; every stage is served.
    #[test]
    fn plans_are_valid(
        cores in 1usize..8,
        extra_vcpus in 0u32..8,
        loads in proptest::collection::vec(0.0f64..100.0, 1..6),
        min0 in 0usize..2,
    ) {
        let mut c = ctx(cores, cores as u32 + extra_vcpus, loads.len());
        c.budgets[0].min_cores = min0.min(cores);
        let vcpus = c.num_vcpus;
        for kind in [PolicyKind::Static, PolicyKind::Proportional] {
            let mut p = build(kind, c.clone());
            for _ in 0..3 {
                let plan = p.plan(&loads);
                prop_assert_eq!(plan.requirement.iter().sum::<usize>(), cores);
                prop_assert!(plan.requirement[0] >= c.budgets[0].min_cores);
                for (s, mask) in plan.stage_vcpus.iter().enumerate() {
                    prop_assert!(*mask != 0, "stage {} unserved", s);
                    for v in 0..vcpus.min(64) {
                        if mask & (1 << v) != 0 {
                            prop_assert!(plan.vcpu_cores[v as usize].is_subset(&plan.stage_cores[s]));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_vcpu_owns_its_core_only_when_alone_on_it() {
    // 2 vCPUs on 2 cores: each alone on its core.
    let plan = build(PolicyKind::Static, ctx(2, 2, 2)).plan(&[]);
    assert_eq!(plan.owned_vcpus(), 0b11);
    // 3 vCPUs on 2 cores: vCPUs 0 and 2 share core 0, vCPU 1 owns core 1.
    let plan = build(PolicyKind::Pinned, ctx(2, 3, 2)).plan(&[]);
    assert_eq!(plan.owned_vcpus(), 0b010);
    // `off` floats every vCPU over every core: nobody owns one.
    let plan = build(PolicyKind::Off, ctx(2, 2, 2)).plan(&[]);
    assert_eq!(plan.owned_vcpus(), 0);
}

/// The mode a plan of `auto` over `ctx(2, 2, 2)` runs, checking that the
/// plan is exactly the `pinned` or the `static` one with FIFO visits or
/// `temporal` ones.
fn mode_of(plan: &Plan, temporal: VisitPolicy) -> auto::Mode {
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
        (false, false) => auto::Mode::Unstaged,
        (false, true) => auto::Mode::Temporal,
        (true, false) => auto::Mode::Spatial,
        (true, true) => auto::Mode::Both,
    }
}

/// Drives `auto` for `periods` periods, reporting `rate(mode)` requests/s
/// for the mode of each period, on an even load; returns the modes it ran.
fn drive_auto(
    p: &mut auto::Auto,
    periods: usize,
    rate: impl FnMut(auto::Mode) -> f64,
) -> Vec<auto::Mode> {
    drive_auto_with(p, periods, |_| [0.5, 0.5], rate).0
}

/// [`drive_auto`] with `load(period)` as each period's stage load; returns
/// the modes and the decisions with their periods. Every plan must be the
/// one of its mode, and every decision name that mode.
fn drive_auto_with(
    p: &mut auto::Auto,
    periods: usize,
    mut load: impl FnMut(usize) -> [f64; 2],
    mut rate: impl FnMut(auto::Mode) -> f64,
) -> (Vec<auto::Mode>, Vec<(usize, auto::AutoDecision)>) {
    let mut modes = Vec::new();
    let mut decisions = Vec::new();
    let mut mode = auto::Mode::Unstaged;
    for i in 0..periods {
        p.observe_rate(rate(mode));
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
fn rates(r: [f64; 4]) -> impl Fn(auto::Mode) -> f64 {
    move |m| r[m.index()]
}

/// `auto` with its first trial at once.
fn auto_now(params: auto::AutoParams) -> auto::Auto {
    auto::Auto::new(
        ctx(2, 2, 2),
        auto::AutoParams {
            first_trial_after: 0,
            ..params
        },
    )
}

#[test]
fn auto_keeps_temporal_when_it_is_fastest_by_more_than_the_margin() {
    use auto::Mode::*;
    let mut p = auto_now(Default::default());
    let rate = rates([1000.0, 1100.0, 900.0, 1050.0]);
    let (modes, decisions) = drive_auto_with(&mut p, 80, |_| [0.5, 0.5], rate);
    let trial = modes.iter().rposition(|m| *m != Temporal).unwrap();
    assert!(trial < 36, "{modes:?}");
    assert!(
        modes[trial + 1..].iter().all(|m| *m == Temporal),
        "{modes:?}"
    );
    for m in auto::Mode::ALL {
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
    let params = auto::AutoParams::default();
    let mut p = auto_now(params);
    let modes = drive_auto(&mut p, 80, rates([1000.0, 1020.0, 1010.0, 1025.0]));
    // A full trial: every mode's epochs in every round.
    let trial = 4 * (params.rounds * params.epoch_periods) as usize;
    assert!(
        modes[trial..].iter().all(|m| *m == auto::Mode::Unstaged),
        "{modes:?}"
    );
    for m in auto::Mode::ALL {
        let ran = modes[..trial].iter().filter(|x| **x == m).count();
        assert_eq!(
            ran,
            (params.rounds * params.epoch_periods) as usize,
            "{m:?}"
        );
    }
    let d = p.decision();
    assert!(d.is_none() || d.unwrap().mode == auto::Mode::Unstaged);
    assert_eq!(p.stats().losing_periods, 3 * 9);
}

#[test]
fn auto_keeps_both_when_both_is_best() {
    let mut p = auto_now(Default::default());
    let modes = drive_auto(&mut p, 80, rates([1000.0, 1100.0, 1120.0, 1250.0]));
    assert!(
        modes[36..].iter().all(|m| *m == auto::Mode::Both),
        "{modes:?}"
    );
    // The map is partitioned and the visits temporal (asserted for every
    // period by `mode_of`): here SRPT, the default.
    assert_eq!(p.temporal_policy(), auto::DEFAULT_TEMPORAL);
    let plan = p.plan(&[0.5, 0.5]);
    assert_eq!(plan.visit, VisitPolicy::Srpt);
    assert_eq!(plan.stage_vcpus, [0b01, 0b10]);
}

#[test]
fn auto_ties_go_to_the_simpler_mode() {
    // Spatial and both equally fast, well above unstaged: spatial.
    let mut p = auto_now(Default::default());
    let modes = drive_auto(&mut p, 80, rates([1000.0, 1000.0, 1200.0, 1200.0]));
    assert!(
        modes[40..].iter().all(|m| *m == auto::Mode::Spatial),
        "{modes:?}"
    );
}

#[test]
fn auto_runs_the_operators_temporal_policy() {
    let mut c = ctx(2, 2, 2);
    c.visit = VisitPolicy::Srpt;
    let params = auto::AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    let mut p = auto::Auto::new(c, params);
    assert_eq!(p.temporal_policy(), VisitPolicy::Srpt);
    // Temporal wins; its plans visit by SRPT (checked by `mode_of`), the
    // others FIFO although the operator named SRPT.
    let modes = drive_auto(&mut p, 60, rates([1000.0, 1300.0, 900.0, 1000.0]));
    assert_eq!(modes.last(), Some(&auto::Mode::Temporal));
    let plan = p.plan(&[0.5, 0.5]);
    assert_eq!(plan.visit, VisitPolicy::Srpt);
    assert!(plan.stage_vcpus.iter().all(|m| *m == 0b11));
}

#[test]
fn auto_trials_only_its_candidates() {
    use auto::Mode::*;
    let mut p = auto_now(auto::AutoParams {
        candidates: auto::Modes::of(&[Spatial]),
        ..Default::default()
    });
    // Temporal would win, but it is not a candidate.
    let modes = drive_auto(&mut p, 60, rates([1000.0, 2000.0, 1200.0, 2000.0]));
    assert!(modes.iter().all(|m| [Unstaged, Spatial].contains(m)));
    assert!(modes[20..].iter().all(|m| *m == Spatial), "{modes:?}");
}

#[test]
fn auto_trials_again_after_its_hold_and_records_why() {
    let params = auto::AutoParams {
        hold_periods: 10,
        first_trial_after: 0,
        ..Default::default()
    };
    let mut p = auto::Auto::new(ctx(2, 2, 2), params);
    let mut i = 0;
    let (_, decisions) = drive_auto_with(
        &mut p,
        100,
        |_| [0.5, 0.5],
        |m| {
            i += 1;
            // Temporal wins at first, loses later.
            match (m == auto::Mode::Temporal, i <= 30) {
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
    assert_eq!(keeps[0].1, auto::Mode::Temporal);
    assert_eq!(keeps.last().unwrap().1, auto::Mode::Unstaged);
    assert!(keeps[0].2.contains("requests/s"));
    assert!(decisions.iter().any(|(_, _, w)| w.starts_with("hold over")));
    assert!(decisions.iter().any(|(_, _, w)| w.starts_with("drop ")));
}

#[test]
fn auto_ignores_periods_without_requests() {
    let mut p = auto_now(Default::default());
    // No request ever completes: it never decides, it keeps trying.
    let modes = drive_auto(&mut p, 60, |_| 0.0);
    for m in auto::Mode::ALL {
        assert!(modes.contains(&m), "{m:?}: {modes:?}");
    }
    assert!(p.decision().is_none_or(|d| d.what.starts_with("trial")));
}

#[test]
fn distribute_is_total_on_hostile_priorities() {
    for p in [
        vec![f64::NAN, 1.0],
        vec![f64::INFINITY, f64::INFINITY],
        vec![1e308, 1e308, 1e308],
        vec![-1.0, f64::NEG_INFINITY],
        vec![f64::NAN; 4],
    ] {
        let r = distribute(&p, 5);
        assert_eq!(r.iter().sum::<usize>(), 5, "{p:?} -> {r:?}");
    }
}

proptest! {
    /// Any priorities, finite or not: every core is given out, at once.
    #[test]
    fn distribute_gives_out_every_core(p in proptest::collection::vec(any::<f64>(), 1..17), c in 0usize..65) {
        prop_assert_eq!(distribute(&p, c).iter().sum::<usize>(), c);
    }

    /// Proportional stays within its budgets on any load, however forged.
    #[test]
    fn proportional_is_total_on_any_load(load in proptest::collection::vec(any::<f64>(), 3)) {
        let mut p = build(PolicyKind::Proportional, ctx(2, 2, 3));
        let plan = p.plan(&load);
        prop_assert_eq!(plan.requirement.iter().sum::<usize>(), 2);
    }
}

#[test]
fn auto_runs_unstaged_before_its_first_trial() {
    let params = auto::AutoParams::default();
    let mut p = auto::Auto::new(ctx(2, 2, 2), params);
    // Staging would win, but a run shorter than the first hold never tries it.
    let modes = drive_auto(
        &mut p,
        params.first_trial_after as usize,
        rates([100.0, 200.0, 200.0, 200.0]),
    );
    assert!(
        modes.iter().all(|m| *m == auto::Mode::Unstaged),
        "{modes:?}"
    );
}

#[test]
fn auto_falls_back_when_the_held_mode_drops_below_the_trial_unstaged_rate() {
    let params = auto::AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    for held in [auto::Mode::Temporal, auto::Mode::Spatial, auto::Mode::Both] {
        // The trial sees `held` 40 % faster (a transient); held, it runs at
        // 60 % of unstaged: back to unstaged once the hold settled.
        let mut p = auto::Auto::new(ctx(2, 2, 2), params);
        let mut periods_held = 0;
        let modes = drive_auto(&mut p, 80, |m| {
            if m != held {
                return if m == auto::Mode::Unstaged {
                    100.0
                } else {
                    90.0
                };
            }
            periods_held += 1;
            if periods_held <= 3 {
                140.0
            } else {
                60.0
            }
        });
        let first = modes.iter().position(|m| *m == held).expect("tried");
        let last = modes.iter().rposition(|m| *m == held).unwrap();
        // Its epoch, the others' (cut at once), then the settled hold.
        assert!(
            last < first + 3 + 2 * 2 + 2 * params.mix_settle as usize,
            "{held:?}: {modes:?}"
        );
        assert!(modes[last - 5..=last].iter().all(|m| *m == held));
        assert!(
            modes[last + 1..].iter().all(|m| *m == auto::Mode::Unstaged),
            "{held:?}: {modes:?}"
        );
    }
    // A held mode that keeps its rate is kept.
    let mut p = auto::Auto::new(ctx(2, 2, 2), params);
    let modes = drive_auto(&mut p, 80, rates([100.0, 140.0, 90.0, 90.0]));
    assert!(
        modes[20..].iter().all(|m| *m == auto::Mode::Temporal),
        "{modes:?}"
    );
}

#[test]
fn auto_counts_what_its_trials_cost() {
    let params = auto::AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    // Every staging 20 % slower: one trial, its other modes' epochs lost,
    // no switch of mode outside it.
    let mut p = auto::Auto::new(ctx(2, 2, 2), params);
    let modes = drive_auto(&mut p, 60, rates([100.0, 80.0, 80.0, 80.0]));
    let st = p.stats();
    assert_eq!(st.periods, 60);
    assert_eq!(st.trials, 1);
    let staged = modes.iter().filter(|m| **m != auto::Mode::Unstaged).count() as u64;
    assert_eq!(st.losing_periods, staged, "{st:?} {modes:?}");
    assert!(st.losing_periods > 0 && st.losing_periods < st.trial_periods);
    assert!(st.trial_periods <= 4 * u64::from(params.rounds * params.epoch_periods));
    assert_eq!(st.mode_switches, 0);
    // Temporal wins, then (after the hold) loses: one switch of mode.
    let params = auto::AutoParams {
        first_trial_after: 0,
        hold_periods: 20,
        ..Default::default()
    };
    let mut p = auto::Auto::new(ctx(2, 2, 2), params);
    let mut i = 0;
    drive_auto(&mut p, 100, |m| {
        i += 1;
        match (m == auto::Mode::Temporal, i < 40) {
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
    let params = auto::AutoParams {
        first_trial_after: 0,
        ..Default::default()
    };
    // Unstaged wins; the mix then moves for `burst` periods and back.
    let trials_after = |burst: usize| {
        let mut p = auto::Auto::new(ctx(2, 2, 2), params);
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
