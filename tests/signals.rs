//! End-to-end: SIGTERM and SIGINT stop a running guest promptly with the
//! documented exit codes.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::*;
use hypercall_abi::platform::{EXIT_SIGINT, EXIT_SIGTERM};
use nix::sys::signal::Signal;

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
    let mut stdout = child.take_stdout().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8];
    while !seen.ends_with(b"\n") {
        assert_eq!(stdout.read(&mut byte).unwrap(), 1, "stagevm closed stdout");
        seen.push(byte[0]);
    }
    assert!(seen.starts_with(b"stagevm testguest: 4 vCPUs"));
    std::thread::sleep(Duration::from_millis(200));
    let sent = Instant::now();
    child.signal(signal).unwrap();
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

/// Issue 36, item 5: stdout is a pipe nobody reads and stdin a terminal
/// (`--serial tty` then reads it); the guest (`console=1`) answers the
/// lines typed on the terminal until its answers exceed what the pipe
/// holds. Console output never blocks a vCPU, so SIGTERM ends the VM
/// within 1 s and the report counts the bytes lost. Before the fix vCPU 0
/// blocked in `write(2)` holding the UART's lock, which the exit path's
/// flush then waited for.
#[test]
fn a_stalled_stdout_never_blocks_the_vcpus() {
    use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::process::Stdio;
    let _lock = vm_lock();
    let report = report_path("stalled-stdout");
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    // Raw mode: the lines reach the VMM as typed, and nothing is echoed
    // back into the master that this test never reads.
    let mut t = tcgetattr(&pty.slave).unwrap();
    cfmakeraw(&mut t);
    tcsetattr(&pty.slave, SetArg::TCSANOW, &t).unwrap();
    let (master, slave) = (pty.master, pty.slave);
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let args = guest_args_with_report(
        &report,
        &[
            "--no-stage-device",
            "--cmdline",
            "console=1 iters=1000 requests=0",
        ],
    );
    let mut child = stagevm()
        .args(&args)
        .stdin(Stdio::from(slave))
        .stdout(Stdio::from(write_end))
        .spawn()
        .unwrap();
    // 1000 lines of 120 bytes: about 150 KiB of answers, more than twice
    // what the pipe holds. Typed from a thread: the terminal's input
    // buffer may be full while the guest reads slowly.
    let typist = std::thread::spawn(move || {
        let mut master = std::fs::File::from(master);
        for i in 0..1000 {
            let line = format!("line {i:04} {}\n", "x".repeat(110));
            if master.write_all(line.as_bytes()).is_err() {
                return;
            }
        }
        // Keep the terminal open until the VMM is gone.
        std::thread::sleep(Duration::from_secs(30));
    });
    // The pipe fills: 64 KiB the guest wrote that nobody reads.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int.
        unsafe { libc::ioctl(read_end.as_raw_fd(), libc::FIONREAD, &mut queued) };
        if queued >= 60_000 {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none() && Instant::now() < deadline,
            "the pipe never filled ({queued} bytes)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let the guest answer on into the full pipe for a while.
    std::thread::sleep(Duration::from_secs(1));
    let t = Instant::now();
    child.signal(Signal::SIGTERM).unwrap();
    let run = wait(child, Duration::from_secs(10));
    let took = t.elapsed();
    drop(read_end);
    drop(typist);
    let r = stagevm_report::Report::read(&report).unwrap_or_else(|e| panic!("{e}: {run:#?}"));
    let _ = std::fs::remove_file(&report);
    eprintln!(
        "SIGTERM to exit: {took:?}; {} bytes of console output dropped",
        r.serial_dropped_bytes
    );
    assert_eq!(run.code(), i32::from(EXIT_SIGTERM), "{run:#?}");
    assert!(took < Duration::from_secs(1), "took {took:?}: {run:#?}");
    assert!(r.serial_dropped_bytes > 0, "{run:#?}");
}
