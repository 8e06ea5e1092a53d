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
//! What a thread runs is not the runtime's business: [`run_vcpu`] takes the
//! threads' entry function and the maker of their [`Job`]s from the
//! workload layer. Thread stacks come from [`super::platform::alloc_pages`].
//!
//! Depends on [`super::platform`], [`super::stats`] and [`super::config`]
//! only; the stage switch ([`super::switch`]) and the workloads build on it.

use core::arch::global_asm;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use guest_agent::Platform;
use hypercall_abi::stage::{MAX_VCPUS, STAGE_NONE};

use super::config::{IdleConfig, Job, StagedConfig, MAX_THREADS_PER_VCPU};
use super::platform::{agent, alloc_pages, num_vcpus, PortIo};
use super::stats::{bump, count, END_TSC, START_TSC, TOTAL_REQUESTS, VCPU_COUNTS};
use crate::print_line;

/// Bytes of stack per guest thread.
const THREAD_STACK: u64 = 64 << 10;

global_asm!(
    r#"
    .global testguest_ctx_switch
testguest_ctx_switch:
    push rbp
    push rbx
    push r12
    push r13
    push r14
    push r15
    mov [rdi], rsp
    mov rsp, rsi
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbx
    pop rbp
    ret
    .global testguest_thread_trampoline
testguest_thread_trampoline:
    mov rdi, r12
    call r13
    ud2
"#
);

extern "C" {
    /// Saves callee-saved registers and RSP into `*save`, switches to `to`.
    fn testguest_ctx_switch(save: *mut u64, to: u64);
    fn testguest_thread_trampoline();
}

/// Thread id and vCPU value meaning "none".
const NONE: u32 = u32::MAX;
/// Bytes at the top of each thread's stack allocation that hold its
/// [`Thread`] (the stack grows down from below them).
const THREAD_HEADER: u64 = 256;
const _: () = assert!(core::mem::size_of::<Thread>() as u64 <= THREAD_HEADER);
/// Longest back-off between two checks of an empty run queue (PAUSEs).
const IDLE_MAX_SPIN: u32 = 64;
/// Timeout of one WAIT of an idle vCPU (µs).
const IDLE_WAIT_US: u32 = 1000;

/// A cooperative guest thread. It lives at the top of its own stack
/// allocation and moves between vCPUs' run queues: whoever popped it from a
/// queue owns it until it is pushed again (the queue locks order the
/// accesses), so every mutable field is an atomic used as a plain cell.
#[repr(C, align(64))]
pub(super) struct Thread {
    /// Saved stack pointer while the thread is not running (written by
    /// `testguest_ctx_switch`).
    rsp: AtomicU64,
    /// Next thread in the run queue it is on (under the queue's lock).
    next: AtomicPtr<Thread>,
    /// vCPU that runs it now or last ran it (set by the scheduler that resumes it).
    pub(super) vcpu: AtomicU32,
    /// vCPU it asked to move to at its last stage switch, or [`NONE`]; taken by
    /// the scheduler once the thread's context is saved.
    pub(super) migrate_to: AtomicU32,
    /// Stage it is in, or `STAGE_NONE` between requests.
    pub(super) stage: AtomicU32,
    /// Set when all its requests are done.
    done: AtomicBool,
    /// Checksum of its requests (final once `done`).
    checksum: AtomicU64,
    /// Unique id (`vcpu + num_vcpus × i` of the vCPU that created it).
    pub(super) id: u32,
    /// What it runs (requests and their parameters).
    pub(super) job: Job,
}

/// A vCPU's run queue: a FIFO of threads linked through [`Thread::next`],
/// under a spinlock, usable from any vCPU. 128-byte aligned: two vCPUs'
/// queues never share a pair of cache lines (the adjacent-line prefetcher
/// moves lines in pairs).
#[repr(C, align(128))]
struct RunQueue {
    lock: AtomicBool,
    len: AtomicU32,
    head: AtomicPtr<Thread>,
    tail: AtomicPtr<Thread>,
}

impl RunQueue {
    const fn new() -> Self {
        Self {
            lock: AtomicBool::new(false),
            len: AtomicU32::new(0),
            head: AtomicPtr::new(ptr::null_mut()),
            tail: AtomicPtr::new(ptr::null_mut()),
        }
    }

    fn lock(&self) {
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.lock.load(Ordering::Relaxed) {
                core::hint::spin_loop();
            }
        }
    }

    fn unlock(&self) {
        self.lock.store(false, Ordering::Release);
    }

    /// Lock-free check; sequentially consistent so that a vCPU that published
    /// `parked = 1` and then sees an empty queue cannot miss a pusher that
    /// then reads `parked` (no lost wake-ups).
    fn is_empty(&self) -> bool {
        self.len.load(Ordering::SeqCst) == 0
    }

    fn push(&self, t: &'static Thread) {
        let p = t as *const Thread as *mut Thread;
        t.next.store(ptr::null_mut(), Ordering::Relaxed);
        self.lock();
        let tail = self.tail.load(Ordering::Relaxed);
        if tail.is_null() {
            self.head.store(p, Ordering::Relaxed);
        } else {
            // SAFETY: threads on a queue are live (they are never freed).
            unsafe { (*tail).next.store(p, Ordering::Relaxed) };
        }
        self.tail.store(p, Ordering::Relaxed);
        self.len.fetch_add(1, Ordering::SeqCst);
        self.unlock();
    }

    fn pop(&self) -> Option<&'static Thread> {
        self.pop_if(|_| true)
    }

    /// Pops the head thread if `take` accepts it (under the queue's lock).
    fn pop_if(&self, take: impl Fn(&Thread) -> bool) -> Option<&'static Thread> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock();
        let head = self.head.load(Ordering::Relaxed);
        // SAFETY: threads on a queue are live and never freed.
        if head.is_null() || !take(unsafe { &*head }) {
            self.unlock();
            return None;
        }
        // SAFETY: as above.
        let t: &'static Thread = unsafe { &*head };
        let next = t.next.load(Ordering::Relaxed);
        self.head.store(next, Ordering::Relaxed);
        if next.is_null() {
            self.tail.store(ptr::null_mut(), Ordering::Relaxed);
        }
        self.len.fetch_sub(1, Ordering::SeqCst);
        self.unlock();
        Some(t)
    }
}

/// Per-vCPU run queues.
static RUNQ: [RunQueue; MAX_VCPUS] = [const { RunQueue::new() }; MAX_VCPUS];
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

/// Marks `t` done with `checksum` and yields for good.
pub(super) fn finish(t: &Thread, checksum: u64) -> ! {
    t.checksum.store(checksum, Ordering::Relaxed);
    t.done.store(true, Ordering::Release);
    loop {
        yield_now(t);
    }
}

/// Body of every guest thread, given by the workload layer and entered
/// through the trampoline with the thread's [`Thread`]; it ends with
/// [`finish`].
pub(super) type Entry = extern "C" fn(*const Thread);

/// Makes a new thread's [`Job`] under the config (the workload layer's,
/// which may allocate the thread's data).
pub(super) type NewJob = fn(&StagedConfig) -> Job;

/// Creates a thread on a fresh stack, to start on `vcpu` in `entry`,
/// running its share of `cfg` (the [`Job`] `new_job` makes).
fn new_thread(
    id: u32,
    vcpu: u32,
    cfg: &StagedConfig,
    entry: Entry,
    new_job: NewJob,
) -> &'static Thread {
    let Some(stack) = alloc_pages(THREAD_STACK) else {
        println!("testguest: out of memory for thread stacks");
        crate::shutdown(5);
    };
    let job = new_job(cfg);
    let slot = (stack + THREAD_STACK - THREAD_HEADER) as *mut Thread;
    // SAFETY: the top THREAD_HEADER bytes of our freshly allocated, 4 KiB
    // aligned stack; nothing else uses them.
    unsafe {
        slot.write(Thread {
            rsp: AtomicU64::new(0),
            next: AtomicPtr::new(ptr::null_mut()),
            vcpu: AtomicU32::new(vcpu),
            migrate_to: AtomicU32::new(NONE),
            stage: AtomicU32::new(STAGE_NONE),
            done: AtomicBool::new(false),
            checksum: AtomicU64::new(0),
            id,
            job,
        })
    };
    // SAFETY: initialised just above, never freed.
    let t: &'static Thread = unsafe { &*slot };
    // Initial frame popped by testguest_ctx_switch: r15, r14, r13 (entry),
    // r12 (argument), rbx, rbp, then the return address (the trampoline),
    // placed so RSP is 16-byte aligned at the trampoline's `call`.
    let top = slot as u64;
    let frame = (top - 56) as *mut u64;
    let words = [
        0,
        0,
        entry as *const () as u64,
        slot as u64,
        0,
        0,
        testguest_thread_trampoline as *const () as u64,
    ];
    for (k, word) in words.iter().enumerate() {
        // SAFETY: inside the freshly allocated stack, below the Thread.
        unsafe { frame.add(k).write(*word) };
    }
    t.rsp.store(frame as u64, Ordering::Relaxed);
    t
}

/// `vcpu`'s run-queue length (the guest's own, for the least-loaded
/// choice).
pub(super) fn queue_len(vcpu: u32) -> u32 {
    RUNQ[vcpu as usize].len.load(Ordering::Relaxed)
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

/// Work stealing under an unstaged map: an idle `vcpu` that serves every
/// stage takes the first waiting thread of the busiest other run queue, as
/// an OS balances its run queues. Without it, threads that a staged map
/// gathered on some vCPUs stay there after the map turns unstaged
/// (`--policy auto`'s trials) and the other vCPUs idle. Under a staged map
/// threads move only at stage switches, as before. Returns whether it took
/// one (counted as a migration, as the host counts it).
fn steal(vcpu: u32) -> bool {
    let a = agent();
    let n = num_vcpus();
    let map = a.read_map();
    let unstaged = map.is_none_or(|m| {
        m.vcpus
            .iter()
            .all(|mask| *mask == 0 || (vcpu < 64 && mask & (1 << vcpu) != 0))
    });
    if !unstaged {
        return false;
    }
    let Some(victim) = (0..n)
        .filter(|v| *v != vcpu)
        .max_by_key(|v| RUNQ[*v as usize].len.load(Ordering::Relaxed))
        .filter(|v| !RUNQ[*v as usize].is_empty())
    else {
        return false;
    };
    let serves = |t: &Thread| {
        let stage = t.stage.load(Ordering::Relaxed);
        stage == STAGE_NONE || map.is_none_or(|m| m.serves(stage, vcpu))
    };
    let Some(t) = RUNQ[victim as usize].pop_if(serves) else {
        return false;
    };
    let stage = t.stage.load(Ordering::Relaxed);
    let counts = &VCPU_COUNTS[vcpu as usize];
    if let Some(m) = counts.migrations_in.get(stage as usize) {
        bump(&counts.migrations, 1);
        bump(m, 1);
        // The thread keeps its stage and arrives here (this vCPU writes).
        a.count_migration(vcpu, STAGE_NONE, stage);
    }
    RUNQ[vcpu as usize].push(t);
    true
}

/// Polls between two steal attempts of an idle vCPU.
const STEAL_EVERY: u32 = 16;

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
fn idle(vcpu: u32, idle: &IdleConfig, tsc_khz: u64) {
    let a = agent();
    let q = &RUNQ[vcpu as usize];
    // The host counts this vCPU's time as idle from here, not as the last
    // stage's (the policy's load is vCPU time per stage).
    count(vcpu, a.vcpu_idle(vcpu), &VCPU_COUNTS[vcpu as usize].idles);
    let spin_cycles = idle_spin_cycles(vcpu, idle, tsc_khz);
    let mut polls = 0u32;
    let start = PortIo.tsc();
    let mut spin = 1u32;
    while q.is_empty() && LIVE.load(Ordering::SeqCst) != 0 {
        polls = polls.wrapping_add(1);
        if polls % STEAL_EVERY == 1 && steal(vcpu) {
            break;
        }
        if a.is_active() && PortIo.tsc().wrapping_sub(start) >= spin_cycles {
            publish_depth(vcpu);
            a.set_parked(vcpu, true);
            if q.is_empty() && LIVE.load(Ordering::SeqCst) != 0 {
                a.wait(IDLE_WAIT_US);
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

/// `vcpu`'s scheduler loop: runs the threads of its queue until every thread
/// of the guest is done. A thread that yields is queued again here, or on
/// the vCPU it asked to move to.
fn schedule(vcpu: u32, idle_cfg: &IdleConfig, tsc_khz: u64) {
    let a = agent();
    let n = num_vcpus();
    let sched_rsp = SCHED_RSP[vcpu as usize].0.as_ptr();
    loop {
        let Some(t) = RUNQ[vcpu as usize].pop() else {
            if LIVE.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle(vcpu, idle_cfg, tsc_khz);
            continue;
        };
        t.vcpu.store(vcpu, Ordering::Relaxed);
        // SAFETY: resumes the thread; it switches back into `sched_rsp`.
        unsafe { testguest_ctx_switch(sched_rsp, t.rsp.load(Ordering::Relaxed)) };
        // Only now, with its context saved, may the thread become visible to
        // another vCPU.
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
        enqueue(t, if target < n { target } else { vcpu }, vcpu);
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
        START_TSC.store(PortIo.tsc().max(1), Ordering::Relaxed);
        RELEASED.store(true, Ordering::Release);
    } else {
        while !RELEASED.load(Ordering::Acquire) {
            core::hint::spin_loop();
        }
    }
    schedule(vcpu, &cfg.idle, tsc_khz);
    for t in own.iter().flatten() {
        println!(
            "thread {}: vcpu {}, requests {}, checksum {:#018x}",
            t.id,
            t.vcpu.load(Ordering::Relaxed),
            t.job.requests,
            t.checksum.load(Ordering::Relaxed)
        );
    }
}

/// `hold=1`: once every vCPU finished, keeps `vcpu` parked (WAIT, 1 s at a
/// time; spinning without an active channel) until the VMM ends the VM, so
/// an operator or a test reads final counters through the operator API
/// while nothing changes.
pub fn hold(vcpu: u32) -> ! {
    let a = agent();
    loop {
        if a.is_active() {
            a.set_parked(vcpu, true);
            a.wait(1_000_000);
        } else {
            core::hint::spin_loop();
        }
    }
}
