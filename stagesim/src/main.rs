//! `stagesim`: replay stagetrace v1 traces on simulated cores under each
//! scheduling policy, write synthetic traces, plot results.
//!
//! * `cli/` — the command line (clap): subcommands and their options,
//! * `commands/` — what each subcommand does (`replay` and `discover` have
//!   files of their own).

mod cli;
mod commands;

use clap::Parser as _;

fn main() {
    if let Err(e) = commands::run(cli::Cli::parse()) {
        eprintln!("stagesim: error: {e:#}");
        std::process::exit(1);
    }
}
