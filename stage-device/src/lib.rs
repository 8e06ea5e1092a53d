//! The stage channel's host side, for any VMM built on rust-vmm crates
//! (docs/embedding.md): the stage device that speaks
//! [`hypercall_abi::stage`] and the stage scheduling that drives it. It
//! knows nothing of the VMM's bus, builder or threads; the VMM gives it
//! guest memory (any `vm-memory` [`GuestMemoryBackend`](vm_memory::GuestMemoryBackend)),
//! calls it from four places and runs one loop:
//!
//! * the port-I/O exit handler: [`stage::StageDevice::handles`] and
//!   [`stage::StageDevice::doorbell`] on the vCPU thread (WAIT blocks that
//!   thread in [`park`]), then [`sched::StageSched::on_register`] for a
//!   REGISTER before the vCPU resumes;
//! * each vCPU thread's start: [`sched::Pinner::start_vcpu_thread`] (its
//!   thread id and affinity) and [`sched::ThreadCpu::start`];
//! * each helper thread's start: [`sched::Pinner::start_helper_thread`]
//!   (to the housekeeping cores);
//! * the VM's end: [`stage::StageDevice::stop`] (parked vCPUs return) and
//!   [`sched::StageSched::finish`] (the reports);
//! * the `stage-sched` loop: a thread of the VMM's that waits on its timer
//!   and [`sched::StageSched::registered_fd`] and calls
//!   [`sched::Pacer::wake`].
//!
//! Data flows one way: guest counters
//! ([`stage::StageDevice::read_counters`], once per policy period) or rings
//! ([`stage::StageDevice::drain`], an older guest's events or a trace) →
//! [`sched::Controller`] → host-sched policy → plan → stage map
//! ([`stage::StageDevice::publish`]) and pins ([`sched::Pinner::apply`]).
//!
//! * [`stage`] — the stage device: speaks the stage-channel ABI,
//! * [`sched`] — stage scheduling: controller, pinner, the loop's pace,
//! * [`park`] — vCPU threads parked by the WAIT doorbell,
//! * [`abi`] — the ABI's structs as guest-memory objects,
//! * [`ratelimit`] — rate-limited logging of what a guest can trigger.

pub mod abi;
pub mod park;
pub mod ratelimit;
pub mod sched;
pub mod stage;

/// `tracing`, for [`guest_warn!`] in the crates that call it.
#[doc(hidden)]
pub use tracing as __tracing;
