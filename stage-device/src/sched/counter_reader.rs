//! From the guest's per-vCPU stage counters (ABI minor 2) to what happened
//! between two reads, under the untrusted-guest rules of
//! docs/stage-protocol.md §8–9.
//!
//! Every vCPU is in exactly one state at every tick (a stage, idle, or no
//! stage), so between two reads its `window` of ticks splits over the
//! state codes:
//! * **idle, exactly**: idle visits are always timed, so idle time is the
//!   growth of `cycles[IDLE]`, minus the part of an open idle visit already
//!   charged at the last read, plus the open visit's part now (`now −
//!   since` of the state word);
//! * **busy = window − idle, split by estimate**: each stage's time is its
//!   timed visits' exact time in the window plus its untimed visits
//!   (entries − timed visits) at the mean length of its timed visits (of
//!   this window, else of the whole run); "no stage" gets the rest of the
//!   busy time (its visits include odd very long ones — the wait from
//!   REGISTER to the first switch, a thread blocked between requests —
//!   whose mean would wrongly scale its untimed ones), and the stages are
//!   scaled down when they add up to more than the busy time. With every
//!   visit timed (`timed_every = 1`) the split is exact; paced at one timed
//!   visit per 16 µs it samples ~1,250 visits per vCPU per 20 ms period. A
//!   window without a single entry gives all its busy time to the current
//!   code (a long visit).
//!
//! The host's estimate of the guest's TSC "now" comes from the REGISTER
//! exit ([`GuestClock`]). Rules, each applied and counted per vCPU in
//! [`VcpuDelta::clamps`] (a guest that breaks them only skews its own load
//! signal):
//! * a counter that goes backwards adds nothing and becomes the new
//!   baseline;
//! * a state code out of range, or a timed state that started more than a
//!   policy period in the future, contributes no open visit;
//! * idle time above the window, or counts above one per tick, are cut to
//!   that bound;
//! * idle's or a stage's exact time summed since REGISTER above the
//!   windows' sum (+ 1/8, + the clock's raises) is counted (and that total
//!   cut to it).
//!
//! A writer's adds can land reads after its state word: a torn copy (the
//! guest writes while the host copies), or a thread preempted between the
//! two (libstage, for as long as the host's scheduler keeps it off its
//! CPU). Its visit's time then moves to the window where the adds land —
//! possibly more than that window holds, so the bound on a code's time is
//! checked on the totals, not per window; each window's estimate is still
//! cut to its busy time, and the windows in between give the missing part
//! to "no stage".

use hypercall_abi::stage::{
    state_code, state_since, state_timed, VcpuCounters, CODE_FIRST_STAGE, CODE_IDLE, CODE_NONE,
    MAX_STAGES, NUM_CODES,
};

/// Share of the window a vCPU's idle time or a code's counts may exceed it
/// by before the excess counts as impossible (1/8: torn reads and the clock
/// estimate's error).
pub const SLACK_DIV: u64 = 8;

/// The host's estimate of the guest's TSC: guest = host + offset
/// (wrapping). Calibrated at REGISTER from the guest's `register_tsc` and
/// the host's TSC at the exit (error: one exit's latency), and raised when
/// a vCPU's state shows a later time than the estimate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestClock {
    offset: u64,
    calibrated: bool,
}

impl GuestClock {
    /// The clock from REGISTER's pair (`register_tsc` 0: uncalibrated until
    /// the first read, which takes the latest state time as "now").
    pub fn new(register_tsc: u64, host_tsc: u64) -> Self {
        Self {
            offset: register_tsc.wrapping_sub(host_tsc),
            calibrated: register_tsc != 0,
        }
    }

    /// The guest TSC at host TSC `host_tsc`.
    pub fn now(&self, host_tsc: u64) -> u64 {
        host_tsc.wrapping_add(self.offset)
    }
}

/// What one vCPU did between two reads, after the rules above.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VcpuDelta {
    /// Per state code, guest TSC ticks spent in it in the window.
    pub ticks: [u64; NUM_CODES],
    /// Per state code, transitions into it (entries, requests, idles).
    pub counts: [u64; NUM_CODES],
    /// Per stage, migrations in and out (counted where threads arrived).
    pub migrations_in: [u64; MAX_STAGES],
    /// See `migrations_in`.
    pub migrations_out: [u64; MAX_STAGES],
    /// Impossible values clamped in this window.
    pub clamps: u64,
}

impl Default for VcpuDelta {
    fn default() -> Self {
        Self {
            ticks: [0; NUM_CODES],
            counts: [0; NUM_CODES],
            migrations_in: [0; MAX_STAGES],
            migrations_out: [0; MAX_STAGES],
            clamps: 0,
        }
    }
}

/// The last read of one vCPU: its raw counters, the open visit already
/// charged (code, ticks), per code the charged time that no ended visit
/// has paid back yet (ticks; see [`delta`]), and the totals since REGISTER
/// that the plausibility bounds are checked on: each code's exact time
/// (ticks) and the windows' length (ticks).
#[derive(Clone, Copy, Debug)]
struct Baseline {
    raw: VcpuCounters,
    open: Option<(usize, u64)>,
    owed: [u64; NUM_CODES],
    exact_total: [u128; NUM_CODES],
    elapsed: u128,
}

impl Baseline {
    /// A fresh area's block: all zero, in no stage since REGISTER.
    fn fresh() -> Self {
        Self {
            raw: VcpuCounters::default(),
            open: None,
            owed: [0; NUM_CODES],
            exact_total: [0; NUM_CODES],
            elapsed: 0,
        }
    }
}

/// Reads of one registration's counters: per-vCPU baselines, the clock,
/// and the host TSC of the last read (the next window's start).
#[derive(Debug)]
pub struct CounterReader {
    generation: u64,
    clock: GuestClock,
    /// Most the clock is raised by in one read (ticks; 1 ms at the guest's
    /// TSC rate, or the window's slack when the rate is unknown).
    max_raise: u64,
    /// Sum of the raises so far (ticks): guest time the windows do not
    /// cover, allowed on top of them in the totals' bounds.
    raised: u64,
    last: Vec<Baseline>,
    last_host_tsc: u64,
    /// Latest state time seen: the guest's last transition on any vCPU.
    last_transition_tsc: Option<u64>,
    /// Guest TSC at the start of the first window with a transition, and at
    /// the end of the last one: the span the guest's stages ran.
    first_active_tsc: Option<u64>,
    last_active_tsc: Option<u64>,
}

/// Grows `base` to `new` when the counter did not go backwards: returns the
/// growth, or counts a clamp and takes `new` as the baseline.
fn growth(base: &mut u64, new: u64, clamps: &mut u64) -> u64 {
    let d = new.checked_sub(*base).unwrap_or_else(|| {
        *clamps += 1;
        0
    });
    *base = new;
    d
}

impl CounterReader {
    /// Reads for registration `generation` of `num_vcpus` vCPUs, registered
    /// at host TSC `host_tsc` with the guest's `register_tsc` (0: unknown),
    /// guest TSC rate `tsc_khz` (kHz, 0: unknown); every block starts from
    /// zero, in no stage.
    pub fn new(
        generation: u64,
        num_vcpus: u32,
        register_tsc: u64,
        host_tsc: u64,
        tsc_khz: u64,
    ) -> Self {
        let clock = GuestClock::new(register_tsc, host_tsc);
        Self {
            generation,
            clock,
            max_raise: tsc_khz,
            raised: 0,
            last: vec![Baseline::fresh(); num_vcpus as usize],
            last_host_tsc: host_tsc,
            last_transition_tsc: None,
            first_active_tsc: None,
            last_active_tsc: None,
        }
    }

    /// The registration these reads belong to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Guest TSC span in which the guest made transitions (ticks), for
    /// rates in the report: from the start of the first read window with a
    /// transition to its last transition seen (or the end of the last
    /// window with one). Its resolution is a read window — a policy period
    /// — at the start.
    pub fn span_ticks(&self) -> u64 {
        let Some(first) = self.first_active_tsc else {
            return 0;
        };
        let last = match (self.last_transition_tsc, self.last_active_tsc) {
            (Some(t), Some(end)) if t >= first && t <= end => t,
            (_, Some(end)) => end,
            _ => first,
        };
        last.saturating_sub(first)
    }

    /// Turns `blocks` (one per vCPU, copied at host TSC `host_tsc`) into
    /// per-vCPU deltas since the previous read (since REGISTER for the
    /// first), and returns them with that window's length (ticks, from the
    /// host's TSC): every vCPU's ticks sum to it. Blocks past the vCPU
    /// count are ignored. Pure arithmetic: O(vCPUs × codes), never panics.
    pub fn update(&mut self, blocks: &[VcpuCounters], host_tsc: u64) -> (Vec<VcpuDelta>, u64) {
        // The window comes from the host's own clock: nothing the guest
        // writes lengthens it. A read older than the last one (cannot
        // happen while reads are serialised) changes nothing.
        let Some(elapsed) = host_tsc.checked_sub(self.last_host_tsc) else {
            return (
                vec![VcpuDelta::default(); blocks.len().min(self.last.len())],
                0,
            );
        };
        self.last_host_tsc = host_tsc;
        let window = if elapsed < 1 << 62 { elapsed } else { 0 };
        let latest = blocks
            .iter()
            .filter(|b| state_timed(b.state) && (state_code(b.state) as usize) < NUM_CODES)
            .map(|b| state_since(b.state))
            .max();
        let mut now = self.clock.now(host_tsc);
        let max_raise = if self.max_raise == 0 {
            window / SLACK_DIV
        } else {
            self.max_raise
        };
        match latest {
            // No calibration from REGISTER: the latest transition is the
            // best lower bound of "now".
            Some(l) if !self.clock.calibrated => {
                self.clock = GuestClock {
                    offset: l.wrapping_sub(host_tsc),
                    calibrated: true,
                };
                now = l;
            }
            // The REGISTER exit's latency made the estimate early.
            Some(l) if l > now && l - now <= max_raise => {
                self.clock.offset = self.clock.offset.wrapping_add(l - now);
                self.raised = self.raised.saturating_add(l - now);
                now = l;
            }
            _ => {}
        }
        if let Some(l) = latest.filter(|l| *l <= now) {
            self.last_transition_tsc = Some(self.last_transition_tsc.map_or(l, |t| t.max(l)));
        }
        let deltas: Vec<VcpuDelta> = blocks
            .iter()
            .zip(self.last.iter_mut())
            .map(|(block, base)| delta(base, block, now, window, self.raised))
            .collect();
        if deltas.iter().any(|d| d.counts.iter().any(|c| *c > 0)) {
            self.first_active_tsc
                .get_or_insert(now.saturating_sub(window));
            self.last_active_tsc = Some(now);
        }
        (deltas, window)
    }
}

/// One vCPU's delta against `base` (updated in place), `now` being the
/// guest TSC of this read, `window` the ticks since the previous one and
/// `raised` the clock's raises so far (ticks). The steps: the raw
/// counters' growth ([`counter_growth`]), each code's exact time
/// ([`exact_times`]), the bound on the totals since REGISTER
/// ([`bound_totals`]), and the window's split over the codes
/// ([`split_window`]); `clamps` is the sum of the clamps each counts.
fn delta(base: &mut Baseline, new: &VcpuCounters, now: u64, window: u64, raised: u64) -> VcpuDelta {
    let mut clamps = 0;
    let g = counter_growth(&mut base.raw, new, window, &mut clamps);
    let exact = exact_times(base, &g.cycles, new.state, now, window, &mut clamps);
    bound_totals(base, &exact, window, raised, &mut clamps);
    let current = state_code(new.state) as usize;
    let ticks = split_window(&g, &exact, &base.raw, current, window);
    VcpuDelta {
        ticks,
        counts: g.counts,
        migrations_in: g.migrations_in,
        migrations_out: g.migrations_out,
        clamps,
    }
}

/// What one vCPU's raw counters grew by in a window ([`counter_growth`]).
struct Growth {
    /// Per state code, transitions into it, at most one per tick.
    counts: [u64; NUM_CODES],
    /// Per state code, guest TSC ticks of the timed visits that ended.
    cycles: [u64; NUM_CODES],
    /// Per state code, timed visits that ended.
    timed: [u64; NUM_CODES],
    /// Per stage, migrations in, at most one per tick.
    migrations_in: [u64; MAX_STAGES],
    /// Per stage, migrations out, at most one per tick.
    migrations_out: [u64; MAX_STAGES],
}

/// The growth of every counter of `new` over `raw` (the last read's copy,
/// each field replaced by `new`'s), `window` the ticks since that read.
/// Counts a clamp for each counter that went backwards (it adds nothing:
/// [`growth`]) and for each count or migration count above the window's
/// ticks + 1/[`SLACK_DIV`] (cut to the window: at most one per tick);
/// `cycles` and `timed` are not cut here (the exact times are bounded on
/// their totals, [`bound_totals`]).
fn counter_growth(
    raw: &mut VcpuCounters,
    new: &VcpuCounters,
    window: u64,
    clamps: &mut u64,
) -> Growth {
    let mut g = Growth {
        counts: [0; NUM_CODES],
        cycles: [0; NUM_CODES],
        timed: [0; NUM_CODES],
        migrations_in: [0; MAX_STAGES],
        migrations_out: [0; MAX_STAGES],
    };
    for c in 0..NUM_CODES {
        let n = growth(&mut raw.counts[c], new.counts[c], clamps);
        g.counts[c] = one_per_tick(n, window, clamps);
        g.cycles[c] = growth(&mut raw.cycles[c], new.cycles[c], clamps);
        g.timed[c] = growth(&mut raw.timed[c], new.timed[c], clamps);
    }
    // Migrations are cut like the counts: a thread arrives or leaves at
    // most once per tick.
    for s in 0..MAX_STAGES {
        let m = growth(&mut raw.migrations_in[s], new.migrations_in[s], clamps);
        g.migrations_in[s] = one_per_tick(m, window, clamps);
        let m = growth(&mut raw.migrations_out[s], new.migrations_out[s], clamps);
        g.migrations_out[s] = one_per_tick(m, window, clamps);
    }
    g
}

/// `n` events in `window` ticks, or `window` (one per tick) with a clamp
/// counted when `n` is above the window + 1/[`SLACK_DIV`] of it.
fn one_per_tick(n: u64, window: u64, clamps: &mut u64) -> u64 {
    if n > window.saturating_add(window / SLACK_DIV) {
        *clamps += 1;
        window
    } else {
        n
    }
}

/// Per state code, the exact time of its timed visits in this window
/// (ticks, each ≥ 0): the visits that ended (`cycles`, this window's
/// growth), minus the open visit charged at the last read and the time
/// still owed, plus the open visit now ([`open_visit`] of the `state` word
/// at guest TSC `now`). `base`'s open visit and owed time are replaced by
/// this read's (see [`settle_owed`]). Counts the open visit's clamps.
/// i128: nothing a guest writes overflows it.
fn exact_times(
    base: &mut Baseline,
    cycles: &[u64; NUM_CODES],
    state: u64,
    now: u64,
    window: u64,
    clamps: &mut u64,
) -> [i128; NUM_CODES] {
    let mut exact = [0i128; NUM_CODES];
    for (e, c) in exact.iter_mut().zip(cycles) {
        *e = i128::from(*c);
    }
    if let Some((c, charged)) = base.open.take() {
        exact[c] -= i128::from(charged);
    }
    for (e, owed) in exact.iter_mut().zip(base.owed) {
        *e -= i128::from(owed);
    }
    base.open = open_visit(state, now, window, clamps);
    if let Some((code, open)) = base.open {
        exact[code] += i128::from(open);
    }
    settle_owed(&mut exact, &mut base.owed);
    exact
}

/// The open visit of the `state` word at guest TSC `now`: its code and the
/// ticks it has lasted (`now − since`, 0 for a `since` up to `window` ticks
/// after `now`), for a timed visit; none for an untimed one. Counts a clamp,
/// and gives none, for a code out of range (timed or not) or a timed visit
/// that started more than `window` ticks after `now`.
fn open_visit(state: u64, now: u64, window: u64, clamps: &mut u64) -> Option<(usize, u64)> {
    let code = state_code(state) as usize;
    let since = state_since(state);
    if code >= NUM_CODES {
        *clamps += 1;
    } else if state_timed(state) {
        if since > now.saturating_add(window) {
            *clamps += 1;
        } else {
            return Some((code, now.saturating_sub(since)));
        }
    }
    None
}

/// Settles each code's `exact` time (ticks) against what it owes: a
/// negative time becomes 0 and its magnitude the code's new `owed`
/// (saturating at `u64::MAX`), else `owed` is 0. No clamp: a short time is
/// no lie.
///
/// A visit charged as open at an earlier read whose length is not in
/// `cycles` yet — a copy torn by a transition in flight, or a writer
/// preempted between its state word and its adds (libstage, any number of
/// reads long) — leaves its code short now: what is short is owed and
/// taken back from the reads that see the length, instead of being counted
/// twice. The time moves to the window where the adds land.
fn settle_owed(exact: &mut [i128; NUM_CODES], owed: &mut [u64; NUM_CODES]) {
    for (e, owed) in exact.iter_mut().zip(owed.iter_mut()) {
        *owed = if *e < 0 {
            u64::try_from(-*e).unwrap_or(u64::MAX)
        } else {
            0
        };
        *e = (*e).max(0);
    }
}

/// Adds this `window`'s ticks to `base.elapsed` and each code's `exact`
/// time (ticks, ≥ 0) to its total since REGISTER, and bounds the totals by
/// the windows' sum + 1/[`SLACK_DIV`] of it + `raised` (the clock's
/// raises, ticks): each total above it counts one clamp and is cut to it.
///
/// Late adds move time between windows, so a code's time above one window
/// is no proof of a lie; above all the windows since REGISTER it is. Not
/// for "no stage": its first visit began when the agent set the block up,
/// before REGISTER.
fn bound_totals(
    base: &mut Baseline,
    exact: &[i128; NUM_CODES],
    window: u64,
    raised: u64,
    clamps: &mut u64,
) {
    base.elapsed += u128::from(window);
    let bound = base.elapsed + base.elapsed / u128::from(SLACK_DIV) + u128::from(raised);
    for (total, e) in base
        .exact_total
        .iter_mut()
        .zip(exact)
        .skip(CODE_IDLE as usize)
    {
        *total = total.saturating_add(*e as u128);
        if *total > bound {
            *clamps += 1;
            *total = bound;
        }
    }
}

/// Splits the `window` (ticks) over the state codes: per code, its ticks,
/// summing to `window`. Idle gets its `exact` time (cut to the window);
/// the rest, the busy time, goes to the stages by [`stage_estimates`] and
/// [`share_busy`], `current` being the state word's code (any value). The
/// run's counters `run` (after this read) give the stages' mean visit when
/// the window timed none. Counts no clamp: every cut here is an estimate's.
fn split_window(
    g: &Growth,
    exact: &[i128; NUM_CODES],
    run: &VcpuCounters,
    current: usize,
    window: u64,
) -> [u64; NUM_CODES] {
    let mut ticks = [0u64; NUM_CODES];
    let idle_code = CODE_IDLE as usize;
    let idle = exact[idle_code].clamp(0, i128::from(window)) as u64;
    ticks[idle_code] = idle;
    let busy = window - idle;
    let est = stage_estimates(g, exact, run, busy);
    share_busy(&mut ticks, &g.counts, &est, current, busy);
    ticks
}

/// Each stage's time estimate (ticks; 0 for idle and "no stage"): its
/// `exact` time in the window plus its untimed visits (entries − timed
/// visits, from `g`) at the mean length of its timed visits (ticks: this
/// window's, else the whole `run`'s, else 0), at most `busy` each.
fn stage_estimates(
    g: &Growth,
    exact: &[i128; NUM_CODES],
    run: &VcpuCounters,
    busy: u64,
) -> [u128; NUM_CODES] {
    let mut est = [0u128; NUM_CODES];
    for c in CODE_FIRST_STAGE as usize..NUM_CODES {
        let mean = if g.timed[c] > 0 {
            u128::from(g.cycles[c]) / u128::from(g.timed[c])
        } else if run.timed[c] > 0 {
            u128::from(run.cycles[c]) / u128::from(run.timed[c])
        } else {
            0
        };
        let untimed = u128::from(g.counts[c].saturating_sub(g.timed[c]));
        // At most the busy time each (< 2^62 ticks): the sum and the
        // scaling products in `share_busy` stay far inside u128.
        est[c] = (exact[c].max(0) as u128)
            .saturating_add(mean.saturating_mul(untimed))
            .min(u128::from(busy));
    }
    est
}

/// Adds the `busy` ticks to `ticks` (per state code) by the stages'
/// estimates `est` (ticks, each ≤ `busy`):
/// * nothing entered (every `counts` 0) and nothing estimated: all to the
///   `current` code — the whole window was the current visit — or to "no
///   stage" when that code is idle or out of range;
/// * more estimated than `busy`: the stages scaled to it, the division's
///   remainder to the largest estimate;
/// * else each stage its estimate and "no stage" the rest (its visits
///   include the odd very long one — the wait from REGISTER to the first
///   switch, a thread blocked between requests — whose mean would wrongly
///   scale its untimed ones).
fn share_busy(
    ticks: &mut [u64; NUM_CODES],
    counts: &[u64; NUM_CODES],
    est: &[u128; NUM_CODES],
    current: usize,
    busy: u64,
) {
    let stages = CODE_FIRST_STAGE as usize..NUM_CODES;
    let total: u128 = est.iter().sum();
    let none = CODE_NONE as usize;
    if counts.iter().all(|n| *n == 0) && total == 0 {
        let c = if current < NUM_CODES && current != CODE_IDLE as usize {
            current
        } else {
            none
        };
        ticks[c] += busy;
    } else if total > u128::from(busy) {
        let mut given = 0;
        for c in stages.clone() {
            let t = (u128::from(busy) * est[c] / total) as u64;
            ticks[c] += t;
            given += t;
        }
        let largest = stages.max_by_key(|c| est[*c]).unwrap_or(none);
        ticks[largest] += busy - given;
    } else {
        for c in stages {
            ticks[c] += est[c] as u64;
        }
        ticks[none] += busy - total as u64;
    }
}

#[cfg(test)]
mod tests;
