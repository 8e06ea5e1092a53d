//! The counter rules against a modelled guest (`VcpuCounters::apply`, the
//! single-writer update the Rust agent makes) and against garbage.

use hypercall_abi::stage::{
    needs_tsc, stage_code, state_word, transition, VcpuCounters, CODE_IDLE, CODE_NONE, NUM_CODES,
    STATE_LOW_MASK, TIMED_EVERY,
};
use proptest::prelude::*;

use super::*;

/// A guest vCPU: its block, its stride of timed visits, and the TSC of its
/// transitions (the host's TSC plus `OFFSET`, as under KVM).
struct Guest {
    block: VcpuCounters,
    every: u64,
    /// TSC reads made (the cost the stride saves).
    reads: u64,
}

const OFFSET: u64 = 1 << 40;
const REGISTER_HOST: u64 = 1_000_000;

impl Guest {
    fn new(every: u64) -> Self {
        Self {
            block: VcpuCounters {
                state: state_word(REGISTER_HOST + OFFSET, CODE_NONE, true),
                ..Default::default()
            },
            every,
            reads: 0,
        }
    }
    /// A transition into `code` at host TSC `host`.
    fn at(&mut self, host: u64, code: u32) {
        let b = &mut self.block;
        if needs_tsc(b.state, b.countdown, code) {
            self.reads += 1;
        }
        let t = transition(b.state, b.countdown, code, host + OFFSET, self.every);
        b.apply(&t);
    }
}

impl CounterReader {
    /// [`CounterReader::update`]'s deltas alone.
    fn update_deltas(&mut self, blocks: &[VcpuCounters], host_tsc: u64) -> Vec<VcpuDelta> {
        self.update(blocks, host_tsc).0
    }
}

fn reader(vcpus: u32) -> CounterReader {
    CounterReader::new(1, vcpus, REGISTER_HOST + OFFSET, REGISTER_HOST, 2_000_000)
}

/// Ticks of `code` in a delta, allowing the 128-tick state granule.
fn near(got: u64, want: u64) -> bool {
    got.abs_diff(want) <= 2 * (STATE_LOW_MASK + 1)
}

#[test]
fn every_visit_timed_splits_windows_exactly_including_open_visits() {
    let mut g = Guest::new(1);
    let mut r = reader(1);
    let w = 1_000_000; // one window = 1 M ticks
    let t0 = REGISTER_HOST;
    g.at(t0 + 100_000, stage_code(0));
    g.at(t0 + 400_000, stage_code(1));
    // A long visit of stage 1: open across the end of the first window.
    let d = r.update_deltas(&[g.block], t0 + w);
    let d = &d[0];
    assert_eq!(d.clamps, 0);
    assert!(near(d.ticks[CODE_NONE as usize], 100_000), "{d:?}");
    assert!(near(d.ticks[stage_code(0) as usize], 300_000));
    assert!(
        near(d.ticks[stage_code(1) as usize], 600_000),
        "open part charged now"
    );
    assert_eq!(d.counts[stage_code(0) as usize], 1);
    assert_eq!(d.ticks.iter().sum::<u64>(), w);
    // Second window: stage 1 goes on for 500 k more, then idle.
    g.at(t0 + w + 500_000, CODE_IDLE);
    let d = r.update_deltas(&[g.block], t0 + 2 * w);
    let d = &d[0];
    assert_eq!(d.clamps, 0);
    assert!(near(d.ticks[stage_code(1) as usize], 500_000), "{d:?}");
    assert!(near(d.ticks[CODE_IDLE as usize], 500_000));
    assert_eq!(d.counts[CODE_IDLE as usize], 1);
    // A whole window idle.
    let d = r.update_deltas(&[g.block], t0 + 3 * w);
    assert!(near(d[0].ticks[CODE_IDLE as usize], w));
    assert!(r.span_ticks() > 0);
}

#[test]
fn a_sampled_split_is_close_and_idle_is_exact() {
    // Stage 0 visits last 3× as long as stage 1's; 2 vCPUs; the default
    // stride; idle stretches are exact.
    let mut g = [Guest::new(TIMED_EVERY), Guest::new(TIMED_EVERY)];
    let mut r = reader(2);
    let mut host = [REGISTER_HOST; 2];
    let mut transitions = 0u64;
    for window in 1..=5u64 {
        let end = REGISTER_HOST + window * 10_000_000;
        for (v, g) in g.iter_mut().enumerate() {
            let mut i = 0u64;
            while host[v] + 4000 < end - 2_000_000 {
                // A request: 3000 ticks in stage 0, 1000 in stage 1, 40 in none.
                g.at(host[v], stage_code(0));
                g.at(host[v] + 3000, stage_code(1));
                g.at(host[v] + 4000, CODE_NONE);
                host[v] += 4040 + (i % 7) * 3;
                i += 1;
                transitions += 3;
            }
            // Then idle until 1 M ticks before the window ends... and back.
            g.at(host[v], CODE_IDLE);
            host[v] = end - 1_000_000;
            g.at(host[v], stage_code(0));
        }
        let d = r.update_deltas(&[g[0].block, g[1].block], end);
        for d in &d {
            assert_eq!(d.clamps, 0, "{d:?}");
            assert_eq!(d.ticks.iter().sum::<u64>(), 10_000_000, "window {window}");
            let (s0, s1) = (
                d.ticks[stage_code(0) as usize] as f64,
                d.ticks[stage_code(1) as usize] as f64,
            );
            // Stage 0 holds ~3/4 of the busy time (the last 1 M ticks of
            // each window are stage 0 too).
            let share = s0 / (s0 + s1);
            assert!(
                (0.70..0.84).contains(&share),
                "window {window}: share {share}"
            );
        }
    }
    // Two TSC reads per 61 transitions, plus the idle visits'.
    let reads: u64 = g.iter().map(|g| g.reads).sum();
    assert!(
        reads < transitions / 20,
        "{reads} reads for {transitions} transitions"
    );
}

#[test]
fn a_long_untimed_visit_gets_its_windows() {
    let mut g = Guest::new(TIMED_EVERY);
    let mut r = reader(1);
    let w = 1_000_000;
    // Count down to a visit that is not timed, then stay in it.
    g.block.countdown = 5;
    g.at(REGISTER_HOST + 10, stage_code(3));
    assert!(!hypercall_abi::stage::state_timed(g.block.state));
    r.update_deltas(&[g.block], REGISTER_HOST + w);
    for k in 2..5 {
        let d = r.update_deltas(&[g.block], REGISTER_HOST + k * w);
        assert_eq!(d[0].ticks[stage_code(3) as usize], w, "{d:?}");
    }
}

#[test]
fn impossible_values_are_clamped_and_counted() {
    let mut g = Guest::new(1);
    let mut r = reader(1);
    let w = 1_000_000;
    g.at(REGISTER_HOST + 10, stage_code(2));
    let d = r.update_deltas(&[g.block], REGISTER_HOST + w);
    assert_eq!(d[0].clamps, 0);
    // Idle ten windows long in one window: cut to the window.
    g.block.cycles[CODE_IDLE as usize] += 10 * w;
    let d = r.update_deltas(&[g.block], REGISTER_HOST + 2 * w);
    assert!(d[0].clamps >= 1);
    assert!(d[0].ticks.iter().all(|t| *t <= w));
    assert_eq!(d[0].ticks.iter().sum::<u64>(), w);
    // A counter that goes backwards adds nothing; the next window is clean.
    g.block.counts[stage_code(2) as usize] = 0;
    let d = r.update_deltas(&[g.block], REGISTER_HOST + 3 * w);
    assert!(d[0].clamps >= 1);
    assert_eq!(d[0].counts[stage_code(2) as usize], 0);
    g.at(REGISTER_HOST + 3 * w + 5, stage_code(2));
    let d = r.update_deltas(&[g.block], REGISTER_HOST + 4 * w);
    assert_eq!(d[0].clamps, 0, "{d:?}");
    assert_eq!(d[0].counts[stage_code(2) as usize], 1);
    // A state code out of range: no open visit, counted.
    g.block.state = state_word(REGISTER_HOST + OFFSET + 4 * w, 31, true);
    let d = r.update_deltas(&[g.block], REGISTER_HOST + 5 * w);
    assert!(d[0].clamps >= 1);
    // A timed state far in the future: no open visit, counted, clock unmoved.
    g.block.state = state_word(u64::MAX - 64, stage_code(0), true);
    let d = r.update_deltas(&[g.block], REGISTER_HOST + 6 * w);
    assert!(d[0].clamps >= 1);
    assert!(d[0].ticks.iter().sum::<u64>() <= w);
}

#[test]
fn an_uncalibrated_clock_takes_the_latest_timed_transition() {
    let mut g = Guest::new(1);
    let mut r = CounterReader::new(1, 1, 0, REGISTER_HOST, 0);
    g.at(REGISTER_HOST + 500, stage_code(0));
    let d = r.update_deltas(&[g.block], REGISTER_HOST + 1000);
    assert_eq!(d[0].clamps, 0);
    g.at(REGISTER_HOST + 1500, stage_code(1));
    let d = r.update_deltas(&[g.block], REGISTER_HOST + 2000);
    assert_eq!(d[0].clamps, 0, "{d:?}");
    assert!(near(d[0].ticks[stage_code(0) as usize], 1000));
}

#[test]
fn an_early_clock_is_raised_by_a_later_state() {
    // The guest's register_tsc was read 5,000 ticks before the host's TSC
    // at the exit (a slow exit): states look 5 k ticks in the future.
    let mut r = CounterReader::new(
        1,
        1,
        REGISTER_HOST + OFFSET - 5000,
        REGISTER_HOST,
        2_000_000,
    );
    let mut g = Guest::new(1);
    g.at(REGISTER_HOST + 100_000, stage_code(0));
    let d = r.update_deltas(&[g.block], REGISTER_HOST + 100_000);
    assert_eq!(d[0].clamps, 0);
    g.at(REGISTER_HOST + 300_000, stage_code(1));
    let d = r.update_deltas(&[g.block], REGISTER_HOST + 400_000);
    assert_eq!(d[0].clamps, 0);
    assert!(near(d[0].ticks[stage_code(0) as usize], 200_000), "{d:?}");
    assert!(near(d[0].ticks[stage_code(1) as usize], 100_000), "{d:?}");
}

fn any_block() -> impl Strategy<Value = VcpuCounters> {
    (
        any::<u64>(),
        prop::array::uniform16(any::<u64>()),
        prop::array::uniform16(any::<u64>()),
        prop::array::uniform2(any::<u64>()),
    )
        .prop_map(|(state, a, b, extra)| {
            let mut c = VcpuCounters {
                state,
                ..Default::default()
            };
            c.cycles[..16].copy_from_slice(&a);
            c.cycles[16..].copy_from_slice(&extra);
            c.timed[..16].copy_from_slice(&b);
            c.counts[..16].copy_from_slice(&b);
            c.counts[16..].copy_from_slice(&extra);
            c.migrations_in = a;
            c.migrations_out = b;
            c
        })
}

proptest! {
    /// Whatever a guest writes: no panic, and no vCPU gets more time than
    /// the window, or counts above the window and its slack.
    #[test]
    fn garbage_is_bounded(
        blocks in prop::collection::vec(prop::collection::vec(any_block(), 2), 1..6),
        steps in prop::collection::vec(0u64..10_000_000, 6),
        register_tsc in any::<u64>(),
    ) {
        let mut r = CounterReader::new(1, 2, register_tsc, 5, 1000);
        let mut host = 5u64;
        for (b, step) in blocks.iter().zip(&steps) {
            host += step;
            for d in r.update_deltas(b, host) {
                prop_assert!(d.ticks.iter().sum::<u64>() <= *step);
                prop_assert!(d.counts.iter().all(|c| *c <= step + step / SLACK_DIV));
                prop_assert!(d.migrations_in.iter().chain(&d.migrations_out).all(|c| *c <= step + step / SLACK_DIV));
                prop_assert_eq!(d.ticks.len(), NUM_CODES);
            }
        }
    }
}

#[test]
fn a_long_wait_before_the_first_switch_does_not_skew_the_stages() {
    // REGISTER's timed "no stage" visit lasts 5 M ticks (the guest did other
    // work first), then 3,000 requests of 300 ticks in stage 0 and 100 in
    // stage 1, sampled: the stages get their ~0.9 M and ~0.3 M ticks, not a
    // share diluted by the long wait's mean.
    let mut g = Guest::new(TIMED_EVERY);
    let mut r = reader(1);
    let mut host = REGISTER_HOST + 5_000_000;
    for _ in 0..3000 {
        g.at(host, stage_code(0));
        g.at(host + 300, stage_code(1));
        g.at(host + 400, CODE_NONE);
        host += 410;
    }
    let d = r.update_deltas(&[g.block], host);
    let (s0, s1) = (
        d[0].ticks[stage_code(0) as usize],
        d[0].ticks[stage_code(1) as usize],
    );
    eprintln!("stage 0 {s0} ticks, stage 1 {s1} ticks");
    assert_eq!(d[0].clamps, 0);
    assert!((800_000..1_000_000).contains(&s0), "{d:?}");
    assert!((250_000..350_000).contains(&s1), "{d:?}");
}

#[test]
fn a_visit_whose_end_is_read_late_is_charged_once() {
    // Idle from t0 + 100k, open at the first read (charged 900k); it ends
    // at 1.5 M. The second read sees the new state but not yet the idle
    // visit's length in `cycles` (libstage stores the state word first, or
    // a torn copy): the charge is owed, and the third read, which sees the
    // length, takes it back once. Over the three windows idle is exact.
    let mut g = Guest::new(1);
    let mut r = reader(1);
    let w = 1_000_000;
    let t0 = REGISTER_HOST;
    g.at(t0 + 100_000, CODE_IDLE);
    let first = r.update_deltas(&[g.block], t0 + w);
    let before = g.block;
    g.at(t0 + 1_500_000, stage_code(0));
    let mut torn = g.block;
    torn.cycles = before.cycles;
    torn.timed = before.timed;
    let second = r.update_deltas(&[torn], t0 + 2 * w);
    let third = r.update_deltas(&[g.block], t0 + 3 * w);
    let idle: u64 = [&first, &second, &third]
        .iter()
        .map(|d| d[0].ticks[CODE_IDLE as usize])
        .sum();
    assert!(near(idle, 1_400_000), "idle {idle}");
    for d in [&first, &second, &third] {
        assert_eq!(d[0].clamps, 0, "{d:?}");
        assert_eq!(d[0].ticks.iter().sum::<u64>(), w);
    }
}

#[test]
fn a_writer_preempted_for_several_reads_shifts_time_but_is_not_a_lie() {
    // Stage 0 from t0 + 100 k, open across the first read. At 1.5 M a
    // thread enters stage 1 and is preempted between the state word and
    // its adds (libstage on a loaded host) until after the fourth read;
    // other threads on the vCPU switch on meanwhile with their adds landed.
    // The stage-0 visit (1.4 M ticks) lands in the fifth window, beyond
    // that window's length: time moved between windows, not a lie, so no
    // clamp. The windows in between could not know it (their share went to
    // "no stage"); the fifth gets stage 0 beyond its own share, and no
    // stage is ever given more than it had.
    let mut g = Guest::new(1);
    let mut r = reader(1);
    let w = 1_000_000;
    let t0 = REGISTER_HOST;
    g.at(t0 + 100_000, stage_code(0));
    let mut reads = vec![r.update_deltas(&[g.block], t0 + w)];
    let before = g.block;
    g.at(t0 + 1_500_000, stage_code(1));
    let late = (
        g.block.cycles[stage_code(0) as usize] - before.cycles[stage_code(0) as usize],
        g.block.timed[stage_code(0) as usize] - before.timed[stage_code(0) as usize],
        g.block.counts[stage_code(1) as usize] - before.counts[stage_code(1) as usize],
    );
    let mut at = 1_600_000;
    for read in 2..=5u64 {
        while at < read * w - 50_000 {
            let code = if (at / 100_000) % 2 == 0 { 0 } else { 1 };
            g.at(t0 + at, stage_code(code));
            at += 100_000;
        }
        let mut seen = g.block;
        if read < 5 {
            seen.cycles[stage_code(0) as usize] -= late.0;
            seen.timed[stage_code(0) as usize] -= late.1;
            seen.counts[stage_code(1) as usize] -= late.2;
        }
        reads.push(r.update_deltas(&[seen], t0 + read * w));
    }
    let total = |code: u32| -> u64 { reads.iter().map(|d| d[0].ticks[code as usize]).sum() };
    for d in &reads {
        assert_eq!(d[0].clamps, 0, "{d:?}");
        assert_eq!(d[0].ticks.iter().sum::<u64>(), w);
    }
    // Stage 0: 100 k..1.5 M, then every other 100 k from 1.6 M (the
    // visit open at the last read, from 4.9 M, charged to its end 5 M).
    let stage0 = 1_400_000 + 17 * 100_000;
    let stage1 = 5 * w - 100_000 - stage0;
    let granule = 8 * 128;
    assert!(total(stage_code(0)) <= stage0 + granule, "{reads:?}");
    assert!(total(stage_code(1)) <= stage1 + granule, "{reads:?}");
    // Window 5 had 500 k of stage 0 of its own.
    assert!(
        reads[4][0].ticks[stage_code(0) as usize] > 500_000 + granule,
        "{reads:?}"
    );
}

#[test]
fn huge_visit_means_and_long_windows_stay_in_range() {
    // A guest that once claimed a visit of ~2^64 ticks and then counts
    // entries at the window's limit, read over windows of 2^34 ticks (a
    // long policy period): estimates are cut to the busy time, nothing
    // overflows, the window is shared out exactly.
    let mut r = reader(1);
    let mut b = VcpuCounters::default();
    let s = stage_code(0) as usize;
    b.cycles[s] = u64::MAX;
    b.timed[s] = 1;
    let mut host = REGISTER_HOST;
    for k in 1..4u64 {
        host += 1 << 34;
        b.counts[s] = k << 34;
        b.counts[stage_code(1) as usize] = k << 34;
        let d = r.update_deltas(&[b], host);
        assert_eq!(d[0].ticks.iter().sum::<u64>(), 1 << 34, "{d:?}");
    }
}

#[test]
fn a_read_older_than_the_last_changes_nothing() {
    let mut g = Guest::new(1);
    let mut r = reader(1);
    let w = 1_000_000;
    g.at(REGISTER_HOST + 10, stage_code(0));
    let (d, window) = r.update(&[g.block], REGISTER_HOST + 2 * w);
    assert_eq!((window, d[0].counts[stage_code(0) as usize]), (2 * w, 1));
    // A read taken earlier but ingested later: no window, no counts, and
    // the next read still counts from the newer one.
    let (d, window) = r.update(&[g.block], REGISTER_HOST + w);
    assert_eq!(window, 0);
    assert!(d[0].counts.iter().all(|c| *c == 0));
    g.at(REGISTER_HOST + 2 * w + 10, stage_code(1));
    let (d, window) = r.update(&[g.block], REGISTER_HOST + 3 * w);
    assert_eq!(window, w);
    assert_eq!(d[0].counts[stage_code(1) as usize], 1);
    assert_eq!(d[0].clamps, 0);
}
