//! The guest's thread runtime: cooperative threads on stacks of their own
//! ([`Thread`], switched by `testguest_ctx_switch`), one run queue per vCPU
//! in guest memory ([`RUNQ`], spinlocked, usable from any vCPU), and each
//! vCPU's scheduler loop ([`schedule`]), which resumes the threads of its
//! queue and, once a thread that yielded has its context saved, queues it
//! again here or on the vCPU it asked to move to ([`Thread::migrate_to`]).
//! [`run_vcpu`] is a vCPU's whole part of the staged phase.
//!
//! Idle vCPUs poll with back-off (PAUSE) for [`IdleConfig`]'s time — long on
//! a core the host says the vCPU owns, short on a shared one — then park with the
//! channel's WAIT (no lost wake-ups: `parked = 1`, re-check, WAIT; a pusher
//! raises the target's run-queue depth, pushes, then WAKEs it if parked).
//!
//! Which queued thread runs next is the host's stage-visit policy (the
//! map's `visit`, ABI minor 3): FIFO, or temporal staging — threads wait
//! in per-stage queues at every stage switch and [`guest_agent::visit`]'s
//! [`Visitor`] picks the stage to serve (Cohort, SRPT, DBR, MG1), or the
//! vCPUs share one queue tagged by stage (Color, [`SHARED`]).
//!
//! Open loop (`arrival=`, [`super::arrivals`]): every scheduler pass and
//! every idle poll releases the requests that are due; a thread that finds
//! none waits off the run queues until one comes ([`take_arrival`]), and a
//! released request wakes a waiting thread on the least-loaded vCPU that
//! serves the first stage ([`poll_arrivals`]).
//!
//! What a thread runs is not the runtime's business: [`run_vcpu`] takes the
//! threads' entry function and the maker of their
//! [`Job`](super::config::Job)s from the workload layer. Thread stacks come
//! from [`super::platform::alloc_pages`].
//!
//! Depends on [`super::thread`], [`super::runq`], [`super::map`],
//! [`super::platform`], [`super::stats`], [`super::config`],
//! [`super::arrivals`] and [`super::balance`] only; the stage switch
//! ([`super::switch`]) and the workloads build on it.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use guest_agent::visit::Visitor;
use guest_agent::{Platform, VisitPolicy};
use hypercall_abi::stage::{MAX_STAGES, MAX_VCPUS, STAGE_NONE};

use super::arrivals::{self, Take};
use super::balance::{balance, steal, BALANCE_EVERY, STEAL_EVERY};
use super::config::{IdleConfig, StagedConfig, MAX_THREADS_PER_VCPU};
use super::map::{map_on, visit_on};
use super::platform::{agent, num_vcpus, PortIo};
use super::runq::{queue_len, NO_STAGE, RUNQ, SHARED};
use super::stats::{bump, count, END_TSC, START_TSC, TOTAL_REQUESTS, VCPU_COUNTS};
use super::thread::{new_thread, testguest_ctx_switch, NONE};
pub(super) use super::thread::{Entry, NewJob, Thread};
use crate::print_line;

/// Longest back-off between two checks of an empty run queue (PAUSEs).
const IDLE_MAX_SPIN: u32 = 64;
/// Timeout of one WAIT of an idle vCPU (µs).
const IDLE_WAIT_US: u32 = 1000;

/// Per vCPU, the scheduler loop's saved stack pointer while a thread runs
/// (written and read only on that vCPU).
static SCHED_RSP: [SchedRsp; MAX_VCPUS] = [const { SchedRsp(AtomicU64::new(0)) }; MAX_VCPUS];

/// One vCPU's saved scheduler stack pointer, on cache lines of its own
/// (written at every switch: shared lines would bounce between vCPUs).
#[repr(C, align(128))]
struct SchedRsp(AtomicU64);

/// vCPUs that created and queued their threads; vCPU 0 releases them all
/// once every vCPU has.
static ARRIVED: AtomicU32 = AtomicU32::new(0);
static RELEASED: AtomicBool = AtomicBool::new(false);
/// Threads of the whole guest not done yet.
static LIVE: AtomicU32 = AtomicU32::new(0);

/// Yields back to the scheduler loop of the vCPU running `t`.
fn yield_now(t: &Thread) {
    let vcpu = t.vcpu.load(Ordering::Relaxed) as usize;
    // SAFETY: switches to this vCPU's scheduler context (saved when it
    // resumed us); a scheduler resumes us later through `t.rsp`.
    unsafe {
        testguest_ctx_switch(t.rsp.as_ptr(), SCHED_RSP[vcpu].0.load(Ordering::Relaxed));
    }
}

/// Yields `t` and adds the time until it runs again to the switch
/// statistics `k` (0: through its own vCPU's queue, 1: a migration).
/// Returns that time (TSC ticks, from just before the yield to just after
/// the thread resumed).
pub(super) fn timed_yield(t: &Thread, k: usize) -> u64 {
    let t0 = PortIo.tsc();
    yield_now(t);
    let waited = PortIo.tsc().wrapping_sub(t0);
    // Counted on the vCPU that resumed the thread (this code runs there).
    let counts = &VCPU_COUNTS[t.vcpu.load(Ordering::Relaxed) as usize];
    bump(&counts.switch_cycles[k], waited);
    bump(&counts.switches[k], 1);
    waited
}

/// Open loop: the next request for `t` (the TSC it arrived at), waiting
/// off the run queues while none is queued; `None` when every request was
/// released and taken (the thread is done).
pub(super) fn take_arrival(t: &Thread) -> Option<u64> {
    loop {
        match arrivals::try_take(t) {
            Take::Arrival(a) => return Some(a),
            Take::Done => return None,
            Take::Empty => {
                // The scheduler parks it once its context is saved
                // (`schedule`), or runs it again if a request came.
                t.blocked.store(true, Ordering::Relaxed);
                yield_now(t);
            }
        }
    }
}

/// Open loop: releases the requests due now and wakes a waiting thread for
/// each queued one, on the vCPU with the shortest queue among those that
/// serve the first stage (all, without a map), `vcpu` first on ties.
fn poll_arrivals(vcpu: u32) {
    arrivals::release_due(PortIo.tsc());
    while let Some(t) = arrivals::wake_one() {
        let n = num_vcpus();
        let first = map_on(vcpu).map_or(u64::MAX, |v| v.snap.vcpus[0]);
        let serves = |v: u32| v >= 64 || first == 0 || first & (1 << v) != 0;
        let target = core::iter::once(vcpu)
            .chain(0..n)
            .filter(|v| serves(*v))
            .min_by_key(|v| queue_len(*v))
            .unwrap_or(vcpu);
        enqueue(t, target, vcpu);
    }
}

/// Marks `t` done with `checksum` and yields for good.
pub(super) fn finish(t: &Thread, checksum: u64) -> ! {
    t.checksum.store(checksum, Ordering::Relaxed);
    t.done.store(true, Ordering::Release);
    loop {
        yield_now(t);
    }
}

/// Publishes `vcpu`'s queue length as its run-queue depth in the shared
/// area: the hint the host's safety-net wake reads for a parked vCPU. Only
/// done where it matters — before this vCPU parks, and when queuing on a
/// parked one — so the switch path writes no shared line.
fn publish_depth(vcpu: u32) {
    agent().set_runq_depth(vcpu, queue_len(vcpu));
}

/// Queues `t` on `vcpu` (called by the scheduler of `from`, after `t`'s
/// context is saved), then WAKEs `vcpu` if it idles, publishing its depth
/// first (the queue's own length, sequentially consistent, is what the
/// idler re-checks: no lost wake-up).
fn enqueue(t: &'static Thread, vcpu: u32, from: u32) {
    let a = agent();
    RUNQ[vcpu as usize].push(t);
    if vcpu != from && a.is_parked(vcpu) {
        publish_depth(vcpu);
        a.wake(vcpu);
        bump(&VCPU_COUNTS[from as usize].wakes, 1);
    }
}

/// TSC ticks an idle `vcpu` polls before parking: [`IdleConfig::owned_us`]
/// when the current map says it is alone on its host core, else
/// [`IdleConfig::shared_us`].
fn idle_spin_cycles(vcpu: u32, idle: &IdleConfig, tsc_khz: u64) -> u64 {
    let owned = agent()
        .read_map()
        .is_some_and(|m| vcpu < 64 && m.owned & (1 << vcpu) != 0);
    let us = if owned { idle.owned_us } else { idle.shared_us };
    tsc_khz.saturating_mul(us) / 1000
}

/// Waits for work on `vcpu`'s empty queue (or the end of the phase): polls
/// with exponential back-off (PAUSE), then, with an active channel, parks the
/// vCPU (`parked = 1`, re-check, WAIT) until a WAKE or the timeout. Other
/// vCPUs WAKE it only while it is parked.
fn idle(vcpu: u32, idle: &IdleConfig, tsc_khz: u64, shared: bool) {
    let a = agent();
    let q = &RUNQ[vcpu as usize];
    // Work for this vCPU: its own queue, and Color's shared one.
    let empty = || q.is_empty() && (!shared || SHARED.is_empty());
    // The host counts this vCPU's time as idle from here, not as the last
    // stage's (the policy's load is vCPU time per stage).
    count(vcpu, a.vcpu_idle(vcpu), &VCPU_COUNTS[vcpu as usize].idles);
    let spin_cycles = idle_spin_cycles(vcpu, idle, tsc_khz);
    // `spill_us=`: after this long idle, threads of other stages may be
    // taken (0: never).
    let spill_cycles = tsc_khz.saturating_mul(idle.spill_us) / 1000;
    let mut polls = 0u32;
    let start = PortIo.tsc();
    let mut spin = 1u32;
    let open = arrivals::is_open();
    while empty() && LIVE.load(Ordering::SeqCst) != 0 {
        polls = polls.wrapping_add(1);
        if open {
            poll_arrivals(vcpu);
            if !empty() {
                break;
            }
        }
        if polls % STEAL_EVERY == 1 {
            let spill = spill_cycles != 0 && PortIo.tsc().wrapping_sub(start) >= spill_cycles;
            if steal(vcpu, spill) {
                break;
            }
        }
        if a.is_active() && PortIo.tsc().wrapping_sub(start) >= spin_cycles {
            publish_depth(vcpu);
            a.set_parked(vcpu, true);
            if empty() && LIVE.load(Ordering::SeqCst) != 0 {
                // Open loop: no longer than until the next request is due.
                let us = match arrivals::next_arrival() {
                    u64::MAX => IDLE_WAIT_US,
                    next => {
                        let ticks = next.saturating_sub(PortIo.tsc());
                        (ticks.saturating_mul(1000) / tsc_khz.max(1))
                            .clamp(1, u64::from(IDLE_WAIT_US)) as u32
                    }
                };
                a.wait(us);
                bump(&VCPU_COUNTS[vcpu as usize].waits, 1);
            }
            a.set_parked(vcpu, false);
            continue;
        }
        for _ in 0..spin {
            core::hint::spin_loop();
        }
        spin = (spin * 2).min(IDLE_MAX_SPIN);
    }
    // Idle only until the phase ends (the last thread's end).
    let end = match END_TSC.load(Ordering::Relaxed) {
        0 => PortIo.tsc(),
        e => e.max(start),
    };
    bump(
        &VCPU_COUNTS[vcpu as usize].idle_cycles,
        end.saturating_sub(start),
    );
}

/// Per vCPU, its stage-visit state (touched only by that vCPU's
/// scheduler loop; `None` until its first temporal pick).
#[repr(C, align(128))]
struct VisitorCell(UnsafeCell<Option<Visitor>>);
// SAFETY: entry v is used only by vCPU v's scheduler loop, never across a
// thread's run.
unsafe impl Sync for VisitorCell {}
static VISITORS: [VisitorCell; MAX_VCPUS] =
    [const { VisitorCell(UnsafeCell::new(None)) }; MAX_VCPUS];

/// Whether Color's shared queue is the one `vcpu` serves: under Color with
/// a map that gives it every stage (`off`/`pinned`: Gordon's replicated
/// stage graph). Under a staged map a shared queue would hand it threads
/// of stages it does not serve, so there Color keeps each vCPU's own queue
/// in arrival order, tagged by stage.
fn color_shared(vcpu: u32, visit: VisitPolicy) -> bool {
    visit == VisitPolicy::Color
        && map_on(vcpu).is_some_and(|v| {
            let n = agent().layout().map_or(0, |l| l.num_stages as usize);
            (0..n.min(MAX_STAGES)).all(|s| v.here & (1 << s) != 0)
        })
}

/// The next thread `vcpu` runs under `visit`, and the stage whose queue it
/// came from when a [`Visitor`] chose it: FIFO pops its queue; Color its
/// own queue (new threads, arrivals), then the shared one; the polling
/// policies threads between requests first, then the stage the vCPU's
/// [`Visitor`] picks from the per-stage lengths.
fn pick(vcpu: u32, visit: VisitPolicy) -> Option<(&'static Thread, Option<usize>)> {
    let q = &RUNQ[vcpu as usize];
    match visit {
        VisitPolicy::Fifo => q.pop().map(|t| (t, None)),
        VisitPolicy::Color => q
            .pop()
            .or_else(|| color_shared(vcpu, visit).then(|| SHARED.pop()).flatten())
            .map(|t| (t, None)),
        _ => {
            if let Some(t) = q.take_class(NO_STAGE) {
                return Some((t, None));
            }
            let mut lens = [0u32; MAX_STAGES];
            q.stage_lens(&mut lens);
            match visitor_on(vcpu, visit).next(&lens) {
                // A steal may have taken the chosen thread: then any.
                Some(s) => q
                    .take_class(s)
                    .map(|t| (t, Some(s)))
                    .or_else(|| q.pop().map(|t| (t, None))),
                None => q.pop().map(|t| (t, None)),
            }
        }
    }
}

/// `vcpu`'s stage-visit state for `visit` (created on first use, reset
/// when the policy changes).
#[allow(clippy::mut_from_ref)]
fn visitor_on(vcpu: u32, visit: VisitPolicy) -> &'static mut Visitor {
    // SAFETY: vCPU `vcpu`'s own entry (see `VisitorCell`); its scheduler
    // loop holds the reference only between two picks.
    let cell = unsafe { &mut *VISITORS[vcpu as usize].0.get() };
    let v = cell.get_or_insert_with(|| {
        let stages = agent()
            .layout()
            .map_or(MAX_STAGES, |l| l.num_stages as usize);
        Visitor::new(visit, stages)
    });
    v.set_policy(visit);
    v
}

/// The visit policy vCPU 0 printed last (its code + 1; 0: none yet).
static SAID: AtomicU64 = AtomicU64::new(0);

/// vCPU 0 prints the visit policy each time the map it reads names a new
/// one (`testguest: visit policy NAME (map epoch E)`): the tests check an
/// operator's change reached the guest. The first is printed before the
/// threads are released ([`run_vcpu`]): a line on the serial port costs
/// milliseconds here, as long as a short run.
fn say_visit(vcpu: u32, visit: VisitPolicy) {
    if vcpu == 0 && SAID.load(Ordering::Relaxed) != visit.code() + 1 {
        SAID.store(visit.code() + 1, Ordering::Relaxed);
        println!(
            "testguest: visit policy {} (map epoch {})",
            visit.name(),
            agent().map_epoch()
        );
    }
}

/// `vcpu`'s scheduler loop: runs the threads of its queue until every thread
/// of the guest is done, in the order of the map's visit policy ([`pick`]).
/// A thread that yields is queued again here (Color: on the shared queue),
/// or on the vCPU it asked to move to.
fn schedule(vcpu: u32, idle_cfg: &IdleConfig, tsc_khz: u64) {
    let a = agent();
    let n = num_vcpus();
    let sched_rsp = SCHED_RSP[vcpu as usize].0.as_ptr();
    let counts = &VCPU_COUNTS[vcpu as usize];
    let mut last_stage = None;
    let mut picks = 0u32;
    let open = arrivals::is_open();
    loop {
        if open {
            poll_arrivals(vcpu);
        }
        let visit = visit_on(vcpu);
        say_visit(vcpu, visit);
        if visit.is_temporal() {
            picks = picks.wrapping_add(1);
            if picks.is_multiple_of(BALANCE_EVERY) {
                balance(vcpu);
            }
        }
        let Some((t, from)) = pick(vcpu, visit) else {
            if LIVE.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle(vcpu, idle_cfg, tsc_khz, color_shared(vcpu, visit));
            continue;
        };
        t.vcpu.store(vcpu, Ordering::Relaxed);
        let stage = t.stage.load(Ordering::Relaxed);
        if visit.is_temporal() && stage != STAGE_NONE {
            // A stage visit starts when the stage served changes.
            if last_stage != Some(stage) {
                bump(&counts.visits, 1);
                last_stage = Some(stage);
            }
            bump(&counts.visit_threads, 1);
        }
        let t0 = if from.is_some() { PortIo.tsc() } else { 0 };
        // SAFETY: resumes the thread; it switches back into `sched_rsp`.
        unsafe { testguest_ctx_switch(sched_rsp, t.rsp.load(Ordering::Relaxed)) };
        if let Some(s) = from {
            visitor_on(vcpu, visit).served(s, PortIo.tsc().wrapping_sub(t0));
        }
        // Only now, with its context saved, may the thread become visible to
        // another vCPU: a thread that found no request waits for one.
        if t.blocked.swap(false, Ordering::Relaxed) && arrivals::park(t) {
            continue;
        }
        if t.done.load(Ordering::Acquire) {
            if LIVE.fetch_sub(1, Ordering::SeqCst) == 1 {
                END_TSC.store(PortIo.tsc(), Ordering::Relaxed);
                for v in (0..n).filter(|v| *v != vcpu) {
                    if a.is_parked(v) {
                        a.wake(v);
                        bump(&VCPU_COUNTS[vcpu as usize].wakes, 1);
                    }
                }
            }
            continue;
        }
        let target = t.migrate_to.swap(NONE, Ordering::Relaxed);
        if target >= n
            && t.stage.load(Ordering::Relaxed) != STAGE_NONE
            && color_shared(vcpu, visit_on(vcpu))
        {
            SHARED.push(t);
        } else {
            enqueue(t, if target < n { target } else { vcpu }, vcpu);
        }
    }
}

/// This vCPU's part of the staged phase: creates `cfg.threads` threads (ids
/// `vcpu + num_vcpus × i`) on its own queue, waits until vCPU 0 releases all
/// vCPUs' threads together, schedules until every thread of the guest is done
/// (threads move between vCPUs at stage switches, following the host's
/// stage map), then prints the checksums of the threads it created.
/// vCPUs past [`MAX_VCPUS`] (no ring, no queue) take no part. The threads
/// run `entry` with the jobs `new_job` makes (the workload layer's).
pub(super) fn run_vcpu(
    vcpu: u32,
    num_vcpus: u32,
    cfg: &StagedConfig,
    tsc_khz: u64,
    entry: Entry,
    new_job: NewJob,
) {
    let num_vcpus = num_vcpus.min(MAX_VCPUS as u32);
    if vcpu >= num_vcpus {
        return;
    }
    let threads = cfg.threads.min(MAX_THREADS_PER_VCPU);
    let mut own: [Option<&'static Thread>; MAX_THREADS_PER_VCPU] = [None; MAX_THREADS_PER_VCPU];
    for (i, slot) in own.iter_mut().enumerate().take(threads) {
        let id = vcpu + num_vcpus * i as u32;
        let home = id % num_vcpus;
        let t = new_thread(id, home, cfg, entry, new_job);
        *slot = Some(t);
        RUNQ[home as usize].push(t);
    }
    LIVE.fetch_add(threads as u32, Ordering::SeqCst);
    TOTAL_REQUESTS.fetch_add(threads as u64 * cfg.requests, Ordering::Relaxed);
    ARRIVED.fetch_add(1, Ordering::AcqRel);
    if vcpu == 0 {
        while ARRIVED.load(Ordering::Acquire) < num_vcpus {
            core::hint::spin_loop();
        }
        say_visit(vcpu, visit_on(vcpu));
        if let Some(open) = &cfg.arrival {
            let total = TOTAL_REQUESTS.load(Ordering::Relaxed);
            arrivals::configure(open, total, tsc_khz);
        }
        let now = PortIo.tsc().max(1);
        START_TSC.store(now, Ordering::Relaxed);
        if arrivals::is_open() {
            arrivals::start(now);
        }
        RELEASED.store(true, Ordering::Release);
    } else {
        while !RELEASED.load(Ordering::Acquire) {
            core::hint::spin_loop();
        }
    }
    schedule(vcpu, &cfg.idle, tsc_khz);
    for t in own.iter().flatten() {
        // Open loop: the requests it happened to serve.
        let requests = if arrivals::is_open() {
            t.served.load(Ordering::Relaxed)
        } else {
            t.job.requests
        };
        println!(
            "thread {}: vcpu {}, requests {}, checksum {:#018x}",
            t.id,
            t.vcpu.load(Ordering::Relaxed),
            requests,
            t.checksum.load(Ordering::Relaxed)
        );
    }
}

/// `hold=1`: once every vCPU finished, keeps `vcpu` parked (WAIT, 1 s at a
/// time; spinning without an active channel) until the VMM ends the VM, so
/// an operator or a test reads final counters through the operator API
/// while nothing changes. A held vCPU reports itself idle first: the
/// vCPU that ran a thread's last request ends outside its idle loop, in
/// "no stage", which the host counts as busy (a held guest of 2 vCPUs read
/// 0.5 utilisation, and 1.0 when both ended that way).
pub fn hold(vcpu: u32) -> ! {
    let a = agent();
    if a.is_active() {
        let _ = a.vcpu_idle(vcpu);
    }
    loop {
        if a.is_active() {
            a.set_parked(vcpu, true);
            a.wait(1_000_000);
        } else {
            core::hint::spin_loop();
        }
    }
}
