//! The staged phase: cooperative guest threads whose requests pass through
//! stages with distinct code (parse → plan → execute, or the footprint
//! workload's stages), every stage switch reported through the guest
//! agent's ring in ring 3, without a VM exit.
//!
//! Threads migrate between vCPUs as in the seeds (seed 000, `docs/design.md`,
//! §4.3/§4.5): a thread is only dispatched on vCPUs the host's stage map
//! gives its current stage. At a stage switch the thread picks the
//! least-loaded vCPU serving the stage (`guest_agent::choose_from_map`,
//! loads = published run-queue depths) unless its own vCPU serves it, and
//! yields to its vCPU's scheduler loop, which — once the thread's context is
//! saved — queues it on the chosen vCPU (waking that vCPU if it is parked);
//! when its own vCPU serves the stage it goes on running, as a thread of an
//! OS would. Threads on a vCPU take turns at the end of each request (a
//! yield to the back of the local queue). The thread reports `stage_enter`
//! on the vCPU that resumed it, right before running the stage's code, so
//! the host's per-vCPU occupancy follows what each vCPU really executes. A
//! stage no vCPU serves runs where the thread is (a counted fallback). The
//! published per-vCPU state (run-queue depth, parked, fallbacks) feeds the
//! host's wake-up safety net and its report; the guest does not maintain
//! per-stage runnable counts.
//!
//! Where things are:
//! * [`runtime`] — guest threads, the context switch, per-vCPU run queues,
//!   each vCPU's scheduler loop, idle spinning and parking, and the page
//!   allocator;
//! * [`agent`] — agent glue: registering the stage channel, the global
//!   [`guest_agent::Agent`], and the stage switch that picks a vCPU and
//!   reports through it;
//! * [`workload`] — what the threads run: the default parse → plan →
//!   execute request loop and the footprint workload (`workload=footprint`);
//! * [`abuse`] — `abuse=1`: bad REGISTERs and corrupt ring entries that test
//!   the VMM's validation;
//! * [`stats`] — guest-side counters and the `testguest:` lines printed at
//!   the end, which the end-to-end tests and benchmarks parse;
//! * [`bench`](mod@bench) — `bench=1`: the `stage_enter` / doorbell
//!   micro-benchmark;
//! * [`hopper`] — `hopper=N`: the thread-migration micro-benchmark (seed
//!   000's `hopper`);
//! * [`hostile`] — `hostile=NAME,…`: attacks on the VMM instead of the
//!   workload (`tests/hostile.rs`).

mod abuse;
mod agent;
mod bench;
pub mod hopper;
pub mod hostile;
mod hostile_counters;
mod runtime;
mod stats;
mod workload;

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use hypercall_abi::stage::MAX_VCPUS;

pub use agent::PortIo;
pub use bench::bench;
pub use runtime::{alloc_pages, hold, run_vcpu};
pub use stats::print_counts;
pub use workload::set_request_source;

/// Most stages a workload has (the footprint workload's maximum).
pub const MAX_STAGES: usize = stage_workload::MAX_STAGES;
/// Largest number of guest threads per vCPU.
pub const MAX_THREADS_PER_VCPU: usize = 16;

/// vCPU count (≤ `MAX_VCPUS`) and TSC frequency (kHz), set by vCPU 0 in
/// [`setup`].
static NUM_VCPUS: AtomicU32 = AtomicU32::new(1);
static TSC_KHZ: AtomicU64 = AtomicU64::new(0);

/// vCPUs taking part in the staged phase (those with a ring and a queue).
fn num_vcpus() -> u32 {
    NUM_VCPUS.load(Ordering::Relaxed)
}

/// Parameters of the staged phase, from the command line.
#[derive(Clone, Copy, Debug)]
pub struct StagedConfig {
    /// Guest threads per vCPU (≤ [`MAX_THREADS_PER_VCPU`]).
    pub threads: usize,
    /// Requests per thread.
    pub requests: u64,
    /// Extra work iterations per stage and request, times the stage's weight.
    pub work: u64,
    /// Per-stage weights (parse, plan, execute).
    pub weights: [u64; 3],
    /// Reverse the weights once half of all requests (guest-wide) are done.
    pub phase: bool,
    /// How an idle vCPU waits for work (see [`runtime`]'s idle rule).
    pub idle: IdleConfig,
    /// Mixing iterations a vCPU pays when it runs a different stage than
    /// the one it ran last (`switch_cost=`, a synthetic i-cache refill).
    pub switch_cost: u64,
}

/// How long an idle vCPU polls its empty run queue before it parks with
/// WAIT: briefly when it shares its host core with other vCPUs, long when
/// the host says it is alone on its core (ABI minor 1, `StageMap::owned`),
/// where polling costs no other vCPU anything and saves the WAIT and WAKE
/// exits (seed 000 §5: busy-polling idle CPUs migrate in 1.3 µs and gave
/// +22 % TPC-C against +9 % with MWAIT).
#[derive(Clone, Copy, Debug)]
pub struct IdleConfig {
    /// Polling before parking on a shared core (µs; `idle_spin_us=`).
    pub shared_us: u64,
    /// Polling before parking on an owned core (µs; `owned_idle_us=`).
    pub owned_us: u64,
}

impl Default for IdleConfig {
    fn default() -> Self {
        Self {
            shared_us: 50,
            owned_us: 10_000,
        }
    }
}

/// vCPU 0's part before the other vCPUs start the staged phase: the free
/// range, hopper's sample buffers (after [`hopper::configure`]), the
/// workload, the area and the agent (registered with the workload's stage
/// names, with per-vCPU counters unless `counters` is false). With `abuse`,
/// bad REGISTERs come before the
/// registration and corrupt ring entries after it.
pub fn setup(
    info: &hypercall_abi::boot::BootInfo,
    ring_entries: u32,
    counters: bool,
    timed_every: u64,
    abuse: bool,
    footprint: Option<stage_workload::Params>,
) {
    runtime::init_free(info.free_start, info.free_end);
    hopper::init();
    if let Some(p) = footprint {
        workload::set_footprint(&p);
    }
    let names = workload::stage_names();
    NUM_VCPUS.store(info.num_vcpus.min(MAX_VCPUS as u32), Ordering::Relaxed);
    TSC_KHZ.store(info.tsc_khz, Ordering::Relaxed);
    agent::register(info, names, ring_entries, counters, timed_every, abuse);
    if abuse && agent::agent().is_active() {
        abuse::corrupt_ring(ring_entries);
    }
}
