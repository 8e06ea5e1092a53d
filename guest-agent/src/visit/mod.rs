//! Temporal staging: the order in which a vCPU's scheduler serves the
//! threads queued for the stages it serves ([`Visitor`]), after the
//! thread-per-core stage-visit policies of seed 002 (Gordon, Cambridge
//! TR-781, ch. 3). The host names the policy in the stage map (ABI minor 3,
//! [`VisitPolicy`]); spatial staging (the map's masks) decides *where* a
//! stage runs, the visit policy *when*.
//!
//! Model. Each vCPU keeps one queue per stage: a thread that reaches a stage
//! switch yields and waits in the queue of the stage it enters. Serving a
//! queue means resuming one of its threads, which runs that stage (its
//! *visit*) and yields at its next switch. Serving one stage's threads back
//! to back runs that stage's code on the core over and over, so the
//! i-cache holds one stage's code at a time (Larus & Parkes 2002; seed 002
//! §2.4.2) — without any migration.
//!
//! Every polling policy here serves a stage **exhaustively** (seed 002
//! §3.1.1, table 3.1): once chosen, a stage is served while its queue has
//! threads, including ones that arrive during the visit; then the policy
//! picks the next stage:
//!
//! * **Cohort** (§2.4.2): an elevator over the stage ids — up to the last
//!   stage, back down to the first — skipping empty queues. A stage whose
//!   queue reaches [`Thresholds::jump_len`] makes the vCPU jump there
//!   after the current thread, drain it, and go back to the stage it left
//!   (no second jump during a jump, as in Larus & Parkes).
//! * **SRPT** (§3.1.2): the last stage of the pipeline first, working back
//!   to the first; after each successful visit the scan restarts at the end
//!   (threads nearest completion first, an approximation of SRPT).
//! * **DBR** (§3.1.3, drum-buffer-rope): stages in ascending order of their
//!   measured service rate — the slowest (longest mean service time per
//!   thread, [`Visitor::served`]) first; the order is re-sorted at the
//!   start of every pass, and a pass restarts after each successful visit.
//! * **MG1** (§3.1.1): a polling table of about [`MG1_TABLE`] entries in
//!   which stage *i* appears with frequency f_i ∝ √(ρ_i (1 − ρ_i)), its
//!   entries evenly spaced; ρ_i is stage *i*'s share of the vCPU's busy
//!   time (λ_i/μ_i of a saturated server). The seed's formula is lost from
//!   its text; this is the published form for exhaustive service with
//!   equal switch-over times: Boxma, Levy & Westrate, "Efficient visit
//!   frequencies for polling tables: minimization of waiting cost",
//!   Queueing Systems 9 (1991), §4 (the √ rule), as used by their
//!   "Efficient visit orders for polling systems", Performance Evaluation
//!   18 (1993). The table is rebuilt from the measured loads every time it
//!   has been walked through.
//! * **FIFO** and **Color** do not poll stages: FIFO runs a thread's whole
//!   request (no temporal staging), Color (§3.1.4) serves one queue shared
//!   by the vCPUs in arrival order, each entry tagged by its stage — both
//!   are the runtime's queue, and [`Visitor::next`] serves them as the
//!   lowest non-empty stage id.
//!
//! **Starvation bound** (ours, generalising Cohort's inter-visit threshold
//! to every policy): a stage whose threads have waited while
//! [`Thresholds::starve_after`] threads of other stages were served on the
//! vCPU is visited next, the longest-waiting first. So no waiting thread
//! sees more than `starve_after` + (stages − 1) other threads served before
//! its stage is visited, whatever the policy's order (tested).
//!
//! Pure logic: queue lengths and service times in, the next stage out; the
//! caller owns the queues and the clock (the test guest's runtime, or a
//! unit test).

use hypercall_abi::stage::{VisitPolicy, MAX_STAGES};

/// Default [`Thresholds::starve_after`] (threads served elsewhere): four
/// full rounds of a 4-stage pipeline at the test guest's 16 threads per
/// vCPU (4 × 4 × 16), so a thread waits at most ~20 ms at ~70 µs per visit.
/// Far above what the orders need in a closed pipeline (3 × 16 = 48 serves
/// of other stages per round), even with twice the threads on a vCPU after
/// an imbalance; it only bounds pathological orders (a stage that refills
/// itself). A smaller bound fragments cohorts when a vCPU holds more
/// threads than usual.
pub const STARVE_AFTER: u32 = 256;
/// Default [`Thresholds::jump_len`] (threads): Cohort jumps to a stage
/// whose queue holds this many. Above the test guest's threads per vCPU
/// (≤ 16), so cohorts of a closed pipeline are never split; a thread
/// count this large is a backlog worth serving first. Seed 002 (§4.3.6)
/// notes that a static threshold is hard to set in general.
pub const COHORT_JUMP_LEN: u32 = 32;
/// Entries of the MG1 polling table: seed 002 §3.1.1, "in practice the
/// algorithm uses polling table sizes of 144 or greater" (each stage also
/// gets at least one entry, so the table holds up to 144 + stages).
pub const MG1_TABLE: usize = 144;
/// Capacity of the MG1 table.
const TABLE_CAP: usize = MG1_TABLE + MAX_STAGES;
/// A new sample's weight in the mean service times, 2^-3 (the gain of
/// TCP's smoothed RTT, RFC 6298 §2).
const SERVICE_SHIFT: u32 = 3;

/// A visitor's thresholds (units: threads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// Threads of other stages served while a stage's threads wait before
    /// that stage is visited next (every polling policy).
    pub starve_after: u32,
    /// Cohort: a queue this long is visited next (a jump).
    pub jump_len: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            starve_after: STARVE_AFTER,
            jump_len: COHORT_JUMP_LEN,
        }
    }
}

/// One vCPU's stage-visit state (see the module docs). Owned and used by
/// that vCPU's scheduler only.
#[derive(Clone, Debug)]
pub struct Visitor {
    policy: VisitPolicy,
    /// Stages of the pipeline (1..=[`MAX_STAGES`]).
    stages: usize,
    thresholds: Thresholds,
    /// The stage being visited (served while its queue has threads).
    current: Option<usize>,
    /// Cohort: the elevator goes towards higher stage ids.
    up: bool,
    /// Cohort: during a jump, the stage to go back to.
    resume: Option<usize>,
    /// Threads served so far.
    served: u64,
    /// Per stage: `served` when its waiting threads were first seen (or it
    /// was left with threads waiting); `None` while empty or visited.
    waiting_since: [Option<u64>; MAX_STAGES],
    /// Per stage: mean service time per thread (TSC ticks; 0 = none yet).
    service: [u64; MAX_STAGES],
    /// Per stage: busy time since the MG1 table was last built (ticks).
    busy: [u64; MAX_STAGES],
    /// MG1: the polling table (stage ids) and its length.
    table: [u8; TABLE_CAP],
    table_len: usize,
    /// MG1: the next table entry to poll.
    pos: usize,
}

impl Visitor {
    /// A visitor for `policy` over `stages` stages (clamped to
    /// 1..=[`MAX_STAGES`]) with the default [`Thresholds`].
    pub fn new(policy: VisitPolicy, stages: usize) -> Self {
        Self::with_thresholds(policy, stages, Thresholds::default())
    }

    /// A visitor with explicit thresholds (a `starve_after` of 0 counts as 1).
    pub fn with_thresholds(policy: VisitPolicy, stages: usize, thresholds: Thresholds) -> Self {
        Self {
            policy,
            stages: stages.clamp(1, MAX_STAGES),
            thresholds: Thresholds {
                starve_after: thresholds.starve_after.max(1),
                jump_len: thresholds.jump_len.max(1),
            },
            current: None,
            up: true,
            resume: None,
            served: 0,
            waiting_since: [None; MAX_STAGES],
            service: [0; MAX_STAGES],
            busy: [0; MAX_STAGES],
            table: [0; TABLE_CAP],
            table_len: 0,
            pos: 0,
        }
    }

    /// The policy it follows.
    pub fn policy(&self) -> VisitPolicy {
        self.policy
    }

    /// Follows `policy` from now on (a new map); the measured service times
    /// are kept, the order starts afresh. No-op when it is the same.
    pub fn set_policy(&mut self, policy: VisitPolicy) {
        if policy != self.policy {
            let (service, stages, thresholds) = (self.service, self.stages, self.thresholds);
            *self = Self::with_thresholds(policy, stages, thresholds);
            self.service = service;
        }
    }

    /// The stage whose queue to serve one thread from next, given each
    /// stage's queue length (`lens[s]`, threads; stages past the pipeline's
    /// are ignored); `None` when every queue is empty. Call
    /// [`Visitor::served`] once that thread yields again.
    pub fn next(&mut self, lens: &[u32]) -> Option<usize> {
        let n = self.stages.min(lens.len());
        let len = |s: usize| lens.get(s).copied().unwrap_or(0);
        if (0..n).all(|s| len(s) == 0) {
            self.current = None;
            return None;
        }
        if matches!(self.policy, VisitPolicy::Fifo | VisitPolicy::Color) {
            return (0..n).find(|s| len(*s) > 0);
        }
        for s in 0..n {
            if len(s) == 0 {
                self.waiting_since[s] = None;
            } else if self.current != Some(s) && self.waiting_since[s].is_none() {
                self.waiting_since[s] = Some(self.served);
            }
        }
        // The starvation bound first: the longest-waiting stage past it.
        let starved = (0..n)
            .filter_map(|s| self.waiting_since[s].map(|w| (w, s)))
            .filter(|(w, _)| self.served - w >= u64::from(self.thresholds.starve_after))
            .min();
        if let Some((_, s)) = starved {
            if self.policy == VisitPolicy::Cohort && self.resume.is_none() {
                self.resume = self.current.filter(|c| len(*c) > 0);
            }
            return Some(self.enter(s, lens));
        }
        if let Some(c) = self.current.filter(|c| len(*c) > 0) {
            // Cohort's queue-length threshold, outside a jump.
            if self.policy == VisitPolicy::Cohort && self.resume.is_none() {
                if let Some(s) = (0..n).find(|s| *s != c && len(*s) >= self.thresholds.jump_len) {
                    self.resume = Some(c);
                    return Some(self.enter(s, lens));
                }
            }
            return Some(c);
        }
        let s = match self.policy {
            VisitPolicy::Cohort => self.cohort_next(lens, n),
            VisitPolicy::Srpt => (0..n).rev().find(|s| len(*s) > 0),
            VisitPolicy::Dbr => self.dbr_next(lens, n),
            VisitPolicy::Mg1 => self.mg1_next(lens, n),
            VisitPolicy::Fifo | VisitPolicy::Color => None,
        }?;
        Some(self.enter(s, lens))
    }

    /// Records that a thread of `stage` was served and ran `ticks` TSC
    /// ticks before it yielded (its visit's length: DBR's service rate,
    /// MG1's load).
    pub fn served(&mut self, stage: usize, ticks: u64) {
        self.served += 1;
        let Some(mean) = self.service.get_mut(stage) else {
            return;
        };
        *mean = if *mean == 0 {
            ticks.max(1)
        } else {
            // mean += (ticks − mean) / 8, in integers.
            (*mean - (*mean >> SERVICE_SHIFT)).saturating_add(ticks >> SERVICE_SHIFT)
        };
        self.busy[stage] = self.busy[stage].saturating_add(ticks);
    }

    /// The MG1 polling table as it stands (stage ids; empty before the
    /// first MG1 choice).
    pub fn table(&self) -> &[u8] {
        &self.table[..self.table_len]
    }

    /// Makes `s` the stage being visited, leaving the current one (whose
    /// waiting threads, if any, now wait).
    fn enter(&mut self, s: usize, lens: &[u32]) -> usize {
        if let Some(c) = self.current.filter(|c| *c != s) {
            if lens.get(c).copied().unwrap_or(0) > 0 {
                self.waiting_since[c] = Some(self.served);
            }
        }
        self.current = Some(s);
        self.waiting_since[s] = None;
        s
    }

    /// Cohort's elevator: back to the stage a jump left, else the next
    /// non-empty stage in the elevator's direction, turning at the ends.
    fn cohort_next(&mut self, lens: &[u32], n: usize) -> Option<usize> {
        if let Some(r) = self.resume.take() {
            if lens[r] > 0 {
                return Some(r);
            }
        }
        if self.current.is_none() && lens[0] > 0 {
            return Some(0);
        }
        let mut s = self.current.unwrap_or(0).min(n - 1);
        // Two sweeps visit every stage; with one stage there is nowhere to go.
        let steps = if n > 1 { 2 * n } else { 0 };
        for _ in 0..steps {
            if self.up && s + 1 >= n {
                self.up = false;
            } else if !self.up && s == 0 {
                self.up = true;
            }
            s = if self.up { s + 1 } else { s - 1 };
            if lens[s] > 0 {
                return Some(s);
            }
        }
        (0..n).find(|s| lens[*s] > 0)
    }

    /// DBR: the slowest stage with threads (longest mean service time; a
    /// stage not measured yet counts as slowest, ties to the lower id).
    fn dbr_next(&self, lens: &[u32], n: usize) -> Option<usize> {
        let mut order = [0usize; MAX_STAGES];
        for (k, o) in order.iter_mut().enumerate().take(n) {
            *o = k;
        }
        let key = |s: &usize| {
            let t = self.service[*s];
            (core::cmp::Reverse(if t == 0 { u64::MAX } else { t }), *s)
        };
        order[..n].sort_unstable_by_key(key);
        order[..n].iter().copied().find(|s| lens[*s] > 0)
    }

    /// MG1: the next table entry whose stage has threads; rebuilds the
    /// table from the loads measured since the last build once it has been
    /// walked through.
    fn mg1_next(&mut self, lens: &[u32], n: usize) -> Option<usize> {
        if self.table_len == 0 {
            self.build_table(n);
        }
        for _ in 0..self.table_len {
            if self.pos >= self.table_len {
                self.build_table(n);
                self.pos = 0;
            }
            let s = self.table[self.pos] as usize;
            self.pos += 1;
            if lens.get(s).is_some_and(|l| *l > 0) {
                return Some(s);
            }
        }
        (0..n).find(|s| lens[*s] > 0)
    }

    /// Builds the MG1 table: stage *i* gets max(1, ⌊f_i · M⌋) entries with
    /// f_i ∝ √(ρ_i (1 − ρ_i)) (module docs), evenly spaced, entry *k* of
    /// stage *i* at (k + ½)/n_i of the table; then the loads start anew.
    fn build_table(&mut self, n: usize) {
        // ρ_i in 1/2^20 units (the busy-time shares), guarded against
        // overflow: busy times are scaled down to 2^40 first.
        const ONE: u64 = 1 << 20;
        let total: u64 = self.busy[..n]
            .iter()
            .fold(0u64, |a, b| a.saturating_add(*b));
        let mut weight = [0u64; MAX_STAGES];
        for (w, busy) in weight.iter_mut().zip(&self.busy).take(n) {
            let rho = if total == 0 {
                ONE / n as u64
            } else {
                // busy / total in 2^-20 units without overflow.
                ((u128::from(*busy) * u128::from(ONE)) / u128::from(total)) as u64
            };
            *w = (rho * (ONE - rho.min(ONE))).isqrt();
        }
        let sum: u64 = weight[..n].iter().sum();
        let mut count = [1usize; MAX_STAGES];
        if sum > 0 {
            for (c, w) in count.iter_mut().zip(&weight).take(n) {
                *c = ((u128::from(*w) * MG1_TABLE as u128 / u128::from(sum)) as usize).max(1);
            }
        }
        // Entries keyed by their position in the table, (2k + 1) / (2 n_i).
        let mut keys = [(0u64, 0u8); TABLE_CAP];
        let mut len = 0;
        for (s, c) in count.iter().enumerate().take(n) {
            for k in 0..*c {
                if len < TABLE_CAP {
                    keys[len] = (((2 * k + 1) as u64) * ONE / (2 * *c as u64), s as u8);
                    len += 1;
                }
            }
        }
        keys[..len].sort_unstable();
        for (slot, (_, s)) in self.table.iter_mut().zip(&keys[..len]) {
            *slot = *s;
        }
        self.table_len = len;
        self.busy = [0; MAX_STAGES];
    }
}

#[cfg(test)]
mod tests;
