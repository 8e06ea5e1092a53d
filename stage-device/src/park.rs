//! Parking of vCPU threads for the stage channel's WAIT / WAKE doorbells.
//!
//! A vCPU thread that rings WAIT blocks in [`Parkers::park`] until another
//! vCPU's WAKE (or the host's safety-net wake) calls [`Parkers::unpark`], its
//! timeout passes, or the VM ends ([`Parkers::stop`]). A wake that arrives
//! before the WAIT leaves a token, so the WAIT returns at once: no wake-up
//! is lost between the guest's "parked" store and its doorbell.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

struct Parker {
    woken: Mutex<bool>,
    cv: Condvar,
}

/// One parking slot per vCPU.
pub struct Parkers {
    slots: Vec<Parker>,
    stopping: AtomicBool,
}

impl Parkers {
    /// Slots for `num_vcpus` vCPUs.
    pub fn new(num_vcpus: u32) -> Self {
        Self {
            slots: (0..num_vcpus)
                .map(|_| Parker {
                    woken: Mutex::new(false),
                    cv: Condvar::new(),
                })
                .collect(),
            stopping: AtomicBool::new(false),
        }
    }

    /// Blocks the calling thread as vCPU `vcpu` for at most `timeout`, until
    /// a wake token is there or the VM ends; consumes the token. Returns
    /// false for a vCPU index out of range.
    pub fn park(&self, vcpu: u32, timeout: Duration) -> bool {
        let Some(p) = self.slots.get(vcpu as usize) else {
            return false;
        };
        let woken = p.woken.lock().unwrap_or_else(|e| e.into_inner());
        let (mut woken, _) =
            p.cv.wait_timeout_while(woken, timeout, |w| {
                !*w && !self.stopping.load(Ordering::Acquire)
            })
            .unwrap_or_else(|e| e.into_inner());
        *woken = false;
        true
    }

    /// Leaves a wake token for vCPU `vcpu` and wakes it if it is parked.
    /// Returns false for a vCPU index out of range.
    pub fn unpark(&self, vcpu: u32) -> bool {
        let Some(p) = self.slots.get(vcpu as usize) else {
            return false;
        };
        *p.woken.lock().unwrap_or_else(|e| e.into_inner()) = true;
        p.cv.notify_one();
        true
    }

    /// Unparks every vCPU for good (the VM is ending): later parks return at
    /// once.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        for p in &self.slots {
            let _guard = p.woken.lock().unwrap_or_else(|e| e.into_inner());
            p.cv.notify_all();
        }
    }
}
