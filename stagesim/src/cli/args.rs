//! The options of the `replay`, `discover`, `synth` and `plot` subcommands.

use std::path::PathBuf;

use stagesim::synth::SynthConfig;

use super::{list, ModelArgs};

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Trace file (zstd stagetrace v1); its sidecar `<trace>.stages.toml` names the stages.
    #[arg(long)]
    pub trace: PathBuf,
    /// Stage sidecar to use instead of `<trace>.stages.toml`.
    #[arg(long)]
    pub sidecar: Option<PathBuf>,
    /// Simulated core counts (1..=64), comma-separated.
    #[arg(long, default_value = "2,4,8,16", value_parser = list::<usize>)]
    pub cores: std::vec::Vec<usize>,
    /// Scheduling models: baseline, captured (the traced schedule, on 1 core, once), pinned,
    /// static, proportional, auto.
    #[arg(
        long,
        default_value = "baseline,captured,pinned,static,proportional,auto"
    )]
    pub policy: String,
    /// Time slices in instructions, comma-separated.
    #[arg(long, default_value = "10000,100000,1000000", value_parser = list::<u64>)]
    pub slice: std::vec::Vec<u64>,
    /// Warm-up prefix excluded from statistics, % of the trace's instructions (replay order).
    #[arg(long, default_value_t = 10.0)]
    pub warmup_pct: f64,
    /// Policy period in instructions per core (static, proportional).
    #[arg(long, default_value_t = 1_000_000)]
    pub period: u64,
    /// Replay only this many instructions (a prefix in replay order; the warm-up is --warmup-pct of it).
    #[arg(long)]
    pub instrs: Option<u64>,
    /// CPU one thread migration costs its source core, cycles; a comma-separated list sweeps it
    /// (staged policies only). Default 500: half of the 0.41 µs (at 2.5 GHz) both vCPUs spend per
    /// migration when busy, `just bench-migration --rounds 5` saturated mode at W = 0
    /// (bench/RESULTS.md, migration microbenchmark). Before issue 25 the whole latency (1700,
    /// 4250) was charged here, with the next two at 0.
    #[arg(long, default_value = "500", value_parser = list::<u64>)]
    pub migration_cycles: std::vec::Vec<u64>,
    /// CPU a migration costs the core the thread arrives on, cycles, charged when it first runs
    /// the thread. Default 500: the other half of the saturated figure above; 0 = source only.
    #[arg(long, default_value_t = 500)]
    pub migration_target_cycles: u64,
    /// Latency of a migration, cycles: the thread is runnable on its target only this long after
    /// it left its source, while the cores run other threads (no CPU). Default 1700: 677 ns, the
    /// mean `just bench-migration` latency to an idle spinning vCPU at 2.5 GHz; 0: at once.
    #[arg(long, default_value_t = 1700)]
    pub migration_latency: u64,
    /// Merge stages into coarser groups for the staged policies, e.g.
    /// `front=net_read,dispatch,parse;plan=open_lock,optimize;exec=execute,innodb;finish=commit,send`;
    /// `-` = the trace's own stages. Repeatable: each grouping is replayed. Unlisted stages stay alone.
    #[arg(long = "stage-groups", default_value = "-")]
    pub stage_groups: Vec<String>,
    /// Replay the trace re-marked by this stage-map file (`discover --binary --map-out`): a thread
    /// enters a stage where it enters one of its functions; the request-marker stage (--block-at)
    /// joins the file's request stage. Needs --binary; excludes --stage-groups.
    #[arg(long)]
    pub stage_map: Option<PathBuf>,
    /// The traced ELF binary whose symbols --stage-map names.
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Load bias of --binary in the trace (0xHEX); default: the sidecar's `[capture] text_bias`, else 0.
    #[arg(long)]
    pub text_bias: Option<String>,
    /// Model variant, not host-sched: migrate only for stage visits expected to last at least this
    /// many instructions (comma-separated list; 0 = off, host-sched's behaviour).
    #[arg(long, default_value = "0", value_parser = list::<u64>)]
    pub min_visit: std::vec::Vec<u64>,
    /// How --min-visit knows a visit's length: `oracle` (read ahead in the trace; an upper bound)
    /// or `history` (the stage's mean past visit, online).
    #[arg(long, default_value = "oracle")]
    pub visit_rule: String,
    /// host-sched stage budgets (its TOML; `[[stage]]` entries matched by name; other sections ignored).
    #[arg(long)]
    pub budgets: Option<PathBuf>,
    /// Scheduling-model option for the staged policies and `pinned`: idle cores take queued
    /// threads whose current stage they serve (`off`, `on`, or `off,on` for both).
    #[arg(long, default_value = "off")]
    pub steal: String,
    /// Temporal staging (issue 40): each core orders its threads' visits with the guest agent's
    /// visit policy, threads yielding at every stage switch: `fifo` (none), `cohort`, `srpt`,
    /// `dbr`, `mg1`, `color`; comma-separated to replay each. With pinned: the temporal mode;
    /// with static/proportional: both; with auto: its temporal modes (then trialled too).
    #[arg(long, default_value = "fifo")]
    pub visit: String,
    /// With `--policy auto`: a null experiment (`just bench-auto` O2). Its only candidate is
    /// `temporal`, which runs unstaged's plan and visit order under that name: every duel is
    /// between two identical modes.
    #[arg(long)]
    pub auto_twin: bool,
    /// CPU a yield at a stage switch costs its core under a temporal visit policy, cycles;
    /// comma-separated to sweep. Default 163: the test unikernel's local switch, 65 ns at
    /// 2.5 GHz (`just bench-migration` saturated mode, bench/RESULTS.md).
    #[arg(long, default_value = "163", value_parser = list::<u64>)]
    pub switch_cycles: std::vec::Vec<u64>,
    /// Weights of the `static` policy: `equal` (host-sched's default without budgets) or `load`
    /// (each stage group's share of the trace's instructions, a profile); comma-separated to run both.
    #[arg(long, default_value = "equal")]
    pub static_weights: String,
    /// EWMA weight of the newest load sample (proportional).
    #[arg(long, default_value_t = 0.7)]
    pub smoothing: f64,
    /// Hysteresis in cores (proportional).
    #[arg(long, default_value_t = 0.1)]
    pub hysteresis: f64,
    /// OS-like scheduling: every slice is drawn from `slice × [1 − J, 1 + J]`
    /// (0 = fixed slices, in which identical threads stay in lockstep).
    #[arg(long, default_value_t = 0.5)]
    pub slice_jitter: f64,
    /// Threads block for their client when they enter this stage (the request
    /// marker; MariaDB's `net_read`) and run again after a think time; `-` = never.
    /// A trace without the stage never blocks (a note says so).
    #[arg(long, default_value = "net_read")]
    pub block_at: String,
    /// Mean think time of a blocked thread, cycles (each drawn from an exponential
    /// distribution); 100000 ≈ 40 µs at 2.5 GHz, an assumed loopback round trip of a
    /// sysbench client.
    #[arg(long, default_value_t = 100_000)]
    pub think_cycles: u64,
    /// Seed of the slice jitter and think times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replay every thread's stream N times in a row: a longer run of the same transactions
    /// (auto's trials take a fixed number of policy periods, which one short window cannot
    /// amortize). Not for `captured`, which is replayed once.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Write the full report (per core, per stage) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Print per-core and per-stage breakdowns.
    #[arg(long)]
    pub detail: bool,
    /// Replays to run in parallel (each replay is single-threaded).
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
}

#[derive(clap::Args)]
pub struct DiscoverArgs {
    /// Trace file (zstd stagetrace v1).
    #[arg(long)]
    pub trace: PathBuf,
    /// Stage sidecar to use instead of `<trace>.stages.toml`.
    #[arg(long)]
    pub sidecar: Option<PathBuf>,
    /// Simulated cores.
    #[arg(long, default_value_t = 4)]
    pub cores: usize,
    /// Time slice in instructions.
    #[arg(long, default_value_t = 100_000)]
    pub slice: u64,
    /// Staged policy the candidates are replayed under (static or proportional; `pinned` with a
    /// temporal --visit: scored by the temporal replay, issue 40).
    #[arg(long, default_value = "static")]
    pub policy: String,
    /// Visit policy of the candidates' replays (see `replay --visit`): with `--policy pinned`
    /// a candidate map is scored by temporal staging (idle cores steal), with static by both.
    #[arg(long, default_value = "fifo")]
    pub visit: String,
    /// CPU a yield at a stage switch costs under a temporal --visit, cycles (see `replay`).
    #[arg(long, default_value_t = stagesim::sim::LOCAL_SWITCH_CYCLES)]
    pub switch_cycles: u64,
    /// CPU one migration costs the source core, cycles (default: as `replay`'s, measured).
    #[arg(long, default_value_t = 500)]
    pub migration_cycles: u64,
    /// CPU a migration costs the target core, cycles (see `replay --migration-target-cycles`).
    #[arg(long, default_value_t = 500)]
    pub migration_target_cycles: u64,
    /// Latency of a migration, cycles (see `replay --migration-latency`).
    #[arg(long, default_value_t = 1700)]
    pub migration_latency: u64,
    /// Request-level discovery (seed 004): migration points among the function entries of this
    /// ELF binary (the traced one; its .symtab/.dynsym) instead of merging the trace's stages.
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Load bias of --binary in the trace (0xHEX); default: the sidecar's `[capture] text_bias`, else 0.
    #[arg(long)]
    pub text_bias: Option<String>,
    /// Request marker for --binary: a request starts where a thread enters this trace stage.
    #[arg(long, default_value = "net_read")]
    pub block_at: String,
    /// --binary: a candidate is called in at least this share of requests, % (seed 004: 80).
    #[arg(long, default_value_t = 80.0)]
    pub min_present_pct: f64,
    /// --binary: ... and more than once in at most this share of them, % (seed 004: 0).
    #[arg(long, default_value_t = 0.0)]
    pub max_repeat_pct: f64,
    /// --binary: candidates kept after screening; every choice of N among them is replayed.
    #[arg(long, default_value_t = 8)]
    pub keep: usize,
    /// --binary: least share of a request every stage holds, % (by the points' mean positions).
    #[arg(long, default_value_t = 10.0)]
    pub min_stage_pct: f64,
    /// --binary: part of every thread's stream the screening replays, %.
    #[arg(long, default_value_t = 5.0)]
    pub screen_pct: f64,
    /// --binary: find the best choice for N = 2..=this stages.
    #[arg(long, default_value_t = 4)]
    pub max_parts: usize,
    /// --binary: write the stage-map file of each N to PREFIX-N.stagemap.
    #[arg(long)]
    pub map_out: Option<PathBuf>,
    /// Part of every thread's stream each candidate replays, % (the same instructions for every candidate).
    #[arg(long, default_value_t = 20.0)]
    pub prefix_pct: f64,
    /// Warm-up excluded, % of the prefix.
    #[arg(long, default_value_t = 10.0)]
    pub warmup_pct: f64,
    /// Policy period in instructions per core.
    #[arg(long, default_value_t = 1_000_000)]
    pub period: u64,
    /// Score to minimise: cpi (busy cycles per instruction), l2 (L2 misses, seed 004), tput
    /// (negated throughput: wall cycles, idle cores included). Default: cpi when merging stages,
    /// tput with --binary (a choice of points also decides how well the cores are balanced).
    #[arg(long)]
    pub objective: Option<String>,
    /// Stop merging at this many groups.
    #[arg(long, default_value_t = 1)]
    pub min_groups: usize,
    /// Idle cores take queued threads whose stage they serve (see `replay --steal`).
    #[arg(long)]
    pub steal: bool,
    /// Weights of `static` for each candidate: `load` (the groups' instruction shares) or `equal`.
    #[arg(long, default_value = "load")]
    pub static_weights: String,
    /// Write `K<TAB>SPEC` per group count (usable as --stage-groups).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the steps (with each chosen replay) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
}

#[derive(clap::Args)]
pub struct SynthArgs {
    /// Output trace file.
    #[arg(long)]
    pub out: PathBuf,
    /// Threads (connections).
    #[arg(long, default_value_t = SynthConfig::default().threads)]
    pub threads: u32,
    /// Stages per request.
    #[arg(long, default_value_t = SynthConfig::default().stages)]
    pub stages: u16,
    /// Code per stage, KiB.
    #[arg(long, default_value_t = SynthConfig::default().stage_kib)]
    pub stage_kib: u64,
    /// Code outside stages, KiB.
    #[arg(long, default_value_t = SynthConfig::default().common_kib)]
    pub common_kib: u64,
    /// Requests per thread.
    #[arg(long, default_value_t = SynthConfig::default().requests)]
    pub requests: u32,
    /// Instructions per stage visit (±25 %).
    #[arg(long, default_value_t = SynthConfig::default().visit_instrs)]
    pub visit_instrs: u64,
    /// Per-stage factors on --visit-instrs, comma-separated (e.g. 3,1: the first stage carries 3× the load).
    #[arg(long, value_parser = list::<f64>)]
    pub visit_weights: Option<std::vec::Vec<f64>>,
    /// Shared heap, KiB.
    #[arg(long, default_value_t = SynthConfig::default().heap_kib)]
    pub heap_kib: u64,
    /// Per-thread stack, KiB.
    #[arg(long, default_value_t = SynthConfig::default().stack_kib)]
    pub stack_kib: u64,
    /// Probability of a data access per basic block.
    #[arg(long, default_value_t = SynthConfig::default().data_per_block)]
    pub data_per_block: f64,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(clap::Args)]
pub struct PlotArgs {
    /// JSON written by `replay --json`.
    #[arg(long)]
    pub json: PathBuf,
    /// Output directory.
    #[arg(long)]
    pub out_dir: PathBuf,
    /// File name prefix (default: the JSON file's stem).
    #[arg(long)]
    pub prefix: Option<String>,
    /// The JSON is a migration-cost sweep: plot relative throughput against the cost.
    #[arg(long)]
    pub sweep: bool,
}
