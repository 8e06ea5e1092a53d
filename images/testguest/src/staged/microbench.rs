//! `bench=1`: the stage channel's micro-benchmark, run by vCPU 0 before the
//! staged phase; its one `bench:` line is parsed by `channel-bench`
//! (`bench/src/channel.rs`).
//!
//! Depends on [`super::platform`] only.

use guest_agent::Platform;

use super::platform::{agent, PortIo};
use crate::{outl, print_line};

/// `bench=1`: measures, on this vCPU in ring 3, the cost of one
/// `stage_enter` (batches that fit the ring, waiting for the host to drain
/// between batches, waits not timed), a plain loop doing the same bookkeeping
/// without the report, and one doorbell exit (a WAKE of this vCPU). Prints
/// one `bench:` line with ns figures from the TSC and `tsc_khz`.
pub fn channel_microbench(vcpu: u32, tsc_khz: u64) {
    let a = agent();
    let Some(layout) = a.layout() else {
        println!("bench: stage channel inactive");
        return;
    };
    let tsc = || PortIo.tsc();
    let batch = u64::from(layout.ring_entries - 1);
    let batches = (1_000_000 / batch).max(1);
    // Cycles through the area's stages (every one a real stage).
    let stages = u64::from(layout.num_stages.max(1));
    let mut cycles = 0u64;
    for b in 0..batches {
        while !a.ring_drained(vcpu) {
            core::hint::spin_loop();
        }
        let t0 = tsc();
        let mut stage = (b % stages) as u32;
        for _ in 0..batch {
            a.stage_enter(vcpu, stage, 0);
            stage = next_stage(stage, stages);
        }
        cycles += tsc() - t0;
    }
    let events = batches * batch;
    // Plain loop: the same iteration count and stage arithmetic, a volatile
    // store instead of the report.
    let mut sink = 0u64;
    let t0 = tsc();
    for b in 0..batches {
        let mut stage = (b % stages) as u32;
        for _ in 0..batch {
            // SAFETY: a local variable.
            unsafe { core::ptr::write_volatile(&mut sink, u64::from(stage)) };
            stage = next_stage(stage, stages);
        }
    }
    let plain = tsc() - t0;
    // The TSC read alone: what a timed visit adds at its start and end, and
    // what every report cost on the rings.
    let mut sink = 0u64;
    let t0 = tsc();
    for _ in 0..events {
        sink = sink.wrapping_add(tsc());
    }
    let tsc_cycles = tsc() - t0;
    // SAFETY: a local variable.
    unsafe { core::ptr::write_volatile(&mut sink, sink) };
    let exits = 200u64;
    let t0 = tsc();
    for _ in 0..exits {
        outl(hypercall_abi::stage::DOORBELL_WAKE, vcpu);
    }
    let exit_cycles = tsc() - t0;
    // Hundredths of a ns: cycles * 1e6 / kHz * 100.
    let centi_ns = |c: u64, n: u64| c.saturating_mul(100_000_000) / tsc_khz.max(1) / n.max(1);
    let (s, p, d, r) = (
        centi_ns(cycles, events),
        centi_ns(plain, events),
        centi_ns(exit_cycles, exits),
        centi_ns(tsc_cycles, events),
    );
    println!(
        "bench: stage_enter {}.{:02} ns/event ({} events, {:?}), plain loop {}.{:02} ns/iter, doorbell exit {}.{:02} us ({} exits), rdtsc {}.{:02} ns",
        s / 100,
        s % 100,
        events,
        a.mode(),
        p / 100,
        p % 100,
        d / 100_000,
        (d / 1000) % 100,
        exits,
        r / 100,
        r % 100
    );
}

/// The stage after `stage` of `stages`, without a division in the loop.
#[inline(always)]
fn next_stage(stage: u32, stages: u64) -> u32 {
    let next = stage + 1;
    if u64::from(next) == stages {
        0
    } else {
        next
    }
}
