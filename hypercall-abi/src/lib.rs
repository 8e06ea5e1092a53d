//! The stagevm guest/host contract: the stage channel is port-I/O doorbells
//! plus shared memory, not a hypercall.
//!
//! The folder is named for the design card's "hypercall ABI", but the stage
//! channel uses no hypercall (a `vmcall` never reaches a VMM's user space on
//! ordinary KVM): it is **shared memory plus port I/O** — an area of guest
//! memory the guest lays out and the host maps (per-vCPU counter blocks and
//! rings, the stage map), and doorbell ports (an `outl` to one port per
//! command, an `inl` of the status from the REGISTER port) for the rare control operations (REGISTER,
//! UNREGISTER, WAIT, WAKE). docs/stage-protocol.md is the full protocol.
//!
//! This crate holds everything a guest and the stagevm VMM must agree on, and
//! nothing else: constants, `#[repr(C)]` layouts and their size assertions. It
//! is `no_std` and has no dependencies so the test unikernel, the guest agent
//! and the VMM all build it unchanged.
//!
//! * [`boot`] — the direct ring-3 boot protocol: how each vCPU starts and the
//!   [`boot::BootInfo`] page the VMM writes for the guest.
//! * [`platform`] — the platform's fixed port-I/O devices (serial console,
//!   shutdown, vCPU stop).
//!
//! * [`stage`] — the stage channel ABI v1: shared area, per-vCPU event rings,
//!   stage map, doorbell and status codes.
#![no_std]

pub mod boot;
pub mod platform;
pub mod stage;
