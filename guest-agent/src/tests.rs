//! Unit tests of the agent against a fake host on a heap-allocated area.

use super::*;
use std::vec::Vec;

/// A host that answers every doorbell with `status` and counts time.
struct FakeHost {
    status: Status,
    tsc: AtomicU64,
}

impl Platform for FakeHost {
    fn doorbell(&self, _port: u16, _value: u32) {}
    fn doorbell_status(&self) -> u32 {
        self.status as u32
    }
    fn tsc(&self) -> u64 {
        self.tsc.fetch_add(1, Ordering::Relaxed)
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
    }
}

/// A fresh, zeroed, page-aligned area for `layout`.
fn area(layout: &Layout) -> Vec<Page> {
    std::vec![Page([0; 4096]); (layout.area_size() / 4096) as usize]
}

/// Registers an agent on `area` (laid out by `layout`, with `names` as its
/// stages) with a host that answers `status`.
fn register(area: &mut [Page], layout: &Layout, names: &[&str], status: Status) -> Agent<FakeHost> {
    let host = FakeHost {
        status,
        tsc: AtomicU64::new(100),
    };
    // SAFETY: `area` is our own page-aligned memory of `area_size` bytes;
    // every caller keeps it alive (declared before the agent) and unused
    // otherwise while the agent lives.
    unsafe {
        Agent::register(
            host,
            area.as_mut_ptr().cast(),
            0x10_0000,
            layout.area_size(),
            layout.num_vcpus,
            names,
            layout.ring_entries,
        )
    }
    .unwrap()
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
