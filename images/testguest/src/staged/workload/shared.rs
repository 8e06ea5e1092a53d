//! What the workloads share: `switch_cost=`'s synthetic refill
//! ([`cold_start`]), the mixing loop behind it and behind `work=` ([`mix`]),
//! the guest-wide count of completed requests ([`COMPLETED`]), and where a
//! thread's requests come from and go ([`next_request`], [`request_done`]):
//! its job's count in a closed loop, the arrivals in an open loop.
//!
//! Depends on [`crate::staged::runtime`] (threads, arrivals) and the stage
//! switch.

use core::sync::atomic::{AtomicU64, Ordering};

use hypercall_abi::stage::MAX_VCPUS;

use guest_agent::Platform;

use crate::staged::arrivals;
use crate::staged::platform::PortIo;
use crate::staged::runtime::{take_arrival, Thread};
use crate::staged::stats::{mark_at, MARKS};
use crate::staged::switch::{request_begin, stage_leave};

/// Per vCPU, the stage it ran last (`u32::MAX`: none yet), for `switch_cost`.
static LAST_STAGE: [core::sync::atomic::AtomicU32; MAX_VCPUS] =
    [const { core::sync::atomic::AtomicU32::new(u32::MAX) }; MAX_VCPUS];

/// `switch_cost=N`: a synthetic refill cost, N iterations of the mixing
/// loop whenever a vCPU runs a different stage than the one it ran last —
/// what a cold instruction cache costs a core that switches stage, and what
/// stage scheduling saves. A test fixture: it makes staging win by
/// construction (the tests of `--policy auto` use it); 0 (default) is off.
pub(super) fn cold_start(t: &Thread, stage: u32) {
    let cost = t.job.switch_cost;
    let vcpu = t.vcpu.load(Ordering::Relaxed) as usize;
    let Some(last) = LAST_STAGE.get(vcpu) else {
        return;
    };
    if cost != 0 && last.swap(stage, Ordering::Relaxed) != stage {
        let mut scratch = [u64::from(stage); 8];
        mix::<0x2545_f491_4f6c_dd1d>(&mut scratch, cost);
        core::hint::black_box(scratch);
    }
}

/// `n` rounds of xorshift64 mixing (with the stage's constant `K`, so each
/// stage has its own code) folded into the request: the `work=` option's
/// extra per-stage work (its result is only kept from being optimised
/// away). Nothing when `n` is 0.
#[inline(always)]
pub(super) fn mix<const K: u64>(req: &mut [u64; 8], n: u64) {
    if n == 0 {
        return;
    }
    let mut x = req[(K & 7) as usize] | 1;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = x.wrapping_add(K ^ i);
    }
    // Only the time counts: the result stays out of the checksum, so checksums
    // do not depend on work=, weights= or when a phase change happens.
    core::hint::black_box(x);
}

/// Requests completed by all threads (drives `phase=1`).
pub(super) static COMPLETED: AtomicU64 = AtomicU64::new(0);

/// Counts one completed request guest-wide and notes the steady-state
/// marks (`stats::mark_at`); returns the count before it.
#[inline]
pub(super) fn complete() -> u64 {
    let before = COMPLETED.fetch_add(1, Ordering::Relaxed);
    if let Some(k) = mark_at(before + 1) {
        MARKS[k].store(PortIo.tsc(), Ordering::Relaxed);
    }
    before
}

/// Whether `t` runs its `r`-th request (from 0): in a closed loop while
/// `r` is below its job's count; in an open loop when it takes one that
/// arrived (waiting for it; none when every request was released and
/// taken), whose start is its arrival.
pub(super) fn next_request(t: &Thread, r: u64) -> bool {
    if !arrivals::is_open() {
        return r < t.job.requests;
    }
    let Some(arrival) = take_arrival(t) else {
        return false;
    };
    t.arrival.store(arrival, Ordering::Relaxed);
    request_begin(t, Some(arrival));
    true
}

/// `t` finished its request: it leaves its stage (`switch::stage_leave`),
/// the request counts guest-wide, and in an open loop its latency from
/// arrival is recorded (`arrivals::record`).
pub(super) fn request_done(t: &Thread) {
    let open = arrivals::is_open();
    stage_leave(t, open);
    let before = complete();
    t.served
        .store(t.served.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    if open {
        let vcpu = t.vcpu.load(Ordering::Relaxed);
        arrivals::record(vcpu, t.arrival.load(Ordering::Relaxed), before);
    }
}
