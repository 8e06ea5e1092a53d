//! Minor 2: per-vCPU stage counters, the channel's load signal.
//!
//! Each vCPU has one [`VcpuCounters`] block (768 bytes, twelve cache
//! lines) that only code running on that vCPU writes. A stage switch is a
//! *transition* of the vCPU's state: the new state's `counts` goes up by
//! one and the state word ([`VcpuCounters::state`]: the state's code, a
//! "timed" flag and a TSC, in one word) is replaced ([`transition`]). The
//! host reads every block once per policy period and takes deltas; it never
//! waits for the guest and the guest never waits for it. The seeds' own
//! mechanism kept stage load in the guest kernel and read it once per
//! allocation period, not per event (seed 000, OSv, §4.5).
//!
//! **Timed visits.** Reading the TSC is the one costly part of a transition:
//! measured in the test guest's i-cache-bound footprint workload, one
//! `rdtsc` costs 35–43 ns in context against 8 ns in a tight loop
//! (bench/RESULTS.md, "The stage channel"). So only some visits are timed:
//! the agents pace them to about one per vCPU every [`TIMED_INTERVAL_NS`]
//! (a stride of transitions measured from the switch rate, at most
//! [`TIMED_STRIDE_MAX`]), or one in [`TIMED_EVERY`] when the host gives no
//! TSC rate. A timed visit's TSC is the state word's `since`, and the
//! transition that ends it adds its length to `cycles` and one to `timed`;
//! idle visits are always timed. The other transitions read no clock. The
//! host gives each stage its timed time plus its untimed entries at its
//! mean timed length, "no stage" the rest of the busy time
//! (docs/stage-protocol.md §5a): exact counts, exact idle time, and a
//! sampled split of busy time — two TSC reads per ~16 µs per vCPU.
//!
//! Codes: [`CODE_NONE`] (in no stage: between requests, and the state an
//! agent starts each vCPU in), [`CODE_IDLE`] (nothing to run), and
//! [`stage_code`]`(s)` = 2 + *s* for stage *s*, so `cycles`, `timed` and
//! `counts` are indexed the same way for every kind of transition.
//!
//! Writers: a single writer per vCPU (the Rust agent's one cooperative
//! context per vCPU) may use plain loads and stores. Several writers per
//! vCPU (Linux threads sharing a CPU) replace the state word inside one
//! restartable sequence or a lock and add to the counters with atomic
//! read-modify-writes (`guest-agent/linux/README.md`).

use super::MAX_STAGES;

/// Low bits of [`VcpuCounters::state`] that hold the state's code.
pub const STATE_CODE_BITS: u32 = 5;
/// Mask of the code bits of a state word.
pub const STATE_CODE_MASK: u64 = (1 << STATE_CODE_BITS) - 1;
/// State-word flag: the current visit is timed (`since` is its start).
pub const STATE_TIMED: u64 = 1 << STATE_CODE_BITS;
/// First guest-private bit of a state word: bit 6 of every state word, and
/// bits 6–63 of an untimed one, are the guest's own (the Rust agent keeps
/// its countdown to the next timed visit and its trace flag there, so the
/// common transition is one load and one store of the state); the host
/// reads only the code and the timed flag of an untimed state.
pub const STATE_PRIVATE_SHIFT: u32 = STATE_CODE_BITS + 1;
/// Low bits of a state word that are not a timed state's TSC: code, flag
/// and the private bit. The TSC is kept with these bits cleared (a 128-tick
/// granule, ~50 ns at 2.6 GHz).
pub const STATE_LOW_MASK: u64 = (1 << (STATE_PRIVATE_SHIFT + 1)) - 1;
/// State code: in no stage (a request ended; also a fresh block: all zero).
pub const CODE_NONE: u32 = 0;
/// State code: the vCPU has nothing to run (its time is idle time; idle
/// visits are always timed).
pub const CODE_IDLE: u32 = 1;
/// State code of stage 0; stage *s* is `CODE_FIRST_STAGE + s`.
pub const CODE_FIRST_STAGE: u32 = 2;
/// Number of state codes: none, idle and one per stage.
pub const NUM_CODES: usize = CODE_FIRST_STAGE as usize + MAX_STAGES;
const _: () = assert!(NUM_CODES as u64 <= STATE_CODE_MASK + 1);
/// The fixed stride of timed visits when an agent cannot pace them by time
/// (the guest TSC's rate is unknown): one transition in 61 starts a timed
/// visit (a prime, so a workload whose transitions repeat with a period
/// that is not a multiple of 61 — every one in practice — has each of its
/// positions timed in turn: no aliasing).
pub const TIMED_EVERY: u64 = 61;
/// The agents' pace of timed visits when the TSC rate is known: about one
/// timed visit per vCPU every 16 µs, whatever the switch rate (~1,250 per
/// 20 ms policy period; two TSC reads per 16 µs cost < 0.5 % at 40 ns a
/// read), with the stride capped at [`TIMED_STRIDE_MAX`].
pub const TIMED_INTERVAL_NS: u64 = 16_000;
/// Largest stride of paced timed visits.
pub const TIMED_STRIDE_MAX: u64 = 1021;

/// The state code of stage `stage` (< [`MAX_STAGES`]).
pub const fn stage_code(stage: u32) -> u32 {
    CODE_FIRST_STAGE + stage
}

/// A state word: `code` (< [`NUM_CODES`]) since guest TSC `tsc`, `timed`
/// when the visit is timed.
pub const fn state_word(tsc: u64, code: u32, timed: bool) -> u64 {
    (tsc & !STATE_LOW_MASK) | if timed { STATE_TIMED } else { 0 } | (code as u64 & STATE_CODE_MASK)
}

/// The code of a state word (may be ≥ [`NUM_CODES`] in a forged word).
pub const fn state_code(state: u64) -> u32 {
    (state & STATE_CODE_MASK) as u32
}

/// Whether the state word's visit is timed.
pub const fn state_timed(state: u64) -> bool {
    state & STATE_TIMED != 0
}

/// The TSC since when a timed state holds (granule cleared; meaningless for
/// an untimed one).
pub const fn state_since(state: u64) -> u64 {
    state & !STATE_LOW_MASK
}

/// An untimed state word: `code` with the guest-private value `private`
/// (its low 58 bits) in bits 6–63.
pub const fn untimed_state(private: u64, code: u32) -> u64 {
    (private << STATE_PRIVATE_SHIFT) | (code as u64 & STATE_CODE_MASK)
}

/// The guest-private value of an untimed state word (bits 6–63).
pub const fn state_private(state: u64) -> u64 {
    state >> STATE_PRIVATE_SHIFT
}

/// One vCPU's counters (768 bytes), written only by code running on that
/// vCPU, read by the host once per policy period. All counters are totals
/// since REGISTER; the host takes deltas.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VcpuCounters {
    /// The current state: [`state_word`]`(since, code, timed)`, or for an
    /// untimed visit [`untimed_state`]`(private, code)`. Replaced last in
    /// every transition.
    pub state: u64,
    /// Guest-private (the agents' countdown to the next timed visit; the
    /// host never reads it).
    pub countdown: u64,
    /// Per code, guest TSC ticks of the timed visits that ended:
    /// `cycles[CODE_IDLE]` is all idle time, `cycles[stage_code(s)]` the
    /// timed visits of stage *s*.
    pub cycles: [u64; NUM_CODES],
    /// Per code, timed visits that ended.
    pub timed: [u64; NUM_CODES],
    /// Per code, transitions into it: `counts[stage_code(s)]` entries of
    /// stage *s*, `counts[CODE_NONE]` requests completed (`stage_exit`),
    /// `counts[CODE_IDLE]` times the vCPU went idle.
    pub counts: [u64; NUM_CODES],
    /// Per stage, threads that entered it on this vCPU coming from another
    /// vCPU (thread migrations into the stage, counted where they arrive).
    pub migrations_in: [u64; MAX_STAGES],
    /// Per stage, threads that arrived on this vCPU from another one right
    /// after leaving that stage (counted where they arrive, so the block
    /// keeps a single writer).
    pub migrations_out: [u64; MAX_STAGES],
    /// Guest-private: the agent's pacing of timed visits (the Rust agent:
    /// the TSC of the last paced start and the stride since); the host
    /// never reads them.
    pub agent: [u64; 2],
    /// Reserved, 0 (pads the block to six 128-byte line pairs, so adjacent
    /// blocks never share one).
    pub reserved: [u64; 6],
}

impl Default for VcpuCounters {
    fn default() -> Self {
        Self {
            state: 0,
            countdown: 0,
            cycles: [0; NUM_CODES],
            timed: [0; NUM_CODES],
            counts: [0; NUM_CODES],
            migrations_in: [0; MAX_STAGES],
            migrations_out: [0; MAX_STAGES],
            agent: [0; 2],
            reserved: [0; 6],
        }
    }
}

/// Offset of [`VcpuCounters::countdown`] in the block.
pub const COUNTERS_COUNTDOWN_OFFSET: u64 = core::mem::offset_of!(VcpuCounters, countdown) as u64;
/// Offset of [`VcpuCounters::cycles`] in the block.
pub const COUNTERS_CYCLES_OFFSET: u64 = core::mem::offset_of!(VcpuCounters, cycles) as u64;
/// Offset of [`VcpuCounters::timed`] in the block.
pub const COUNTERS_TIMED_OFFSET: u64 = core::mem::offset_of!(VcpuCounters, timed) as u64;
/// Offset of [`VcpuCounters::counts`] in the block.
pub const COUNTERS_COUNTS_OFFSET: u64 = core::mem::offset_of!(VcpuCounters, counts) as u64;
/// Offset of [`VcpuCounters::migrations_in`] in the block.
pub const COUNTERS_MIGRATIONS_IN_OFFSET: u64 =
    core::mem::offset_of!(VcpuCounters, migrations_in) as u64;
/// Offset of [`VcpuCounters::migrations_out`] in the block.
pub const COUNTERS_MIGRATIONS_OUT_OFFSET: u64 =
    core::mem::offset_of!(VcpuCounters, migrations_out) as u64;
/// Offset of [`VcpuCounters::agent`] in the block.
pub const COUNTERS_AGENT_OFFSET: u64 = core::mem::offset_of!(VcpuCounters, agent) as u64;

const _: () = assert!(core::mem::size_of::<VcpuCounters>() == 768);
const _: () = assert!(COUNTERS_COUNTDOWN_OFFSET == 8);
const _: () = assert!(COUNTERS_CYCLES_OFFSET == 16);
const _: () = assert!(COUNTERS_TIMED_OFFSET == 160);
const _: () = assert!(COUNTERS_COUNTS_OFFSET == 304);
const _: () = assert!(COUNTERS_MIGRATIONS_IN_OFFSET == 448);
const _: () = assert!(COUNTERS_MIGRATIONS_OUT_OFFSET == 576);

/// Whether the transition from state word `state` into `code`, with
/// `countdown` transitions left before the next timed visit, needs the TSC:
/// it ends a timed visit, or starts one (the countdown ran out, or the vCPU
/// goes idle).
pub const fn needs_tsc(state: u64, countdown: u64, code: u32) -> bool {
    state_timed(state) || countdown == 0 || code == CODE_IDLE
}

/// What one transition does to a block (pure; the agents apply it with
/// plain or atomic operations, the host's tests model guests with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// A timed visit that ended: its code and length in ticks (0 when the
    /// TSC went backwards); `cycles[code]` grows by the length and
    /// `timed[code]` by one.
    pub ended: Option<(u32, u64)>,
    /// Code whose `counts` grows by one (the state entered).
    pub new_code: u32,
    /// The new state word.
    pub state: u64,
    /// The new countdown.
    pub countdown: u64,
}

/// The transition from state word `state` into `code`, with `countdown`
/// transitions left before a timed visit; when the countdown runs out here
/// the next one is `every − 1` (a stride of `every` ≥ 1; 1 times every
/// visit). `tsc` is the guest TSC, read only when [`needs_tsc`] says so
/// (any value otherwise: it is not used). A forged old code (≥
/// [`NUM_CODES`]) is reported as is: the writer skips its `cycles`.
pub const fn transition(state: u64, countdown: u64, code: u32, tsc: u64, every: u64) -> Transition {
    let ended = if state_timed(state) {
        let len = (tsc & !STATE_LOW_MASK).saturating_sub(state_since(state));
        Some((state_code(state), len))
    } else {
        None
    };
    let start = countdown == 0 || code == CODE_IDLE;
    Transition {
        ended,
        new_code: code,
        state: if start {
            state_word(tsc, code, true)
        } else {
            state_word(0, code, false)
        },
        countdown: if countdown == 0 {
            every.saturating_sub(1)
        } else {
            countdown - 1
        },
    }
}

impl VcpuCounters {
    /// Applies `t` (what a single writer does, in this order: `cycles` and
    /// `timed`, `counts`, the countdown, then the state word).
    pub fn apply(&mut self, t: &Transition) {
        if let Some((code, len)) = t.ended {
            if let Some(c) = self.cycles.get_mut(code as usize) {
                *c = c.wrapping_add(len);
            }
            if let Some(c) = self.timed.get_mut(code as usize) {
                *c = c.wrapping_add(1);
            }
        }
        if let Some(c) = self.counts.get_mut(t.new_code as usize) {
            *c = c.wrapping_add(1);
        }
        self.countdown = t.countdown;
        self.state = t.state;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_word_round_trips() {
        let w = state_word(0x1234_5678_9abc, stage_code(3), true);
        assert_eq!(state_code(w), 5);
        assert!(state_timed(w));
        assert_eq!(state_since(w), 0x1234_5678_9abc & !STATE_LOW_MASK);
        assert_eq!(state_code(0), CODE_NONE);
        assert!(!state_timed(state_word(5000, CODE_NONE, false)));
    }

    /// Runs `codes` through a block with stride `every`, a transition every
    /// 1024 ticks; returns the block and the number of TSC reads.
    fn run(codes: &[u32], every: u64) -> (VcpuCounters, usize) {
        let mut c = VcpuCounters {
            state: state_word(0, CODE_NONE, false),
            countdown: every - 1,
            ..Default::default()
        };
        let mut reads = 0;
        for (i, code) in codes.iter().enumerate() {
            let tsc = 1024 * (i as u64 + 1);
            if needs_tsc(c.state, c.countdown, *code) {
                reads += 1;
            }
            c.apply(&transition(c.state, c.countdown, *code, tsc, every));
        }
        (c, reads)
    }

    #[test]
    fn every_visit_timed_with_a_stride_of_one() {
        let codes = [
            stage_code(0),
            stage_code(1),
            CODE_NONE,
            CODE_IDLE,
            stage_code(0),
        ];
        let (c, reads) = run(&codes, 1);
        assert_eq!(reads, 5);
        for code in [stage_code(0), stage_code(1), CODE_NONE, CODE_IDLE] {
            assert_eq!(c.timed[code as usize], 1, "code {code}");
            assert_eq!(c.cycles[code as usize], 1024);
        }
        assert_eq!(c.counts[stage_code(0) as usize], 2);
        assert_eq!(state_code(c.state), stage_code(0));
    }

    #[test]
    fn a_stride_times_one_visit_in_61_and_every_idle_one() {
        // 3 transitions per request (period 3, coprime to 61).
        let pattern = [stage_code(0), stage_code(1), CODE_NONE];
        let codes: [u32; 61 * 30 + 1] = core::array::from_fn(|i| pattern[i % 3]);
        let (c, reads) = run(&codes, TIMED_EVERY);
        assert_eq!(reads, 60, "2 reads per timed visit");
        // Each position of the pattern is timed in turn.
        for code in pattern {
            assert_eq!(c.timed[code as usize], 10, "code {code}");
            assert_eq!(c.cycles[code as usize], 10 * 1024);
        }
        assert_eq!(c.counts[stage_code(0) as usize], 611);
        let (c, _) = run(&[stage_code(0), CODE_IDLE, stage_code(0)], TIMED_EVERY);
        assert_eq!(
            (c.timed[CODE_IDLE as usize], c.cycles[CODE_IDLE as usize]),
            (1, 1024)
        );
    }

    #[test]
    fn a_tsc_going_backwards_adds_nothing() {
        let t = transition(state_word(5000, stage_code(0), true), 3, CODE_NONE, 10, 61);
        assert_eq!(t.ended, Some((stage_code(0), 0)));
    }
}
