//! End-to-end: every bad input gives a non-zero exit and a message naming
//! the bad value, never a panic.

mod common;

use common::*;
use hypercall_abi::platform::EXIT_VMM_ERROR;

#[test]
fn missing_kernel() {
    expect_vmm_error(
        &["--kernel", "/nonexistent/vmlinux"],
        &[
            "/nonexistent/vmlinux",
            "its directory /nonexistent does not exist",
        ],
    );
}

#[test]
fn non_elf_kernel() {
    let path = std::env::temp_dir().join(format!("stagevm-not-elf-{}", std::process::id()));
    std::fs::write(&path, b"#!/bin/sh\necho this is not a kernel\n").unwrap();
    expect_vmm_error(
        &["--kernel", path.to_str().unwrap()],
        &[path.to_str().unwrap(), "not an ELF64"],
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn zero_vcpus() {
    let guest = guest_image();
    expect_vmm_error(
        &["--kernel", guest.to_str().unwrap(), "--cpus", "boot=0"],
        &["'0'", "at least 1 vCPU"],
    );
}

#[test]
fn too_many_vcpus() {
    let guest = guest_image();
    expect_vmm_error(
        &["--kernel", guest.to_str().unwrap(), "--cpus", "boot=100000"],
        &["boot=100000", "KVM_CAP_MAX_VCPUS"],
    );
}

#[test]
fn memory_too_small_for_the_image() {
    let guest = guest_image();
    expect_vmm_error(
        &["--kernel", guest.to_str().unwrap(), "--memory", "size=1M"],
        &["size=1M", "too small"],
    );
}

#[test]
fn memory_not_parseable() {
    let guest = guest_image();
    expect_vmm_error(
        &["--kernel", guest.to_str().unwrap(), "--memory", "size=lots"],
        &["'lots'", "memory size"],
    );
}

/// Runs stagevm in a private mount namespace where /dev is an empty tmpfs,
/// so /dev/kvm really is missing (util-linux `unshare`; needs root).
#[test]
fn kvm_device_missing() {
    let guest = guest_image();
    // The shell's `$0` and `$@` are stagevm and its arguments.
    let child = stagevm()
        .wrap(
            "unshare",
            [
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                r#"mount -t tmpfs none /dev && exec "$0" "$@""#,
            ],
        )
        .kernel(guest)
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
    let child = stagevm()
        .wrap(
            "setpriv",
            ["--reuid=65534", "--regid=65534", "--clear-groups"],
        )
        .kernel(guest)
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

/// Runs stagevm with a stage configuration file and expects exit 1 with a
/// one-line error containing every needle.
fn expect_config_error(config: &str, extra: &[&str], needles: &[&str]) {
    let guest = guest_image();
    let _lock = vm_lock();
    let path = std::env::temp_dir().join(format!(
        "stagevm-bad-{}-{}.toml",
        std::process::id(),
        config.len()
    ));
    std::fs::write(&path, config).unwrap();
    let mut args = vec![
        "--kernel",
        guest.to_str().unwrap(),
        "--cpus",
        "boot=2",
        "--stages",
        path.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let run = run(&args);
    let _ = std::fs::remove_file(&path);
    run.assert_no_panic();
    assert_eq!(run.code(), i32::from(EXIT_VMM_ERROR), "{run:#?}");
    // The error from its line on (a TOML syntax error spans several lines).
    let at = run
        .stderr
        .find("stagevm: error: ")
        .unwrap_or_else(|| panic!("no error line: {}", run.stderr));
    let line = &run.stderr[at..];
    for needle in needles {
        assert!(line.contains(needle), "'{line}' should name '{needle}'");
    }
}

/// A `[[stage]]` the guest does not declare does not end the VM: stage
/// names are the untrusted guest's own, known only at its REGISTER. The
/// budget is left out with a warning naming it (log and report), the
/// configured policy serves the guest's stages, and the guest runs to its
/// end (exit 0).
#[test]
fn config_stage_the_guest_does_not_declare() {
    let guest = guest_image();
    let _lock = vm_lock();
    let path = std::env::temp_dir().join(format!("stagevm-undeclared-{}.toml", std::process::id()));
    let report = path.with_extension("json");
    std::fs::write(
        &path,
        "[policy]\nname = \"static\"\n[[stage]]\nname = \"commit\"\n",
    )
    .unwrap();
    let run = run(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cpus",
        "boot=2",
        "--stages",
        path.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&path);
    run.assert_no_panic();
    assert_eq!(run.code(), 0, "{run:#?}");
    let warning = "stage 'commit': unknown stage; the guest declared parse, plan, execute: the [[stage]] budgets of commit are left out";
    assert!(run.stderr.contains(warning), "{}", run.stderr);
    let text = std::fs::read_to_string(&report).unwrap();
    let _ = std::fs::remove_file(&report);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let sched = &json["sched"];
    assert_eq!(sched["policy"], "static", "{sched}");
    assert!(
        sched["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str() == Some(warning)),
        "{sched}"
    );
    // The guest's stages were served: events counted for each of them.
    let stages = json["stage_channel"]["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 3, "{text}");
    assert!(
        stages.iter().all(|s| s["events"].as_u64().unwrap() > 0),
        "{text}"
    );
}

#[test]
fn config_min_above_max() {
    expect_config_error(
        "[[stage]]\nname = \"parse\"\nmin_cores = 2\nmax_cores = 1\n",
        &[],
        &["stage 'parse'", "min_cores = 2 > max_cores = 1"],
    );
}

#[test]
fn config_cores_not_online() {
    expect_config_error(
        "[host]\ncores = \"0-1023\"\n",
        &[],
        &["host.cores = '0-1023'", "not online"],
    );
}

#[test]
fn config_overlap_of_stage_and_housekeeping_cores() {
    expect_config_error(
        "[host]\ncores = \"0-1\"\nhousekeeping = \"1\"\n",
        &[],
        &["host.housekeeping = '1'", "overlaps", "CPU 1"],
    );
}

#[test]
fn config_budgets_cannot_fit() {
    expect_config_error(
        "[host]\ncores = \"0-1\"\n[[stage]]\nname = \"parse\"\nmin_cores = 2\n[[stage]]\nname = \"plan\"\nmin_cores = 1\n",
        &[],
        &["budgets cannot fit", "min_cores sum to 3"],
    );
}

#[test]
fn config_unknown_policy_and_key() {
    expect_config_error(
        "",
        &["--policy", "fastest"],
        &["--policy = 'fastest'", "unknown policy"],
    );
    expect_config_error(
        "[polcy]\nname = \"static\"\n",
        &[],
        &["unknown field `polcy`"],
    );
}

/// An unknown stage-visit policy names the option, or the file and its key.
#[test]
fn config_unknown_visit() {
    expect_config_error(
        "",
        &["--visit", "lifo"],
        &["--visit = 'lifo'", "unknown visit policy"],
    );
    expect_config_error(
        "[policy]\nvisit = \"x\"\n",
        &[],
        &[
            "--stages ",
            "stagevm-bad-",
            "policy.visit = 'x'",
            "unknown visit policy",
        ],
    );
}

/// A FIFO as `--kernel` used to block start-up forever (issue 14 D14); it is
/// refused at once, before it is opened.
#[test]
fn fifo_as_kernel_is_refused_not_waited_on() {
    let path = std::env::temp_dir().join(format!("stagevm-fifo-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    expect_vmm_error(
        &["--kernel", path.to_str().unwrap()],
        &[path.to_str().unwrap(), "not a regular file"],
    );
    let _ = std::fs::remove_file(&path);
}

/// `/dev/zero` as `--initramfs` or `--stages` used to be read whole, ~6 GB
/// (issue 14 D10); both are refused unread.
#[test]
fn devices_as_initramfs_or_stages_are_refused_unread() {
    let guest = guest_image();
    expect_vmm_error(
        &[
            "--kernel",
            guest.to_str().unwrap(),
            "--initramfs",
            "/dev/zero",
        ],
        &["--initramfs /dev/zero", "not a regular file"],
    );
    expect_vmm_error(
        &["--kernel", guest.to_str().unwrap(), "--stages", "/dev/zero"],
        &["--stages /dev/zero", "not a regular file"],
    );
}

/// `--report` is opened before the VM boots (issue 14 D11): a bad path fails
/// at once with status 1 and the guest never runs; a symbolic link is
/// refused; a new report file is readable by its owner only.
#[test]
fn report_path_is_checked_before_boot_and_written_safely() {
    use std::os::unix::fs::PermissionsExt;
    let guest = guest_image();
    let run = run(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--report",
        "/nonexistent/dir/report.json",
    ]);
    assert_eq!(run.code(), i32::from(EXIT_VMM_ERROR), "{run:#?}");
    assert!(
        run.stderr.contains("--report /nonexistent/dir/report.json"),
        "{run:#?}"
    );
    assert!(
        !run.stdout.contains("stagevm testguest"),
        "the guest ran: {run:#?}"
    );

    let dir = std::env::temp_dir().join(format!("stagevm-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let target = dir.join("target");
    std::fs::write(&target, "keep me").unwrap();
    let link = dir.join("link.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    expect_vmm_error(
        &[
            "--kernel",
            guest.to_str().unwrap(),
            "--report",
            link.to_str().unwrap(),
        ],
        &["symbolic link"],
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");

    let fresh = dir.join("fresh.json");
    run_ok(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cmdline",
        "iters=1000 requests=0",
        "--report",
        fresh.to_str().unwrap(),
    ]);
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(stagevm_report::Report::read(&fresh).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

fn run_ok(args: &[&str]) -> Run {
    let run = run(args);
    run.assert_no_panic();
    assert_eq!(run.code(), 0, "{run:#?}");
    run
}

/// A serial console whose writes fail (a full disk: `/dev/full`) used to
/// log one warning per byte the guest wrote (issue 14 D13); the lines are
/// rate-limited and the rest counted.
#[test]
fn failing_serial_output_is_logged_rate_limited() {
    let guest = guest_image();
    let _lock = vm_lock();
    let run = run(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--serial",
        "file=/dev/full",
        "--cmdline",
        "iters=1000 requests=50",
    ]);
    run.assert_no_panic();
    assert_eq!(run.code(), 0, "{run:#?}");
    let failures = run
        .stderr
        .lines()
        .filter(|l| l.contains("serial output failed"))
        .count();
    assert!(
        (1..=10).contains(&failures),
        "{failures} lines: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains("guest-triggered log lines suppressed"),
        "{}",
        run.stderr
    );
}

/// A TOML syntax error in `--stages` shows the file's path and toml's own
/// message: the line, the line's text and a caret under the error.
#[test]
fn a_stages_syntax_error_shows_path_line_and_caret() {
    let guest = guest_image();
    let path = std::env::temp_dir().join(format!("stagevm-caret-{}.toml", std::process::id()));
    std::fs::write(&path, "[host]\ncores = 0-1\n").unwrap();
    expect_vmm_error(
        &[
            "--kernel",
            guest.to_str().unwrap(),
            "--stages",
            path.to_str().unwrap(),
        ],
        &[
            &format!("stagevm: error: {}: ", path.display()),
            "line 2",
            "2 | cores = 0-1",
            "^",
        ],
    );
    let _ = std::fs::remove_file(&path);
}

/// A value the file gives that is wrong names the file; one from a
/// command-line option names the option.
#[test]
fn a_bad_value_names_the_stages_file() {
    expect_config_error(
        "[policy]\nname = \"fastest\"\n",
        &[],
        &["--stages ", "stagevm-bad-", "policy.name = 'fastest'"],
    );
}

/// A path in a directory that does not exist says which directory.
#[test]
fn a_missing_directory_is_named() {
    let guest = guest_image();
    let dir = format!("/nonexistent-stagevm-{}", std::process::id());
    for (option, value, shown) in [
        ("--report", format!("{dir}/r.json"), "--report"),
        ("--api-socket", format!("{dir}/a.sock"), "--api-socket"),
        ("--serial", format!("file={dir}/s.log"), "serial file"),
    ] {
        expect_vmm_error(
            &["--kernel", guest.to_str().unwrap(), option, &value],
            &[shown, &format!("its directory {dir} does not exist")],
        );
    }
    // An input file: a missing directory, or a missing file in one that
    // exists.
    let tmp = std::env::temp_dir();
    let missing = tmp.join(format!("stagevm-missing-{}", std::process::id()));
    let in_tmp = format!("no such file (its directory {} exists)", tmp.display());
    let cases = [
        (
            vec!["--kernel".to_string(), format!("{dir}/vmlinux")],
            format!("its directory {dir} does not exist"),
        ),
        (
            vec!["--kernel".to_string(), missing.display().to_string()],
            in_tmp.clone(),
        ),
        (
            vec![
                "--kernel".to_string(),
                guest.display().to_string(),
                "--initramfs".to_string(),
                missing.display().to_string(),
            ],
            in_tmp,
        ),
    ];
    for (args, why) in cases {
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        expect_vmm_error(&args, &[&why]);
    }
}
