//! Target 2: ring drains over arbitrary ring contents and indices.
//!
//! A valid area is registered, then for a few rounds every ring gets
//! arbitrary (often plausible) slots, an arbitrary `full_backoffs` and an
//! arbitrary `head` (near the host's tail, behind it, far ahead, or next to
//! `u64::MAX`, so the free-running indices cross the 64-bit wrap), and the
//! device drains twice. Each drain is checked against a model of
//! docs/stage-protocol.md §4 and §8: per ring, the events returned are
//! exactly the slots in `[tail, tail + min(pending, MAX_DRAIN_PER_RING))`
//! whose `seq` is their index and whose stage is valid, every other slot
//! is counted as a drop, a bad index is counted once and resynchronises the
//! tail to `head`, the published tail is the model's, and the events of one
//! drain are ordered by TSC (a ring's events keep their order on ties).
//!
//! Found by this target, fixed: a guest that wrote `full_backoffs` values
//! summing past `u64::MAX` into its rings (e.g. `1 << 63` in two rings)
//! made `StageDevice::report` panic with "attempt to add with overflow" in
//! debug builds; the sums saturate now.

use hypercall_abi::stage::{
    Layout, StageEvent, Status, DOORBELL_REGISTER, DOORBELL_STATUS, STAGE_NONE,
};
use stage_device::abi::Obj;
use stage_device::stage::{StageDevice, MAX_DRAIN_PER_RING};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::guest::{memory as guest_memory, ZeroOnDrop};
use crate::input::Input;
use crate::stage_register::AREA;

/// Guest RAM of the target's VMs (bytes): room for 4 rings of 8192 entries.
pub const MEM: u64 = 4 << 20;

thread_local! {
    static MEMORY: GuestMemoryMmap = guest_memory(MEM);
}

/// The target (see the module documentation).
pub fn fuzz(data: &[u8]) {
    MEMORY.with(|mem| run(mem, data));
}

/// Per-ring counters the model follows.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct Counts {
    events: u64,
    bad_seq: u64,
    bad_stage: u64,
    bad_index: u64,
    exits: u64,
    idles: u64,
}

fn counts(dev: &StageDevice) -> Vec<Counts> {
    dev.report()
        .vcpus
        .iter()
        .map(|v| Counts {
            events: v.events,
            bad_seq: v.dropped_bad_seq,
            bad_stage: v.dropped_bad_stage,
            bad_index: v.bad_index,
            exits: v.exits,
            idles: v.idles,
        })
        .collect()
}

fn run(mem: &GuestMemoryMmap, data: &[u8]) {
    let mut inp = Input::new(data);
    let vcpus = inp.range(1, 4);
    let stages = inp.range(1, 16);
    // Mostly small rings; sometimes larger than one drain's bound.
    let entries = match inp.u8() % 64 {
        0 => 8192,
        n => 2u32 << (n % 7),
    };
    let layout = Layout::new(vcpus, stages, entries).expect("valid counts");
    let _clean = ZeroOnDrop::new(mem, MEM, AREA, layout.area_size());
    mem.write_obj(Obj(layout.header()), GuestAddress(AREA))
        .unwrap();
    let dev = StageDevice::new(std::sync::Arc::new(mem.clone()), MEM, vcpus, 0, 1000);
    dev.doorbell(0, DOORBELL_REGISTER, &((AREA >> 12) as u32).to_le_bytes());
    let mut st = [0u8; 4];
    dev.read_status(0, DOORBELL_STATUS, &mut st);
    assert_eq!(u32::from_le_bytes(st), Status::Ok as u32);

    let mut tails = vec![0u64; vcpus as usize];
    let mut want = counts(&dev);
    let rounds = inp.range(1, 4);
    for _ in 0..rounds {
        for v in 0..vcpus {
            fill_ring(mem, &layout, v, tails[v as usize], &mut inp);
        }
        for _ in 0..2 {
            drain_and_check(mem, &dev, &layout, &mut tails, &mut want);
        }
        if inp.is_empty() {
            break;
        }
    }
}

/// Writes arbitrary slots, `full_backoffs` and `head` into `v`'s ring.
fn fill_ring(mem: &GuestMemoryMmap, layout: &Layout, v: u32, tail: u64, inp: &mut Input) {
    let ring = AREA + layout.ring_offset(v);
    let entries = u64::from(layout.ring_entries);
    let head = match inp.u8() % 8 {
        0 => inp.u64(),
        1 => u64::MAX - u64::from(inp.u8()),
        2 => tail.wrapping_sub(u64::from(inp.u8() % 4) + 1),
        3 => tail.wrapping_add(entries + u64::from(inp.u8() % 4)),
        4 => tail.wrapping_add(u64::from(inp.u16()) % (entries + 1)),
        _ => tail.wrapping_add(u64::from(inp.u8()) % (entries.min(64) + 1)),
    };
    let slots = u64::from(inp.u8()).min(entries);
    for i in 0..slots {
        let index = tail.wrapping_add(i);
        let mut ev = StageEvent {
            seq: index,
            tsc: u64::from(inp.u16()),
            stage: inp.below(layout.num_stages + 1),
            thread: inp.below(4),
            reserved: 0,
        };
        match inp.u8() % 8 {
            0 => ev.seq = inp.u64_near(index),
            1 => ev.stage = inp.u32_near(layout.num_stages),
            2 => ev.stage = STAGE_NONE,
            3 => (ev.stage, ev.thread) = (STAGE_NONE, u32::MAX),
            4 => ev.tsc = inp.u64(),
            _ => {}
        }
        let at = AREA + layout.slot_offset(v, index);
        mem.write_obj(Obj(ev), GuestAddress(at)).unwrap();
    }
    // Any value: the host's sums saturate (this target found the overflow).
    let backoffs = inp.u64();
    mem.write_obj(backoffs, GuestAddress(ring + 128)).unwrap();
    mem.write_obj(head, GuestAddress(ring)).unwrap();
}

/// One drain, checked against the model (see the module documentation).
fn drain_and_check(
    mem: &GuestMemoryMmap,
    dev: &StageDevice,
    layout: &Layout,
    tails: &mut [u64],
    want: &mut [Counts],
) {
    let mut expected = Vec::new();
    let mut resync = Vec::new();
    for v in 0..layout.num_vcpus {
        let ring = AREA + layout.ring_offset(v);
        let head: u64 = mem.read_obj(GuestAddress(ring)).unwrap();
        let (tail, w) = (tails[v as usize], &mut want[v as usize]);
        let pending = head.wrapping_sub(tail);
        if pending == 0 {
            expected.push(Vec::new());
            continue;
        }
        if pending > u64::from(layout.ring_entries) || tail.checked_add(pending).is_none() {
            w.bad_index += 1;
            tails[v as usize] = head;
            resync.push(v);
            expected.push(Vec::new());
            continue;
        }
        let take = pending.min(MAX_DRAIN_PER_RING);
        let mut evs = Vec::new();
        for i in 0..take {
            let index = tail + i;
            let Obj(ev): Obj<StageEvent> = mem
                .read_obj(GuestAddress(AREA + layout.slot_offset(v, index)))
                .unwrap();
            if ev.seq != index {
                w.bad_seq += 1;
            } else if ev.stage != STAGE_NONE && ev.stage >= layout.num_stages {
                w.bad_stage += 1;
            } else {
                w.events += 1;
                if ev.stage == STAGE_NONE {
                    if ev.thread == u32::MAX {
                        w.idles += 1;
                    } else {
                        w.exits += 1;
                    }
                }
                evs.push((ev.thread, ev.stage, ev.tsc));
            }
        }
        tails[v as usize] = tail + take;
        // One drain's events are ordered by TSC, ring order kept on ties.
        evs.sort_by_key(|e| e.2);
        expected.push(evs);
    }
    let drained = dev.drain();
    let report = dev.report();
    assert!(
        drained.events.windows(2).all(|w| w[0].tsc <= w[1].tsc),
        "events not ordered by TSC"
    );
    for v in 0..layout.num_vcpus {
        let got: Vec<_> = drained
            .events
            .iter()
            .filter(|e| e.vcpu == v)
            .map(|e| (e.thread, e.stage, e.tsc))
            .collect();
        assert_eq!(got, expected[v as usize], "events of ring {v}");
        let tail: u64 = mem
            .read_obj(GuestAddress(AREA + layout.ring_offset(v) + 64))
            .unwrap();
        assert_eq!(tail, tails[v as usize], "published tail of ring {v}");
        let backoffs: u64 = mem
            .read_obj(GuestAddress(AREA + layout.ring_offset(v) + 128))
            .unwrap();
        assert_eq!(report.vcpus[v as usize].ring_full_backoffs, backoffs);
    }
    assert!(drained.events.iter().all(|e| e.vcpu < layout.num_vcpus));
    assert_eq!(drained.resynced, resync);
    assert_eq!(counts(dev), want, "counters after a drain");
}
