//! End-to-end: the staged test guest reports every stage switch through the
//! stage channel; the VMM's per-stage counts must equal the guest's own.

mod common;

use common::*;
use stagevm_report::{ChannelReport, Report};

/// The guest's own counts: (parse, plan, execute, exit, back-offs).
fn guest_counts(stdout: &str) -> [u64; 5] {
    let n = line_numbers(stdout, "testguest: stage events ");
    [n[0], n[1], n[2], n[3], n[4]]
}

fn boot_staged(extra_args: &[&str], cmdline: &str) -> (Run, Report) {
    let mut args = vec!["--cpus", "boot=2", "--cmdline", cmdline];
    args.extend_from_slice(extra_args);
    boot_with_report(&args)
}

/// The report's stage-channel counters; panics if there are none.
fn channel(json: &Report) -> &ChannelReport {
    json.stage_channel
        .as_ref()
        .expect("no stage_channel in the report")
}

/// Checks that the VMM counted exactly what the guest reported.
fn assert_counts_equal(run: &Run, json: &Report) {
    let [parse, plan, execute, exits, _] = guest_counts(&run.stdout);
    let ch = channel(json);
    let stages = &ch.stages;
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["parse", "plan", "execute"]);
    let host: Vec<u64> = stages.iter().map(|s| s.events).collect();
    assert_eq!(
        host,
        [parse, plan, execute],
        "per-stage events, VMM vs guest"
    );
    let host_exits: u64 = ch.vcpus.iter().map(|v| v.exits).sum();
    assert_eq!(host_exits, exits);
}

#[test]
fn vmm_counts_equal_guest_counts() {
    let (run, json) = boot_staged(&[], "iters=1000 threads=3 requests=200");
    // 2 vCPUs × 3 threads × 200 requests pass each stage once.
    assert_eq!(guest_counts(&run.stdout)[..4], [1200, 1200, 1200, 1200]);
    assert_counts_equal(&run, &json);
    let ch = channel(&json);
    assert_eq!(ch.dropped, 0);
    assert_eq!(ch.registrations, 1);
    assert!(ch.drains > 0);
    assert!(run.stdout.contains("testguest: stage channel Ok"));
    // The summary on stderr gives the same totals.
    assert!(run.stderr.contains("stage parse "), "{}", run.stderr);
}

#[test]
fn tiny_ring_and_slow_drain_lose_nothing() {
    let (run, json) = boot_staged(
        &["--drain-period-us", "20000"],
        "iters=1000 threads=2 requests=100 ring=4",
    );
    assert_counts_equal(&run, &json);
    let ch = channel(&json);
    assert_eq!(ch.dropped, 0);
    let backoffs = ch.ring_full_backoffs;
    // A 4-entry ring drained every 20 ms must fill up; the guest backs off
    // instead of overwriting, and its own count matches the ring headers.
    assert!(backoffs > 0, "{ch:?}");
    assert_eq!(guest_counts(&run.stdout)[4], backoffs);
    eprintln!("tiny ring: {backoffs} ring-full back-offs");
}

#[test]
fn corrupt_guest_input_is_counted_and_survived() {
    let (run, json) = boot_staged(&[], "iters=1000 abuse=1 ring=16");
    assert!(
        run.stdout.contains(
            "abuse: register outside RAM -> BadRange, wrong magic -> BadMagic, unaligned size -> BadAlignment"
        ),
        "{}",
        run.stdout
    );
    let ch = channel(&json);
    let rejected = &ch.registrations_rejected;
    assert_eq!(rejected.get("BadRange"), Some(&1), "{rejected:?}");
    assert_eq!(rejected.get("BadMagic"), Some(&1), "{rejected:?}");
    assert_eq!(rejected.get("BadAlignment"), Some(&1), "{rejected:?}");
    assert_eq!(ch.registrations, 1);
    let v0 = &ch.vcpus[0];
    assert_eq!(v0.dropped_bad_seq, 1, "{v0:?}");
    assert_eq!(v0.dropped_bad_stage, 1, "{v0:?}");
    assert_eq!(v0.bad_index, 1, "{v0:?}");
    assert_eq!(ch.dropped, 3);
    // The valid events still all arrive.
    assert_counts_equal(&run, &json);
    assert!(run.stderr.contains("REGISTER refused"), "{}", run.stderr);
}

#[test]
fn without_stage_device_the_agent_is_a_no_op() {
    let (run, json) = boot_staged(&["--no-stage-device"], "iters=1000");
    assert!(
        run.stdout.contains("testguest: stage channel NoDevice"),
        "{}",
        run.stdout
    );
    assert_eq!(guest_counts(&run.stdout)[..4], [0, 0, 0, 0]);
    assert!(json.stage_channel.is_none());
    // The same work ran: every thread printed its checksum.
    assert_eq!(
        run.stdout
            .lines()
            .filter(|l| l.starts_with("thread "))
            .count(),
        4
    );
}
