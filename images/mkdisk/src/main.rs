//! `mkdisk`: writes the default disk image (`stagevm_mkdisk::generate`)
//! for `just run`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;

/// Writes a reproducible disk image.
#[derive(Parser, Debug)]
#[command(name = "mkdisk", about)]
struct Args {
    /// Output file.
    path: PathBuf,
    /// Size in MiB.
    #[arg(long, default_value_t = 4)]
    mib: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.mib == 0 {
        bail!("--mib 0: the disk needs at least one sector");
    }
    std::fs::write(&args.path, stagevm_mkdisk::generate(args.mib << 20))
        .with_context(|| format!("writing {}", args.path.display()))?;
    Ok(())
}
