//! One bolero test per fuzz target (see `stagevm_fuzz`). Under plain
//! `cargo test` each runs a modest number of random cases; `just fuzz`
//! (`fuzz/run.sh`) sets `STAGEVM_FUZZ_CASES` for the long runs.

use std::sync::Mutex;

use stagevm_fuzz::harness::{cases, Run};

/// Runs `target` under bolero's random engine for `cases(name, default)`
/// inputs of at most `max_len` bytes.
fn fuzz(name: &'static str, default: usize, max_len: usize, target: fn(&[u8])) {
    let run = Mutex::new(Run::new(name));
    bolero::check!()
        .with_iterations(cases(name, default))
        .with_max_len(max_len)
        .for_each(|data: &[u8]| {
            run.lock()
                .unwrap_or_else(|p| p.into_inner())
                .case(data, target)
        });
}

#[test]
fn stage_register() {
    fuzz(
        "stage_register",
        20_000,
        768,
        stagevm_fuzz::stage_register::fuzz,
    );
}

#[test]
fn stage_ring() {
    fuzz("stage_ring", 5_000, 4096, stagevm_fuzz::stage_ring::fuzz);
}

#[test]
fn doorbell() {
    fuzz("doorbell", 10_000, 512, stagevm_fuzz::doorbell::fuzz);
}

#[test]
fn virtio_blk() {
    fuzz("virtio_blk", 5_000, 4096, stagevm_fuzz::virtio_blk::fuzz);
}

#[test]
fn virtio_net() {
    fuzz("virtio_net", 5_000, 4096, stagevm_fuzz::virtio_net::fuzz);
}

#[test]
fn kernel() {
    fuzz("kernel", 5_000, 2048, stagevm_fuzz::kernel::fuzz);
}

#[test]
fn stage_toml() {
    fuzz("stage_toml", 10_000, 512, stagevm_fuzz::stage_toml::fuzz);
}

#[test]
fn stage_counters() {
    fuzz(
        "stage_counters",
        10_000,
        1024,
        stagevm_fuzz::stage_counters::fuzz,
    );
}
