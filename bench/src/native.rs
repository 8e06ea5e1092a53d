//! The host reference: the generated workload run natively on two host
//! cores, three ways ([`Mode`]), as code-footprint probe (`docs/design.md`)
//! does for the first two.
//!
//! * **whole** — each core's thread runs whole requests of its connections
//!   (connection `c` on core `c mod 2`), a request per connection in turn;
//! * **spatial** (staged) — core A runs the first half of the stages of
//!   every request, core B the second half; a request passes from A to B
//!   through a single-producer ring and the connection token comes back
//!   through a second ring, so each connection has one request in flight
//!   and its requests run in order (its checksum equals the sequential one);
//! * **cohort** (temporal staging, Larus & Parkes' cohort scheduling) — each
//!   core runs its own connections as in *whole*, but stage by stage: stage
//!   `s` of the current request of every one of its connections back to
//!   back, then stage `s + 1`, so a stage's code runs over and over on the
//!   core without any migration.
//!
//! A connection stands for one guest thread: the same ids, requests, data
//! working sets and checksums (`stage_workload::thread_checksum`).
//!
//! Under open-loop load (the requests arrive on a schedule): [`open`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

pub mod open;
use host_sched::cpuset::CpuSet;
use host_sched::topology::gettid;
pub use open::{run_open, Load, OpenRun};
use stage_device::os::set_thread_affinity;
use stage_workload::{fold, init_data, request_seed, run_stage, Params};

/// How the native reference splits the work over its two cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Each core runs whole requests of its connections (no staging).
    Whole,
    /// Core A runs the first half of the stages, core B the second half;
    /// connections are handed over through rings (spatial staging).
    Spatial,
    /// Each core runs its own connections stage by stage, a cohort of all
    /// its connections per stage (temporal staging, no migration).
    Cohort,
}

impl Mode {
    /// Every mode, in the order of [`Mode::index`].
    pub const ALL: [Mode; 3] = [Mode::Whole, Mode::Spatial, Mode::Cohort];

    /// The mode's position in [`Mode::ALL`] (0, 1, 2).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its lower-case name (`whole`, `spatial`, `cohort`).
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Whole => "whole",
            Mode::Spatial => "spatial",
            Mode::Cohort => "cohort",
        }
    }
}

/// One native run's result.
#[derive(Clone, Debug)]
pub struct NativeRun {
    /// Requests per second (all connections' requests / wall time).
    pub rps: f64,
    /// Per connection, its checksum.
    pub checksums: Vec<u64>,
}

/// A bounded single-producer single-consumer ring of `u64`s (spinning).
struct Ring {
    head: AtomicU64,
    _pad: [u64; 7],
    tail: AtomicU64,
    slots: Vec<AtomicU64>,
}

impl Ring {
    fn new(size: usize) -> Self {
        Self {
            head: AtomicU64::new(0),
            _pad: [0; 7],
            tail: AtomicU64::new(0),
            slots: (0..size).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn push(&self, v: u64) {
        let h = self.head.load(Ordering::Relaxed);
        while h - self.tail.load(Ordering::Acquire) >= self.slots.len() as u64 {
            std::hint::spin_loop();
        }
        self.slots[(h % self.slots.len() as u64) as usize].store(v, Ordering::Relaxed);
        self.head.store(h + 1, Ordering::Release);
    }

    fn pop(&self) -> u64 {
        let t = self.tail.load(Ordering::Relaxed);
        while self.head.load(Ordering::Acquire) == t {
            std::hint::spin_loop();
        }
        let v = self.slots[(t % self.slots.len() as u64) as usize].load(Ordering::Relaxed);
        self.tail.store(t + 1, Ordering::Release);
        v
    }
}

/// A connection's state: its data working set, next request, checksum and
/// the value between two stages of a request (between the two halves in
/// [`Mode::Spatial`], between cohorts in [`Mode::Cohort`]).
struct Conn {
    data: Vec<u64>,
    next: u64,
    checksum: u64,
    x: u64,
}

/// Shared connection table; each connection is touched by one core at a
/// time (handed over through the rings, which order the accesses).
struct Conns(Vec<std::cell::UnsafeCell<Conn>>);
// SAFETY: see the type's comment — a connection has one owner at a time and
// ownership passes through the rings' release/acquire pairs.
unsafe impl Sync for Conns {}

impl Conns {
    fn new(connections: u32, params: &Params) -> Self {
        Self(
            (0..connections)
                .map(|c| {
                    let mut data = vec![0u64; params.data_words];
                    init_data(c, &mut data);
                    std::cell::UnsafeCell::new(Conn {
                        data,
                        next: 0,
                        checksum: 0,
                        x: 0,
                    })
                })
                .collect(),
        )
    }

    /// # Safety
    /// The caller owns connection `c` (see the type's comment).
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self, c: usize) -> &mut Conn {
        // SAFETY: the caller owns connection `c`: no other reference to it exists.
        unsafe { &mut *self.0[c].get() }
    }
}

fn pin(core: usize) -> Result<()> {
    let set: CpuSet = [core].into_iter().collect();
    set_thread_affinity(gettid(), &set).with_context(|| format!("pinning to core {core}"))
}

/// Runs the requests of this core's connections (`side`: connection `c`
/// on core `c mod 2`), whole ([`Mode::Whole`]) or in cohorts
/// ([`Mode::Cohort`]).
fn run_own(
    side: usize,
    cohort: bool,
    conns: &Conns,
    params: &Params,
    connections: u32,
    requests: u64,
) {
    let mine: Vec<usize> = (side..connections as usize).step_by(2).collect();
    for _ in 0..requests {
        if cohort {
            for s in 0..params.stages {
                for &c in &mine {
                    // SAFETY: connection c belongs to this side only.
                    let conn = unsafe { conns.get(c) };
                    let x = if s == 0 {
                        request_seed(c as u32, conn.next)
                    } else {
                        conn.x
                    };
                    conn.x = run_stage(s, x, params, &mut conn.data);
                }
            }
            for &c in &mine {
                // SAFETY: connection c belongs to this side only.
                let conn = unsafe { conns.get(c) };
                conn.checksum = fold(conn.checksum, conn.x);
                conn.next += 1;
            }
        } else {
            for &c in &mine {
                // SAFETY: connection c belongs to this side only.
                let conn = unsafe { conns.get(c) };
                let mut x = request_seed(c as u32, conn.next);
                for s in 0..params.stages {
                    x = run_stage(s, x, params, &mut conn.data);
                }
                conn.checksum = fold(conn.checksum, x);
                conn.next += 1;
            }
        }
    }
}

/// [`Mode::Spatial`]'s work on `side`: side 0 runs the first `split`
/// stages of every request, side 1 the rest, connection tokens passing
/// through `to_b` (A → B) and `to_a` (B → A).
fn run_spatial(
    side: usize,
    split: usize,
    conns: &Conns,
    rings: [&Ring; 2],
    params: &Params,
    total: u64,
    connections: u32,
) {
    let [to_b, to_a] = rings;
    if side == 0 {
        // Front half: every connection starts available.
        for c in 0..u64::from(connections) {
            to_a.push(c);
        }
        for _ in 0..total {
            let c = to_a.pop() as usize;
            // SAFETY: the token for c came through `to_a`.
            let conn = unsafe { conns.get(c) };
            let mut x = request_seed(c as u32, conn.next);
            for s in 0..split {
                x = run_stage(s, x, params, &mut conn.data);
            }
            conn.x = x;
            to_b.push(c as u64);
        }
        // Drain the tokens that come back.
        for _ in 0..connections {
            to_a.pop();
        }
    } else {
        for _ in 0..total {
            let c = to_b.pop() as usize;
            // SAFETY: the token for c came through `to_b`.
            let conn = unsafe { conns.get(c) };
            let mut x = conn.x;
            for s in split..params.stages {
                x = run_stage(s, x, params, &mut conn.data);
            }
            conn.checksum = fold(conn.checksum, x);
            conn.next += 1;
            to_a.push(c as u64);
        }
    }
}

/// Runs `connections × requests` requests natively on `cores` (two host
/// cores) the way `mode` says.
///
/// # Errors
/// When a thread cannot be pinned.
pub fn run(
    params: &Params,
    connections: u32,
    requests: u64,
    cores: [usize; 2],
    mode: Mode,
) -> Result<NativeRun> {
    let conns = Arc::new(Conns::new(connections, params));
    let split = params.stages.div_ceil(2);
    let to_b = Arc::new(Ring::new(connections as usize + 1));
    let to_a = Arc::new(Ring::new(connections as usize + 1));
    let start = Instant::now();
    let workers: Vec<_> = (0..2usize)
        .map(|side| {
            let (conns, to_b, to_a, params) = (conns.clone(), to_b.clone(), to_a.clone(), *params);
            std::thread::spawn(move || -> Result<()> {
                pin(cores[side])?;
                let total = u64::from(connections) * requests;
                match mode {
                    Mode::Whole | Mode::Cohort => {
                        run_own(
                            side,
                            mode == Mode::Cohort,
                            &conns,
                            &params,
                            connections,
                            requests,
                        );
                    }
                    Mode::Spatial => {
                        run_spatial(
                            side,
                            split,
                            &conns,
                            [&to_b, &to_a],
                            &params,
                            total,
                            connections,
                        );
                    }
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a native worker panicked"))??;
    }
    let secs = start.elapsed().as_secs_f64();
    let conns = Arc::try_unwrap(conns)
        .map_err(|_| anyhow::anyhow!("workers still hold the connections"))?;
    let checksums = conns
        .0
        .into_iter()
        .map(|c| c.into_inner().checksum)
        .collect();
    Ok(NativeRun {
        rps: (u64::from(connections) * requests) as f64 / secs,
        checksums,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_gives_the_sequential_checksums() {
        let p = Params {
            stages: 2,
            funcs: 64,
            calls: 20,
            data_words: 64,
        };
        let mut data = vec![0u64; 64];
        let want: Vec<u64> = (0..6)
            .map(|c| stage_workload::thread_checksum(c, 30, &p, &mut data))
            .collect();
        let allowed: Vec<usize> = host_sched::topology::thread_affinity(0)
            .unwrap()
            .iter()
            .collect();
        let cores = [allowed[0], *allowed.get(1).unwrap_or(&allowed[0])];
        for mode in Mode::ALL {
            let r = run(&p, 6, 30, cores, mode).unwrap();
            assert_eq!(r.checksums, want, "mode {}", mode.name());
            assert!(r.rps > 0.0);
        }
        // A stage count not divisible by two: the cohorts and the halves
        // still keep each connection's order.
        let p3 = Params { stages: 3, ..p };
        let want3: Vec<u64> = (0..5)
            .map(|c| stage_workload::thread_checksum(c, 7, &p3, &mut data))
            .collect();
        for mode in Mode::ALL {
            let r = run(&p3, 5, 7, cores, mode).unwrap();
            assert_eq!(r.checksums, want3, "3 stages, mode {}", mode.name());
        }
    }
}
