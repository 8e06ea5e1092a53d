//! The control page: a file both the preload library (in the server) and
//! its controller (`stagevm-gatectl`, a benchmark, a test) map shared. The
//! controller writes the gate's mode, visit policy and wait bound; the
//! library reads them at stage points (one load each) and writes its
//! counters there. It plays the part the stage channel's shared page plays
//! in a guest: the chosen mode reaches the library through shared memory.
//!
//! Layout (`repr(C)`, every field an aligned atomic, little-endian, all
//! sizes fixed): [`Control`], 4 KiB of header then [`MAX_LANES`] lane
//! blocks and [`MAX_SLOTS`] thread slots; [`CONTROL_BYTES`] in all.
//!
//! Nothing in the page is trusted by the library beyond its range: a mode
//! or policy code it does not know reads as "off" / SRPT, and the wait
//! bound is clamped to [`MAX_WAIT_US_RANGE`].

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use hypercall_abi::stage::{VisitPolicy, MAX_STAGES};

/// `"SVGC"`, the page's magic.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SVGC");
/// Layout version.
pub const VERSION: u32 = 2;
/// Lanes (CPUs) the page has blocks for.
pub const MAX_LANES: usize = 64;
/// Threads the page has slots for; a thread past them runs with its stage
/// points counted in [`Header::unslotted`] and never gated.
pub const MAX_SLOTS: usize = 1024;
/// The range the wait bound is clamped to, µs.
pub const MAX_WAIT_US_RANGE: std::ops::RangeInclusive<u32> = 10..=1_000_000;
/// The default wait bound, µs: a few MariaDB requests' worth (a request of
/// `oltp_read_only` is ~50–100 µs of CPU on these machines).
pub const DEFAULT_MAX_WAIT_US: u32 = 500;

/// Gate mode codes ([`Control::mode`]).
pub mod mode {
    /// Stage points count visits; nobody waits, no thread is bound.
    pub const OFF: u32 = 0;
    /// The temporal gate (lanes, queues, the visit policy).
    pub const TEMPORAL: u32 = 1;
}

/// One lane's counters (written by the library under the lane's lock).
#[repr(C)]
#[derive(Debug, Default)]
pub struct LaneBlock {
    /// The CPU this lane is, or `u32::MAX` for an unused block.
    pub cpu: AtomicU32,
    /// Threads bound to the lane now.
    pub threads: AtomicU32,
    /// Visits begun (token grants).
    pub visits: AtomicU64,
    /// Handoffs (a grant that wakes another thread).
    pub handoffs: AtomicU64,
    /// Waits that reached the bound.
    pub timeouts: AtomicU64,
    /// Cohorts ended and the threads they served.
    pub cohorts: AtomicU64,
    /// See [`LaneBlock::cohorts`].
    pub cohort_threads: AtomicU64,
    /// Waiters released by a gate switched off.
    pub released: AtomicU64,
    /// Time threads spent blocked in the gate, ns.
    pub wait_ns: AtomicU64,
    /// Stage points and waits that went on without the gate because the
    /// lane's lock was not had within 20 ms (its holder stopped, e.g. by
    /// a tracer; `gate::lanes`).
    pub bypasses: AtomicU64,
    /// Padding to 128 bytes.
    _pad: [u64; 7],
}

/// One thread's counters (written by that thread only).
#[repr(C)]
#[derive(Debug, Default)]
pub struct SlotBlock {
    /// The thread's id (0: slot free and never used).
    pub tid: AtomicU32,
    /// The lane it is bound to, or `u32::MAX`.
    pub lane: AtomicU32,
    /// Requests begun (request-marker entries).
    pub requests: AtomicU64,
    /// Visits of each stage: switches into it, and the first stage point
    /// of each request (after a request marker) — the entries the stage
    /// channel reports.
    pub visits: [AtomicU64; MAX_STAGES],
}

/// The page's header.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    /// [`MAGIC`] once laid out.
    pub magic: AtomicU32,
    /// [`VERSION`].
    pub version: AtomicU32,
    /// Controller → library: [`mode`] code.
    pub mode: AtomicU32,
    /// Controller → library: the visit policy's ABI code (`VisitPolicy`).
    pub policy: AtomicU32,
    /// Controller → library: the wait bound, µs.
    pub max_wait_us: AtomicU32,
    /// Library → controller: the server's pid.
    pub pid: AtomicU32,
    /// Library: stages in the map.
    pub stages: AtomicU32,
    /// Library: stage points installed / functions left alone.
    pub hooks_installed: AtomicU32,
    /// See [`Header::hooks_installed`].
    pub hooks_skipped: AtomicU32,
    /// Library: lanes in use.
    pub lanes: AtomicU32,
    /// Library: stage points hit by threads without a slot.
    pub unslotted: AtomicU64,
    /// Library: times the gate was switched off with threads bound.
    pub releases: AtomicU64,
    /// Library: 1 when stage points report through the stage channel (in
    /// a stagevm guest: `channel`), which then also sets `mode` and
    /// `policy` from the VMM's map.
    pub channel: AtomicU32,
    /// Padding (keeps the 64-bit fields aligned).
    _pad0: AtomicU32,
    /// Library: the epoch of the VMM's map the mode last followed.
    pub map_epoch: AtomicU64,
    /// Library: maps followed.
    pub map_changes: AtomicU64,
    /// Library: switches libstage did not report (counted by it as
    /// dropped too).
    pub channel_drops: AtomicU64,
}

/// The whole page.
#[repr(C)]
#[derive(Debug)]
pub struct Control {
    /// The header.
    pub header: Header,
    _pad: [u8; 4096 - std::mem::size_of::<Header>()],
    /// Lane blocks.
    pub lanes: [LaneBlock; MAX_LANES],
    /// Thread slots.
    pub slots: [SlotBlock; MAX_SLOTS],
}

/// Bytes of the page.
pub const CONTROL_BYTES: usize = std::mem::size_of::<Control>();

impl Control {
    /// The mode to follow: [`mode::TEMPORAL`] or [`mode::OFF`] (any other
    /// code).
    #[inline]
    pub fn mode(&self) -> u32 {
        match self.header.mode.load(Relaxed) {
            mode::TEMPORAL => mode::TEMPORAL,
            _ => mode::OFF,
        }
    }

    /// The visit policy; SRPT for a code it does not know, and FIFO (no
    /// temporal order) reads as SRPT too: the gate only runs temporal
    /// policies.
    pub fn policy(&self) -> VisitPolicy {
        match VisitPolicy::from_code(u64::from(self.header.policy.load(Relaxed))) {
            Some(p) if p.is_temporal() => p,
            _ => VisitPolicy::Srpt,
        }
    }

    /// The wait bound, ns (clamped to [`MAX_WAIT_US_RANGE`]).
    pub fn max_wait_ns(&self) -> u64 {
        let us = self.header.max_wait_us.load(Relaxed);
        u64::from(us.clamp(*MAX_WAIT_US_RANGE.start(), *MAX_WAIT_US_RANGE.end())) * 1_000
    }

    /// Sums the threads' visits per stage.
    pub fn stage_visits(&self) -> [u64; MAX_STAGES] {
        let mut out = [0u64; MAX_STAGES];
        for s in &self.slots {
            for (o, v) in out.iter_mut().zip(&s.visits) {
                *o = o.wrapping_add(v.load(Relaxed));
            }
        }
        out
    }

    /// Sums the threads' requests.
    pub fn requests(&self) -> u64 {
        self.slots.iter().map(|s| s.requests.load(Relaxed)).sum()
    }
}

/// A mapped control page.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<Control>,
}

// SAFETY: the page holds atomics only; sharing references across threads is
// what it is for.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the page in `path`, creating the file (mode 0600) and laying it
    /// out with `init` when it is new, shorter than the page or has another
    /// magic or version. Errors: opening, sizing or mapping the file.
    pub fn open(path: &Path, init: impl FnOnce(&Control)) -> io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let fresh = file.metadata()?.len() < CONTROL_BYTES as u64;
        if fresh {
            file.set_len(CONTROL_BYTES as u64)?;
        }
        let m = Self::map(libc::MAP_SHARED, file.as_raw_fd())?;
        let c = m.get();
        if fresh
            || c.header.magic.load(Relaxed) != MAGIC
            || c.header.version.load(Relaxed) != VERSION
        {
            Self::lay_out(c);
            init(c);
            c.header.magic.store(MAGIC, Relaxed);
        }
        Ok(m)
    }

    /// An anonymous page (no controller): laid out and set by `init`.
    pub fn anonymous(init: impl FnOnce(&Control)) -> io::Result<Self> {
        let m = Self::map(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)?;
        Self::lay_out(m.get());
        init(m.get());
        m.get().header.magic.store(MAGIC, Relaxed);
        Ok(m)
    }

    /// Maps [`CONTROL_BYTES`] read-write with `flags` from `fd` (-1 for an
    /// anonymous mapping, which the kernel zeroes).
    fn map(flags: libc::c_int, fd: libc::c_int) -> io::Result<Self> {
        // SAFETY: a new mapping at an address the kernel picks; for a file,
        // the caller sized it to the page first. The fd may be closed
        // afterwards.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CONTROL_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
        })
    }

    fn lay_out(c: &Control) {
        let h = &c.header;
        h.version.store(VERSION, Relaxed);
        h.mode.store(mode::OFF, Relaxed);
        h.policy.store(VisitPolicy::Srpt.code() as u32, Relaxed);
        h.max_wait_us.store(DEFAULT_MAX_WAIT_US, Relaxed);
        for l in &c.lanes {
            l.cpu.store(u32::MAX, Relaxed);
        }
        for s in &c.slots {
            s.lane.store(u32::MAX, Relaxed);
        }
    }

    /// The page.
    #[inline]
    pub fn get(&self) -> &Control {
        // SAFETY: the mapping lives as long as `self` and is CONTROL_BYTES
        // long, page-aligned, and holds only atomics (any bit pattern is
        // valid).
        unsafe { self.ptr.as_ref() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `open`/`anonymous` mapped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), CONTROL_BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_fixed_and_a_second_mapping_sees_the_first() {
        assert_eq!(std::mem::size_of::<LaneBlock>(), 128);
        assert_eq!(std::mem::offset_of!(Control, lanes), 4096);
        let dir = std::env::temp_dir().join(format!("svgc-{}", std::process::id()));
        let a = Mapping::open(&dir, |c| c.header.max_wait_us.store(77, Relaxed)).unwrap();
        let b = Mapping::open(&dir, |_| panic!("laid out twice")).unwrap();
        a.get().header.mode.store(mode::TEMPORAL, Relaxed);
        assert_eq!(b.get().mode(), mode::TEMPORAL);
        assert_eq!(b.get().max_wait_ns(), 77_000);
        // Out-of-range values read as the safe ones.
        a.get().header.mode.store(9, Relaxed);
        a.get().header.policy.store(0, Relaxed);
        a.get().header.max_wait_us.store(0, Relaxed);
        assert_eq!(b.get().mode(), mode::OFF);
        assert_eq!(b.get().policy(), VisitPolicy::Srpt);
        assert_eq!(b.get().max_wait_ns(), 10_000);
        std::fs::remove_file(dir).unwrap();
    }
}
