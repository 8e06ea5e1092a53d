//! `hopper=N`: the thread-migration micro-benchmark, after seed 000's
//! `hopper` (the thesis measured 1.3 µs per migration between cores with
//! busy-polling idle CPUs, 1.66 µs with MWAIT).
//!
//! The guest registers `N` stages (`hop0`, `hop1`[, `hop2`]) and runs
//! `threads=` threads per vCPU, by default one thread in the whole guest
//! (on vCPU 0) so that every target vCPU is idle when a thread arrives: the
//! point is the mechanism, not queueing. Each thread makes two passes of
//! `hops=` switches (default 100,000, shared among the threads):
//!
//! 1. **Migrations**: stage `i mod N` at switch `i`, through the ordinary
//!    stage switch (`switch::stage_switch`: the host's map, the least-loaded
//!    rule, the run queues, a WAKE when the target is parked), with no work
//!    in between. A switch whose next stage is served by the thread's own
//!    vCPU does not migrate and is only counted (`stayed`).
//! 2. **Local switches**: the same yield to the vCPU's scheduler and resume,
//!    without moving.
//!
//! A sample is the TSC from just before the thread yields to just after it
//! runs again (on the target vCPU for a migration), as
//! `runtime::timed_yield` measures it. The first 1000 switches of each
//! pass (guest-wide; a tenth of a pass shorter than 10,000) are dropped.
//! The last vCPU prints, per pass, the count, mean, median, p99 and maximum
//! in ns, and a histogram in [`BUCKET_NS`]-ns buckets (`print`);
//! `migration-bench` (`bench/src/migration/`) parses those lines.
//!
//! A workload (dispatched by [`super::workload`]): depends on
//! [`super::switch`], [`super::runtime`] and [`super::platform`].

use core::fmt;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::platform::{agent, alloc_pages, TSC_KHZ};
use super::runtime::{finish, timed_yield, Thread};
use super::switch::{stage_leave, stage_switch};
use crate::print_line;

/// Stage names hopper registers, in id order (`hopper=N` uses the first N).
const NAMES: [&str; 3] = ["hop0", "hop1", "hop2"];
/// Most switches dropped at the start of each pass (the warm-up).
const WARMUP: u64 = 1000;
/// Width of one histogram bucket (ns).
pub const BUCKET_NS: u64 = 200;
/// Histogram buckets before the overflow bucket: [0, 10 µs) in 200 ns steps.
const BUCKETS: usize = 50;

/// Stages (0: hopper off), switches per pass guest-wide, mixing iterations
/// after every switch and the passes that run ([`Passes`] as its `u32`), set
/// by vCPU 0 in [`configure`] before the other vCPUs start the staged
/// phase.
static STAGES: AtomicU32 = AtomicU32::new(0);
static HOPS: AtomicU64 = AtomicU64::new(0);
static WORK: AtomicU64 = AtomicU64::new(0);
static PASSES_RUN: AtomicU32 = AtomicU32::new(0);

/// Which of hopper's passes run (`hop_pass=`), kept in [`PASSES_RUN`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Passes {
    /// Migrations, then local switches (the default).
    Both = 0,
    /// Migrations only (`migrate`).
    Migrate = 1,
    /// Local switches only (`local`).
    Local = 2,
}

impl Passes {
    /// `both`, `migrate` or `local`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "both" => Some(Self::Both),
            "migrate" => Some(Self::Migrate),
            "local" => Some(Self::Local),
            _ => None,
        }
    }

    /// The passes [`configure`] chose.
    fn current() -> Self {
        match PASSES_RUN.load(Ordering::Relaxed) {
            1 => Self::Migrate,
            2 => Self::Local,
            _ => Self::Both,
        }
    }

    /// Whether pass `pass` (0: migrations, 1: local switches) runs.
    fn runs(self, pass: usize) -> bool {
        matches!(
            (self, pass),
            (Self::Both, _) | (Self::Migrate, 0) | (Self::Local, 1)
        )
    }
}

/// One pass's samples: a buffer of TSC deltas (ticks) in guest memory,
/// filled through an atomic index by whichever vCPU resumes a thread.
struct Pass {
    /// GPA of the sample buffer (0: not allocated).
    buf: AtomicU64,
    /// Samples the buffer holds.
    cap: AtomicU64,
    /// Switches seen so far (guest-wide), measured or not.
    seq: AtomicU64,
    /// Samples written (may exceed `cap`; the excess is dropped).
    len: AtomicU64,
    /// Switches after the warm-up that did not migrate.
    stayed: AtomicU64,
}

impl Pass {
    const fn new() -> Self {
        Self {
            buf: AtomicU64::new(0),
            cap: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            len: AtomicU64::new(0),
            stayed: AtomicU64::new(0),
        }
    }

    /// Counts one switch; stores its duration (`Some(ticks)`) or counts it
    /// as stayed (`None`) unless it falls in the warm-up.
    fn record(&self, ticks: Option<u64>) {
        if self.seq.fetch_add(1, Ordering::Relaxed) < warmup() {
            return;
        }
        let Some(ticks) = ticks else {
            self.stayed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let i = self.len.fetch_add(1, Ordering::Relaxed);
        if i < self.cap.load(Ordering::Relaxed) {
            let buf = self.buf.load(Ordering::Relaxed) as *mut u64;
            // SAFETY: `buf` holds `cap` u64s allocated in `init` for this pass
            // alone, and the atomic index gives slot `i` to this caller only.
            unsafe { buf.add(i as usize).write(ticks) };
        }
    }

    /// The samples, once every thread is done.
    fn samples(&self) -> &'static mut [u64] {
        let n = self
            .len
            .load(Ordering::Relaxed)
            .min(self.cap.load(Ordering::Relaxed));
        let buf = self.buf.load(Ordering::Relaxed);
        if buf == 0 || n == 0 {
            return &mut [];
        }
        // SAFETY: `n` samples were written to the buffer (see `record`); the
        // caller runs after every thread finished (the last vCPU, after
        // `DONE`'s acquire), so no one else touches the buffer any more.
        unsafe { core::slice::from_raw_parts_mut(buf as *mut u64, n as usize) }
    }
}

/// Pass 0: migrations; pass 1: local switches.
static PASSES: [Pass; 2] = [Pass::new(), Pass::new()];

/// Turns hopper on with `stages` stages (2 or 3) and `hops` switches per
/// pass guest-wide, `work` mixing iterations after every switch, running
/// `passes` (vCPU 0, before `staged::setup`); 0 stages leaves it off.
pub fn configure(stages: u32, hops: u64, work: u64, passes: Passes) {
    HOPS.store(hops, Ordering::Relaxed);
    WORK.store(work, Ordering::Relaxed);
    PASSES_RUN.store(passes as u32, Ordering::Relaxed);
    STAGES.store(stages.min(NAMES.len() as u32), Ordering::Relaxed);
}

/// Stages of the running hopper, if it is on.
pub(super) fn stages() -> Option<u32> {
    Some(STAGES.load(Ordering::Relaxed)).filter(|n| *n != 0)
}

/// Hopper's stage names, if it is on.
pub(super) fn stage_names() -> Option<&'static [&'static str]> {
    stages().map(|n| &NAMES[..n as usize])
}

/// Switches dropped at the start of each pass: 1000, or a tenth of a pass
/// when a pass is shorter than 10,000 switches.
fn warmup() -> u64 {
    WARMUP.min(HOPS.load(Ordering::Relaxed) / 10)
}

/// Allocates the sample buffers (vCPU 0, after the free range is set); ends
/// the VM with exit code 5 when memory runs out.
pub(super) fn init() {
    if stages().is_none() {
        return;
    }
    if Passes::current() != Passes::Both {
        // One pass only (`hop_pass=`): no samples, see `thread_main`.
        return;
    }
    let cap = HOPS.load(Ordering::Relaxed);
    for pass in &PASSES {
        let Some(buf) = alloc_pages(cap.saturating_mul(8).max(8)) else {
            println!("testguest: out of memory for hopper samples ({cap} per pass)");
            crate::shutdown(5);
        };
        pass.buf.store(buf, Ordering::Relaxed);
        pass.cap.store(cap, Ordering::Relaxed);
    }
}

/// Body of a hopper thread: `t.job.requests` switches round-robin over the
/// stages (stage `i mod N`, starting at stage 0 so the first switch stays),
/// then as many local yields, each timed (`hop_pass=` runs one pass only;
/// `hop_work=` iterations of [`spin`] after each switch); then it reports
/// its exit and ends with its switch count as checksum.
pub(super) fn thread_main(t: &Thread, stages: u32) -> ! {
    let hops = t.job.requests;
    let work = WORK.load(Ordering::Relaxed);
    let passes = Passes::current();
    let mut x = u64::from(t.id) | 1;
    // With one pass (`hop_pass=`, migration-bench's saturated mode) no
    // samples are kept: their shared index would make every switch a
    // contended atomic on both vCPUs, which is not what is measured.
    let sampled = passes == Passes::Both;
    if passes.runs(0) {
        for i in 0..hops {
            let ticks = stage_switch(t, (i % u64::from(stages)) as u32);
            if sampled {
                PASSES[0].record(ticks);
            }
            x = spin(x, work);
        }
    }
    if passes.runs(1) {
        for _ in 0..hops {
            let ticks = timed_yield(t, 0);
            if sampled {
                PASSES[1].record(Some(ticks));
            }
            x = spin(x, work);
        }
    }
    core::hint::black_box(x);
    stage_leave(t, false);
    finish(t, hops)
}

/// `n` rounds of xorshift64 on `x`: the work between two switches
/// (`hop_work=`), the same in both passes.
#[inline(never)]
fn spin(mut x: u64, n: u64) -> u64 {
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = x.wrapping_add(i);
    }
    x
}

/// `ticks` of the TSC in ns.
fn ns(ticks: u64) -> u64 {
    let khz = TSC_KHZ.load(Ordering::Relaxed).max(1);
    (u128::from(ticks) * 1_000_000 / u128::from(khz)) as u64
}

/// Bucket counts of sorted samples (ticks): `[k]` counts samples in
/// `[k × BUCKET_NS, (k + 1) × BUCKET_NS)` ns, the last one everything from
/// `BUCKETS × BUCKET_NS` ns on.
struct Histogram([u64; BUCKETS + 1]);

impl Histogram {
    fn new(samples: &[u64]) -> Self {
        let mut counts = [0u64; BUCKETS + 1];
        for s in samples {
            let k = (ns(*s) / BUCKET_NS).min(BUCKETS as u64) as usize;
            counts[k] += 1;
        }
        Self(counts)
    }
}

impl fmt::Display for Histogram {
    /// The non-empty buckets as `lower-bound-ns:count`, space-separated, the
    /// overflow bucket as `>=LIMIT:count`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for (k, c) in self.0.iter().enumerate().filter(|(_, c)| **c != 0) {
            let lo = k as u64 * BUCKET_NS;
            let ge = if k == BUCKETS { ">=" } else { "" };
            write!(f, "{sep}{ge}{lo}:{c}")?;
            sep = " ";
        }
        Ok(())
    }
}

/// Prints one pass (`what` is `migrations` or `local`): its summary line
/// (count, mean, p50, p99, max in ns) and its histogram line.
fn print_pass(what: &str, pass: &Pass) {
    let samples = pass.samples();
    samples.sort_unstable();
    let n = samples.len();
    let at = |q: usize| samples.get((n * q).div_ceil(100).max(1) - 1).copied();
    let sum: u128 = samples.iter().map(|s| u128::from(*s)).sum();
    let mean = if n == 0 {
        0
    } else {
        ns((sum / n as u128) as u64)
    };
    println!(
        "testguest: hopper {what} {n} mean {mean} ns p50 {} ns p99 {} ns max {} ns",
        at(50).map_or(0, ns),
        at(99).map_or(0, ns),
        samples.last().copied().map_or(0, ns)
    );
    println!(
        "testguest: hopper histogram {what} ({BUCKET_NS} ns buckets, lower bound ns:count) {}",
        Histogram::new(samples)
    );
}

/// Prints hopper's lines (nothing when it is off): a header with the
/// stages, switches per pass, warm-up, switches that stayed on their vCPU,
/// the map's owned vCPUs and dropped samples, then each pass's summary and
/// histogram (see [`print_pass`]).
pub(super) fn print() {
    let Some(stages) = stages() else {
        return;
    };
    let owned = agent().read_map().map_or(0, |m| m.owned);
    let pass = match Passes::current() {
        Passes::Migrate => "migrate",
        Passes::Local => "local",
        Passes::Both => "",
    };
    if !pass.is_empty() {
        // One pass, no samples: its cost is in the `testguest: busy` line.
        println!(
            "testguest: hopper {stages} stages, {} switches in all, hop_pass={pass} (no samples), owned vCPUs {owned:#x}",
            HOPS.load(Ordering::Relaxed)
        );
        return;
    }
    let dropped: u64 = PASSES
        .iter()
        .map(|p| {
            let len = p.len.load(Ordering::Relaxed);
            len.saturating_sub(p.cap.load(Ordering::Relaxed))
        })
        .sum();
    println!(
        "testguest: hopper {} stages, {} switches per pass, warm-up {}, stayed {}, owned vCPUs {:#x}, samples lost {}",
        stages,
        PASSES[0].seq.load(Ordering::Relaxed),
        warmup(),
        PASSES[0].stayed.load(Ordering::Relaxed),
        owned,
        dropped
    );
    print_pass("migrations", &PASSES[0]);
    print_pass("local", &PASSES[1]);
}
