//! The mechanism's costs measured in process (`stagevm_preload::costs`,
//! what `stagevm-discover` gives the model): real detours on the probes,
//! the real gate on one lane. Behaviour only (the figures themselves are
//! `just bench-native-server`'s): the gate handed off, every figure is a
//! number, the gate is left off with no thread bound, this thread's CPU
//! mask is its own again (read from /proc), and a second measurement in
//! the same process is refused.

use std::sync::atomic::Ordering::Relaxed;

use stagevm_preload::control::mode;
use stagevm_preload::costs::{measure, CostError};

fn my_cpus() -> String {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn costs_are_measured_with_the_real_gate_and_leave_it_off() {
    let mask = my_cpus();
    let cpu = stagevm_preload::costs::default_cpu().unwrap();
    let k = measure(cpu, 2, 200_000).unwrap();
    eprintln!("{k:?}");
    assert_eq!((k.cpu, k.rounds), (cpu, 2));
    assert!(k.handoffs > 0);
    for f in [k.call, k.point_off, k.point_on, k.handoff] {
        assert!(f.median_ns.is_finite() && f.spread_ns >= 0.0, "{k:?}");
    }
    // A stage point through the gate does more than a call.
    assert!(
        k.point_on.median_ns > 0.0 && k.handoff.median_ns > 0.0,
        "{k:?}"
    );
    let c = stagevm_preload::gate::control().unwrap();
    assert_eq!(c.mode(), mode::OFF);
    assert_eq!(c.lanes[0].threads.load(Relaxed), 0, "a thread left bound");
    assert_eq!(my_cpus(), mask, "this thread's mask was not given back");
    assert!(matches!(measure(cpu, 1, 1000), Err(CostError::InUse)));
}
