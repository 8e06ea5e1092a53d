//! End-to-end: the headline benchmark's footprint workload in the guest
//! computes exactly what the host build of the same generated code computes,
//! and under `static` each of its stages runs only on its own vCPU.

mod common;

use common::*;
use stage_workload::{thread_checksum, Params};

const PARAMS: Params = Params {
    stages: 2,
    funcs: 300,
    calls: 40,
    data_words: 64,
};
const THREADS_PER_VCPU: u64 = 3;
const REQUESTS: u64 = 60;

fn cmdline() -> String {
    format!(
        "iters=1 workload=footprint stages={} funcs={} calls={} data={} threads={THREADS_PER_VCPU} requests={REQUESTS}",
        PARAMS.stages, PARAMS.funcs, PARAMS.calls, PARAMS.data_words
    )
}

fn stages_config() -> String {
    repo_root()
        .join("bench/headline-stages.toml")
        .to_str()
        .unwrap()
        .to_string()
}

/// Boots the footprint workload ([`cmdline`]) on 2 vCPUs with the
/// headline's stage configuration and `args`.
fn boot_footprint(args: &[&str]) -> (Run, stagevm_report::Report) {
    let stages = stages_config();
    let cmdline = cmdline();
    let mut all = vec![
        "--cpus",
        "boot=2",
        "--stages",
        &stages,
        "--cmdline",
        &cmdline,
    ];
    all.extend_from_slice(args);
    boot_with_report(&all)
}

/// `thread N: vcpu V, requests R, checksum 0x…` lines: (id, checksum).
fn thread_checksums(stdout: &str) -> Vec<(u32, u64)> {
    let mut v: Vec<(u32, u64)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("thread "))
        .map(|l| {
            let id = l.split(':').next().unwrap().parse().unwrap();
            let hex = l.rsplit("checksum 0x").next().unwrap();
            (id, u64::from_str_radix(hex.trim(), 16).unwrap())
        })
        .collect();
    v.sort();
    v
}

fn host_checksums(threads: u32) -> Vec<(u32, u64)> {
    let mut data = vec![0u64; PARAMS.data_words];
    (0..threads)
        .map(|id| (id, thread_checksum(id, REQUESTS, &PARAMS, &mut data)))
        .collect()
}

#[test]
fn guest_checksums_equal_the_host_build_under_every_policy() {
    let cpus = 2u32;
    let want = host_checksums(cpus * THREADS_PER_VCPU as u32);
    for policy in ["off", "static"] {
        let (run, json) = boot_footprint(&["--policy", policy]);
        assert!(
            run.stdout.contains(&format!(
                "footprint workload: 2 stages, {} functions per stage, {} bytes of code",
                PARAMS.funcs,
                stage_workload::code_bytes(2, PARAMS.funcs)
            )),
            "{}",
            run.stdout
        );
        assert_eq!(thread_checksums(&run.stdout), want, "policy {policy}");
        // Every request entered both stages, counted alike by guest and VMM.
        let total = u64::from(cpus) * THREADS_PER_VCPU * REQUESTS;
        // "stage events stage0 A stage1 B exit C; …": numbers 0, A, 1, B, C, …
        let guest = line_numbers(&run.stdout, "testguest: stage events ");
        assert_eq!([guest[1], guest[3], guest[4]], [total; 3], "{guest:?}");
        let host: Vec<u64> = json
            .stage_channel
            .as_ref()
            .expect("no stage_channel in the report")
            .stages
            .iter()
            .map(|s| s.events)
            .collect();
        assert_eq!(host, [total, total], "policy {policy}");
        let migrations = line_numbers(&run.stdout, "testguest: migrations ")[0];
        let per_vcpu: Vec<Vec<u64>> = run
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix("testguest: vcpu "))
            .map(numbers)
            .collect();
        assert_eq!(per_vcpu.len(), 2);
        if policy == "off" {
            // Every vCPU serves both stages: threads stay where they are.
            assert_eq!(migrations, 0, "{}", run.stdout);
        } else {
            // stage0 → vCPU 0, stage1 → vCPU 1; a thread moves at every
            // stage switch but its first.
            assert!(migrations >= total, "{}", run.stdout);
            // "vcpu V ran stage0 A stage1 B": numbers are V, 0, A, 1, B.
            assert_eq!(per_vcpu[0][4], 0, "stage1 ran on vCPU 0: {per_vcpu:?}");
            assert_eq!(per_vcpu[1][2], 0, "stage0 ran on vCPU 1: {per_vcpu:?}");
        }
    }
}

/// Temporal staging (the map's visit policy, issue 24): under `pinned`
/// with each visit policy, and under `static` with cohort, the guest
/// computes the host build's checksums, every request enters both stages,
/// and the polling policies serve several threads per stage visit
/// (`testguest: stage visits V, threads served in them T`), FIFO none.
#[test]
fn every_visit_policy_computes_the_host_checksums() {
    let cpus = 2u32;
    let want = host_checksums(cpus * THREADS_PER_VCPU as u32);
    let total = u64::from(cpus) * THREADS_PER_VCPU * REQUESTS;
    let cases = [
        ("pinned", "fifo"),
        ("pinned", "cohort"),
        ("pinned", "srpt"),
        ("pinned", "dbr"),
        ("pinned", "mg1"),
        ("pinned", "color"),
        ("static", "cohort"),
    ];
    for (policy, visit) in cases {
        let (run, _) = boot_footprint(&["--policy", policy, "--visit", visit]);
        let what = format!("{policy} + {visit}");
        assert!(
            run.stdout
                .contains(&format!("testguest: visit policy {visit} (map epoch 2)")),
            "{what}: {}",
            run.stdout
        );
        assert_eq!(thread_checksums(&run.stdout), want, "{what}");
        let guest = line_numbers(&run.stdout, "testguest: stage events ");
        assert_eq!(
            [guest[1], guest[3], guest[4]],
            [total; 3],
            "{what}: {guest:?}"
        );
        // "stage visits V, threads served in them T (X.YY per visit)"
        let v = line_numbers(&run.stdout, "testguest: stage visits ");
        let (visits, threads) = (v[0], v[1]);
        if visit == "fifo" {
            assert_eq!((visits, threads), (0, 0), "{what}");
        } else {
            // Each thread is served once per stage it enters.
            assert_eq!(threads, 2 * total, "{what}");
            if visit != "color" {
                // Cohorts form: more than one thread per visit on average
                // (3 threads per vCPU, 2 stages; one per visit without
                // them). Not more: under `./dev test`'s other tests dbr
                // once served 1.50 per visit, where it serves ~2 alone.
                assert!(
                    threads > visits,
                    "{what}: {visits} visits, {threads} threads"
                );
            }
        }
    }
}

#[test]
fn bad_footprint_parameters_are_named() {
    let guest = guest_image();
    let _lock = vm_lock();
    for (word, ok_before) in [
        ("stages=5", "funcs=10"),
        ("funcs=0", "stages=2"),
        ("calls=0", ""),
    ] {
        let cmdline = format!("iters=1 workload=footprint {ok_before} {word}");
        let run = run(&["--kernel", guest.to_str().unwrap(), "--cmdline", &cmdline]);
        assert_eq!(run.code(), 4, "{run:#?}");
        assert!(
            run.stdout
                .contains(&format!("testguest: bad command-line word '{word}'")),
            "{}",
            run.stdout
        );
    }
}
