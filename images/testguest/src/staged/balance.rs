//! Work conservation (issue 23): an idle vCPU takes waiting threads from
//! other vCPUs' run queues ([`steal`]: a thread of a stage it serves, or,
//! with `spill_us=N`, a thread of another stage for the rest of its visit),
//! and under a temporal visit policy a busy vCPU pulls threads from a much
//! longer queue ([`balance`]). Every thread taken is counted as a migration
//! and as a steal or a spill. The scheduler loop ([`super::runtime`]) calls
//! both.

use core::sync::atomic::Ordering;

use hypercall_abi::stage::{MAX_VCPUS, STAGE_NONE};

use super::map::visit_on;
use super::platform::{agent, num_vcpus};
use super::runq::{queue_len, RUNQ};
use super::stats::{bump, VCPU_COUNTS};
use super::thread::Thread;

/// Work conservation of an idle `vcpu` (issue 23): it takes a waiting
/// thread from another vCPU's run queue, the longest queue first,
///
/// * a thread whose current stage it serves — under an unstaged map any
///   thread, as an OS balances its run queues (without it, threads a
///   staged map gathered on some vCPUs stay there after the map turns
///   unstaged, as in `--policy auto`'s trials); under a staged map only a
///   thread of a stage the map gives this vCPU, queued behind others on
///   another vCPU of the stage (seed 000 balances a stage's threads over
///   its cores, §4.4): a thread between requests stays where it is, its
///   next stage is not known yet;
/// * else, with `spill`, any thread inside a stage: a **spill**, off the
///   map, for a bounded time — the thread runs the rest of its current
///   stage visit here and follows the map again at its next switch
///   ([`Thread::spilled`]).
///
/// Returns whether it took one (counted as a migration, as the host counts
/// it, and as a steal or a spill).
pub(super) fn steal(vcpu: u32, spill: bool) -> bool {
    let a = agent();
    let n = num_vcpus();
    let map = a.read_map();
    let unstaged = map.is_none_or(|m| {
        m.vcpus
            .iter()
            .all(|mask| *mask == 0 || (vcpu < 64 && mask & (1 << vcpu) != 0))
    });
    // Under a staged map a thread of this vCPU's stages waits only on a
    // vCPU that serves one of them too: the others' queues are not locked
    // (a locked scan bounces the busy vCPU's queue line) unless a spill may
    // take from them. With a spill allowed every queue is scanned for a
    // thread of this vCPU's stages first (a spilled one, or one queued
    // before a map change): taking it is a steal.
    let mine_mask = map.map_or(u64::MAX, |m| {
        m.vcpus
            .iter()
            .filter(|mask| vcpu < 64 && *mask & (1 << vcpu) != 0)
            .fold(0, |acc, mask| acc | mask)
    });
    let mut victims = [0u32; MAX_VCPUS];
    let mut k = 0;
    for v in (0..n).filter(|v| *v != vcpu && !RUNQ[*v as usize].is_empty()) {
        if spill || unstaged || (v < 64 && mine_mask & (1 << v) != 0) {
            victims[k] = v;
            k += 1;
        }
    }
    if k == 0 {
        return false;
    }
    let victims = &mut victims[..k];
    victims.sort_unstable_by_key(|v| core::cmp::Reverse(queue_len(*v)));
    let mine = |t: &Thread| match t.stage.load(Ordering::Relaxed) {
        STAGE_NONE => unstaged,
        // A stage no vCPU serves runs anywhere (a counted fallback).
        stage => map.is_none_or(|m| {
            m.serves(stage, vcpu) || m.vcpus.get(stage as usize).is_some_and(|mask| *mask == 0)
        }),
    };
    let other_stage = |t: &Thread| t.stage.load(Ordering::Relaxed) != STAGE_NONE && !mine(t);
    let took = victims
        .iter()
        .find_map(|v| RUNQ[*v as usize].take_first(mine).map(|t| (t, *v)))
        .map(|(t, v)| {
            // Under a temporal visit policy a lone thread would run its
            // visits alone (a cohort of one) here: take more of its stage's
            // queue on the victim, up to half the victim's queue, so a
            // cohort moves (the usual batch of a load balancer).
            if visit_on(vcpu).is_temporal() && t.stage.load(Ordering::Relaxed) != STAGE_NONE {
                let class = t.stage.load(Ordering::Relaxed);
                let more = queue_len(v) / 2;
                for _ in 0..more {
                    let same = |o: &Thread| o.stage.load(Ordering::Relaxed) == class && mine(o);
                    match RUNQ[v as usize].take_first(same) {
                        Some(o) => adopt(vcpu, o, false),
                        None => break,
                    }
                }
            }
            (t, false)
        })
        .or_else(|| {
            (spill && !unstaged)
                .then(|| {
                    victims
                        .iter()
                        .find_map(|v| RUNQ[*v as usize].take_first(other_stage))
                })
                .flatten()
                .map(|t| (t, true))
        });
    let Some((t, spilled)) = took else {
        return false;
    };
    adopt(vcpu, t, spilled);
    true
}

/// Queues `t`, taken from another vCPU's queue by an idle `vcpu` (a steal,
/// or a spill when `spilled`), here, counting it as a migration.
fn adopt(vcpu: u32, t: &'static Thread, spilled: bool) {
    let a = agent();
    let stage = t.stage.load(Ordering::Relaxed);
    let counts = &VCPU_COUNTS[vcpu as usize];
    // A spill is counted where the visit runs (`switch::stage_switch`): a
    // spilled thread may still be taken back by a vCPU of its stage first,
    // which clears the mark.
    t.spilled.store(spilled, Ordering::Relaxed);
    if !spilled {
        bump(&counts.steals, 1);
    }
    if let Some(m) = counts.migrations_in.get(stage as usize) {
        bump(&counts.migrations, 1);
        bump(m, 1);
        // The thread keeps its stage and arrives here (this vCPU writes).
        a.count_migration(vcpu, STAGE_NONE, stage);
    }
    RUNQ[vcpu as usize].push(t);
}

/// Polls between two steal attempts of an idle vCPU.
pub(super) const STEAL_EVERY: u32 = 16;

/// Threads a busy vCPU serves between two balance checks under a temporal
/// visit policy ([`balance`]).
pub(super) const BALANCE_EVERY: u32 = 64;

/// Balance of a busy `vcpu` under a temporal visit policy: a cohort is as
/// large as the vCPU's share of the threads, and in a closed loop no vCPU
/// idles, so an imbalance left by a mode change (an `auto` trial of
/// spatial staging gathers threads on some vCPUs) would never be undone by
/// steals. When the longest other queue holds more than 2 threads more than
/// this vCPU's, it takes half the difference, of stages it serves (as a
/// load balancer's periodic pull; counted as steals).
pub(super) fn balance(vcpu: u32) {
    let n = num_vcpus();
    let own = queue_len(vcpu);
    let Some(v) = (0..n).filter(|v| *v != vcpu).max_by_key(|v| queue_len(*v)) else {
        return;
    };
    let theirs = queue_len(v);
    if theirs <= own + 2 {
        return;
    }
    let map = agent().read_map();
    let ok = |t: &Thread| match t.stage.load(Ordering::Relaxed) {
        STAGE_NONE => false,
        stage => map.is_none_or(|m| m.serves(stage, vcpu)),
    };
    for _ in 0..(theirs - own) / 2 {
        match RUNQ[v as usize].take_first(ok) {
            Some(t) => adopt(vcpu, t, false),
            None => break,
        }
    }
}
