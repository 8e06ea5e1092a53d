//! The per-vCPU run queues ([`RUNQ`]): a FIFO of [`Thread`]s per vCPU in
//! guest memory, spinlocked, usable from any vCPU, which also counts its
//! threads per stage (the lengths a stage-visit policy orders by), and the
//! queue the vCPUs share under the Color visit policy ([`SHARED`]).
//!
//! Depends on [`super::thread`] only.

use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

use hypercall_abi::stage::{MAX_STAGES, MAX_VCPUS, STAGE_NONE};

use super::thread::Thread;

/// A vCPU's run queue: a FIFO of threads linked through [`Thread::next`],
/// under a spinlock, usable from any vCPU. 128-byte aligned: two vCPUs'
/// queues never share a pair of cache lines (the adjacent-line prefetcher
/// moves lines in pairs).
#[repr(C, align(128))]
pub(super) struct RunQueue {
    lock: AtomicBool,
    pub(super) len: AtomicU32,
    head: AtomicPtr<Thread>,
    tail: AtomicPtr<Thread>,
    /// Threads queued per class ([`class`]: the stage a thread enters, or
    /// [`NO_STAGE`] between requests), written under the lock.
    stage_lens: [AtomicU32; CLASSES],
}

/// Queue classes: one per stage and [`NO_STAGE`].
pub(super) const CLASSES: usize = MAX_STAGES + 1;
/// The class of threads outside any stage (new, or between requests).
pub(super) const NO_STAGE: usize = MAX_STAGES;

/// A thread's class: the stage it is in (and runs when resumed), or
/// [`NO_STAGE`]. A queued thread's stage does not change (only the thread
/// itself changes it, while it runs).
fn class(t: &Thread) -> usize {
    match t.stage.load(Ordering::Relaxed) {
        STAGE_NONE => NO_STAGE,
        s => (s as usize).min(NO_STAGE),
    }
}

impl RunQueue {
    const fn new() -> Self {
        Self {
            lock: AtomicBool::new(false),
            len: AtomicU32::new(0),
            head: AtomicPtr::new(ptr::null_mut()),
            tail: AtomicPtr::new(ptr::null_mut()),
            stage_lens: [const { AtomicU32::new(0) }; CLASSES],
        }
    }

    /// Threads queued per stage (`out[s]`, stages `0..out.len()`), read
    /// without the lock (a hint: a take may still find none).
    pub(super) fn stage_lens(&self, out: &mut [u32]) {
        for (o, l) in out.iter_mut().zip(&self.stage_lens) {
            *o = l.load(Ordering::Relaxed);
        }
    }

    /// Unlinks and returns the first thread of class `c` (a stage, or
    /// [`NO_STAGE`]), if any.
    pub(super) fn take_class(&self, c: usize) -> Option<&'static Thread> {
        if self.stage_lens.get(c)?.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.take_first(|t| class(t) == c)
    }

    fn count(&self, t: &Thread, up: bool) {
        let l = &self.stage_lens[class(t)];
        let v = l.load(Ordering::Relaxed);
        l.store(
            if up { v + 1 } else { v.saturating_sub(1) },
            Ordering::Relaxed,
        );
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
    pub(super) fn is_empty(&self) -> bool {
        self.len.load(Ordering::SeqCst) == 0
    }

    pub(super) fn push(&self, t: &'static Thread) {
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
        self.count(t, true);
        self.len.fetch_add(1, Ordering::SeqCst);
        self.unlock();
    }

    pub(super) fn pop(&self) -> Option<&'static Thread> {
        self.pop_if(|_| true)
    }

    /// Unlinks and returns the first thread `take` accepts, scanning the
    /// whole queue under its lock (at most the guest's thread count).
    pub(super) fn take_first(&self, take: impl Fn(&Thread) -> bool) -> Option<&'static Thread> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock();
        let mut prev: *mut Thread = ptr::null_mut();
        let mut cur = self.head.load(Ordering::Relaxed);
        while !cur.is_null() {
            // SAFETY: threads on a queue are live and never freed.
            let t: &'static Thread = unsafe { &*cur };
            let next = t.next.load(Ordering::Relaxed);
            if take(t) {
                if prev.is_null() {
                    self.head.store(next, Ordering::Relaxed);
                } else {
                    // SAFETY: as above; `prev` is on this queue.
                    unsafe { (*prev).next.store(next, Ordering::Relaxed) };
                }
                if next.is_null() {
                    self.tail.store(prev, Ordering::Relaxed);
                }
                self.count(t, false);
                self.len.fetch_sub(1, Ordering::SeqCst);
                self.unlock();
                return Some(t);
            }
            prev = cur;
            cur = next;
        }
        self.unlock();
        None
    }

    /// Pops the head thread if `take` accepts it (under the queue's lock).
    pub(super) fn pop_if(&self, take: impl Fn(&Thread) -> bool) -> Option<&'static Thread> {
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
        self.count(t, false);
        self.len.fetch_sub(1, Ordering::SeqCst);
        self.unlock();
        Some(t)
    }
}

/// Per-vCPU run queues.
pub(super) static RUNQ: [RunQueue; MAX_VCPUS] = [const { RunQueue::new() }; MAX_VCPUS];
/// The queue every vCPU serves under the Color visit policy (seed 002
/// §3.1.4): threads that yielded at a stage switch, in arrival order, each
/// tagged by its stage (its class); a vCPU takes the oldest of a stage it
/// serves.
pub(super) static SHARED: RunQueue = RunQueue::new();
/// `vcpu`'s run-queue length (the guest's own, for the least-loaded
/// choice).
pub(super) fn queue_len(vcpu: u32) -> u32 {
    RUNQ[vcpu as usize].len.load(Ordering::Relaxed)
}
