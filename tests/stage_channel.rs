//! End-to-end: the staged test guest reports every stage switch through the
//! stage channel — its per-vCPU counters (ABI minor 2), or its rings as a
//! v1.1 guest (`counters=0`) — and the VMM's per-stage counts must equal the
//! guest's own.

mod common;

use common::*;
use stagevm_report::{ChannelReport, Report};

/// The guest's own counts: (parse, plan, execute, exit, back-offs).
fn guest_counts(stdout: &str) -> [u64; 5] {
    let n = line_numbers(stdout, "testguest: stage events ");
    [n[0], n[1], n[2], n[3], n[4]]
}

/// The guest's trace counts: (written, dropped, dropped in its ring headers).
fn guest_trace(stdout: &str) -> [u64; 3] {
    let n = line_numbers(stdout, "testguest: stage events ");
    [n[6], n[7], n[8]]
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
    assert_eq!(ch.mode, "counters");
    assert_eq!((ch.dropped, ch.counter_clamps), (0, 0));
    assert_eq!(ch.registrations, 1);
    // No trace asked: the rings stay empty, nothing is traced or dropped.
    assert_eq!((ch.traced_events, ch.trace_dropped), (0, 0));
    assert!(run.stdout.contains("testguest: stage channel Ok"));
    assert!(run.stdout.contains("256 ring entries, counters)"));
    // Every vCPU's time is split: occupancy and idle time are measured.
    assert!(ch.stages.iter().all(|s| s.occupancy_ns > 0), "{ch:?}");
    // The summary on stderr gives the same totals.
    assert!(run.stderr.contains("stage parse "), "{}", run.stderr);
}

/// A v1.1 guest (no counters) is served through its rings, every event
/// counted: a tiny ring drained slowly makes it wait, never lose one.
#[test]
fn tiny_ring_and_slow_drain_lose_nothing() {
    let (run, json) = boot_staged(
        &["--drain-period-us", "20000"],
        "iters=1000 threads=2 requests=100 ring=4 counters=0",
    );
    assert!(
        run.stdout.contains("4 ring entries, rings)"),
        "{}",
        run.stdout
    );
    assert_counts_equal(&run, &json);
    let ch = channel(&json);
    assert_eq!(ch.mode, "rings");
    assert_eq!(ch.dropped, 0);
    let backoffs = ch.ring_full_backoffs;
    // A 4-entry ring drained every 20 ms must fill up; the guest backs off
    // instead of overwriting, and its own count matches the ring headers.
    assert!(backoffs > 0, "{ch:?}");
    assert_eq!(guest_counts(&run.stdout)[4], backoffs);
    eprintln!("tiny ring: {backoffs} ring-full back-offs");
}

/// A counters guest with a trace on, whose rings are far too small for its
/// events and drained slowly: it never waits, the trace drops are counted
/// by the guest in its ring headers, and what was written is what the VMM
/// drained; the counters still count every switch.
#[test]
fn a_full_trace_ring_drops_and_counts_without_waiting() {
    let (run, json) = boot_staged(
        &["--stage-trace", "on", "--drain-period-us", "20000"],
        "iters=1000 threads=2 requests=300 ring=4",
    );
    assert_counts_equal(&run, &json);
    let ch = channel(&json);
    let [written, dropped, in_headers] = guest_trace(&run.stdout);
    eprintln!("trace on a 4-entry ring: {written} written, {dropped} dropped");
    assert_eq!(ch.trace_every, 1);
    assert_eq!(ch.ring_full_backoffs, 0, "a traced guest never waits");
    assert!(dropped > 0, "{}", run.stdout);
    assert_eq!(dropped, in_headers);
    assert_eq!(ch.trace_dropped, dropped);
    assert_eq!(ch.traced_events, written);
    // Every report was traced or dropped: enters, exits and idle markers.
    let events: u64 = ch.vcpus.iter().map(|v| v.events).sum();
    assert_eq!(written + dropped, events);
    assert_eq!(ch.dropped, 0);
}

/// A complete trace shows the cohorts each vCPU served: under `pinned`
/// with the `cohort` visit policy the test guest's threads of a stage run
/// together, so a stage's cohorts hold more than one thread on average;
/// under FIFO the same guest's cohorts are smaller. Every traced entry is
/// in a cohort (no drop on a ring this size), shown in the summary line.
#[test]
fn a_complete_trace_shows_the_cohorts_each_vcpu_served() {
    let cohorts = |visit: &str| {
        let (run, json) = boot_staged(
            &[
                "--stage-trace",
                "on",
                "--policy",
                "pinned",
                "--visit",
                visit,
            ],
            "iters=1000 threads=4 requests=150 ring=4096",
        );
        let ch = channel(&json).clone();
        assert_eq!(ch.trace_dropped, 0, "{}", run.stdout);
        for st in &ch.stages {
            assert_eq!(st.cohort_entries, st.events, "{st:?}");
            assert!(st.cohorts > 0 && st.cohorts <= st.events, "{st:?}");
        }
        assert!(
            run.stderr.contains("stagevm: cohorts (threads per visit"),
            "{}",
            run.stderr
        );
        let (entries, n) = ch
            .stages
            .iter()
            .fold((0, 0), |(e, n), st| (e + st.cohort_entries, n + st.cohorts));
        entries as f64 / n as f64
    };
    let (cohort, fifo) = (cohorts("cohort"), cohorts("fifo"));
    eprintln!("threads per cohort: {cohort:.2} (cohort), {fifo:.2} (fifo)");
    assert!(
        cohort > 1.5,
        "{cohort:.2} threads per cohort under the cohort policy"
    );
    assert!(cohort > fifo, "{cohort:.2} (cohort) vs {fifo:.2} (fifo)");
}

/// A trace of every 10th event of each kind per vCPU.
#[test]
fn a_sampled_trace_keeps_one_event_in_n() {
    let (run, json) = boot_staged(
        &["--stage-trace", "every=10"],
        "iters=1000 threads=2 requests=500 ring=4096",
    );
    assert_counts_equal(&run, &json);
    let ch = channel(&json);
    let [written, dropped, _] = guest_trace(&run.stdout);
    let events: u64 = ch.vcpus.iter().map(|v| v.events).sum();
    eprintln!("every=10: {written} written, {dropped} dropped of {events} events");
    assert_eq!(ch.traced_events, written);
    assert_eq!(dropped, 0, "a 4096-entry ring holds a tenth");
    // Each kind's count on each vCPU is sampled every 10th: at most one
    // event per (vCPU, kind) more or less than a tenth.
    assert!(
        written.abs_diff(events / 10) <= 2 * 5,
        "{written} of {events}"
    );
}

/// Corrupt ring entries are validated the same way in a counters guest's
/// trace rings and in a v1.1 guest's event rings.
#[test]
fn corrupt_guest_input_is_counted_and_survived() {
    corrupt_input(&["--stage-trace", "on"], "iters=1000 abuse=1 ring=16");
    corrupt_input(&[], "iters=1000 abuse=1 ring=16 counters=0");
}

fn corrupt_input(extra_args: &[&str], cmdline: &str) {
    let (run, json) = boot_staged(extra_args, cmdline);
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
