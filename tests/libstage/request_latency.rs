//! Requests and their latency histograms (ABI minor 4) in libstage: the
//! record path against the Rust agent's ([`histogram_equals_the_rust_agents`])
//! and requests timed end to end through the VMM's stage device
//! ([`requests_are_timed_through_the_device`]).

use std::time::{Duration, Instant};

use hypercall_abi::stage::{
    latency_bucket, latency_bucket_lower_ns, Layout, Status, VcpuLatency, AREA_FLAG_COUNTERS,
    AREA_FLAG_LATENCY, CODE_NONE, LATENCY_BUCKETS,
};
use stage_device::sched::latency_reader::LatencyReader;
use stage_device::stage::{host_tsc, Blocks};

use crate::common::skip;
use crate::host::{host_vcpus, Host, STAGES};
use crate::program::{field, fields, word_after};

/// The latencies recorded: bucket edges and their neighbours, powers of two
/// and theirs, 1 s, 300 s (past the last bucket's lower bound) and the
/// extremes (the sum wraps on both sides alike).
fn samples() -> Vec<u64> {
    let mut v = vec![0, 1, 15, 16, 17, 127, 128, 129, 143, 144, 1000];
    for k in 4..=40 {
        let p = 1u64 << k;
        v.extend([p - 1, p, p + 1]);
    }
    v.extend([
        999_999_999,
        1_000_000_000,
        300_000_000_000,
        latency_bucket_lower_ns(LATENCY_BUCKETS - 1),
        u64::MAX >> 1,
        u64::MAX,
    ]);
    v
}

/// libstage's record path (the one `stage_exit` takes for a timed request,
/// through `stage__test_record_latency`) leaves vCPU 0's block of a memfd
/// area exactly as the Rust agent's `VcpuLatency::record` does for the same
/// latencies: samples, sum and every bucket; the guest-private words stay
/// 0, and the buckets C returned are Rust's `latency_bucket`.
pub fn histogram_equals_the_rust_agents() {
    let vcpus = host_vcpus().unwrap_or(1).max(1);
    let host = Host::with_latency(vcpus, 256, "off", 0);
    let ns = samples();
    let args: Vec<String> = std::iter::once("latency".to_string())
        .chain(ns.iter().map(u64::to_string))
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = host.command(&args, &[]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "e2e latency: {text}");
    // libstage laid the area out (fd mode) with the latency blocks.
    assert_eq!(
        host.header_flags(),
        AREA_FLAG_COUNTERS | AREA_FLAG_LATENCY,
        "{text}"
    );
    let line = text.lines().next().unwrap();
    assert!(line.starts_with("buckets"), "{text}");
    let c_buckets: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|b| b.parse().unwrap())
        .collect();
    let rust_buckets: Vec<u64> = ns.iter().map(|n| latency_bucket(*n) as u64).collect();
    assert_eq!(c_buckets, rust_buckets, "buckets, C vs Rust");
    let mut expect = VcpuLatency::default();
    for n in &ns {
        expect.record(*n);
    }
    let layout = Layout::new(vcpus, STAGES.len() as u32, 256)
        .unwrap()
        .with_latency();
    let got = host.read_latency(&layout, 0);
    assert_eq!(
        (got.samples, got.sum_ns),
        (expect.samples, expect.sum_ns),
        "samples and sum, C vs Rust"
    );
    for (b, (g, e)) in got.buckets.iter().zip(expect.buckets.iter()).enumerate() {
        assert_eq!(g, e, "bucket {b} (from {} ns)", latency_bucket_lower_ns(b));
    }
    assert_eq!(got, expect, "the whole block, C vs Rust");
    // The other vCPUs' blocks are untouched.
    for v in 1..vcpus {
        assert_eq!(host.read_latency(&layout, v), VcpuLatency::default());
    }
    println!(
        "libstage latency record = VcpuLatency::record over {} latencies ({} buckets used, sum {})",
        ns.len(),
        got.buckets.iter().filter(|n| **n > 0).count(),
        got.sum_ns
    );
}

/// The host's TSC rate (kHz), measured against the monotonic clock over
/// 100 ms (the VMM gets it from KVM; here the device hands it to the
/// guest).
fn tsc_khz() -> u64 {
    let (t0, i0) = (host_tsc(), Instant::now());
    std::thread::sleep(Duration::from_millis(100));
    let (t1, i1) = (host_tsc(), Instant::now());
    let us = i1.duration_since(i0).as_micros().max(1);
    (u128::from(t1 - t0) * 1000 / us) as u64
}

/// What the guest looks like to the device in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Guest {
    /// A minor-4 guest on this host: every request timed.
    Timed,
    /// `STAGEVM_LATENCY=0`: a minor-3 guest, no latency blocks.
    NoBlocks,
    /// The blocks laid out, but the map says minor 3 (an older host).
    OldHost,
}

/// Requests through the VMM's real stage device and stage scheduling: 4
/// threads run requests (enter 0, work, enter 1, work, exit), begun by
/// their first `stage_enter`, by `stage_request_begin()` and by
/// `stage_request_begin_at(2 ms ago)` in turn, with `STAGE_TIMED_EVERY=1`.
/// With latency blocks on a minor-4 host that gave the TSC rate every
/// request is timed, and per vCPU the samples in the device's latency
/// blocks equal the completed requests in its counter blocks (the C
/// program's exits there); the VMM's report holds them all with no clamp;
/// no latency is shorter than the work done, and the requests begun 2 ms
/// early are at least 2 ms long. Without the blocks (`STAGEVM_LATENCY=0`)
/// or on a minor-3 host no request is timed.
pub fn requests_are_timed_through_the_device() {
    let Some(vcpus) = host_vcpus() else {
        return skip("needs CPUs 0 and 1 allowed for this process");
    };
    let khz = tsc_khz();
    let (threads, iters, work_ns, age_us) = (4u64, 300u64, 20_000u64, 2000u64);
    for guest in [Guest::Timed, Guest::NoBlocks, Guest::OldHost] {
        let mut host = Host::with_latency(vcpus, 256, "off", khz);
        let mut env = vec![("STAGE_TIMED_EVERY", "1")];
        if guest == Guest::NoBlocks {
            env.push(("STAGEVM_LATENCY", "0"));
        }
        let mut c = host.child(
            &[
                "requests",
                &threads.to_string(),
                &iters.to_string(),
                &work_ns.to_string(),
                &age_us.to_string(),
            ],
            &env,
        );
        c.expect("ready");
        assert_eq!(host.register(), Status::Ok);
        let flags = host.header_flags();
        if guest == Guest::OldHost {
            host.set_map_minor(3);
        }
        host.start_draining(Duration::from_millis(1));
        c.send("go");
        let map = c.expect("map");
        assert_eq!(word_after(&map, "mode"), "counters", "{guest:?}: {map}");
        let req = c.expect("requests");
        let exits_on = fields(&c.expect("vcpus exits"))["exits"].clone();
        let stats = c.expect("stats");
        c.expect("end");
        let report = host.finish();
        let mut blocks = Blocks::default();
        host.dev.read_blocks(&mut blocks).expect("a counters area");
        c.send("exit");
        c.wait_ok();

        let total = threads * iters;
        let label = format!("{guest:?}: {req}; {stats}");
        assert_eq!(
            (field(&req, "total"), field(&req, "errors")),
            (total, 0),
            "{label}"
        );
        assert_eq!(field(&stats, "requests"), total, "{label}");
        assert_eq!(field(&stats, "exits"), total, "{label}");
        assert_eq!(report.requests, total, "{label}");
        assert_eq!(report.counter_clamps, 0, "{label}");
        let done: Vec<u64> = blocks
            .counters
            .iter()
            .map(|b| b.counts[CODE_NONE as usize])
            .collect();
        assert_eq!(done, exits_on, "{label}: completed requests per vCPU");
        if guest != Guest::Timed {
            assert_eq!(field(&stats, "latency"), 0, "{label}");
            assert_eq!(field(&stats, "requests_timed"), 0, "{label}");
            assert_eq!(field(&req, "timed_begins"), 0, "{label}");
            assert!(
                report.latency.as_ref().is_none_or(|l| l.samples == 0),
                "{label}: {:?}",
                report.latency
            );
            if guest == Guest::NoBlocks {
                assert_eq!(flags, AREA_FLAG_COUNTERS, "{label}");
                assert!(blocks.latency.is_empty(), "{label}");
            } else {
                assert_eq!(flags, AREA_FLAG_COUNTERS | AREA_FLAG_LATENCY, "{label}");
                assert!(
                    blocks.latency.iter().all(|b| *b == VcpuLatency::default()),
                    "{label}: a minor-3 host's blocks stay untouched"
                );
            }
            println!("libstage requests ({guest:?}): {total} requests, none timed; {stats}");
            continue;
        }
        assert_eq!(flags, AREA_FLAG_COUNTERS | AREA_FLAG_LATENCY, "{label}");
        assert_eq!(field(&stats, "latency"), 1, "{label}");
        // STAGE_TIMED_EVERY=1: every request timed, at its begin and its end.
        assert_eq!(field(&req, "timed_begins"), 2 * total / 3, "{label}");
        assert_eq!(field(&stats, "requests_timed"), total, "{label}");
        // Per vCPU: samples = completed requests, the buckets add up.
        assert_eq!(blocks.latency.len(), vcpus as usize, "{label}");
        for (v, b) in blocks.latency.iter().enumerate() {
            assert_eq!(b.samples, done[v], "{label}: vCPU {v} samples vs requests");
            assert_eq!(
                b.buckets.iter().sum::<u64>(),
                b.samples,
                "{label}: vCPU {v}"
            );
        }
        let (h, clamps) = LatencyReader::new(vcpus).update(&blocks.latency, &done);
        assert_eq!(clamps, vec![0; vcpus as usize], "{label}");
        assert_eq!(h.count(), total, "{label}");
        let lat = report.latency.as_ref().expect("the report's latency");
        assert_eq!((lat.samples, lat.clamps), (total, 0), "{label}: {lat:?}");
        assert_eq!(lat.sum_ns, h.sum_ns(), "{label}");
        // No latency shorter than the work (2 x work_ns of spinning, with
        // 2 % for the TSC rate measured here): no sample in a bucket that
        // ends at or below it; and the aged third at least age_us long: as
        // many samples in buckets that reach past it.
        let floor = 2 * work_ns * 98 / 100;
        let aged_floor = age_us * 1000 * 98 / 100;
        let buckets = h.buckets();
        let below: u64 = (0..LATENCY_BUCKETS)
            .filter(|b| latency_bucket_lower_ns(b + 1) <= floor)
            .map(|b| buckets[b])
            .sum();
        assert_eq!(below, 0, "{label}: latencies shorter than the work");
        let at_least_aged: u64 = (0..LATENCY_BUCKETS)
            .filter(|b| latency_bucket_lower_ns(b + 1) > aged_floor)
            .map(|b| buckets[b])
            .sum();
        let aged = field(&req, "aged");
        assert!(
            at_least_aged >= aged,
            "{label}: {at_least_aged} latencies of at least {aged_floor} ns, {aged} begun {age_us} µs early"
        );
        assert!(
            h.sum_ns() >= total * floor + aged * aged_floor,
            "{label}: sum {}",
            h.sum_ns()
        );
        println!(
            "libstage requests ({guest:?}, TSC {khz} kHz): {total} requests, {} timed, clamps 0; \
             p50 {:.1} µs, p99 {:.1} µs, mean {:.1} µs; {stats}",
            lat.samples, lat.p50_us, lat.p99_us, lat.mean_us
        );
    }
}
