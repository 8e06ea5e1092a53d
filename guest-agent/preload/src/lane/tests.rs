use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// Drives a lane like the gate does: `arrive` returns who runs; a woken
/// thread runs. Records every grant as (thread, stage).
struct Sim {
    lane: LaneCore,
    now: u64,
    grants: Vec<(Slot, usize)>,
}

impl Sim {
    fn new(policy: VisitPolicy, stages: usize) -> Self {
        Self {
            lane: LaneCore::new(policy, stages),
            now: 0,
            grants: Vec::new(),
        }
    }

    /// `t` reaches the point of `stage` after 1 µs of work; returns the
    /// thread that holds the token afterwards.
    fn point(&mut self, t: Slot, stage: usize) -> Option<Slot> {
        self.now += 1_000;
        match self.lane.arrive(t, stage, self.now) {
            Arrival::Run => self.grants.push((t, stage)),
            Arrival::Wait { wake: Some(u) } => self.grants.push((u, self.stage_of(u))),
            Arrival::Wait { wake: None } => {}
        }
        self.lane.holder()
    }

    fn leave(&mut self, t: Slot) -> Option<Slot> {
        self.now += 1_000;
        if let Some(u) = self.lane.leave(t, self.now) {
            self.grants.push((u, self.stage_of(u)));
        }
        self.lane.holder()
    }

    fn stage_of(&self, t: Slot) -> usize {
        self.lane.holder.filter(|h| h.slot == t).unwrap().stage
    }
}

#[test]
fn a_lone_thread_never_waits() {
    let mut sim = Sim::new(VisitPolicy::Srpt, 2);
    for _ in 0..3 {
        assert_eq!(sim.lane.arrive(7, 0, 1), Arrival::Run);
        assert_eq!(sim.lane.arrive(7, 1, 2), Arrival::Run);
        assert_eq!(sim.lane.leave(7, 3), None);
    }
    assert_eq!(sim.lane.counts().handoffs, 0);
    assert_eq!(sim.lane.counts().visits, 6);
}

#[test]
fn srpt_serves_each_stage_as_a_cohort_and_the_last_stage_first() {
    let mut sim = Sim::new(VisitPolicy::Srpt, 2);
    // Three threads reach stage 0; the first runs, the others queue.
    assert_eq!(sim.point(0, 0), Some(0));
    assert_eq!(sim.point(1, 0), Some(0));
    assert_eq!(sim.point(2, 0), Some(0));
    // Each holder moves on to stage 1; stage 0 is served exhaustively.
    assert_eq!(sim.point(0, 1), Some(1));
    assert_eq!(sim.point(1, 1), Some(2));
    // Thread 2 ends stage 0: only stage 1 has threads.
    assert_eq!(sim.point(2, 1), Some(0));
    // Thread 0 comes back for a new request (stage 0) while stage 1 still
    // has threads 1 and 2: SRPT serves the last stage first.
    assert_eq!(sim.point(0, 0), Some(1));
    assert_eq!(sim.leave(1), Some(2));
    assert_eq!(sim.leave(2), Some(0));
    assert_eq!(
        sim.grants,
        vec![(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 0)]
    );
    sim.lane.release_all();
    let c = sim.lane.counts();
    assert_eq!((c.cohorts, c.cohort_threads), (3, 7));
}

#[test]
fn cohort_turns_its_elevator_at_the_last_stage() {
    let mut sim = Sim::new(VisitPolicy::Cohort, 3);
    for t in 0..3 {
        sim.point(t, 0);
    }
    // Stage 0's cohort moves to stage 1, then stage 2.
    for t in 0..3 {
        sim.point(t, 1);
    }
    for t in 0..3 {
        sim.point(t, 2);
    }
    // Two threads start new requests at stage 0 while stage 2 is served;
    // at the top the elevator turns and comes down through stage 1 (empty)
    // to stage 0.
    sim.point(0, 0);
    sim.point(1, 0);
    sim.leave(2);
    let stages: Vec<usize> = sim.grants.iter().map(|g| g.1).collect();
    assert_eq!(stages, [0, 0, 0, 1, 1, 1, 2, 2, 2, 0]);
}

#[test]
fn a_wait_that_times_out_takes_the_token_and_the_old_holder_queues() {
    let mut lane = LaneCore::new(VisitPolicy::Srpt, 2);
    assert_eq!(lane.arrive(0, 0, 0), Arrival::Run);
    // Thread 0 blocks inside its stage; thread 1 waits, then times out.
    assert_eq!(lane.arrive(1, 1, 10), Arrival::Wait { wake: None });
    assert!(lane.timeout(1, 500_000));
    assert_eq!(lane.holder(), Some(1));
    assert_eq!(lane.counts().timeouts, 1);
    // Thread 0 is back: it queues behind the new holder.
    assert_eq!(lane.arrive(0, 1, 600_000), Arrival::Wait { wake: None });
    assert_eq!(lane.leave(1, 700_000), Some(0));
    // A timeout that races a grant is no timeout.
    assert!(!lane.timeout(0, 800_000));
}

#[test]
fn release_all_wakes_every_waiter_and_frees_the_token() {
    let mut lane = LaneCore::new(VisitPolicy::Cohort, 4);
    lane.arrive(0, 0, 0);
    for t in 1..6 {
        lane.arrive(t, (t as usize) % 4, 1);
    }
    let mut out = lane.release_all();
    out.sort_unstable();
    assert_eq!(out, [1, 2, 3, 4, 5]);
    assert_eq!((lane.holder(), lane.waiting()), (None, 0));
    // A released thread's late timeout is no timeout.
    assert!(!lane.timeout(3, 2));
    // The lane works on afterwards.
    assert_eq!(lane.arrive(9, 2, 3), Arrival::Run);
}

/// One step of a random schedule.
#[derive(Clone, Debug)]
enum Op {
    /// The thread at this index (among the threads not waiting) reaches a
    /// stage point of this stage.
    Point(usize, usize),
    /// It leaves the lane.
    Leave(usize),
    /// The longest waiter times out.
    Timeout,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..8usize, 0..4usize).prop_map(|(t, s)| Op::Point(t, s)),
        2 => (0..8usize).prop_map(Op::Leave),
        1 => Just(Op::Timeout),
    ]
}

proptest! {
    /// Random arrivals, leaves and timeouts of 8 threads over 4 stages
    /// under every policy: the token is never free while a thread waits
    /// (work conservation), a thread is never in two places, every arrival
    /// gets exactly one grant once the others drain (no lost thread), and
    /// only waiting threads are woken.
    #[test]
    fn no_thread_is_lost_and_the_token_is_never_idle_while_threads_wait(
        policy in prop::sample::select(VisitPolicy::ALL.to_vec()),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut lane = LaneCore::new(policy, 4);
        // Thread → waiting since (ns); absent: running (with or without
        // the token) or outside.
        let mut waiting: BTreeMap<Slot, u64> = BTreeMap::new();
        let (mut arrivals, mut grants) = (0u64, 0u64);
        let mut now = 0u64;
        let woken = |lane: &LaneCore, waiting: &mut BTreeMap<Slot, u64>, u: Slot| {
            prop_assert!(waiting.remove(&u).is_some(), "woke {u}, which was not waiting");
            prop_assert_eq!(lane.holder(), Some(u));
            Ok(())
        };
        for op in ops {
            now += 1_000;
            let free: Vec<Slot> = (0..8).filter(|t| !waiting.contains_key(t)).collect();
            match op {
                Op::Point(i, s) if !free.is_empty() => {
                    let t = free[i % free.len()];
                    arrivals += 1;
                    match lane.arrive(t, s, now) {
                        Arrival::Run => grants += 1,
                        Arrival::Wait { wake } => {
                            waiting.insert(t, now);
                            if let Some(u) = wake {
                                grants += 1;
                                woken(&lane, &mut waiting, u)?;
                            }
                        }
                    }
                }
                Op::Leave(i) if !free.is_empty() => {
                    if let Some(u) = lane.leave(free[i % free.len()], now) {
                        grants += 1;
                        woken(&lane, &mut waiting, u)?;
                    }
                }
                Op::Timeout => {
                    if let Some((&t, _)) = waiting.iter().min_by_key(|(_, since)| **since) {
                        prop_assert!(lane.timeout(t, now));
                        waiting.remove(&t);
                        grants += 1;
                        prop_assert_eq!(lane.holder(), Some(t));
                    }
                }
                _ => {}
            }
            prop_assert_eq!(lane.waiting(), waiting.len());
            prop_assert!(lane.holder().is_some() || waiting.is_empty(), "token idle while threads wait");
            if let Some(h) = lane.holder() {
                prop_assert!(!waiting.contains_key(&h), "the holder waits");
            }
        }
        // Drain: the holder leaves until nobody waits.
        let mut rounds = 0;
        while let Some(h) = lane.holder() {
            rounds += 1;
            prop_assert!(rounds <= 8 + 1, "drain does not end");
            if let Some(u) = lane.leave(h, now) {
                grants += 1;
                woken(&lane, &mut waiting, u)?;
            }
        }
        prop_assert!(waiting.is_empty());
        prop_assert_eq!(grants, arrivals);
    }
}
