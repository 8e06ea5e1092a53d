//! `stagevm-layering [ROOT]`: prints every import against the documented
//! direction (docs/architecture.md, "Layering") under ROOT (default: the
//! current directory) and exits 1 if there is one.

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let root = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    let found = stagevm_layering::check(&root)?;
    for v in &found {
        eprintln!("layering: {v}");
    }
    if !found.is_empty() {
        eprintln!(
            "layering: {} import(s) against the documented direction (docs/architecture.md, Layering)",
            found.len()
        );
        std::process::exit(1);
    }
    println!("layering: every import runs the documented way");
    Ok(())
}
