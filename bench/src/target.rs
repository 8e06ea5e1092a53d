//! Command-line arguments shared by the benchmarks: what to run.

use std::path::PathBuf;

use stagevm_testkit::Stagevm;

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

impl Target {
    /// A `stagevm` command line (the test kit's) for this binary with
    /// `--kernel` this guest.
    pub fn launch(&self) -> Stagevm {
        Stagevm::new(&self.stagevm).kernel(&self.kernel)
    }
}
