//! stagevm: a VMM on rust-vmm crates that boots guests on `/dev/kvm` and (in
//! later parts) schedules their vCPUs by server stage.
//!
//! * [`acpi`] — minimal ACPI tables (MADT, FADT…) for Linux guests,
//! * [`config`] — parsed command-line values,
//! * [`kernel`] — ELF and bzImage checks and loading (`linux-loader`),
//! * [`layout`] — guest memory layout, GDT, page tables, boot info,
//! * [`linux`] — Linux boot (PVH `vmlinux`, bzImage): boot structures and
//!   vCPU set-up,
//! * [`legacy`] — PC legacy ports of a Linux guest (CMOS clock, i8042 reset),
//! * [`gva`] — guest page-table walks for failure reports,
//! * [`devices`] — port-I/O devices (`vm-superio` serial, shutdown ports),
//! * [`stage`] — the stage device: doorbell, shared-area validation, ring
//!   draining, per-stage counters, stage map,
//! * [`vcpu`] — vCPU register set-up for the direct ring-3 boot and run loop,
//! * [`virtio`] — virtio-mmio block devices served on I/O threads,
//! * [`vm`] — building and running a VM.
//!
//! The guest/host contract lives in the `hypercall-abi` crate.

pub mod abi;
pub mod acpi;
pub mod config;
pub mod devices;
pub mod gva;
pub mod kernel;
pub mod layout;
pub mod legacy;
pub mod linux;
pub mod report;
pub mod sched;
pub mod stage;
pub mod vcpu;
pub mod virtio;
pub mod vm;
