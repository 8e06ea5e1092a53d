//! A thread's stage switch ([`stage_switch`], [`stage_leave`]): pick the
//! vCPU for the next stage from the host's map with
//! `guest_agent::choose_from_map` (each vCPU caches the last map it read,
//! in [`super::map`]), migrate through the run queues when it is another vCPU,
//! and report the stage on the vCPU that runs it.
//!
//! Depends on [`super::runtime`] (threads, yields, queue lengths),
//! [`super::platform`] (the agent) and [`super::stats`]; the workloads call
//! it, the runtime does not.

use core::sync::atomic::Ordering;

use guest_agent::{choose_from_map, RequestClock};
use hypercall_abi::stage::{MAX_VCPUS, STAGE_NONE};

use super::map::map_on;
use super::platform::{agent, num_vcpus};
use super::runtime::{timed_yield, Thread};
use super::stats::{bump, count, VCPU_COUNTS};

/// Switches `t` to `stage`. Picks the vCPU for the stage from the host's map
/// (the least loaded of the stage's vCPUs unless the current one serves it),
/// and if that is another vCPU yields to the scheduler, which moves the
/// thread there once its context is saved; it reports the stage on the vCPU
/// that runs it, right before the stage's code runs.
/// If the map changed while the thread waited and its new vCPU no longer
/// serves the stage, it moves again: a stage only runs where the current map
/// puts it, as a counted fallback when no vCPU serves it, or as a counted
/// spill when an idle vCPU of another stage took the waiting thread
/// (`spill_us=`, `runtime::steal`; the spill ends at the next switch).
/// Returns the time the thread spent migrating (TSC ticks from just before
/// its first yield to just after it resumed on its final vCPU, summed over
/// the moves), or `None` when it stayed on its vCPU.
pub(super) fn stage_switch(t: &Thread, stage: u32) -> Option<u64> {
    let a = agent();
    let mut cur = t.vcpu.load(Ordering::Relaxed);
    let old = t.stage.swap(stage, Ordering::Relaxed);
    // A spill ends at the thread's next switch (see `runtime::steal`).
    if t.spilled.load(Ordering::Relaxed) {
        t.spilled.store(false, Ordering::Relaxed);
    }
    let mut spilled = false;
    let mut first = true;
    let mut queued = false;
    let mut migrated: Option<u64> = None;
    loop {
        let mut target = cur;
        // One read of the map per pass (an epoch load when unchanged).
        let view = map_on(cur);
        let temporal = view.is_some_and(|v| v.snap.visit.is_temporal());
        if first {
            t.temporal.store(temporal, Ordering::Relaxed);
        }
        if let Some(view) = view.filter(|v| v.here & (1 << stage) == 0) {
            let map = &view.snap;
            if map.vcpus[stage as usize] == 0 {
                // No vCPU serves the stage: run it here and say so.
                if first {
                    a.count_fallback(cur);
                    bump(&VCPU_COUNTS[cur as usize].fallbacks, 1);
                }
            } else if !map.serves(stage, cur) {
                // The least-loaded rule on the snapshot just read, so the
                // fallback test and the choice see the same map.
                // Only the candidates' queue lengths are read, and none for
                // a stage one vCPU serves: each is a line other vCPUs
                // write, a cross-core miss per read.
                let n = num_vcpus() as usize;
                let mask = map.vcpus[stage as usize];
                target = if mask.count_ones() == 1 && (mask.trailing_zeros() as usize) < n {
                    mask.trailing_zeros()
                } else {
                    let mut loads = [u32::MAX; MAX_VCPUS];
                    for (v, load) in loads.iter_mut().enumerate().take(n.min(64)) {
                        if mask & (1 << v) != 0 {
                            *load = super::runq::queue_len(v as u32);
                        }
                    }
                    choose_from_map(map, stage, cur, &loads[..n])
                };
            }
        }
        if target == cur {
            if !temporal || queued {
                // This vCPU serves the stage: go on running, as a thread of
                // an OS would (threads take turns at request ends,
                // `stage_leave`).
                break;
            }
            // Temporal staging (a visit policy in the map): wait in the
            // stage's queue here, so the scheduler serves one stage's
            // threads back to back in the policy's order
            // (`runtime::schedule`). It may resume on another vCPU (Color's
            // shared queue, a steal): check the map there.
            queued = true;
            timed_yield(t, 0);
            cur = t.vcpu.load(Ordering::Relaxed);
            if took_spill(t, cur) {
                spilled = true;
                break;
            }
            first = false;
            continue;
        }
        let from = &VCPU_COUNTS[cur as usize];
        bump(&from.migrations, 1);
        bump(&from.migrations_in[stage as usize], 1);
        if let Some(out) = from.migrations_out.get(old as usize).filter(|_| first) {
            bump(out, 1);
        }
        t.migrate_to.store(target, Ordering::Relaxed);
        // Time from giving up the vCPU to running on the target vCPU,
        // through its queue.
        let waited = timed_yield(t, 1);
        migrated = Some(migrated.unwrap_or(0).wrapping_add(waited));
        // It waited in the stage's queue on the target (ordered by its
        // visit policy there).
        queued = true;
        cur = t.vcpu.load(Ordering::Relaxed);
        if took_spill(t, cur) {
            spilled = true;
            break;
        }
        match map_on(cur) {
            Some(v) if v.snap.vcpus[stage as usize] != 0 && v.here & (1 << stage) == 0 => {
                // The map moved under us while we waited: go again.
                first = false;
            }
            _ => break,
        }
    }
    if migrated.is_some() {
        // Counted where the thread arrived, by the vCPU that runs it now.
        a.count_migration(cur, old, stage);
    }
    let counts = &VCPU_COUNTS[cur as usize];
    let mut clock = RequestClock::from_raw(t.clock.load(Ordering::Relaxed));
    count(
        cur,
        a.stage_enter_request(cur, stage, t.id, &mut clock),
        &counts.reported[stage as usize],
    );
    t.clock.store(clock.to_raw(), Ordering::Relaxed);
    bump(&counts.ran[stage as usize], 1);
    if let Some(v) = map_on(cur).filter(|_| !spilled) {
        if v.snap.vcpus[stage as usize] != 0 && v.here & (1 << stage) == 0 {
            bump(&counts.violations, 1);
        }
    }
    migrated
}

/// Whether an idle vCPU of another stage took `t` while it waited (a
/// spill, `runtime::steal`), now running on `cur`: then the mark is taken
/// and the spill counted there, and the thread runs its visit on `cur`. A
/// load, not a swap: no locked instruction on the common path.
fn took_spill(t: &Thread, cur: u32) -> bool {
    if !t.spilled.load(Ordering::Relaxed) {
        return false;
    }
    t.spilled.store(false, Ordering::Relaxed);
    bump(&VCPU_COUNTS[cur as usize].spills, 1);
    true
}

/// Starts `t`'s request at guest TSC `start` (an open-loop arrival) or now
/// (`None`) on the vCPU it runs on: the agent times one in N.
pub(super) fn request_begin(t: &Thread, start: Option<u64>) {
    let vcpu = t.vcpu.load(Ordering::Relaxed);
    let mut clock = RequestClock::new();
    agent().request_begin(vcpu, &mut clock, start);
    t.clock.store(clock.to_raw(), Ordering::Relaxed);
}

/// `t` finished its request: reports the exit (the agent records a timed
/// request's latency) and leaves its stage. In a closed loop its next
/// request starts at once — a closed-loop client issues it as soon as the
/// last one completes, so the wait for its turn is part of its latency —
/// and it yields so the threads on its vCPU take turns, a request each;
/// under a temporal visit policy it does not yield here but at its next
/// request's first stage switch, into that stage's queue. In an open loop
/// (`open`) the next request starts when it arrives, and the thread goes
/// on to take it without yielding.
pub(super) fn stage_leave(t: &Thread, open: bool) {
    let a = agent();
    let vcpu = t.vcpu.load(Ordering::Relaxed);
    let mut clock = RequestClock::from_raw(t.clock.load(Ordering::Relaxed));
    let (report, _) = a.stage_exit_request(vcpu, t.id, &mut clock);
    count(vcpu, report, &VCPU_COUNTS[vcpu as usize].exits);
    t.stage.store(STAGE_NONE, Ordering::Relaxed);
    if open {
        t.clock.store(clock.to_raw(), Ordering::Relaxed);
        return;
    }
    a.request_begin(vcpu, &mut clock, None);
    t.clock.store(clock.to_raw(), Ordering::Relaxed);
    if !t.temporal.load(Ordering::Relaxed) {
        timed_yield(t, 0);
    }
}
