//! End-to-end: `host.cpu_weight` (the VM's CPU weight on cores it shares
//! with other VMs, as `stagevm-hostd` gives it) applied to the vCPU
//! threads' nice, read back from /proc and taken back; a VMM alone in a
//! cgroup of its own says that the group's weight decides instead.

mod common;
#[path = "api/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::*;

const BUDGETS: &str = "/api/v1/stages.budgets";

/// The nice level of each of VMM `pid`'s vCPU threads (`/proc/…/stat`
/// field 19).
fn vcpu_nice(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("vcpu") {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        if let Some((_, after)) = stat.rsplit_once(')') {
            out.push(after.split_whitespace().nth(16).unwrap().parse().unwrap());
        }
    }
    out
}

/// Polls `check` for at most 3 s (a few policy periods of 100 ms).
fn soon(what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
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
    let a = vm
        .api
        .request(
            "PUT",
            BUDGETS,
            br#"{"host":{"cores":"0-1","cpu_weight":0}}"#,
        )
        .unwrap();
    let text = String::from_utf8_lossy(&a.body).into_owned();
    assert_eq!(a.status, 400, "{text}");
    assert!(text.contains("host.cpu_weight = 0"), "{text}");
    // 25 for 2 vCPUs: 12.5 per thread, nice 9 (CFS weight 137 of 1024).
    vm.put(BUDGETS, r#"{"host":{"cores":"0-1","cpu_weight":25}}"#);
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
    // Taken back: the nice found before.
    vm.put(BUDGETS, r#"{"host":{"cores":"0-1"}}"#);
    soon("nice 0 again", || {
        let n = vcpu_nice(pid);
        (n == [0, 0]).then_some(()).ok_or(format!("{n:?}"))
    });
    assert_eq!(vm.stages().sched.cpu_weight.unwrap().weight, None);
}

/// A cgroup v1 `cpu` group made for the test (removed when dropped, the
/// VMM moved back to the root group first).
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

/// A VMM alone in a cgroup of its own (a systemd unit's) competes by the
/// group's weight, which it does not change: its report says which group
/// decides.
#[test]
fn a_vm_alone_in_its_cgroup_is_weighed_by_the_group_and_says_so() {
    let root = Path::new("/sys/fs/cgroup/cpu");
    if !root.join("cpu.shares").exists() {
        eprintln!("skipped: no cgroup v1 cpu hierarchy at {}", root.display());
        return;
    }
    let vm = Vm::boot("iters=1000 threads=2 requests=100 work=100");
    let pid = vm.pid();
    let dir = root.join(format!("stagevm-test-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&dir) {
        eprintln!("skipped: cannot make {} ({e})", dir.display());
        return;
    }
    let group = Group(dir);
    std::fs::write(group.0.join("cgroup.procs"), pid.to_string()).unwrap();
    let shares = || {
        std::fs::read_to_string(group.0.join("cpu.shares"))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(shares(), "1024");
    // The group decides; the VMM says so and changes nothing (its threads'
    // seccomp filters open no file for writing).
    vm.put(BUDGETS, r#"{"host":{"cores":"0-1","cpu_weight":50}}"#);
    soon("the report names the group", || {
        let w = vm.stages().sched.cpu_weight;
        let ok = w.as_ref().is_some_and(|w| {
            w.weight == Some(50)
                && w.by == format!("cgroup v1 {}/cpu.shares", group.0.display())
                && w.error.as_ref().is_some_and(|e| e.contains("CPUWeight="))
        });
        ok.then_some(()).ok_or(format!("{w:?}"))
    });
    assert_eq!(shares(), "1024");
    assert_eq!(vcpu_nice(pid), vec![0, 0]);
    drop(vm);
    drop(group);
}
