//! End-to-end: every VMM thread runs under its seccomp filter (issue 14),
//! and a syscall outside a thread's filter ends the VMM with status 2 and a
//! message naming the thread kind and the syscall. The debug build's
//! `STAGEVM_TEST_SYSCALL` hook makes the named thread call `getppid`.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use hypercall_abi::platform::EXIT_GUEST_FAILURE;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn stagevm(extra_env: Option<(&str, &str)>, args: &[&str]) -> std::process::Child {
    let guest = guest_image();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stagevm"));
    cmd.args(["--kernel", guest.to_str().unwrap()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some((k, v)) = extra_env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

#[test]
fn every_thread_runs_under_a_seccomp_filter() {
    let _lock = vm_lock();
    let disk = std::env::temp_dir().join(format!("stagevm-seccomp-{}.img", std::process::id()));
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let disk_arg = format!("path={},readonly=on", disk.display());
    let socket = report_path("seccomp-api").with_extension("sock");
    let mut child = stagevm(
        None,
        &[
            "--cpus",
            "boot=2",
            "--api-socket",
            socket.to_str().unwrap(),
            "--disk",
            &disk_arg,
            "--cmdline",
            "iters=1000000000000",
        ],
    );
    // Wait for the banner: every thread has started and filtered itself.
    let mut stdout = child.stdout.take().unwrap();
    let mut byte = [0u8];
    while byte[0] != b'\n' {
        assert_eq!(stdout.read(&mut byte).unwrap(), 1, "stagevm closed stdout");
    }
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id();
    let mut seen = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        let mode = status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .map(str::trim)
            .unwrap_or("?")
            .to_string();
        seen.push((comm.trim().to_string(), mode));
    }
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).unwrap();
    let run = wait(child, Duration::from_secs(10));
    let _ = std::fs::remove_file(&disk);
    assert_eq!(run.code(), 143, "{run:#?}");
    for kind in ["vcpu0", "vcpu1", "stage-sched", "io-blk0", "api"] {
        assert!(
            seen.iter().any(|(c, _)| c == kind),
            "{kind} missing: {seen:?}"
        );
    }
    assert!(
        seen.iter().all(|(_, mode)| mode == "2"),
        "a thread without a filter: {seen:?}"
    );
}

fn forbidden_syscall_in(kind: &str, args: &[&str]) {
    let _lock = vm_lock();
    let child = stagevm(Some(("STAGEVM_TEST_SYSCALL", kind)), args);
    let run = wait(child, Duration::from_secs(10));
    assert_eq!(run.code(), i32::from(EXIT_GUEST_FAILURE), "{run:#?}");
    let expected = format!("seccomp: thread {kind} made forbidden syscall 0000000110");
    assert!(run.stderr.contains(&expected), "{run:#?}");
}

#[test]
fn a_forbidden_syscall_ends_the_vmm_with_a_message() {
    let long = ["--cpus", "boot=2", "--cmdline", "iters=1000000000000"];
    forbidden_syscall_in("vcpu", &long);
    forbidden_syscall_in("stage-sched", &long);
    forbidden_syscall_in("vmm-main", &long);
    let socket = report_path("seccomp-api").with_extension("sock");
    let api = [&long[..], &["--api-socket", socket.to_str().unwrap()]].concat();
    forbidden_syscall_in("api", &api);
}

#[test]
fn openat_in_the_api_thread_fails_and_the_vm_goes_on() {
    let _lock = vm_lock();
    let socket = report_path("seccomp-openat").with_extension("sock");
    let child = stagevm(
        Some(("STAGEVM_TEST_SYSCALL", "api-openat")),
        &[
            "--api-socket",
            socket.to_str().unwrap(),
            "--cmdline",
            "iters=50000000 requests=100",
        ],
    );
    let run = wait(child, Duration::from_secs(10));
    assert_eq!(run.code(), 0, "{run:#?}");
    assert!(
        run.stderr.contains("openat in api: Permission denied"),
        "{run:#?}"
    );
}

#[test]
fn seccomp_false_installs_no_filter() {
    let _lock = vm_lock();
    let child = stagevm(
        Some(("STAGEVM_TEST_SYSCALL", "vcpu")),
        &["--seccomp", "false", "--cmdline", "iters=1000 requests=0"],
    );
    let run = wait(child, Duration::from_secs(10));
    assert_eq!(run.code(), 0, "{run:#?}");
}
