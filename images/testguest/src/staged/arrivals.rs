//! Open-loop load (`arrival=RATE`, `arrival_dist=fixed|poisson`,
//! `queue=N`): requests arrive at their own pace, whatever the guest does,
//! as a production server's clients send them.
//!
//! A generator releases each request at its arrival time (the schedule of
//! `stage_workload::arrivals`, the same as the host reference's) into a
//! bounded queue of arrival TSCs; a full queue drops the request and counts
//! it, and the generator never waits. It runs in whichever vCPU's scheduler
//! loop notices a request is due ([`release_due`]: one TSC read and one
//! load when none is), idle vCPUs included; a parked vCPU's WAIT ends at
//! the next arrival ([`next_arrival`]). Guest threads take requests from
//! the queue ([`try_take`]); a thread that finds it empty waits among the
//! waiting threads ([`park`], once its context is saved), off every run
//! queue, and a released request wakes one ([`wake_one`]). The run ends
//! when every request was released and the queue is empty: the waiting
//! threads are woken to find nothing and finish.
//!
//! Each request's latency, from its arrival to its `stage_exit`, goes to a
//! per-vCPU histogram (the ABI's buckets) when it completes in the steady
//! middle of the run (10 % to 90 % of the requests, as the closed loop's
//! steady rate), and [`print`] gives the achieved rate, p50/p99/p99.9 and
//! the drops.
//!
//! Depends on [`super::thread`], [`super::platform`], [`super::config`] and
//! [`super::stats`]'s line buffer only; the runtime drives it.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use guest_agent::Platform;
use hypercall_abi::stage::{latency_bucket, latency_bucket_lower_ns, LATENCY_BUCKETS, MAX_VCPUS};
use stage_workload::arrivals::{ArrivalDist, Arrivals, Phases};

use super::config::MAX_THREADS_PER_VCPU;
use super::platform::PortIo;
use super::thread::Thread;
use crate::print_line;

/// The open-loop parameters.
#[derive(Clone, Copy, Debug)]
pub struct ArrivalConfig {
    /// Requests per second for the whole guest.
    pub rate: u64,
    /// Gaps: fixed or exponential.
    pub dist: ArrivalDist,
    /// The queue's capacity (requests, 1..=[`QUEUE_MAX`]).
    pub queue: usize,
    /// Busy and idle windows (ms; `on` 0: always busy): `phases=`.
    pub phases_ms: Phases,
}

/// Largest queue of released requests.
pub const QUEUE_MAX: usize = 4096;
/// Most threads that can wait for a request.
const MAX_WAITING: usize = MAX_VCPUS * MAX_THREADS_PER_VCPU;

/// The generator's state, under [`GEN`]'s lock.
struct Gen {
    /// The gaps (`None` before [`configure`]).
    schedule: Option<Arrivals>,
    /// The on/off windows, in TSC ticks.
    phases: Phases,
    /// TSC of the first arrival.
    start: u64,
    /// Requests to release in all, and released so far (queued or
    /// dropped).
    total: u64,
    released: u64,
    /// The next arrival's TSC.
    next: u64,
    queue: [u64; QUEUE_MAX],
    head: usize,
    len: usize,
    cap: usize,
    waiting: [*const Thread; MAX_WAITING],
    nwaiting: usize,
    /// Threads woken that have not come to take a request yet: a queued
    /// request wakes one thread, not one per scheduler pass until it is
    /// taken.
    woken: usize,
}

impl Gen {
    /// The TSC of the schedule's next arrival, laid over the on windows.
    fn next_from_start(&mut self) -> u64 {
        let active = self
            .schedule
            .as_mut()
            .map_or(u64::MAX, Arrivals::next_arrival);
        let phases = self.phases;
        self.start.saturating_add(phases.wall(active))
    }

    /// The generator before [`configure`]; built in the static, not on a
    /// vCPU's stack (the arrays alone are ≈ 40 KiB).
    const EMPTY: Gen = Gen {
        schedule: None,
        phases: Phases {
            on: 0,
            off: 0,
            offset: 0,
            low_pct: 0,
        },
        start: 0,
        total: 0,
        released: 0,
        next: u64::MAX,
        queue: [0; QUEUE_MAX],
        head: 0,
        len: 0,
        cap: 1,
        waiting: [core::ptr::null(); MAX_WAITING],
        nwaiting: 0,
        woken: 0,
    };
}

/// A spinlock around the generator (any vCPU may take it).
struct Locked {
    lock: AtomicBool,
    gen: UnsafeCell<Gen>,
}

// SAFETY: `gen` is only touched with `lock` held (`with`); the thread
// pointers in it are to threads that live for the whole run.
unsafe impl Sync for Locked {}

static GEN: Locked = Locked {
    lock: AtomicBool::new(false),
    gen: UnsafeCell::new(Gen::EMPTY),
};

/// Open loop configured, the next arrival's TSC (`u64::MAX` when every
/// request was released), and hints read without the lock: requests
/// queued, threads waiting.
static OPEN: AtomicBool = AtomicBool::new(false);
static NEXT: AtomicU64 = AtomicU64::new(u64::MAX);
static QUEUED: AtomicU64 = AtomicU64::new(0);
static WAITING: AtomicU64 = AtomicU64::new(0);
/// Released requests, dropped ones, and the configuration, for [`print`].
static RELEASED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static RATE: AtomicU64 = AtomicU64::new(0);
static POISSON: AtomicBool = AtomicBool::new(false);
static CAP: AtomicU64 = AtomicU64::new(0);
/// Requests in all and the TSC rate (kHz), read without the lock.
static TOTAL: AtomicU64 = AtomicU64::new(0);
static KHZ: AtomicU64 = AtomicU64::new(1);

/// Runs `f` on the generator with its lock held (`None` before
/// [`configure`]).
fn with<R>(f: impl FnOnce(&mut Gen) -> R) -> Option<R> {
    while GEN
        .lock
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        core::hint::spin_loop();
    }
    // SAFETY: the lock is held; nothing else touches `gen` meanwhile.
    let g = unsafe { &mut *GEN.gen.get() };
    let r = g.schedule.is_some().then(|| f(g));
    GEN.lock.store(false, Ordering::Release);
    r
}

/// Sets the open loop up (vCPU 0, before the threads are released):
/// `total` requests at `cfg`'s rate, on a TSC of `khz` kHz.
pub(super) fn configure(cfg: &ArrivalConfig, total: u64, khz: u64) {
    RATE.store(cfg.rate, Ordering::Relaxed);
    POISSON.store(cfg.dist == ArrivalDist::Poisson, Ordering::Relaxed);
    CAP.store(cfg.queue as u64, Ordering::Relaxed);
    TOTAL.store(total, Ordering::Relaxed);
    KHZ.store(khz.max(1), Ordering::Relaxed);
    // SAFETY: vCPU 0 alone, before any other vCPU runs the staged phase
    // (the lock is not needed yet, and is free).
    // Fields are set in place: the static is already `Gen::EMPTY`.
    let g = unsafe { &mut *GEN.gen.get() };
    g.total = total;
    g.cap = cfg.queue.clamp(1, QUEUE_MAX);
    g.schedule = Some(Arrivals::new(
        cfg.rate,
        cfg.dist,
        khz.max(1).saturating_mul(1000),
    ));
    let ticks = |ms: u64| ms.saturating_mul(khz.max(1));
    g.phases = Phases {
        on: ticks(cfg.phases_ms.on),
        off: ticks(cfg.phases_ms.off),
        offset: ticks(cfg.phases_ms.offset),
        low_pct: cfg.phases_ms.low_pct,
    };
    OPEN.store(true, Ordering::Release);
}

/// Whether the run is open-loop.
pub fn is_open() -> bool {
    OPEN.load(Ordering::Relaxed)
}

/// Starts the schedule: the first request arrives at TSC `now`.
pub(super) fn start(now: u64) {
    with(|g| {
        g.start = now;
        g.next = g.next_from_start();
        NEXT.store(g.next, Ordering::Release);
    });
}

/// The next arrival's TSC (`u64::MAX` when none is left or in a closed
/// loop): a parked vCPU waits no longer.
pub(super) fn next_arrival() -> u64 {
    NEXT.load(Ordering::Relaxed)
}

/// Releases every request due at TSC `now` into the queue (dropping, and
/// counting, those a full queue cannot take). Cheap when none is due.
pub(super) fn release_due(now: u64) {
    if now < NEXT.load(Ordering::Relaxed) {
        return;
    }
    with(|g| {
        while g.released < g.total && g.next <= now {
            if g.len < g.cap {
                let at = (g.head + g.len) % QUEUE_MAX;
                g.queue[at] = g.next;
                g.len += 1;
            } else {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
            g.released += 1;
            g.next = g.next_from_start();
        }
        if g.released >= g.total {
            g.next = u64::MAX;
        }
        RELEASED.store(g.released, Ordering::Relaxed);
        QUEUED.store(g.len as u64, Ordering::Relaxed);
        NEXT.store(g.next, Ordering::Release);
    });
}

/// What [`try_take`] found.
pub(super) enum Take {
    /// A request that arrived at this TSC.
    Arrival(u64),
    /// None is queued; more will come.
    Empty,
    /// Every request was released and taken: the thread is done.
    Done,
}

/// Takes the oldest queued request for `t`.
pub(super) fn try_take(t: &Thread) -> Take {
    let woken = t.woken.swap(false, Ordering::Relaxed);
    with(|g| {
        if woken {
            g.woken = g.woken.saturating_sub(1);
        }
        if g.len > 0 {
            let a = g.queue[g.head];
            g.head = (g.head + 1) % QUEUE_MAX;
            g.len -= 1;
            QUEUED.store(g.len as u64, Ordering::Relaxed);
            Take::Arrival(a)
        } else if g.released >= g.total {
            Take::Done
        } else {
            Take::Empty
        }
    })
    .unwrap_or(Take::Done)
}

/// Parks `t` (its context saved: it found the queue empty) among the
/// waiting threads; false when a request came meanwhile or the run is
/// over (the caller queues it to run again).
pub(super) fn park(t: &'static Thread) -> bool {
    with(|g| {
        if g.len > 0 || g.released >= g.total || g.nwaiting >= MAX_WAITING {
            return false;
        }
        g.waiting[g.nwaiting] = t;
        g.nwaiting += 1;
        WAITING.store(g.nwaiting as u64, Ordering::Relaxed);
        true
    })
    .unwrap_or(false)
}

/// A waiting thread to wake, when a queued request (or the end of the run)
/// has no thread woken for it yet: one per queued request, all at the end.
pub(super) fn wake_one() -> Option<&'static Thread> {
    if WAITING.load(Ordering::Relaxed) == 0
        || (QUEUED.load(Ordering::Relaxed) == 0 && NEXT.load(Ordering::Relaxed) != u64::MAX)
    {
        return None;
    }
    with(|g| {
        let over = g.released >= g.total;
        if g.nwaiting == 0 || (g.len <= g.woken && !over) {
            return None;
        }
        g.nwaiting -= 1;
        g.woken += 1;
        WAITING.store(g.nwaiting as u64, Ordering::Relaxed);
        // SAFETY: parked threads live for the whole run.
        let t: &'static Thread = unsafe { &*g.waiting[g.nwaiting] };
        t.woken.store(true, Ordering::Relaxed);
        Some(t)
    })
    .flatten()
}

/// Per vCPU, the steady latencies of its completed requests (buckets of
/// the ABI's scheme), written only by that vCPU.
#[repr(C, align(128))]
struct Latencies([AtomicU64; LATENCY_BUCKETS]);
static LATENCIES: [Latencies; MAX_VCPUS] =
    [const { Latencies([const { AtomicU64::new(0) }; LATENCY_BUCKETS]) }; MAX_VCPUS];
/// Per vCPU, requests completed (all) and the TSC of the last one.
static SERVED: [AtomicU64; MAX_VCPUS] = [const { AtomicU64::new(0) }; MAX_VCPUS];
static LAST_DONE: AtomicU64 = AtomicU64::new(0);

/// A request that arrived at `arrival` completed on `vcpu` now; it was the
/// `completed`-th guest-wide (from 0): its latency counts when it falls in
/// the steady middle of the run.
pub(super) fn record(vcpu: u32, arrival: u64, completed: u64) {
    let now = PortIo.tsc();
    let v = vcpu as usize;
    let Some(served) = SERVED.get(v) else {
        return;
    };
    super::stats::bump(served, 1);
    LAST_DONE.fetch_max(now, Ordering::Relaxed);
    let total = TOTAL.load(Ordering::Relaxed);
    if completed < total / 10 || completed >= total - total / 10 {
        return;
    }
    let khz = KHZ.load(Ordering::Relaxed);
    let ns = (u128::from(now.saturating_sub(arrival)) * 1_000_000 / u128::from(khz)) as u64;
    super::stats::bump(&LATENCIES[v].0[latency_bucket(ns)], 1);
}

/// The `q` quantile of `buckets` (ns, a bucket's midpoint; 0 when empty).
fn quantile_ns(buckets: &[u64; LATENCY_BUCKETS], q_permille: u64) -> u64 {
    let n: u64 = buckets.iter().sum();
    let rank = (n * q_permille).div_ceil(1000).max(1);
    let mut seen = 0;
    for (b, c) in buckets.iter().enumerate() {
        seen += c;
        if seen >= rank {
            let lo = latency_bucket_lower_ns(b);
            let hi = latency_bucket_lower_ns(b + 1).min(lo.saturating_mul(2).max(lo + 16));
            return lo + (hi - lo) / 2;
        }
    }
    0
}

/// Prints the open loop's line: the rate asked for and achieved, the
/// requests released, served and dropped, and the steady latencies from
/// arrival (`testguest: open loop …`).
pub(super) fn print(num_vcpus: usize, khz: u64) {
    if !is_open() {
        return;
    }
    let mut merged = [0u64; LATENCY_BUCKETS];
    for l in &LATENCIES[..num_vcpus] {
        for (m, c) in merged.iter_mut().zip(&l.0) {
            *m += c.load(Ordering::Relaxed);
        }
    }
    let served: u64 = SERVED[..num_vcpus]
        .iter()
        .map(|s| s.load(Ordering::Relaxed))
        .sum();
    let start = with(|g| g.start).unwrap_or(0);
    let span = LAST_DONE
        .load(Ordering::Relaxed)
        .saturating_sub(start)
        .max(1);
    let achieved = u128::from(served) * u128::from(khz) * 1000 / u128::from(span);
    // µs with one decimal.
    let us = |q| {
        let ns = quantile_ns(&merged, q);
        Us(ns / 1000, ns % 1000 / 100)
    };
    println!(
        "testguest: open loop: arrival {} requests/s {}, queue {}: released {}, served {}, dropped {}; achieved {} requests/s; latency from arrival p50 {} us p99 {} us p999 {} us ({} steady requests)",
        RATE.load(Ordering::Relaxed),
        if POISSON.load(Ordering::Relaxed) { "poisson" } else { "fixed" },
        CAP.load(Ordering::Relaxed),
        RELEASED.load(Ordering::Relaxed),
        served,
        DROPPED.load(Ordering::Relaxed),
        achieved,
        us(500),
        us(990),
        us(999),
        merged.iter().sum::<u64>()
    );
}

/// µs and tenths, printed `12.3`.
struct Us(u64, u64);

impl core::fmt::Display for Us {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}
