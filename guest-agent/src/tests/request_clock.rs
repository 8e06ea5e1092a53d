//! Requests with a start and an end (ABI minor 4): the agent's timed
//! requests and its histograms, against the fake host.

use super::*;
use hypercall_abi::stage::{latency_bucket, VcpuLatency, CODE_NONE};

/// The latency block of `vcpu` in `area`.
fn histogram(area: &[Page], layout: &Layout, vcpu: u32) -> VcpuLatency {
    // SAFETY: the block lies inside the test's area (layout with latency).
    unsafe {
        ptr::read_volatile(
            area.as_ptr()
                .cast::<u8>()
                .add(layout.latency_offset(vcpu) as usize)
                .cast::<VcpuLatency>(),
        )
    }
}

/// An agent on a 1 GHz TSC (1 tick = 1 ns) with a host of ABI `minor`,
/// timing one request in `every`; the fake TSC moves only when the test
/// moves it.
fn agent(mem: &mut [Page], layout: &Layout, minor: u64, every: u64) -> Agent<FakeHost> {
    TIMED_EVERY_IN_TESTS.with(|t| t.set(every));
    TSC_KHZ_IN_TESTS.with(|t| t.set(1_000_000));
    let a = register_minor(mem, layout, &["p", "q"], Status::Ok, Some(minor));
    TIMED_EVERY_IN_TESTS.with(|t| t.set(1));
    TSC_KHZ_IN_TESTS.with(|t| t.set(0));
    a.platform().step.store(0, Ordering::Relaxed);
    a
}

#[test]
fn a_timed_request_lands_in_the_bucket_of_its_latency_on_the_vcpu_it_ends_on() {
    let layout = Layout::new(2, 2, 8).unwrap().with_latency();
    let mut mem = area(&layout);
    let a = agent(&mut mem, &layout, 4, 1);
    assert!(a.latency_active());
    let tsc = &a.platform().tsc;
    let mut clock = RequestClock::new();
    // Begun on vCPU 0, ended on vCPU 1 after 5,000 ns.
    a.request_begin(0, &mut clock, None);
    assert!(clock.timed_start().is_some());
    a.stage_enter_request(0, 0, 7, &mut clock);
    tsc.fetch_add(3_000, Ordering::Relaxed);
    a.stage_enter_request(1, 1, 7, &mut clock);
    tsc.fetch_add(2_000, Ordering::Relaxed);
    let (report, ns) = a.stage_exit_request(1, 7, &mut clock);
    assert_eq!(report, Report::Counted { trace: Trace::Off });
    assert_eq!(ns, Some(5_000));
    assert!(!clock.is_open());
    let h = histogram(&mem, &layout, 1);
    assert_eq!((h.samples, h.sum_ns), (1, 5_000));
    assert_eq!(h.buckets[latency_bucket(5_000)], 1);
    assert_eq!(h.buckets.iter().sum::<u64>(), 1);
    assert_eq!(a.latency(1), Some(h));
    assert_eq!(histogram(&mem, &layout, 0).samples, 0);
    // The request also counts as completed where it ended.
    assert_eq!(a.counters(1).unwrap().counts[CODE_NONE as usize], 1);
}

#[test]
fn one_request_in_the_stride_is_timed_and_only_it_reads_the_tsc() {
    let layout = Layout::new(1, 2, 8).unwrap().with_latency();
    let mut mem = area(&layout);
    let a = agent(&mut mem, &layout, 4, 5);
    let host = a.platform();
    let mut timed = 0;
    for _ in 0..100 {
        let mut clock = RequestClock::new();
        let before = host.reads.load(Ordering::Relaxed);
        a.request_begin(0, &mut clock, None);
        let read = host.reads.load(Ordering::Relaxed) - before;
        assert_eq!(read, u64::from(clock.timed_start().is_some()));
        timed += u64::from(clock.timed_start().is_some());
        host.tsc.fetch_add(1_000, Ordering::Relaxed);
        a.stage_exit_request(0, 1, &mut clock);
    }
    assert_eq!(timed, 20);
    let h = histogram(&mem, &layout, 0);
    assert_eq!((h.samples, h.buckets[latency_bucket(1_000)]), (20, 20));
}

#[test]
fn an_arrival_tsc_starts_the_request_and_a_guest_that_never_begins_starts_at_its_first_entry() {
    let layout = Layout::new(1, 2, 8).unwrap().with_latency();
    let mut mem = area(&layout);
    let a = agent(&mut mem, &layout, 4, 1);
    let tsc = &a.platform().tsc;
    tsc.fetch_add(1_000_000, Ordering::Relaxed);
    let now = tsc.load(Ordering::Relaxed);
    // An open-loop arrival 40 µs ago.
    let mut clock = RequestClock::new();
    a.request_begin(0, &mut clock, Some(now - 40_000));
    tsc.fetch_add(10_000, Ordering::Relaxed);
    assert_eq!(a.stage_exit_request(0, 1, &mut clock).1, Some(50_000));
    // No begin: the first stage entry starts it, the second does not.
    a.stage_enter_request(0, 0, 1, &mut clock);
    tsc.fetch_add(700, Ordering::Relaxed);
    a.stage_enter_request(0, 1, 1, &mut clock);
    tsc.fetch_add(300, Ordering::Relaxed);
    assert_eq!(a.stage_exit_request(0, 1, &mut clock).1, Some(1_000));
    assert_eq!(histogram(&mem, &layout, 0).sum_ns, 51_000);
    // The clock round-trips through one word.
    for c in [
        RequestClock::new(),
        RequestClock::from_raw(u64::MAX),
        RequestClock::from_raw(12_345),
    ] {
        assert_eq!(RequestClock::from_raw(c.to_raw()), c);
    }
    assert!(RequestClock::from_raw(u64::MAX).is_open());
    assert_eq!(RequestClock::from_raw(7).timed_start(), Some(7));
}

#[test]
fn an_older_host_or_layout_times_no_request() {
    // A minor-3 host: counters, no latency.
    let layout = Layout::new(1, 2, 8).unwrap().with_latency();
    let mut mem = area(&layout);
    let a = agent(&mut mem, &layout, 3, 1);
    assert_eq!(a.mode(), Mode::Counters);
    assert!(!a.latency_active());
    let mut clock = RequestClock::new();
    a.request_begin(0, &mut clock, None);
    assert!(clock.is_open() && clock.timed_start().is_none());
    assert_eq!(a.stage_exit_request(0, 1, &mut clock).1, None);
    assert_eq!(histogram(&mem, &layout, 0), VcpuLatency::default());
    assert_eq!(a.counters(0).unwrap().counts[CODE_NONE as usize], 1);
    // A minor-4 host but an area without latency blocks.
    let layout = Layout::new(1, 2, 8).unwrap().with_counters();
    let mut mem = area(&layout);
    let a = agent(&mut mem, &layout, 4, 1);
    assert!(!a.latency_active());
    assert_eq!(a.latency(0), None);
}

#[test]
fn timed_requests_are_paced_to_one_per_16_us_per_vcpu() {
    // A 1 GHz TSC: 16,000 ticks between timed requests.
    for (gap, want_min, want_max) in [
        (50_000u64, 0.99, 1.0),
        (4_000, 0.12, 0.3),
        (160, 0.005, 0.02),
    ] {
        let layout = Layout::new(1, 2, 8).unwrap().with_latency();
        let mut mem = area(&layout);
        let a = agent(&mut mem, &layout, 4, 0);
        assert_eq!(a.timed_every(), 0, "paced");
        let tsc = &a.platform().tsc;
        let n = 20_000u64;
        for _ in 0..n {
            let mut clock = RequestClock::new();
            a.request_begin(0, &mut clock, None);
            a.stage_enter_request(0, 0, 1, &mut clock);
            // Half the gap in the request, the other half before the next.
            tsc.fetch_add(gap / 2, Ordering::Relaxed);
            a.stage_exit_request(0, 1, &mut clock);
            tsc.fetch_add(gap - gap / 2, Ordering::Relaxed);
        }
        let timed = histogram(&mem, &layout, 0).samples as f64 / n as f64;
        assert!(
            (want_min..=want_max).contains(&timed),
            "a request every {gap} ticks: {timed} timed"
        );
    }
}
