//! The example VMM, a second embedder of the stage device, boots the
//! staged test guest: the device's per-stage counts equal the guest's own.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stagevm_testkit::console::{line, numbers};
use stagevm_testkit::machine::{test_guest, vm_lock};

#[test]
fn the_example_vmm_boots_the_test_guest_staged_and_counts_what_it_reports() {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        eprintln!("skipped: /dev/kvm cannot be opened here");
        return;
    }
    let guest = test_guest();
    let _vm = vm_lock();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stage-vmm"))
        .arg(guest)
        .args([
            "--vcpus",
            "2",
            "--cmdline",
            "iters=1000 threads=3 requests=200",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start stage-vmm");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    // The guest's own counts: 2 vCPUs × 3 threads × 200 requests pass
    // each of parse, plan and execute once.
    let guest_line = line(&stdout, "testguest: stage events ").expect("the guest's counts");
    let guest_counts = &numbers(guest_line)[..3];
    assert_eq!(guest_counts, [1200, 1200, 1200], "{guest_line}");
    // The stage device's, through the example's doorbell ports.
    let device: Vec<(String, u64)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("stage-vmm: stage "))
        .filter_map(|l| {
            let (name, n) = l.split_once(" events ")?;
            Some((name.to_string(), n.trim().parse().ok()?))
        })
        .collect();
    let names: Vec<&str> = device.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["parse", "plan", "execute"], "{stdout}");
    let counts: Vec<u64> = device.iter().map(|d| d.1).collect();
    assert_eq!(counts, guest_counts, "per-stage events, device vs guest");
    // One registration, planned for (a map published), and the guest's
    // own exit code.
    let last = line(&stdout, "stage-vmm: registrations ").expect("the summary");
    let n = numbers(last);
    assert_eq!(n[0], 1, "{last}");
    assert!(n[1] >= 1, "no map change: {last}");
    assert_eq!(n[2], 0, "{last}");
}
