//! End-to-end: every bad input gives a non-zero exit and a message naming
//! the bad value, never a panic.

mod common;

use common::*;
use hypercall_abi::platform::EXIT_VMM_ERROR;

fn expect_error(args: &[&str], needles: &[&str]) {
    let run = run(args);
    run.assert_no_panic();
    assert_eq!(run.code(), i32::from(EXIT_VMM_ERROR), "{run:#?}");
    for needle in needles {
        assert!(
            run.stderr.contains(needle),
            "stderr should name '{needle}': {}",
            run.stderr
        );
    }
    assert!(
        run.stdout.is_empty(),
        "no guest output expected: {}",
        run.stdout
    );
}

#[test]
fn missing_kernel() {
    expect_error(
        &["--kernel", "/nonexistent/vmlinux"],
        &["/nonexistent/vmlinux", "No such file"],
    );
}

#[test]
fn non_elf_kernel() {
    let path = std::env::temp_dir().join(format!("stagevm-not-elf-{}", std::process::id()));
    std::fs::write(&path, b"#!/bin/sh\necho this is not a kernel\n").unwrap();
    expect_error(
        &["--kernel", path.to_str().unwrap()],
        &[path.to_str().unwrap(), "not an ELF64"],
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn zero_vcpus() {
    let guest = guest_image();
    expect_error(
        &["--kernel", guest.to_str().unwrap(), "--cpus", "boot=0"],
        &["'0'", "at least 1 vCPU"],
    );
}

#[test]
fn too_many_vcpus() {
    let guest = guest_image();
    expect_error(
        &["--kernel", guest.to_str().unwrap(), "--cpus", "boot=100000"],
        &["boot=100000", "KVM_CAP_MAX_VCPUS"],
    );
}

#[test]
fn memory_too_small_for_the_image() {
    let guest = guest_image();
    expect_error(
        &["--kernel", guest.to_str().unwrap(), "--memory", "size=1M"],
        &["size=1M", "too small"],
    );
}

#[test]
fn memory_not_parseable() {
    let guest = guest_image();
    expect_error(
        &["--kernel", guest.to_str().unwrap(), "--memory", "size=lots"],
        &["'lots'", "memory size"],
    );
}

/// Runs stagevm in a private mount namespace where /dev is an empty tmpfs,
/// so /dev/kvm really is missing (util-linux `unshare`; needs root).
#[test]
fn kvm_device_missing() {
    let guest = guest_image();
    let script = format!(
        "mount -t tmpfs none /dev && exec {STAGEVM} --kernel {}",
        guest.display()
    );
    let child = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) is needed for this test");
    let run = wait(child, std::time::Duration::from_secs(30));
    run.assert_no_panic();
    assert_eq!(run.code(), i32::from(EXIT_VMM_ERROR), "{run:#?}");
    assert!(
        run.stderr.contains("cannot open /dev/kvm") && run.stderr.contains("No such file"),
        "{}",
        run.stderr
    );
}

/// Runs stagevm as user `nobody` (util-linux `setpriv`), who may not open the
/// root-only /dev/kvm.
#[test]
fn kvm_device_without_permission() {
    let guest = guest_image();
    let child = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            STAGEVM,
            "--kernel",
            guest.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux) is needed for this test");
    let run = wait(child, std::time::Duration::from_secs(30));
    run.assert_no_panic();
    assert_eq!(run.code(), i32::from(EXIT_VMM_ERROR), "{run:#?}");
    assert!(
        run.stderr.contains("cannot open /dev/kvm") && run.stderr.contains("Permission denied"),
        "{}",
        run.stderr
    );
}
