//! The stage channel's host side, for any VMM built on rust-vmm crates
//! (docs/embedding.md): the stage device that speaks
//! [`hypercall_abi::stage`] and the stage scheduling that drives it. It
//! knows nothing of the VMM's bus, builder or threads; the VMM gives it
//! guest memory (any `vm-memory` address space: [`stage::StageMemory`]),
//! creates it in its device manager, calls it from four places and runs
//! one loop:
//!
//! * the port-I/O exit handler: [`stage::handles`] and
//!   [`stage::StageDevice::doorbell`] on the vCPU thread (WAIT blocks that
//!   thread in [`park`]), then [`sched::StageSched::on_register`] for a
//!   REGISTER before the vCPU resumes;
//! * each vCPU thread's start: [`sched::Pinner::start_vcpu_thread`] (its
//!   thread id and affinity) and [`sched::ThreadCpu::start`];
//! * each helper thread's start: [`sched::Pinner::start_helper_thread`]
//!   (to the housekeeping cores);
//! * the VM's end: [`stage::StageDevice::stop`] (parked vCPUs return) and
//!   [`sched::StageSched::finish`] (the reports);
//! * the `stage-sched` loop: a thread of the VMM's running
//!   [`sched::run_loop`] (it waits on a timer and
//!   [`sched::StageSched::registered_fd`] and calls [`sched::Pacer::wake`]),
//!   or the VMM's own event loop calling [`sched::Pacer::wake`].
//!
//! Data flows one way: guest counters
//! ([`stage::StageDevice::read_blocks`], once per policy period) or rings
//! ([`stage::StageDevice::drain`], an older guest's events or a trace) →
//! [`sched::Controller`] → host-sched policy → plan → stage map
//! ([`stage::StageDevice::publish`]) and pins ([`sched::Pinner::apply`]).
//!
//! A minimal embedding (compiled by `cargo test -p stage-device`):
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use stage_device::sched::{Pacer, StageSched};
//! use stage_device::stage::{self, StageDevice};
//! use vm_memory::GuestMemoryMmap;
//!
//! /// `ram_end`: the GPA where RAM ends; `setup`: the operator's budgets.
//! fn embed(
//!     memory: GuestMemoryMmap,
//!     ram_end: u64,
//!     vcpus: u32,
//!     setup: &host_sched::vm::Setup,
//! ) -> std::io::Result<()> {
//!     // Device manager: TSC kHz unknown (0), 1 ms drain period.
//!     let device = Arc::new(StageDevice::new(Arc::new(memory), ram_end, vcpus, 0, 1000));
//!     let sched = StageSched::new(setup, vcpus, Some(device.clone()))?;
//!
//!     // vCPU thread `index`, at its start; then its port-I/O `out` exits.
//!     let vcpu = |index: u32, port: u16, data: &[u8]| {
//!         sched.pinner().start_vcpu_thread(index);
//!         if stage::handles(port) {
//!             if let Some(registered) = device.doorbell_from_current(port, data) {
//!                 sched.on_register(&registered);
//!             }
//!         }
//!     };
//!     vcpu(0, hypercall_abi::stage::DOORBELL_WAKE, &1u32.to_le_bytes());
//!
//!     // The scheduling loop's thread: a timer at `pacer.tick()`; on each
//!     // wake-up (the timer, or `registered_fd` readable: read it to clear).
//!     let mut pacer = Pacer::new(&sched, Duration::from_millis(1));
//!     let registered = sched.registered_fd().read().is_ok();
//!     if let Some(_tick) = pacer.wake(&sched, registered) {
//!         // re-arm the timer at `_tick`
//!     }
//!
//!     // The end: parked vCPUs return, then the reports.
//!     device.stop();
//!     let (_channel, _sched_report) = sched.finish();
//!     Ok(())
//! }
//! ```
//!
//! * [`stage`] — the stage device: speaks the stage-channel ABI,
//! * [`sched`] — stage scheduling: controller, pinner, the loop's pace,
//! * [`park`] — vCPU threads parked by the WAIT doorbell,
//! * [`abi`] — the ABI's structs as guest-memory objects,
//! * [`ratelimit`] — rate-limited logging of what a guest can trigger.

// The channel's timestamps are the TSC (`stage::host_tsc`, the guest
// agent's `rdtsc`): the crate is x86-64's until another counter is wired.
#[cfg(not(target_arch = "x86_64"))]
compile_error!(
    "stage-device: the stage channel's timestamps are the x86-64 TSC; see stage::host_tsc"
);

pub mod abi;
pub mod os;
pub mod park;
#[cfg(feature = "vm-device")]
pub mod ports;
pub mod ratelimit;
pub mod sched;
pub mod stage;

/// `tracing`, for [`guest_warn!`] in the crates that call it.
#[doc(hidden)]
pub use tracing as __tracing;
