//! Hostile-guest attacks on the stage channel's counters (ABI minor 2) and
//! on registration (`tests/hostile.rs`):
//!
//! * [`impossible_counters`] — vCPU 0 writes impossible values into the
//!   counter blocks of the registered area, one kind per round, a round
//!   every 10 ms (longer than half a policy period, so the host reads
//!   most of them): counters that go backwards, idle time and counts far
//!   beyond a period, state codes out of range, timed states far in the
//!   future. The host must clamp and count them, never panic, and keep the
//!   policy's load within the vCPUs.
//! * [`reregister_loop`] — vCPU 0 builds a 16-stage area whose rings are
//!   full of valid events and loops UNREGISTER + REGISTER of it for
//!   [`REREGISTER_MS`]: the host must serve at most one planning per policy
//!   period, and keep the events each UNREGISTER finds within a bounded
//!   backlog, its memory and its CPU bounds.
//!
//! Depends on [`super::env`] and [`crate::staged::platform`].

use core::sync::atomic::{AtomicU64, Ordering};

use hypercall_abi::stage::{
    stage_code, state_word, AreaHeader, Layout, StageDesc, StageEvent, Status, CODE_IDLE,
    COUNTERS_COUNTS_OFFSET, COUNTERS_CYCLES_OFFSET, DOORBELL_REGISTER, DOORBELL_STATUS,
    DOORBELL_UNREGISTER, MAX_STAGES, STAGE_DESCS_OFFSET,
};

use super::env::{fail, tsc, Env};
use crate::staged::platform::{agent, alloc_pages, area};
use crate::{inl, outl, print_line};

/// Rounds of [`impossible_counters`] (10 ms each).
const COUNTER_ROUNDS: u64 = 40;
/// How long [`reregister_loop`] runs (ms).
pub const REREGISTER_MS: u64 = 4000;

/// Word at byte `offset` of vCPU `vcpu`'s counter block in the registered
/// area laid out by `layout`.
fn word(layout: &Layout, vcpu: u32, offset: u64) -> &'static AtomicU64 {
    let addr = area() + layout.counters_offset(vcpu) + offset;
    // SAFETY: a field of vCPU `vcpu`'s block in our own registered,
    // identity-mapped area, 8-byte aligned (the layout was validated).
    unsafe { AtomicU64::from_ptr(addr as *mut u64) }
}

/// Busy-waits `ms` milliseconds.
fn spin_ms(env: &Env, ms: u64) {
    let until = tsc() + env.ticks(ms);
    while tsc() < until {
        core::hint::spin_loop();
    }
}

/// Writes impossible counter values on vCPU 0 (and 1) for
/// [`COUNTER_ROUNDS`] rounds; prints how many.
pub fn impossible_counters(env: &Env, verbose: bool) {
    let Some(layout) = agent().layout().filter(|l| l.counters && area() != 0) else {
        fail(format_args!(
            "the counters attack needs a registered area with counters"
        ));
    };
    let vcpus = layout.num_vcpus.min(2);
    let mut written = 0u64;
    let counts = |v, code: u32| word(&layout, v, COUNTERS_COUNTS_OFFSET + 8 * u64::from(code));
    let cycles = |v, code: u32| word(&layout, v, COUNTERS_CYCLES_OFFSET + 8 * u64::from(code));
    for round in 0..COUNTER_ROUNDS {
        for v in 0..vcpus {
            let state = word(&layout, v, 0);
            match round % 5 {
                // A count that goes backwards.
                0 => counts(v, stage_code(0)).store(0, Ordering::Relaxed),
                // Idle time a million times a policy period.
                1 => {
                    let c = cycles(v, CODE_IDLE);
                    c.store(
                        c.load(Ordering::Relaxed)
                            .wrapping_add(env.ticks(20_000_000)),
                        Ordering::Relaxed,
                    )
                }
                // A state code out of range.
                2 => state.store(state_word(tsc(), 31, true), Ordering::Release),
                // A timed state far in the future.
                3 => state.store(
                    state_word(u64::MAX - 4096, stage_code(1), true),
                    Ordering::Release,
                ),
                // A count of 2^40 transitions at once, then a plausible one.
                _ => {
                    counts(v, stage_code(0)).store(1 << 40, Ordering::Relaxed);
                    state.store(state_word(tsc(), stage_code(0), true), Ordering::Release);
                }
            }
            written += 1;
        }
        spin_ms(env, 10);
    }
    if verbose {
        println!(
            "hostile: counters wrote {} impossible values on {} vCPUs",
            written, vcpus
        );
    }
}

/// Lays out a 16-stage area with counters for `num_vcpus` vCPUs (valid:
/// the host accepts it) and returns its GPA.
fn sixteen_stage_area(num_vcpus: u32) -> u64 {
    let layout = Layout::new(num_vcpus, MAX_STAGES as u32, 256)
        .unwrap_or_else(|| fail(format_args!("no 16-stage layout for {num_vcpus} vCPUs")))
        .with_counters();
    let size = layout.area_size();
    let gpa = alloc_pages(size).unwrap_or_else(|| fail(format_args!("out of memory")));
    // SAFETY: `size` bytes of our own, freshly allocated, identity-mapped
    // memory.
    unsafe {
        core::ptr::write_bytes(gpa as *mut u8, 0, size as usize);
        for s in 0..MAX_STAGES {
            let mut desc = StageDesc::default();
            desc.name[..2].copy_from_slice(&[b's', b'a' + s as u8]);
            (gpa as *mut u8)
                .add(STAGE_DESCS_OFFSET as usize + 32 * s)
                .cast::<StageDesc>()
                .write_volatile(desc);
        }
        (gpa as *mut AreaHeader).write_volatile(AreaHeader {
            area_size: size,
            ..layout.header()
        });
        // Every ring full of valid trace events: the host's tails start
        // at 0 at each REGISTER, so each UNREGISTER finds them all again.
        for v in 0..num_vcpus {
            for i in 0..u64::from(layout.ring_entries) {
                (gpa as *mut u8)
                    .add(layout.slot_offset(v, i) as usize)
                    .cast::<StageEvent>()
                    .write_volatile(StageEvent {
                        seq: i,
                        tsc: i,
                        stage: (i % MAX_STAGES as u64) as u32,
                        thread: 1,
                        reserved: 0,
                    });
            }
            (gpa as *mut u8)
                .add(layout.ring_offset(v) as usize)
                .cast::<u64>()
                .write_volatile(u64::from(layout.ring_entries));
        }
    }
    gpa
}

/// UNREGISTER + REGISTER of a 16-stage area in a loop for
/// [`REREGISTER_MS`]; checks one REGISTER status in 100. Prints the pairs
/// sent and the unexpected statuses.
pub fn reregister_loop(env: &Env, verbose: bool) {
    let pfn = (sixteen_stage_area(env.num_vcpus) >> 12) as u32;
    let until = tsc() + env.ticks(REREGISTER_MS);
    let (mut pairs, mut unexpected) = (0u64, 0u64);
    while tsc() < until {
        outl(DOORBELL_UNREGISTER, 0);
        outl(DOORBELL_REGISTER, pfn);
        if pairs % 100 == 0 && Status::from_u32(inl(DOORBELL_STATUS)) != Some(Status::Ok) {
            unexpected += 1;
        }
        pairs += 1;
    }
    if verbose {
        println!(
            "hostile: reregister sent {} UNREGISTER/REGISTER pairs in {} ms, {} unexpected statuses",
            pairs, REREGISTER_MS, unexpected
        );
    }
}
