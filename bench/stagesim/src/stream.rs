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
//! instructions spread evenly (the instruction total and the lines touched
//! are unchanged). Addresses keep their low 48 bits, sign-extended: exact for
//! canonical x86-64 addresses. So ~8 bytes per basic block or data access:
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

    /// Dense index meaning "no stage" (= number of stages).
    pub fn no_stage(&self) -> usize {
        self.stages.len()
    }

    /// Bytes of event storage.
    pub fn memory_bytes(&self) -> u64 {
        self.threads.iter().map(|t| t.events.len() as u64 * 8).sum()
    }
}

/// Appends one FETCH record as one or more fetch events.
fn push_fetch(out: &mut Vec<u64>, addr: u64, bytes: u64, instrs: u64) {
    if bytes <= MAX_EV_BYTES && instrs <= MAX_EV_INSTRS {
        out.push(pack_fetch(addr, bytes, instrs));
        return;
    }
    let n = bytes
        .div_ceil(MAX_EV_BYTES)
        .max(instrs.div_ceil(MAX_EV_INSTRS))
        .max(1);
    let (mut b0, mut i0) = (0u64, 0u64);
    for k in 1..=n {
        let b1 = bytes * k / n;
        let i1 = instrs * k / n;
        out.push(pack_fetch(addr.wrapping_add(b0), b1 - b0, i1 - i0));
        b0 = b1;
        i0 = i1;
    }
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
        assert_eq!(v.len(), 4);
        assert_eq!(v.iter().map(|e| ev_instrs(*e)).sum::<u64>(), 200);
        assert_eq!(v.iter().map(|e| ev_bytes(*e)).sum::<u64>(), 1000);
        assert_eq!(ev_addr(v[0]), 0x1000);
        assert_eq!(ev_addr(v[1]), 0x1000 + ev_bytes(v[0]));
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
            }],
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
    }
}
