//! Unit and property tests of the stage device with the real guest agent.

use super::*;
use guest_agent::{Agent, AreaSpec, Platform};
use hypercall_abi::stage::{RingHeader, StageEvent, DOORBELL_STATUS};
use proptest::prelude::*;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use vm_memory::GuestMemoryBackend;

use crate::sched::Accounting;

const MEM: u64 = 4 << 20;
const AREA: u64 = 1 << 20;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap()
}

/// A device of 2 vCPUs over `mem` with a counters area of 3 stages and
/// `ring_entries` entries laid out (not yet registered) at [`AREA`].
fn counters_device(mem: &GuestMemoryMmap, ring_entries: u32) -> (Layout, StageDevice) {
    let layout = Layout::new(2, 3, ring_entries).unwrap().with_latency();
    mem.write_obj(Obj(layout.header()), GuestAddress(AREA))
        .unwrap();
    (
        layout,
        StageDevice::new(std::sync::Arc::new(mem.clone()), MEM, 2, 0, 0),
    )
}

fn register(dev: &StageDevice) -> Status {
    dev.doorbell(0, DOORBELL_REGISTER, &((AREA >> 12) as u32).to_le_bytes());
    let mut st = [0u8; 4];
    dev.read_status(0, DOORBELL_STATUS, &mut st);
    Status::from_u32(u32::from_le_bytes(st)).unwrap()
}

/// The real guest agent, with its doorbell wired to the device in-process
/// and its area in the device's guest memory.
struct InProcess(Arc<StageDevice>, u32);
impl Platform for InProcess {
    fn doorbell(&self, port: u16, value: u32) {
        self.0.doorbell(self.1, port, &value.to_le_bytes());
    }
    fn doorbell_status(&self) -> u32 {
        let mut st = [0u8; 4];
        self.0.read_status(self.1, DOORBELL_STATUS, &mut st);
        u32::from_le_bytes(st)
    }
    fn tsc(&self) -> u64 {
        // Any monotonic clock will do for the counters.
        std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos() as u64
    }
}

#[test]
fn agent_and_device_agree_under_concurrent_draining() {
    let mem = memory();
    let host = mem.get_host_address(GuestAddress(AREA)).unwrap();
    let dev = Arc::new(StageDevice::new(std::sync::Arc::new(mem), MEM, 2, 0, 0));
    let layout = Layout::new(2, 3, 4).unwrap();
    // SAFETY: the area lies in the device's guest memory, which outlives the agent.
    let agent = unsafe {
        Agent::register(
            InProcess(dev.clone(), 0),
            host,
            &AreaSpec {
                gpa: AREA,
                size: layout.area_size(),
                num_vcpus: 2,
                stage_names: &["a", "b", "c"],
                ring_entries: 4,
                counters: false,
                timed_every: 0,
                latency: false,
            },
        )
    }
    .unwrap();
    assert_eq!(agent.status(), Status::Ok);
    dev.publish(&[0b11; 3], 0, hypercall_abi::stage::VisitPolicy::Fifo);
    assert_eq!(agent.read_map().unwrap().vcpus[..3], [0b11; 3]);
    let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    let done = Arc::new(AtomicBool::new(false));
    let drainer = {
        let (dev, done) = (dev.clone(), done.clone());
        std::thread::spawn(move || {
            let mut accounting = Accounting::new(&names, 2, 0);
            while !done.load(Ordering::Acquire) {
                accounting.ingest(&dev.drain());
                std::thread::yield_now();
            }
            accounting
        })
    };
    let mut written = [0u64; 3];
    for i in 0..20_000u32 {
        let stage = i % 3;
        assert!(matches!(
            agent.stage_enter(0, stage, i),
            guest_agent::Report::Written { .. }
        ));
        written[stage as usize] += 1;
    }
    agent.stage_exit(0, 0);
    done.store(true, Ordering::Release);
    let mut accounting = drainer.join().unwrap();
    accounting.ingest(&dev.drain());
    let mut r = dev.report();
    accounting.fill_report(&mut r);
    assert_eq!(r.dropped, 0);
    let counted: Vec<u64> = r.stages.iter().map(|s| s.events).collect();
    assert_eq!(counted, written);
    assert_eq!(r.vcpus[0].exits, 1);
    // The policy period's window counts the same entries, per stage (what
    // `auto` weighs its slices by) and in all.
    let w = accounting.take_window();
    assert_eq!(w.stage_entries, written);
    assert_eq!(w.entries, written.iter().sum::<u64>());
    assert_eq!(accounting.take_window().stage_entries, [0; 3]);
    // A 4-entry ring cannot hold 20 000 events: the guest must have waited.
    assert!(r.ring_full_backoffs > 0);
    assert_eq!(r.ring_full_backoffs, agent.ring_full_backoffs(0));
}

#[test]
fn register_refusals_and_unregister() {
    let mem = memory();
    let dev = StageDevice::new(std::sync::Arc::new(mem.clone()), MEM, 1, 0, 0);
    let layout = Layout::new(1, 2, 8).unwrap();
    // Below the minimum GPA, past the end of RAM.
    dev.doorbell(0, DOORBELL_REGISTER, &1u32.to_le_bytes());
    dev.doorbell(0, DOORBELL_REGISTER, &u32::MAX.to_le_bytes());
    assert_eq!(register(&dev), Status::BadMagic);
    let mut h = layout.header();
    h.area_size = MEM; // runs past the end of RAM from AREA
    mem.write_obj(Obj(h), GuestAddress(AREA)).unwrap();
    assert_eq!(register(&dev), Status::BadRange);
    mem.write_obj(Obj(layout.header()), GuestAddress(AREA))
        .unwrap();
    assert_eq!(register(&dev), Status::Ok);
    assert_eq!(register(&dev), Status::AlreadyRegistered);
    // A refused REGISTER hands nothing to the scheduler (issue 14 D15).
    let pfn = (AREA >> 12) as u32;
    assert!(dev
        .doorbell(0, DOORBELL_REGISTER, &pfn.to_le_bytes())
        .is_none());
    dev.doorbell(0, DOORBELL_UNREGISTER, &[0]);
    dev.doorbell(0, DOORBELL_WAKE, &7u32.to_le_bytes());
    let mut st = [0u8; 4];
    dev.read_status(0, DOORBELL_STATUS, &mut st);
    assert_eq!(u32::from_le_bytes(st), Status::BadVcpu as u32);
    let r = dev.report();
    assert!(!r.registered);
    assert_eq!(r.registrations, 1);
    assert_eq!(r.registrations_rejected["BadRange"], 3);
    assert_eq!(r.registrations_rejected["BadMagic"], 1);
    assert_eq!(r.registrations_rejected["AlreadyRegistered"], 2);
}

/// The device holds any `vm-memory` address space ([`super::StageMemory`]):
/// over a borrowed `&GuestMemoryMmap` (as over the VMM's `Arc`), a guest's
/// area registers and its counters are read through the space's snapshot.
#[test]
fn any_guest_address_space_serves() {
    let mem = memory();
    let layout = Layout::new(2, 3, 8).unwrap().with_latency();
    mem.write_obj(Obj(layout.header()), GuestAddress(AREA))
        .unwrap();
    let dev: StageDevice<&GuestMemoryMmap> = StageDevice::new(&mem, MEM, 2, 0, 0);
    let pfn = (AREA >> 12) as u32;
    let registered = dev.doorbell(0, DOORBELL_REGISTER, &pfn.to_le_bytes());
    assert!(registered.is_some_and(|r| r.counters));
    assert!(dev.report().registered);
    let mut blocks = Blocks::default();
    assert!(dev.read_blocks(&mut blocks).is_some());
    assert_eq!((blocks.counters.len(), blocks.latency.len()), (2, 2));
}

/// vCPU `vcpu` rings WAIT (the longest timeout) on a thread of its own;
/// the thread returns how long it waited.
fn wait_on(dev: &Arc<StageDevice>, vcpu: u32) -> std::thread::JoinHandle<Duration> {
    let dev = dev.clone();
    std::thread::spawn(move || {
        let t = std::time::Instant::now();
        dev.doorbell(vcpu, DOORBELL_WAIT, &0u32.to_le_bytes());
        t.elapsed()
    })
}

#[test]
fn wait_returns_on_wake_and_on_timeout() {
    let dev = Arc::new(StageDevice::new(
        std::sync::Arc::new(memory()),
        MEM,
        2,
        0,
        0,
    ));
    let t0 = std::time::Instant::now();
    dev.doorbell(1, DOORBELL_WAIT, &2000u32.to_le_bytes());
    assert!(t0.elapsed() >= Duration::from_millis(2));
    let waiter = wait_on(&dev, 1);
    std::thread::sleep(Duration::from_millis(5));
    dev.doorbell(0, DOORBELL_WAKE, &1u32.to_le_bytes());
    let waited = waiter.join().unwrap();
    assert!(
        waited < Duration::from_micros(u64::from(WAIT_MAX_US)),
        "{waited:?}"
    );
    assert_eq!(dev.report().wakes, 1);
    // A VMM's pause kicks a parked vCPU out of its WAIT without a WAKE.
    let waiter = wait_on(&dev, 0);
    std::thread::sleep(Duration::from_millis(5));
    dev.kick_parked();
    let waited = waiter.join().unwrap();
    assert!(
        waited < Duration::from_micros(u64::from(WAIT_MAX_US)),
        "{waited:?}"
    );
    assert_eq!(dev.report().wakes, 1, "a kick is not a guest's WAKE");
}

proptest! {
    /// A valid header with arbitrary fields overwritten: REGISTER accepts
    /// it exactly when the header is well-formed for this VM and the area
    /// fits in RAM, and then returns one name per declared stage.
    #[test]
    fn register_accepts_exactly_the_areas_that_fit(
        num_vcpus in prop_oneof![Just(2u32), any::<u32>()],
        num_stages in prop_oneof![1u32..=16, any::<u32>()],
        ring_entries in prop_oneof![Just(8u32), 0u32..=1 << 17],
        area_pages in prop_oneof![1u64..=3, any::<u64>()],
        version in prop_oneof![Just(hypercall_abi::stage::ABI_VERSION), any::<u32>()],
    ) {
        let mem = memory();
        let mut h = Layout::new(2, 3, 8).unwrap().header();
        h.num_vcpus = num_vcpus;
        h.num_stages = num_stages;
        h.ring_entries = ring_entries;
        h.area_size = area_pages.wrapping_mul(4096);
        h.version = version;
        mem.write_obj(Obj(h), GuestAddress(AREA)).unwrap();
        let dev = StageDevice::new(std::sync::Arc::new(mem), MEM, 2, 0, 0);
        let result = dev.doorbell(0, DOORBELL_REGISTER, &((AREA >> 12) as u32).to_le_bytes());
        let fits = hypercall_abi::stage::validate_header(&h, 2).is_ok()
            && AREA.checked_add(h.area_size).is_some_and(|end| end <= MEM);
        prop_assert_eq!(result.is_some(), fits);
        let r = dev.report();
        prop_assert_eq!(r.registered, fits);
        match result {
            Some(registered) => prop_assert_eq!(registered.names.len() as u32, h.num_stages),
            None => prop_assert_eq!(r.registrations_rejected.values().sum::<u64>(), 1),
        }
    }

    /// Arbitrary ring contents and head: never a panic, and every slot the
    /// host looked at is either counted or dropped.
    #[test]
    fn arbitrary_ring_contents(
        slots in proptest::collection::vec(any::<u8>(), 8 * 32),
        seqs_valid in proptest::collection::vec(any::<bool>(), 8),
        head in prop_oneof![0u64..=8, any::<u64>()],
    ) {
        let mem = memory();
        let layout = Layout::new(1, 3, 8).unwrap();
        mem.write_obj(Obj(layout.header()), GuestAddress(AREA)).unwrap();
        let dev = StageDevice::new(std::sync::Arc::new(mem.clone()), MEM, 1, 0, 0);
        prop_assert_eq!(register(&dev), Status::Ok);
        let first_slot = AREA + layout.slot_offset(0, 0);
        mem.write_slice(&slots, GuestAddress(first_slot)).unwrap();
        // Make some entries plausibly valid so both paths are exercised.
        for (i, valid) in seqs_valid.iter().enumerate() {
            if *valid {
                mem.write_obj(i as u64, GuestAddress(first_slot + 32 * i as u64)).unwrap();
            }
        }
        mem.write_obj(head, GuestAddress(AREA + layout.ring_offset(0))).unwrap();
        dev.drain();
        dev.drain();
        let v = &dev.report().vcpus[0];
        if head <= 8 {
            prop_assert_eq!(v.events + v.dropped_bad_seq + v.dropped_bad_stage, head);
            prop_assert_eq!(v.bad_index, 0);
        } else {
            prop_assert_eq!(v.bad_index, 1);
            prop_assert_eq!(v.events, 0);
        }
        // The host published its tail.
        let tail: u64 = mem.read_obj(GuestAddress(AREA + layout.ring_offset(0) + core::mem::offset_of!(RingHeader, tail) as u64)).unwrap();
        prop_assert_eq!(tail, head);
    }
}

/// A guest that moves `head` next to `u64::MAX` gets a resynchronised ring
/// and counted drops, never an overflow (the drain's index arithmetic is
/// checked).
#[test]
fn head_near_the_end_of_the_index_space_is_counted_not_overflowed() {
    let mem = memory();
    let layout = Layout::new(1, 3, 8).unwrap();
    mem.write_obj(Obj(layout.header()), GuestAddress(AREA))
        .unwrap();
    let dev = StageDevice::new(std::sync::Arc::new(mem.clone()), MEM, 1, 0, 0);
    assert_eq!(register(&dev), Status::Ok);
    let head_gpa = GuestAddress(AREA + layout.ring_offset(0));
    // A jump far ahead: resynchronised to head = u64::MAX - 2.
    mem.write_obj(u64::MAX - 2, head_gpa).unwrap();
    assert!(dev.drain().events.is_empty());
    // Five more entries would run the index past u64::MAX.
    mem.write_obj(2u64, head_gpa).unwrap();
    let drained = dev.drain();
    assert!(drained.events.is_empty());
    assert_eq!(drained.resynced, vec![0]);
    let r = dev.report();
    assert_eq!(r.vcpus[0].bad_index, 2);
    assert_eq!(r.vcpus[0].events, 0);
}

/// 100,000 refused REGISTERs log at most one burst of lines; the rest are
/// counted (issue 14 D1: every refusal used to log a line).
#[test]
fn refused_registers_are_logged_rate_limited() {
    let dev = StageDevice::new(std::sync::Arc::new(memory()), MEM, 1, 0, 0);
    let before = crate::ratelimit::suppressed();
    for _ in 0..100_000 {
        dev.doorbell(0, DOORBELL_REGISTER, &1u32.to_le_bytes());
    }
    assert_eq!(dev.report().registrations_rejected["BadRange"], 100_000);
    let suppressed = crate::ratelimit::suppressed() - before;
    assert!(
        suppressed >= 100_000 - u64::from(crate::ratelimit::BURST),
        "{suppressed}"
    );
}

/// A guest that pre-fills every ring and publishes them at once gets them
/// drained a bounded number of entries per pass, and WAKE doorbells of other
/// vCPUs do not wait for the drain (issue 14 D6).
#[test]
fn prefilled_rings_are_drained_in_bounded_passes_without_blocking_doorbells() {
    const VCPUS: u32 = 64;
    const ENTRIES: u32 = 8192;
    let layout = Layout::new(VCPUS, 2, ENTRIES).unwrap();
    let size = AREA + layout.area_size();
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size as usize)]).unwrap();
    mem.write_obj(Obj(layout.header()), GuestAddress(AREA))
        .unwrap();
    let dev = Arc::new(StageDevice::new(
        std::sync::Arc::new(mem.clone()),
        size,
        VCPUS,
        0,
        0,
    ));
    assert_eq!(register(&dev), Status::Ok);
    for v in 0..VCPUS {
        for i in 0..u64::from(ENTRIES) {
            let ev = StageEvent {
                seq: i,
                tsc: i,
                stage: (i % 2) as u32,
                thread: v,
                reserved: 0,
            };
            mem.write_obj(Obj(ev), GuestAddress(AREA + layout.slot_offset(v, i)))
                .unwrap();
        }
        mem.write_obj(
            u64::from(ENTRIES),
            GuestAddress(AREA + layout.ring_offset(v)),
        )
        .unwrap();
    }
    let done = Arc::new(AtomicBool::new(false));
    let waker = {
        let (dev, done) = (dev.clone(), done.clone());
        std::thread::spawn(move || {
            let mut waits = Vec::new();
            while !done.load(Ordering::Acquire) {
                let t = std::time::Instant::now();
                dev.doorbell(1, DOORBELL_WAKE, &0u32.to_le_bytes());
                waits.push(t.elapsed());
            }
            waits.sort();
            waits
        })
    };
    let first = dev.drain();
    let second = dev.drain();
    done.store(true, Ordering::Release);
    let waits = waker.join().unwrap();
    let per_pass = (VCPUS as u64 * MAX_DRAIN_PER_RING) as usize;
    assert_eq!(first.events.len(), per_pass);
    assert_eq!(
        first.events.len() + second.events.len(),
        (VCPUS * ENTRIES) as usize
    );
    assert_eq!(dev.report().dropped, 0);
    // WAKE takes no lock a drain holds: while a drain pass runs, WAKEs keep
    // completing at once (a descheduled test thread on 2 busy cores can
    // still stretch one; the old device lock made them wait a whole pass).
    let median = waits[waits.len() / 2];
    assert!(waits.len() > 100, "{} WAKEs during the drains", waits.len());
    assert!(median < Duration::from_millis(1), "median WAKE {median:?}");
}

/// Found by fuzzing: guest-written `full_backoffs` summing past `u64::MAX`
/// overflowed the report's sum (a panic in debug builds); it saturates.
#[test]
fn backoff_sums_saturate() {
    let mem = memory();
    let layout = Layout::new(2, 2, 8).unwrap();
    mem.write_obj(Obj(layout.header()), GuestAddress(AREA))
        .unwrap();
    let dev = StageDevice::new(std::sync::Arc::new(mem.clone()), MEM, 2, 0, 0);
    assert_eq!(register(&dev), Status::Ok);
    for v in 0..2 {
        let backoffs = AREA + layout.ring_offset(v) + 128;
        mem.write_obj(1u64 << 63, GuestAddress(backoffs)).unwrap();
    }
    dev.drain();
    assert_eq!(dev.report().ring_full_backoffs, u64::MAX);
}

/// UNREGISTER keeps a counters area's blocks for one more read, so the
/// last policy period's switches are not lost; a new registration's blocks
/// are read after them.
#[test]
fn unregister_keeps_the_counters_for_one_last_read() {
    use hypercall_abi::stage::{stage_code, VcpuCounters};
    let mem = memory();
    let (layout, dev) = counters_device(&mem, 8);
    let first = dev
        .doorbell(0, DOORBELL_REGISTER, &((AREA >> 12) as u32).to_le_bytes())
        .unwrap();
    assert!(first.counters);
    let mut block = VcpuCounters::default();
    block.counts[stage_code(1) as usize] = 42;
    mem.write_obj(Obj(block), GuestAddress(AREA + layout.counters_offset(1)))
        .unwrap();
    let mut latency = hypercall_abi::stage::VcpuLatency::default();
    latency.record(5_000);
    mem.write_obj(Obj(latency), GuestAddress(AREA + layout.latency_offset(0)))
        .unwrap();
    let mut buf = Blocks::default();
    assert_eq!(dev.take_final_blocks(&mut buf), None);
    dev.doorbell(0, DOORBELL_UNREGISTER, &[0]);
    assert_eq!(dev.read_blocks(&mut buf), None, "no area any more");
    assert_eq!(
        dev.take_final_blocks(&mut buf).map(|c| c.generation),
        Some(first.generation)
    );
    assert_eq!(buf.counters[1].counts[stage_code(1) as usize], 42);
    assert_eq!(buf.latency.len(), 2);
    assert_eq!(buf.latency[0], latency);
    assert_eq!(dev.take_final_blocks(&mut buf), None, "handed out once");
    let mut buf = Vec::new();
    // Registered again: a new generation, read live.
    let second = dev
        .doorbell(0, DOORBELL_REGISTER, &((AREA >> 12) as u32).to_le_bytes())
        .unwrap();
    assert_eq!(second.generation, first.generation + 1);
    assert_eq!(
        dev.read_counters(&mut buf).map(|c| c.generation),
        Some(second.generation)
    );
}

/// A counters guest that fills its rings with valid trace events and
/// unregisters in a loop: the events of one UNREGISTER wait as trace (never
/// as load) for the next drain, the rings of the next ones are not read
/// while they wait (counted), and what waits stays at one drain pass.
#[test]
fn unregister_in_a_loop_keeps_a_bounded_trace_backlog() {
    let mem = memory();
    let (layout, dev) = counters_device(&mem, 4096);
    let fill = || {
        for vcpu in 0..2 {
            let ring = AREA + layout.ring_offset(vcpu);
            for i in 0..4096u64 {
                let ev = StageEvent {
                    seq: i,
                    tsc: i,
                    stage: 1,
                    thread: 7,
                    reserved: 0,
                };
                mem.write_obj(Obj(ev), GuestAddress(AREA + layout.slot_offset(vcpu, i)))
                    .unwrap();
            }
            mem.store(4096u64, GuestAddress(ring), Ordering::Release)
                .unwrap();
        }
    };
    for _ in 0..5 {
        // The host's tails start at 0 at every REGISTER.
        assert_eq!(register(&dev), Status::Ok);
        fill();
        dev.doorbell(0, DOORBELL_UNREGISTER, &[0]);
    }
    let r = dev.report();
    assert_eq!(r.unread_at_unregister, 4, "{r:?}");
    assert_eq!(dev.drain_need(), Drain::Trace);
    let drained = dev.drain();
    assert_eq!((drained.trace.len(), drained.events.len()), (2 * 4096, 0));
    assert_eq!(dev.drain_need(), Drain::No);
}

/// The device over guest memory with a dirty-page bitmap, the kind Cloud
/// Hypervisor (`GuestMemoryMmap<AtomicBitmap>`) and Firecracker (with
/// `Option<AtomicBitmap>`) run: REGISTER, a counter read and the map
/// publish work through `vm-memory` alone, and the device's map writes
/// mark the pages dirty, so a live migration copies them again.
#[test]
fn a_vmm_with_a_dirty_bitmap_embeds_the_device() {
    use hypercall_abi::stage::{stage_code, VcpuCounters};
    use vm_memory::bitmap::{AtomicBitmap, Bitmap};
    use vm_memory::GuestMemoryRegion;
    type DirtyMemory = vm_memory::GuestMemoryMmap<AtomicBitmap>;
    let mem = DirtyMemory::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
    let layout = Layout::new(2, 3, 8).unwrap().with_latency();
    mem.write_obj(Obj(layout.header()), GuestAddress(AREA))
        .unwrap();
    let mut block = VcpuCounters::default();
    block.counts[stage_code(2) as usize] = 7;
    mem.write_obj(Obj(block), GuestAddress(AREA + layout.counters_offset(0)))
        .unwrap();
    let region = mem.iter().next().unwrap();
    // As after a migration pass: nothing dirty.
    std::ops::Deref::deref(region).bitmap().reset();
    let dev: StageDevice<std::sync::Arc<DirtyMemory>> =
        StageDevice::new(std::sync::Arc::new(mem.clone()), MEM, 2, 0, 0);
    let registered = dev
        .doorbell(0, DOORBELL_REGISTER, &((AREA >> 12) as u32).to_le_bytes())
        .expect("REGISTER");
    assert_eq!(registered.names.len(), 3);
    assert!(registered.counters);
    let mut buf = Vec::new();
    assert!(dev.read_counters(&mut buf).is_some());
    assert_eq!(buf[0].counts[stage_code(2) as usize], 7);
    let unrelated = MEM as usize - 4096;
    assert!(!region.bitmap().dirty_at(unrelated));
    dev.publish(&[0b01, 0b10, 0b11], 0b11, VisitPolicy::default());
    let map = AREA + STAGE_MAP_OFFSET;
    assert!(
        region.bitmap().dirty_at(map as usize),
        "the stage map's page is marked dirty"
    );
}
