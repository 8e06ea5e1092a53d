//! stagevm: a VMM on rust-vmm crates that boots guests on `/dev/kvm` and
//! schedules their vCPUs by server stage. The layout follows Firecracker's
//! `src/vmm` (docs/architecture.md):
//!
//! * [`builder`] — building a VM from a [`config::VmConfig`] as named steps,
//! * [`vmm`] — running it: the main event loop and shutdown,
//! * [`exit`] — how a VM ends and the exit `EventFd` every loop waits on,
//! * [`error`] — the VMM's errors,
//! * [`config`] — parsed command-line values,
//! * [`arch`] — x86-64 registers, layout, Linux boot, ACPI, page walks,
//! * [`vstate`] — the vCPU run loop and guest memory,
//! * [`devices`] — the I/O bus, legacy devices, virtio-mmio block,
//! * [`sched_loop`] — the `stage-sched` thread's loop,
//! * [`seccomp`] — one seccomp filter per thread kind.
//! * [`sandbox`] — Landlock once the VM is built.
//!
//! Data flows one way: guest counters
//! ([`stage_device::stage::StageDevice::read_blocks`], once per policy
//! period) or rings ([`stage_device::stage::StageDevice::drain`], an older
//! guest's events or a trace) → [`stage_device::sched::Controller`] →
//! host-sched policy → plan → stage map
//! ([`stage_device::stage::StageDevice::publish`]) and pins
//! ([`stage_device::sched::Pinner::apply`]). The stage device and its
//! scheduling (WAIT/WAKE parking, the guest-memory objects, the rate-limited
//! guest log lines) are the `stage-device` crate, which any rust-vmm VMM can
//! embed (docs/embedding.md); this VMM is its first user and imports it by
//! its own name. The guest/host
//! contract lives in the `hypercall-abi` crate; the report types in
//! `stagevm-report`.

pub mod api;
pub mod arch;
pub mod builder;
pub mod config;
pub mod devices;
pub mod error;
pub mod exit;
pub mod sandbox;
pub mod sched_loop;
pub mod seccomp;
pub mod vmm;
pub mod vstate;
