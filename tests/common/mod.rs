//! Shared helpers of the end-to-end tests: build the test guest, run
//! `stagevm` one VM at a time (through the test kit, `tests/kit`), and
//! recompute the guest's checksums on the host.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use stagevm_testkit::console::numbers;
#[allow(unused_imports)] // Each test binary uses part of the kit.
pub use stagevm_testkit::{Remote, Run, Running, Stagevm};

/// The `stagevm` binary cargo built for these tests.
pub const STAGEVM: &str = env!("CARGO_BIN_EXE_stagevm");

#[allow(unused_imports)] // Each test binary uses part of the kit.
pub use stagevm_testkit::machine::{repo_root, vm_lock, VmLock};

/// Builds `images/testguest` once per test binary and returns the ELF's
/// path (the kit's [`stagevm_testkit::machine::test_guest`]).
pub fn guest_image() -> &'static Path {
    stagevm_testkit::machine::test_guest()
}

/// A `stagevm` command line for [`STAGEVM`] (the kit's builder).
pub fn stagevm() -> Stagevm {
    Stagevm::new(STAGEVM)
}

/// Spawns `stagevm` with `args`, stdin `/dev/null`, stdout and stderr
/// piped; the VMM is killed if the [`Running`] child is dropped.
pub fn spawn(args: &[&str]) -> Running {
    stagevm().args(args).spawn().expect("spawn stagevm")
}

/// Waits for `child` for at most `timeout`, killing it and panicking after.
/// Collects whatever of stdout/stderr the caller has not taken.
pub fn wait(child: Running, timeout: Duration) -> Run {
    child.wait(timeout).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `stagevm` with `args` to completion (at most 60 s).
pub fn run(args: &[&str]) -> Run {
    wait(spawn(args), Duration::from_secs(60))
}

/// The test guest's per-vCPU workload, written again from its specification
/// (`images/testguest/src/main.rs`, `workload`): a 4096-word table filled
/// from xorshift64 (13, 7, 17) seeded with
/// `0x5354_4147_4556_4d31 ^ (vcpu + 1) * 0x9e37_79b9_7f4a_7c15`, then `iters`
/// steps `t[j] = rotl(t[j], 7) ^ i; sum = rotl(sum, 5) ^ t[j]` with
/// `j = x % 4096`, and finally the wrapping sum of the table added to `sum`.
pub fn expected_checksum(vcpu: u64, iters: u64) -> u64 {
    let step = |mut x: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut x = 0x5354_4147_4556_4d31u64 ^ (vcpu + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut table = vec![0u64; 4096];
    for w in table.iter_mut() {
        x = step(x);
        *w = x;
    }
    let mut sum = 0u64;
    for i in 0..iters {
        x = step(x);
        let j = (x % 4096) as usize;
        table[j] = table[j].rotate_left(7) ^ i;
        sum = sum.rotate_left(5) ^ table[j];
    }
    table.iter().fold(sum, |acc, w| acc.wrapping_add(*w))
}

/// Parses the guest's `vcpu N: ring R, iters I, checksum 0x…` lines into
/// `(vcpu, ring, iters, checksum)`.
pub fn checksum_lines(stdout: &str) -> Vec<(u64, u64, u64, u64)> {
    stdout
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("vcpu ")?;
            let (vcpu, rest) = rest.split_once(": ring ")?;
            let (ring, rest) = rest.split_once(", iters ")?;
            let (iters, sum) = rest.split_once(", checksum 0x")?;
            Some((
                vcpu.parse().ok()?,
                ring.parse().ok()?,
                iters.parse().ok()?,
                u64::from_str_radix(sum.trim(), 16).ok()?,
            ))
        })
        .collect()
}

/// The integers of the first guest line starting with `prefix` (panics with
/// the output when there is none).
pub fn line_numbers(stdout: &str, prefix: &str) -> Vec<u64> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no '{prefix}' line in: {stdout}"));
    numbers(line)
}

/// A fresh report path in the temporary directory, `stagevm-<what>-<pid>-<n>.json`.
pub fn report_path(what: &str) -> PathBuf {
    stagevm_testkit::temp_path(what, "json")
}

/// `--kernel <test guest> --report <report>` followed by `args`.
pub fn guest_args_with_report<'a>(report: &'a Path, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec![
        "--kernel",
        guest_image().to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    all
}

/// Boots the test guest with `args` (after `--kernel`) plus `--report`,
/// holding the [`VmLock`]; asserts exit 0 without a panic and returns the
/// run and its report.
pub fn boot_with_report(args: &[&str]) -> (Run, stagevm_report::Report) {
    boot_with_report_within(args, Duration::from_secs(60))
}

/// [`boot_with_report`] for a run that may take up to `timeout` (the
/// minute-long tests).
pub fn boot_with_report_within(args: &[&str], timeout: Duration) -> (Run, stagevm_report::Report) {
    let _lock = vm_lock();
    let report = report_path("report");
    let run = wait(spawn(&guest_args_with_report(&report, args)), timeout);
    run.assert_no_panic();
    assert_eq!(run.code(), 0, "{run:#?}");
    let json = stagevm_report::Report::read(&report)
        .unwrap_or_else(|e| panic!("{}: {e}", report.display()));
    let _ = std::fs::remove_file(&report);
    (run, json)
}

/// `comm` → `Cpus_allowed_list` of every thread of `pid`, read from
/// `/proc/<pid>/task/*/status` (names repeat: the value is a list).
pub fn thread_affinities(pid: u32) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut map: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return map;
    };
    for task in dir.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        if let Some(list) = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        {
            map.entry(comm.trim().to_string())
                .or_default()
                .push(list.trim().to_string());
        }
    }
    map
}

/// Watches the threads of a running `stagevm` (polling [`thread_affinities`])
/// until `done` holds or 10 s pass, then kills it and returns the last
/// observation.
pub fn watch_threads(
    child: Running,
    done: impl Fn(&std::collections::BTreeMap<String, Vec<String>>) -> bool,
) -> std::collections::BTreeMap<String, Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Default::default();
    while Instant::now() < deadline {
        seen = thread_affinities(child.id());
        if done(&seen) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    seen
}

/// Runs stagevm with `args` and asserts it refused them as a configuration
/// error (exit 1, no panic) with every one of `needles` in its stderr.
pub fn expect_vmm_error(args: &[&str], needles: &[&str]) {
    let run = run(args);
    run.assert_no_panic();
    assert_eq!(
        run.code(),
        i32::from(hypercall_abi::platform::EXIT_VMM_ERROR),
        "{run:#?}"
    );
    for needle in needles {
        assert!(
            run.stderr.contains(needle),
            "stderr should name '{needle}': {}",
            run.stderr
        );
    }
}

/// Reports a test that cannot run here as skipped, with why. Written to the
/// process's stderr directly (the harness captures only `eprintln!`), so
/// the line shows in every run; under CI (`CI` set) a skip is a failure,
/// because CI's machines have what these tests need.
pub fn skip(why: &str) {
    use std::io::Write as _;
    let name = std::thread::current().name().unwrap_or("?").to_string();
    let _ = writeln!(std::io::stderr(), "test {name}: skipped: {why}");
    assert!(
        std::env::var_os("CI").is_none(),
        "{name} cannot run under CI: {why}"
    );
}
