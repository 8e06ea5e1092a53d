use host_sched::config::{BudgetsUpdate, Config, HostSection, Overrides};
use host_sched::cpuset::CpuSet;
use host_sched::topology::Topology;
use host_sched::vm::Setup;

use super::*;

fn controller() -> Controller {
    let cpus = CpuSet::parse("0-1").unwrap();
    let topology = Topology {
        allowed: cpus.clone(),
        online: cpus,
        isolated: CpuSet::new(),
    };
    let config = Config::from_toml("[host]\ncores = \"0-1\"\n", "test").unwrap();
    let setup = Setup::new(config, &Overrides::default(), topology).unwrap();
    Controller::new(&setup, 2, 0)
}

fn budgets(cores: &str, cpu_weight: Option<u32>) -> Change {
    Change::Budgets(BudgetsUpdate {
        host: HostSection {
            cores: Some(cores.into()),
            housekeeping: None,
            cpu_weight,
        },
        stages: None,
    })
}

#[test]
fn a_cpu_weight_alone_keeps_the_policy_and_any_other_change_rebuilds_it() {
    let mut c = controller();
    // The weight alone: applied without a new policy.
    c.propose(&budgets("0-1", Some(50))).unwrap();
    assert!(!c.pending.as_ref().unwrap().replans);
    assert!(c.apply_pending().unwrap().starts_with("applied: budgets"));
    assert_eq!(c.vm().resolved.cpu_weight, Some(50));
    // Taken back: still only the weight.
    c.propose(&budgets("0-1", None)).unwrap();
    assert!(!c.pending.as_ref().unwrap().replans);
    c.apply_pending();
    assert_eq!(c.vm().resolved.cpu_weight, None);
    // The cores too: a new policy.
    c.propose(&budgets("1", Some(50))).unwrap();
    assert!(c.pending.as_ref().unwrap().replans);
    c.apply_pending();
    assert_eq!(c.vm().resolved.stage_cores.to_string(), "1");
    // A weight after a pending core change still rebuilds (the pending
    // changes are applied together).
    c.propose(&budgets("0-1", Some(50))).unwrap();
    c.propose(&budgets("0-1", Some(70))).unwrap();
    assert!(c.pending.as_ref().unwrap().replans);
}
