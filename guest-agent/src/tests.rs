//! Unit tests of the agent against a fake host on a heap-allocated area.

use super::*;
use hypercall_abi::stage::{
    StageEvent, StageMap, VcpuCounters, MAX_STAGES, NUM_CODES, STAGE_MAP_OFFSET,
};
use std::vec::Vec;

std::thread_local! {
    /// The stride of timed visits `register_minor` asks for (1: every visit,
    /// so the fake TSC's ticks add up exactly).
    static TIMED_EVERY_IN_TESTS: core::cell::Cell<u64> = const { core::cell::Cell::new(1) };
    /// The TSC rate the fake host gives at REGISTER (kHz, 0: unknown).
    static TSC_KHZ_IN_TESTS: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
}

/// A host that answers every doorbell with `status` and counts time; with
/// `minor` set, REGISTER publishes a first map of that ABI minor into
/// `area` (every stage on vCPU 0), as the VMM does before it answers.
struct FakeHost {
    status: Status,
    tsc: AtomicU64,
    area: *mut u8,
    minor: Option<u64>,
    /// The TSC rate REGISTER writes into the header (kHz, 0: unknown).
    khz: u64,
    /// Ticks the fake TSC advances per read (0: the test moves it).
    step: AtomicU64,
    /// TSC reads served.
    reads: AtomicU64,
}

impl Platform for FakeHost {
    fn doorbell(&self, port: u16, _value: u32) {
        if let (DOORBELL_REGISTER, Some(minor)) = (port, self.minor) {
            // SAFETY: the test's own page-aligned area, alive while the
            // agent is (see `register`).
            let area = unsafe { core::slice::from_raw_parts_mut(self.area.cast::<Page>(), 1) };
            publish(area, 0, minor);
            let at = core::mem::offset_of!(AreaHeader, tsc_khz);
            area[0].0[at..at + 8].copy_from_slice(&self.khz.to_le_bytes());
        }
    }
    fn doorbell_status(&self) -> u32 {
        self.status as u32
    }
    fn tsc(&self) -> u64 {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.tsc
            .fetch_add(self.step.load(Ordering::Relaxed), Ordering::Relaxed)
    }
}

/// One page of the area (page-aligned storage for `register`).
#[repr(C, align(4096))]
#[derive(Clone, Copy)]
struct Page([u8; 4096]);

fn map(vcpus: [u64; 3]) -> MapSnapshot {
    let mut m = [0u64; MAX_STAGES];
    m[..3].copy_from_slice(&vcpus);
    MapSnapshot {
        epoch: 2,
        vcpus: m,
        owned: 0,
        visit: hypercall_abi::stage::VisitPolicy::Fifo,
    }
}

/// A fresh, zeroed, page-aligned area for `layout`.
fn area(layout: &Layout) -> Vec<Page> {
    std::vec![Page([0; 4096]); (layout.area_size() / 4096) as usize]
}

/// Registers an agent on `area` (laid out by `layout`, with `names` as its
/// stages, counters when `layout.counters`) with a host that answers
/// `status` and, with `minor`, publishes a first map of that ABI minor.
fn register_minor(
    area: &mut [Page],
    layout: &Layout,
    names: &[&str],
    status: Status,
    minor: Option<u64>,
) -> Agent<FakeHost> {
    let host = FakeHost {
        status,
        tsc: AtomicU64::new(100),
        area: area.as_mut_ptr().cast(),
        minor,
        khz: TSC_KHZ_IN_TESTS.with(|t| t.get()),
        step: AtomicU64::new(1),
        reads: AtomicU64::new(0),
    };
    let spec = AreaSpec {
        gpa: 0x10_0000,
        size: layout.area_size(),
        num_vcpus: layout.num_vcpus,
        stage_names: names,
        ring_entries: layout.ring_entries,
        counters: layout.counters,
        timed_every: TIMED_EVERY_IN_TESTS.with(|t| t.get()),
        latency: layout.latency,
    };
    // SAFETY: `area` is our own page-aligned memory of `area_size` bytes;
    // every caller keeps it alive (declared before the agent) and unused
    // otherwise while the agent lives.
    unsafe { Agent::register(host, area.as_mut_ptr().cast(), &spec) }.unwrap()
}

/// [`register_minor`] with a host that publishes no map (a rings-only
/// agent, whatever the layout).
fn register(area: &mut [Page], layout: &Layout, names: &[&str], status: Status) -> Agent<FakeHost> {
    register_minor(area, layout, names, status, None)
}

#[test]
fn choose_keeps_a_serving_vcpu() {
    let m = map([0b011, 0b100, 0]);
    assert_eq!(choose_from_map(&m, 0, 1, &[9, 9, 0]), 1);
}

#[test]
fn choose_takes_the_least_loaded_serving_vcpu() {
    let m = map([0b1110, 0, 0]);
    assert_eq!(choose_from_map(&m, 0, 0, &[0, 5, 2, 2]), 2);
    // Ties go to the lowest index.
    assert_eq!(choose_from_map(&m, 0, 0, &[0, 1, 1, 1]), 1);
}

#[test]
fn choose_stays_when_nobody_serves_or_stage_is_out_of_range() {
    let m = map([0b10, 0, 0]);
    assert_eq!(choose_from_map(&m, 1, 0, &[0, 0]), 0);
    assert_eq!(choose_from_map(&m, MAX_STAGES as u32, 0, &[0, 0]), 0);
    // vCPU 1 serves stage 0 but `loads` only covers vCPU 0.
    assert_eq!(choose_from_map(&m, 0, 0, &[0]), 0);
}

#[test]
fn inactive_agent_is_a_no_op() {
    let a = Agent::inactive(FakeHost {
        status: Status::Ok,
        tsc: AtomicU64::new(0),
        area: core::ptr::null_mut(),
        minor: None,
        khz: 0,
        step: AtomicU64::new(1),
        reads: AtomicU64::new(0),
    });
    assert!(!a.is_active());
    assert_eq!(a.stage_enter(0, 0, 0), Report::Inactive);
    assert_eq!(a.stage_exit(0, 0), Report::Inactive);
    assert_eq!(a.read_map(), None);
    assert!(a.ring_drained(0));
    assert_eq!(a.runq_depth(0), 0);
    assert_eq!(a.wait(10), Status::NotRegistered);
}

#[test]
fn registered_agent_writes_events_and_state() {
    let layout = Layout::new(2, 3, 16).unwrap();
    let mut area = area(&layout);
    let a = register(
        &mut area,
        &layout,
        &["parse", "plan", "execute"],
        Status::Ok,
    );
    let base = area.as_ptr().cast::<u8>();
    assert!(a.is_active());
    assert_eq!(a.read_map(), None, "no map before the host publishes one");
    assert_eq!(a.stage_enter(1, 2, 7), Report::Written { backoffs: 0 });
    assert!(!a.ring_drained(1));
    assert!(a.ring_drained(0));
    // SAFETY: slot 0 of vCPU 1's ring, inside the area.
    let event = unsafe {
        ptr::read_volatile(base.add(layout.slot_offset(1, 0) as usize) as *const StageEvent)
    };
    assert_eq!((event.seq, event.stage, event.thread), (0, 2, 7));
    a.runq_add(1, 2);
    a.runq_add(1, -1);
    assert_eq!(a.runq_depth(1), 1);
    a.set_parked(0, true);
    assert!(a.is_parked(0) && !a.is_parked(1));
    // Out-of-range vCPUs are ignored.
    assert_eq!(a.stage_enter(2, 0, 0), Report::Inactive);
}

#[cfg(feature = "test-hooks")]
#[test]
fn test_hooks_forge_entries() {
    let layout = Layout::new(1, 1, 16).unwrap();
    let mut area = area(&layout);
    let a = register(&mut area, &layout, &["only"], Status::Ok);
    let base = area.as_ptr().cast::<u8>();
    let event = StageEvent {
        seq: 0xdead_beef,
        tsc: 0,
        stage: 0,
        thread: 1,
        reserved: 0,
    };
    assert_eq!(
        a.write_raw_event(0, event, false),
        Report::Written { backoffs: 0 }
    );
    assert_eq!(a.write_raw_event(1, event, true), Report::Inactive);
    // SAFETY: slot 0 of vCPU 0's ring, inside the area.
    let slot = unsafe {
        ptr::read_volatile(base.add(layout.slot_offset(0, 0) as usize) as *const StageEvent)
    };
    assert_eq!(slot.seq, 0xdead_beef, "written as given");
    a.corrupt_head(0, 64);
    assert!(!a.ring_drained(0));
}

#[test]
fn refused_registration_leaves_the_agent_inactive() {
    let layout = Layout::new(1, 1, 16).unwrap();
    let mut area = area(&layout);
    let a = register(&mut area, &layout, &["only"], Status::BadRange);
    assert_eq!(a.status(), Status::BadRange);
    assert!(!a.is_active());
}

/// Writes a stage map as a host of ABI minor `minor` would: epoch 2, every
/// stage on vCPU 0, and `owned` (a v1.0 host leaves owned and minor 0).
fn publish(area: &mut [Page], owned: u64, minor: u64) {
    let map = STAGE_MAP_OFFSET as usize;
    let words: &mut [u8] = &mut area[0].0;
    let mut put = |index: usize, value: u64| {
        words[map + 8 * index..map + 8 * index + 8].copy_from_slice(&value.to_le_bytes());
    };
    put(0, 2);
    for s in 0..MAX_STAGES {
        put(1 + s, 1);
    }
    put(core::mem::offset_of!(StageMap, owned) / 8, owned);
    put(core::mem::offset_of!(StageMap, minor) / 8, minor);
}

#[test]
fn owned_vcpus_are_read_only_from_a_minor_1_host() {
    let layout = Layout::new(2, 2, 8).unwrap();
    let mut mem = area(&layout);
    let agent = register(&mut mem, &layout, &["a", "b"], Status::Ok);
    // A v1.0 host never writes `owned` or `minor`: a stale or forged owned
    // word is ignored and the guest parks as in v1.0.
    publish(&mut mem, 0b11, 0);
    let m = agent.read_map().unwrap();
    assert_eq!((m.epoch, m.vcpus[0], m.owned), (2, 1, 0));
    publish(&mut mem, 0b10, hypercall_abi::stage::ABI_MINOR);
    assert_eq!(agent.read_map().unwrap().owned, 0b10);
}

/// The counter block of `vcpu` in `area`.
fn block(area: &[Page], layout: &Layout, vcpu: u32) -> VcpuCounters {
    // SAFETY: the block lies inside the test's area (layout with counters).
    unsafe {
        ptr::read_volatile(
            area.as_ptr()
                .cast::<u8>()
                .add(layout.counters_offset(vcpu) as usize)
                .cast::<VcpuCounters>(),
        )
    }
}

#[test]
fn a_minor_2_host_gets_counters_and_no_ring_events() {
    use hypercall_abi::stage::{stage_code, state_code, CODE_IDLE, CODE_NONE};
    let layout = Layout::new(2, 3, 8).unwrap().with_counters();
    let mut mem = area(&layout);
    let a = register_minor(&mut mem, &layout, &["p", "q", "r"], Status::Ok, Some(2));
    assert_eq!(a.mode(), Mode::Counters);
    // Registration starts every vCPU in "no stage" at the register TSC.
    let start = block(&mem, &layout, 1);
    assert_eq!(state_code(start.state), CODE_NONE);
    // Far more events than the ring holds: none waits, none reaches a ring.
    for i in 0..100u32 {
        assert_eq!(
            a.stage_enter(1, i % 3, 7),
            Report::Counted { trace: Trace::Off }
        );
    }
    // A stage the area does not declare is refused and counts nothing.
    assert_eq!(a.stage_enter(1, 3, 7), Report::BadStage);
    assert_eq!(a.stage_enter(1, u32::MAX, 7), Report::BadStage);
    assert_eq!(a.stage_exit(1, 7), Report::Counted { trace: Trace::Off });
    assert_eq!(a.vcpu_idle(1), Report::Counted { trace: Trace::Off });
    assert!(a.ring_drained(1));
    a.count_migration(1, 0, 2);
    let c = block(&mem, &layout, 1);
    assert_eq!(c.counts[stage_code(0) as usize], 34);
    assert_eq!(c.counts[stage_code(1) as usize], 33);
    assert_eq!(c.counts[stage_code(2) as usize], 33);
    assert_eq!(c.counts[CODE_NONE as usize], 1, "one request completed");
    assert_eq!(c.counts[CODE_IDLE as usize], 1);
    assert_eq!(state_code(c.state), CODE_IDLE);
    assert_eq!((c.migrations_in[2], c.migrations_out[0]), (1, 1));
    // With every visit timed the fake TSC (one tick per read: 100 at
    // REGISTER, where a timed "no stage" visit starts) is charged whole to
    // the states left, in 128-tick granules; 102 transitions end 102 visits.
    let charged: u64 = c.cycles.iter().sum();
    const REGISTER_TSC: u64 = 100;
    assert_eq!(charged, (c.state & !127) - (REGISTER_TSC & !127));
    assert_eq!(c.timed.iter().sum::<u64>(), 102);
    assert_eq!(a.counters(1), Some(c));
    assert_eq!(block(&mem, &layout, 0).counts, [0; NUM_CODES]);
}

#[test]
fn a_trace_is_sampled_and_lossy() {
    let layout = Layout::new(1, 2, 4).unwrap().with_counters();
    let mut mem = area(&layout);
    let a = register_minor(&mut mem, &layout, &["p", "q"], Status::Ok, Some(2));
    let trace_every = |mem: &mut [Page], every: u64| {
        let at = STAGE_MAP_OFFSET as usize + core::mem::offset_of!(StageMap, trace_every);
        mem[0].0[at..at + 8].copy_from_slice(&every.to_le_bytes());
    };
    trace_every(&mut mem, 1);
    let mut written = 0;
    let mut dropped = 0;
    for _ in 0..10 {
        match a.stage_enter(0, 0, 1) {
            Report::Counted {
                trace: Trace::Written,
            } => written += 1,
            Report::Counted {
                trace: Trace::Dropped,
            } => dropped += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    // Nobody drains: 4 fit, 6 are dropped and counted, none waits.
    assert_eq!((written, dropped), (4, 6));
    assert_eq!(a.trace_dropped(0), 6);
    assert_eq!(a.ring_full_backoffs(0), 0);
    // Every 5th event of a kind (its count), with room again.
    let layout = Layout::new(1, 2, 64).unwrap().with_counters();
    let mut mem = area(&layout);
    let a = register_minor(&mut mem, &layout, &["p", "q"], Status::Ok, Some(2));
    trace_every(&mut mem, 5);
    let traced = (0..20)
        .filter(|_| {
            a.stage_enter(0, 1, 1)
                == Report::Counted {
                    trace: Trace::Written,
                }
        })
        .count();
    assert_eq!(traced, 4);
}

#[test]
fn an_older_host_gets_every_event_in_the_rings() {
    // A counters layout on a minor-1 host (or one that publishes nothing):
    // the agent falls back to the rings, as a v1.1 guest.
    for minor in [Some(1), None] {
        let layout = Layout::new(1, 1, 8).unwrap().with_counters();
        let mut mem = area(&layout);
        let a = register_minor(&mut mem, &layout, &["only"], Status::Ok, minor);
        assert_eq!(a.mode(), Mode::Rings);
        assert_eq!(a.stage_enter(0, 1, 3), Report::BadStage);
        assert!(a.ring_drained(0), "a refused stage writes no event");
        assert_eq!(a.stage_enter(0, 0, 3), Report::Written { backoffs: 0 });
        assert!(!a.ring_drained(0));
        assert_eq!(a.counters(0), None);
        a.count_migration(0, 0, 0);
        assert_eq!(block(&mem, &layout, 0).migrations_in, [0; MAX_STAGES]);
    }
}

#[test]
fn the_default_stride_reads_the_tsc_for_one_visit_in_61() {
    use hypercall_abi::stage::{stage_code, TIMED_EVERY};
    TIMED_EVERY_IN_TESTS.with(|t| t.set(0));
    let layout = Layout::new(1, 2, 8).unwrap().with_counters();
    let mut mem = area(&layout);
    let a = register_minor(&mut mem, &layout, &["p", "q"], Status::Ok, Some(2));
    TIMED_EVERY_IN_TESTS.with(|t| t.set(1));
    assert_eq!(a.timed_every(), TIMED_EVERY);
    let reads_before = a.platform().reads.load(Ordering::Relaxed);
    for i in 0..(61 * 10) {
        a.stage_enter(0, i % 2, 1);
    }
    let reads = a.platform().reads.load(Ordering::Relaxed) - reads_before;
    // The first transition ends REGISTER's timed visit and starts a timed
    // one (a fresh countdown is 0), then one in 61: 10 starts, 11 ends.
    assert_eq!(reads, 20);
    let c = block(&mem, &layout, 0);
    assert_eq!(
        c.counts[stage_code(0) as usize] + c.counts[stage_code(1) as usize],
        610
    );
    assert_eq!(c.timed.iter().sum::<u64>(), 11);
    // Idle visits are always timed.
    a.vcpu_idle(0);
    a.stage_enter(0, 0, 1);
    assert_eq!(
        block(&mem, &layout, 0).timed[hypercall_abi::stage::CODE_IDLE as usize],
        1
    );
}

#[test]
fn paced_timed_visits_follow_the_switch_rate() {
    use hypercall_abi::stage::TIMED_INTERVAL_NS;
    // A 1 GHz TSC: 16,000 ticks between paced timed visits; a transition
    // every 300 ticks: a stride of ~53.
    TIMED_EVERY_IN_TESTS.with(|t| t.set(0));
    TSC_KHZ_IN_TESTS.with(|t| t.set(1_000_000));
    let layout = Layout::new(1, 2, 8).unwrap().with_counters();
    let mut mem = area(&layout);
    let a = register_minor(&mut mem, &layout, &["p", "q"], Status::Ok, Some(2));
    TIMED_EVERY_IN_TESTS.with(|t| t.set(1));
    TSC_KHZ_IN_TESTS.with(|t| t.set(0));
    assert_eq!(a.timed_every(), 0, "paced");
    let host = a.platform();
    host.step.store(0, Ordering::Relaxed);
    let reads0 = host.reads.load(Ordering::Relaxed);
    let n = 100_000u64;
    for i in 0..n {
        host.tsc.fetch_add(300, Ordering::Relaxed);
        a.stage_enter(0, (i % 2) as u32, 1);
    }
    let reads = host.reads.load(Ordering::Relaxed) - reads0;
    // Two reads per paced visit, one paced visit per 16 µs (16,000 ticks
    // at 1 GHz) of 300-tick transitions (the first few at the fixed
    // stride; the jitter adds up to 3 to a stride): within 10 %.
    let want = 2 * n * 300 / (TIMED_INTERVAL_NS * 1_000_000 / 1_000_000);
    assert!(
        reads.abs_diff(want) <= want / 10,
        "{reads} TSC reads, {want} expected"
    );
    let c = block(&mem, &layout, 0);
    let timed: u64 = c.timed.iter().sum();
    assert!(
        timed.abs_diff(want / 2) <= want / 20,
        "{timed} timed visits"
    );
}

mod request_clock;
