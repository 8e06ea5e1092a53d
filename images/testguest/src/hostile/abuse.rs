//! `abuse=1`: what a hostile or broken guest could send, so the end-to-end
//! tests can check the VMM's validation. Bad REGISTERs go out before the
//! real registration ([`bad_registers`]); corrupt ring entries after it
//! ([`corrupt_ring`], through guest-agent's `test-hooks`). Each step prints
//! one `abuse:` line that the tests match. `main.rs` hands
//! [`bad_registers`] to `staged::setup` (a `staged::RegisterHook`) and
//! calls [`corrupt_ring`] right after it.
//!
//! Depends on [`crate::staged::platform`] only.

use guest_agent::Platform;
use hypercall_abi::stage::{AreaHeader, Layout, Status, DOORBELL_REGISTER, DOORBELL_STATUS};

use crate::staged::platform::agent;
use crate::{inl, outl, print_line};

/// Sends REGISTER for page frame `pfn` directly (no agent) and returns the
/// VMM's status.
fn raw_register(pfn: u64) -> Status {
    outl(DOORBELL_REGISTER, pfn as u32);
    Status::from_u32(inl(DOORBELL_STATUS)).unwrap_or(Status::NoDevice)
}

/// Bad REGISTERs a hostile guest could send: outside RAM (`mem_size`
/// bytes), wrong magic, size not page-aligned, the last two on the area at
/// GPA `area` laid out by `layout`. Prints the status the VMM answered each
/// with.
pub fn bad_registers(mem_size: u64, area: u64, layout: &Layout) {
    let outside = raw_register((mem_size >> 12) + 16);
    let header = area as *mut AreaHeader;
    let good = layout.header();
    // SAFETY: `area` is this guest's own, identity-mapped, allocated memory.
    unsafe {
        header.write_volatile(AreaHeader {
            magic: 0x0bad,
            ..good
        })
    };
    let magic = raw_register(area >> 12);
    // SAFETY: as above.
    unsafe {
        header.write_volatile(AreaHeader {
            area_size: good.area_size + 100,
            ..good
        })
    };
    let unaligned = raw_register(area >> 12);
    println!(
        "abuse: register outside RAM -> {:?}, wrong magic -> {:?}, unaligned size -> {:?}",
        outside, magic, unaligned
    );
}

/// Corrupt ring entries from vCPU 0: one with a wrong sequence number (a
/// torn or forged slot), one with an out-of-range stage, then a head that
/// jumps four rings ahead. Waits for the host to consume each step so every
/// corruption is seen on its own. Nothing when the agent is inactive (the
/// registration failed).
pub fn corrupt_ring(ring_entries: u32) {
    let a = agent();
    if !a.is_active() {
        return;
    }
    if a.mode() == guest_agent::Mode::Counters && a.trace_every() == 0 {
        // The host reads no ring of a counters guest without a trace.
        println!("abuse: ring corruption skipped: counters without a trace (run with --stage-trace on, or counters=0)");
        return;
    }
    let wait_drained = || {
        while !a.ring_drained(0) {
            core::hint::spin_loop();
        }
    };
    let event = hypercall_abi::stage::StageEvent {
        seq: 0xdead_beef,
        tsc: a.platform().tsc(),
        stage: 0,
        thread: 999,
        reserved: 0,
    };
    a.write_raw_event(0, event, false);
    a.write_raw_event(
        0,
        hypercall_abi::stage::StageEvent { stage: 99, ..event },
        true,
    );
    wait_drained();
    a.corrupt_head(0, 4 * u64::from(ring_entries));
    wait_drained();
    println!("abuse: wrote 1 bad-sequence entry, 1 bad-stage entry and 1 head jump on vCPU 0");
}
