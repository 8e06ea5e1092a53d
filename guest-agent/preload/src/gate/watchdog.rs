//! The watchdog: one thread per process, started when the gate first
//! makes a thread wait, that keeps the wait bound and notices a gate
//! switched off while every thread waits.
//!
//! It sleeps on a futex word of its own, without a timer while nobody
//! waits, and otherwise until the earliest waiter's deadline (its wait's
//! start + `max_wait_us`). Then it scans the lanes: each waiter whose
//! deadline has passed is timed out and woken with the token. A waiter
//! announces itself by bumping the word (`watch_arrival`), and wakes the
//! watchdog only when it sleeps without a timer; the watchdog reads the
//! word before it scans and sleeps without a timer only while the word
//! still holds that value, so a first waiter arriving during a scan is
//! never missed. With a deadline it ignores arrivals: theirs are later.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};
use std::sync::Once;

use super::{futex_wait, futex_wake, now_ns, runtime, Runtime, GRANTED};
use crate::control::mode;

/// The watchdog's state.
pub(super) struct Watch {
    /// Bumped by each arrival; the watchdog sleeps on it.
    word: AtomicU32,
    /// The watchdog sleeps without a deadline.
    idle: AtomicBool,
    started: Once,
}

impl Default for Watch {
    fn default() -> Self {
        Self {
            word: AtomicU32::new(0),
            idle: AtomicBool::new(false),
            started: Once::new(),
        }
    }
}

impl Runtime {
    /// A thread is about to wait: start the watchdog if needed, and wake it
    /// if it sleeps without a deadline.
    pub(super) fn watch_arrival(&self) {
        let w = &self.watch;
        w.started.call_once(|| {
            let spawned = std::thread::Builder::new()
                .name("stagevm-gate".into())
                .spawn(|| {
                    if let Some(rt) = runtime() {
                        rt.watchdog();
                    }
                });
            if let Err(e) = spawned {
                eprintln!("stagevm-preload: warning: no watchdog thread ({e}): waits are bounded only by other threads' stage points");
            }
        });
        w.word.fetch_add(1, SeqCst);
        if w.idle.load(SeqCst) {
            futex_wake(&w.word);
        }
    }

    fn watchdog(&self) -> ! {
        let w = &self.watch;
        let c = self.control.get();
        loop {
            let seen = w.word.load(SeqCst);
            if c.mode() == mode::OFF && self.gate_seen_on.load(Relaxed) {
                self.release_all();
            }
            match self.expire(now_ns(), c.max_wait_ns()) {
                Some(deadline) => {
                    // Threads that began to wait since the scan have later
                    // deadlines than this one: no need to wake for them, so
                    // sleep on the word as it is now (comparing with the
                    // value before the scan would turn every arrival during
                    // a scan into another scan: a busy loop at high rates).
                    let wait = deadline.saturating_sub(now_ns()).max(1_000);
                    futex_wait(&w.word, w.word.load(SeqCst), Some(wait));
                }
                None => {
                    // Nobody waited at the scan: sleep without a timer unless
                    // a thread began to wait since (then the word moved).
                    w.idle.store(true, SeqCst);
                    futex_wait(&w.word, seen, None);
                    w.idle.store(false, SeqCst);
                }
            }
        }
    }

    /// Times out every waiter whose wait began `max_wait_ns` or more
    /// before `now`; returns the earliest deadline still ahead, if any.
    pub(super) fn expire(&self, now: u64, max_wait_ns: u64) -> Option<u64> {
        let mut next: Option<u64> = None;
        let mut wake = Vec::new();
        for (i, lane) in self.lanes.iter().enumerate() {
            // A lane whose lock is not had in time (its holder stopped):
            // free its waiters past the bound without it.
            let Some(mut core) = lane.lock() else {
                if let Some(d) = self.bypass_waiters(i, now.max(now_ns()), max_wait_ns) {
                    earliest(&mut next, d);
                }
                continue;
            };
            let waiting: Vec<_> = core.waiters().collect();
            for u in waiting {
                // 0: queued but not yet announced (it bumps the word next).
                let since = self.since[u as usize].load(Acquire);
                if since == 0 {
                    continue;
                }
                let deadline = since.saturating_add(max_wait_ns);
                if deadline <= now {
                    if core.timeout(u, now) {
                        self.words[u as usize].store(GRANTED, Release);
                        wake.push(u);
                    }
                } else {
                    earliest(&mut next, deadline);
                }
            }
            self.publish(i, &core);
        }
        for u in wake {
            futex_wake(&self.words[u as usize]);
        }
        next
    }
}

/// Keeps in `next` the earlier of it and `deadline` (ns).
pub(super) fn earliest(next: &mut Option<u64>, deadline: u64) {
    *next = Some(next.map_or(deadline, |n| n.min(deadline)));
}
