//! Counters, the cycle model and the results of a replay: [`Counters`] per
//! (core, stage), [`Metrics`] derived from them with a [`CycleModel`], and
//! [`SimResult`], one replay's output (also read back from the JSON report).

use serde::{Deserialize, Serialize};

/// Cycle costs. The defaults are assumptions for an AMD Zen 3 (family 19h)
/// core at ~2.5 GHz, in line with commonly quoted load-to-use latencies (L2
/// ≈ 12–14 cycles, L3 ≈ 46–50 cycles, DRAM ≈ 80 ns); they were not checked
/// against a source available here — see `stagesim/README.md`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CycleModel {
    /// Cycles per instruction when every access hits L1 (default 0.5, i.e.
    /// IPC 2 — an assumption for server code on a 4-wide core).
    pub base_cpi: f64,
    /// Penalty of an L1 miss served by L2, cycles (default 14).
    pub l2_hit: f64,
    /// Penalty of an L2 miss served by L3 (or any L2 miss when no L3 is
    /// simulated), cycles (default 50).
    pub l3_hit: f64,
    /// Penalty of an L3 miss served by memory, cycles (default 200 ≈ 80 ns
    /// at 2.5 GHz).
    pub memory: f64,
    /// Factor on data-miss penalties (default 1.0; below 1 models
    /// out-of-order overlap of data misses, which instruction misses lack).
    pub data_penalty_scale: f64,
    /// Penalty of a data access that misses this core's L1d and L2 while
    /// the line was last written on another core (a cross-core transfer,
    /// charged instead of `l3_hit`), cycles. 0 (the default) turns the
    /// transfer model off: such lines cost like any L2 miss and a write does
    /// not invalidate other cores' copies (`sim/coherence.rs`). Issue 25
    /// uses 150 (60 ns at 2.5 GHz: the 60–100 ns per cross-core transfer
    /// that bench/RESULTS.md's saturated migration analysis assumes for this
    /// Xeon, at its low end).
    #[serde(default)]
    pub transfer: f64,
}

impl Default for CycleModel {
    fn default() -> Self {
        Self {
            base_cpi: 0.5,
            l2_hit: 14.0,
            l3_hit: 50.0,
            memory: 200.0,
            data_penalty_scale: 1.0,
            transfer: 0.0,
        }
    }
}

impl CycleModel {
    /// Cycles of `c` (busy time, migrations included).
    pub fn cycles(&self, c: &Counters) -> f64 {
        let pen = |l1: u64, l2: u64, l3: u64| {
            (l1 - l2) as f64 * self.l2_hit
                + (l2 - l3) as f64 * self.l3_hit
                + l3 as f64 * self.memory
        };
        c.instrs as f64 * self.base_cpi
            + pen(c.l1i_misses, c.l2i_misses, c.l3i_misses)
            + self.data_penalty_scale
                * (pen(c.l1d_misses, c.l2d_misses, c.l3d_misses)
                    + c.xfer_lines as f64 * (self.transfer - self.l3_hit))
            + c.migration_cycles as f64
            + c.switch_cycles as f64
    }
}

/// Raw event counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Instructions executed.
    pub instrs: u64,
    /// Instruction-fetch line accesses (each 64 B line a basic block touches).
    pub fetch_lines: u64,
    /// Fetch line accesses that missed L1i.
    pub l1i_misses: u64,
    /// Fetch line accesses that missed L1i and L2.
    pub l2i_misses: u64,
    /// Fetch line accesses that missed every level including the shared L3 (0 without L3).
    pub l3i_misses: u64,
    /// Data line accesses (loads and stores).
    pub data_lines: u64,
    /// Data accesses that missed L1d.
    pub l1d_misses: u64,
    /// Data accesses that missed L1d and L2.
    pub l2d_misses: u64,
    /// Data accesses that missed every level including L3 (0 without L3).
    pub l3d_misses: u64,
    /// Data accesses that missed L1d and L2 and found the line last written
    /// on another core (counted only with [`CycleModel::transfer`] > 0).
    #[serde(default)]
    pub xfer_lines: u64,
    /// Thread migrations (see the module docs for attribution).
    pub migrations: u64,
    /// Cycles spent migrating.
    pub migration_cycles: u64,
    /// Stage changes onto a stage the core does not serve where the
    /// min-visit rule ([`VisitRule`](super::VisitRule)) kept the thread on its core.
    pub kept: u64,
    /// Queued threads an idle core took from another core's queue
    /// ([`SimConfig::steal`](super::SimConfig::steal)); counted on the taking core, under the
    /// thread's stage, and charged `migration_cycles` there.
    pub steals: u64,
    /// Yields at a stage switch under a temporal visit policy
    /// ([`SimConfig::visit`](super::SimConfig::visit)), counted on the core under the stage
    /// entered.
    #[serde(default)]
    pub switches: u64,
    /// Cycles those yields cost ([`SimConfig::switch_cycles`](super::SimConfig::switch_cycles) each).
    #[serde(default)]
    pub switch_cycles: u64,
}

impl Counters {
    pub(super) fn add(&mut self, o: &Counters) {
        self.instrs += o.instrs;
        self.fetch_lines += o.fetch_lines;
        self.l1i_misses += o.l1i_misses;
        self.l2i_misses += o.l2i_misses;
        self.l3i_misses += o.l3i_misses;
        self.data_lines += o.data_lines;
        self.l1d_misses += o.l1d_misses;
        self.l2d_misses += o.l2d_misses;
        self.l3d_misses += o.l3d_misses;
        self.xfer_lines += o.xfer_lines;
        self.migrations += o.migrations;
        self.migration_cycles += o.migration_cycles;
        self.kept += o.kept;
        self.steals += o.steals;
        self.switches += o.switches;
        self.switch_cycles += o.switch_cycles;
    }
}

/// Counters with derived rates.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Metrics {
    /// The raw counts.
    pub counters: Counters,
    /// Busy cycles from the cycle model.
    pub cycles: f64,
    /// L1i misses per 1000 instructions.
    pub l1i_mpki: f64,
    /// L2 instruction misses per 1000 instructions.
    pub l2i_mpki: f64,
    /// L3 instruction misses per 1000 instructions (0 without L3).
    pub l3i_mpki: f64,
    /// L1d misses per 1000 instructions.
    pub l1d_mpki: f64,
    /// L2 data misses per 1000 instructions.
    pub l2d_mpki: f64,
    /// Cross-core line transfers per 1000 instructions (0 unless
    /// [`CycleModel::transfer`] > 0).
    #[serde(default)]
    pub xfer_pki: f64,
    /// Migrations per 1000 instructions.
    pub migrations_pki: f64,
    /// Instructions per busy cycle.
    pub ipc: f64,
}

impl Metrics {
    /// Derives rates from `c` with `model`.
    pub fn new(c: Counters, model: &CycleModel) -> Self {
        let k = if c.instrs == 0 {
            0.0
        } else {
            1000.0 / c.instrs as f64
        };
        let cycles = model.cycles(&c);
        Self {
            counters: c,
            cycles,
            l1i_mpki: c.l1i_misses as f64 * k,
            l2i_mpki: c.l2i_misses as f64 * k,
            l3i_mpki: c.l3i_misses as f64 * k,
            l1d_mpki: c.l1d_misses as f64 * k,
            l2d_mpki: c.l2d_misses as f64 * k,
            xfer_pki: c.xfer_lines as f64 * k,
            migrations_pki: c.migrations as f64 * k,
            ipc: if cycles > 0.0 {
                c.instrs as f64 / cycles
            } else {
                0.0
            },
        }
    }
}

/// Statistics of one stage (or of "no stage").
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StageResult {
    /// Stage name (`(none)` for code outside any stage).
    pub name: String,
    /// Over all cores.
    pub metrics: Metrics,
}

/// One replay's results (measured window only).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SimResult {
    /// Model name.
    pub policy: String,
    /// Model label ([`SimConfig::label`](super::SimConfig::label)): the name plus any variant.
    pub label: String,
    /// Stage grouping label ([`StageGroups::label`](crate::groups::StageGroups::label)).
    pub groups: String,
    /// Stage grouping, every group written out ([`StageGroups::full_spec`](crate::groups::StageGroups::full_spec)).
    pub group_spec: String,
    /// Migration cost, cycles.
    pub migration_cycles: u64,
    /// Min-visit variant threshold (0: off).
    pub min_visit: u64,
    /// The visit policy the cores followed (`fifo`: no temporal staging;
    /// `auto`: the policy of its temporal modes).
    #[serde(default = "fifo")]
    pub visit: String,
    /// Cost of a yield at a stage switch, cycles (temporal staging).
    #[serde(default)]
    pub switch_cycles: u64,
    /// Idle cores stole queued threads.
    #[serde(default)]
    pub steal: bool,
    /// `auto`'s name for the mode ([`super::visit_mode`]): unstaged,
    /// temporal, spatial, both; else the model's name.
    #[serde(default)]
    pub mode: String,
    /// Simulated cores.
    pub cores: usize,
    /// Time slice, instructions.
    pub slice: u64,
    /// Slice jitter (slices drawn from `slice × [1 − j, 1 + j]`; 0 = fixed).
    #[serde(default)]
    pub slice_jitter: f64,
    /// Mean think time of a blocking thread (cycles; 0 = threads never block).
    #[serde(default)]
    pub think_cycles: u64,
    /// Times threads blocked for their client.
    #[serde(default)]
    pub blocks: u64,
    /// Laps over every thread's stream ([`super::SimConfig::repeat`]).
    #[serde(default = "one")]
    pub repeat: u32,
    /// Threads in the trace.
    pub threads: usize,
    /// Instructions replayed before statistics started.
    pub warmup_instrs: u64,
    /// All cores, all stages.
    pub total: Metrics,
    /// Per core.
    pub per_core: Vec<Metrics>,
    /// Per stage, trace order, then `(none)`.
    pub per_stage: Vec<StageResult>,
    /// Wall cycles of the measured window (mean over cores).
    pub window_cycles: f64,
    /// Busy cycles / sum of the cores' windows.
    pub utilization: f64,
    /// Machine throughput: measured instructions per wall cycle, all cores.
    pub throughput_ipc: f64,
    /// Policy periods evaluated.
    pub periods: u64,
    /// Periods whose plan differed from the previous one.
    pub plan_changes: u64,
    /// Cores per stage in the last plan (host-sched `Plan::requirement`;
    /// 0 = served by the victim core); empty for baseline and pinned.
    pub final_requirement: Vec<usize>,
    /// Cores per stage (group) after each plan change: (instructions
    /// replayed so far, warm-up included; `Plan::requirement`). The first
    /// entry is the initial plan. Empty for baseline and pinned.
    pub plan_history: Vec<(u64, Vec<usize>)>,
    /// `auto` only: its trial steps and decisions (instructions replayed,
    /// `mode: what`, with the modelled rates it compared).
    #[serde(default)]
    pub auto_decisions: Vec<(u64, String)>,
    /// `auto`: policy periods, those in trials, those its trials spent
    /// in the modes they did not keep, and those periods priced by what
    /// their modes lost against the kept one (the trials' cost, in periods
    /// of the kept mode).
    #[serde(default)]
    pub auto_cost: Option<(u64, u64, u64, f64)>,
    /// Wall-clock seconds of the replay.
    pub replay_seconds: f64,
    /// Replay speed, million instructions per second (single thread).
    pub replay_mips: f64,
}

/// The default of [`SimResult::visit`] in older JSON files.
fn fifo() -> String {
    "fifo".to_string()
}

/// The default of [`SimResult::repeat`] in older JSON files.
fn one() -> u32 {
    1
}
