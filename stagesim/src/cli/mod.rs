//! The command line of `stagesim`: the subcommands ([`Cmd`]), the options
//! shared by `replay` and `discover` ([`ModelArgs`]: cache geometry and
//! cycle model) and the list and geometry parsers. Each subcommand's own
//! options are in [`args`]; what runs them is in `crate::commands`.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use stagesim::cache::{Geometry, Hierarchy};
use stagesim::sim::CycleModel;

pub mod args;

use args::{DiscoverArgs, PlotArgs, ReplayArgs, SynthArgs};

#[derive(Parser)]
#[command(
    name = "stagesim",
    about = "Trace-driven multi-core cache simulator: replays stagetrace v1 traces under baseline, pinned and the host-sched stage policies"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Replay a trace under each (policy, cores, slice) and print a comparison table.
    Replay(Box<ReplayArgs>),
    /// Run the `replay` command lines of FILE (one per line, `#` comments), loading each trace
    /// (and each --stage-map re-marking of it) once for all of them.
    ReplayBatch {
        /// The batch file: each line is `replay`'s options (split on white space, no quoting).
        file: PathBuf,
    },
    /// Write a synthetic trace (and its .stages.toml sidecar).
    Synth(SynthArgs),
    /// Write PNG plots (MPKI and throughput per policy and core count) from a replay's JSON.
    Plot(PlotArgs),
    /// Automatic stage discovery (seed 004's simulate-and-pick, at stage granularity): greedy merging of the trace's stages.
    Discover(Box<DiscoverArgs>),
    /// Per-stage (or per-group) visit lengths, code footprints, shared code and stage transitions.
    Stats {
        /// Trace file (zstd stagetrace v1).
        #[arg(long)]
        trace: PathBuf,
        /// Stage sidecar to use instead of `<trace>.stages.toml`.
        #[arg(long)]
        sidecar: Option<PathBuf>,
        /// Groupings to report (repeatable; `-` = the trace's own stages; syntax as for `replay`).
        #[arg(long = "stage-groups", default_value = "-")]
        stage_groups: Vec<String>,
        /// Cache line size for footprints, bytes.
        #[arg(long, default_value_t = 64)]
        line: u64,
        /// Also write the statistics as JSON (an array, one entry per grouping).
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Write the `bench/RESULTS.md` section (between the stagesim markers) from the JSON files of `just bench-sim`.
    Results {
        /// Folder with the JSON files (`<trace>.json`, `<trace>-sweep.json`, …, `commands.txt`, `env.txt`).
        #[arg(long, default_value = "target/stagesim")]
        dir: PathBuf,
        /// Trace names (file stems) in table order, comma-separated.
        #[arg(long, value_parser = list::<String>)]
        traces: std::vec::Vec<String>,
        /// The results file; only the text between its stagesim markers is replaced.
        #[arg(long, default_value = "bench/RESULTS.md")]
        out: PathBuf,
        /// Hand-written interpretation to include (markdown).
        #[arg(long)]
        notes: Option<PathBuf>,
        /// Checked-in plots folder (relative to the results file's folder: linked as stagesim/plots/NAME).
        #[arg(long, default_value = "stagesim/plots")]
        plots: PathBuf,
        /// Print the section instead of writing it.
        #[arg(long)]
        print: bool,
        /// Write issue 40's temporal-staging section instead (its own markers,
        /// `<!-- stagesim-temporal:begin … -->`), from `bench-sim.sh --temporal`'s files.
        #[arg(long)]
        temporal: bool,
    },
    /// Summarise a trace: threads, instructions, stages.
    Info {
        /// Trace file (zstd stagetrace v1).
        #[arg(long)]
        trace: PathBuf,
        /// Stage sidecar to use instead of `<trace>.stages.toml`.
        #[arg(long)]
        sidecar: Option<PathBuf>,
    },
}

pub fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|_| format!("'{x}' is not valid"))
        })
        .collect()
}

/// `KIB:WAYS`, e.g. `512:8`.
pub fn geometry(s: &str, line: u32) -> anyhow::Result<Geometry> {
    let (kib, ways) = s
        .split_once(':')
        .with_context(|| format!("'{s}': expected KIB:WAYS, e.g. 512:8"))?;
    Ok(Geometry::kib(
        kib.parse().with_context(|| format!("'{s}': bad KiB"))?,
        ways.parse().with_context(|| format!("'{s}': bad ways"))?,
        line,
    ))
}

/// Cache geometry and cycle model (shared by `replay` and `discover`).
#[derive(clap::Args, Clone)]
pub struct ModelArgs {
    /// Cache line size in bytes (all levels).
    #[arg(long, default_value_t = 64)]
    pub line: u32,
    /// Per-core L1i as KIB:WAYS.
    #[arg(long, default_value = "32:8")]
    pub l1i: String,
    /// Per-core L1d as KIB:WAYS.
    #[arg(long, default_value = "32:8")]
    pub l1d: String,
    /// Per-core private L2 as KIB:WAYS.
    #[arg(long, default_value = "512:8")]
    pub l2: String,
    /// Shared L3 as KIB:WAYS, or `none`.
    #[arg(long, default_value = "none")]
    pub l3: String,
    /// Cycles per instruction with all-L1 hits.
    #[arg(long, default_value_t = 0.5)]
    pub base_cpi: f64,
    /// Penalty of an L2 hit, cycles.
    #[arg(long, default_value_t = 14.0)]
    pub l2_cycles: f64,
    /// Penalty of an L2 miss served by L3 (or of any L2 miss without --l3), cycles.
    #[arg(long, default_value_t = 50.0)]
    pub l3_cycles: f64,
    /// Penalty of an L3 miss, cycles.
    #[arg(long, default_value_t = 200.0)]
    pub mem_cycles: f64,
    /// Factor on data-miss penalties.
    #[arg(long, default_value_t = 1.0)]
    pub data_penalty_scale: f64,
    /// Penalty of a data line last written on another core (a cross-core
    /// transfer, instead of the L3 hit), cycles; 0 = no transfer model.
    #[arg(long, default_value_t = 0.0)]
    pub transfer_cycles: f64,
}

impl ModelArgs {
    pub fn hierarchy(&self) -> anyhow::Result<Hierarchy> {
        let h = Hierarchy {
            l1i: geometry(&self.l1i, self.line).context("--l1i")?,
            l1d: geometry(&self.l1d, self.line).context("--l1d")?,
            l2: geometry(&self.l2, self.line).context("--l2")?,
            l3: if self.l3 == "none" {
                None
            } else {
                Some(geometry(&self.l3, self.line).context("--l3")?)
            },
        };
        h.validate()?;
        Ok(h)
    }

    pub fn cycle_model(&self) -> CycleModel {
        CycleModel {
            base_cpi: self.base_cpi,
            l2_hit: self.l2_cycles,
            l3_hit: self.l3_cycles,
            memory: self.mem_cycles,
            data_penalty_scale: self.data_penalty_scale,
            transfer: self.transfer_cycles,
        }
    }
}
