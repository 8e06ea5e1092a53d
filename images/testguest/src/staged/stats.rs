//! Guest-side statistics of the staged phase: what was reported to the host
//! per stage, per-vCPU counts, migrations, switch latencies and throughput,
//! and [`print_counts`], which prints them as `testguest:` lines at the end
//! of the run. The end-to-end tests (`tests/`) and the benchmarks
//! (`bench/src/`) parse these lines, so their format is an interface.
//!
//! Depends on nothing else in `staged/` but the limits of [`super::config`]:
//! what it prints about the agent, the stages and the machine is passed in
//! (`staged::print_counts`).

use core::fmt::Write as _;
use core::sync::atomic::{AtomicU64, Ordering};

use guest_agent::{Agent, Platform, Report, Trace};
use hypercall_abi::stage::MAX_VCPUS;

use super::config::MAX_STAGES;
use crate::print_line;

/// Adds `n` to a counter only this vCPU writes (no locked instruction:
/// the counters of one vCPU live on its own cache lines).
pub(super) fn bump(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// Counts `report`, made on `vcpu`, in `counter` (a field of that vCPU's
/// [`VcpuCounts`]) when it reached the host (counted or written), its
/// full-ring back-offs and its trace event's fate.
pub(super) fn count(vcpu: u32, report: Report, counter: &AtomicU64) {
    let c = &VCPU_COUNTS[vcpu as usize];
    match report {
        Report::Written { backoffs } => {
            bump(counter, 1);
            bump(&c.backoffs, u64::from(backoffs));
        }
        Report::Counted { trace } => {
            bump(counter, 1);
            match trace {
                Trace::Off => {}
                Trace::Written => bump(&c.traced, 1),
                Trace::Dropped => bump(&c.trace_dropped, 1),
            }
        }
        Report::Inactive | Report::BadStage => {}
    }
}

/// TSC when the guest-wide count of completed requests reached 10 % and
/// 90 % of all requests (0: not yet): the steady middle of the run, which
/// leaves out the start-up and the tail where few threads remain.
pub(super) static MARKS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The 10 % and 90 % marks of `total` requests.
fn marks(total: u64) -> [u64; 2] {
    [total / 10, total - total / 10]
}

/// Which steady-state mark `completed` requests done guest-wide (the value
/// the completing thread's increment made) reach, if any: the caller then
/// records the TSC in [`MARKS`] (read only there: a TSC read costs tens of
/// ns here).
#[inline]
pub(super) fn mark_at(completed: u64) -> Option<usize> {
    let m = marks(TOTAL_REQUESTS.load(Ordering::Relaxed));
    (completed == m[0] || completed == m[1]).then_some(usize::from(completed == m[1]))
}

/// Guest-side per-vCPU counts, written only by their vCPU, on cache lines
/// of their own, 128-byte aligned (the adjacent-line prefetcher moves pairs
/// of lines): shared counters would bounce between vCPUs at every switch and
/// make the channel look costlier than it is.
#[repr(C, align(128))]
pub(super) struct VcpuCounts {
    /// `stage_enter` calls executed on this vCPU, per stage.
    pub(super) ran: [AtomicU64; MAX_STAGES],
    /// Of those, the reports that reached the host, per stage.
    pub(super) reported: [AtomicU64; MAX_STAGES],
    /// `stage_exit` reports that reached the host (requests).
    pub(super) exits: AtomicU64,
    /// Idle markers that reached the host.
    pub(super) idles: AtomicU64,
    /// Full-ring back-offs (rings mode).
    pub(super) backoffs: AtomicU64,
    /// Trace events written to a ring, and dropped on a full one.
    pub(super) traced: AtomicU64,
    pub(super) trace_dropped: AtomicU64,
    /// Stage switches that stayed on their vCPU (`[0]`) or migrated
    /// (`[1]`), counted where the thread resumed, and the TSC cycles from
    /// yielding to running again, summed.
    pub(super) switches: [AtomicU64; 2],
    pub(super) switch_cycles: [AtomicU64; 2],
    /// Threads this vCPU took from other vCPUs' queues while idle: of a
    /// stage it serves (steals), and of other stages (spills, `spill_us=`).
    pub(super) steals: AtomicU64,
    pub(super) spills: AtomicU64,
    /// Under a temporal visit policy: stage visits (runs of threads of one
    /// stage served back to back) and the threads served in them.
    pub(super) visits: AtomicU64,
    pub(super) visit_threads: AtomicU64,
    /// WAITs sent while idle.
    pub(super) waits: AtomicU64,
    /// WAKEs sent to parked vCPUs.
    pub(super) wakes: AtomicU64,
    /// TSC ticks spent with an empty run queue (in the scheduler's idle
    /// loop, polling or parked).
    pub(super) idle_cycles: AtomicU64,
    /// Migrations decided at stage switches on this vCPU (or steals into
    /// it), in total and per stage entered (`in`) and left (`out`, not
    /// counted when the thread was between requests).
    pub(super) migrations: AtomicU64,
    pub(super) migrations_in: [AtomicU64; MAX_STAGES],
    pub(super) migrations_out: [AtomicU64; MAX_STAGES],
    /// Stage switches that stayed because the map gives the stage no vCPU.
    pub(super) fallbacks: AtomicU64,
    /// `stage_enter`s on a vCPU the map read at that moment does not give
    /// the stage although some vCPU serves it.
    pub(super) violations: AtomicU64,
}

pub(super) static VCPU_COUNTS: [VcpuCounts; MAX_VCPUS] = [const {
    VcpuCounts {
        ran: [const { AtomicU64::new(0) }; MAX_STAGES],
        reported: [const { AtomicU64::new(0) }; MAX_STAGES],
        exits: AtomicU64::new(0),
        idles: AtomicU64::new(0),
        backoffs: AtomicU64::new(0),
        traced: AtomicU64::new(0),
        trace_dropped: AtomicU64::new(0),
        switches: [const { AtomicU64::new(0) }; 2],
        switch_cycles: [const { AtomicU64::new(0) }; 2],
        steals: AtomicU64::new(0),
        spills: AtomicU64::new(0),
        visits: AtomicU64::new(0),
        visit_threads: AtomicU64::new(0),
        waits: AtomicU64::new(0),
        wakes: AtomicU64::new(0),
        idle_cycles: AtomicU64::new(0),
        migrations: AtomicU64::new(0),
        migrations_in: [const { AtomicU64::new(0) }; MAX_STAGES],
        migrations_out: [const { AtomicU64::new(0) }; MAX_STAGES],
        fallbacks: AtomicU64::new(0),
        violations: AtomicU64::new(0),
    }
}; MAX_VCPUS];

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
/// throughput: the agent `a`'s ring counters, the counts of the first
/// `num_vcpus` vCPUs over the stages `names`, times from a TSC of
/// `tsc_khz` kHz. (`staged::print_counts` then prints hopper's lines.)
pub(super) fn print_counts<P: Platform>(
    a: &Agent<P>,
    names: &[&str],
    num_vcpus: usize,
    tsc_khz: u64,
) {
    let layout_vcpus = a.layout().map_or(0, |l| l.num_vcpus);
    let ring_full: u64 = (0..layout_vcpus).map(|v| a.ring_full_backoffs(v)).sum();
    let ring_dropped: u64 = (0..layout_vcpus).map(|v| a.trace_dropped(v)).sum();
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let n = num_vcpus;
    let vcpus = &VCPU_COUNTS[..n];
    let total = |f: fn(&VcpuCounts) -> &AtomicU64| vcpus.iter().map(|c| load(f(c))).sum::<u64>();
    // "name count name count …" over the workload's stages.
    let per_stage = |count: &dyn Fn(usize) -> u64| {
        let mut line = LineBuf::new();
        for (k, name) in names.iter().enumerate() {
            let sep = if k == 0 { "" } else { " " };
            let _ = write!(line, "{sep}{name} {}", count(k));
        }
        line
    };
    let reported = |k: usize| vcpus.iter().map(|c| load(&c.reported[k])).sum::<u64>();
    println!(
        "testguest: stage events {} exit {}; ring-full back-offs {} (ring headers {}); trace written {} dropped {} (ring headers {})",
        per_stage(&reported).as_str(),
        total(|c| &c.exits),
        total(|c| &c.backoffs),
        ring_full,
        total(|c| &c.traced),
        total(|c| &c.trace_dropped),
        ring_dropped
    );
    for (v, c) in vcpus.iter().enumerate() {
        println!(
            "testguest: vcpu {} ran {}",
            v,
            per_stage(&|k| load(&c.ran[k])).as_str()
        );
    }
    println!(
        "testguest: migrations {}, fallbacks {}, violations {}",
        total(|c| &c.migrations),
        total(|c| &c.fallbacks),
        total(|c| &c.violations)
    );
    let mut line = LineBuf::new();
    for (k, name) in names.iter().enumerate() {
        let sep = if k == 0 { "" } else { ", " };
        let _ = write!(
            line,
            "{sep}{name} in {} out {}",
            vcpus.iter().map(|c| load(&c.migrations_in[k])).sum::<u64>(),
            vcpus
                .iter()
                .map(|c| load(&c.migrations_out[k]))
                .sum::<u64>()
        );
    }
    println!("testguest: stage migrations {}", line.as_str());
    // Idle time over the vCPUs' time in the staged phase (per mille).
    let start = START_TSC.load(Ordering::Relaxed);
    let phase = END_TSC.load(Ordering::Relaxed).saturating_sub(start);
    let idle = total(|c| &c.idle_cycles);
    let permille = (u128::from(idle) * 1000 / u128::from(phase.max(1) * n as u64)).min(1000);
    println!(
        "testguest: idle waits {}, wakes sent {}, idle {}.{} % of the vCPUs' time",
        total(|c| &c.waits),
        total(|c| &c.wakes),
        permille / 10,
        permille % 10
    );
    let khz = tsc_khz.max(1);
    // Busy vCPU time (not idle) over the vCPUs' time in the staged phase,
    // in ns: what migration-bench's saturated mode compares.
    let vcpu_ns = u128::from(phase) * n as u128 * 1_000_000 / u128::from(khz);
    let idle_ns = u128::from(idle) * 1_000_000 / u128::from(khz);
    println!(
        "testguest: busy {} ns of {} ns vCPU time in the staged phase",
        vcpu_ns.saturating_sub(idle_ns),
        vcpu_ns
    );
    println!(
        "testguest: work-conserving steals {}, spills {}",
        total(|c| &c.steals),
        total(|c| &c.spills)
    );
    let (visits, threads) = (total(|c| &c.visits), total(|c| &c.visit_threads));
    println!(
        "testguest: stage visits {visits}, threads served in them {threads} ({}.{:02} per visit)",
        threads / visits.max(1),
        threads % visits.max(1) * 100 / visits.max(1)
    );
    let switches = |k: usize| vcpus.iter().map(|c| load(&c.switches[k])).sum::<u64>();
    let ns = |k: usize| {
        let cycles: u64 = vcpus.iter().map(|c| load(&c.switch_cycles[k])).sum();
        cycles.saturating_mul(1_000_000) / khz / switches(k).max(1)
    };
    println!(
        "testguest: migration latency {} ns ({} migrations), local switch {} ns ({} switches)",
        ns(1),
        switches(1),
        ns(0),
        switches(0)
    );
    if start != 0 {
        let cycles = phase.max(1);
        let requests = TOTAL_REQUESTS.load(Ordering::Relaxed);
        let rps = u128::from(requests) * u128::from(khz) * 1000 / u128::from(cycles);
        println!(
            "testguest: staged phase {} requests in {} ms, {} requests/s",
            requests,
            cycles / khz,
            rps
        );
        let [a, b] = [0, 1].map(|k| MARKS[k].load(Ordering::Relaxed));
        let m = marks(requests);
        if a != 0 && b > a && m[1] > m[0] {
            let n = m[1] - m[0];
            let rps = u128::from(n) * u128::from(khz) * 1000 / u128::from(b - a);
            println!(
                "testguest: steady phase {n} requests in {} ms, {rps} requests/s (from 10 % to 90 % of {requests})",
                (b - a) / khz
            );
        }
    }
}
