//! stagevm guest agent core (`no_std`).
//!
//! The guest side of the stage channel of [`hypercall_abi::stage`]: it lays out
//! and registers the shared area, reports stage switches into the calling
//! vCPU's ring without a VM exit (`stage_enter` / `stage_exit`, the user-space
//! API of the seeds, seed 000, `docs/design.md`), reads the host's stage map with
//! acquire ordering, and decides which vCPU a thread should run a stage on
//! ([`choose_from_map`], the least-loaded rule).
//! It also publishes each vCPU's scheduling state ([`VcpuState`]): run-queue
//! depth, parked flag and fallback count. Per-stage runnable counts
//! (`VcpuState::runnable`) are not maintained: the field stays in the ABI
//! but the agent leaves it at 0.
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
use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use hypercall_abi::stage::{
    validate_header, AreaHeader, Layout, RingHeader, StageDesc, StageEvent, StageMap, Status,
    VcpuState, DOORBELL_REGISTER, DOORBELL_UNREGISTER, DOORBELL_WAIT, DOORBELL_WAKE, MAX_STAGES,
    STAGE_DESCS_OFFSET, STAGE_MAP_OFFSET, STAGE_NONE,
};

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
    /// Written to the ring after `backoffs` waits for a full ring (0 usually).
    Written {
        /// Times the ring was full before the event fit.
        backoffs: u32,
    },
    /// The agent is inactive (no channel): nothing was written.
    Inactive,
}

/// A consistent copy of the host's stage map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSnapshot {
    /// Seqlock epoch (even).
    pub epoch: u64,
    /// Per stage, the mask of vCPUs serving it.
    pub vcpus: [u64; MAX_STAGES],
    /// The vCPUs alone on their host core (ABI minor 1); 0 from a host
    /// that does not publish it (minor 0), so such a guest parks as in v1.0.
    pub owned: u64,
}

impl MapSnapshot {
    /// True if `vcpu` serves `stage` in this map.
    pub fn serves(&self, stage: u32, vcpu: u32) -> bool {
        (stage as usize) < MAX_STAGES && vcpu < 64 && self.vcpus[stage as usize] & (1 << vcpu) != 0
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
/// Contract: ring `v` is written only by code running on vCPU `v`, one
/// context at a time (a cooperative scheduler per vCPU satisfies this).
pub struct Agent<P: Platform> {
    platform: P,
    base: *mut u8,
    layout: Option<Layout>,
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
            status: Status::NoDevice,
        }
    }

    /// Lays out the area at `base` (whose guest-physical address is `gpa`),
    /// writes the header and stage names, and sends REGISTER. Returns the agent
    /// and the host's status; on any status but [`Status::Ok`] the agent is
    /// inactive (no-op).
    ///
    /// # Safety
    /// `base` must point to `area_size` writable bytes, 64-byte aligned, that
    /// stay valid and are used for nothing else while the agent lives.
    pub unsafe fn register(
        platform: P,
        base: *mut u8,
        gpa: u64,
        area_size: u64,
        num_vcpus: u32,
        stage_names: &[&str],
        ring_entries: u32,
    ) -> Result<Self, SetupError> {
        let layout = Layout::new(num_vcpus, stage_names.len() as u32, ring_entries)
            .ok_or(SetupError::BadCounts)?;
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
        let header = AreaHeader {
            area_size,
            ..layout.header()
        };
        // SAFETY: offset 0 is inside the area and aligned.
        unsafe { ptr::write_volatile(base as *mut AreaHeader, header) };
        for (i, name) in stage_names.iter().enumerate() {
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
        // The guest must not send a header its own validator refuses.
        debug_assert!(validate_header(&header, num_vcpus).is_ok());
        fence(Ordering::Release);
        let mut agent = Self {
            platform,
            base,
            layout: None,
            status: Status::NoDevice,
        };
        agent.status = agent.send(DOORBELL_REGISTER, (gpa >> 12) as u32);
        if agent.status == Status::Ok {
            agent.layout = Some(layout);
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

    /// Sends UNREGISTER; the agent becomes inactive. Returns the host's status.
    pub fn unregister(&mut self) -> Status {
        if self.layout.take().is_none() {
            return Status::NotRegistered;
        }
        self.send(DOORBELL_UNREGISTER, 0)
    }

    fn ring(&self, layout: &Layout, vcpu: u32) -> *mut RingHeader {
        // SAFETY: vcpu < num_vcpus is checked by callers; the ring lies in the area.
        unsafe { self.base.add(layout.ring_offset(vcpu) as usize) as *mut RingHeader }
    }

    fn word(p: *mut u64) -> &'static AtomicU64 {
        // SAFETY: `p` is an 8-byte aligned word of the registered area, which
        // outlives the agent (register's contract).
        unsafe { AtomicU64::from_ptr(p) }
    }

    /// Reports that `thread` on `vcpu` entered `stage` (no VM exit).
    pub fn stage_enter(&self, vcpu: u32, stage: u32, thread: u32) -> Report {
        self.report(vcpu, stage, thread)
    }

    /// Reports that `thread` on `vcpu` left its stage.
    pub fn stage_exit(&self, vcpu: u32, thread: u32) -> Report {
        self.report(vcpu, STAGE_NONE, thread)
    }

    /// Reports that `vcpu` has nothing to run (its run queue is empty), so the
    /// host stops counting its time for the last stage.
    pub fn vcpu_idle(&self, vcpu: u32) -> Report {
        self.report(vcpu, STAGE_NONE, hypercall_abi::stage::IDLE_THREAD)
    }

    fn report(&self, vcpu: u32, stage: u32, thread: u32) -> Report {
        let Some(layout) = self.layout else {
            return Report::Inactive;
        };
        if vcpu >= layout.num_vcpus {
            return Report::Inactive;
        }
        let event = StageEvent {
            seq: 0,
            tsc: self.platform.tsc(),
            stage,
            thread,
            reserved: 0,
        };
        // SAFETY: vcpu < num_vcpus (checked above); single producer per ring.
        unsafe { self.push(&layout, vcpu, event, true) }
    }

    /// Writes `event` into `vcpu`'s ring. With `fix_seq` the sequence number
    /// is set to the slot's index (the valid form); without it the event is
    /// written as given (the `test-hooks` feature's `write_raw_event` forges
    /// bad entries this way).
    ///
    /// # Safety
    /// `vcpu < layout.num_vcpus`, and only one context writes this ring.
    unsafe fn push(
        &self,
        layout: &Layout,
        vcpu: u32,
        mut event: StageEvent,
        fix_seq: bool,
    ) -> Report {
        let ring = self.ring(layout, vcpu);
        // SAFETY: `ring` points to this ring's header inside the area.
        let head_word = Self::word(unsafe { ptr::addr_of_mut!((*ring).head) });
        // SAFETY: as above.
        let tail_word = Self::word(unsafe { ptr::addr_of_mut!((*ring).tail) });
        // SAFETY: as above.
        let backoff_word = Self::word(unsafe { ptr::addr_of_mut!((*ring).full_backoffs) });
        let head = head_word.load(Ordering::Relaxed);
        let mut backoffs = 0u32;
        let mut spin = 64u32;
        while head.wrapping_sub(tail_word.load(Ordering::Acquire)) >= u64::from(layout.ring_entries)
        {
            // Full: never overwrite an unread entry; count and back off.
            backoffs += 1;
            backoff_word.fetch_add(1, Ordering::Relaxed);
            for _ in 0..spin {
                core::hint::spin_loop();
            }
            spin = (spin * 2).min(1 << 16);
        }
        if fix_seq {
            event.seq = head;
        }
        // SAFETY: the slot lies in this ring; it is unread-free (checked above).
        unsafe {
            ptr::write_volatile(
                self.base.add(layout.slot_offset(vcpu, head) as usize) as *mut StageEvent,
                event,
            )
        };
        head_word.store(head.wrapping_add(1), Ordering::Release);
        Report::Written { backoffs }
    }

    /// Test hook: writes `event` into `vcpu`'s ring as given, or with its
    /// sequence number fixed up when `fix_seq`, to check the host's
    /// validation. Returns `Inactive` when not registered or `vcpu` is out of
    /// range. Only with the `test-hooks` feature.
    #[cfg(feature = "test-hooks")]
    pub fn write_raw_event(&self, vcpu: u32, event: StageEvent, fix_seq: bool) -> Report {
        match self.layout {
            // SAFETY: vcpu checked; single producer per ring (caller's contract).
            Some(layout) if vcpu < layout.num_vcpus => unsafe {
                self.push(&layout, vcpu, event, fix_seq)
            },
            _ => Report::Inactive,
        }
    }

    /// True when the host has consumed everything in `vcpu`'s ring
    /// (`tail == head`); also true when inactive.
    pub fn ring_drained(&self, vcpu: u32) -> bool {
        match self.layout.filter(|l| vcpu < l.num_vcpus) {
            Some(layout) => {
                let ring = self.ring(&layout, vcpu);
                // SAFETY: fields of this ring's header.
                let head = Self::word(unsafe { ptr::addr_of_mut!((*ring).head) });
                // SAFETY: as above.
                let tail = Self::word(unsafe { ptr::addr_of_mut!((*ring).tail) });
                head.load(Ordering::Relaxed) == tail.load(Ordering::Acquire)
            }
            None => true,
        }
    }

    /// Test hook: moves `vcpu`'s published head forward by `delta` without
    /// writing slots, as a corrupt guest would. Only with the `test-hooks`
    /// feature.
    #[cfg(feature = "test-hooks")]
    pub fn corrupt_head(&self, vcpu: u32, delta: u64) {
        if let Some(layout) = self.layout.filter(|l| vcpu < l.num_vcpus) {
            let ring = self.ring(&layout, vcpu);
            // SAFETY: field of this ring's header.
            Self::word(unsafe { ptr::addr_of_mut!((*ring).head) })
                .fetch_add(delta, Ordering::Release);
        }
    }

    /// Times `vcpu`'s ring was found full (from the ring header).
    pub fn ring_full_backoffs(&self, vcpu: u32) -> u64 {
        match self.layout.filter(|l| vcpu < l.num_vcpus) {
            Some(layout) => {
                let ring = self.ring(&layout, vcpu);
                // SAFETY: field of this ring's header.
                Self::word(unsafe { ptr::addr_of_mut!((*ring).full_backoffs) })
                    .load(Ordering::Relaxed)
            }
            None => 0,
        }
    }

    fn state_u32(&self, vcpu: u32, offset: usize) -> Option<&'static AtomicU32> {
        self.layout.filter(|l| vcpu < l.num_vcpus)?;
        // SAFETY: the state block of vcpu < num_vcpus ≤ MAX_VCPUS lies in the
        // area; `offset` is a 4-aligned field offset inside VcpuState.
        Some(unsafe {
            AtomicU32::from_ptr(
                self.base
                    .add(Layout::vcpu_state_offset(vcpu) as usize + offset)
                    .cast::<u32>(),
            )
        })
    }

    /// Adds `delta` to `vcpu`'s published run-queue depth (see
    /// [`VcpuState`] for the wake-up protocol). No-op when inactive.
    pub fn runq_add(&self, vcpu: u32, delta: i32) {
        if let Some(w) = self.state_u32(vcpu, core::mem::offset_of!(VcpuState, runq_depth)) {
            w.fetch_add(delta as u32, Ordering::AcqRel);
        }
    }

    /// `vcpu`'s published run-queue depth (0 when inactive).
    pub fn runq_depth(&self, vcpu: u32) -> u32 {
        self.state_u32(vcpu, core::mem::offset_of!(VcpuState, runq_depth))
            .map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// Publishes whether `vcpu` idles (see [`VcpuState`]).
    pub fn set_parked(&self, vcpu: u32, parked: bool) {
        if let Some(w) = self.state_u32(vcpu, core::mem::offset_of!(VcpuState, parked)) {
            w.store(u32::from(parked), Ordering::SeqCst);
        }
    }

    /// Whether `vcpu` published that it idles.
    pub fn is_parked(&self, vcpu: u32) -> bool {
        self.state_u32(vcpu, core::mem::offset_of!(VcpuState, parked))
            .is_some_and(|w| w.load(Ordering::SeqCst) != 0)
    }

    /// Counts a fallback on `vcpu`: a stage ran there although the map does not
    /// give it the stage, because no vCPU served the stage.
    pub fn count_fallback(&self, vcpu: u32) {
        if let Some(w) = self.state_u32(vcpu, core::mem::offset_of!(VcpuState, fallbacks)) {
            w.fetch_add(1, Ordering::Relaxed);
        }
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

    /// Reads a consistent stage map (seqlock: retries while the host writes).
    /// `None` when inactive or before the host published a map.
    pub fn read_map(&self) -> Option<MapSnapshot> {
        self.layout?;
        // SAFETY: the map lies in the registered area.
        let map = unsafe { self.base.add(STAGE_MAP_OFFSET as usize) } as *mut u64;
        let epoch_word = Self::word(map);
        loop {
            let epoch = epoch_word.load(Ordering::Acquire);
            if epoch == 0 {
                return None;
            }
            if !epoch.is_multiple_of(2) {
                core::hint::spin_loop();
                continue;
            }
            let mut vcpus = [0u64; MAX_STAGES];
            for (i, v) in vcpus.iter_mut().enumerate() {
                // SAFETY: word i + 1 of the map.
                *v = unsafe { ptr::read_volatile(map.add(1 + i)) };
            }
            const OWNED: usize = core::mem::offset_of!(StageMap, owned) / 8;
            const MINOR: usize = core::mem::offset_of!(StageMap, minor) / 8;
            // SAFETY: words of the map (`StageMap` is 24 words).
            let (owned, minor) = unsafe {
                (
                    ptr::read_volatile(map.add(OWNED)),
                    ptr::read_volatile(map.add(MINOR)),
                )
            };
            fence(Ordering::Acquire);
            if epoch_word.load(Ordering::Relaxed) == epoch {
                let owned = if minor >= 1 { owned } else { 0 };
                return Some(MapSnapshot {
                    epoch,
                    vcpus,
                    owned,
                });
            }
        }
    }
}

/// Which vCPU `stage` should run on for a thread now on `current`, given a
/// map read with [`Agent::read_map`] (pure; the one place the rule lives):
/// `current` if `map` lets it serve the stage, else the vCPU with the
/// smallest `loads[v]` among those serving it (lowest index on ties; `loads`
/// is indexed by vCPU, e.g. published run-queue depths, and only its first
/// 64 entries count). Returns `current` when the stage is out of range or no
/// vCPU of `loads` serves it (the caller counts that as a fallback).
pub fn choose_from_map(map: &MapSnapshot, stage: u32, current: u32, loads: &[u32]) -> u32 {
    if (stage as usize) >= MAX_STAGES || map.serves(stage, current) {
        return current;
    }
    let mask = map.vcpus[stage as usize];
    (0..loads.len().min(64) as u32)
        .filter(|v| mask & (1 << v) != 0)
        .min_by_key(|v| loads[*v as usize])
        .unwrap_or(current)
}

#[cfg(test)]
mod tests;
