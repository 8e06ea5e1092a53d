//! The "stagetrace v1" format: reader, writer and the `.stages.toml` sidecar.
//! `stagesim/TRACE-FORMAT.md` is the specification; this module follows
//! it exactly. (Tests: `trace/tests.rs`.)
//!
//! A zstd-compressed stream; its decompressed content is the 8-byte magic
//! `STGTRC01` followed by records, each a 1-byte tag and little-endian fields:
//!
//! | tag | record | fields | size with tag |
//! |---|---|---|---|
//! | `0x01` | THREAD | `u32 tid` | 5 |
//! | `0x02` | FETCH | `u64 addr, u16 bytes, u16 instrs` | 13 |
//! | `0x03` | LOAD | `u64 addr, u8 size` | 10 |
//! | `0x04` | STORE | `u64 addr, u8 size` | 10 |
//! | `0x05` | STAGE | `u16 stage` (`0xFFFF` = no stage) | 3 |
//! | `0x06` | END | — | 1 |
//!
//! Byte offsets in errors count bytes of the *decompressed* stream from its
//! start (the magic is at offset 0).

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The 8-byte magic at the start of the decompressed stream.
pub const MAGIC: &[u8; 8] = b"STGTRC01";
/// Tag of a THREAD record.
pub const TAG_THREAD: u8 = 0x01;
/// Tag of a FETCH record.
pub const TAG_FETCH: u8 = 0x02;
/// Tag of a LOAD record.
pub const TAG_LOAD: u8 = 0x03;
/// Tag of a STORE record.
pub const TAG_STORE: u8 = 0x04;
/// Tag of a STAGE record.
pub const TAG_STAGE: u8 = 0x05;
/// Tag of an END record.
pub const TAG_END: u8 = 0x06;
/// The STAGE value meaning "no stage".
pub const NO_STAGE: u16 = 0xFFFF;

/// One trace record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// Following records belong to thread `tid` (a thread switch point).
    Thread(u32),
    /// `instrs` instructions occupying `[addr, addr + bytes)`, fetched
    /// sequentially (one executed basic block / translation block).
    Fetch {
        /// Address of the first instruction byte.
        addr: u64,
        /// Length of the block in bytes.
        bytes: u16,
        /// Instructions in the block.
        instrs: u16,
    },
    /// A data load of `size` bytes at `addr`.
    Load {
        /// Byte address.
        addr: u64,
        /// Access size in bytes.
        size: u8,
    },
    /// A data store of `size` bytes at `addr`.
    Store {
        /// Byte address.
        addr: u64,
        /// Access size in bytes.
        size: u8,
    },
    /// The current thread enters stage `stage` ([`NO_STAGE`] = no stage).
    Stage(u16),
    /// End of trace (optional; EOF also ends).
    End,
}

impl Record {
    /// The record's name as in the specification.
    pub fn name(tag: u8) -> &'static str {
        match tag {
            TAG_THREAD => "THREAD",
            TAG_FETCH => "FETCH",
            TAG_LOAD => "LOAD",
            TAG_STORE => "STORE",
            TAG_STAGE => "STAGE",
            TAG_END => "END",
            _ => "unknown",
        }
    }

    /// Encoded length in bytes including the tag, or `None` for an unknown tag.
    pub fn encoded_len(tag: u8) -> Option<usize> {
        Some(match tag {
            TAG_THREAD => 5,
            TAG_FETCH => 13,
            TAG_LOAD | TAG_STORE => 10,
            TAG_STAGE => 3,
            TAG_END => 1,
            _ => return None,
        })
    }

    /// Appends the record's encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Record::Thread(tid) => {
                out.push(TAG_THREAD);
                out.extend_from_slice(&tid.to_le_bytes());
            }
            Record::Fetch {
                addr,
                bytes,
                instrs,
            } => {
                out.push(TAG_FETCH);
                out.extend_from_slice(&addr.to_le_bytes());
                out.extend_from_slice(&bytes.to_le_bytes());
                out.extend_from_slice(&instrs.to_le_bytes());
            }
            Record::Load { addr, size } | Record::Store { addr, size } => {
                out.push(if matches!(self, Record::Load { .. }) {
                    TAG_LOAD
                } else {
                    TAG_STORE
                });
                out.extend_from_slice(&addr.to_le_bytes());
                out.push(size);
            }
            Record::Stage(s) => {
                out.push(TAG_STAGE);
                out.extend_from_slice(&s.to_le_bytes());
            }
            Record::End => out.push(TAG_END),
        }
    }
}

/// Bad trace input. Offsets count bytes of the decompressed stream.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The stream does not start with `STGTRC01`.
    #[error(
        "byte offset 0: bad magic {found:?}, expected \"STGTRC01\" (not a stagetrace v1 stream)"
    )]
    BadMagic {
        /// The bytes found (at most 8, fewer if the stream is shorter).
        found: String,
    },
    /// A record tag that v1 does not define.
    #[error("byte offset {offset}: unknown record tag 0x{tag:02x}")]
    UnknownTag {
        /// Offset of the tag byte.
        offset: u64,
        /// The tag.
        tag: u8,
    },
    /// The stream ends inside a record.
    #[error("byte offset {offset}: truncated {record} record ({have} of {need} bytes before end of stream)")]
    Truncated {
        /// Offset of the record's tag byte.
        offset: u64,
        /// Record name.
        record: &'static str,
        /// Bytes present.
        have: usize,
        /// Bytes the record needs.
        need: usize,
    },
    /// Reading or decompressing failed.
    #[error("byte offset {offset}: {source}")]
    Io {
        /// Decompressed bytes read successfully before the failure.
        offset: u64,
        /// The I/O or zstd error.
        source: io::Error,
    },
}

/// Reads records from a *decompressed* stagetrace stream (use
/// [`RecordReader::open`] or [`RecordReader::from_compressed`] for files).
pub struct RecordReader<R: Read> {
    inner: R,
    buf: Box<[u8]>,
    pos: usize,
    len: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
    eof: bool,
    ended: bool,
    started: bool,
}

const BUF: usize = 1 << 18;

impl RecordReader<zstd::stream::read::Decoder<'static, BufReader<File>>> {
    /// Opens a compressed trace file.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let f = File::open(path).map_err(|source| TraceError::Io { offset: 0, source })?;
        Self::from_compressed(f)
    }
}

impl<R: Read> RecordReader<zstd::stream::read::Decoder<'static, BufReader<R>>> {
    /// Reads the zstd-compressed stream `r`.
    pub fn from_compressed(r: R) -> Result<Self, TraceError> {
        let dec = zstd::stream::read::Decoder::new(r)
            .map_err(|source| TraceError::Io { offset: 0, source })?;
        Ok(RecordReader::new(dec))
    }
}

impl<R: Read> RecordReader<R> {
    /// Reads the decompressed stream `inner` (magic first).
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            buf: vec![0u8; BUF].into_boxed_slice(),
            pos: 0,
            len: 0,
            base: 0,
            eof: false,
            ended: false,
            started: false,
        }
    }

    /// Offset (in the decompressed stream) of the next unread byte.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Makes at least `need` bytes available unless the stream ends first;
    /// returns how many are available.
    fn fill(&mut self, need: usize) -> Result<usize, TraceError> {
        if self.len - self.pos >= need || self.eof {
            return Ok(self.len - self.pos);
        }
        self.buf.copy_within(self.pos..self.len, 0);
        self.base += self.pos as u64;
        self.len -= self.pos;
        self.pos = 0;
        while self.len < need && !self.eof {
            match self.inner.read(&mut self.buf[self.len..]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(TraceError::Io {
                        offset: self.base + self.len as u64,
                        source,
                    })
                }
            }
        }
        Ok(self.len)
    }

    fn check_magic(&mut self) -> Result<(), TraceError> {
        self.started = true;
        let have = self.fill(MAGIC.len())?;
        let found = &self.buf[..have.min(MAGIC.len())];
        if found != MAGIC {
            return Err(TraceError::BadMagic {
                found: String::from_utf8_lossy(found).escape_debug().to_string(),
            });
        }
        self.pos += MAGIC.len();
        Ok(())
    }

    /// The next record, `None` at the end (EOF or after END; bytes after an
    /// END record are not read).
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        if !self.started {
            self.check_magic()?;
        }
        if self.ended {
            return Ok(None);
        }
        let have = self.fill(13)?;
        if have == 0 {
            self.ended = true;
            return Ok(None);
        }
        let offset = self.offset();
        let b = &self.buf[self.pos..self.len];
        let tag = b[0];
        let Some(need) = Record::encoded_len(tag) else {
            self.ended = true;
            return Err(TraceError::UnknownTag { offset, tag });
        };
        if have < need {
            self.ended = true;
            return Err(TraceError::Truncated {
                offset,
                record: Record::name(tag),
                have,
                need,
            });
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let rec = match tag {
            TAG_THREAD => Record::Thread(u32::from_le_bytes([b[1], b[2], b[3], b[4]])),
            TAG_FETCH => Record::Fetch {
                addr: u64_at(1),
                bytes: u16_at(9),
                instrs: u16_at(11),
            },
            TAG_LOAD => Record::Load {
                addr: u64_at(1),
                size: b[9],
            },
            TAG_STORE => Record::Store {
                addr: u64_at(1),
                size: b[9],
            },
            TAG_STAGE => Record::Stage(u16_at(1)),
            _ => {
                self.ended = true;
                Record::End
            }
        };
        self.pos += need;
        Ok(Some(rec))
    }
}

/// Writes a compressed stagetrace v1 stream.
pub struct TraceWriter<W: Write> {
    enc: zstd::stream::write::Encoder<'static, W>,
    buf: Vec<u8>,
    bytes: u64,
    records: u64,
}

impl TraceWriter<BufWriter<File>> {
    /// Creates (truncates) `path`, zstd level 3.
    pub fn create(path: &Path) -> io::Result<Self> {
        Self::new(BufWriter::new(File::create(path)?), 3)
    }
}

impl<W: Write> TraceWriter<W> {
    /// A writer onto `w` at zstd `level` (1–19); writes the magic.
    pub fn new(w: W, level: i32) -> io::Result<Self> {
        let mut enc = zstd::stream::write::Encoder::new(w, level)?;
        enc.include_checksum(true)?;
        let mut buf = Vec::with_capacity(1 << 16);
        buf.extend_from_slice(MAGIC);
        Ok(Self {
            enc,
            buf,
            bytes: MAGIC.len() as u64,
            records: 0,
        })
    }

    /// Appends one record.
    pub fn record(&mut self, r: Record) -> io::Result<()> {
        let before = self.buf.len();
        r.encode(&mut self.buf);
        self.bytes += (self.buf.len() - before) as u64;
        self.records += 1;
        if self.buf.len() >= 1 << 16 {
            self.enc.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    /// THREAD record.
    pub fn thread(&mut self, tid: u32) -> io::Result<()> {
        self.record(Record::Thread(tid))
    }

    /// FETCH record.
    pub fn fetch(&mut self, addr: u64, bytes: u16, instrs: u16) -> io::Result<()> {
        self.record(Record::Fetch {
            addr,
            bytes,
            instrs,
        })
    }

    /// LOAD record.
    pub fn load(&mut self, addr: u64, size: u8) -> io::Result<()> {
        self.record(Record::Load { addr, size })
    }

    /// STORE record.
    pub fn store(&mut self, addr: u64, size: u8) -> io::Result<()> {
        self.record(Record::Store { addr, size })
    }

    /// STAGE record.
    pub fn stage(&mut self, stage: u16) -> io::Result<()> {
        self.record(Record::Stage(stage))
    }

    /// Decompressed bytes written so far (magic included).
    pub fn raw_bytes(&self) -> u64 {
        self.bytes
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Writes END, flushes and finishes the zstd frame; returns the sink.
    pub fn finish(mut self) -> io::Result<W> {
        self.record(Record::End)?;
        self.enc.write_all(&self.buf)?;
        let mut w = self.enc.finish()?;
        w.flush()?;
        Ok(w)
    }
}

/// One `[[stage]]` entry of the sidecar.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct StageEntry {
    /// The id STAGE records carry.
    pub id: u16,
    /// Human-readable name.
    pub name: String,
    /// The functions that start the stage (mangled; the capture's stage map).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub symbols: Vec<String>,
}

/// The `[capture]` table of a sidecar: what stagesim reads of it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct CaptureMeta {
    /// The traced binary's load bias (`0x108000`): trace address = file
    /// address + bias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_bias: Option<String>,
}

/// The `<trace>.stages.toml` sidecar: `[[stage]] id = N, name = "..."`.
/// Unknown keys (anything else the capture writes) are ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Sidecar {
    /// Stage definitions in file order.
    #[serde(default, rename = "stage")]
    pub stages: Vec<StageEntry>,
    /// Capture metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<CaptureMeta>,
}

impl Sidecar {
    /// The sidecar path of `trace`: the trace path with `.stages.toml`
    /// appended (`t.stz` → `t.stz.stages.toml`).
    pub fn path_for(trace: &Path) -> PathBuf {
        let mut s = trace.as_os_str().to_owned();
        s.push(".stages.toml");
        PathBuf::from(s)
    }

    /// Parses sidecar text; `origin` prefixes errors.
    pub fn parse(text: &str, origin: &str) -> anyhow::Result<Self> {
        let s: Sidecar =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("{origin}: {}", e.message()))?;
        for (i, a) in s.stages.iter().enumerate() {
            if a.id == NO_STAGE {
                anyhow::bail!("{origin}: stage '{}': id 0xFFFF means no stage", a.name);
            }
            if s.stages[..i].iter().any(|b| b.id == a.id) {
                anyhow::bail!("{origin}: stage id {} defined twice", a.id);
            }
        }
        Ok(s)
    }

    /// Reads the sidecar of `trace` if it exists.
    pub fn load_for(trace: &Path) -> anyhow::Result<Option<Self>> {
        let p = Self::path_for(trace);
        match std::fs::read_to_string(&p) {
            Ok(text) => Ok(Some(Self::parse(&text, &p.display().to_string())?)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow::anyhow!("{}: {e}", p.display())),
        }
    }

    /// Writes the sidecar of `trace`.
    pub fn write_for(&self, trace: &Path) -> anyhow::Result<()> {
        let p = Self::path_for(trace);
        std::fs::write(&p, toml::to_string(self)?)
            .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
    }
}

#[cfg(test)]
mod tests;
