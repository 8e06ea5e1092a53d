//! End-to-end: SIGTERM and SIGINT stop a running guest promptly with the
//! documented exit codes.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::*;
use hypercall_abi::platform::{EXIT_SIGINT, EXIT_SIGTERM};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn stop_with(signal: Signal, expected: u8) {
    let guest = guest_image();
    let _lock = vm_lock();
    // ~1e12 iterations: minutes of work, so only the signal can end it.
    let mut child = spawn(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cpus",
        "boot=4",
        "--cmdline",
        "iters=1000000000000",
    ]);
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
        took < Duration::from_secs(2),
        "stagevm took {took:?} to stop after {signal}"
    );
}

#[test]
fn sigterm_stops_a_running_guest_within_2s() {
    stop_with(Signal::SIGTERM, EXIT_SIGTERM);
}

#[test]
fn sigint_stops_a_running_guest_within_2s() {
    stop_with(Signal::SIGINT, EXIT_SIGINT);
}
