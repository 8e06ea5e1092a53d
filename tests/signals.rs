//! End-to-end: SIGTERM and SIGINT stop a running guest promptly with the
//! documented exit codes.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::*;
use hypercall_abi::platform::{EXIT_SIGINT, EXIT_SIGTERM};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Boots a guest that runs for minutes with `extra` arguments, sends
/// `signal` once its vCPUs run guest code, and checks that stagevm exits
/// with `expected` within `bound`; returns its run.
fn stop_with(signal: Signal, expected: u8, extra: &[&str], bound: Duration) -> Run {
    let guest = guest_image();
    let _lock = vm_lock();
    // ~1e12 iterations: minutes of work, so only the signal can end it.
    let mut args = vec![
        "--kernel",
        guest.to_str().unwrap(),
        "--cpus",
        "boot=4",
        "--cmdline",
        "iters=1000000000000",
    ];
    args.extend_from_slice(extra);
    let mut child = spawn(&args);
    // Wait for the guest's banner so the vCPUs are running guest code.
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8];
    while !seen.ends_with(b"\n") {
        assert_eq!(stdout.read(&mut byte).unwrap(), 1, "stagevm closed stdout");
        seen.push(byte[0]);
    }
    assert!(seen.starts_with(b"stagevm testguest: 4 vCPUs"));
    std::thread::sleep(Duration::from_millis(200));
    let sent = Instant::now();
    kill(Pid::from_raw(child.id() as i32), signal).unwrap();
    let run = wait(child, Duration::from_secs(10));
    let took = sent.elapsed();
    run.assert_no_panic();
    assert_eq!(run.code(), i32::from(expected), "{run:#?}");
    assert!(
        took < bound,
        "stagevm took {took:?} to stop after {signal} (bound {bound:?})"
    );
    run
}

#[test]
fn sigterm_stops_a_running_guest_within_2s() {
    stop_with(Signal::SIGTERM, EXIT_SIGTERM, &[], Duration::from_secs(2));
}

#[test]
fn sigint_stops_a_running_guest_within_2s() {
    stop_with(Signal::SIGINT, EXIT_SIGINT, &[], Duration::from_secs(2));
}

/// The `stage-sched` loop waits on the exit `EventFd`, not on its drain
/// period, and each vCPU needs one kick: even with a 10 s drain period the
/// VM ends within 0.5 s, and the report (written after every thread was
/// joined) says why.
#[test]
fn sigterm_with_a_10s_drain_period_exits_within_half_a_second() {
    let report = std::env::temp_dir().join(format!("stagevm-sigterm-{}.json", std::process::id()));
    let run = stop_with(
        Signal::SIGTERM,
        EXIT_SIGTERM,
        &[
            "--drain-period-us",
            "10000000",
            "--report",
            report.to_str().unwrap(),
        ],
        Duration::from_millis(500),
    );
    assert!(!run.stderr.contains("did not stop"), "{run:#?}");
    let r = stagevm_report::Report::read(&report).unwrap();
    let _ = std::fs::remove_file(&report);
    assert_eq!(r.exit, "signal 15");
    assert_eq!(r.sched.vcpus.len(), 4);
    assert!(r.sched.helpers.iter().any(|h| h.name == "stage-sched"));
}
