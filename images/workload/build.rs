//! Generates the workload's code as assembly (`$OUT_DIR/workload.s`), which
//! `src/lib.rs` includes with `global_asm!`, so the test guest and the host
//! reference assemble the very same instructions.
//!
//! Shape (after the seeds' Accesstest, seed 001, `docs/design.md`, and the
//! project's probe code-footprint probe, `docs/design.md`):
//! [`STAGES`] stages of [`FUNCS`] functions each. Every function is
//! [`OPS`] rounds of `x = (x * K) ^ (x >> r)` on `rdi`/`rax` with its own
//! random constants, integer-only (no SSE state is needed in the guest),
//! aligned to 16 bytes. A table per stage holds the functions' addresses; the
//! dispatcher in `src/lib.rs` calls them in a data-dependent order. The
//! constants come from a fixed seed, so every build is identical.

use std::fmt::Write as _;
use std::path::PathBuf;

/// Stages generated (a run uses the first `stages` of them).
const STAGES: usize = 4;
/// Functions generated per stage (a run uses the first `funcs` of them).
const FUNCS: usize = 16384;
/// Multiply/xor-shift rounds per function.
const OPS: usize = 8;

/// splitmix64 (Steele, Lea, Flood: "Fast splittable pseudorandom number
/// generators", OOPSLA 2014).
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn main() {
    let mut rng = 0x05ee_d0f5_7a6e_u64;
    let mut s = String::with_capacity(STAGES * FUNCS * 200);
    writeln!(s, ".section .text.stage_workload, \"ax\"").unwrap();
    for stage in 0..STAGES {
        for f in 0..FUNCS {
            writeln!(
                s,
                ".balign 16\nstage_workload_s{stage}_f{f}:\n mov rax, rdi"
            )
            .unwrap();
            for _ in 0..OPS {
                // imul's immediate is a sign-extended 32-bit value: keep it
                // positive and odd, as the probe's 1..2^20 multipliers.
                let k = (splitmix(&mut rng) % (1 << 20)) | 1;
                let r = 1 + splitmix(&mut rng) % 31;
                writeln!(
                    s,
                    " imul rax, rax, {k}\n mov rdx, rax\n shr rdx, {r}\n xor rax, rdx"
                )
                .unwrap();
            }
            writeln!(s, " ret").unwrap();
        }
    }
    // The tables hold absolute addresses: in `.data.rel.ro` so a PIE host
    // build gets them relocated at load; the guest is linked static.
    writeln!(
        s,
        ".section .data.rel.ro.stage_workload, \"aw\"\n.balign 8\n.global stage_workload_table\nstage_workload_table:"
    )
    .unwrap();
    for stage in 0..STAGES {
        for f in 0..FUNCS {
            writeln!(s, " .quad stage_workload_s{stage}_f{f}").unwrap();
        }
    }
    writeln!(s, ".text").unwrap();
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    std::fs::write(out.join("workload.s"), s).unwrap();
    std::fs::write(
        out.join("params.rs"),
        format!(
            "/// Stages generated.\npub const MAX_STAGES: usize = {STAGES};\n\
             /// Functions generated per stage.\npub const MAX_FUNCS: usize = {FUNCS};\n\
             /// Multiply/xor-shift rounds per function.\npub const OPS: usize = {OPS};\n"
        ),
    )
    .unwrap();
    println!("cargo:rerun-if-changed=build.rs");
}
