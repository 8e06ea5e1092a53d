//! A lane and its lock, waited for at most 20 ms.
//!
//! Every stage point of a bound thread takes its lane's lock for a few
//! hundred ns. A thread stopped inside that section (a tracer's
//! `PTRACE_INTERRUPT`, a debugger's breakpoint, a thread stopped for
//! `gcore`) would otherwise stall every thread of the lane and the
//! watchdog until it runs again: the token's wait bound means nothing
//! when the lock around the token is the thing that waits. So the lock is
//! waited for at most [`LOCK_WAIT_NS`] ([`Lane::lock`]); a lane whose lock
//! was not had in time is marked *stuck*, and until a
//! thread has its lock again every stage point of the lane tries the lock
//! once and, failing, goes on without the gate (a *bypass*, counted in
//! the lane's `bypasses`). The watchdog frees that lane's waiters past
//! their bound without the lock ([`Runtime::bypass_waiters`]): it reads
//! each slot's wait start and lane (atomics) and moves its futex word
//! from `WAITING` to `RELEASED`. A freed waiter stays in the lane's queue
//! until its next stage point takes it out (or the token reaches it,
//! harmlessly: it runs already); at worst a thread that ends one wait and
//! begins another during that scan is freed early, without the gate.
//!
//! The lock is a futex word of three states (0 free, 1 held, 2 held with
//! waiters: U. Drepper, "Futexes Are Tricky", 2011, §6 "Mutex, Take 2"),
//! every wait on it timed. Not `parking_lot`'s `try_lock_for`: it parks
//! through a lock of its own on a hash bucket, waited for without a bound,
//! so a thread stopped inside `parking_lot` stalls its waiters after all.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};

use super::watchdog::earliest;
use super::{futex_wait, futex_wake, now_ns, Runtime, RELEASED, WAITING};
use crate::control::MAX_SLOTS;
use crate::lane::LaneCore;

/// How long a thread waits for a lane's lock, ns: 20 ms, longer than a
/// busy CPU keeps a preempted thread off it (a scheduler period: a few
/// ms; Linux's `sched_latency_ns` default 6 ms × (1 + log2 CPUs)), so
/// that a lock holder merely preempted is waited for and only one that
/// is stopped gets its lane bypassed. (With the wait bound instead, 1 ms,
/// the 4 threads of `tests/native.rs`'s server bound to one CPU bypassed
/// their lane 86,300 times in their first 300 ms: preempted holders.)
pub(super) const LOCK_WAIT_NS: u64 = 20_000_000;

/// One lane: a CPU, its state and its lock.
pub(super) struct Lane {
    /// The CPU the lane's threads are bound to.
    pub(super) cpu: usize,
    /// The lock's futex word: 0 free, 1 held, 2 held with waiters.
    word: AtomicU32,
    core: UnsafeCell<LaneCore>,
    /// The policy code the core follows.
    pub(super) policy: AtomicU32,
    /// The lock was not had within the bound; cleared by the next thread
    /// that has it.
    stuck: AtomicBool,
}

// SAFETY: `core` is reached only through a `Held`, which exists only while
// `word` is nonzero and was made nonzero by its maker (mutual exclusion).
unsafe impl Sync for Lane {}

/// The lane's lock, held: its state, which it unlocks when dropped.
pub(super) struct Held<'a>(&'a Lane);

impl Deref for Held<'_> {
    type Target = LaneCore;
    fn deref(&self) -> &LaneCore {
        // SAFETY: the lock is held (see `Lane`'s Sync).
        unsafe { &*self.0.core.get() }
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut LaneCore {
        // SAFETY: as above; `&mut self` makes this reference unique.
        unsafe { &mut *self.0.core.get() }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.0.word.swap(0, Release) == 2 {
            futex_wake(&self.0.word);
        }
    }
}

impl Lane {
    /// A lane on `cpu` whose state is `core`, following `policy` (code).
    pub(super) fn new(cpu: usize, core: LaneCore, policy: u32) -> Self {
        Self {
            cpu,
            word: AtomicU32::new(0),
            core: UnsafeCell::new(core),
            policy: AtomicU32::new(policy),
            stuck: AtomicBool::new(false),
        }
    }

    /// The lane's lock, waited for at most [`LOCK_WAIT_NS`], and not at
    /// all while the lane is stuck. `None`: not had; the lane is stuck
    /// from now on and the caller goes on without the gate.
    pub(super) fn lock(&self) -> Option<Held<'_>> {
        let stuck = self.stuck.load(Relaxed);
        let held = if stuck {
            self.try_lock()
        } else {
            self.lock_until(Some(now_ns().saturating_add(LOCK_WAIT_NS)))
        };
        match (held.is_some(), stuck) {
            (true, true) => self.stuck.store(false, Relaxed),
            (false, false) => self.stuck.store(true, Relaxed),
            _ => {}
        }
        held
    }

    fn try_lock(&self) -> Option<Held<'_>> {
        self.word
            .compare_exchange(0, 1, Acquire, Relaxed)
            .ok()
            .map(|_| Held(self))
    }

    /// Takes the lock before `deadline` (ns, [`now_ns`]'s clock; `None`:
    /// however long it takes).
    fn lock_until(&self, deadline: Option<u64>) -> Option<Held<'_>> {
        if let Some(h) = self.try_lock() {
            return Some(h);
        }
        loop {
            // Marks the lock contended; takes it if it was free.
            if self.word.swap(2, Acquire) == 0 {
                return Some(Held(self));
            }
            let left = match deadline {
                Some(d) => match d.checked_sub(now_ns()) {
                    Some(left) if left > 0 => Some(left),
                    _ => return None,
                },
                None => None,
            };
            futex_wait(&self.word, 2, left);
        }
    }

    /// True while the lane is stuck (its lock was not had in time).
    #[cfg(test)]
    pub(super) fn is_stuck(&self) -> bool {
        self.stuck.load(Relaxed)
    }

    /// The lock, however long it takes (tests: a holder that stops).
    #[cfg(test)]
    pub(super) fn lock_blocking(&self) -> Held<'_> {
        self.lock_until(None).expect("no deadline")
    }
}

impl Runtime {
    /// Frees, without lane `i`'s lock, each of its waiters whose wait
    /// began `max_wait_ns` (ns) or more before `now` (ns; `max_wait_ns`
    /// 0: every waiter), counting each in the lane's `bypasses`. Returns
    /// the earliest deadline still ahead, if any. Work: one pass over the
    /// slots in use (at most [`MAX_SLOTS`]).
    pub(super) fn bypass_waiters(&self, i: usize, now: u64, max_wait_ns: u64) -> Option<u64> {
        let c = self.control.get();
        let used = (self.next_slot.load(Acquire) as usize).min(MAX_SLOTS);
        let mut next: Option<u64> = None;
        for u in 0..used {
            if c.slots[u].lane.load(Relaxed) as usize != i {
                continue;
            }
            let since = self.since[u].load(Acquire);
            if since == 0 {
                continue;
            }
            let deadline = since.saturating_add(max_wait_ns);
            if deadline > now {
                earliest(&mut next, deadline);
                continue;
            }
            let word = &self.words[u];
            if word
                .compare_exchange(WAITING, RELEASED, AcqRel, Relaxed)
                .is_ok()
            {
                c.lanes[i].bypasses.fetch_add(1, Relaxed);
                futex_wake(word);
            }
        }
        next
    }
}
