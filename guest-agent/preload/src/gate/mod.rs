//! The stage point at run time and the temporal gate's mechanism: thread
//! slots, lanes bound to CPUs, the futexes threads block on.
//!
//! A stage point ([`point_fast`]) with the gate off costs a thread-local read,
//! a compare, one counter store and one load of the control page's mode.
//! With the gate on ([`crate::control::mode::TEMPORAL`]) a thread is bound
//! to a lane (the lane with the fewest threads; `sched_setaffinity` to its
//! CPU, the thread's own mask saved) and each stage switch goes through the
//! lane's [`LaneCore`] under the lane's mutex. A thread that must wait
//! blocks on a private futex word of its slot, which its waker sets to
//! [`GRANTED`] under the lane's lock (so a late waker can never grant a
//! later wait), or [`RELEASED`] when the gate is switched off. It waits at
//! most the control page's `max_wait_us`: then the watchdog thread grants
//! it the token ([`LaneCore::timeout`]).
//!
//! Switching the gate off is seen by the next stage point of any thread,
//! or by the watchdog at the next wait bound: every waiter is then
//! released at once, and each thread restores its own CPU mask at its next
//! stage point.
//!
//! The lane's lock is waited for at most 20 ms (`lanes`): a thread stopped
//! while it holds it stalls no other longer.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Mutex;

use crate::channel;
use crate::control::{mode, Control, Mapping, MAX_SLOTS};
use crate::hooks::PointKind;
use crate::lane::{Arrival, LaneCore, Slot};

mod lanes;
mod report;
#[cfg(test)]
mod tests;
mod watchdog;

use lanes::Lane;

/// Futex word: waiting.
const WAITING: u32 = 0;
/// Futex word: the token was handed to this thread.
pub const GRANTED: u32 = 1;
/// Futex word: the gate was switched off; run on.
pub const RELEASED: u32 = 2;

const NONE: u32 = u32::MAX;
const NO_STAGE: u8 = u8::MAX;
/// `ThreadState::report`: nothing for the channel.
const REPORT_NONE: u16 = u16::MAX;
/// `ThreadState::report`: the request is done (`stage_exit`).
const REPORT_EXIT: u16 = 0x100;

/// The library's run-time state (one per process).
pub struct Runtime {
    control: Mapping,
    lanes: Vec<Lane>,
    /// Per slot: the futex word its thread waits on.
    words: Box<[AtomicU32]>,
    /// Per slot: when its thread began to wait (ns; 0: not waiting).
    since: Box<[AtomicU64]>,
    /// The watchdog (bounded waits; `watchdog`).
    watch: watchdog::Watch,
    /// Slots never used yet start here; freed ones go to `free`.
    next_slot: AtomicU32,
    free: Mutex<Vec<u32>>,
    /// The gate was seen on (so switching it off must release waiters).
    gate_seen_on: AtomicBool,
}

static RUNTIME: AtomicPtr<Runtime> = AtomicPtr::new(std::ptr::null_mut());

/// Makes `rt` the process's run time (leaked: it lives as long as the
/// hooks that use it). Call once, before installing hooks.
pub fn install_runtime(control: Mapping, cpus: &[usize], stages: usize) {
    let rt = Box::new(Runtime::new(control, cpus, stages));
    RUNTIME.store(Box::into_raw(rt), Release);
}

impl Runtime {
    /// A run time with lanes on `cpus` (at most
    /// [`crate::control::MAX_LANES`]) over `stages` stages.
    fn new(control: Mapping, cpus: &[usize], stages: usize) -> Self {
        let c = control.get();
        let policy = c.policy();
        let lanes: Vec<Lane> = cpus
            .iter()
            .take(crate::control::MAX_LANES)
            .enumerate()
            .map(|(i, &cpu)| {
                c.lanes[i].cpu.store(cpu as u32, Relaxed);
                Lane::new(cpu, LaneCore::new(policy, stages), policy.code() as u32)
            })
            .collect();
        c.header.lanes.store(lanes.len() as u32, Relaxed);
        Runtime {
            control,
            lanes,
            words: (0..MAX_SLOTS).map(|_| AtomicU32::new(WAITING)).collect(),
            since: (0..MAX_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            watch: watchdog::Watch::default(),
            next_slot: AtomicU32::new(0),
            free: Mutex::new(Vec::new()),
            gate_seen_on: AtomicBool::new(false),
        }
    }
}

fn runtime() -> Option<&'static Runtime> {
    // SAFETY: RUNTIME is null or a leaked Box that is never freed.
    unsafe { RUNTIME.load(Acquire).as_ref() }
}

/// A thread's state (plain data: reading it registers no destructor, so
/// the fast path never calls into libc).
struct ThreadState {
    slot: Cell<u32>,
    /// The stage entered last (`NO_STAGE`: none yet).
    stage: Cell<u8>,
    /// The lane it is bound to (`NONE`: unbound).
    lane: Cell<u32>,
    /// The thread's CPU mask before binding.
    saved: Cell<Option<libc::cpu_set_t>>,
    /// The thread's scheduling policy before binding.
    policy: Cell<i32>,
    /// The last point was a request marker (nested markers count once).
    after_marker: Cell<bool>,
    /// The lane counts it in a request (holder, or running past a wait).
    gated: Cell<bool>,
    /// The fast path found work for the gate (the slow path's gate part
    /// runs only then).
    gate_due: Cell<bool>,
    /// The stage the channel last got (`NO_STAGE`: none, or the request
    /// ended).
    ch_stage: Cell<u8>,
    /// What the slow path reports to the channel: a stage, `REPORT_EXIT`
    /// or `REPORT_NONE`.
    report: Cell<u16>,
}

impl ThreadState {
    /// A thread that has met no stage point yet.
    const fn new() -> Self {
        Self {
            slot: Cell::new(NONE),
            stage: Cell::new(NO_STAGE),
            lane: Cell::new(NONE),
            saved: Cell::new(None),
            policy: Cell::new(0),
            after_marker: Cell::new(false),
            gated: Cell::new(false),
            gate_due: Cell::new(false),
            ch_stage: Cell::new(NO_STAGE),
            report: Cell::new(REPORT_NONE),
        }
    }
}

/// Registered (slow path) when a thread takes a slot: at thread exit it
/// leaves the lane and frees the slot.
struct ExitGuard;

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let Some(rt) = runtime() else { return };
        let _ = THREAD.try_with(|t| {
            if t.lane.get() != NONE {
                rt.unbind(t);
            }
            let slot = t.slot.replace(NONE);
            if slot != NONE {
                rt.control.get().slots[slot as usize]
                    .lane
                    .store(NONE, Relaxed);
                rt.free.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
            }
        });
    }
}

thread_local! {
    static THREAD: ThreadState = const { ThreadState::new() };
    static EXIT: ExitGuard = const { ExitGuard };
}

/// Monotonic time, ns.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// The stage point's fast path (called by every hook with the caller's
/// registers saved, but not its vector state beyond `xmm0`–`xmm15`): counts
/// the visit or request. Returns true when the slow path ([`point_slow`])
/// must run: the thread has no slot yet, or the gate must act. Touches no
/// libc function and no vector register beyond SSE.
#[inline]
pub fn point_fast(point: PointKind) -> bool {
    let Some(rt) = runtime() else { return false };
    THREAD.try_with(|t| rt.fast(t, point)).unwrap_or(false)
}

/// The stage point's slow path: a slot for a new thread, and the gate
/// (binding, queues, futexes). Called with the whole extended state saved
/// (XSAVE), so it may call anything.
pub fn point_slow(point: PointKind) {
    let Some(rt) = runtime() else { return };
    let _ = THREAD.try_with(|t| rt.slow(t, point));
}

impl Runtime {
    /// Counts; true when the gate or the channel must act (see
    /// [`point_fast`]).
    #[inline]
    fn fast(&self, t: &ThreadState, point: PointKind) -> bool {
        let c = self.control.get();
        let slot = t.slot.get();
        if slot == NONE {
            return true;
        }
        let block = &c.slots[slot as usize];
        let off = c.mode() == mode::OFF;
        let ch = channel::active() && (Self::channel_due(t, point) | channel::map_changed());
        let gate = match point {
            PointKind::Stage(s) => {
                // A visit: a switch, or the first stage point of a request
                // (after a request marker), as the channel reports them.
                let new_request = t.after_marker.replace(false);
                let switch = t.stage.get() != s;
                if switch || new_request {
                    t.stage.set(s);
                    let v = &block.visits[usize::from(s) % block.visits.len()];
                    v.store(v.load(Relaxed).wrapping_add(1), Relaxed);
                }
                if off {
                    self.gate_seen_on.load(Relaxed) || t.lane.get() != NONE
                } else {
                    switch || !t.gated.get()
                }
            }
            PointKind::Request(_) if t.after_marker.replace(true) => false,
            PointKind::Request(s) => {
                block
                    .requests
                    .store(block.requests.load(Relaxed).wrapping_add(1), Relaxed);
                t.stage.set(s);
                if off {
                    self.gate_seen_on.load(Relaxed) || t.lane.get() != NONE
                } else {
                    t.gated.get()
                }
            }
        };
        t.gate_due.set(gate);
        gate || ch
    }

    /// The gate's part of a stage point (see [`point_slow`]).
    fn slow(&self, t: &ThreadState, point: PointKind) {
        let c = self.control.get();
        let mut slot = t.slot.get();
        if slot == NONE {
            slot = self.take_slot(t);
            if slot == NONE {
                c.header.unslotted.fetch_add(1, Relaxed);
                return;
            }
            let _ = EXIT.try_with(|_| ());
            if !self.fast(t, point) {
                return;
            }
        }
        // A new map first (it may switch the gate), then the gate, then
        // the report: a switch is reported when the thread runs its visit,
        // on the CPU it runs it on.
        if channel::map_changed() {
            channel::follow(c);
        }
        if t.gate_due.replace(false) {
            let off = c.mode() == mode::OFF;
            match point {
                PointKind::Stage(s) if !off => {
                    self.gate_on();
                    self.arrive(t, slot, s);
                }
                PointKind::Request(_) if !off => {
                    if t.gated.get() {
                        self.leave(t, slot);
                    }
                }
                _ => self.gate_off(t),
            }
        }
        if channel::active() {
            self.report(t);
        }
    }

    /// The slow path of a thread's first stage point: a slot.
    #[cold]
    fn take_slot(&self, t: &ThreadState) -> u32 {
        let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let slot = reused.unwrap_or_else(|| {
            let s = self.next_slot.fetch_add(1, Relaxed);
            if s as usize >= MAX_SLOTS {
                self.next_slot.store(MAX_SLOTS as u32, Relaxed);
                NONE
            } else {
                s
            }
        });
        if slot != NONE {
            t.slot.set(slot);
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            self.control.get().slots[slot as usize]
                .tid
                .store(tid, Relaxed);
        }
        slot
    }

    /// The gate is on: remember it, so that switching it off releases.
    #[inline]
    fn gate_on(&self) {
        if !self.gate_seen_on.load(Relaxed) {
            self.gate_seen_on.store(true, Relaxed);
        }
    }

    /// The gate is off: release every waiter once, unbind this thread.
    #[inline]
    fn gate_off(&self, t: &ThreadState) {
        if self.gate_seen_on.load(Relaxed) {
            self.release_all();
        }
        if t.lane.get() != NONE {
            self.unbind(t);
        }
    }

    /// Releases every waiter of every lane (the gate was switched off).
    #[cold]
    fn release_all(&self) {
        if !self.gate_seen_on.swap(false, AcqRel) {
            return;
        }
        self.control.get().header.releases.fetch_add(1, Relaxed);
        for (i, lane) in self.lanes.iter().enumerate() {
            let Some(mut core) = lane.lock() else {
                self.bypass_waiters(i, now_ns(), 0);
                continue;
            };
            let out = core.release_all();
            for u in &out {
                self.words[*u as usize].store(RELEASED, Release);
            }
            self.publish(i, &core);
            drop(core);
            for u in out {
                futex_wake(&self.words[u as usize]);
            }
        }
    }

    /// Binds the thread to the lane with the fewest threads.
    #[cold]
    fn bind(&self, t: &ThreadState, slot: Slot) -> Option<usize> {
        let c = self.control.get();
        let (i, lane) = self
            .lanes
            .iter()
            .enumerate()
            .min_by_key(|(i, _)| c.lanes[*i].threads.load(Relaxed))?;
        // SAFETY: cpu_set_t is plain data; the calls read/write ours only.
        let mut saved: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: as above.
        if unsafe { libc::sched_getaffinity(0, size, &mut saved) } != 0 {
            return None;
        }
        // SAFETY: as above.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: lane CPUs are < CPU_SETSIZE (control::MAX_LANES lanes of
        // CPUs from the process's own mask).
        unsafe { libc::CPU_SET(lane.cpu, &mut one) };
        // SAFETY: as above.
        if unsafe { libc::sched_setaffinity(0, size, &one) } != 0 {
            return None;
        }
        t.saved.set(Some(saved));
        // SAFETY: reads this thread's policy.
        t.policy.set(unsafe { libc::sched_getscheduler(0) });
        set_policy(libc::SCHED_BATCH);
        t.lane.set(i as u32);
        c.lanes[i].threads.fetch_add(1, Relaxed);
        c.slots[slot as usize].lane.store(i as u32, Relaxed);
        Some(i)
    }

    /// Leaves the lane and restores the thread's CPU mask.
    #[cold]
    fn unbind(&self, t: &ThreadState) {
        let i = t.lane.replace(NONE) as usize;
        let slot = t.slot.get();
        let c = self.control.get();
        if let Some(lane) = self.lanes.get(i) {
            if t.gated.get() {
                self.leave_lane(i, lane, slot);
                t.gated.set(false);
            }
            c.lanes[i].threads.fetch_sub(1, Relaxed);
        }
        if let Some(saved) = t.saved.take() {
            // SAFETY: restores the mask this thread had (our own cpu_set_t).
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &saved) };
            if t.policy.get() == libc::SCHED_OTHER {
                set_policy(libc::SCHED_OTHER);
            }
        }
        if slot != NONE {
            c.slots[slot as usize].lane.store(NONE, Relaxed);
        }
    }

    /// A request marker: the thread leaves its lane until its next stage.
    fn leave(&self, t: &ThreadState, slot: Slot) {
        let i = t.lane.get() as usize;
        if let Some(lane) = self.lanes.get(i) {
            self.leave_lane(i, lane, slot);
        }
        t.gated.set(false);
    }

    fn leave_lane(&self, i: usize, lane: &Lane, slot: Slot) {
        let c = self.control.get();
        let Some(mut core) = lane.lock() else {
            c.lanes[i].bypasses.fetch_add(1, Relaxed);
            return;
        };
        let wake = core.leave(slot, now_ns());
        if let Some(u) = wake {
            self.words[u as usize].store(GRANTED, Release);
        }
        self.publish(i, &core);
        drop(core);
        if let Some(u) = wake {
            futex_wake(&self.words[u as usize]);
        }
    }

    /// A stage switch with the gate on.
    fn arrive(&self, t: &ThreadState, slot: Slot, stage: u8) {
        let i = match t.lane.get() {
            NONE => match self.bind(t, slot) {
                Some(i) => i,
                None => return,
            },
            i => i as usize,
        };
        let Some(lane) = self.lanes.get(i) else {
            return;
        };
        let c = self.control.get();
        let start = now_ns();
        let Some(mut core) = lane.lock() else {
            c.lanes[i].bypasses.fetch_add(1, Relaxed);
            return;
        };
        let policy = c.policy();
        if lane.policy.load(Relaxed) != policy.code() as u32 {
            core.set_policy(policy);
            lane.policy.store(policy.code() as u32, Relaxed);
        }
        let word = &self.words[slot as usize];
        word.store(WAITING, Relaxed);
        let arrival = core.arrive(slot, usize::from(stage), start);
        let wake = match arrival {
            Arrival::Wait { wake: Some(u) } => {
                self.words[u as usize].store(GRANTED, Release);
                Some(u)
            }
            _ => None,
        };
        self.publish(i, &core);
        drop(core);
        t.gated.set(true);
        if let Some(u) = wake {
            futex_wake(&self.words[u as usize]);
        }
        if arrival != Arrival::Run {
            self.wait(i, slot, start);
        }
    }

    /// Blocks until granted (by a handoff, or by the watchdog at the wait
    /// bound) or released. The futex wait has no timeout: arming a timer
    /// per wait costs ~4 µs per handoff on these machines (a futex
    /// ping-pong between two threads on one CPU: 1.7 µs per handoff
    /// without a timeout, 5.7 µs with one); the one watchdog thread keeps
    /// the bound instead (`watchdog`).
    fn wait(&self, i: usize, slot: Slot, start: u64) {
        let c = self.control.get();
        let word = &self.words[slot as usize];
        self.since[slot as usize].store(start.max(1), Release);
        self.watch_arrival();
        loop {
            if word.load(Acquire) != WAITING {
                break;
            }
            if c.mode() == mode::OFF {
                self.release_all();
                break;
            }
            futex_wait(word, WAITING, None);
        }
        self.since[slot as usize].store(0, Relaxed);
        c.lanes[i]
            .wait_ns
            .fetch_add(now_ns().saturating_sub(start), Relaxed);
    }

    /// Copies lane `i`'s counters to the control page (under its lock).
    fn publish(&self, i: usize, core: &LaneCore) {
        let b = &self.control.get().lanes[i];
        let n = core.counts();
        b.visits.store(n.visits, Relaxed);
        b.handoffs.store(n.handoffs, Relaxed);
        b.timeouts.store(n.timeouts, Relaxed);
        b.cohorts.store(n.cohorts, Relaxed);
        b.cohort_threads.store(n.cohort_threads, Relaxed);
        b.released.store(n.released, Relaxed);
    }
}

/// The control page, for the library's start-up report.
pub fn control() -> Option<&'static Control> {
    runtime().map(|rt| rt.control.get())
}

/// Sets this thread's scheduling policy (`SCHED_BATCH` or `SCHED_OTHER`,
/// priority 0: no privilege needed). A bound thread runs `SCHED_BATCH`: a
/// thread woken with the token then does not preempt its waker at once
/// (CFS/EEVDF skip wake-up preemption for batch threads), so the waker
/// reaches its own wait first and a handoff is one context switch, not two.
fn set_policy(policy: i32) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: changes this thread's own policy with a valid param.
    unsafe { libc::sched_setscheduler(0, policy, &param) };
}

/// Waits while `word` holds `expected`, at most `timeout_ns` (none: no
/// timer).
fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    let ts = timeout_ns.map(|t| libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    });
    // SAFETY: FUTEX_WAIT on a live aligned u32 with a relative timeout we
    // own; an early return (EAGAIN, EINTR, a spurious wake) is rechecked by
    // the caller's loop.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            ts.as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec),
        )
    };
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE of one waiter on a live aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        )
    };
}
