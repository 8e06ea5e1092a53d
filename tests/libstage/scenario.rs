//! The main scenario of the libstage test ([`follow_the_map`]), which two
//! tests run: against this host (counters) and an older one (rings).

use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hypercall_abi::stage::{
    stage_code, StageMap, Status, VcpuCounters, ABI_MINOR, CODE_NONE, STAGE_MAP_OFFSET,
};

use crate::common::skip;
use crate::host::{host_vcpus, Host, HostKind, STAGES};
use crate::program::{
    binaries, check_affinity, field, fields, mask_cpus, parse_map, thread_affinities, word_after,
};

/// The main scenario: static map, a map swap between phases, live map flips,
/// corrupt ring entries, exact counts, thread placement, stagectl — against
/// this host (counters; the trace is off for phases 0 and 1, on for the
/// rest, where the corrupt entries go) or an older one (rings).
pub fn follow_the_map(kind: HostKind) {
    let Some(vcpus) = host_vcpus() else {
        return skip("needs CPUs 0 and 1 allowed for this process");
    };
    let mut host = Host::new(vcpus, 256, "static");
    let (threads, iters, work_ns, corrupt) = (4u64, 150u64, 20_000, 5u64);
    let mut c = host.child(
        &[
            "run",
            &threads.to_string(),
            &iters.to_string(),
            &work_ns.to_string(),
            "3",
            &corrupt.to_string(),
        ],
        &[],
    );
    let ready = c.expect("ready");
    assert_eq!(host.map().0, 0, "no map before REGISTER");
    // The guest laid the area out; the doorbell registers it, and the real
    // scheduler's static policy supplies the first map.
    assert_eq!(kind.register(&mut host), Status::Ok);
    let minor = host.map_word(std::mem::offset_of!(StageMap, minor));
    assert_eq!(minor, if kind == HostKind::Old { 1 } else { ABI_MINOR });
    let (epoch_a, map_a) = host.map();
    assert_eq!(epoch_a, 2);
    assert_eq!(map_a.len(), 2);
    assert!(
        map_a.iter().all(|m| *m != 0) && map_a[0] & map_a[1] == 0,
        "static policy: disjoint non-empty stage sets, got {map_a:x?}"
    );
    host.start_draining(Duration::from_millis(1));
    c.send("go");
    let first = c.expect("map");
    assert_eq!(parse_map(&first), (epoch_a, map_a.clone()));
    // libstage chose its mode from this first map.
    assert_eq!(word_after(&first, "mode"), kind.mode(), "{first}");

    // Phase 0 under map A: every thread's last stage was stage 1.
    let done = c.expect("phase 0 done");
    check_affinity(c.child.id(), &done, &mask_cpus(map_a[1]));
    // Map B: the stages swap vCPUs (a host-sched plan, published by the VMM).
    let rev: Vec<usize> = (0..vcpus as usize)
        .map(|k| {
            let a = (0..2).find(|s| map_a[*s] >> k & 1 != 0).unwrap();
            1 - a
        })
        .collect();
    let plan_b = host.plan(&rev);
    host.publish(&plan_b.stage_vcpus, plan_b.owned_vcpus());
    let (epoch_b, map_b) = host.map();
    assert_eq!(map_b, plan_b.stage_vcpus);
    assert_eq!(map_b, vec![map_a[1], map_a[0]]);
    c.send("go");
    assert_eq!(parse_map(&c.expect("map")), (epoch_b, map_b.clone()));

    // Phase 1 under map B.
    let done = c.expect("phase 1 done");
    check_affinity(c.child.id(), &done, &mask_cpus(map_b[1]));
    if kind == HostKind::Counters {
        // Without a trace the counters guest never touched a ring.
        assert_eq!(
            host.ring_heads(),
            vec![0; vcpus as usize],
            "rings without a trace"
        );
        // From now on the host asks for every event in the rings.
        host.dev.set_trace(1);
    }
    // Phase 2: the map flips between A and B every 3 ms while threads run.
    let flipping = Arc::new(AtomicBool::new(true));
    let flips = {
        let (dev, flipping) = (host.dev.clone(), flipping.clone());
        let (a, b) = (map_a.clone(), map_b.clone());
        let old_minor = (kind == HostKind::Old).then_some(host.memfd.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while flipping.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(3));
                dev.publish(
                    if n.is_multiple_of(2) { &a } else { &b },
                    0,
                    hypercall_abi::stage::VisitPolicy::Fifo,
                );
                if let Some(f) = &old_minor {
                    use std::os::unix::fs::FileExt;
                    let at = STAGE_MAP_OFFSET + std::mem::offset_of!(StageMap, minor) as u64;
                    f.write_all_at(&1u64.to_le_bytes(), at).unwrap();
                }
                n += 1;
            }
            n
        })
    };
    c.send("go");
    c.expect("map");
    let done = c.expect("phase 2 done");
    flipping.store(false, Ordering::Release);
    let flips = flips.join().unwrap();
    // Each thread's last enter of stage 1 followed map A or map B.
    let (a1, b1) = (mask_cpus(map_a[1]), mask_cpus(map_b[1]));
    for (tid, set) in thread_affinities(c.child.id(), &done) {
        assert!(
            set == a1 || set == b1,
            "thread {tid}: Cpus_allowed_list {set}"
        );
    }
    c.send("go");
    c.expect("map");

    let count = c.expect("count");
    let corrupt_line = c.expect("corrupt");
    let on0 = fields(&c.expect("vcpus stage0"))["stage0"].clone();
    let on1 = fields(&c.expect("vcpus stage1"))["stage1"].clone();
    let exits_on = fields(&c.expect("vcpus exits"))["exits"].clone();
    let stats = c.expect("stats");
    c.expect("end");
    let report = host.finish();
    // The device's own copy of the counters, after the guest is done.
    let mut blocks: Vec<VcpuCounters> = Vec::new();
    let generation = host.dev.read_counters(&mut blocks);

    // stagectl reads the same area (inherited memfd).
    let ctl = Command::new(&binaries().stagectl)
        .args(["--fd", &host.memfd.as_raw_fd().to_string()])
        .output()
        .unwrap();
    let ctl_out = String::from_utf8_lossy(&ctl.stdout).into_owned();
    assert!(ctl.status.success(), "stagectl: {ctl_out}");

    c.send("exit");
    c.wait_ok();

    let (enter0, enter1, exits) = (
        field(&count, "enter0"),
        field(&count, "enter1"),
        field(&count, "exits"),
    );
    let requests = threads * iters * 3;
    assert_eq!(field(&count, "errors"), 0, "{count}");
    assert_eq!(
        field(&count, "violations"),
        0,
        "switches on vCPUs not serving their stage: {count}"
    );
    assert_eq!(enter0, requests + corrupt);
    assert_eq!((enter1, exits), (requests, requests));
    assert_eq!(report.mode, kind.mode());
    let host_events: Vec<u64> = report.stages.iter().map(|s| s.events).collect();
    assert_eq!(host_events, [enter0, enter1], "per-stage entries, VMM vs C");
    assert_eq!(
        report.vcpus.iter().map(|v| v.exits).sum::<u64>(),
        exits,
        "exits, VMM vs C"
    );
    assert_eq!(report.requests, exits, "requests, VMM vs C");
    // Per vCPU: the switches the VMM counted on each vCPU (its counters, or
    // the valid events of its ring) are the C side's enters and exits there.
    for v in 0..vcpus as usize {
        assert_eq!(
            report.vcpus[v].events,
            on0[v] + on1[v] + exits_on[v],
            "vCPU {v}: VMM switches vs C (stage0 {} stage1 {} exits {})",
            on0[v],
            on1[v],
            exits_on[v]
        );
        assert_eq!(report.vcpus[v].exits, exits_on[v], "vCPU {v} exits");
    }
    assert_eq!(on0.iter().sum::<u64>(), enter0);
    assert_eq!(on1.iter().sum::<u64>(), enter1);
    // The corrupt ring entries (the trace ring of a counters guest):
    // counted, not fatal (valid events after them count).
    assert_eq!(field(&corrupt_line, "bad_seq"), corrupt);
    let bad_seq: u64 = report.vcpus.iter().map(|v| v.dropped_bad_seq).sum();
    let bad_stage: u64 = report.vcpus.iter().map(|v| v.dropped_bad_stage).sum();
    let bad_index: u64 = report.vcpus.iter().map(|v| v.bad_index).sum();
    assert_eq!((bad_seq, bad_stage, bad_index), (corrupt, corrupt, 0));
    assert_eq!(report.dropped, 2 * corrupt);
    let s = fields(&stats);
    assert_eq!(s["dropped"], [0], "{stats}");
    assert_eq!(s["enters"], [enter0, enter1], "{stats}");
    assert!(
        s["affinity_calls"][0] > 0 && s["cpu_changes"][0] > 0,
        "{stats}"
    );
    assert_eq!(s["affinity_failures"], [0], "{stats}");
    let migrations_in: Vec<u64> = report.stages.iter().map(|s| s.migrations_in).collect();
    let migrations_out: Vec<u64> = report.stages.iter().map(|s| s.migrations_out).collect();
    assert!(
        migrations_in.iter().sum::<u64>() > 0,
        "the VMM saw no migrations"
    );
    match kind {
        HostKind::Counters => {
            assert_eq!(s["counters"], [1], "{stats}");
            assert_eq!(report.counter_clamps, 0, "clamped counters: {report:?}");
            // Migrations are counted where threads arrive, exactly.
            assert_eq!(migrations_in, s["migrations_in"], "{stats}");
            assert_eq!(migrations_out, s["migrations_out"], "{stats}");
            // Time: every stage got vCPU time from the sampled visits.
            assert!(s["tsc_reads"][0] > 0, "{stats}");
            for st in &report.stages {
                assert!(st.occupancy_ns > 0, "stage {}: no occupancy", st.name);
            }
            // The trace (phase 2 on): every event either written and
            // drained, or dropped and counted where the host reads it.
            let traced = threads * iters * 3 + corrupt;
            let (written, dropped) = (s["trace_written"][0], s["trace_dropped"][0]);
            assert_eq!(written + dropped, traced, "{stats}");
            assert_eq!(
                report.traced_events, written,
                "trace events drained vs written"
            );
            assert_eq!(report.trace_dropped, dropped, "trace drops, VMM vs C");
            assert_eq!(report.trace_every, 1);
            // The device's read_counters: the raw blocks hold the same.
            assert!(generation.is_some(), "read_counters: no counters area");
            for (v, b) in blocks.iter().enumerate() {
                assert_eq!(
                    [
                        b.counts[stage_code(0) as usize],
                        b.counts[stage_code(1) as usize],
                        b.counts[CODE_NONE as usize]
                    ],
                    [on0[v], on1[v], exits_on[v]],
                    "vCPU {v}'s counter block"
                );
            }
        }
        HostKind::Old => {
            assert_eq!(s["counters"], [0], "{stats}");
            assert_eq!(
                (s["tsc_reads"][0], s["trace_written"][0]),
                (0, 0),
                "{stats}"
            );
            // The old host saw a rings-only area: no counters to read.
            assert_eq!(generation, None);
            assert_eq!(report.traced_events, 0);
        }
    }
    // stagectl shows the names, the last map and, with counters, each
    // vCPU's requests.
    let (epoch_end, map_end) = host.map();
    assert!(
        ctl_out.contains(&format!("stage map epoch {epoch_end}")),
        "{ctl_out}"
    );
    for (s, name) in STAGES.iter().enumerate() {
        assert!(
            ctl_out.contains(name) && ctl_out.contains(&format!("mask {:#x}", map_end[s])),
            "stagectl output lacks stage {s}:\n{ctl_out}"
        );
    }
    assert!(
        ctl_out.contains(&format!("the guest reports through {}", kind.mode())),
        "{ctl_out}"
    );
    if kind == HostKind::Counters {
        assert!(ctl_out.contains("trace every 1 event(s)"), "{ctl_out}");
        for (v, exits) in exits_on.iter().enumerate() {
            let line = ctl_out
                .lines()
                .find(|l| l.starts_with(&format!("  vcpu {v:2} counters: state ")))
                .unwrap_or_else(|| panic!("stagectl: no counters of vCPU {v}:\n{ctl_out}"));
            assert!(
                line.contains(&format!(", requests {exits}, idle 0,")),
                "stagectl: vCPU {v} requests: {line}"
            );
        }
    }
    println!("libstage e2e ({}): {ready}; {count}; {stats}", kind.mode());
    println!(
        "libstage e2e ({}): VMM entries {host_events:?}, requests {}, migrations in {migrations_in:?} \
         out {migrations_out:?}, clamps {}, dropped {} (bad seq {bad_seq}, bad stage {bad_stage}), \
         trace {} drained {} dropped, {flips} live map flips, {} ring-full back-offs",
        kind.mode(),
        report.requests,
        report.counter_clamps,
        report.dropped,
        report.traced_events,
        report.trace_dropped,
        report.ring_full_backoffs
    );
    print!("{ctl_out}");
}
