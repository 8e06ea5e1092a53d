//! End-to-end: the host daemon moving a VM's stage cores keeps the VM's
//! policy and what `auto` learnt (issue 50, S5): to as many other cores at
//! any time, to another number of them while `auto` holds a mode. A
//! neighbour whose demand swings may move this VM's cores at every hold,
//! and `auto` must not start over at each move.

mod common;
#[path = "api/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const BUDGETS: &str = "/api/v1/stages.budgets";

/// Gives `vm` the stage cores `cores` as the daemon does and waits (at
/// most 3 s) until it runs on them with `kept` moves counted as keeping
/// its policy — its vCPU threads read back on exactly `cores` too, when
/// `pinned` (one vCPU per core there).
fn move_to(vm: &Vm, cores: &str, kept: u64, pinned: bool) {
    vm.put(BUDGETS, &format!(r#"{{"host":{{"cores":"{cores}"}}}}"#));
    let t = std::time::Instant::now();
    loop {
        let v = vm.stages();
        let moved = v.sched.stage_cores == cores
            && v.sched.policy_kept == kept
            && (!pinned || v.sched.vcpus.iter().all(|t| t.affinity == cores));
        if moved {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "to {cores}: {:?}",
            v.sched
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An `auto` VM on one stage core, moved between the two cores of this
/// machine six times as the daemon would (`[host] cores` only): each move
/// re-pins the vCPU threads to the new core, and the policy is the same
/// object throughout — its period count only grows (a rebuilt policy
/// starts at 0, as it did before the fix), its trials are not started
/// over, and the report counts every move as `policy_kept`.
#[test]
fn moving_a_vm_to_as_many_other_cores_keeps_autos_state() {
    let config = "[host]\ncores = \"0\"\n[policy]\nname = \"auto\"\nperiod_ms = 100\n";
    let vm = Vm::boot_config(
        config,
        "iters=1000 threads=4 requests=1000000000 work=200",
        &[],
    );
    let auto = |vm: &Vm| vm.stages().sched.auto.expect("auto's figures");
    // The guest registered and auto planned a few periods.
    let t0 = std::time::Instant::now();
    while vm.stages().sched.auto.is_none_or(|a| a.periods < 5) {
        assert!(t0.elapsed() < Duration::from_secs(10), "auto never planned");
        std::thread::sleep(Duration::from_millis(50));
    }
    let first = auto(&vm);
    let mut last = first.periods;
    for (i, core) in ["1", "0", "1", "0", "1", "0"].into_iter().enumerate() {
        move_to(&vm, core, i as u64 + 1, true);
        std::thread::sleep(Duration::from_millis(3 * PERIOD_MS));
        let now = auto(&vm);
        assert!(
            now.periods > last,
            "move {i}: auto's periods went from {last} to {} (a new policy)",
            now.periods
        );
        assert!(now.trials >= first.trials, "{now:?}");
        last = now.periods;
    }
    let end = auto(&vm);
    // Six moves, no trial started for them (its own hold-overs aside, at
    // most one per ~second of holding).
    assert!(
        end.trials <= first.trials + 2,
        "trials {} -> {}",
        first.trials,
        end.trials
    );

    // Another number of cores while auto holds a mode (its first trial
    // over): the same policy plans for them (`retarget`), its mode and
    // periods kept.
    let t0 = std::time::Instant::now();
    while auto(&vm).last_trial.is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "auto never decided");
        std::thread::sleep(Duration::from_millis(50));
    }
    let holding = auto(&vm);
    let mut last = holding.periods;
    for (i, cores) in ["0-1", "1", "0-1"].into_iter().enumerate() {
        let kept = vm.stages().sched.policy_kept;
        move_to(&vm, cores, kept + 1, false);
        std::thread::sleep(Duration::from_millis(3 * PERIOD_MS));
        let now = auto(&vm);
        assert!(
            now.periods > last && now.trials == holding.trials,
            "count change {i} (to {cores}): periods {last} -> {}, trials {} -> {}",
            now.periods,
            holding.trials,
            now.trials
        );
        last = now.periods;
    }
}
