//! End-to-end: host-sched pins vCPU threads and helper threads; the masks are
//! read back from /proc/<pid>/task/<tid>/status while the guest runs and
//! compared with masks written here by hand.

mod common;

use std::collections::BTreeMap;

use common::*;

/// Whether `seen` matches: the vCPU threads and the named helpers exactly as
/// `expected`, and every other thread (e.g. KVM's `kvm-nx-lpage-recovery`
/// worker) on the housekeeping mask `hk`.
fn matches(
    seen: &BTreeMap<String, Vec<String>>,
    expected: &BTreeMap<String, Vec<String>>,
    hk: &str,
) -> bool {
    expected.iter().all(|(k, v)| seen.get(k) == Some(v))
        && seen
            .iter()
            .filter(|(k, _)| !expected.contains_key(*k))
            .all(|(_, v)| v.iter().all(|m| m == hk))
}

/// Boots the guest with `config` and 4 vCPUs on a long first phase, waits
/// until the threads match (or 10 s), kills it and returns the last
/// observation.
fn observe(
    config: &str,
    expected: &BTreeMap<String, Vec<String>>,
    hk: &str,
) -> BTreeMap<String, Vec<String>> {
    let guest = guest_image();
    let _lock = vm_lock();
    let path = std::env::temp_dir().join(format!("stagevm-pin-{}.toml", std::process::id()));
    std::fs::write(&path, config).unwrap();
    let child = spawn(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cpus",
        "boot=4",
        "--stages",
        path.to_str().unwrap(),
        "--cmdline",
        "iters=100000000000",
    ]);
    let seen = watch_threads(child, |seen| matches(seen, expected, hk));
    let _ = std::fs::remove_file(&path);
    seen
}

/// The expected masks: vCPU `v` on `vcpus[v]`, and the VMM's own helper
/// threads on `helpers`: the main thread (`stagevm` in /proc, `vmm-main` in
/// the report; it also reads the signalfd, so there is no signal thread) and
/// `stage-sched`.
fn expect(vcpus: &[&str], helpers: &str) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = vcpus
        .iter()
        .enumerate()
        .map(|(v, mask)| (format!("vcpu{v}"), vec![mask.to_string()]))
        .collect();
    for name in ["stagevm", "stage-sched"] {
        map.insert(name.into(), vec![helpers.into()]);
    }
    map
}

#[test]
fn static_config_pins_vcpus_to_their_stage_cores() {
    // Three stages on cores 0-1 with equal weights: parse gets core 0, plan
    // and execute core 1 (plan rides on the victim core, seed 000 §4.5).
    // vCPU v runs on core v mod 2. No housekeeping core is left, so helpers
    // share the stage cores.
    let config = "[host]\ncores = \"0-1\"\n[policy]\nname = \"static\"\n\
                  [[stage]]\nname = \"parse\"\n[[stage]]\nname = \"plan\"\n[[stage]]\nname = \"execute\"\n";
    let expected = expect(&["0", "1", "0", "1"], "0-1");
    let seen = observe(config, &expected, "0-1");
    assert!(matches(&seen, &expected, "0-1"), "{seen:?}");
}

#[test]
fn helpers_stay_off_the_stage_core() {
    // One stage core (1) and one housekeeping core (0): every vCPU on 1,
    // every helper thread on 0, none on the stage core.
    let config = "[host]\ncores = \"1\"\nhousekeeping = \"0\"\n[policy]\nname = \"static\"\n";
    let expected = expect(&["1", "1", "1", "1"], "0");
    let seen = observe(config, &expected, "0");
    assert!(matches(&seen, &expected, "0"), "{seen:?}");
    for (name, lists) in &seen {
        if !name.starts_with("vcpu") {
            assert!(lists.iter().all(|l| l == "0"), "helper {name} on {lists:?}");
        }
    }
}

#[test]
fn off_lets_vcpus_float_and_pinned_pins_them() {
    let off = expect(&["0-1", "0-1", "0-1", "0-1"], "0-1");
    let seen = observe(
        "[host]\ncores = \"0-1\"\n[policy]\nname = \"off\"\n",
        &off,
        "0-1",
    );
    assert!(matches(&seen, &off, "0-1"), "{seen:?}");
    let pinned = expect(&["0", "1", "0", "1"], "0-1");
    let seen = observe(
        "[host]\ncores = \"0-1\"\n[policy]\nname = \"pinned\"\n",
        &pinned,
        "0-1",
    );
    assert!(matches(&seen, &pinned, "0-1"), "{seen:?}");
}
