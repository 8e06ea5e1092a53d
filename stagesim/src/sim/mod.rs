//! Replay of a [`Trace`](crate::stream::Trace) on N simulated cores under a scheduling model.
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
//!   the cores (when no thread waits, a thread keeps its core). As an OS
//!   scheduler on real threads: slices are randomised around `slice`
//!   ([`SimConfig::slice_jitter`]) and connection threads block for their
//!   client at the request marker ([`BlockRule`]); with neither, identical
//!   threads started together run in lockstep and understate L2
//!   instruction misses (issue 16).
//! * `captured` — the schedule the traced run had: one core (Valgrind ran
//!   one thread at a time) executing the records in file order, switching
//!   threads where the trace switched. The reference the baseline is
//!   validated against (`bench/capture/cachesim.c` simulates the same order
//!   independently).
//! * `pinned` — thread *i* (in order of first appearance in the trace) stays
//!   on core *i* mod N; each core round-robins its threads.
//! * `auto` — host-sched's `auto`: unstaged (every core serves every
//!   stage) first, then trials of the `static` plan and the unstaged plan,
//!   compared on the modelled throughput of each period (instructions per
//!   second at 2.5 GHz, given as the VMM gives the guest's requests/s); it
//!   keeps the faster. Its trial steps and decisions are in the result.
//!   Under an unstaged plan an idle core takes queued threads from other
//!   cores (`steal`, whatever [`SimConfig::steal`] says), as the test
//!   guest's runtime steals work under an unstaged map: the threads a
//!   staged trial gathered spread out again.
//! * `static`, `proportional` — the real `host-sched` policies
//!   ([`host_sched::policy::build`]): simulated core *k* is vCPU *k* (one vCPU
//!   per core, `Context.cores = 0..N`). Threads start as in `pinned`. Every
//!   policy period (`period` instructions per core, i.e. `period × N`
//!   instructions over all cores) the policy gets per-stage load — the
//!   instructions executed in the stage during the period divided by
//!   `period`, i.e. the cores' worth of work, as the VMM passes vCPUs' worth
//!   of time — and returns a [`host_sched::policy::Plan`]; its `stage_vcpus`
//!   masks say which cores serve each stage. At every STAGE marker whose
//!   stage the current core does not serve, the thread migrates to the
//!   least-loaded core serving the stage (fewest threads queued or running;
//!   ties: lowest index), chosen by the guest agent's own rule
//!   ([`guest_agent::choose_from_map`]): the source core pays
//!   `migration_cycles`, the thread may run on the target
//!   `migration_latency` cycles later, and the target pays
//!   `migration_target_cycles` when it first runs it.
//!   Threads outside any stage (`0xFFFF`, or before their first marker) stay
//!   where they are.
//! * **Temporal staging** ([`SimConfig::visit`], issue 40) — each core
//!   orders the visits of its own threads with the guest agent's
//!   [`guest_agent::visit::Visitor`] (the code the test guest's scheduler
//!   runs): at every stage switch a thread yields into its core's queue for
//!   the stage it enters (the core pays [`SimConfig::switch_cycles`]), and
//!   the core serves one stage's threads back to back. With `pinned` this
//!   is `auto`'s *temporal* mode (no migration; idle cores steal when
//!   [`SimConfig::steal`] is on), with `static`/`proportional` its *both*
//!   mode (a thread migrates where its core does not serve the new stage,
//!   and yields where it does); `auto` then trials all four modes.
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
//! per migration `migration_cycles` on the source and
//! `migration_target_cycles` on the target (a steal: both on the core that
//! steals); `migration_latency` only delays the thread. Each core's clock advances by the cycles
//! of what it runs and waits (idle) when it has no work. Reported: per-core
//! IPC = instructions / busy cycles, and machine throughput = instructions /
//! (wall cycles of the measured window). Each core's window runs from its
//! own clock when the warm-up ended to the moment the last core finishes;
//! the machine window is the mean over cores. Idle time (load imbalance,
//! the tail of the run) lowers throughput; utilization = busy cycles / sum
//! of the cores' windows.
//!
//! ## Files
//! * `mod.rs` — the models ([`SimPolicy`], [`VisitRule`]) and a replay's
//!   parameters ([`SimConfig`]),
//! * `metrics.rs` — counters, the cycle model and the result types,
//! * `chunk.rs` — the inner loop: one chunk of a thread's events through a
//!   core's caches, and the min-visit oracle's look-ahead,
//! * `sched.rs` — the scheduling model: cores, run queues, which core runs
//!   next, stealing, and where a thread migrates (the guest agent's rule),
//! * `plans.rs` — the staged policies' periods and plans (host-sched),
//! * `account.rs` — statistics per (core, stage), the warm-up reset and the
//!   final [`SimResult`],
//! * `replay.rs` — [`simulate`]: set-up and the replay loop,
//! * `temporal.rs` — temporal staging: per-core visit orders
//!   ([`guest_agent::visit::Visitor`]), yields at stage switches and their
//!   switch cost (issue 40).

use serde::Serialize;

use crate::cache::Hierarchy;
use crate::groups::StageGroups;
use host_sched::config::Budget;
use host_sched::policy::PolicyKind;

mod account;
mod chunk;
mod coherence;
mod metrics;
mod plans;
mod replay;
mod sched;
mod temporal;

pub use metrics::{Counters, CycleModel, Metrics, SimResult, StageResult};
pub use plans::{default_budget, default_budgets};
pub use replay::simulate;
pub use temporal::{visit_mode, LOCAL_SWITCH_CYCLES};

pub use guest_agent::VisitPolicy;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_temporal;

/// Which scheduling model a replay uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SimPolicy {
    /// Global round-robin run queue, no affinity (the OS model).
    Baseline,
    /// The schedule as captured: one core (the traced run's threads were
    /// serialised by Valgrind) switching threads where the traced run did
    /// ([`crate::stream::Trace::schedule`]).
    Captured,
    /// Thread i stays on core i mod N.
    Pinned,
    /// host-sched `static`.
    Static,
    /// host-sched `proportional`.
    Proportional,
    /// host-sched `auto`: trials of `static` and unstaged (every core
    /// serves every stage) on the modelled throughput, keeps the faster.
    Auto,
}

impl SimPolicy {
    /// Every model, in table order.
    pub const ALL: [SimPolicy; 6] = [
        Self::Baseline,
        Self::Captured,
        Self::Pinned,
        Self::Static,
        Self::Proportional,
        Self::Auto,
    ];

    /// Parses `baseline`, `captured`, `pinned`, `static`, `proportional` or
    /// `auto`.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "baseline" => Self::Baseline,
            "captured" => Self::Captured,
            "pinned" => Self::Pinned,
            "static" => Self::Static,
            "proportional" => Self::Proportional,
            "auto" => Self::Auto,
            _ => return None,
        })
    }

    /// The model's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::Captured => "captured",
            Self::Pinned => "pinned",
            Self::Static => "static",
            Self::Proportional => "proportional",
            Self::Auto => "auto",
        }
    }

    /// The host-sched policy behind a staged model.
    pub fn host_sched_kind(self) -> Option<PolicyKind> {
        match self {
            Self::Static => Some(PolicyKind::Static),
            Self::Proportional => Some(PolicyKind::Proportional),
            Self::Auto => Some(PolicyKind::Auto),
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
    /// Cost of one thread migration in cycles (default 1700: 677 ns at
    /// 2.5 GHz, the mean migration between vCPUs that own their cores that
    /// `just bench-migration` measured — bench/RESULTS.md, migration
    /// microbenchmark; seed 000's 1.7 µs bare-metal IPI propagation, the
    /// lower bound of IPI-based migration it cites, is 4250). Charged as
    /// busy time on the core the thread leaves (the source's CPU share of
    /// a migration).
    pub migration_cycles: u64,
    /// CPU a migration costs the core the thread arrives on, charged when
    /// that core first runs it (the queue hand-off and the thread state's
    /// lines; 0 by default, as before this field existed).
    pub migration_target_cycles: u64,
    /// Latency of a migration: the thread becomes runnable on its target
    /// only this many cycles after it left its source; the target runs
    /// other threads meanwhile, so it costs no CPU (0 by default). Seed
    /// 000's 1.3 µs and `just bench-migration`'s 677 ns to an idle
    /// spinning target are latencies of this kind; its saturated mode
    /// measures the CPU (source + target) instead.
    pub migration_latency: u64,
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
    /// Randomised time slices: each slice is drawn uniformly from
    /// `slice × [1 − j, 1 + j]` (`j` in [0, 1); 0 = every slice exactly
    /// `slice`), as an OS scheduler's slices vary with wake-ups, ticks and
    /// vruntime. Without it identical threads started together stay in
    /// lockstep and keep reusing each other's code in L2 (issue 16).
    pub slice_jitter: f64,
    /// Seed of the replay's random numbers (slice jitter, think times).
    pub seed: u64,
    /// Threads that block: see [`BlockRule`]; `None`: threads never block.
    #[serde(skip)]
    pub block: Option<BlockRule>,
    /// Replays every thread's stream this many times in a row (≥ 1): a
    /// longer run of the same transactions, e.g. for `auto`, whose trials
    /// take a fixed number of policy periods that one short trace window
    /// cannot amortize (not with the `captured` model).
    pub repeat: u32,
    /// Temporal staging (issue 40): the stage-visit policy every core's
    /// scheduler follows ([`guest_agent::visit::Visitor`]); `Fifo` (the
    /// default) is none. With `pinned`: the temporal mode; with `static` or
    /// `proportional`: both; with `auto`: the policy of its temporal modes
    /// (which it then trials too). Not for `baseline` and `captured`.
    #[serde(serialize_with = "ser_visit")]
    pub visit: VisitPolicy,
    /// CPU a yield at a stage switch costs the core (temporal staging),
    /// cycles: the mechanism that hands the core to the next thread of the
    /// stage being served. Default [`LOCAL_SWITCH_CYCLES`] (the test
    /// unikernel's measured local switch); a migration (both mode) is
    /// charged as a migration instead, never both.
    pub switch_cycles: u64,
    /// `auto` only: the null experiment of `just bench-auto` O2 (its
    /// `temporal` candidate is unstaged under another name:
    /// [`host_sched::policy::auto::AutoParams::twin`]).
    #[serde(default)]
    pub auto_twin: bool,
}

/// Serialises a visit policy by its name.
fn ser_visit<S: serde::Serializer>(v: &VisitPolicy, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.name())
}

/// Threads that block: a connection thread entering trace stage `stage`
/// (MariaDB's `net_read`: reading the next command from its client; the
/// trace's own stage, whatever the grouping merges it with) waits
/// for its client — it leaves its core and becomes runnable again after a
/// think time drawn from an exponential distribution of mean
/// `think_cycles` (memoryless client delays, the usual model of a closed
/// system's clients; TPC-C draws its think times from a negative
/// exponential, clause 5.2.5.4) — as a server's threads do between
/// requests, which breaks the convoys of threads running the same code in
/// step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BlockRule {
    /// Dense trace-stage index ([`crate::stream::Trace::stages`] order) at
    /// whose markers a thread blocks.
    pub stage: usize,
    /// Mean think time (cycles).
    pub think_cycles: u64,
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
            migration_cycles: 1700,
            migration_target_cycles: 0,
            migration_latency: 0,
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
            slice_jitter: 0.0,
            seed: 1,
            block: None,
            repeat: 1,
            visit: VisitPolicy::Fifo,
            switch_cycles: LOCAL_SWITCH_CYCLES,
            auto_twin: false,
        }
    }

    /// Whether the cores order their visits (a temporal visit policy
    /// under `pinned`, `static`, `proportional` or `auto`).
    pub fn temporal(&self) -> bool {
        self.visit.is_temporal()
            && matches!(
                self.policy,
                SimPolicy::Pinned | SimPolicy::Static | SimPolicy::Proportional | SimPolicy::Auto
            )
    }

    /// The model's label: the policy name, plus the min-visit variant when
    /// it is on (e.g. `static/min-visit 5000 oracle`).
    pub fn label(&self) -> String {
        let mut l = self.policy.name().to_string();
        if self.load_weights && self.policy == SimPolicy::Static {
            l.push_str("/load-weights");
        }
        if self.steal
            && (self.policy.host_sched_kind().is_some() || self.policy == SimPolicy::Pinned)
        {
            l.push_str("/steal");
        }
        if self.temporal() {
            l.push_str(&format!("/visit {}", self.visit.name()));
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
