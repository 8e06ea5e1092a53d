//! A lane whose lock is held past the wait bound (its holder stopped, as a
//! tracer stops a thread): real threads, futexes and CPU binding, a run
//! time of the test's own (not the process's: no hooks, and no watchdog
//! thread; the test calls the watchdog's scan, `expire`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::*;

/// The token's wait bound: far from the lock's 20 ms, so that B's wait
/// ends by the lock's bypass, not by its own bound.
const BOUND: Duration = Duration::from_millis(200);
/// How long the lane's lock is waited for.
const LOCK_WAIT: Duration = Duration::from_nanos(lanes::LOCK_WAIT_NS);

fn runtime() -> Runtime {
    let control = Mapping::anonymous(|c| {
        c.header.mode.store(mode::TEMPORAL, Relaxed);
        c.header
            .max_wait_us
            .store(BOUND.as_micros() as u32, Relaxed);
    })
    .unwrap();
    let cpu = crate::costs::default_cpu().unwrap();
    Runtime::new(control, &[cpu], 2)
}

/// One stage point into `stage` on this thread, as a hook runs it.
fn stage_point(rt: &Runtime, t: &ThreadState, stage: u8) {
    let point = PointKind::Stage(stage);
    if rt.fast(t, point) {
        rt.slow(t, point);
    }
}

/// Waits until some thread waits in the gate.
fn until_one_waits(rt: &Runtime) {
    let t0 = Instant::now();
    while rt.since.iter().all(|s| s.load(Acquire) == 0) {
        assert!(t0.elapsed() < Duration::from_secs(10), "no thread waits");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_lane_whose_lock_a_stopped_thread_holds_is_bypassed_and_its_waiters_freed() {
    let rt = &runtime();
    let c = rt.control.get();
    let bypasses = || c.lanes[0].bypasses.load(Relaxed);
    std::thread::scope(|s| {
        // A takes the token and keeps it (its stage runs on).
        s.spawn(|| stage_point(rt, &ThreadState::new(), 0))
            .join()
            .unwrap();
        // B waits for it.
        let (done, b_done) = mpsc::channel();
        s.spawn(move || {
            stage_point(rt, &ThreadState::new(), 1);
            done.send(()).unwrap();
        });
        until_one_waits(rt);
        // A thread stops inside the lock: the watchdog's scan past B's
        // bound waits for the lock 20 ms, then frees B without it.
        let scan_past_b = || {
            rt.expire(
                now_ns() + 2 * BOUND.as_nanos() as u64,
                BOUND.as_nanos() as u64,
            )
        };
        let held = rt.lanes[0].lock_blocking();
        let t0 = Instant::now();
        scan_past_b();
        let scan = t0.elapsed();
        let freed = b_done.recv_timeout(Duration::from_secs(10));
        let stuck = rt.lanes[0].is_stuck();
        let after_b = bypasses();
        // C's stage points, while the lane is stuck, do not wait for the
        // lock at all (the first binds C to the lane's CPU, untimed).
        let c_took = s
            .spawn(|| {
                let t = ThreadState::new();
                stage_point(rt, &t, 0);
                let t0 = Instant::now();
                stage_point(rt, &t, 1);
                t0.elapsed()
            })
            .join()
            .unwrap();
        let after_c = bypasses();
        drop(held);
        if freed.is_err() {
            // Let B go (the scan now has the lock) before failing.
            scan_past_b();
        }
        assert!(freed.is_ok(), "the waiter was not freed");
        assert!(
            scan >= LOCK_WAIT / 2,
            "the scan did not wait for the lock: {scan:?}"
        );
        assert!(stuck, "a lane whose lock was not had in time is stuck");
        assert_eq!(after_b, 1, "B's wait is one bypass");
        assert!(
            c_took < LOCK_WAIT / 2,
            "a stuck lane made C wait {c_took:?}"
        );
        assert_eq!(after_c, 3, "C's stage points are two bypasses");
        // The lock free again: the next scan has it, and the lane is no
        // longer stuck.
        rt.expire(now_ns(), BOUND.as_nanos() as u64);
        assert!(!rt.lanes[0].is_stuck());
        assert_eq!(bypasses(), 3);
    });
}
