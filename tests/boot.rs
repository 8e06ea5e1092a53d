//! End-to-end: boot the test guest on /dev/kvm and check what every vCPU did.

mod common;

use common::*;
use hypercall_abi::platform::EXIT_GUEST_FAILURE;

fn boot_and_check(vcpus: u32, iters: u64) {
    let guest = guest_image();
    let _lock = vm_lock();
    let cpus = format!("boot={vcpus}");
    let cmdline = format!("iters={iters}");
    let run = run(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cpus",
        &cpus,
        "--memory",
        "size=64M",
        "--cmdline",
        &cmdline,
    ]);
    run.assert_no_panic();
    assert_eq!(run.code(), 0, "{run:#?}");
    assert!(
        run.stdout
            .starts_with(&format!("stagevm testguest: {vcpus} vCPUs, 64 MiB")),
        "banner: {}",
        run.stdout
    );
    let mut lines = checksum_lines(&run.stdout);
    lines.sort();
    assert_eq!(
        lines.len(),
        vcpus as usize,
        "one line per vCPU: {}",
        run.stdout
    );
    for (i, (vcpu, ring, got_iters, checksum)) in lines.into_iter().enumerate() {
        assert_eq!(vcpu, i as u64);
        assert_eq!(ring, 3, "vCPU {vcpu} must run its work in ring 3");
        assert_eq!(got_iters, iters);
        assert_eq!(
            checksum,
            expected_checksum(vcpu, iters),
            "checksum of vCPU {vcpu}"
        );
    }
    assert!(run
        .stdout
        .contains(&format!("testguest: all {vcpus} vCPUs done")));
}

#[test]
fn boots_one_vcpu() {
    boot_and_check(1, 2_000_000);
}

#[test]
fn boots_two_vcpus() {
    boot_and_check(2, 2_000_000);
}

#[test]
fn boots_four_vcpus_on_fewer_cores() {
    // More vCPUs than the machine's 2 cores.
    boot_and_check(4, 1_000_000);
}

#[test]
fn vcpu_threads_are_named() {
    let guest = guest_image();
    let _lock = vm_lock();
    // Long enough to look at the threads while it runs.
    let child = spawn(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cpus",
        "boot=3",
        "--cmdline",
        "iters=40000000000",
    ]);
    let threads = watch_threads(child, |t| {
        t.iter()
            .filter(|(n, _)| n.starts_with("vcpu"))
            .map(|(_, m)| m.len())
            .sum::<usize>()
            == 3
    });
    // One entry per thread, so a repeated name would show.
    let mut names: Vec<&String> = threads
        .iter()
        .filter(|(n, _)| n.starts_with("vcpu"))
        .flat_map(|(n, masks)| masks.iter().map(move |_| n))
        .collect();
    names.sort();
    assert_eq!(names, ["vcpu0", "vcpu1", "vcpu2"]);
}

#[test]
fn guest_exit_code_is_returned() {
    let guest = guest_image();
    let _lock = vm_lock();
    let run = run(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cpus",
        "boot=2",
        "--cmdline",
        "iters=1000 exit=42",
    ]);
    run.assert_no_panic();
    assert_eq!(run.code(), 42, "{run:#?}");
}

#[test]
fn guest_triple_fault_is_reported() {
    let guest = guest_image();
    let _lock = vm_lock();
    let run = run(&["--kernel", guest.to_str().unwrap(), "--cmdline", "fault=1"]);
    run.assert_no_panic();
    assert_eq!(run.code(), i32::from(EXIT_GUEST_FAILURE), "{run:#?}");
    assert!(
        run.stderr.contains("vCPU 0: triple fault") && run.stderr.contains("RIP 0x"),
        "{}",
        run.stderr
    );
    // The instruction bytes at RIP start with the `hlt` (f4) that faulted.
    assert!(run.stderr.contains("code: f4"), "{}", run.stderr);
}

#[test]
fn serial_goes_to_a_file() {
    let guest = guest_image();
    let _lock = vm_lock();
    let path = std::env::temp_dir().join(format!("stagevm-serial-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let serial = format!("file={}", path.display());
    let run = run(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cmdline",
        "iters=1000",
        "--serial",
        &serial,
    ]);
    assert_eq!(run.code(), 0, "{run:#?}");
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    let log = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(
        checksum_lines(&log),
        [(0, 3, 1000, expected_checksum(0, 1000))]
    );
}

/// The JSON report says which layout and which `stagevm` wrote it, when the
/// VM started (the host's clock) and how long it ran (issue 28).
#[test]
fn the_report_names_its_schema_version_start_and_duration() {
    let before = std::time::SystemTime::now();
    let t0 = std::time::Instant::now();
    let (_, report) = boot_with_report(&["--cpus", "boot=1", "--cmdline", "iters=1000"]);
    let (after, took) = (std::time::SystemTime::now(), t0.elapsed());
    let ms = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
    };
    assert_eq!(report.schema, stagevm_report::REPORT_SCHEMA);
    assert_eq!(report.stagevm_version, env!("CARGO_PKG_VERSION"));
    assert!(
        (ms(before)..=ms(after)).contains(&report.started_unix_ms),
        "started {} not in [{}, {}]",
        report.started_unix_ms,
        ms(before),
        ms(after)
    );
    assert!(
        report.duration_ms <= took.as_millis() as u64,
        "ran {} ms in a {} ms test",
        report.duration_ms,
        took.as_millis()
    );
    // RFC 3339, UTC, the same instant.
    let started = chrono::DateTime::parse_from_rfc3339(&report.started)
        .unwrap_or_else(|e| panic!("started '{}': {e}", report.started));
    assert!(report.started.ends_with('Z'), "{}", report.started);
    assert_eq!(started.timestamp_millis() as u64, report.started_unix_ms);
    // The serialised form carries them by name.
    let json = serde_json::to_value(&report).unwrap();
    for key in [
        "schema",
        "stagevm_version",
        "started",
        "started_unix_ms",
        "duration_ms",
    ] {
        assert!(json.get(key).is_some(), "no {key} in {json}");
    }
}

/// An 8 GiB guest: 3 GiB below the MMIO hole, 5 GiB from 4 GiB up, every
/// byte identity-mapped for the ring-3 guest, which writes and reads back
/// the first and last page above 4 GiB (issue 28).
#[test]
fn an_8_gib_guest_uses_ram_above_4_gib() {
    let (run, _) = boot_with_report(&[
        "--cpus",
        "boot=2",
        "--memory",
        "size=8G",
        "--cmdline",
        "highmem=1 iters=1000 requests=0",
    ]);
    assert!(
        run.stdout.contains(
            "testguest: high memory [0x100000000, 0x240000000) pages 0x100000000 0x23ffff000 ok"
        ),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("2 vCPUs, 8192 MiB"), "{}", run.stdout);
}

/// More RAM than the unikernel's page tables map, and huge pages a host
/// does not have, are refused before boot, naming the value and the limit.
#[test]
fn memory_the_guest_or_host_cannot_give_is_refused() {
    let guest = guest_image().to_str().unwrap();
    expect_vmm_error(
        &["--kernel", guest, "--memory", "size=24G"],
        &["--memory size=24G", "maps at most 20G"],
    );
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let free = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let args = [
        "--memory",
        "size=128M,hugepages=on",
        "--cmdline",
        "iters=1000",
    ];
    if free >= 64 {
        // A host with a pool: the guest runs in huge pages.
        let (run, _) = boot_with_report(&args);
        assert!(run.stdout.contains("128 MiB"), "{}", run.stdout);
        return;
    }
    let mut all = vec!["--kernel", guest];
    all.extend_from_slice(&args);
    expect_vmm_error(
        &all,
        &["--memory hugepages=on", "HugePages_Free", "nr_hugepages"],
    );
}
