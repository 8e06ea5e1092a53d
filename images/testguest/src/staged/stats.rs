//! Guest-side statistics of the staged phase: what was reported to the host
//! per stage, per-vCPU counts, migrations, switch latencies and throughput,
//! and [`print_counts`], which prints them as `testguest:` lines at the end
//! of the run. The end-to-end tests (`tests/`) and the benchmarks
//! (`bench/src/`) parse these lines, so their format is an interface.

use core::fmt::Write as _;
use core::sync::atomic::{AtomicU64, Ordering};

use guest_agent::Report;
use hypercall_abi::stage::MAX_VCPUS;

use super::agent::agent;
use super::workload::stage_names;
use super::{num_vcpus, MAX_STAGES, TSC_KHZ};
use crate::print_line;

/// Guest-side counts of what was reported, per stage, plus exits and
/// full-ring back-offs.
pub(super) static STAGE_EVENTS: [AtomicU64; MAX_STAGES] = [const { AtomicU64::new(0) }; MAX_STAGES];
pub(super) static EXIT_EVENTS: AtomicU64 = AtomicU64::new(0);
static BACKOFFS: AtomicU64 = AtomicU64::new(0);

/// Stage switches that stayed on their vCPU (`[0]`) or migrated (`[1]`), and
/// the TSC cycles from yielding to running again, summed.
pub(super) static SWITCHES: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
pub(super) static SWITCH_CYCLES: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Idle markers reported (not part of the stage counts).
pub(super) static IDLE_EVENTS: AtomicU64 = AtomicU64::new(0);

/// Counts `report` in `counter` when it was written, and its full-ring
/// back-offs in [`BACKOFFS`].
pub(super) fn count(report: Report, counter: &AtomicU64) {
    if let Report::Written { backoffs } = report {
        counter.fetch_add(1, Ordering::Relaxed);
        BACKOFFS.fetch_add(u64::from(backoffs), Ordering::Relaxed);
    }
}

/// Guest-side per-vCPU counts, one cache line each.
#[repr(C, align(64))]
pub(super) struct VcpuCounts {
    /// `stage_enter` calls executed on this vCPU, per stage.
    pub(super) ran: [AtomicU64; MAX_STAGES],
    /// WAITs sent while idle.
    pub(super) waits: AtomicU64,
    /// WAKEs sent to parked vCPUs.
    pub(super) wakes: AtomicU64,
}

pub(super) static VCPU_COUNTS: [VcpuCounts; MAX_VCPUS] = [const {
    VcpuCounts {
        ran: [const { AtomicU64::new(0) }; MAX_STAGES],
        waits: AtomicU64::new(0),
        wakes: AtomicU64::new(0),
    }
}; MAX_VCPUS];

/// Migrations decided at stage switches, in total and per stage entered
/// (`in`) and left (`out`, not counted when the thread was between requests).
pub(super) static MIGRATIONS: AtomicU64 = AtomicU64::new(0);
pub(super) static MIGRATIONS_IN: [AtomicU64; MAX_STAGES] =
    [const { AtomicU64::new(0) }; MAX_STAGES];
pub(super) static MIGRATIONS_OUT: [AtomicU64; MAX_STAGES] =
    [const { AtomicU64::new(0) }; MAX_STAGES];
/// Stage switches that stayed because the map gives the stage no vCPU.
pub(super) static FALLBACKS: AtomicU64 = AtomicU64::new(0);
/// `stage_enter`s on a vCPU the map read at that moment does not give the
/// stage although some vCPU serves it.
pub(super) static VIOLATIONS: AtomicU64 = AtomicU64::new(0);

/// Requests of all threads, and the TSC at release and when the last thread
/// finished (0: the staged phase did not run).
pub(super) static TOTAL_REQUESTS: AtomicU64 = AtomicU64::new(0);
pub(super) static START_TSC: AtomicU64 = AtomicU64::new(0);
pub(super) static END_TSC: AtomicU64 = AtomicU64::new(0);

/// A line of at most 256 bytes built with `write!` (no allocator here);
/// what does not fit is cut.
struct LineBuf {
    buf: [u8; 256],
    len: usize,
}

impl LineBuf {
    const fn new() -> Self {
        Self {
            buf: [0; 256],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl core::fmt::Write for LineBuf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        // Cut at a character boundary that fits.
        let room = self.buf.len() - self.len;
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Prints the guest's own per-stage counts (compared with the VMM's by the
/// tests), per-vCPU stage counts, migrations and the staged phase's
/// throughput, then hopper's lines when it ran (`hopper::print`).
pub fn print_counts() {
    let a = agent();
    let layout_vcpus = a.layout().map_or(0, |l| l.num_vcpus);
    let ring_full: u64 = (0..layout_vcpus).map(|v| a.ring_full_backoffs(v)).sum();
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let names = stage_names();
    // "name count name count …" over the workload's stages.
    let per_stage = |counts: &[AtomicU64; MAX_STAGES]| {
        let mut line = LineBuf::new();
        for (k, (name, c)) in names.iter().zip(counts).enumerate() {
            let sep = if k == 0 { "" } else { " " };
            let _ = write!(line, "{sep}{name} {}", load(c));
        }
        line
    };
    println!(
        "testguest: stage events {} exit {}; ring-full back-offs {} (ring headers {})",
        per_stage(&STAGE_EVENTS).as_str(),
        load(&EXIT_EVENTS),
        load(&BACKOFFS),
        ring_full
    );
    let n = num_vcpus() as usize;
    for (v, c) in VCPU_COUNTS.iter().enumerate().take(n) {
        println!("testguest: vcpu {} ran {}", v, per_stage(&c.ran).as_str());
    }
    println!(
        "testguest: migrations {}, fallbacks {}, violations {}",
        load(&MIGRATIONS),
        load(&FALLBACKS),
        load(&VIOLATIONS)
    );
    let mut line = LineBuf::new();
    for (k, name) in names.iter().enumerate() {
        let sep = if k == 0 { "" } else { ", " };
        let _ = write!(
            line,
            "{sep}{name} in {} out {}",
            load(&MIGRATIONS_IN[k]),
            load(&MIGRATIONS_OUT[k])
        );
    }
    println!("testguest: stage migrations {}", line.as_str());
    let (waits, wakes) = VCPU_COUNTS
        .iter()
        .take(n)
        .fold((0, 0), |(w, k), c| (w + load(&c.waits), k + load(&c.wakes)));
    println!("testguest: idle waits {}, wakes sent {}", waits, wakes);
    let khz = TSC_KHZ.load(Ordering::Relaxed).max(1);
    let ns = |k: usize| {
        let n = SWITCHES[k].load(Ordering::Relaxed).max(1);
        SWITCH_CYCLES[k]
            .load(Ordering::Relaxed)
            .saturating_mul(1_000_000)
            / khz
            / n
    };
    println!(
        "testguest: migration latency {} ns ({} migrations), local switch {} ns ({} switches)",
        ns(1),
        SWITCHES[1].load(Ordering::Relaxed),
        ns(0),
        SWITCHES[0].load(Ordering::Relaxed)
    );
    let start = START_TSC.load(Ordering::Relaxed);
    if start != 0 {
        let cycles = END_TSC.load(Ordering::Relaxed).saturating_sub(start).max(1);
        let khz = TSC_KHZ.load(Ordering::Relaxed).max(1);
        let requests = TOTAL_REQUESTS.load(Ordering::Relaxed);
        let rps = u128::from(requests) * u128::from(khz) * 1000 / u128::from(cycles);
        println!(
            "testguest: staged phase {} requests in {} ms, {} requests/s",
            requests,
            cycles / khz,
            rps
        );
    }
    super::hopper::print();
}
