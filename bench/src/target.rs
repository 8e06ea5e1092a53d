//! Command-line arguments shared by the benchmarks: what to run.

use std::path::PathBuf;

/// The VMM and guest a benchmark runs.
#[derive(clap::Args, Debug)]
pub struct Target {
    /// The stagevm binary.
    #[arg(long, default_value = "target/release/stagevm")]
    pub stagevm: PathBuf,
    /// Guest kernel (the test guest).
    #[arg(
        long,
        default_value = "images/testguest/target/x86_64-unknown-none/release/testguest"
    )]
    pub kernel: PathBuf,
}
