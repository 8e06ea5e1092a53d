//! A trace demultiplexed into per-thread streams of packed 64-bit events.
//!
//! Each event is one `u64`, kind in the top two bits:
//!
//! | bits 63–62 | kind | payload |
//! |---|---|---|
//! | `00` | fetch | bits 0–47 address (sign-extended from bit 47 on use), 48–53 instructions (≤ 63), 54–61 bytes (≤ 255) |
//! | `01` | data | bits 0–47 address, 48–55 size in bytes, bit 56 store |
//! | `10` | stage | bits 0–15 dense stage index ([`Trace::stages`] order; `stages.len()` = no stage) |
//!
//! A FETCH record larger than 255 bytes or 63 instructions becomes several
//! consecutive fetch events over consecutive byte ranges with the
//! instructions spread evenly (the instruction and byte totals are
//! unchanged). The ranges are cut only at multiples of [`SPLIT_ALIGN`]
//! (128) bytes, so with lines of up to 128 bytes no line is shared by two
//! pieces and a replay fetches (and counts) each line of the record once.
//! Only a record with more instructions than 128-byte pieces can hold (over
//! 63 per piece) is cut finer; then, and with lines larger than 128 bytes,
//! the line at a cut is fetched by both pieces (the second fetch hits, so
//! miss counts are the same either way). Addresses keep their low 48 bits,
//! sign-extended: exact for canonical x86-64 addresses. So ~8 bytes per
//! basic block or data access:
//! a 300 M-instruction trace with ~6 instructions per block and ~0.5 data
//! accesses per instruction needs ~1.6 GB.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use crate::trace::{Record, RecordReader, Sidecar, TraceError, NO_STAGE};

/// Event kind: fetch.
pub const EV_FETCH: u64 = 0;
/// Event kind: data access.
pub const EV_DATA: u64 = 1;
/// Event kind: stage marker.
pub const EV_STAGE: u64 = 2;

const ADDR_MASK: u64 = (1 << 48) - 1;
/// Most instructions one fetch event holds.
pub const MAX_EV_INSTRS: u64 = 63;
/// Most bytes one fetch event holds.
pub const MAX_EV_BYTES: u64 = 255;
/// A FETCH record too large for one event is cut only at addresses that
/// are multiples of this (a power of two ≤ [`MAX_EV_BYTES`]), so that no
/// cache line of up to this size is split between two events.
pub const SPLIT_ALIGN: u64 = 128;

/// Packs a fetch event (`instrs` ≤ 63, `bytes` ≤ 255).
#[inline]
pub fn pack_fetch(addr: u64, bytes: u64, instrs: u64) -> u64 {
    debug_assert!(instrs <= MAX_EV_INSTRS && bytes <= MAX_EV_BYTES);
    (EV_FETCH << 62) | (bytes << 54) | (instrs << 48) | (addr & ADDR_MASK)
}

/// Packs a data event.
#[inline]
pub fn pack_data(addr: u64, size: u8, store: bool) -> u64 {
    (EV_DATA << 62) | ((store as u64) << 56) | ((size as u64) << 48) | (addr & ADDR_MASK)
}

/// Packs a stage event (dense index).
#[inline]
pub fn pack_stage(index: u16) -> u64 {
    (EV_STAGE << 62) | index as u64
}

/// The 48-bit address of a fetch or data event, sign-extended.
#[inline]
pub fn ev_addr(ev: u64) -> u64 {
    (((ev << 16) as i64) >> 16) as u64
}

/// Instructions of a fetch event.
#[inline]
pub fn ev_instrs(ev: u64) -> u64 {
    (ev >> 48) & 0x3f
}

/// Bytes of a fetch event.
#[inline]
pub fn ev_bytes(ev: u64) -> u64 {
    (ev >> 54) & 0xff
}

/// Size in bytes of a data event.
#[inline]
pub fn ev_size(ev: u64) -> u64 {
    (ev >> 48) & 0xff
}

/// Whether a data event is a store.
#[inline]
pub fn ev_is_store(ev: u64) -> bool {
    (ev >> 56) & 1 == 1
}

/// One traced thread.
#[derive(Clone, Debug, Default)]
pub struct ThreadStream {
    /// Thread id from the trace.
    pub tid: u32,
    /// Packed events in program order.
    pub events: Vec<u64>,
    /// Instructions in the stream.
    pub instrs: u64,
}

/// A stage known to the replay.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StageInfo {
    /// The id STAGE records carry.
    pub id: u16,
    /// Name from the sidecar (or `stage<id>` when it has none).
    pub name: String,
}

/// A whole trace in memory, per thread.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Threads in order of first appearance.
    pub threads: Vec<ThreadStream>,
    /// Stages: the sidecar's in file order, then ids seen only in the trace,
    /// in order of first appearance. Dense stage index = position here.
    pub stages: Vec<StageInfo>,
    /// Instructions over all threads.
    pub instrs: u64,
    /// The schedule as captured: the trace's records in file order as
    /// segments `(thread index, end)`: thread `thread` ran its events up to
    /// position `end` (exclusive) before the traced run switched to the
    /// next segment's thread (a THREAD record). The `captured` model
    /// replays it.
    pub schedule: Vec<(u32, usize)>,
    /// Records read (END included).
    pub records: u64,
    /// Decompressed bytes read.
    pub raw_bytes: u64,
}

impl Trace {
    /// Loads a compressed trace file and its sidecar (if any).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let sidecar = Sidecar::load_for(path)?.unwrap_or_default();
        let reader =
            RecordReader::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Self::from_reader(reader, &sidecar, |_| {})
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Demultiplexes every record of `reader`; `progress` gets the
    /// decompressed offset now and then.
    pub fn from_reader<R: Read>(
        mut reader: RecordReader<R>,
        sidecar: &Sidecar,
        mut progress: impl FnMut(u64),
    ) -> Result<Self, TraceError> {
        let mut t = Trace {
            stages: sidecar
                .stages
                .iter()
                .map(|s| StageInfo {
                    id: s.id,
                    name: s.name.clone(),
                })
                .collect(),
            ..Default::default()
        };
        let mut stage_index: HashMap<u16, u16> = t
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id, i as u16))
            .collect();
        let mut thread_index: HashMap<u32, usize> = HashMap::new();
        // Stage events are packed with a provisional index; the "no stage"
        // index is only known at the end, so mark it with u16::MAX here.
        let mut cur: Option<usize> = None;
        while let Some(rec) = reader.next_record()? {
            t.records += 1;
            if t.records.is_multiple_of(1 << 20) {
                progress(reader.offset());
            }
            let mut current = |t: &mut Trace| -> usize {
                *cur.get_or_insert_with(|| {
                    // Records before the first THREAD belong to thread 0.
                    *thread_index.entry(0).or_insert_with(|| {
                        t.threads.push(ThreadStream::default());
                        t.threads.len() - 1
                    })
                })
            };
            match rec {
                Record::Thread(tid) => {
                    let n = t.threads.len();
                    let i = *thread_index.entry(tid).or_insert(n);
                    if i == n {
                        t.threads.push(ThreadStream {
                            tid,
                            ..Default::default()
                        });
                    }
                    if let Some(c) = cur.filter(|c| *c != i) {
                        t.end_segment(c);
                    }
                    cur = Some(i);
                }
                Record::Fetch {
                    addr,
                    bytes,
                    instrs,
                } => {
                    let i = current(&mut t);
                    let th = &mut t.threads[i];
                    push_fetch(&mut th.events, addr, bytes as u64, instrs as u64);
                    th.instrs += instrs as u64;
                    t.instrs += instrs as u64;
                }
                Record::Load { addr, size } | Record::Store { addr, size } => {
                    let i = current(&mut t);
                    let store = matches!(rec, Record::Store { .. });
                    t.threads[i].events.push(pack_data(addr, size, store));
                }
                Record::Stage(id) => {
                    let i = current(&mut t);
                    let idx = if id == NO_STAGE {
                        u16::MAX
                    } else {
                        let n = t.stages.len() as u16;
                        *stage_index.entry(id).or_insert_with(|| {
                            t.stages.push(StageInfo {
                                id,
                                name: format!("stage{id}"),
                            });
                            n
                        })
                    };
                    t.threads[i].events.push(pack_stage(idx));
                }
                Record::End => {}
            }
        }
        if let Some(c) = cur {
            t.end_segment(c);
        }
        t.raw_bytes = reader.offset();
        let none = t.stages.len() as u16;
        for th in &mut t.threads {
            for ev in &mut th.events {
                if *ev >> 62 == EV_STAGE && *ev as u16 == u16::MAX {
                    *ev = pack_stage(none);
                }
            }
            th.events.shrink_to_fit();
        }
        Ok(t)
    }

    /// Closes thread `c`'s current segment of [`Trace::schedule`] (nothing
    /// when it added no event since its previous segment).
    fn end_segment(&mut self, c: usize) {
        let end = self.threads[c].events.len();
        let previous = self
            .schedule
            .iter()
            .rev()
            .find(|(t, _)| *t as usize == c)
            .map_or(0, |(_, e)| *e);
        if end > previous {
            self.schedule.push((c as u32, end));
        }
    }

    /// Dense index meaning "no stage" (= number of stages).
    pub fn no_stage(&self) -> usize {
        self.stages.len()
    }

    /// Bytes of event storage.
    pub fn memory_bytes(&self) -> u64 {
        self.threads.iter().map(|t| t.events.len() as u64 * 8).sum()
    }
}

/// Appends one FETCH record as one or more fetch events (see the module
/// documentation for how a large record is cut).
fn push_fetch(out: &mut Vec<u64>, addr: u64, bytes: u64, instrs: u64) {
    if bytes <= MAX_EV_BYTES && instrs <= MAX_EV_INSTRS {
        out.push(pack_fetch(addr, bytes, instrs));
        return;
    }
    let ends = split_ends(addr, bytes, instrs);
    let n = ends.len() as u64;
    let (mut b0, mut i0) = (0u64, 0u64);
    for (k, &b1) in (1..=n).zip(&ends) {
        let i1 = instrs * k / n;
        out.push(pack_fetch(addr.wrapping_add(b0), b1 - b0, i1 - i0));
        b0 = b1;
        i0 = i1;
    }
}

/// Where a FETCH record of `bytes` bytes at `addr` with `instrs`
/// instructions, too large for one event, is cut: the end offset (from
/// `addr`) of every piece, ascending, the last one `bytes`. Every piece has
/// at most [`MAX_EV_BYTES`] bytes, and there are at least
/// `instrs / MAX_EV_INSTRS` (rounded up) pieces so that spreading the
/// instructions evenly gives none more than [`MAX_EV_INSTRS`].
///
/// Cuts fall on multiples of [`SPLIT_ALIGN`], as few as the byte limit
/// allows; when the instructions need more pieces, on every multiple of the
/// largest power of two ≤ [`SPLIT_ALIGN`] that gives enough; when even
/// 1-byte pieces are too few (more instructions than bytes, not x86), the
/// bytes are spread evenly over zero- and one-byte pieces.
fn split_ends(addr: u64, bytes: u64, instrs: u64) -> Vec<u64> {
    let need = instrs.div_ceil(MAX_EV_INSTRS).max(1);
    // As few pieces as the byte limit allows: each piece ends at the last
    // multiple of SPLIT_ALIGN within MAX_EV_BYTES of its start (≥ 128 bytes on).
    let mut ends = Vec::with_capacity(bytes.div_ceil(SPLIT_ALIGN) as usize + 1);
    let mut o = 0u64;
    while bytes - o > MAX_EV_BYTES {
        o += MAX_EV_BYTES - (addr.wrapping_add(o + MAX_EV_BYTES) & (SPLIT_ALIGN - 1));
        ends.push(o);
    }
    ends.push(bytes);
    if ends.len() as u64 >= need {
        return ends;
    }
    // More pieces for the instructions: cut at every multiple of g.
    let mut g = SPLIT_ALIGN;
    while g >= 1 && bytes > 0 {
        let blocks = ((addr & (g - 1)) + bytes).div_ceil(g);
        if blocks >= need {
            ends.clear();
            let mut o = 0u64;
            while o < bytes {
                o = (o + g - (addr.wrapping_add(o) & (g - 1))).min(bytes);
                ends.push(o);
            }
            return ends;
        }
        g /= 2;
    }
    (1..=need).map(|k| bytes * k / need).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{StageEntry, MAGIC};

    #[test]
    fn packing_round_trips() {
        let e = pack_fetch(0xffff_8000_1234_5678, 255, 63);
        assert_eq!(e >> 62, EV_FETCH);
        assert_eq!(ev_addr(e), 0xffff_8000_1234_5678);
        assert_eq!((ev_bytes(e), ev_instrs(e)), (255, 63));
        let d = pack_data(0x7fff_ffff_fff8, 8, true);
        assert_eq!(d >> 62, EV_DATA);
        assert_eq!(ev_addr(d), 0x7fff_ffff_fff8);
        assert_eq!(ev_size(d), 8);
        assert!(ev_is_store(d));
        assert!(!ev_is_store(pack_data(0, 1, false)));
        assert_eq!(pack_stage(3) >> 62, EV_STAGE);
    }

    #[test]
    fn big_fetches_split_without_losing_instructions_or_bytes() {
        let mut v = Vec::new();
        push_fetch(&mut v, 0x1000, 1000, 200);
        // cut at multiples of 128: six 128-byte pieces from the aligned
        // start, then the last 232 bytes (≤ 255) in one
        assert_eq!(v.len(), 7);
        assert_eq!(ev_bytes(v[6]), 232);
        assert_eq!(v.iter().map(|e| ev_instrs(*e)).sum::<u64>(), 200);
        assert_eq!(v.iter().map(|e| ev_bytes(*e)).sum::<u64>(), 1000);
        assert_eq!(ev_addr(v[0]), 0x1000);
        assert_eq!(ev_addr(v[1]), 0x1000 + ev_bytes(v[0]));
    }

    /// Lines a replay fetches for `events` (fetch events only) with lines of
    /// `1 << shift` bytes, counted as the replay counts them: every line of
    /// every event's `[addr, addr + max(bytes, 1))`.
    fn lines_fetched(events: &[u64], shift: u32) -> u64 {
        events
            .iter()
            .map(|&e| {
                let a = ev_addr(e);
                let last = a.wrapping_add(ev_bytes(e).max(1) - 1) >> shift;
                last - (a >> shift) + 1
            })
            .sum()
    }

    /// Distinct lines of `[addr, addr + bytes)`: the in-line offset of the
    /// start plus the bytes, over the line size, rounded up.
    fn lines_of(addr: u64, bytes: u64, shift: u32) -> u64 {
        ((addr & ((1 << shift) - 1)) + bytes).div_ceil(1 << shift)
    }

    #[test]
    fn split_fetch_counts_each_line_once() {
        // 300 bytes: the old even split cut at byte 150 = 0x1096, inside the
        // 64-byte line 0x1080..0x10c0, which both pieces then fetched.
        let (addr, bytes) = (0x1000u64, 300u64);
        assert_ne!((addr + bytes / 2) % 64, 0);
        let mut v = Vec::new();
        push_fetch(&mut v, addr, bytes, 60);
        assert!(v.len() > 1, "a fetch over 255 bytes is split");
        assert_eq!(lines_fetched(&v, 6), bytes.div_ceil(64)); // 5 lines
        assert_eq!(lines_fetched(&v, 6), 5);
        assert_eq!(v.iter().map(|e| ev_bytes(*e)).sum::<u64>(), bytes);
        assert_eq!(v.iter().map(|e| ev_instrs(*e)).sum::<u64>(), 60);
    }

    #[test]
    fn split_fetches_stay_contiguous_within_limits_and_count_lines_once() {
        for off in [0u64, 1, 2, 31, 63, 64, 100, 127, 128, 200, 255] {
            // also in the kernel half (sign-extended addresses)
            for base in [0x40_0000u64, 0xffff_ffff_fff0_0000] {
                let addr = base + off;
                for bytes in [256u64, 257, 300, 383, 384, 511, 1000, 4096, 65535] {
                    for instrs in [0u64, 1, 63, 64, 130, bytes / 4, bytes / 2, bytes] {
                        let mut v = Vec::new();
                        push_fetch(&mut v, addr, bytes, instrs);
                        let ctx = format!("addr {addr:#x} bytes {bytes} instrs {instrs}");
                        let mut next = addr;
                        for &e in &v {
                            assert_eq!(e >> 62, EV_FETCH, "{ctx}");
                            assert_eq!(ev_addr(e), next, "{ctx}");
                            assert!(ev_bytes(e) >= 1, "{ctx}");
                            next = next.wrapping_add(ev_bytes(e));
                        }
                        assert_eq!(next, addr + bytes, "{ctx}");
                        assert_eq!(
                            v.iter().map(|e| ev_instrs(*e)).sum::<u64>(),
                            instrs,
                            "{ctx}"
                        );
                        // lines up to 128 bytes unless the instructions force
                        // finer cuts; up to 32 bytes whenever instrs ≤ bytes
                        let max_shift = if instrs <= bytes / 4 { 7 } else { 5 };
                        for shift in 1..=max_shift {
                            assert_eq!(
                                lines_fetched(&v, shift),
                                lines_of(addr, bytes, shift),
                                "{ctx} line {}",
                                1 << shift
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn fetches_with_more_instructions_than_bytes_still_fit() {
        for (bytes, instrs) in [(0u64, 64u64), (0, 1000), (10, 700), (100, 65535)] {
            let mut v = Vec::new();
            push_fetch(&mut v, 0x2000, bytes, instrs);
            assert!(v.iter().all(|e| ev_instrs(*e) <= MAX_EV_INSTRS));
            assert_eq!(v.iter().map(|e| ev_instrs(*e)).sum::<u64>(), instrs);
            assert_eq!(v.iter().map(|e| ev_bytes(*e)).sum::<u64>(), bytes);
        }
    }

    #[test]
    fn demux_by_thread_and_stage_indices() {
        let mut raw = MAGIC.to_vec();
        for r in [
            Record::Fetch {
                addr: 0x10,
                bytes: 4,
                instrs: 1,
            }, // before any THREAD: thread 0
            Record::Thread(5),
            Record::Stage(9),
            Record::Fetch {
                addr: 0x20,
                bytes: 8,
                instrs: 2,
            },
            Record::Thread(0),
            Record::Stage(NO_STAGE),
            Record::Load {
                addr: 0x30,
                size: 4,
            },
            Record::Thread(5),
            Record::Stage(1),
        ] {
            r.encode(&mut raw);
        }
        let side = Sidecar {
            stages: vec![StageEntry {
                id: 1,
                name: "parse".into(),
                symbols: Vec::new(),
            }],
            capture: None,
        };
        let t = Trace::from_reader(RecordReader::new(&raw[..]), &side, |_| {}).unwrap();
        assert_eq!(t.instrs, 3);
        assert_eq!(t.threads.len(), 2);
        assert_eq!((t.threads[0].tid, t.threads[1].tid), (0, 5));
        assert_eq!(t.stages.len(), 2);
        assert_eq!(t.stages[0].name, "parse");
        assert_eq!(t.stages[1].name, "stage9");
        // thread 5: stage9 (index 1), fetch, stage parse (index 0)
        assert_eq!(t.threads[1].events[0], pack_stage(1));
        assert_eq!(t.threads[1].events[2], pack_stage(0));
        // thread 0: fetch, no stage (index 2), load
        assert_eq!(t.threads[0].events[1], pack_stage(2));
        assert_eq!(t.threads[0].events[2] >> 62, EV_DATA);
        // The captured schedule: thread 0's fetch, thread 5's first two
        // events, thread 0's next two, thread 5's marker.
        assert_eq!(t.schedule, [(0, 1), (1, 2), (0, 3), (1, 3)]);
    }
}
