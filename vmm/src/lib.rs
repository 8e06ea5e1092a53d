//! stagevm: a VMM on rust-vmm crates that boots guests on `/dev/kvm` and
//! schedules their vCPUs by server stage. The layout follows Firecracker's
//! `src/vmm` (docs/architecture.md):
//!
//! * [`builder`] — building a VM from a [`config::VmConfig`] as named steps,
//! * [`vmm`] — running it: the main event loop and shutdown,
//! * [`exit`] — how a VM ends and the exit `EventFd` every loop waits on,
//! * [`error`] — the VMM's errors,
//! * [`poll`] — the epoll helper of the event loops,
//! * [`ratelimit`] — rate-limited logging of what a guest can trigger,
//! * [`config`] — parsed command-line values,
//! * [`arch`] — x86-64 registers, layout, Linux boot, ACPI, page walks,
//! * [`vstate`] — the vCPU run loop, WAIT/WAKE parking, guest memory,
//! * [`devices`] — the I/O bus, legacy devices, virtio-mmio block,
//! * [`stage`] — the stage device: speaks the stage-channel ABI,
//! * [`sched`] — stage scheduling: controller, pinner, the `stage-sched` loop,
//! * [`seccomp`] — one seccomp filter per thread kind.
//!
//! Data flows one way: guest counters ([`stage::StageDevice::read_counters`],
//! once per policy period) or rings ([`stage::StageDevice::drain`], an
//! older guest's events or a trace) → [`sched::Controller`] → host-sched
//! policy → plan → stage map
//! ([`stage::StageDevice::publish`]) and pins ([`sched::Pinner::apply`]).
//! The guest/host contract lives in the `hypercall-abi` crate; the report
//! types in `stagevm-report`.

pub mod abi;
pub mod api;
pub mod arch;
pub mod builder;
pub mod config;
pub mod devices;
pub mod error;
pub mod exit;
pub mod poll;
pub mod ratelimit;
pub mod sched;
pub mod seccomp;
pub mod stage;
pub mod vmm;
pub mod vstate;
