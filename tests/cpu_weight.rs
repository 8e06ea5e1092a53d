//! End-to-end: `host.cpu_weight` (the VM's CPU weight on cores it shares
//! with other VMs, as `stagevm-hostd` gives it) applied to the vCPU
//! threads' nice (never to a cgroup: the VMM opens none), read back from
//! /proc and the group's own file, and taken back.

mod common;
#[path = "api/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use harness::*;
use stagevm_testkit::api::Api;
use stagevm_testkit::machine::vcpu_nice;

const BUDGETS: &str = "/api/v1/stages.budgets";
const WEIGHT: &str = "/api/v1/stages.cpu_weight";
/// The capability's bit (linux/capability.h).
const CAP_SYS_NICE: u32 = 23;

/// Polls `check` for at most 3 s (a few policy periods of 100 ms).
fn soon(what: &str, check: impl FnMut() -> Result<(), String>) {
    stagevm_testkit::machine::until(Duration::from_secs(3), what, check);
}

#[test]
fn a_vm_among_others_in_its_group_weighs_through_its_vcpu_threads_nice() {
    let vm = Vm::boot("iters=1000 threads=2 requests=100 work=100");
    let pid = vm.pid();
    soon("two vCPU threads at nice 0", || {
        let n = vcpu_nice(pid);
        (n == [0, 0]).then_some(()).ok_or(format!("{n:?}"))
    });
    // Out of range: refused, naming the key, nothing changed.
    let a = vm.api.request("PUT", WEIGHT, br#"{"weight":0}"#).unwrap();
    let text = String::from_utf8_lossy(&a.body).into_owned();
    assert_eq!(a.status, 400, "{text}");
    assert!(text.contains("host.cpu_weight = 0"), "{text}");
    // Not a budget: a budgets update naming it is refused, saying what
    // sets it.
    let a = vm
        .api
        .request(
            "PUT",
            BUDGETS,
            br#"{"host":{"cores":"0-1","cpu_weight":25}}"#,
        )
        .unwrap();
    let text = String::from_utf8_lossy(&a.body).into_owned();
    assert_eq!(a.status, 400, "{text}");
    assert!(
        text.contains(
            "host.cpu_weight: not part of a budgets update; PUT /api/v1/stages.cpu_weight sets it"
        ),
        "{text}"
    );
    // 25 for 2 vCPUs: 12.5 per thread, nice 9 (CFS weight 137 of 1024).
    vm.put(WEIGHT, r#"{"weight":25}"#);
    soon("nice 9 on both vCPU threads", || {
        let n = vcpu_nice(pid);
        (n == [9, 9]).then_some(()).ok_or(format!("{n:?}"))
    });
    let w = vm
        .stages()
        .sched
        .cpu_weight
        .expect("the report's cpu_weight");
    assert_eq!((w.weight, w.by.as_str()), (Some(25), "vCPU threads' nice"));
    assert!(vm.stages().sched.vcpus.iter().all(|t| t.nice == Some(9)));
    // A budgets update keeps it.
    vm.put(BUDGETS, r#"{"host":{"cores":"0-1"}}"#);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(vcpu_nice(pid), [9, 9]);
    assert_eq!(vm.stages().sched.cpu_weight.unwrap().weight, Some(25));
    // Taken back: the nice found before.
    vm.put(WEIGHT, r#"{"weight":null}"#);
    soon("nice 0 again", || {
        let n = vcpu_nice(pid);
        (n == [0, 0]).then_some(()).ok_or(format!("{n:?}"))
    });
    assert_eq!(vm.stages().sched.cpu_weight.unwrap().weight, None);
}

/// A cgroup v1 `cpu` group made for the test (removed when dropped, its
/// processes moved back to the root group first).
struct Group(PathBuf);

impl Drop for Group {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            let root = self.0.parent().unwrap().join("cgroup.procs");
            for p in procs.lines() {
                let _ = std::fs::write(&root, p);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A VMM started alone in a cgroup of its own (as a systemd unit's)
/// opens no group file (issue 50, S2): its group's weight is
/// `stagevm-hostd`'s to set (hostd/tests/weight.rs), and a weight sent to
/// the VMM goes to its vCPU threads' nice while the group's `cpu.shares`
/// stays. Before, the VMM held the group's `cpu.shares` open for writing
/// for its whole life and wrote the weight there.
#[test]
fn a_vm_alone_in_its_cgroup_opens_no_group_file_and_weighs_through_its_threads() {
    let root = Path::new("/sys/fs/cgroup/cpu");
    if !root.join("cpu.shares").exists() {
        eprintln!("skipped: no cgroup v1 cpu hierarchy at {}", root.display());
        return;
    }
    let dir = root.join(format!("stagevm-test-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&dir) {
        eprintln!("skipped: cannot make {} ({e})", dir.display());
        return;
    }
    let group = Group(dir);
    let _lock = vm_lock();
    let socket = stagevm_testkit::temp_path("cpu-weight", "sock");
    // The shell joins the group, then becomes the VMM.
    let join = format!(
        "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
        group.0.display()
    );
    let vm = stagevm()
        .kernel(guest_image())
        .vcpus(2)
        .memory("128M")
        .api_socket(&socket)
        .cmdline("iters=1000 threads=2 requests=100 work=100 hold=1")
        .wrap("sh", ["-c", join.as_str()])
        .spawn()
        .expect("start stagevm");
    let api = Api::wait_ready(&socket, Duration::from_secs(10)).unwrap();
    let pid = vm.vmm_pid().as_raw() as u32;
    let procs = std::fs::read_to_string(group.0.join("cgroup.procs")).unwrap();
    assert_eq!(procs.trim(), pid.to_string(), "the VMM alone in the group");
    let shares = || {
        std::fs::read_to_string(group.0.join("cpu.shares"))
            .unwrap()
            .trim()
            .to_string()
    };
    let group_files = || -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|l| l.display().to_string())
            .filter(|l| l.contains("/sys/fs/cgroup") || l.contains("autogroup"))
            .collect()
    };
    assert_eq!(group_files(), Vec::<String>::new());
    api.put(WEIGHT, br#"{"weight":25}"#).unwrap();
    soon("nice 9 on both vCPU threads", || {
        let n = vcpu_nice(pid);
        (n == [9, 9]).then_some(()).ok_or(format!("{n:?}"))
    });
    let v: stagevm_report::api::StagesView = api.get_json("/api/v1/stages?timeline=0").unwrap();
    let w = v.sched.cpu_weight.expect("the report's cpu_weight");
    assert_eq!(
        (w.weight, w.by.as_str(), w.group_value),
        (Some(25), "vCPU threads' nice", None)
    );
    assert_eq!(
        shares(),
        "1024",
        "the group's weight is not the VMM's to set"
    );
    assert_eq!(group_files(), Vec::<String>::new());
    drop(vm);
    drop(group);
}

/// Without `CAP_SYS_NICE` (dropped from the bounding set by `setpriv`, so
/// root has it no more): a raised nice needs no privilege, and lowering it
/// again works only within the `RLIMIT_NICE` the supervisor gives (`prlimit`
/// here, `LimitNICE=+0` in `stagevm@.service`). With that limit the weight
/// taken back brings both vCPU threads to nice 0; without it they stay at
/// nice 9, and the report says so — the weight in force and why — instead
/// of "no weight".
#[test]
fn unprivileged_weights_come_back_to_nice_0_within_the_supervisors_limit() {
    // Raising RLIMIT_NICE needs CAP_SYS_RESOURCE, which this sandbox may not give root.
    let can_limit = std::process::Command::new("prlimit")
        .args(["--nice=20", "true"])
        .status()
        .is_ok_and(|s| s.success());
    for limit in [true, false] {
        if limit && !can_limit {
            eprintln!(
                "skipped: the half with RLIMIT_NICE 20 (prlimit cannot raise it here: no CAP_SYS_RESOURCE)"
            );
            continue;
        }
        let mut wrapper = vec!["setpriv", "--bounding-set=-sys_nice", "--"];
        if limit {
            wrapper.splice(0..0, ["prlimit", "--nice=20"]);
        }
        let vm = Vm::boot_wrapped("iters=1000 threads=2 requests=100 work=100", &wrapper);
        let pid = vm.pid();
        let caps = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let eff = caps
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
            .unwrap();
        assert_eq!(
            eff & (1 << CAP_SYS_NICE),
            0,
            "CAP_SYS_NICE still in {eff:#x}"
        );
        vm.put(WEIGHT, r#"{"weight":25}"#);
        soon("nice 9 on both vCPU threads", || {
            let n = vcpu_nice(pid);
            (n == [9, 9]).then_some(()).ok_or(format!("{n:?}"))
        });
        vm.put(WEIGHT, "{}");
        let want = if limit { [0, 0] } else { [9, 9] };
        soon("the weight taken back", || {
            let w = vm.stages().sched.cpu_weight.unwrap();
            (w.weight.is_none()).then_some(()).ok_or(format!("{w:?}"))
        });
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(vcpu_nice(pid), want, "limit {limit}");
        let w = vm.stages().sched.cpu_weight.unwrap();
        eprintln!("limit {limit}: {w:?}");
        if limit {
            assert_eq!((w.in_force, w.error.as_deref()), (Some(200), None));
        } else {
            // 2 threads at nice 9: 2 × 137 × 100 ÷ 1024.
            assert_eq!(w.in_force, Some(26), "{w:?}");
            let e = w.error.unwrap_or_default();
            assert!(e.contains("nice 0") && e.contains("LimitNICE"), "{e}");
        }
    }
}
