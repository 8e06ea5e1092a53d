//! Host-side end-to-end test of the Linux guest agent's libstage
//! (`guest-agent/linux/`): the shared area lives in a memfd; the VMM's real
//! [`StageDevice`] registers it at a guest-physical address, the VMM's real
//! stage scheduling ([`StageSched`]: the same `stage-sched` loop, controller,
//! accounting and host-sched policy as in a VM) plans the first map, reads
//! the per-vCPU counters once per policy period (ABI minor 2) or drains the
//! rings (an older host, or a trace), host-sched plans make further map
//! changes, while a C program — several threads using libstage, the code a
//! Linux guest runs — enters stages and migrates between the host's CPUs
//! (standing in for vCPUs: in a guest, CPU i is vCPU i) following the stage
//! map the Rust side publishes. No VM is booted.
//!
//! Checked: with counters, the VMM's per-stage entries, exits (requests),
//! per-vCPU switches and migrations equal the C side's, with zero clamps and
//! zero drops, and the rings stay empty until the host asks for a trace;
//! the trace accounts for every event (written and drained, or dropped and
//! counted); on an older host (a map with minor 1) libstage reports through
//! the rings and the drained events equal the C side's; every switch lands
//! on a vCPU that serves its stage; after each phase every worker thread's
//! `Cpus_allowed_list` is the CPU set of its last stage; corrupt ring
//! entries written on purpose are counted, not fatal; concurrent writers
//! (rseq, own rseq registration, lock transport) lose nothing in either
//! mode; the C layout helpers equal `Layout`, with and without counters and
//! latency blocks; libstage's latency record equals the Rust agent's, and
//! requests it times reach the VMM's histogram with samples = completed
//! requests per vCPU (ABI minor 4);
//! `stagectl` prints the map and the counters. The cost of `stage_enter` is
//! measured and printed.
//!
//! [`StageDevice`]: stage_device::stage::StageDevice
//! [`StageSched`]: stage_device::sched::StageSched

mod common;
// This file is the crate root, so a plain `mod x;` would be looked up in
// tests/ beside the other test targets; the helpers live in tests/libstage/.
#[path = "libstage/host.rs"]
mod host;
#[path = "libstage/program.rs"]
mod program;
#[path = "libstage/request_latency.rs"]
mod request_latency;
#[path = "libstage/scenario.rs"]
mod scenario;

use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use common::skip;
use hypercall_abi::stage::{state_code, Layout, Status, VcpuCounters, CODE_NONE, NUM_CODES};

use host::{host_vcpus, Host, HostKind};
use program::{binaries, field, fields, word_after};
use scenario::follow_the_map;

/// One test at a time: the children compete for the 2 CPUs, and the bench
/// must not measure another test.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn c_layout_helpers_match_rust_layout() {
    let _serial = serial();
    for (v, s, e) in [
        (1, 1, 2),
        (1, 3, 256),
        (2, 2, 256),
        (3, 5, 1024),
        (8, 3, 2),
        (64, 16, 65536),
        (0, 2, 256),
        (2, 17, 256),
        (2, 2, 100),
        (65, 1, 4),
    ] {
        let out = Command::new(&binaries().e2e)
            .args(["layout", &v.to_string(), &s.to_string(), &e.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let Some(l) = Layout::new(v, s, e) else {
            assert_eq!(text.trim(), "invalid", "({v}, {s}, {e})");
            continue;
        };
        let mut expect = vec![
            format!("ring_bytes {}", l.ring_bytes()),
            format!("used_bytes {}", l.used_bytes()),
            format!("area_size {}", l.area_size()),
        ];
        expect.extend((0..=v).map(|i| format!("ring_offset {i} {}", l.ring_offset(i))));
        for i in 0..v {
            expect.push(format!(
                "vcpu_state_offset {i} {}",
                Layout::vcpu_state_offset(i)
            ));
            expect.push(format!("slot_offset {i} 0 {}", l.slot_offset(i, 0)));
            let idx = u64::from(e) + 3;
            expect.push(format!("slot_offset {i} {idx} {}", l.slot_offset(i, idx)));
        }
        // Minor 2: the counter blocks after the rings (128-byte aligned).
        let c = l.with_counters();
        expect.push(format!("counters used_bytes {}", c.used_bytes()));
        expect.push(format!("counters area_size {}", c.area_size()));
        expect.extend((0..=v).map(|i| format!("counters_offset {i} {}", c.counters_offset(i))));
        // Minor 4: the latency blocks after the counters.
        let lat = l.with_latency();
        expect.push(format!("latency used_bytes {}", lat.used_bytes()));
        expect.push(format!("latency area_size {}", lat.area_size()));
        expect.extend((0..=v).map(|i| format!("latency_offset {i} {}", lat.latency_offset(i))));
        assert_eq!(text.lines().collect::<Vec<_>>(), expect, "({v}, {s}, {e})");
    }
}

/// The main scenario on this host: libstage reports through the counters,
/// and the VMM's figures, from its counter reads, equal the C program's.
#[test]
fn libstage_threads_follow_the_map_and_counts_match() {
    let _serial = serial();
    follow_the_map(HostKind::Counters);
}

/// The main scenario on a v1.1 host (a map with minor 1): libstage falls
/// back to the rings, and the events the VMM drains equal the C program's.
#[test]
fn older_host_makes_libstage_fall_back_to_the_rings() {
    let _serial = serial();
    follow_the_map(HostKind::Old);
}

/// Many threads per CPU reporting through one counter block (or ring) per
/// CPU, preempted at random: nothing is lost or torn, with rseq (glibc's
/// registration and libstage's own) and with the lock transport, through
/// the counters and through the rings of an older host.
///
/// With counters every visit is timed (`STAGE_TIMED_EVERY=1`): each
/// transition into a code starts one visit of it, and ends exactly the
/// visit whose state word it replaced. So per block and code, the ended
/// visits (`timed`) are the entries (`counts`, plus the "none" visit every
/// block starts in) minus the visit still open — only if no two writers
/// ever replaced the same state word (the compare-and-store: a writer that
/// replaced a state it read before another thread replaced it would end
/// that visit twice and lose the other). The counts are exact only if no
/// add was lost. Every event is also traced into small rings, so the trace
/// too must account for every event.
#[test]
fn concurrent_writers_lose_nothing() {
    let _serial = serial();
    let Some(vcpus) = host_vcpus() else {
        return skip("needs CPUs 0 and 1 allowed for this process");
    };
    for kind in [HostKind::Counters, HostKind::Old] {
        for (what, env) in [
            ("rseq", vec![]),
            ("own rseq", vec![("GLIBC_TUNABLES", "glibc.pthread.rseq=0")]),
            ("lock", vec![("STAGE_TRANSPORT", "lock")]),
        ] {
            let mut host = Host::new(vcpus, 64, "off");
            // Long enough to span many scheduler slices per thread (a
            // counters switch costs ~10 ns; a ring of 64 makes the rings
            // wait for the host).
            let threads = 8u64;
            let iters = if kind == HostKind::Counters {
                200_000u64
            } else {
                4000
            };
            let mut env = env;
            if kind == HostKind::Counters {
                env.push(("STAGE_TIMED_EVERY", "1"));
            }
            let mut c = host.child(
                &[
                    "run",
                    &threads.to_string(),
                    &iters.to_string(),
                    "0",
                    "1",
                    "0",
                ],
                &env,
            );
            let ready = c.expect("ready");
            let expect_transport = match what {
                "rseq" => "ready transport rseq",
                "own rseq" => "ready transport rseq (own registration)",
                _ => "ready transport lock",
            };
            assert_eq!(ready, expect_transport);
            assert_eq!(kind.register(&mut host), Status::Ok);
            if kind == HostKind::Counters {
                host.dev.set_trace(1);
            }
            host.start_draining(Duration::from_micros(200));
            c.send("go");
            let map = c.expect("map");
            assert_eq!(word_after(&map, "mode"), kind.mode(), "{what}: {map}");
            c.expect("phase 0 done");
            c.send("go");
            c.expect("map");
            let count = c.expect("count");
            c.expect("corrupt");
            let mut per_vcpu = vec![0u64; vcpus as usize];
            for _ in 0..3 {
                let l = c.expect("vcpus");
                for (v, n) in fields(&l).into_values().next().unwrap().iter().enumerate() {
                    per_vcpu[v] += n;
                }
            }
            let stats = c.expect("stats");
            c.expect("end");
            let report = host.finish();
            let mut blocks: Vec<VcpuCounters> = Vec::new();
            host.dev.read_counters(&mut blocks);
            c.send("exit");
            c.wait_ok();
            let n = threads * iters;
            let label = format!("{} {what}", kind.mode());
            assert_eq!(
                [
                    field(&count, "enter0"),
                    field(&count, "enter1"),
                    field(&count, "exits")
                ],
                [n, n, n],
                "{label}: {count}"
            );
            let host_events: Vec<u64> = report.stages.iter().map(|s| s.events).collect();
            assert_eq!(host_events, [n, n], "{label}: per-stage entries, VMM vs C");
            assert_eq!(
                report.vcpus.iter().map(|v| v.exits).sum::<u64>(),
                n,
                "{label}"
            );
            let vmm_per_vcpu: Vec<u64> = report.vcpus.iter().map(|v| v.events).collect();
            assert_eq!(
                vmm_per_vcpu, per_vcpu,
                "{label}: per-vCPU switches, VMM vs C"
            );
            assert_eq!(report.dropped, 0, "{label}: {report:?}");
            let s = fields(&stats);
            assert_eq!(s["dropped"], [0], "{label}: {stats}");
            // "off": every vCPU serves every stage, so no migration is needed.
            assert_eq!(s["affinity_calls"], [0], "{label}: {stats}");
            let trace = if kind == HostKind::Counters {
                assert_eq!(report.counter_clamps, 0, "{label}: {report:?}");
                for (v, b) in blocks.iter().enumerate() {
                    assert_eq!(
                        b.counts.iter().sum::<u64>(),
                        per_vcpu[v],
                        "{label}: vCPU {v}"
                    );
                    let open = state_code(b.state) as usize;
                    let ended: Vec<u64> = (0..NUM_CODES)
                        .map(|c| {
                            b.counts[c] + u64::from(c == CODE_NONE as usize) - u64::from(c == open)
                        })
                        .collect();
                    assert_eq!(
                        b.timed.to_vec(),
                        ended,
                        "{label}: vCPU {v}: timed visits per code (stride 1) vs entries"
                    );
                }
                let (written, dropped) = (s["trace_written"][0], s["trace_dropped"][0]);
                assert_eq!(written + dropped, 3 * n, "{label}: {stats}");
                assert_eq!(
                    report.traced_events, written,
                    "{label}: trace drained vs written"
                );
                assert_eq!(
                    report.trace_dropped, dropped,
                    "{label}: trace drops, VMM vs C"
                );
                format!(
                    "trace {written} written, {dropped} dropped; {} state retries, {} rseq aborts",
                    s["state_retries"][0], s["rseq_aborts"][0]
                )
            } else {
                format!("ring-full back-offs {}", report.ring_full_backoffs)
            };
            println!(
                "libstage {label}: {n} requests from {threads} threads, 0 lost; {trace}; {stats}"
            );
        }
    }
}

/// libstage's latency record path equals the Rust agent's
/// `VcpuLatency::record` on the same latencies (ABI minor 4).
#[test]
fn libstage_latency_histogram_equals_the_rust_agents() {
    let _serial = serial();
    request_latency::histogram_equals_the_rust_agents();
}

/// Requests timed end to end through the VMM's stage device: samples equal
/// completed requests per vCPU, no clamp, latencies at least the work; none
/// timed without latency blocks or on a minor-3 host.
#[test]
fn libstage_times_requests_through_the_stage_device() {
    let _serial = serial();
    request_latency::requests_are_timed_through_the_device();
}

/// Cost of stage_enter / stage_exit without migration (an empty call loop
/// as the baseline) and with migration, printed for the record: through
/// the counters (this host), and through the rings (an area laid out
/// without counters, `STAGEVM_COUNTERS=0`) with the module's default ring
/// (256 entries: the batch between two drains stays in the L1 cache) and
/// with a 4096-entry ring (64 KiB per batch).
#[test]
fn stage_enter_cost() {
    let _serial = serial();
    let Some(vcpus) = host_vcpus() else {
        return skip("needs CPUs 0 and 1 allowed for this process");
    };
    for (mode, ring, batches) in [
        ("counters", 256, 2000),
        ("rings", 256, 2000),
        ("rings", 4096, 200),
    ] {
        let mut host = Host::new(vcpus, ring, "off");
        let env = if mode == "rings" {
            vec![("STAGEVM_COUNTERS", "0")]
        } else {
            vec![]
        };
        let mut c = host.child(&["bench", &batches.to_string()], &env);
        c.expect("ready");
        assert_eq!(host.register(), Status::Ok);
        host.start_draining(Duration::from_micros(100));
        c.send("go");
        c.expect("migrate ready");
        // Stage 0 and stage 1 on different vCPUs: every enter migrates.
        let plan = host.plan(&(0..vcpus as usize).map(|k| k % 2).collect::<Vec<_>>());
        host.publish(&plan.stage_vcpus, plan.owned_vcpus());
        c.send("go");
        let bench = c.expect("bench");
        c.expect("end");
        let report = host.finish();
        c.send("exit");
        c.wait_ok();
        let f = |k: &str| -> f64 { word_after(&bench, k).parse().unwrap() };
        let (empty, enter, exit, migrate) =
            (f("empty_ns"), f("enter_ns"), f("exit_ns"), f("migrate_ns"));
        println!(
            "stage_enter cost ({mode}, {ring}-entry ring): {:.1} ns per call without migration \
             ({enter:.1} ns loop vs {empty:.1} ns empty call), stage_exit {:.1} ns; \
             stage_enter with migration {:.1} µs",
            enter - empty,
            exit - empty,
            migrate / 1e3
        );
        println!("libstage bench: {bench}");
        assert_eq!(report.mode, mode);
        assert_eq!(f("counters"), if mode == "counters" { 1.0 } else { 0.0 });
        assert_eq!(report.dropped, 0);
        assert_eq!(report.counter_clamps, 0);
        assert_eq!(f("batch"), f64::from(ring / 2));
        // Every switch the bench made is in the VMM's figures.
        let host_events: Vec<u64> = report.stages.iter().map(|s| s.events).collect();
        assert_eq!(
            host_events,
            [f("enters0") as u64, f("enters1") as u64],
            "{bench}"
        );
        assert_eq!(report.requests, f("exits") as u64, "{bench}");
        // The cost is printed, not asserted (a benchmark figure on a shared
        // machine). The hot path's behaviour is: only the 400 migrating
        // enters (and the first one) changed affinity.
        let calls = f("affinity_calls");
        assert!((400.0..=401.0).contains(&calls), "{bench}");
    }
}
