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
//! Work conservation (issue 23): a vCPU whose queue runs dry takes a
//! waiting thread of a stage the map gives it from another vCPU's queue (a
//! steal: the stage's threads spread over the stage's vCPUs, as seed 000
//! balances a stage over its cores, §4.4); with `spill_us=N`, after N µs of
//! idle with no such thread anywhere, it takes a thread of another stage for
//! the rest of that thread's visit (a spill, off the map for one visit,
//! counted). Both are printed (`testguest: work-conserving steals S, spills
//! P`) and the benchmarks report them.
//!
//! Where things are, bottom up (a module uses only those above it in this
//! list; data flows from the workloads down to the platform):
//! * [`platform`] — port I/O for the agent ([`PortIo`]), the global
//!   [`guest_agent::Agent`] and the registration of the stage channel, the
//!   page allocator ([`alloc_pages`]), the vCPU count and TSC rate;
//! * [`config`] — the parameters as plain data ([`StagedConfig`],
//!   [`IdleConfig`], the limits) and the per-thread job the runtime carries;
//! * [`stats`] — guest-side counters and the `testguest:` lines printed at
//!   the end, which the end-to-end tests and benchmarks parse;
//! * [`thread`] — a guest thread ([`thread::Thread`], at the top of its own
//!   stack), the context switch and the creation of threads;
//! * [`runq`] — the per-vCPU run queues (spinlocked FIFOs any vCPU may
//!   push to, or take a thread from);
//! * [`arrivals`] — open-loop load (`arrival=`): the generator, the queue
//!   of arrived requests, the threads waiting for one and their latencies;
//! * [`balance`] — work conservation: an idle vCPU's steals and spills
//!   from other vCPUs' queues, a busy vCPU's balance under a temporal visit
//!   policy;
//! * [`runtime`] — each vCPU's scheduler loop, idle spinning and parking;
//!   the threads' entry function comes from the workload layer;
//! * [`switch`] — the stage switch that picks a vCPU from the host's map,
//!   migrates through the run queues and reports through the agent;
//! * [`workload`] — what the threads run: the dispatch and entry
//!   ([`workload::thread_main`]), the default parse → plan → execute request
//!   loop ([`workload::pipeline`]) and the footprint workload
//!   ([`workload::footprint`], `workload=footprint`);
//! * [`hopper`] — `hopper=N`: the thread-migration micro-benchmark (seed
//!   000's `hopper`), a workload too;
//! * [`microbench`] — `bench=1`: the `stage_enter` / doorbell
//!   micro-benchmark (on the platform only);
//! * this file — [`setup`], [`run_vcpu`] and [`print_counts`], which tie
//!   the layers together for `main.rs`.
//!
//! The hostile modes (`abuse=1`, `hostile=…`) are in [`crate::hostile`],
//! which builds on [`platform`]; nothing here depends on them.

pub mod arrivals;
mod balance;
mod config;
pub mod hopper;
mod map;
mod microbench;
pub(crate) mod platform;
mod runq;
mod runtime;
mod stats;
mod switch;
mod thread;
mod workload;

use core::sync::atomic::Ordering;

use hypercall_abi::stage::MAX_VCPUS;

pub use arrivals::ArrivalConfig;
pub use config::{IdleConfig, StagedConfig, MAX_THREADS_PER_VCPU};
pub use microbench::channel_microbench;
pub use platform::{alloc_pages, PortIo, RegisterHook};
pub use runtime::hold;
pub use workload::pipeline::set_request_source;

/// vCPU 0's part before the other vCPUs start the staged phase: the free
/// range, hopper's sample buffers (after [`hopper::configure`]), the
/// workload, the area and the agent (registered with the workload's stage
/// names, with per-vCPU counters unless `counters` is false, and latency
/// histograms with them unless `latency` is false). With
/// `before_register` (`abuse=1`'s bad REGISTERs,
/// `crate::hostile::abuse::bad_registers`), it is called on the area before
/// the registration.
pub fn setup(
    info: &hypercall_abi::boot::BootInfo,
    ring_entries: u32,
    counters: bool,
    latency: bool,
    timed_every: u64,
    before_register: Option<RegisterHook>,
    footprint: Option<stage_workload::Params>,
) {
    platform::init_free(info.free_start, info.free_end);
    hopper::init();
    if let Some(p) = footprint {
        workload::footprint::configure(&p);
    }
    let names = workload::stage_names();
    platform::NUM_VCPUS.store(info.num_vcpus.min(MAX_VCPUS as u32), Ordering::Relaxed);
    platform::TSC_KHZ.store(info.tsc_khz, Ordering::Relaxed);
    platform::register(
        info,
        names,
        ring_entries,
        (counters, latency),
        timed_every,
        before_register,
    );
}

/// This vCPU's part of the staged phase (see [`runtime::run_vcpu`]): its
/// `cfg.threads` threads run the workload chosen in [`setup`]
/// ([`workload::thread_main`]).
pub fn run_vcpu(vcpu: u32, num_vcpus: u32, cfg: &StagedConfig, tsc_khz: u64) {
    runtime::run_vcpu(
        vcpu,
        num_vcpus,
        cfg,
        tsc_khz,
        workload::thread_main,
        workload::new_job,
    );
}

/// Prints the guest's own counts (see [`stats::print_counts`]), the open
/// loop's line when it ran ([`arrivals::print`]), then hopper's lines when
/// it ran ([`hopper::print`]).
pub fn print_counts() {
    let khz = platform::TSC_KHZ.load(Ordering::Relaxed);
    stats::print_counts(
        platform::agent(),
        workload::stage_names(),
        platform::num_vcpus() as usize,
        khz,
    );
    arrivals::print(platform::num_vcpus() as usize, khz);
    hopper::print();
}
