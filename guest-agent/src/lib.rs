//! stagevm guest agent core (`no_std`).
//!
//! The guest side of the stage channel of [`hypercall_abi::stage`]: it lays out
//! and registers the shared area, reports stage switches without a VM exit
//! (`stage_enter` / `stage_exit`, the user-space API of the seeds, seed 000,
//! `docs/design.md`), reads the host's stage map with acquire ordering, and
//! decides which vCPU a thread should run a stage on ([`choose_from_map`],
//! the least-loaded rule).
//!
//! Two ways to report, chosen once at registration ([`Mode`]):
//! * [`Mode::Counters`] (ABI minor 2, when the area has counters and the
//!   host's map says `minor` ≥ 2): a switch is a transition of the vCPU's
//!   [`VcpuCounters`](hypercall_abi::stage::VcpuCounters) — usually one
//!   load and two plain stores, a TSC read only for the visits it times
//!   (about one per 16 µs), never a wait. The event also goes to the vCPU's
//!   ring when the host asks for a trace, and is dropped (and counted) when
//!   that ring is full.
//! * [`Mode::Rings`] (a host older than minor 2, or an area without
//!   counters): every switch is an event in the vCPU's ring; a full ring is
//!   waited for, never overwritten.
//!
//! Requests (ABI minor 4): a caller that keeps a [`RequestClock`] per
//! thread and reports through [`Agent::request_begin`],
//! [`Agent::stage_enter_request`] and [`Agent::stage_exit_request`] gets
//! one request in N timed, its latency recorded in the histogram of the
//! vCPU it ends on (the `latency` module).
//!
//! It also publishes each vCPU's scheduling state
//! ([`VcpuState`](hypercall_abi::stage::VcpuState), the `vcpu_state`
//! module): run-queue depth, parked flag and fallback count. Per-stage
//! runnable counts (`VcpuState::runnable`) are not maintained: the field
//! stays in the ABI but the agent leaves it at 0. The host's stage map is
//! read in the `map` module ([`Agent::read_map`], [`MapSnapshot`]).
//!
//! When registration fails (for example the VM runs with
//! `--no-stage-device`), the agent stays inactive and every call is a cheap
//! no-op, so one guest image runs with or without the channel.
//!
//! Platform specifics (port I/O, TSC) come through the [`Platform`] trait so
//! the same core serves the test unikernel and host-side tests.
//!
//! Cargo feature `test-hooks` (off by default): adds the `Agent` methods
//! documented as "Test hook" (`write_raw_event`, `corrupt_head`), which
//! forge bad ring entries to test the host's validation. Only test guests
//! enable it.
#![no_std]

#[cfg(test)]
extern crate std;

use core::ptr;
use core::sync::atomic::{fence, AtomicU64, Ordering};

pub use hypercall_abi::stage::VisitPolicy;
use hypercall_abi::stage::{
    stage_code, state_word, validate_header, AreaHeader, Layout, StageDesc, Status, CODE_IDLE,
    CODE_NONE, DOORBELL_REGISTER, DOORBELL_UNREGISTER, DOORBELL_WAIT, DOORBELL_WAKE, IDLE_THREAD,
    STAGE_DESCS_OFFSET, STAGE_NONE, TIMED_EVERY, TIMED_INTERVAL_NS, TIMED_STRIDE_MAX,
};

mod counter_writer;
mod map;
mod request_clock;
mod ring;
mod vcpu_state;
pub mod visit;

pub use map::{choose_from_map, MapSnapshot};
use map::{MAP_MINOR, MAP_TRACE_EVERY};
pub use request_clock::RequestClock;

/// What the agent needs from the machine it runs on.
pub trait Platform {
    /// `out` of `value` (32 bits) to doorbell `port`.
    fn doorbell(&self, port: u16, value: u32);
    /// `in` of 4 bytes from [`hypercall_abi::stage::DOORBELL_STATUS`].
    fn doorbell_status(&self) -> u32;
    /// Current TSC.
    fn tsc(&self) -> u64;
}

/// Outcome of a stage report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// [`Mode::Counters`]: counted in the vCPU's counters; `trace` says what
    /// became of the event in the trace ring.
    Counted {
        /// The trace event's fate.
        trace: Trace,
    },
    /// [`Mode::Rings`]: written to the ring after `backoffs` waits for a
    /// full ring (0 usually).
    Written {
        /// Times the ring was full before the event fit.
        backoffs: u32,
    },
    /// The agent is inactive (no channel): nothing was written.
    Inactive,
    /// The stage id is not one of the registered area's stages: nothing
    /// was written (the same in both modes).
    BadStage,
}

/// What became of a counted event in the trace ring ([`Mode::Counters`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trace {
    /// The host asks for no trace, or not for this event (sampling).
    Off,
    /// Written to the vCPU's ring.
    Written,
    /// The ring was full: dropped and counted in its header's
    /// `trace_dropped` (a traced guest never waits).
    Dropped,
}

/// How the agent reports stage switches, fixed at registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Per-vCPU counters (ABI minor 2); the rings carry an optional, lossy
    /// trace.
    Counters,
    /// Every switch is an event in the vCPU's ring (a host older than
    /// minor 2, or an area laid out without counters).
    Rings,
}

/// Where and how to lay out the area [`Agent::register`] registers.
#[derive(Clone, Copy, Debug)]
pub struct AreaSpec<'a> {
    /// Guest-physical address of the area (4 KiB aligned, PFN < 2³²).
    pub gpa: u64,
    /// Bytes available at the area (a multiple of 4 KiB, ≥ the layout's).
    pub size: u64,
    /// vCPUs of the VM (one ring and one counter block each).
    pub num_vcpus: u32,
    /// Stage names, in stage-id order (at most 16, each cut to 32 bytes).
    pub stage_names: &'a [&'a str],
    /// Entries per ring (a power of two, 2..=65,536).
    pub ring_entries: u32,
    /// Lay out per-vCPU counters (ABI minor 2). Without them the agent
    /// reports through the rings only, as a v1.1 guest does.
    pub counters: bool,
    /// With counters: one transition in this many starts a timed visit (the
    /// TSC is read at its start and end; 1 times every visit, a TSC read
    /// per transition). 0 (the default) paces them by time instead: about
    /// one per [`TIMED_INTERVAL_NS`]
    /// per vCPU, whatever the switch rate, or one in
    /// [`TIMED_EVERY`] when the host
    /// gives no TSC rate. Capped at
    /// [`TIMED_STRIDE_MAX`], so the
    /// trace flag, refreshed at timed visits, follows the host within that
    /// many transitions.
    pub timed_every: u64,
    /// With counters: lay out per-vCPU request-latency histograms too (ABI
    /// minor 4), where the agent records the requests it times
    /// ([`RequestClock`]).
    pub latency: bool,
}

impl AreaSpec<'_> {
    /// The layout this spec asks for (`None` for invalid counts).
    pub fn layout(&self) -> Option<Layout> {
        let l = Layout::new(
            self.num_vcpus,
            self.stage_names.len() as u32,
            self.ring_entries,
        )?;
        Some(match (self.counters, self.latency) {
            (true, true) => l.with_latency(),
            (true, false) => l.with_counters(),
            _ => l,
        })
    }
}

/// Errors of [`Agent::register`] detected before any doorbell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetupError {
    /// The counts do not form a valid [`Layout`].
    BadCounts,
    /// The area is smaller than the layout needs.
    AreaTooSmall,
    /// The area's GPA or size is not 4 KiB aligned, or its PFN does not fit
    /// 32 bits.
    BadAddress,
}

/// The guest agent. Shared by all vCPUs of the guest.
///
/// Contract: ring `v` and counter block `v` are written only by code running
/// on vCPU `v`, one context at a time (a cooperative scheduler per vCPU
/// satisfies this).
pub struct Agent<P: Platform> {
    platform: P,
    base: *mut u8,
    layout: Option<Layout>,
    mode: Mode,
    /// [`Mode::Counters`]: vCPU 0's counter block (vCPU *v*'s is `v ×
    /// 768` bytes further); null otherwise. With `counted_vcpus`, all the
    /// switch path needs.
    counters: *mut u8,
    /// vCPUs with a counter block (0 unless in [`Mode::Counters`]).
    counted_vcpus: u32,
    /// vCPU 0's latency block (ABI minor 4; vCPU *v*'s is `v × 2176` bytes
    /// further) when requests are timed; null otherwise.
    latency: *mut u8,
    /// vCPUs with a latency block in use (0 unless requests are timed:
    /// counters, latency blocks, a host of minor ≥ 4, a known TSC rate).
    latency_vcpus: u32,
    /// ns per guest TSC tick × 2³² (0: the TSC rate is unknown).
    ns_mult: u64,
    /// Stages of the registered area (0 when inactive).
    num_stages: u32,
    /// Fixed stride of timed visits, or 0: paced by time (`pace_ticks`).
    timed_every: u64,
    /// Ticks between paced timed visits (0: the TSC rate is unknown).
    pace_ticks: u64,
    status: Status,
}

// SAFETY: the area is shared memory designed for concurrent access: each ring
// has one producer (its vCPU, per the contract above), the map is read under
// a seqlock, and all shared words are accessed atomically or volatilely.
unsafe impl<P: Platform + Sync> Sync for Agent<P> {}
// SAFETY: as above; the pointer is to memory that outlives the agent.
unsafe impl<P: Platform + Send> Send for Agent<P> {}

impl<P: Platform> Agent<P> {
    /// An agent that never registers: every call is a no-op.
    pub fn inactive(platform: P) -> Self {
        Self {
            platform,
            base: ptr::null_mut(),
            layout: None,
            mode: Mode::Rings,
            counters: ptr::null_mut(),
            counted_vcpus: 0,
            latency: ptr::null_mut(),
            latency_vcpus: 0,
            ns_mult: 0,
            num_stages: 0,
            timed_every: TIMED_EVERY,
            pace_ticks: 0,
            status: Status::NoDevice,
        }
    }

    /// Lays out the area `spec` describes at `base` (whose guest-physical
    /// address is `spec.gpa`), writes the header and stage names, starts
    /// every vCPU's counters in a timed "no stage" visit from now, and sends
    /// REGISTER.
    /// Returns the agent with the host's status; on any status but
    /// [`Status::Ok`] the agent is inactive (no-op). With counters it reports
    /// through them only when the host's first map says minor ≥ 2
    /// ([`Mode`]). Errors: the counts, the area's size or its address are
    /// invalid ([`SetupError`]); nothing is sent then.
    ///
    /// # Safety
    /// `base` must point to `spec.size` writable bytes, 64-byte aligned, that
    /// stay valid and are used for nothing else while the agent lives.
    pub unsafe fn register(
        platform: P,
        base: *mut u8,
        spec: &AreaSpec,
    ) -> Result<Self, SetupError> {
        let layout = spec.layout().ok_or(SetupError::BadCounts)?;
        let (gpa, area_size) = (spec.gpa, spec.size);
        if layout.used_bytes() > area_size {
            return Err(SetupError::AreaTooSmall);
        }
        if !gpa.is_multiple_of(4096)
            || !area_size.is_multiple_of(4096)
            || gpa >> 12 > u64::from(u32::MAX)
        {
            return Err(SetupError::BadAddress);
        }
        // SAFETY: the caller guarantees `area_size` writable bytes.
        unsafe { ptr::write_bytes(base, 0, area_size as usize) };
        for (i, name) in spec.stage_names.iter().enumerate() {
            let mut desc = StageDesc::default();
            let n = name.len().min(desc.name.len());
            desc.name[..n].copy_from_slice(&name.as_bytes()[..n]);
            // SAFETY: descriptor i < MAX_STAGES lies inside the layout.
            unsafe {
                ptr::write_volatile(
                    base.add(STAGE_DESCS_OFFSET as usize + 32 * i) as *mut StageDesc,
                    desc,
                )
            };
        }
        let now = platform.tsc();
        if layout.counters {
            for v in 0..layout.num_vcpus {
                // SAFETY: vCPU v's counter block (its first word: the state)
                // lies inside the layout.
                unsafe {
                    ptr::write_volatile(
                        base.add(layout.counters_offset(v) as usize) as *mut u64,
                        state_word(now, CODE_NONE, true),
                    )
                };
            }
        }
        let header = AreaHeader {
            area_size,
            register_tsc: now,
            ..layout.header()
        };
        // SAFETY: offset 0 is inside the area and aligned.
        unsafe { ptr::write_volatile(base as *mut AreaHeader, header) };
        // The guest must not send a header its own validator refuses.
        debug_assert!(validate_header(&header, spec.num_vcpus).is_ok());
        fence(Ordering::Release);
        let mut agent = Self {
            platform,
            base,
            layout: None,
            mode: Mode::Rings,
            counters: ptr::null_mut(),
            counted_vcpus: 0,
            latency: ptr::null_mut(),
            latency_vcpus: 0,
            ns_mult: 0,
            num_stages: 0,
            timed_every: spec.timed_every.min(TIMED_STRIDE_MAX),
            pace_ticks: 0,
            status: Status::NoDevice,
        };
        agent.status = agent.send(DOORBELL_REGISTER, (gpa >> 12) as u32);
        if agent.status == Status::Ok {
            agent.layout = Some(layout);
            agent.num_stages = layout.num_stages;
            // The host published its first map before REGISTER returned.
            if layout.counters && agent.map_word(MAP_MINOR) >= 2 {
                agent.mode = Mode::Counters;
                // SAFETY: block 0 lies inside the layout.
                agent.counters = unsafe { base.add(layout.counters_offset(0) as usize) };
                agent.counted_vcpus = layout.num_vcpus;
            }
            // The host wrote the TSC rate at REGISTER: timed visits are
            // paced by time when it is known, else every TIMED_EVERY.
            // SAFETY: the header's `tsc_khz` field, inside the area.
            let khz = unsafe {
                ptr::read_volatile(
                    base.add(core::mem::offset_of!(AreaHeader, tsc_khz))
                        .cast::<u64>(),
                )
            };
            agent.pace_ticks = khz.saturating_mul(TIMED_INTERVAL_NS) / 1_000_000;
            if agent.timed_every == 0 && agent.pace_ticks == 0 {
                agent.timed_every = TIMED_EVERY;
            }
            // Minor 4: requests are timed in ns, so only with the TSC rate
            // (1 kHz at least: the multiplier stays below 2⁵²).
            if agent.mode == Mode::Counters
                && layout.latency
                && khz > 0
                && agent.map_word(MAP_MINOR) >= 4
            {
                agent.ns_mult = ((1_000_000u128 << 32) / u128::from(khz)) as u64;
                // SAFETY: block 0 lies inside the layout.
                agent.latency = unsafe { base.add(layout.latency_offset(0) as usize) };
                agent.latency_vcpus = layout.num_vcpus;
            }
        }
        Ok(agent)
    }

    /// Sends `value` to doorbell `port` and returns the decoded status
    /// (unknown values read as [`Status::NoDevice`]).
    pub fn send(&self, port: u16, value: u32) -> Status {
        self.platform.doorbell(port, value);
        Status::from_u32(self.platform.doorbell_status()).unwrap_or(Status::NoDevice)
    }

    /// The platform.
    pub fn platform(&self) -> &P {
        &self.platform
    }

    /// Status the host gave the registration.
    pub fn status(&self) -> Status {
        self.status
    }

    /// True when registered: reports go to the host.
    pub fn is_active(&self) -> bool {
        self.layout.is_some()
    }

    /// The area's layout when registered.
    pub fn layout(&self) -> Option<Layout> {
        self.layout
    }

    /// How switches are reported (meaningful when [`Self::is_active`]).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Sends UNREGISTER; the agent becomes inactive. Returns the host's status.
    pub fn unregister(&mut self) -> Status {
        if self.layout.take().is_none() {
            return Status::NotRegistered;
        }
        self.counters = ptr::null_mut();
        self.counted_vcpus = 0;
        self.latency = ptr::null_mut();
        self.latency_vcpus = 0;
        self.num_stages = 0;
        self.send(DOORBELL_UNREGISTER, 0)
    }

    /// Reports that `thread` on `vcpu` entered `stage` (no VM exit, no
    /// wait in [`Mode::Counters`]).
    pub fn stage_enter(&self, vcpu: u32, stage: u32, thread: u32) -> Report {
        if stage >= self.num_stages {
            return if self.layout.is_none() {
                Report::Inactive
            } else {
                Report::BadStage
            };
        }
        self.report(vcpu, stage_code(stage), stage, thread)
    }

    /// Reports that `thread` on `vcpu` left its stage: its request is done.
    pub fn stage_exit(&self, vcpu: u32, thread: u32) -> Report {
        self.report(vcpu, CODE_NONE, STAGE_NONE, thread)
    }

    /// Reports that `vcpu` has nothing to run (its run queue is empty), so the
    /// host stops counting its time for the last stage.
    pub fn vcpu_idle(&self, vcpu: u32) -> Report {
        self.report(vcpu, CODE_IDLE, STAGE_NONE, IDLE_THREAD)
    }

    /// One report: a counter transition into `code` (plus a trace event
    /// when the host asks for one) in [`Mode::Counters`], else a ring event
    /// `{stage, thread}`.
    #[inline]
    fn report(&self, vcpu: u32, code: u32, stage: u32, thread: u32) -> Report {
        if vcpu < self.counted_vcpus {
            // SAFETY: vcpu < counted_vcpus, so its block is in the area;
            // this vCPU is the block's only writer (the agent's contract).
            let (n, tsc, traced) = unsafe { self.transition(vcpu, code) };
            if !traced {
                return Report::Counted { trace: Trace::Off };
            }
            let every = self.map_word(MAP_TRACE_EVERY);
            if every == 0 || (every > 1 && n % every != 0) {
                return Report::Counted { trace: Trace::Off };
            }
            return self.trace(vcpu, tsc, stage, thread);
        }
        let Some(layout) = self.layout.filter(|l| vcpu < l.num_vcpus) else {
            return Report::Inactive;
        };
        if self.mode == Mode::Counters {
            return Report::Inactive;
        }
        let tsc = self.platform.tsc();
        // SAFETY: vcpu < num_vcpus (checked above); single producer.
        unsafe { self.push(&layout, vcpu, tsc, stage, thread) }
    }

    /// The trace event of a counted report.
    fn trace(&self, vcpu: u32, tsc: Option<u64>, stage: u32, thread: u32) -> Report {
        let Some(layout) = self.layout else {
            return Report::Inactive;
        };
        // SAFETY: vcpu < counted_vcpus = num_vcpus (caller); the ring's
        // only producer.
        let trace = unsafe { self.try_push(&layout, vcpu, tsc, stage, thread) };
        Report::Counted { trace }
    }

    fn word(p: *mut u64) -> &'static AtomicU64 {
        // SAFETY: `p` is an 8-byte aligned word of the registered area, which
        // outlives the agent (register's contract).
        unsafe { AtomicU64::from_ptr(p) }
    }

    /// Sends WAIT: the VMM parks this vCPU until a WAKE or `timeout_us` µs.
    pub fn wait(&self, timeout_us: u32) -> Status {
        if self.layout.is_none() {
            return Status::NotRegistered;
        }
        self.send(DOORBELL_WAIT, timeout_us)
    }

    /// Sends WAKE for `vcpu`.
    pub fn wake(&self, vcpu: u32) -> Status {
        if self.layout.is_none() {
            return Status::NotRegistered;
        }
        self.send(DOORBELL_WAKE, vcpu)
    }
}

#[cfg(test)]
mod tests;
