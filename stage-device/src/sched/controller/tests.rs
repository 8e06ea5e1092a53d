use host_sched::config::{BudgetsUpdate, CpuWeightUpdate, HostSection};
use host_sched::cpuset::CpuSet;

use super::*;

fn controller() -> Controller {
    controller_on("0-1", "0-1")
}

/// A 2-vCPU controller on a host of CPUs `cpus` with stage cores `cores`.
fn controller_on(cpus: &str, cores: &str) -> Controller {
    let text = format!("[host]\ncores = \"{cores}\"\n[policy]\nname = \"static\"\n");
    Controller::new(&crate::sched::test_setup(cpus, &text), 2, 0)
}

fn budgets(cores: &str) -> Change {
    Change::Budgets(BudgetsUpdate {
        host: HostSection {
            cores: Some(cores.into()),
            ..HostSection::default()
        },
        stages: None,
    })
}

fn weight(weight: Option<u32>) -> Change {
    Change::CpuWeight(CpuWeightUpdate { weight })
}

#[test]
fn a_cpu_weight_is_its_own_change_that_keeps_the_policy() {
    let mut c = controller();
    // The weight: applied without a new policy.
    c.propose(&weight(Some(50))).unwrap();
    assert!(!c.pending.as_ref().unwrap().replans);
    assert!(c
        .apply_pending()
        .unwrap()
        .starts_with("applied: cpu_weight 50"));
    assert_eq!(c.vm().resolved.cpu_weight, Some(50));
    // A budgets update keeps it, and one naming it is refused.
    c.propose(&budgets("1")).unwrap();
    assert!(c.pending.as_ref().unwrap().replans);
    c.apply_pending();
    assert_eq!(c.vm().resolved.stage_cores.to_string(), "1");
    assert_eq!(c.vm().resolved.cpu_weight, Some(50));
    let mut named = BudgetsUpdate::default();
    named.host.cpu_weight = Some(70);
    let e = c.propose(&Change::Budgets(named)).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("host.cpu_weight: not part of a budgets update"),
        "{e}"
    );
    assert!(c.pending.is_none());
    // Out of range: refused as in a file.
    let e = c.propose(&weight(Some(0))).unwrap_err();
    assert!(e.to_string().starts_with("host.cpu_weight = 0"), "{e}");
    // Taken back: still only the weight.
    c.propose(&weight(None)).unwrap();
    assert!(!c.pending.as_ref().unwrap().replans);
    c.apply_pending();
    assert_eq!(c.vm().resolved.cpu_weight, None);
    // A weight after a pending core change still rebuilds (the pending
    // changes are applied together).
    c.propose(&budgets("0-1")).unwrap();
    c.propose(&weight(Some(70))).unwrap();
    assert!(c.pending.as_ref().unwrap().replans);
}

/// Issue 50, S5: the host daemon moving the VM to as many other cores
/// keeps its policy (and what `auto` learnt); only the plans' cores are
/// renamed. Another number of cores rebuilds it.
#[test]
fn a_move_to_as_many_cores_keeps_the_policy_and_renames_its_cores() {
    let mut c = controller_on("0-3", "0-1");
    let cores_of = |c: &Controller| {
        c.plan()
            .vcpu_cores
            .iter()
            .flat_map(|s| s.iter())
            .collect::<CpuSet>()
            .to_string()
    };
    assert_eq!(cores_of(&c), "0-1");
    c.propose(&budgets("2-3")).unwrap();
    let p = c.pending.as_ref().unwrap();
    assert!(p.replans && p.host_only);
    assert!(c.apply_pending().unwrap().ends_with("(policy kept)"));
    assert_eq!((cores_of(&c), c.policy_kept()), ("2-3".into(), 1));
    // Twice: the renaming composes.
    c.propose(&budgets("1,3")).unwrap();
    c.apply_pending();
    assert_eq!((cores_of(&c), c.policy_kept()), ("1,3".into(), 2));
    // One core: rebuilt, for the core it has.
    c.propose(&budgets("3")).unwrap();
    assert!(!c.apply_pending().unwrap().contains("policy kept"));
    assert_eq!((cores_of(&c), c.policy_kept()), ("3".into(), 2));
    assert!(c.relabel.is_identity());
}
