//! Stage channel ABI v1: the shared area, per-vCPU stage counters (minor 2),
//! per-vCPU event rings, the stage map and the doorbell.
//!
//! The design follows KVM's steal-time MSR (a guest-chosen, registered area
//! updated under an odd/even version) with a port-I/O doorbell instead of an
//! MSR or a custom `vmcall`, which never reaches user space on these hosts
//! (`docs/design.md`, "Machine facts" and "The stage protocol").
//!
//! ```text
//! offset                         size                      writer
//! 0                              AreaHeader (64)           guest (host: tsc_khz)
//! STAGE_DESCS_OFFSET (64)        StageDesc × MAX_STAGES    guest
//! STAGE_MAP_OFFSET (576)         StageMap (192)            host
//! VCPU_STATES_OFFSET (768)       VcpuState (64) × MAX_VCPUS guest
//! RINGS_OFFSET (4864)            per vCPU: RingHeader (192) + StageEvent × ring_entries
//! Layout::counters_offset(0)     minor 2, with AREA_FLAG_COUNTERS:
//!                                VcpuCounters (768) × num_vcpus   guest
//! Layout::latency_offset(0)      minor 4, with AREA_FLAG_LATENCY too:
//!                                VcpuLatency (2176) × num_vcpus   guest
//! ```
//!
//! Protocol:
//! 1. The guest fills the header and stage descriptors of a page-aligned area
//!    in its RAM, writes the area's page frame number (GPA >> 12) to
//!    [`DOORBELL_REGISTER`] and reads the [`Status`] from [`DOORBELL_STATUS`]
//!    (an `in` of 4 bytes). With no stage device the read gives
//!    [`Status::NoDevice`] (open bus, all ones).
//! 2. Minor 2 (the guest set [`AREA_FLAG_COUNTERS`] and the host's map says
//!    `minor` ≥ 2): every stage switch updates the vCPU's [`VcpuCounters`]
//!    in a few plain stores — the load signal, which the host reads once per
//!    policy period. The rings carry an event trace only when the host asks
//!    for one ([`StageMap::trace_every`]), and a full ring drops the event
//!    and counts it ([`RingHeader::trace_dropped`]); nothing ever waits.
//! 3. Without counters (a v1.0/v1.1 guest, or a newer guest on an older
//!    host), per vCPU, a single-producer ring carries every switch: the
//!    guest writes `slot[head % ring_entries]` with `seq = head`, then
//!    publishes `head + 1` with release ordering. It never overwrites unread
//!    slots: when `head - tail == ring_entries` it counts a back-off in
//!    [`RingHeader::full_backoffs`] and waits for the host to advance `tail`.
//!    The host polls every ring's `head` (no exit), validates each event,
//!    counts it or drops it, and publishes `tail` with release ordering.
//! 4. The host writes the [`StageMap`] under a seqlock: `epoch` is odd while it
//!    writes and even when stable; readers retry on odd or changed epochs.
//!
//! Everything the guest writes is untrusted: the host snapshots the header at
//! registration, never reads it again, and checks every event's `seq` and
//! `stage`.

/// Area magic: ASCII "STGCHAN1" as a little-endian u64.
pub const AREA_MAGIC: u64 = u64::from_le_bytes(*b"STGCHAN1");
/// ABI version described by this module.
pub const ABI_VERSION: u32 = 1;
/// Minor version of the host side of the ABI, written into every stage map
/// ([`StageMap::minor`]). Minor versions only add what an older side
/// ignores — host-written fields a v1.0 host leaves 0, or guest-written
/// parts announced by a flag an older host never checks (minor 2's
/// counters) — so an older guest keeps working on a newer host and a newer
/// guest falls back on an older host (it reads a smaller `minor`).
///
/// * 1 — [`StageMap::owned`]: the vCPUs that are alone on their core.
/// * 2 — per-vCPU stage counters ([`VcpuCounters`], [`AREA_FLAG_COUNTERS`]),
///   lossy trace rings ([`StageMap::trace_every`],
///   [`RingHeader::trace_dropped`]) and [`AreaHeader::register_tsc`].
/// * 3 — [`StageMap::visit`]: the stage-visit policy the host asks each
///   vCPU's scheduler to use ([`VisitPolicy`], temporal staging).
/// * 4 — per-vCPU request-latency histograms ([`VcpuLatency`],
///   [`AREA_FLAG_LATENCY`]): requests with a start and an end.
pub const ABI_MINOR: u64 = 4;
/// [`AreaHeader::flags`] bit (minor 2): the guest laid out one
/// [`VcpuCounters`] block per vCPU after the rings
/// ([`Layout::counters_offset`]) and, once the host's map says `minor` ≥ 2,
/// keeps the stage load there instead of in the rings. A host that does not
/// know the flag ignores it (it never checked `flags`), and the guest, which
/// then reads `minor` < 2, reports through the rings as before.
pub const AREA_FLAG_COUNTERS: u32 = 1;
/// [`AreaHeader::flags`] bit (minor 4), with [`AREA_FLAG_COUNTERS`]: one
/// [`VcpuLatency`] block per vCPU follows the counter blocks
/// ([`Layout::latency_offset`]), where the guest records the latency of
/// the requests it times once the host's map says `minor` ≥ 4. Without
/// the counters flag it is ignored. An older host ignores it too (it never
/// checked `flags`) and the guest, reading `minor` < 4, records nothing.
pub const AREA_FLAG_LATENCY: u32 = 2;
/// Largest number of stages (stage ids are `0..num_stages`).
pub const MAX_STAGES: usize = 16;
/// Largest number of vCPUs (the stage map holds one 64-bit vCPU mask per stage).
pub const MAX_VCPUS: usize = 64;
/// Largest ring size in entries (a power of two).
pub const MAX_RING_ENTRIES: u32 = 1 << 16;
/// Stage id in an event that means "the thread left its stage" (`stage_exit`).
pub const STAGE_NONE: u32 = u32::MAX;
/// Thread id in a [`STAGE_NONE`] event that marks the vCPU idle (its run
/// queue is empty), so the host stops attributing vCPU time to a stage. Not a
/// request exit.
pub const IDLE_THREAD: u32 = u32::MAX;
/// Page size for the area's alignment and size (bytes).
pub const PAGE_SIZE: u64 = 4096;

/// Doorbell port for REGISTER: `out` the area's PFN (GPA >> 12), 32 bits.
pub const DOORBELL_REGISTER: u16 = 0x610;
/// Doorbell port for UNREGISTER: `out` any value.
pub const DOORBELL_UNREGISTER: u16 = 0x614;
/// Doorbell port for WAIT: `out` a timeout in µs (0 means the maximum,
/// [`WAIT_MAX_US`]). The VMM parks the calling vCPU until a WAKE for it or
/// the timeout.
pub const DOORBELL_WAIT: u16 = 0x618;
/// Doorbell port for WAKE: `out` the index of the vCPU to wake.
pub const DOORBELL_WAKE: u16 = 0x61c;
/// Status port: an `in` of 4 bytes returns the [`Status`] of this vCPU's last
/// doorbell command. The same port number as REGISTER (reads and writes are
/// distinct operations).
pub const DOORBELL_STATUS: u16 = DOORBELL_REGISTER;
/// Longest WAIT the VMM honours (µs).
pub const WAIT_MAX_US: u32 = 100_000;

/// Result of a doorbell command.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// The area is not inside guest RAM (or overlaps the VMM's fixed structures).
    BadRange = 1,
    /// `area_size` is not a non-zero multiple of [`PAGE_SIZE`].
    BadAlignment = 2,
    /// Wrong [`AREA_MAGIC`].
    BadMagic = 3,
    /// Unsupported ABI version.
    BadVersion = 4,
    /// Header fields are inconsistent: counts above the maxima, `num_vcpus`
    /// not the VM's, ring size not a power of two, or the layout does not fit
    /// `area_size`.
    BadLayout = 5,
    /// REGISTER while an area is registered.
    AlreadyRegistered = 6,
    /// UNREGISTER without a registered area.
    NotRegistered = 7,
    /// WAKE of a vCPU index that does not exist.
    BadVcpu = 8,
    /// No stage device (VM started with `--no-stage-device`): open bus.
    NoDevice = 0xffff_ffff,
}

impl Status {
    /// Decodes a status read from [`DOORBELL_STATUS`]; unknown values are
    /// `None`.
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Ok,
            1 => Self::BadRange,
            2 => Self::BadAlignment,
            3 => Self::BadMagic,
            4 => Self::BadVersion,
            5 => Self::BadLayout,
            6 => Self::AlreadyRegistered,
            7 => Self::NotRegistered,
            8 => Self::BadVcpu,
            0xffff_ffff => Self::NoDevice,
            _ => return None,
        })
    }
}

/// Header at offset 0 of the area (64 bytes). Written by the guest before
/// REGISTER, except `tsc_khz` which the host fills in at REGISTER.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AreaHeader {
    /// [`AREA_MAGIC`].
    pub magic: u64,
    /// [`ABI_VERSION`].
    pub version: u32,
    /// `size_of::<AreaHeader>()` (64).
    pub header_size: u32,
    /// Size of the whole area in bytes, a multiple of [`PAGE_SIZE`].
    pub area_size: u64,
    /// Number of vCPUs (rings), equal to the VM's vCPU count, ≤ [`MAX_VCPUS`].
    pub num_vcpus: u32,
    /// Number of stages, 1..=[`MAX_STAGES`].
    pub num_stages: u32,
    /// Entries per ring, a power of two, 2..=[`MAX_RING_ENTRIES`].
    pub ring_entries: u32,
    /// Bit flags: [`AREA_FLAG_COUNTERS`], [`AREA_FLAG_LATENCY`]; other bits
    /// are reserved (0) and ignored by the host.
    pub flags: u32,
    /// Guest TSC frequency in kHz, written by the host at REGISTER (0 if unknown).
    pub tsc_khz: u64,
    /// Minor 2: the guest's TSC read just before it rings REGISTER (0 if it
    /// does not say). The host pairs it with its own clock at the REGISTER
    /// exit to estimate the guest's TSC "now" when it reads the counters
    /// (an open stage visit is charged up to then); untrusted, only ever a
    /// hint (docs/stage-protocol.md §5a).
    pub register_tsc: u64,
    /// Reserved, 0.
    pub reserved: u64,
}

/// A stage's descriptor (32 bytes), written by the guest: its name, NUL-padded
/// UTF-8, so the operator's configuration and reports can use names.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageDesc {
    /// Stage name, NUL-padded.
    pub name: [u8; 32],
}

/// The stage map (192 bytes), written by the host: which vCPUs serve each
/// stage.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageMap {
    /// Seqlock epoch: odd while the host writes, even when stable; it grows by
    /// 2 with every published map (the first is 2).
    pub epoch: u64,
    /// Per stage, a bit mask of the vCPUs that serve it (bit i = vCPU i).
    pub vcpus: [u64; MAX_STAGES],
    /// Minor ABI 1: bit i set when vCPU i is the only vCPU pinned to its
    /// host core, so it may idle by polling its run queue instead of parking
    /// with WAIT (docs/stage-protocol.md, "Idle"). Valid when `minor` ≥ 1.
    pub owned: u64,
    /// The host's [`ABI_MINOR`] (0 from a v1.0 host, which never writes it).
    pub minor: u64,
    /// Minor 2: the event trace the host asks for, written by the host at
    /// any time (one word, outside the seqlock): 0 = no trace (the rings
    /// stay empty), N ≥ 1 = every Nth event of each kind per vCPU goes to
    /// the vCPU's ring too (1 = every event). Only read by a guest that uses
    /// counters.
    pub trace_every: u64,
    /// Minor 3: the stage-visit policy's code ([`VisitPolicy::code`]),
    /// written under the seqlock with the masks: the order in which each
    /// vCPU's scheduler serves the threads queued for the stages it serves
    /// (temporal staging, seed 002 §3.1). 0 ([`VisitPolicy::Fifo`]) from an
    /// older host; a code the guest does not know means FIFO.
    pub visit: u64,
    /// Reserved, 0.
    pub reserved: [u64; 3],
}

/// Per-ring control block (192 bytes, three 64-byte cache lines so guest and
/// host writes never share a line).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingHeader {
    /// Index of the next slot the guest writes (free-running); published with
    /// release ordering after the slot.
    pub head: u64,
    /// Pads `head` to a cache line; guest-private, never read by the host.
    /// Linux's libstage uses `pad0[0]` as its writers' spin lock when rseq
    /// is unavailable (`guest-agent/linux/README.md`).
    pub pad0: [u64; 7],
    /// Index of the next slot the host reads (free-running), written by the host.
    pub tail: u64,
    /// Reserved, pads `tail` to a cache line.
    pub pad1: [u64; 7],
    /// Times the guest found this ring full and backed off (guest-written,
    /// informational; rings-only mode).
    pub full_backoffs: u64,
    /// Minor 2: trace events the guest dropped because this ring was full
    /// (guest-written, informational; a traced guest never waits).
    pub trace_dropped: u64,
    /// Reserved.
    pub pad2: [u64; 6],
}

/// One stage event (32 bytes), guest → host.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageEvent {
    /// Free-running index of this event in its ring; must equal the slot's
    /// absolute index (a mismatch is a torn, stale or forged entry).
    pub seq: u64,
    /// Guest TSC when the switch happened.
    pub tsc: u64,
    /// Stage entered, or [`STAGE_NONE`] when the thread left its stage.
    pub stage: u32,
    /// Guest thread id.
    pub thread: u32,
    /// Reserved, 0.
    pub reserved: u64,
}

/// Per-vCPU scheduling state (64 bytes), written by the guest's scheduler and
/// read by the host as hints (untrusted: clamped, never trusted for memory
/// access).
///
/// Wake-up protocol (no lost wake-ups): a vCPU about to idle stores
/// `parked = 1`, re-checks its run queue, then sends WAIT; it stores
/// `parked = 0` when it runs again. A vCPU that queues a thread on vCPU `v`
/// makes it visible in `v`'s queue first (and `runq_depth` non-zero, at the
/// latest when it sees `v` parked), then sends WAKE(`v`) if `v`'s `parked`
/// is 1. As a safety net the host's scheduler thread wakes every parked
/// vCPU whose `runq_depth` it sees non-zero: at every drain of a rings
/// guest, once per policy period for a counters guest.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuState {
    /// Threads queued on this vCPU, not counting the running one.
    pub runq_depth: u32,
    /// 1 while the vCPU idles (about to WAIT or waiting), else 0.
    pub parked: u32,
    /// Per stage, runnable threads (queued or running) on this vCPU: the
    /// thesis' stage load (seed 000, `docs/design.md`, §4.5).
    pub runnable: [u16; MAX_STAGES],
    /// Threads that ran a stage on this vCPU although the map does not give
    /// it the stage, because no vCPU served it (counted fallbacks).
    pub fallbacks: u32,
    /// Reserved.
    pub reserved: [u32; 5],
}

const _: () = assert!(core::mem::size_of::<AreaHeader>() == 64);
const _: () = assert!(core::mem::offset_of!(AreaHeader, area_size) == 16);
const _: () = assert!(core::mem::offset_of!(AreaHeader, num_vcpus) == 24);
const _: () = assert!(core::mem::offset_of!(AreaHeader, ring_entries) == 32);
const _: () = assert!(core::mem::offset_of!(AreaHeader, tsc_khz) == 40);
const _: () = assert!(core::mem::size_of::<StageDesc>() == 32);
const _: () = assert!(core::mem::size_of::<StageMap>() == 192);
const _: () = assert!(core::mem::offset_of!(StageMap, vcpus) == 8);
const _: () = assert!(core::mem::size_of::<RingHeader>() == 192);
const _: () = assert!(core::mem::offset_of!(RingHeader, tail) == 64);
const _: () = assert!(core::mem::offset_of!(RingHeader, full_backoffs) == 128);
const _: () = assert!(core::mem::offset_of!(RingHeader, trace_dropped) == 136);
const _: () = assert!(core::mem::offset_of!(AreaHeader, register_tsc) == 48);
const _: () = assert!(core::mem::offset_of!(StageMap, trace_every) == 152);
const _: () = assert!(core::mem::offset_of!(StageMap, visit) == 160);
const _: () = assert!(core::mem::size_of::<StageEvent>() == 32);
const _: () = assert!(core::mem::offset_of!(StageEvent, stage) == 16);
const _: () = assert!(core::mem::offset_of!(StageEvent, thread) == 20);
const _: () = assert!(core::mem::size_of::<VcpuState>() == 64);
const _: () = assert!(core::mem::offset_of!(VcpuState, parked) == 4);
const _: () = assert!(core::mem::offset_of!(VcpuState, runnable) == 8);

mod layout;
pub use layout::*;
mod counter_block;
pub use counter_block::*;
mod latency;
pub use latency::*;
mod visit;
pub use visit::VisitPolicy;

/// FNV-1a (32-bit) of a stage name, for compact logs (Fowler, Noll, Vo).
pub fn name_hash(name: &[u8]) -> u32 {
    name.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trip() {
        for s in [
            Status::Ok,
            Status::BadRange,
            Status::BadVcpu,
            Status::NoDevice,
        ] {
            assert_eq!(Status::from_u32(s as u32), Some(s));
        }
        assert_eq!(Status::from_u32(9), None);
    }
}
