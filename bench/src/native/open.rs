//! The native references under open-loop load: the same requests arrive
//! on the same schedule as in the test guest (`stage_workload::arrivals`),
//! on two host cores, whole ([`Mode::Whole`]: either core takes the next
//! arrival, as the guest's unstaged vCPUs take from its queue) or split
//! ([`Mode::Spatial`]: core A takes arrivals and runs the first half of the
//! stages, core B the rest). A request that finds more than the queue's
//! capacity waiting before it is dropped (counted), as in the guest.
//!
//! Measured per run: the rate achieved, the CPU a request costs (the
//! cores' busy time, from the start to the end of each request's work,
//! over the requests: a waiting core spins, which is not work), and the
//! latency from arrival to the end of the last stage of the steady 10–90 %
//! of the requests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Result;
use host_sched::histogram::Histogram;
use stage_workload::arrivals::{ArrivalDist, Arrivals};
use stage_workload::{request_seed, run_stage, Params};

use super::{pin, Conns, Mode, Ring};

/// An open-loop run's figures.
#[derive(Clone, Debug)]
pub struct OpenRun {
    /// Requests completed per second (over the time from the first arrival
    /// to the last completion).
    pub rps: f64,
    /// Busy core time per completed request (µs).
    pub cpu_per_request_us: f64,
    /// Latency from arrival of the steady requests (ns), bucketed.
    pub latency: Histogram,
    /// Requests dropped at a full queue.
    pub dropped: u64,
}

/// The open-loop load of one run.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Requests per second.
    pub rate: u64,
    /// Gaps between arrivals.
    pub dist: ArrivalDist,
    /// Requests in all.
    pub total: u64,
    /// Most requests waiting before one is dropped.
    pub queue: u64,
}

/// What the workers share.
struct Shared {
    /// Arrival times (ns after `start`).
    at: Vec<u64>,
    start: Instant,
    /// The next arrival to take.
    next: AtomicU64,
    dropped: AtomicU64,
    busy_ns: AtomicU64,
    done: AtomicU64,
    last_done_ns: AtomicU64,
    latency: Mutex<Histogram>,
    total: u64,
    queue: u64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Takes the next arrival (waiting, spinning, until it is due); drops
    /// those a full queue would not hold. `None` when all are taken.
    fn take(&self) -> Option<usize> {
        loop {
            let k = self.next.fetch_add(1, Ordering::Relaxed);
            if k >= self.total {
                return None;
            }
            let due = self.at[k as usize];
            let mut now = self.now_ns();
            while now < due {
                std::hint::spin_loop();
                now = self.now_ns();
            }
            // Arrivals released by now but not yet taken (k among them).
            let released = self.at.partition_point(|t| *t <= now) as u64;
            if released.saturating_sub(k) > self.queue {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            return Some(k as usize);
        }
    }

    /// Request `k` done now, after `busy` ns of this core's work.
    fn done(&self, k: usize, busy: u64, hist: &mut Histogram) {
        let now = self.now_ns();
        self.busy_ns.fetch_add(busy, Ordering::Relaxed);
        self.done.fetch_add(1, Ordering::Relaxed);
        self.last_done_ns.fetch_max(now, Ordering::Relaxed);
        let k = k as u64;
        if k >= self.total / 10 && k < self.total - self.total / 10 {
            hist.record(now.saturating_sub(self.at[k as usize]));
        }
    }
}

/// Runs `load` natively on `cores` with `connections` connections' data,
/// whole or spatial (`mode`; cohort is not an open-loop mode here).
///
/// # Errors
/// When a thread cannot be pinned, or `mode` is [`Mode::Cohort`].
pub fn run_open(
    params: &Params,
    connections: u32,
    load: Load,
    cores: [usize; 2],
    mode: Mode,
) -> Result<OpenRun> {
    anyhow::ensure!(mode != Mode::Cohort, "no open-loop cohort reference");
    let mut arrivals = Arrivals::new(load.rate, load.dist, 1_000_000_000);
    let shared = Arc::new(Shared {
        at: (0..load.total).map(|_| arrivals.next_arrival()).collect(),
        start: Instant::now(),
        next: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        busy_ns: AtomicU64::new(0),
        done: AtomicU64::new(0),
        last_done_ns: AtomicU64::new(0),
        latency: Mutex::new(Histogram::new()),
        total: load.total,
        queue: load.queue.max(1),
    });
    let n = connections.max(2);
    let conns = Arc::new(Conns::new(n, params));
    let split = params.stages.div_ceil(2);
    // Spatial: (arrival, connection) from A to B, and the end; connection
    // tokens back.
    let to_b = Arc::new(Ring::new(n as usize + 2));
    let to_a = Arc::new(Ring::new(n as usize + 1));
    let workers: Vec<_> = (0..2usize)
        .map(|side| {
            let (sh, conns, to_b, to_a, p) = (
                shared.clone(),
                conns.clone(),
                to_b.clone(),
                to_a.clone(),
                *params,
            );
            std::thread::spawn(move || -> Result<()> {
                pin(cores[side])?;
                let mut hist = Histogram::new();
                match mode {
                    Mode::Spatial => {
                        spatial(side, split, &sh, &conns, [&to_b, &to_a], &p, &mut hist)
                    }
                    _ => whole(side, &sh, &conns, &p, &mut hist),
                }
                sh.latency
                    .lock()
                    .map_err(|_| anyhow::anyhow!("a worker panicked"))?
                    .merge(&hist);
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a native worker panicked"))??;
    }
    let done = shared.done.load(Ordering::Relaxed).max(1);
    let span = shared.last_done_ns.load(Ordering::Relaxed).max(1) as f64 / 1e9;
    let latency = shared
        .latency
        .lock()
        .map_err(|_| anyhow::anyhow!("a worker panicked"))?
        .clone();
    Ok(OpenRun {
        rps: done as f64 / span,
        cpu_per_request_us: shared.busy_ns.load(Ordering::Relaxed) as f64 / done as f64 / 1e3,
        latency,
        dropped: shared.dropped.load(Ordering::Relaxed),
    })
}

/// [`Mode::Whole`] on `side`: take the next arrival, run it whole on one
/// of this side's connections (round-robin).
fn whole(side: usize, sh: &Shared, conns: &Conns, p: &Params, hist: &mut Histogram) {
    let n = conns.0.len();
    let mut c = side;
    while let Some(k) = sh.take() {
        let t0 = Instant::now();
        // SAFETY: connections of parity `side` belong to this side only.
        let conn = unsafe { conns.get(c) };
        let mut x = request_seed(c as u32, conn.next);
        for s in 0..p.stages {
            x = run_stage(s, x, p, &mut conn.data);
        }
        conn.x = x;
        conn.next += 1;
        sh.done(k, t0.elapsed().as_nanos() as u64, hist);
        c = (c + 2) % n;
    }
}

/// [`Mode::Spatial`] on `side`: A takes arrivals and runs the first
/// `split` stages on a free connection, B the rest; B counts the request.
fn spatial(
    side: usize,
    split: usize,
    sh: &Shared,
    conns: &Conns,
    rings: [&Ring; 2],
    p: &Params,
    hist: &mut Histogram,
) {
    let [to_b, to_a] = rings;
    const END: u64 = u64::MAX;
    if side == 0 {
        for c in 0..conns.0.len() as u64 {
            to_a.push(c);
        }
        while let Some(k) = sh.take() {
            let c = to_a.pop() as usize;
            let t0 = Instant::now();
            // SAFETY: the token for c came through `to_a`.
            let conn = unsafe { conns.get(c) };
            let mut x = request_seed(c as u32, conn.next);
            for s in 0..split {
                x = run_stage(s, x, p, &mut conn.data);
            }
            conn.x = x;
            sh.busy_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            to_b.push(((k as u64) << 20) | c as u64);
        }
        to_b.push(END);
    } else {
        loop {
            let token = to_b.pop();
            if token == END {
                break;
            }
            let (k, c) = ((token >> 20) as usize, (token & 0xf_ffff) as usize);
            let t0 = Instant::now();
            // SAFETY: the token for c came through `to_b`.
            let conn = unsafe { conns.get(c) };
            let mut x = conn.x;
            for s in split..p.stages {
                x = run_stage(s, x, p, &mut conn.data);
            }
            conn.x = x;
            conn.next += 1;
            sh.done(k, t0.elapsed().as_nanos() as u64, hist);
            to_a.push(c as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_loop_below_capacity_keeps_up_and_times_its_requests() {
        let p = Params {
            stages: 2,
            funcs: 64,
            calls: 20,
            data_words: 64,
        };
        let allowed: Vec<usize> = host_sched::topology::thread_affinity(0)
            .unwrap()
            .iter()
            .collect();
        let cores = [allowed[0], *allowed.get(1).unwrap_or(&allowed[0])];
        let load = Load {
            rate: 20_000,
            dist: ArrivalDist::Poisson,
            total: 4000,
            queue: 1024,
        };
        for mode in [Mode::Whole, Mode::Spatial] {
            let r = run_open(&p, 8, load, cores, mode).unwrap();
            assert_eq!(r.dropped, 0, "{}", mode.name());
            // 4000 requests at 20,000/s: 0.2 s, within 20 %.
            assert!(
                (r.rps / 20_000.0 - 1.0).abs() < 0.2,
                "{}: {}",
                mode.name(),
                r.rps
            );
            assert_eq!(r.latency.count(), 3200);
            assert!(r.cpu_per_request_us > 0.0);
        }
    }
}
