//! One lane's temporal gate as pure logic: the queues, the run token and
//! the visit order. A lane is one CPU; the threads bound to it run one at a
//! time, and at each stage point the thread that holds the lane's token
//! joins the queue of the stage it enters and the lane's [`Visitor`] (the
//! guest runtime's stage-visit rules, seed 002 ch. 3, one implementation:
//! `guest_agent::visit`) picks the stage, and so the thread, that runs next.
//!
//! The clock is an input (ns, any monotonic origin) and every call returns
//! a decision; the caller (`gate.rs`) owns the threads, the futexes and the
//! lock. Threads are named by their slot (`u32`).
//!
//! Rules:
//! * **Work-conserving** at a stage point: a thread that arrives when no
//!   thread holds the token, and whose stage the visitor picks, runs on at
//!   once (no block); the holder that reaches a stage point and is picked
//!   again runs on too.
//! * **Bounded waits**: a waiter whose wait reaches the gate's bound is
//!   timed out ([`LaneCore::timeout`], by the gate's watchdog) and takes
//!   the token (the holder is presumed
//!   blocked inside its stage); the old holder, back at a stage point,
//!   queues like any other thread.
//! * **Releasable**: [`LaneCore::release_all`] empties every queue and
//!   returns the waiters to wake.

use std::collections::VecDeque;

use guest_agent::visit::Visitor;
use hypercall_abi::stage::{VisitPolicy, MAX_STAGES};

/// A thread's slot number.
pub type Slot = u32;

/// What a thread at a stage point does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// It holds the token: run the stage now.
    Run,
    /// Wait until granted (or the wait bound); `wake` is the thread that
    /// got the token instead, if one must be woken.
    Wait {
        /// The thread to wake, if any.
        wake: Option<Slot>,
    },
}

/// Counters of one lane (units: events; `cohort_threads` sums the sizes of
/// the cohorts that ended, `cohorts` counts them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneCounts {
    /// Visits begun (token grants, including run-ons).
    pub visits: u64,
    /// Grants to a thread other than the one that arrived (a handoff: one
    /// thread blocks, another wakes).
    pub handoffs: u64,
    /// Waits that reached the bound (the waiter took the token).
    pub timeouts: u64,
    /// Cohorts ended: runs of consecutive visits of one stage.
    pub cohorts: u64,
    /// Threads served in the cohorts that ended.
    pub cohort_threads: u64,
    /// Waiters released by [`LaneCore::release_all`].
    pub released: u64,
}

/// The holder of a lane's token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    slot: Slot,
    stage: usize,
    since_ns: u64,
}

/// One lane's state (module docs).
#[derive(Debug)]
pub struct LaneCore {
    visitor: Visitor,
    stages: usize,
    queues: [VecDeque<Slot>; MAX_STAGES],
    holder: Option<Holder>,
    /// The stage of the cohort being served and its size so far.
    cohort: Option<(usize, u64)>,
    counts: LaneCounts,
}

impl LaneCore {
    /// A lane over `stages` stages (clamped to 1..=[`MAX_STAGES`]) ordered
    /// by `policy`.
    pub fn new(policy: VisitPolicy, stages: usize) -> Self {
        let stages = stages.clamp(1, MAX_STAGES);
        Self {
            visitor: Visitor::new(policy, stages),
            stages,
            queues: Default::default(),
            holder: None,
            cohort: None,
            counts: LaneCounts::default(),
        }
    }

    /// Follows `policy` from now on (the visitor keeps its measured
    /// service times).
    pub fn set_policy(&mut self, policy: VisitPolicy) {
        self.visitor.set_policy(policy);
    }

    /// The lane's counters.
    pub fn counts(&self) -> LaneCounts {
        self.counts
    }

    /// The thread holding the token, if any.
    pub fn holder(&self) -> Option<Slot> {
        self.holder.map(|h| h.slot)
    }

    /// Threads waiting, all stages.
    pub fn waiting(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// The threads waiting, every stage.
    pub fn waiters(&self) -> impl Iterator<Item = Slot> + '_ {
        self.queues.iter().flatten().copied()
    }

    /// Thread `t` reaches a stage point that enters `stage` (taken modulo
    /// the lane's stages) at `now_ns`.
    pub fn arrive(&mut self, t: Slot, stage: usize, now_ns: u64) -> Arrival {
        let stage = stage % self.stages;
        self.end_visit(t, now_ns);
        self.unqueue(t);
        self.queues[stage].push_back(t);
        if self.holder.is_some() {
            return Arrival::Wait { wake: None };
        }
        match self.dispatch(now_ns) {
            Some(u) if u == t => Arrival::Run,
            wake => {
                self.counts.handoffs += u64::from(wake.is_some());
                Arrival::Wait { wake }
            }
        }
    }

    /// Thread `t` leaves the lane at `now_ns` (a request ends: it is about
    /// to wait for its client, or the thread exits, or it is unbound).
    /// Returns the thread to wake with the token, if any.
    pub fn leave(&mut self, t: Slot, now_ns: u64) -> Option<Slot> {
        self.unqueue(t);
        if self.end_visit(t, now_ns) {
            let u = self.dispatch(now_ns);
            self.counts.handoffs += u64::from(u.is_some());
            return u;
        }
        None
    }

    /// Thread `t`'s wait reached the bound at `now_ns`. Unless the token
    /// reached it meanwhile, it leaves its queue and takes the token from
    /// the holder, which queues again at its next stage point. Returns
    /// true when this was a timeout (false: it had been granted).
    pub fn timeout(&mut self, t: Slot, now_ns: u64) -> bool {
        if self.holder() == Some(t) {
            return false;
        }
        let Some(stage) = self.unqueue(t) else {
            // Not queued and not the holder: released meanwhile.
            return false;
        };
        self.counts.timeouts += 1;
        self.grant(t, stage, now_ns);
        true
    }

    /// Empties every queue and drops the token; returns the threads that
    /// were waiting (to wake: they run on without the gate).
    pub fn release_all(&mut self) -> Vec<Slot> {
        let out: Vec<Slot> = self.queues.iter_mut().flat_map(|q| q.drain(..)).collect();
        self.counts.released += out.len() as u64;
        self.holder = None;
        self.close_cohort();
        out
    }

    /// Ends `t`'s visit if it holds the token: records its length with the
    /// visitor and drops the token. True when it was the holder.
    fn end_visit(&mut self, t: Slot, now_ns: u64) -> bool {
        match self.holder {
            Some(h) if h.slot == t => {
                self.visitor
                    .served(h.stage, now_ns.saturating_sub(h.since_ns));
                self.holder = None;
                true
            }
            _ => false,
        }
    }

    /// Removes `t` from the queue it waits in; returns that stage.
    fn unqueue(&mut self, t: Slot) -> Option<usize> {
        for (s, q) in self.queues.iter_mut().enumerate().take(self.stages) {
            if let Some(i) = q.iter().position(|x| *x == t) {
                q.remove(i);
                return Some(s);
            }
        }
        None
    }

    /// Gives the token to the head of the queue the visitor picks.
    fn dispatch(&mut self, now_ns: u64) -> Option<Slot> {
        let mut lens = [0u32; MAX_STAGES];
        for (l, q) in lens.iter_mut().zip(&self.queues) {
            *l = u32::try_from(q.len()).unwrap_or(u32::MAX);
        }
        let stage = self.visitor.next(&lens[..self.stages])?;
        let t = self.queues[stage].pop_front()?;
        self.grant(t, stage, now_ns);
        Some(t)
    }

    fn grant(&mut self, t: Slot, stage: usize, now_ns: u64) {
        self.holder = Some(Holder {
            slot: t,
            stage,
            since_ns: now_ns,
        });
        self.counts.visits += 1;
        match &mut self.cohort {
            Some((s, n)) if *s == stage => *n += 1,
            _ => {
                self.close_cohort();
                self.cohort = Some((stage, 1));
            }
        }
    }

    fn close_cohort(&mut self) {
        if let Some((_, n)) = self.cohort.take() {
            self.counts.cohorts += 1;
            self.counts.cohort_threads += n;
        }
    }
}

#[cfg(test)]
mod tests;
