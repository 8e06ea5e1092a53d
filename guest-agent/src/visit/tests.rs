//! The visit orders on deterministic queues (no VM): each policy's
//! documented order, and the starvation bound.

extern crate std;
use std::vec::Vec;

use super::*;

/// Serves `k` threads from `lens` under `v`, the served threads leaving the
/// system (an open system); returns the stages served.
fn drain(v: &mut Visitor, lens: &mut [u32], k: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for _ in 0..k {
        let Some(s) = v.next(lens) else { break };
        assert!(lens[s] > 0, "visited an empty stage {s}");
        lens[s] -= 1;
        v.served(s, 100);
        out.push(s);
    }
    out
}

#[test]
fn cohort_is_an_elevator_that_drains_each_stage() {
    let mut v = Visitor::new(VisitPolicy::Cohort, 4);
    let mut lens = [2, 1, 1, 2];
    assert_eq!(drain(&mut v, &mut lens, 6), [0, 0, 1, 2, 3, 3]);
    // At the top it turns: down through 2, 1, 0 (cyclic would restart at 0).
    let mut lens = [1, 1, 1, 0];
    assert_eq!(drain(&mut v, &mut lens, 3), [2, 1, 0]);
    // At the bottom it turns again.
    let mut lens = [0, 1, 0, 1];
    assert_eq!(drain(&mut v, &mut lens, 2), [1, 3]);
}

#[test]
fn cohort_jumps_to_a_long_queue_and_comes_back() {
    let t = Thresholds {
        starve_after: 1000,
        jump_len: 3,
    };
    let mut v = Visitor::with_thresholds(VisitPolicy::Cohort, 3, t);
    let mut lens = [2, 0, 0];
    assert_eq!(drain(&mut v, &mut lens, 1), [0]);
    // Stage 2's queue reaches the threshold during stage 0's visit: one
    // jump, drained, then back to stage 0, then on up the elevator.
    lens[2] = 3;
    lens[1] = 1;
    assert_eq!(drain(&mut v, &mut lens, 6), [2, 2, 2, 0, 1]);
}

#[test]
fn srpt_serves_the_end_of_the_pipeline_first_and_restarts_there() {
    let mut v = Visitor::new(VisitPolicy::Srpt, 3);
    let mut lens = [2, 1, 1];
    assert_eq!(drain(&mut v, &mut lens, 2), [2, 1]);
    assert_eq!(drain(&mut v, &mut lens, 1), [0]);
    // Stage 0's visit is exhaustive; after it, the scan restarts at the end.
    lens[2] = 1;
    assert_eq!(drain(&mut v, &mut lens, 2), [0, 2]);
}

#[test]
fn dbr_serves_the_slowest_stage_first() {
    let mut v = Visitor::new(VisitPolicy::Dbr, 3);
    for (s, ticks) in [(0, 100), (1, 300), (2, 200)] {
        v.served(s, ticks);
    }
    let mut lens = [1, 1, 1];
    assert_eq!(drain(&mut v, &mut lens, 3), [1, 2, 0]);
    // Re-sorted at each pass: stage 0 becomes the slowest.
    for _ in 0..40 {
        v.served(0, 10_000);
    }
    let mut lens = [1, 1, 1];
    assert_eq!(drain(&mut v, &mut lens, 3), [0, 1, 2]);
}

#[test]
fn mg1_table_follows_the_square_root_rule_evenly_spaced() {
    let mut v = Visitor::new(VisitPolicy::Mg1, 3);
    // Busy shares 0.5, 0.3, 0.2 → √(ρ(1−ρ)) = 0.5, 0.458, 0.4 → of 144:
    // ⌊144 · 0.5 / 1.358⌋ = 53, 48, 42 entries (⌊f·M⌋).
    for (s, ticks) in [(0, 500), (1, 300), (2, 200)] {
        v.served(s, ticks);
    }
    assert_eq!(v.next(&[1, 0, 0]), Some(0));
    let table = v.table().to_vec();
    let count = |s: u8| table.iter().filter(|t| **t == s).count();
    assert_eq!((count(0), count(1), count(2)), (53, 48, 42));
    // Evenly spaced: between two entries of a stage, at most ⌈M / n_i⌉ + 1
    // entries of others.
    for s in 0..3u8 {
        let at: Vec<usize> = (0..table.len()).filter(|k| table[*k] == s).collect();
        let gap = at.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(
            gap <= table.len().div_ceil(count(s)) + 1,
            "stage {s}: gap {gap}"
        );
    }
    // A stage with no load still gets one entry (never starved by the table).
    let mut v = Visitor::new(VisitPolicy::Mg1, 2);
    v.served(0, 1000);
    assert_eq!(v.next(&[0, 1]), Some(1));
    assert!(v.table().contains(&1));
}

#[test]
fn fifo_and_color_take_the_lowest_waiting_stage() {
    for p in [VisitPolicy::Fifo, VisitPolicy::Color] {
        let mut v = Visitor::new(p, 3);
        assert_eq!(drain(&mut v, &mut [0, 2, 1], 3), [1, 1, 2]);
        assert_eq!(v.next(&[0, 0, 0]), None);
    }
}

/// A closed pipeline where the policy's favourite stage refills itself:
/// every served thread of `hog` returns to `hog`'s queue, others move on to
/// the next stage. Returns, per stage, the most threads of other stages
/// served while one of its threads waited.
fn worst_waits(policy: VisitPolicy, hog: usize, t: Thresholds) -> [u64; 3] {
    let mut v = Visitor::with_thresholds(policy, 3, t);
    let mut lens = [3u32, 3, 3];
    let mut since: [Option<u64>; 3] = [None; 3];
    let mut worst = [0u64; 3];
    for n in 0..20_000u64 {
        for s in 0..3 {
            if lens[s] > 0 && since[s].is_none() {
                since[s] = Some(n);
            }
        }
        let s = v.next(&lens).expect("threads are always waiting");
        if let Some(w) = since[s].take() {
            worst[s] = worst[s].max(n - w);
        }
        lens[s] -= 1;
        v.served(s, 50 + 100 * s as u64);
        lens[if s == hog { s } else { (s + 1) % 3 }] += 1;
        if lens[s] > 0 {
            since[s] = Some(n + 1);
        }
    }
    worst
}

#[test]
fn no_stage_waits_beyond_the_threshold() {
    let t = Thresholds {
        starve_after: 16,
        jump_len: 1000,
    };
    for policy in [
        VisitPolicy::Cohort,
        VisitPolicy::Srpt,
        VisitPolicy::Dbr,
        VisitPolicy::Mg1,
    ] {
        for hog in 0..3 {
            let worst = worst_waits(policy, hog, t);
            for (s, w) in worst.iter().enumerate() {
                assert!(
                    *w <= u64::from(t.starve_after) + 2,
                    "{policy:?}, stage {hog} refilling itself: stage {s} waited {w} serves"
                );
            }
        }
    }
}

#[test]
fn a_new_policy_starts_afresh_but_keeps_service_times() {
    let mut v = Visitor::new(VisitPolicy::Cohort, 3);
    v.served(0, 100);
    v.served(2, 900);
    v.set_policy(VisitPolicy::Dbr);
    assert_eq!(v.policy(), VisitPolicy::Dbr);
    assert_eq!(v.next(&[1, 0, 1]), Some(2));
}
