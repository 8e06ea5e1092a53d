//! The replay's inner loop: [`run_chunk`] runs one chunk of a thread's
//! packed events ([`crate::stream`]) through a core's caches and counts what
//! happened; [`visit_ahead`] reads a visit's length ahead in the stream (the
//! min-visit variant's oracle rule).

use crate::cache::{Cache, CoreCaches, Level};
use crate::stream::{ev_instrs, ev_is_store, EV_DATA, EV_FETCH, EV_STAGE};

use super::coherence::Coherence;
use super::Counters;

/// Why [`run_chunk`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// Instruction limit reached.
    Limit,
    /// The thread's stream ended.
    Done,
    /// A stage marker (dense index) was consumed.
    Stage(usize),
}

/// Accesses every line of `[addr, addr + bytes)` (at least one) with
/// `access`, counting the accesses into `lines` and the misses of each level
/// into `misses` (L1, L2, L3; the L3 count only when an L3 is simulated).
#[inline(always)]
fn access_lines(
    addr: u64,
    bytes: u64,
    shift: u32,
    has_l3: u64,
    lines: &mut u64,
    misses: [&mut u64; 3],
    mut access: impl FnMut(u64) -> Level,
) {
    let [l1, l2, l3] = misses;
    let first = addr >> shift;
    let last = addr.wrapping_add(bytes.max(1) - 1) >> shift;
    let mut line = first;
    loop {
        *lines += 1;
        match access(line) {
            Level::L1 => {}
            Level::L2 => *l1 += 1,
            Level::L3 => {
                *l1 += 1;
                *l2 += 1;
            }
            Level::Memory => {
                *l1 += 1;
                *l2 += 1;
                *l3 += has_l3;
            }
        }
        if line >= last {
            break;
        }
        line += 1;
    }
}

/// Runs `events[*pos..]` on core `k` (its private caches: `core`) until
/// `limit` instructions have run, a stage marker is consumed or the stream
/// ends; counts into `c`. With `coh`, data accesses go through the
/// cross-core transfer model ([`Coherence`]).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
pub(super) fn run_chunk(
    events: &[u64],
    pos: &mut usize,
    limit: u64,
    (k, core): (usize, &mut CoreCaches),
    mut l3: Option<&mut Cache>,
    mut coh: Option<&mut Coherence>,
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
                c.instrs += (ev >> 48) & 0x3f;
                access_lines(
                    addr,
                    (ev >> 54) & 0xff,
                    shift,
                    has_l3,
                    &mut c.fetch_lines,
                    [&mut c.l1i_misses, &mut c.l2i_misses, &mut c.l3i_misses],
                    |line| core.fetch_line(line, l3.as_deref_mut()),
                );
            }
            EV_DATA => {
                let store = ev_is_store(ev);
                let xfer = &mut c.xfer_lines;
                access_lines(
                    addr,
                    (ev >> 48) & 0xff,
                    shift,
                    has_l3,
                    &mut c.data_lines,
                    [&mut c.l1d_misses, &mut c.l2d_misses, &mut c.l3d_misses],
                    |line| {
                        let level = core.data_line(line, l3.as_deref_mut());
                        if let Some(coh) = coh.as_deref_mut() {
                            *xfer += u64::from(coh.access(k, line, store, level));
                        }
                        level
                    },
                )
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

/// Instructions from `pos` until the next STAGE marker that changes the
/// group away from `group` (or the end of the stream), counting at most to
/// `cap`.
pub(super) fn visit_ahead(
    events: &[u64],
    pos: usize,
    group: usize,
    lookup: &[usize],
    cap: u64,
) -> u64 {
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
