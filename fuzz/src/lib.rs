//! Fuzz targets for every guest-facing parser of stagevm.
//!
//! Each target is a function of arbitrary bytes (`fuzz(&[u8])`) that must
//! never panic, hang or allocate without bound, and that checks the
//! parser's invariants with assertions. The bytes are decoded with
//! [`input::Input`] into structured, often near-valid values, so a random
//! engine reaches deep states; the same functions work unchanged under a
//! coverage-guided engine.
//!
//! The engine is [`bolero`](https://docs.rs/bolero) with its default random
//! engine, which runs under plain `cargo test` on stable Rust:
//! `tests/targets.rs` has one `#[test]` per target. The number of cases
//! comes from [`harness::cases`] (`STAGEVM_FUZZ_CASES`, or a modest default
//! so `cargo test` stays fast); `just fuzz` (`fuzz/run.sh`) runs every target
//! for a million cases in debug and release mode and prints a table.
//!
//! Targets:
//! * [`stage_register`] — the stage area header and descriptors at REGISTER,
//! * [`stage_ring`] — ring drains over arbitrary ring contents and indices,
//! * [`doorbell`] — sequences of doorbell accesses on a stage device,
//! * [`virtio_blk`] — virtio-mmio registers and virtio-blk request chains,
//! * [`kernel`] — the ELF / PVH / bzImage kernel image checks and loaders,
//! * [`stage_toml`] — the operator's stage TOML and its resolution,
//! * [`stage_counters`] — the per-vCPU stage counters (ABI minor 2) as the
//!   scheduler reads them,
//! * [`virtio_net`] — virtio-net's registers, both queues' chains and the
//!   frames of its tap.

pub mod doorbell;
pub mod guest;
pub mod harness;
pub mod input;
pub mod kernel;
pub mod stage_counters;
pub mod stage_register;
pub mod stage_ring;
pub mod stage_toml;
pub mod virtio_blk;
pub mod virtio_net;
