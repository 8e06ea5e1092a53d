//! Unit and property tests of the policies.

use super::*;
use proptest::prelude::*;

pub(crate) fn ctx(cores: usize, vcpus: u32, stages: usize) -> Context {
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
        latency: LatencyBound::default(),
        auto_modes: auto::Modes::ALL,
        auto_twin: false,
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
