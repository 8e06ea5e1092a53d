//! virtio-blk request handling (VIRTIO 1.2 §5.2) on `virtio-queue`.
//!
//! A request is a descriptor chain: a 16-byte device-readable header
//! (`type`, reserved, `sector`), data descriptors (device-writable for reads,
//! device-readable for writes), and a final 1-byte device-writable status.
//! Every guest-controlled value is checked: chain shape, lengths (data a
//! multiple of 512 bytes, at most [`MAX_REQUEST_BYTES`]), sector range,
//! guest addresses (through `vm-memory`), and the read-only flag. A bad
//! request gets `VIRTIO_BLK_S_IOERR` (or `UNSUPP`) when its status byte can
//! be written; otherwise it is completed with length 0 and counted.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

/// Bytes per sector (VIRTIO 1.2 §5.2.6).
pub const SECTOR_SIZE: u64 = 512;
/// Largest data payload of one request (bytes); larger requests are refused.
pub const MAX_REQUEST_BYTES: u64 = 1 << 20;
/// Length of the request header (bytes).
const HEADER_LEN: u32 = 16;
/// Length of the `GET_ID` answer (bytes, VIRTIO 1.2 §5.2.6).
const ID_LEN: usize = 20;

/// Counters of one block device.
#[derive(Debug, Default)]
pub struct BlockStats {
    /// Requests completed with `VIRTIO_BLK_S_OK`.
    pub ok: AtomicU64,
    /// Requests answered with an error status.
    pub errors: AtomicU64,
    /// Requests that could not even get a status (no writable status byte).
    pub dropped: AtomicU64,
    /// Available-ring entries naming a descriptor outside the queue (skipped).
    pub bad_heads: AtomicU64,
    /// Bytes read from the backing file.
    pub bytes_read: AtomicU64,
    /// Bytes written to the backing file.
    pub bytes_written: AtomicU64,
}

/// A snapshot of [`BlockStats`] for the report.
pub use stagevm_report::BlockReport;

/// Alignment of an `O_DIRECT` disk's bounce buffer (bytes): a page, which
/// covers logical blocks of 512 and 4096 bytes.
const DIRECT_ALIGN: usize = 4096;

/// A virtio-blk backend over a host file.
pub struct Block {
    file: File,
    sectors: u64,
    readonly: bool,
    /// `GET_ID`'s answer: the device's name, NUL-padded.
    serial: [u8; ID_LEN],
    /// With `direct=on`: the aligned bounce buffer every request goes
    /// through whole (`O_DIRECT` needs aligned buffers, offsets and
    /// lengths; the guest's descriptors are neither).
    direct: Option<std::sync::Mutex<Vec<u8>>>,
    /// Counters.
    pub stats: BlockStats,
}

/// Why a request is refused: the status to answer with.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    IoErr(&'static str),
    Unsupported(u32),
}

impl Block {
    /// A device over `file` of `len` bytes (rounded down to whole sectors).
    pub fn new(file: File, len: u64, readonly: bool) -> Self {
        let mut serial = [0u8; ID_LEN];
        serial[..11].copy_from_slice(b"stagevm-blk");
        Self {
            file,
            sectors: len / SECTOR_SIZE,
            readonly,
            serial,
            direct: None,
            stats: BlockStats::default(),
        }
    }

    /// `GET_ID` answers `name` (its first `ID_LEN` (20) bytes).
    pub fn set_serial(&mut self, name: &str) {
        self.serial = [0; ID_LEN];
        let n = name.len().min(ID_LEN);
        self.serial[..n].copy_from_slice(&name.as_bytes()[..n]);
    }

    /// Every request goes through one aligned buffer (the file was opened
    /// `O_DIRECT`).
    pub fn use_direct_io(&mut self) {
        let len = MAX_REQUEST_BYTES as usize + DIRECT_ALIGN;
        self.direct = Some(std::sync::Mutex::new(vec![0; len]));
    }

    /// Capacity in sectors.
    pub fn sectors(&self) -> u64 {
        self.sectors
    }

    /// Whether writes are refused.
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// Serves one request chain; returns the number of bytes written into
    /// guest memory (for the used ring). Never panics on guest input.
    pub fn handle<M>(&self, mem: &GuestMemoryMmap, chain: DescriptorChain<M>) -> u32
    where
        M: std::ops::Deref<Target = GuestMemoryMmap>,
    {
        let descs: Vec<Descriptor> = chain.collect();
        // The status byte is the last descriptor: device-writable, ≥ 1 byte.
        let status = descs
            .last()
            .filter(|d| d.is_write_only() && d.len() >= 1)
            .map(|d| d.addr());
        let outcome = match status {
            Some(_) => self.execute(mem, &descs[..descs.len() - 1]),
            None => Err(Refusal::IoErr("no writable status descriptor")),
        };
        let (code, written) = match outcome {
            Ok(written) => (VIRTIO_BLK_S_OK, written),
            Err(Refusal::IoErr(why)) => {
                tracing::debug!("virtio-blk request refused: {why}");
                (VIRTIO_BLK_S_IOERR, 0)
            }
            Err(Refusal::Unsupported(t)) => {
                tracing::debug!("virtio-blk request type {t} unsupported");
                (VIRTIO_BLK_S_UNSUPP, 0)
            }
        };
        match status {
            Some(addr) if mem.write_obj(code as u8, addr).is_ok() => {
                let counter = if code == VIRTIO_BLK_S_OK {
                    &self.stats.ok
                } else {
                    &self.stats.errors
                };
                counter.fetch_add(1, Ordering::Relaxed);
                written.saturating_add(1)
            }
            _ => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                0
            }
        }
    }

    /// Parses the header and moves the data; returns bytes written to guest
    /// memory (status excluded).
    fn execute(&self, mem: &GuestMemoryMmap, descs: &[Descriptor]) -> Result<u32, Refusal> {
        let (header, data) = descs.split_first().ok_or(Refusal::IoErr("empty chain"))?;
        if header.is_write_only() || header.len() < HEADER_LEN {
            return Err(Refusal::IoErr("bad header descriptor"));
        }
        let kind: u32 = mem
            .read_obj(header.addr())
            .map_err(|_| Refusal::IoErr("header outside guest memory"))?;
        let sector: u64 = mem
            .read_obj(
                header
                    .addr()
                    .checked_add(8)
                    .ok_or(Refusal::IoErr("header address"))?,
            )
            .map_err(|_| Refusal::IoErr("header outside guest memory"))?;
        let total: u64 = data.iter().map(|d| u64::from(d.len())).sum();
        match kind {
            VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT => {
                let write = kind == VIRTIO_BLK_T_OUT;
                if write && self.readonly {
                    return Err(Refusal::IoErr("write to a read-only disk"));
                }
                if data.iter().any(|d| d.is_write_only() == write) {
                    return Err(Refusal::IoErr("data descriptor direction"));
                }
                if total == 0 || !total.is_multiple_of(SECTOR_SIZE) || total > MAX_REQUEST_BYTES {
                    return Err(Refusal::IoErr("data length"));
                }
                let end = sector
                    .checked_add(total / SECTOR_SIZE)
                    .ok_or(Refusal::IoErr("sector overflow"))?;
                if end > self.sectors {
                    return Err(Refusal::IoErr("sector past the end of the disk"));
                }
                let mut offset = sector * SECTOR_SIZE;
                if let Some(bounce) = &self.direct {
                    return self.direct_io(mem, data, offset, total, write, bounce);
                }
                let mut buf = Vec::new();
                for d in data {
                    buf.resize(d.len() as usize, 0);
                    if write {
                        mem.read_slice(&mut buf, d.addr())
                            .map_err(|_| Refusal::IoErr("data outside guest memory"))?;
                        self.file
                            .write_all_at(&buf, offset)
                            .map_err(|_| Refusal::IoErr("host write failed"))?;
                        self.stats
                            .bytes_written
                            .fetch_add(buf.len() as u64, Ordering::Relaxed);
                    } else {
                        self.file
                            .read_exact_at(&mut buf, offset)
                            .map_err(|_| Refusal::IoErr("host read failed"))?;
                        mem.write_slice(&buf, d.addr())
                            .map_err(|_| Refusal::IoErr("data outside guest memory"))?;
                        self.stats
                            .bytes_read
                            .fetch_add(buf.len() as u64, Ordering::Relaxed);
                    }
                    offset += buf.len() as u64;
                }
                Ok(if write { 0 } else { total as u32 })
            }
            VIRTIO_BLK_T_FLUSH => {
                if !self.readonly {
                    self.file
                        .sync_data()
                        .map_err(|_| Refusal::IoErr("host flush failed"))?;
                }
                Ok(0)
            }
            VIRTIO_BLK_T_GET_ID => {
                let d = data
                    .first()
                    .filter(|d| d.is_write_only())
                    .ok_or(Refusal::IoErr("GET_ID without a writable buffer"))?;
                let n = (d.len() as usize).min(ID_LEN);
                mem.write_slice(&self.serial[..n], d.addr())
                    .map_err(|_| Refusal::IoErr("data outside guest memory"))?;
                Ok(n as u32)
            }
            other => Err(Refusal::Unsupported(other)),
        }
    }
}

impl Block {
    /// A read or write of `total` bytes at byte `offset` through the
    /// aligned `bounce` buffer: one host `pread`/`pwrite` of the whole
    /// request, the guest's descriptors gathered or scattered around it.
    fn direct_io(
        &self,
        mem: &GuestMemoryMmap,
        data: &[Descriptor],
        offset: u64,
        total: u64,
        write: bool,
        bounce: &std::sync::Mutex<Vec<u8>>,
    ) -> Result<u32, Refusal> {
        let mut raw = bounce.lock().unwrap_or_else(|p| p.into_inner());
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN);
        let buf = &mut raw[start..start + total as usize];
        let mut at = 0usize;
        for d in data {
            let part = &mut buf[at..at + d.len() as usize];
            if write {
                mem.read_slice(part, d.addr())
                    .map_err(|_| Refusal::IoErr("data outside guest memory"))?;
            }
            at += d.len() as usize;
        }
        if write {
            self.file
                .write_all_at(buf, offset)
                .map_err(|_| Refusal::IoErr("host write failed (O_DIRECT)"))?;
            self.stats.bytes_written.fetch_add(total, Ordering::Relaxed);
            return Ok(0);
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|_| Refusal::IoErr("host read failed (O_DIRECT)"))?;
        let mut at = 0usize;
        for d in data {
            mem.write_slice(&buf[at..at + d.len() as usize], d.addr())
                .map_err(|_| Refusal::IoErr("data outside guest memory"))?;
            at += d.len() as usize;
        }
        self.stats.bytes_read.fetch_add(total, Ordering::Relaxed);
        Ok(total as u32)
    }
}

/// Reads the status byte a request got (tests).
pub fn read_status(mem: &GuestMemoryMmap, addr: GuestAddress) -> Option<u8> {
    mem.read_obj(addr).ok()
}
