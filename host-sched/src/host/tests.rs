//! The host-wide allocator: the module's rules on small hosts, and
//! properties over arbitrary demands.

use proptest::prelude::*;

use super::*;

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

fn vm(name: &str, demand: f64, current: &str) -> VmDemand {
    VmDemand {
        name: name.into(),
        weight: 1.0,
        min_cores: 0,
        max_cores: usize::MAX,
        fixed: None,
        demand,
        current: if current.is_empty() {
            CpuSet::new()
        } else {
            set(current)
        },
        owned: None,
        lend_when_idle: false,
    }
}

fn cores(out: &[VmCores]) -> Vec<String> {
    out.iter().map(|o| o.cores.to_string()).collect()
}

#[test]
fn cores_follow_demand_and_stay_exclusive() {
    let host = set("0-3");
    // One busy VM, one nearly idle: 3 + 1 (one each first).
    let out = allocate(&host, &[vm("a", 3.5, ""), vm("b", 0.2, "")], 0.0).unwrap();
    assert_eq!(cores(&out), ["0-2", "3"]);
    assert!(out.iter().all(|o| !o.shared));
    // The load swaps: cores move, each VM keeping what it can.
    let out2 = allocate(&host, &[vm("a", 0.2, "0-2"), vm("b", 3.5, "3")], 0.0).unwrap();
    assert_eq!(cores(&out2), ["0", "1-3"]);
}

#[test]
fn weights_minimums_and_maximums_are_honoured() {
    let host = set("0-5");
    let mut a = vm("a", 6.0, "");
    let mut b = vm("b", 6.0, "");
    b.weight = 2.0;
    // Equal demand, b weighs twice: b gets more (4 to 2 by max-min steps).
    let out = allocate(&host, &[a.clone(), b.clone()], 0.0).unwrap();
    assert_eq!((out[0].cores.len(), out[1].cores.len()), (2, 4));
    a.min_cores = 3;
    b.max_cores = 2;
    let out = allocate(&host, &[a.clone(), b.clone()], 0.0).unwrap();
    assert_eq!((out[0].cores.len(), out[1].cores.len()), (4, 2));
    // An idle VM keeps its minimum.
    a.demand = 0.0;
    let out = allocate(&host, &[a, b], 0.0).unwrap();
    assert!(out[0].cores.len() >= 3);
}

#[test]
fn idle_cores_go_by_weight_up_to_the_maximum() {
    let host = set("0-3");
    let mut a = vm("a", 0.5, "");
    a.max_cores = 2;
    let mut b = vm("b", 0.5, "");
    b.weight = 3.0;
    // One each, then the two idle cores by weight ÷ (count + 1): b's 3/2
    // and 3/3 beat a's 1/2.
    let out = allocate(&host, &[a.clone(), b.clone()], 0.0).unwrap();
    assert_eq!((out[0].cores.len(), out[1].cores.len()), (1, 3));
    b.max_cores = 2;
    let out = allocate(&host, &[a, b], 0.0).unwrap();
    assert_eq!((out[0].cores.len(), out[1].cores.len()), (2, 2));
    let mut c = vm("c", 0.0, "");
    c.max_cores = 1;
    let out = allocate(&host, &[c], 0.0).unwrap();
    assert_eq!(cores(&out), ["0"], "at most max_cores even when idle");
}

#[test]
fn hysteresis_keeps_a_core_with_its_holder() {
    let host = set("0-1");
    // a holds both; b's unmet demand is only slightly larger than a's.
    let vms = [vm("a", 1.9, "0-1"), vm("b", 1.0, "")];
    let out = allocate(&host, &vms, 0.0).unwrap();
    assert_eq!(
        cores(&out),
        ["0", "1"],
        "one each: there are as many cores as VMs"
    );
    let vms = [vm("a", 2.0, "0-2"), vm("b", 2.2, ""), vm("c", 0.1, "3")];
    let host = set("0-3");
    // Without hysteresis b's 1.2 unmet beats a's 1.0; with 0.5 a keeps it.
    assert_eq!(
        cores(&allocate(&host, &vms, 0.0).unwrap()),
        ["0", "1-2", "3"]
    );
    assert_eq!(
        cores(&allocate(&host, &vms, 0.5).unwrap()),
        ["0-1", "2", "3"]
    );
}

#[test]
fn more_vms_than_cores_share_the_least_loaded_core() {
    let host = set("0-1");
    let out = allocate(
        &host,
        &[vm("a", 1.5, ""), vm("b", 0.9, ""), vm("c", 0.1, "")],
        0.0,
    )
    .unwrap();
    // a and b take a core each by demand; c shares b's (the lighter).
    assert_eq!(cores(&out), ["0", "1", "1"]);
    assert_eq!(
        out.iter().map(|o| o.shared).collect::<Vec<_>>(),
        [false, true, true]
    );
    assert!(out[2].owned.is_empty(), "c owns nothing");
    // A sharer whose old core was its own (an earlier period) stays there.
    let out = allocate(
        &host,
        &[vm("a", 1.5, "0"), vm("b", 0.9, "1"), vm("c", 0.1, "0")],
        0.0,
    )
    .unwrap();
    assert_eq!(cores(&out), ["0", "1", "0"]);
}

#[test]
fn an_idle_lender_shares_its_core_and_takes_one_back_when_busy() {
    let host = set("0-1");
    let lender = |demand: f64, current: &str, owned: &str| VmDemand {
        lend_when_idle: true,
        owned: Some(if owned.is_empty() {
            CpuSet::new()
        } else {
            set(owned)
        }),
        ..vm("b", demand, current)
    };
    // Without lending two VMs on two cores have one each, whatever the
    // demand: the busy one cannot have the idle one's core.
    let out = allocate(&host, &[vm("a", 2.0, "0"), vm("b", 0.01, "1")], 0.0).unwrap();
    assert_eq!(cores(&out), ["0", "1"]);
    // b lends when idle: a has both cores, b runs on its old one, shared,
    // owning none.
    let out = allocate(&host, &[vm("a", 2.0, "0"), lender(0.01, "1", "1")], 0.0).unwrap();
    assert_eq!(cores(&out), ["0-1", "1"]);
    assert!(out[1].shared && out[1].owned.is_empty(), "{out:?}");
    // Between the thresholds it stays as it is: it keeps an owned core
    // (0.07 ≥ LEND_BELOW) and stays lent (0.07 < RECLAIM_AT).
    let out = allocate(&host, &[vm("a", 2.0, "0"), lender(0.07, "1", "1")], 0.0).unwrap();
    assert_eq!(cores(&out), ["0", "1"]);
    let out = allocate(&host, &[vm("a", 2.0, "0-1"), lender(0.07, "1", "")], 0.0).unwrap();
    assert_eq!(cores(&out), ["0-1", "1"]);
    // Busy again (what it got on the shared core): a core of its own.
    let out = allocate(&host, &[vm("a", 2.0, "0-1"), lender(0.5, "1", "")], 0.0).unwrap();
    assert_eq!(cores(&out), ["0", "1"]);
    assert!(!out[1].shared);
    // Both idle: nobody else wants the cores, so the lender keeps one.
    let out = allocate(&host, &[vm("a", 0.0, "0"), lender(0.0, "1", "1")], 0.0).unwrap();
    assert_eq!(cores(&out), ["0", "1"]);
    // A minimum is a guarantee: a lender with min_cores 1 never lends.
    let b = VmDemand {
        min_cores: 1,
        ..lender(0.0, "1", "1")
    };
    let out = allocate(&host, &[vm("a", 2.0, "0"), b], 0.0).unwrap();
    assert_eq!(cores(&out), ["0", "1"]);
}

#[test]
fn fixed_sets_leave_the_pool() {
    let host = set("0-3");
    let mut a = vm("a", 9.0, "");
    a.fixed = Some(set("3"));
    let out = allocate(&host, &[a, vm("b", 9.0, "")], 0.0).unwrap();
    assert_eq!(cores(&out), ["3", "0-2"]);
}

#[test]
fn settings_the_host_cannot_serve_are_refused_with_the_numbers() {
    let host = set("0-1");
    let mut a = vm("a", 1.0, "");
    a.min_cores = 2;
    let mut b = vm("b", 1.0, "");
    b.min_cores = 1;
    let e = allocate(&host, &[a.clone(), b], 0.0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the VMs' min_cores add up to 3 but the host has 2 stage cores left for them (a=2, b=1)"
    );
    a.max_cores = 1;
    assert!(matches!(
        check(&host, &[a.clone()]),
        Err(AllocError::BadVm { .. })
    ));
    a.max_cores = 2;
    a.weight = 0.0;
    assert!(check(&host, &[a.clone()])
        .unwrap_err()
        .to_string()
        .contains("weight = 0"));
    a.weight = 1.0;
    a.fixed = Some(set("5"));
    assert!(check(&host, &[a.clone()])
        .unwrap_err()
        .to_string()
        .contains("not within"));
    let mut c = vm("c", 1.0, "");
    c.fixed = Some(set("1"));
    let mut d = vm("d", 1.0, "");
    d.fixed = Some(set("1"));
    assert!(check(&host, &[c, d])
        .unwrap_err()
        .to_string()
        .contains("meets another"));
}

#[test]
fn demand_is_work_cpu_and_one_more_core_when_saturated() {
    // Two vCPUs sharing one core, busy: they want a second core.
    assert_eq!(demand(0.99, 1, 2, None), 2.0);
    // Half of one core in use: that is the demand.
    assert!((demand(0.5, 2, 2, None) - 0.5).abs() < 1e-9);
    assert!((demand(0.5, 2, 2, Some(0.3)) - 0.5).abs() < 1e-9);
    // Saturated on both of two cores, two vCPUs: no more than two.
    assert_eq!(demand(1.95, 2, 2, None), 2.0);
    // On a core shared with a heavier VM it gets 0.6 of it, and its guest
    // never idles: saturated all the same.
    assert_eq!(demand(0.6, 1, 2, Some(0.97)), 2.0);
    assert!((demand(0.6, 1, 2, Some(0.5)) - 0.6).abs() < 1e-9);
    // Nonsense counts as nothing; never more than the vCPUs.
    assert_eq!(demand(f64::NAN, 1, 2, Some(f64::NAN)), 0.0);
    assert_eq!(demand(7.0, 0, 2, None), 2.0);
    assert_eq!(demand(-1.0, 1, 3, Some(-4.0)), 0.0);
}

proptest! {
    /// Over arbitrary demands, current sets and lenders: every VM gets a
    /// core, within its bounds when the pool allows; no core in two sets
    /// while the minimums leave a core for each VM, but for idle lenders'
    /// (which run on one shared core); every core of the pool used while
    /// someone wants it; and a second call on the result moves nothing
    /// (stable).
    #[test]
    fn allocations_are_valid_and_stable(
        ncores in 1usize..8,
        demands in prop::collection::vec((0.0f64..6.0, 1u8..4, 0usize..3, 1usize..6, any::<u8>(), any::<bool>()), 1..6),
        hysteresis in 0.0f64..1.0,
    ) {
        let host: CpuSet = {
            let mut s = CpuSet::new();
            (0..ncores).for_each(|c| s.insert(c));
            s
        };
        let vms: Vec<VmDemand> = demands
            .iter()
            .enumerate()
            .map(|(i, &(demand, weight, min, extra, cur, lend))| {
                let mut current = CpuSet::new();
                (0..ncores).filter(|c| cur & (1 << c) != 0).for_each(|c| current.insert(c));
                VmDemand {
                    name: format!("vm{i}"),
                    weight: f64::from(weight),
                    min_cores: min,
                    max_cores: min + extra,
                    fixed: None,
                    // A lender's demand is often idle.
                    demand: if lend && cur & 1 == 0 { demand / 60.0 } else { demand },
                    current,
                    owned: None,
                    lend_when_idle: lend,
                }
            })
            .collect();
        let Ok(out) = allocate(&host, &vms, hysteresis) else {
            let total: usize = vms.iter().map(|v| v.min_cores).sum();
            prop_assert!(total > ncores);
            return Ok(());
        };
        let exclusive = vms.iter().map(|v| v.min_cores.max(1)).sum::<usize>() <= ncores;
        for (vm, o) in vms.iter().zip(&out) {
            prop_assert!(!o.cores.is_empty());
            prop_assert!(o.cores.is_subset(&host));
            prop_assert!(o.cores.len() <= vm.max_cores.max(1));
            if exclusive {
                prop_assert!(o.cores.len() >= vm.min_cores);
                if o.owned.is_empty() {
                    // An idle lender, on one shared core.
                    prop_assert!(vm.lend_when_idle && vm.demand < RECLAIM_AT, "{vm:?} {o:?}");
                    prop_assert_eq!(o.cores.len(), 1);
                } else {
                    prop_assert_eq!(&o.owned, &o.cores);
                }
            }
        }
        if exclusive {
            let total: usize = out.iter().map(|o| o.owned.len()).sum();
            let mut union = CpuSet::new();
            out.iter().for_each(|o| o.owned.iter().for_each(|c| union.insert(c)));
            prop_assert_eq!(union.len(), total, "disjoint owned sets");
            // A core left out only when every VM is at its maximum or has
            // what it wants.
            if total < ncores {
                for (vm, o) in vms.iter().zip(&out) {
                    prop_assert!(o.owned.len() >= vm.max_cores || vm.demand <= o.owned.len() as f64);
                }
            }
        }
        let again: Vec<VmDemand> = vms
            .iter()
            .zip(&out)
            .map(|(v, o)| VmDemand { current: o.cores.clone(), owned: Some(o.owned.clone()), ..v.clone() })
            .collect();
        let out2 = allocate(&host, &again, hysteresis).unwrap();
        prop_assert_eq!(cores(&out2), cores(&out));
    }
}

#[test]
fn shared_vms_get_cpu_weights_in_proportion_the_heaviest_at_nice_0() {
    // Weight 8 and two of 1, 2 vCPUs each, all sharing: 200, 25, 25 (per
    // vCPU 100 and 12.5: nice 0 and 9).
    let w = cpu_weights(&[(8.0, 2, true), (1.0, 2, true), (1.0, 2, true)]);
    assert_eq!(w, vec![Some(200), Some(25), Some(25)]);
    // Per vCPU decides the top: a 4-vCPU VM of weight 2 is as heavy per
    // vCPU as a 2-vCPU VM of weight 1.
    let w = cpu_weights(&[(2.0, 4, true), (1.0, 2, true)]);
    assert_eq!(w, vec![Some(400), Some(200)]);
    // A VM with cores of its own is left alone; none shared, none set.
    let w = cpu_weights(&[(5.0, 2, false), (1.0, 2, true), (3.0, 2, true)]);
    assert_eq!(w, vec![None, Some(67), Some(200)]);
    assert_eq!(
        cpu_weights(&[(1.0, 2, false), (1.0, 2, false)]),
        vec![None, None]
    );
    // Sharers alike: the host's default split is the weighted one.
    assert_eq!(
        cpu_weights(&[(2.0, 2, true), (2.0, 2, true), (9.0, 4, false)]),
        vec![None, None, None]
    );
    // Extreme ratios stay in range.
    let w = cpu_weights(&[(1e6, 1, true), (1.0, 64, true)]);
    assert_eq!(w, vec![Some(100), Some(1)]);
    let w = cpu_weights(&[(1.0, 1, true), (1e6, 1000, true)]);
    assert_eq!(w, vec![Some(1), Some(10_000)]);
}
