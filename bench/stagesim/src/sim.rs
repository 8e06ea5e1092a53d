//! Replay of a [`Trace`] on N simulated cores under a scheduling model.
//!
//! ## Scheduling model
//! Every simulated core has a clock in cycles, at most one *current* thread
//! and (except in `baseline`) its own run queue; a queued thread carries the
//! time it arrived (the clock of the core that queued it). The replay is a
//! discrete-event simulation at chunk granularity: it always advances the
//! core whose next chunk starts earliest — a core with a current thread at
//! its clock, an idle core at max(its clock, the earliest arrival among the
//! threads it may take) — and an idle core takes the earliest-arrived thread.
//! Threads are queued only at chunk ends, never before the chunk's start, so
//! no thread can later arrive anywhere before the chosen start. The core runs
//! its thread for up to one time slice of `slice` instructions, then, if
//! another thread has arrived and waits, queues the thread and switches; a
//! thread alone on its core keeps running. Context switches cost nothing
//! beyond the cache effects. (Stage groups, the min-visit variant and idle
//! stealing: [`SimConfig::groups`], [`VisitRule`], [`SimConfig::steal`].)
//!
//! * `baseline` — the OS model without stage affinity: one global FIFO run
//!   queue shared by all cores; a thread whose slice ended goes to the tail
//!   and the next core to become free takes the head, so threads drift over
//!   the cores (when no thread waits, a thread keeps its core).
//! * `pinned` — thread *i* (in order of first appearance in the trace) stays
//!   on core *i* mod N; each core round-robins its threads.
//! * `static`, `proportional` — the real `host-sched` policies
//!   ([`host_sched::policy::build`]): simulated core *k* is vCPU *k* (one vCPU
//!   per core, `Context.cores = 0..N`). Threads start as in `pinned`. Every
//!   policy period (`period` instructions per core, i.e. `period × N`
//!   instructions over all cores) the policy gets per-stage load — the
//!   instructions executed in the stage during the period divided by
//!   `period`, i.e. the cores' worth of work, as the VMM passes vCPUs' worth
//!   of time — and returns a [`host_sched::policy::Plan`]; its `stage_vcpus`
//!   masks say which cores serve each stage. At every STAGE marker whose
//!   stage the current core does not serve, the thread migrates (as the guest
//!   agent does) to the least-loaded core serving the stage (fewest threads
//!   queued or running; ties: lowest index): the source core pays
//!   `migration_cycles` and the thread may run on the target from then on.
//!   Threads outside any stage (`0xFFFF`, or before their first marker) stay
//!   where they are.
//!
//! ## Statistics
//! The first `warmup_pct` % of the trace's instructions, counted in replay
//! order over all cores, warm the caches and are excluded: every counter is
//! reset when the replay passes that point (to within one basic block).
//! Misses are counted per (core, stage). A migration is counted on the
//! source core under the stage the thread migrates *to*.
//!
//! ## Cycle model ([`CycleModel`])
//! cycles = instructions × `base_cpi` + Σ over instruction-fetch and data
//! line accesses of the penalty of the level that served them (L1 hit: 0;
//! L2 hit: `l2_hit`; L2 miss: `l3_hit` — when no L3 is simulated the real
//! machine's 32 MiB shared L3 is assumed to hold the line —; L3 miss:
//! `memory`) with data penalties scaled by `data_penalty_scale`, plus
//! `migration_cycles` per migration. Each core's clock advances by the cycles
//! of what it runs and waits (idle) when it has no work. Reported: per-core
//! IPC = instructions / busy cycles, and machine throughput = instructions /
//! (wall cycles of the measured window). Each core's window runs from its
//! own clock when the warm-up ended to the moment the last core finishes;
//! the machine window is the mean over cores. Idle time (load imbalance,
//! the tail of the run) lowers throughput; utilization = busy cycles / sum
//! of the cores' windows.

use std::collections::VecDeque;

use host_sched::config::Budget;
use host_sched::policy::{self, PolicyKind};
use serde::Serialize;

use crate::cache::{Cache, CoreCaches, Hierarchy, Level};
use crate::groups::StageGroups;
use crate::stream::{ev_instrs, Trace, EV_DATA, EV_FETCH, EV_STAGE};

/// Which scheduling model a replay uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SimPolicy {
    /// Global round-robin run queue, no affinity (the OS model).
    Baseline,
    /// Thread i stays on core i mod N.
    Pinned,
    /// host-sched `static`.
    Static,
    /// host-sched `proportional`.
    Proportional,
}

impl SimPolicy {
    /// Every model, in table order.
    pub const ALL: [SimPolicy; 4] = [
        Self::Baseline,
        Self::Pinned,
        Self::Static,
        Self::Proportional,
    ];

    /// Parses `baseline`, `pinned`, `static` or `proportional`.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "baseline" => Self::Baseline,
            "pinned" => Self::Pinned,
            "static" => Self::Static,
            "proportional" => Self::Proportional,
            _ => return None,
        })
    }

    /// The model's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::Pinned => "pinned",
            Self::Static => "static",
            Self::Proportional => "proportional",
        }
    }

    /// The host-sched policy behind a staged model.
    pub fn host_sched_kind(self) -> Option<PolicyKind> {
        match self {
            Self::Static => Some(PolicyKind::Static),
            Self::Proportional => Some(PolicyKind::Proportional),
            _ => None,
        }
    }
}

/// A **model variant** of the staged policies, separate from host-sched:
/// at a stage change onto a stage the current core does not serve, migrate
/// only if the thread is expected to stay in the new stage (group) for at
/// least `min_visit` instructions; otherwise it runs that visit where it is
/// (counted as `kept`). host-sched's policies and the guest agent have no
/// such rule: they migrate at every such stage change (`min_visit = 0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VisitRule {
    /// The visit's true length, read ahead in the trace: an upper bound for
    /// any such rule, not implementable online.
    Oracle,
    /// An online prediction: the mean length of the stage's previous visits
    /// over all threads (exponentially weighted, newest visit 1/4); a stage
    /// not yet visited is predicted long.
    History,
}

impl VisitRule {
    /// Parses `oracle` or `history`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "oracle" => Some(Self::Oracle),
            "history" => Some(Self::History),
            _ => None,
        }
    }

    /// The rule's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Oracle => "oracle",
            Self::History => "history",
        }
    }
}

/// Weight of the newest visit in [`VisitRule::History`]'s average.
pub const HISTORY_WEIGHT: f64 = 0.25;

/// Cycle costs. The defaults are assumptions for an AMD Zen 3 (family 19h)
/// core at ~2.5 GHz, in line with commonly quoted load-to-use latencies (L2
/// ≈ 12–14 cycles, L3 ≈ 46–50 cycles, DRAM ≈ 80 ns); they were not checked
/// against a source available here — see `bench/stagesim/README.md`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
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
}

impl Default for CycleModel {
    fn default() -> Self {
        Self {
            base_cpi: 0.5,
            l2_hit: 14.0,
            l3_hit: 50.0,
            memory: 200.0,
            data_penalty_scale: 1.0,
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
            + self.data_penalty_scale * pen(c.l1d_misses, c.l2d_misses, c.l3d_misses)
            + c.migration_cycles as f64
    }
}

/// Raw event counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
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
    /// Thread migrations (see the module docs for attribution).
    pub migrations: u64,
    /// Cycles spent migrating.
    pub migration_cycles: u64,
    /// Stage changes onto a stage the core does not serve where the
    /// min-visit rule ([`VisitRule`]) kept the thread on its core.
    pub kept: u64,
    /// Queued threads an idle core took from another core's queue
    /// ([`SimConfig::steal`]); counted on the taking core, under the
    /// thread's stage, and charged `migration_cycles` there.
    pub steals: u64,
}

impl Counters {
    fn add(&mut self, o: &Counters) {
        self.instrs += o.instrs;
        self.fetch_lines += o.fetch_lines;
        self.l1i_misses += o.l1i_misses;
        self.l2i_misses += o.l2i_misses;
        self.l3i_misses += o.l3i_misses;
        self.data_lines += o.data_lines;
        self.l1d_misses += o.l1d_misses;
        self.l2d_misses += o.l2d_misses;
        self.l3d_misses += o.l3d_misses;
        self.migrations += o.migrations;
        self.migration_cycles += o.migration_cycles;
        self.kept += o.kept;
        self.steals += o.steals;
    }
}

/// Counters with derived rates.
#[derive(Clone, Debug, Default, Serialize)]
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
            migrations_pki: c.migrations as f64 * k,
            ipc: if cycles > 0.0 {
                c.instrs as f64 / cycles
            } else {
                0.0
            },
        }
    }
}

/// One replay's parameters.
#[derive(Clone, Debug, Serialize)]
pub struct SimConfig {
    /// Scheduling model.
    pub policy: SimPolicy,
    /// Simulated cores, 1..=64.
    pub cores: usize,
    /// Time slice in instructions (≥ 1).
    pub slice: u64,
    /// Warm-up prefix excluded from statistics, % of the trace's instructions.
    pub warmup_pct: f64,
    /// Policy period in instructions per core (staged policies).
    pub period: u64,
    /// Cost of one thread migration in cycles (default 4000 ≈ 1.6 µs at
    /// 2.5 GHz: about the 1700 ns bare-metal IPI propagation seed 000 cites
    /// as the lower bound of IPI-based migration).
    pub migration_cycles: u64,
    /// Cache geometry.
    pub caches: Hierarchy,
    /// Cycle model.
    pub model: CycleModel,
    /// EWMA weight of the newest load sample (proportional; host-sched default 0.7).
    pub smoothing: f64,
    /// Hysteresis in cores (proportional; host-sched default 0.1).
    pub hysteresis: f64,
    /// Per stage group (dense order), its budget; `None`: min 0, max N, weight 1.
    #[serde(skip)]
    pub budgets: Option<Vec<Budget>>,
    /// Stage grouping (`None`: the trace's own stages); see [`crate::groups`].
    #[serde(skip)]
    pub groups: Option<StageGroups>,
    /// Min-visit model variant (staged policies): migrate only for visits
    /// expected to last at least this many instructions; 0 = off (host-sched).
    pub min_visit: u64,
    /// How the visit length is known for `min_visit`.
    pub visit_rule: VisitRule,
    /// Replay only the first fraction (0..=1) of every thread's events:
    /// the same instructions whatever the scheduling (`stagesim discover`
    /// compares candidates on them); `None`: whole streams.
    pub thread_prefix: Option<f64>,
    /// Whether `budgets` carry weights proportional to the groups' measured
    /// instruction shares (a profile; `static` then allocates cores by load
    /// once). Only labels the result: the caller sets `budgets`.
    pub load_weights: bool,
    /// Scheduling-model option for the staged policies (not host-sched
    /// policy code): an idle core takes a queued thread from another core's
    /// queue if it serves that thread's current stage (the earliest-arrived
    /// such thread), as Linux's idle balancing does within a
    /// thread's affinity mask (libstage sets the mask to the stage's vCPUs).
    /// Without it, threads move only at stage changes (the test guest's
    /// queue hand-off), and a stage's cores can stay unevenly loaded.
    pub steal: bool,
    /// Replay only the first `limit` instructions (in replay order, warm-up
    /// included; the warm-up is `warmup_pct` of them); `None`: the whole trace.
    pub limit: Option<u64>,
}

impl SimConfig {
    /// Defaults for `policy` on `cores` cores with `slice`.
    pub fn new(policy: SimPolicy, cores: usize, slice: u64) -> Self {
        Self {
            policy,
            cores,
            slice,
            warmup_pct: 10.0,
            period: 1_000_000,
            migration_cycles: 4000,
            caches: Hierarchy::default(),
            model: CycleModel::default(),
            smoothing: 0.7,
            hysteresis: 0.1,
            budgets: None,
            groups: None,
            min_visit: 0,
            visit_rule: VisitRule::Oracle,
            limit: None,
            thread_prefix: None,
            load_weights: false,
            steal: false,
        }
    }

    /// The model's label: the policy name, plus the min-visit variant when
    /// it is on (e.g. `static/min-visit 5000 oracle`).
    pub fn label(&self) -> String {
        let mut l = self.policy.name().to_string();
        if self.load_weights && self.policy == SimPolicy::Static {
            l.push_str("/load-weights");
        }
        if self.steal && self.policy.host_sched_kind().is_some() {
            l.push_str("/steal");
        }
        if self.min_visit > 0 && self.policy.host_sched_kind().is_some() {
            l.push_str(&format!(
                "/min-visit {} {}",
                self.min_visit,
                self.visit_rule.name()
            ));
        }
        l
    }
}

/// Statistics of one stage (or of "no stage").
#[derive(Clone, Debug, Serialize)]
pub struct StageResult {
    /// Stage name (`(none)` for code outside any stage).
    pub name: String,
    /// Over all cores.
    pub metrics: Metrics,
}

/// One replay's results (measured window only).
#[derive(Clone, Debug, Serialize)]
pub struct SimResult {
    /// Model name.
    pub policy: String,
    /// Model label ([`SimConfig::label`]): the name plus any variant.
    pub label: String,
    /// Stage grouping label ([`StageGroups::label`]).
    pub groups: String,
    /// Stage grouping, every group written out ([`StageGroups::full_spec`]).
    pub group_spec: String,
    /// Migration cost, cycles.
    pub migration_cycles: u64,
    /// Min-visit variant threshold (0: off).
    pub min_visit: u64,
    /// Simulated cores.
    pub cores: usize,
    /// Time slice, instructions.
    pub slice: u64,
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
    /// Wall-clock seconds of the replay.
    pub replay_seconds: f64,
    /// Replay speed, million instructions per second (single thread).
    pub replay_mips: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Instruction limit reached.
    Limit,
    /// The thread's stream ended.
    Done,
    /// A stage marker (dense index) was consumed.
    Stage(usize),
}

/// Runs `events[*pos..]` on one core until `limit` instructions have run, a
/// stage marker is consumed or the stream ends; counts into `c`.
#[inline(never)]
fn run_chunk(
    events: &[u64],
    pos: &mut usize,
    limit: u64,
    core: &mut CoreCaches,
    mut l3: Option<&mut Cache>,
    shift: u32,
    c: &mut Counters,
) -> Stop {
    let has_l3 = l3.is_some() as u64;
    let mut p = *pos;
    let mut stop = Stop::Done;
    while p < events.len() {
        if c.instrs >= limit {
            stop = Stop::Limit;
            break;
        }
        let ev = events[p];
        p += 1;
        let addr = (((ev << 16) as i64) >> 16) as u64;
        match ev >> 62 {
            EV_FETCH => {
                let instrs = (ev >> 48) & 0x3f;
                let bytes = (ev >> 54) & 0xff;
                c.instrs += instrs;
                let first = addr >> shift;
                let last = addr.wrapping_add(bytes.max(1) - 1) >> shift;
                let mut line = first;
                loop {
                    c.fetch_lines += 1;
                    match core.fetch_line(line, l3.as_deref_mut()) {
                        Level::L1 => {}
                        Level::L2 => c.l1i_misses += 1,
                        Level::L3 => {
                            c.l1i_misses += 1;
                            c.l2i_misses += 1;
                        }
                        Level::Memory => {
                            c.l1i_misses += 1;
                            c.l2i_misses += 1;
                            c.l3i_misses += has_l3;
                        }
                    }
                    if line >= last {
                        break;
                    }
                    line += 1;
                }
            }
            EV_DATA => {
                let size = (ev >> 48) & 0xff;
                let first = addr >> shift;
                let last = addr.wrapping_add(size.max(1) - 1) >> shift;
                let mut line = first;
                loop {
                    c.data_lines += 1;
                    match core.data_line(line, l3.as_deref_mut()) {
                        Level::L1 => {}
                        Level::L2 => c.l1d_misses += 1,
                        Level::L3 => {
                            c.l1d_misses += 1;
                            c.l2d_misses += 1;
                        }
                        Level::Memory => {
                            c.l1d_misses += 1;
                            c.l2d_misses += 1;
                            c.l3d_misses += has_l3;
                        }
                    }
                    if line >= last {
                        break;
                    }
                    line += 1;
                }
            }
            EV_STAGE => {
                *pos = p;
                return Stop::Stage((ev & 0xffff) as usize);
            }
            _ => {}
        }
    }
    *pos = p;
    stop
}

struct Core {
    caches: CoreCaches,
    clock: f64,
    current: Option<usize>,
    queue: VecDeque<usize>,
}

struct ThreadState {
    pos: usize,
    stage: usize,
    ready_at: f64,
    /// Instructions since the thread entered its current stage (group).
    visit: u64,
}

/// Where a core's next chunk comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// The core's current thread.
    Current,
    /// Position in the core's own queue.
    Own(usize),
    /// Position in the global queue (baseline).
    Global(usize),
    /// (core, position) in another core's queue (`steal`).
    Steal(usize, usize),
}

/// The queued thread that arrived first (position, arrival); ties: the
/// earlier position (FIFO).
fn earliest(q: &VecDeque<usize>, threads: &[ThreadState]) -> Option<(usize, f64)> {
    let mut best: Option<(usize, f64)> = None;
    for (i, t) in q.iter().enumerate() {
        let r = threads[*t].ready_at;
        if best.is_none_or(|(_, b)| r < b) {
            best = Some((i, r));
        }
    }
    best
}

/// For idle core `k` (staged policies with `steal`): the queued thread of
/// another core whose current stage `k` serves and that arrived first:
/// (core, position, arrival).
fn stealable(
    k: usize,
    cores: &[Core],
    threads: &[ThreadState],
    serve: &[u64],
) -> Option<(usize, usize, f64)> {
    let mut best: Option<(usize, usize, f64)> = None;
    for (j, c) in cores.iter().enumerate() {
        if j == k {
            continue;
        }
        for (i, t) in c.queue.iter().enumerate() {
            let th = &threads[*t];
            if serve[th.stage] >> k & 1 == 1 && best.is_none_or(|(.., b)| th.ready_at < b) {
                best = Some((j, i, th.ready_at));
            }
        }
    }
    best
}

/// Instructions from `pos` until the next STAGE marker that changes the
/// group away from `group` (or the end of the stream), counting at most to
/// `cap`.
fn visit_ahead(events: &[u64], pos: usize, group: usize, lookup: &[usize], cap: u64) -> u64 {
    let mut n = 0u64;
    for &ev in &events[pos.min(events.len())..] {
        match ev >> 62 {
            EV_FETCH => {
                n += ev_instrs(ev);
                if n >= cap {
                    break;
                }
            }
            EV_STAGE if lookup[((ev & 0xffff) as usize).min(lookup.len() - 1)] != group => break,
            _ => {}
        }
    }
    n
}

/// Replays `trace` under `cfg`; `progress` is called with instructions
/// replayed since its previous call (about every 2^20 instructions).
pub fn simulate(
    trace: &Trace,
    cfg: &SimConfig,
    progress: &mut dyn FnMut(u64),
) -> anyhow::Result<SimResult> {
    let started = std::time::Instant::now();
    let n = cfg.cores;
    anyhow::ensure!((1..=64).contains(&n), "cores = {n}: must be 1..=64");
    anyhow::ensure!(cfg.slice >= 1, "slice = 0: must be ≥ 1 instruction");
    anyhow::ensure!(
        (0.0..100.0).contains(&cfg.warmup_pct),
        "warm-up = {} %: must be in [0, 100)",
        cfg.warmup_pct
    );
    anyhow::ensure!(
        cfg.period >= 1,
        "policy period = 0: must be ≥ 1 instruction"
    );
    cfg.caches.validate()?;
    let groups = match &cfg.groups {
        Some(g) => {
            anyhow::ensure!(
                g.map.len() == trace.stages.len(),
                "stage grouping for {} stages, trace has {}",
                g.map.len(),
                trace.stages.len()
            );
            g.clone()
        }
        None => StageGroups::identity(&trace.stages),
    };
    // Trace stage (dense, "no stage" last) → group ("no group" last).
    let lookup = groups.lookup();
    let stages = groups.len();
    let ns = stages + 1; // dense group indices plus "no stage"
    let none = stages;
    let shift = cfg.caches.l1i.line_bytes.trailing_zeros();
    let mut cores: Vec<Core> = (0..n)
        .map(|_| {
            Ok(Core {
                caches: CoreCaches::new(&cfg.caches)?,
                clock: 0.0,
                current: None,
                queue: VecDeque::new(),
            })
        })
        .collect::<Result<_, crate::cache::GeometryError>>()?;
    let mut l3 = match cfg.caches.l3 {
        Some(g) => Some(Cache::new(g, "L3")?),
        None => None,
    };
    let mut threads: Vec<ThreadState> = trace
        .threads
        .iter()
        .map(|_| ThreadState {
            pos: 0,
            stage: none,
            ready_at: 0.0,
            visit: 0,
        })
        .collect();
    let baseline = cfg.policy == SimPolicy::Baseline;
    let mut global: VecDeque<usize> = VecDeque::new();
    for (i, t) in trace.threads.iter().enumerate() {
        if t.events.is_empty() {
            continue;
        }
        if baseline {
            global.push_back(i);
        } else {
            cores[i % n].queue.push_back(i);
        }
    }

    // The staged policies: the real host-sched code.
    let mut pol = match cfg.policy.host_sched_kind() {
        Some(kind) => {
            let budgets = match &cfg.budgets {
                Some(b) => {
                    anyhow::ensure!(b.len() == stages, "{} budgets for {stages} stages", b.len());
                    b.clone()
                }
                None => groups
                    .names
                    .iter()
                    .map(|name| Budget {
                        name: name.clone(),
                        min_cores: 0,
                        max_cores: n,
                        weight: 1.0,
                    })
                    .collect(),
            };
            Some(policy::build(
                kind,
                policy::Context {
                    cores: (0..n).collect(),
                    num_vcpus: n as u32,
                    budgets,
                    smoothing: cfg.smoothing,
                    hysteresis: cfg.hysteresis,
                },
            ))
        }
        None => None,
    };
    // Per dense stage, the mask of cores serving it ("no stage": all).
    let mut serve = vec![u64::MAX; ns];
    let mut requirement = Vec::new();
    if let Some(p) = pol.as_mut() {
        let plan = p.plan(&vec![0.0; stages]);
        serve[..stages].copy_from_slice(&plan.stage_vcpus);
        requirement = plan.requirement;
    }
    let mut plan_history: Vec<(u64, Vec<usize>)> = Vec::new();
    if pol.is_some() {
        plan_history.push((0, requirement.clone()));
    }
    let period_total = cfg.period.saturating_mul(n as u64);
    let mut next_period = period_total;
    let mut period_load = vec![0u64; ns];
    let (mut periods, mut plan_changes) = (0u64, 0u64);
    // Min-visit variant, history rule: per group, the weighted mean visit.
    let mut visit_mean: Vec<Option<f64>> = vec![None; ns];

    // Each thread's stream, or its first `thread_prefix` part.
    let ends: Vec<usize> = trace
        .threads
        .iter()
        .map(|th| match cfg.thread_prefix {
            Some(f) => ((th.events.len() as f64 * f.clamp(0.0, 1.0)) as usize).min(th.events.len()),
            None => th.events.len(),
        })
        .collect();
    let stream_instrs: u64 = match cfg.thread_prefix {
        Some(_) => trace
            .threads
            .iter()
            .zip(&ends)
            .map(|(th, e)| {
                th.events[..*e]
                    .iter()
                    .filter(|ev| *ev >> 62 == EV_FETCH)
                    .map(|ev| ev_instrs(*ev))
                    .sum::<u64>()
            })
            .sum(),
        None => trace.instrs,
    };
    // Instructions to replay: the whole trace, or a prefix (in replay order).
    let total = cfg.limit.map_or(stream_instrs, |l| l.min(stream_instrs));
    let warm_at = (total as f64 * cfg.warmup_pct / 100.0) as u64;
    let mut measuring = warm_at == 0;
    // Per core, its clock when statistics started.
    let mut warm_clock = vec![0.0f64; n];
    let mut warmup_instrs = 0u64;
    let mut stats = vec![Counters::default(); n * ns];
    let mut executed = 0u64;
    let mut reported = 0u64;

    let steal = cfg.steal && pol.is_some();
    loop {
        // Discrete-event order: the core whose next chunk starts earliest.
        // A core with a current thread starts at its clock; an idle core at
        // max(its clock, the arrival of the earliest-arrived thread it can
        // take). Pushes happen at chunk ends, which are never earlier than
        // the chunk's start, so no thread can later arrive anywhere before
        // the start chosen here.
        let mut pick: Option<(f64, usize, Source)> = None;
        for (k, c) in cores.iter().enumerate() {
            let cand = if c.current.is_some() {
                Some((c.clock, Source::Current))
            } else {
                let own = if baseline {
                    earliest(&global, &threads).map(|(i, r)| (c.clock.max(r), Source::Global(i)))
                } else {
                    earliest(&c.queue, &threads).map(|(i, r)| (c.clock.max(r), Source::Own(i)))
                };
                let other = if steal {
                    stealable(k, &cores, &threads, &serve)
                        .map(|(j, i, r)| (c.clock.max(r), Source::Steal(j, i)))
                } else {
                    None
                };
                match (own, other) {
                    (Some(o), Some(x)) => Some(if x.0 < o.0 { x } else { o }),
                    (o, x) => o.or(x),
                }
            };
            if let Some((time, src)) = cand {
                if pick.is_none_or(|(pt, ..)| time < pt) {
                    pick = Some((time, k, src));
                }
            }
        }
        let Some((_, k, src)) = pick else { break };
        if executed >= total {
            break;
        }
        let t = match src {
            Source::Current => cores[k].current.unwrap_or_default(),
            Source::Own(i) | Source::Global(i) | Source::Steal(_, i) => {
                let q = match src {
                    Source::Global(_) => &mut global,
                    Source::Steal(j, _) => &mut cores[j].queue,
                    _ => &mut cores[k].queue,
                };
                let Some(t) = q.remove(i) else { break };
                cores[k].current = Some(t);
                cores[k].clock = cores[k].clock.max(threads[t].ready_at);
                if matches!(src, Source::Steal(..)) {
                    let st = &mut stats[k * ns + threads[t].stage];
                    st.steals += 1;
                    st.migration_cycles += cfg.migration_cycles;
                    cores[k].clock += cfg.migration_cycles as f64;
                }
                t
            }
        };
        let events = &trace.threads[t].events[..ends[t]];
        let mut budget = cfg.slice;
        // How the slice ends: None = slice used up, Some(None) = thread done,
        // Some(Some(target)) = migrate to target.
        let mut outcome: Option<Option<usize>> = None;
        while budget > 0 {
            let mut lim = budget;
            lim = lim.min(total.saturating_sub(executed).max(1));
            if !measuring {
                lim = lim.min(warm_at.saturating_sub(executed).max(1));
            }
            if pol.is_some() {
                lim = lim.min(next_period.saturating_sub(executed).max(1));
            }
            let mut delta = Counters::default();
            let stage = threads[t].stage;
            let stop = run_chunk(
                events,
                &mut threads[t].pos,
                lim,
                &mut cores[k].caches,
                l3.as_mut(),
                shift,
                &mut delta,
            );
            let done = delta.instrs;
            threads[t].visit += done;
            executed += done;
            budget = budget.saturating_sub(done);
            cores[k].clock += cfg.model.cycles(&delta);
            stats[k * ns + stage].add(&delta);
            period_load[stage] += done;
            if executed - reported >= 1 << 20 {
                progress(executed - reported);
                reported = executed;
            }
            if !measuring && executed >= warm_at {
                measuring = true;
                for (w, c) in warm_clock.iter_mut().zip(&cores) {
                    *w = c.clock;
                }
                warmup_instrs = executed;
                stats.iter_mut().for_each(|s| *s = Counters::default());
            }
            if let Some(p) = pol.as_mut() {
                if executed >= next_period {
                    next_period = executed + period_total;
                    periods += 1;
                    let load: Vec<f64> = period_load[..stages]
                        .iter()
                        .map(|l| *l as f64 / cfg.period as f64)
                        .collect();
                    period_load.fill(0);
                    let plan = p.plan(&load);
                    if plan.stage_vcpus[..] != serve[..stages] {
                        plan_changes += 1;
                        serve[..stages].copy_from_slice(&plan.stage_vcpus);
                        plan_history.push((executed, plan.requirement.clone()));
                    }
                    requirement = plan.requirement;
                }
            }
            if executed >= total {
                // A prefix replay ends here (the thread keeps its core).
                break;
            }
            match stop {
                Stop::Limit => {}
                Stop::Done => {
                    outcome = Some(None);
                    break;
                }
                Stop::Stage(raw) => {
                    let s = lookup[raw.min(lookup.len() - 1)];
                    let old = threads[t].stage;
                    if s != old {
                        // A marker inside one group is no stage change.
                        let v = threads[t].visit;
                        if old != none && v > 0 {
                            let m = &mut visit_mean[old];
                            *m = Some(match *m {
                                Some(x) => x + HISTORY_WEIGHT * (v as f64 - x),
                                None => v as f64,
                            });
                        }
                        threads[t].visit = 0;
                    }
                    threads[t].stage = s;
                    if s != old && pol.is_some() && serve[s] >> k & 1 == 0 {
                        let target = (0..n).filter(|c| serve[s] >> c & 1 == 1).min_by_key(|c| {
                            let q = &cores[*c];
                            (q.queue.len() + q.current.is_some() as usize, *c)
                        });
                        let long_enough = cfg.min_visit == 0
                            || match cfg.visit_rule {
                                VisitRule::Oracle => {
                                    visit_ahead(events, threads[t].pos, s, &lookup, cfg.min_visit)
                                        >= cfg.min_visit
                                }
                                VisitRule::History => {
                                    visit_mean[s].is_none_or(|m| m >= cfg.min_visit as f64)
                                }
                            };
                        if target.is_some() && !long_enough {
                            stats[k * ns + s].kept += 1;
                        } else if let Some(target) = target {
                            let st = &mut stats[k * ns + s];
                            st.migrations += 1;
                            st.migration_cycles += cfg.migration_cycles;
                            cores[k].clock += cfg.migration_cycles as f64;
                            outcome = Some(Some(target));
                            break;
                        }
                    }
                    if threads[t].pos >= events.len() {
                        outcome = Some(None);
                        break;
                    }
                }
            }
        }
        let core = &mut cores[k];
        match outcome {
            Some(None) => core.current = None,
            Some(Some(target)) => {
                core.current = None;
                threads[t].ready_at = core.clock;
                cores[target].queue.push_back(t);
            }
            None => {
                // Only threads that have arrived by now compete for the core.
                let now = core.clock;
                let arrived = |q: &VecDeque<usize>| q.iter().any(|o| threads[*o].ready_at <= now);
                let others_wait = if baseline {
                    arrived(&global)
                } else {
                    arrived(&core.queue)
                };
                if others_wait {
                    core.current = None;
                    threads[t].ready_at = core.clock;
                    if baseline {
                        global.push_back(t);
                    } else {
                        core.queue.push_back(t);
                    }
                }
            }
        }
    }
    progress(executed - reported);

    // Each core's window runs from its own clock at the warm-up point to the
    // last core's finish; the machine window is their mean.
    let end = cores.iter().map(|c| c.clock).fold(0.0, f64::max);
    let window_sum: f64 = warm_clock.iter().map(|w| (end - w).max(0.0)).sum();
    let window = window_sum / n as f64;
    let mut total = Counters::default();
    let mut per_core = Vec::with_capacity(n);
    for k in 0..n {
        let mut c = Counters::default();
        for s in 0..ns {
            c.add(&stats[k * ns + s]);
        }
        total.add(&c);
        per_core.push(Metrics::new(c, &cfg.model));
    }
    let per_stage = (0..ns)
        .map(|s| {
            let mut c = Counters::default();
            for k in 0..n {
                c.add(&stats[k * ns + s]);
            }
            StageResult {
                name: groups
                    .names
                    .get(s)
                    .map_or("(none)".to_string(), |n| n.clone()),
                metrics: Metrics::new(c, &cfg.model),
            }
        })
        .collect();
    let total = Metrics::new(total, &cfg.model);
    let secs = started.elapsed().as_secs_f64();
    Ok(SimResult {
        policy: cfg.policy.name().to_string(),
        label: cfg.label(),
        groups: groups.label(),
        group_spec: groups.full_spec(),
        migration_cycles: cfg.migration_cycles,
        min_visit: cfg.min_visit,
        cores: n,
        slice: cfg.slice,
        threads: trace.threads.len(),
        warmup_instrs,
        utilization: if window > 0.0 {
            total.cycles / window_sum
        } else {
            0.0
        },
        throughput_ipc: if window > 0.0 {
            total.counters.instrs as f64 / window
        } else {
            0.0
        },
        total,
        per_core,
        per_stage,
        window_cycles: window,
        periods,
        plan_changes,
        final_requirement: requirement,
        plan_history,
        replay_seconds: secs,
        replay_mips: executed as f64 / secs.max(1e-9) / 1e6,
    })
}
