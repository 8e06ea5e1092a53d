//! The stage device: host side of the stage channel of
//! [`hypercall_abi::stage`]. It speaks only the ABI and takes no
//! scheduling decision.
//!
//! * Doorbell: REGISTER validates the guest's area (inside RAM, above the
//!   VMM's fixed structures, page-aligned size, magic, version, layout),
//!   snapshots its header and returns the stage names to the caller, which
//!   asks the scheduler for the first stage map; UNREGISTER forgets the
//!   area; WAIT parks the calling vCPU thread ([`crate::park`])
//!   until a WAKE or a timeout; WAKE unparks a vCPU. Each command's
//!   [`Status`] is read back from [`DOORBELL_STATUS`].
//! * [`StageDevice::read_counters`] (ABI minor 2): a copy of every vCPU's
//!   [`VcpuCounters`](hypercall_abi::stage::VcpuCounters), once per policy period; the values are untrusted and
//!   checked by the scheduler's accounting (`crate::sched::counter_reader`).
//! * [`StageDevice::drain`]: every ring's `head` is read with acquire
//!   ordering, each entry validated (`Ring::drain`) and returned as an [`Event`]
//!   or counted as a drop, and `tail` published — for a rings-only guest
//!   every drain period, for a counters guest only while a trace is on
//!   ([`StageDevice::set_trace`], [`StageDevice::drain_need`]); a counters
//!   guest's events are its trace ([`Drained::trace`]), never its load.
//! * [`StageDevice::publish`]: the stage map, under the seqlock of
//!   [`StageMap`].
//!
//! All guest memory is accessed through `vm-memory` with addresses computed
//! from the validated snapshot, so a guest cannot make the VMM touch memory
//! outside its area; nothing it writes can panic the VMM.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hypercall_abi::boot::KERNEL_MIN_GPA;
use hypercall_abi::stage::{
    validate_header, AreaHeader, Layout, StageDesc, StageMap, Status, VcpuState, VisitPolicy,
    ABI_MINOR, DOORBELL_REGISTER, DOORBELL_STATUS, DOORBELL_UNREGISTER, DOORBELL_WAIT,
    DOORBELL_WAKE, MAX_STAGES, STAGE_DESCS_OFFSET, STAGE_MAP_OFFSET, WAIT_MAX_US,
};
use stagevm_report::{ChannelReport, VcpuRingStats};
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryBackend, GuestMemoryMmap};

use crate::abi::Obj;
use crate::park::Parkers;

/// A successful REGISTER: what the scheduler needs to plan the first map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    /// Stage names in guest stage-id order (lossy UTF-8, NUL-trimmed).
    pub names: Vec<String>,
    /// The area has per-vCPU counters (ABI minor 2): the scheduler reads
    /// them ([`StageDevice::read_blocks`]) instead of draining events.
    pub counters: bool,
    /// The area has per-vCPU latency histograms too (ABI minor 4).
    pub latency: bool,
    /// Which registration this is (1 for the first): counters of a new
    /// area start from zero.
    pub generation: u64,
    /// The guest's TSC just before it rang REGISTER (`register_tsc`, 0 if
    /// it did not say) and the host's TSC when the exit was handled: the
    /// pair from which the scheduler estimates the guest's TSC "now".
    pub register_tsc: u64,
    /// See `register_tsc`.
    pub host_tsc: u64,
}

/// Host-side state of a registered area (a snapshot: the header is never read
/// again after REGISTER).
struct Area {
    gpa: u64,
    layout: Layout,
    /// Per ring: next index to read (authoritative; never read from the guest).
    tails: Vec<u64>,
    epoch: u64,
}

/// The host's TSC (the guest's runs at the same rate with an offset under
/// KVM without TSC scaling, which stagevm never sets). x86-64 only: the
/// guest's timestamps are its TSC (docs/stage-protocol.md); another
/// architecture needs its counter here and in the guest agent.
#[cfg(target_arch = "x86_64")]
pub fn host_tsc() -> u64 {
    // SAFETY: `rdtsc` reads a counter; no memory is touched.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
}

struct Inner {
    area: Option<Area>,
    report: ChannelReport,
    /// Events drained at UNREGISTER, handed out by the next
    /// [`StageDevice::drain`]; at most one drain pass's worth
    /// ([`MAX_DRAIN_PER_RING`] per vCPU) is kept waiting.
    pending: Drained,
    /// Slots copied from a ring, reused by every drain.
    slots: Vec<Obj<hypercall_abi::stage::StageEvent>>,
    /// A counters area's blocks as UNREGISTER left them, with their
    /// registration's generation: handed out once by
    /// [`StageDevice::take_final_counters`], so the switches of the last
    /// policy period before an unregistration are counted.
    final_counters: Option<(CounterCopy, Blocks)>,
}

/// Guest memory as the stage device holds it: a `vm-memory` address space
/// ([`GuestAddressSpace`]) of region-backed memory — `Arc<GuestMemoryMmap>`,
/// or `GuestMemoryAtomic<GuestMemoryMmap>` for an embedder that adds
/// memory while the VM runs (each read of the area — a copy of every
/// vCPU's block, the stage names, the parked words — takes one snapshot,
/// so it sees one consistent map).
pub trait StageMemory: GuestAddressSpace<M: GuestMemoryBackend> + Send + Sync {}

impl<T: GuestAddressSpace<M: GuestMemoryBackend> + Send + Sync> StageMemory for T {}

/// The stage device of one VM. Shared by the vCPU threads (doorbell) and the
/// `stage-sched` thread (drain, publish).
pub struct StageDevice<M: StageMemory = Arc<GuestMemoryMmap>> {
    memory: M,
    mem_size: u64,
    num_vcpus: u32,
    tsc_khz: u64,
    inner: Mutex<Inner>,
    status: Vec<AtomicU32>,
    parkers: Parkers,
    /// WAIT, WAKE and host-wake counters: atomics, so the WAIT and WAKE
    /// doorbells never wait for the device lock a drain holds.
    waits: AtomicU64,
    wakes: AtomicU64,
    host_wakes: AtomicU64,
    /// The trace asked of the guest ([`StageMap::trace_every`]): 0 = off.
    trace_every: AtomicU64,
}

/// True for the I/O ports the stage device decodes (its doorbells,
/// [`hypercall_abi::stage::DOORBELL_REGISTER`] and the next three): the
/// VMM's port-I/O exit handler sends these to [`StageDevice::doorbell`]
/// (an `out`) and [`StageDevice::read_status`] (an `in`).
pub fn handles(port: u16) -> bool {
    matches!(
        port,
        DOORBELL_REGISTER | DOORBELL_UNREGISTER | DOORBELL_WAIT | DOORBELL_WAKE
    )
}

fn status_name(s: Status) -> String {
    format!("{s:?}")
}

impl<M: StageMemory> StageDevice<M> {
    /// A device for a VM of `num_vcpus` vCPUs with RAM `memory` ending at
    /// GPA `mem_size` (its ranges may leave a hole below); `tsc_khz` is the guest TSC frequency (kHz, 0 if unknown), which
    /// REGISTER writes into the area's header; `drain_period_us` is only
    /// recorded for the report.
    pub fn new(
        memory: M,
        mem_size: u64,
        num_vcpus: u32,
        tsc_khz: u64,
        drain_period_us: u64,
    ) -> Self {
        let report = ChannelReport {
            drain_period_us,
            vcpus: (0..num_vcpus)
                .map(|index| VcpuRingStats {
                    index,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        Self {
            memory,
            mem_size,
            num_vcpus,
            tsc_khz,
            inner: Mutex::new(Inner {
                area: None,
                report,
                pending: Drained::default(),
                slots: Vec::new(),
                final_counters: None,
            }),
            status: (0..num_vcpus)
                .map(|_| AtomicU32::new(Status::Ok as u32))
                .collect(),
            parkers: Parkers::new(num_vcpus),
            waits: AtomicU64::new(0),
            wakes: AtomicU64::new(0),
            host_wakes: AtomicU64::new(0),
            trace_every: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Counters stay consistent field by field; keep serving after a panic elsewhere.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Guest TSC frequency (kHz; 0 if unknown).
    pub fn tsc_khz(&self) -> u64 {
        self.tsc_khz
    }

    /// A doorbell `out` from `vcpu`. WAIT blocks the calling thread. Returns
    /// the stage names after a successful REGISTER: the caller then hands
    /// them to the scheduler, which publishes the first stage map before the
    /// guest resumes.
    pub fn doorbell(&self, vcpu: u32, port: u16, data: &[u8]) -> Option<Registered> {
        let mut raw = [0u8; 4];
        let n = data.len().min(4);
        raw[..n].copy_from_slice(&data[..n]);
        let value = u32::from_le_bytes(raw);
        let (status, registered) = match port {
            DOORBELL_REGISTER => match self.register(value) {
                Ok(r) => (Status::Ok, Some(r)),
                Err(s) => (s, None),
            },
            DOORBELL_UNREGISTER => (self.unregister(), None),
            DOORBELL_WAIT => (self.wait(vcpu, value), None),
            DOORBELL_WAKE => (self.wake(value), None),
            _ => return None,
        };
        if let Some(slot) = self.status.get(vcpu as usize) {
            slot.store(status as u32, Ordering::Relaxed);
        }
        registered
    }

    /// A doorbell `in` from `vcpu`: the status of its last command.
    pub fn read_status(&self, vcpu: u32, port: u16, data: &mut [u8]) {
        if port != DOORBELL_STATUS {
            return;
        }
        let status = self
            .status
            .get(vcpu as usize)
            .map_or(Status::BadVcpu as u32, |s| s.load(Ordering::Relaxed));
        let bytes = status.to_le_bytes();
        let n = data.len().min(4);
        data[..n].copy_from_slice(&bytes[..n]);
    }

    /// Stage names of a validated area at `gpa` (lossy UTF-8, NUL-trimmed).
    fn read_names(&self, gpa: u64, layout: &Layout) -> Vec<String> {
        let memory = self.memory.memory();
        (0..layout.num_stages)
            .map(|id| {
                let desc: Obj<StageDesc> = memory
                    .read_obj(GuestAddress(gpa + STAGE_DESCS_OFFSET + 32 * u64::from(id)))
                    .unwrap_or_default();
                let end = desc.0.name.iter().position(|b| *b == 0).unwrap_or(32);
                String::from_utf8_lossy(&desc.0.name[..end]).into_owned()
            })
            .collect()
    }

    fn register(&self, pfn: u32) -> Result<Registered, Status> {
        let gpa = u64::from(pfn) << 12;
        let mut inner = self.lock();
        let validated = match self.validate(gpa) {
            Ok(_) if inner.area.is_some() => Err(Status::AlreadyRegistered),
            other => other,
        };
        let layout = match validated {
            Ok(layout) => layout,
            Err(s) => {
                *inner
                    .report
                    .registrations_rejected
                    .entry(status_name(s))
                    .or_default() += 1;
                crate::guest_warn!(
                    gpa = format_args!("{gpa:#x}"),
                    status = ?s,
                    "stage channel REGISTER refused"
                );
                return Err(s);
            }
        };
        let names = self.read_names(gpa, &layout);
        let register_tsc: u64 = self
            .memory
            .memory()
            .read_obj(GuestAddress(
                gpa + core::mem::offset_of!(AreaHeader, register_tsc) as u64,
            ))
            .unwrap_or_default();
        let host_tsc = host_tsc();
        // Host-written header field; offset inside the validated area.
        let _ = self.memory.memory().write_obj(
            self.tsc_khz,
            GuestAddress(gpa + core::mem::offset_of!(AreaHeader, tsc_khz) as u64),
        );
        tracing::info!(
            gpa = format_args!("{gpa:#x}"),
            stages = layout.num_stages,
            ring_entries = layout.ring_entries,
            counters = layout.counters,
            "stage channel registered"
        );
        let r = &mut inner.report;
        r.registrations += 1;
        r.ring_entries = layout.ring_entries;
        r.mode = if layout.counters { "counters" } else { "rings" }.into();
        r.stages = names
            .iter()
            .enumerate()
            .map(|(id, name)| stagevm_report::StageStats {
                id: id as u32,
                name: name.clone(),
                ..Default::default()
            })
            .collect();
        inner.area = Some(Area {
            gpa,
            layout,
            tails: vec![0; layout.num_vcpus as usize],
            epoch: 0,
        });
        Ok(Registered {
            names,
            counters: layout.counters,
            latency: layout.latency,
            generation: inner.report.registrations,
            register_tsc,
            host_tsc,
        })
    }

    /// Checks a candidate area at `gpa` (see [`Status`] for each refusal).
    fn validate(&self, gpa: u64) -> Result<Layout, Status> {
        let header_end = gpa.checked_add(core::mem::size_of::<AreaHeader>() as u64);
        if gpa < KERNEL_MIN_GPA || header_end.is_none_or(|end| end > self.mem_size) {
            return Err(Status::BadRange);
        }
        let header: Obj<AreaHeader> = self
            .memory
            .memory()
            .read_obj(GuestAddress(gpa))
            .map_err(|_| Status::BadRange)?;
        let layout = validate_header(&header.0, self.num_vcpus)?;
        // Within RAM, and in one range of it (not across the MMIO hole).
        let in_ram = usize::try_from(header.0.area_size).is_ok_and(|len| {
            GuestMemoryBackend::check_range(&*self.memory.memory(), GuestAddress(gpa), len)
        });
        match gpa.checked_add(header.0.area_size) {
            Some(end) if end <= self.mem_size && in_ram => Ok(layout),
            _ => Err(Status::BadRange),
        }
    }

    fn unregister(&self) -> Status {
        let mut inner = self.lock();
        if inner.area.is_none() {
            return Status::NotRegistered;
        }
        // Read what is still in the rings before forgetting the area; the
        // next drain hands those events to the scheduler. A guest that
        // unregisters in a loop refills its rings each time: while a
        // pass's worth of events still waits, its rings are not read again
        // (counted). A counters area's blocks are copied for the next read
        // the same way (only the latest copy is kept).
        let waiting = inner.pending.events.len() + inner.pending.trace.len();
        let bound = MAX_DRAIN_PER_RING as usize * self.num_vcpus as usize;
        if waiting < bound {
            let mut pending = std::mem::take(&mut inner.pending);
            self.drain_locked(&mut inner, &mut pending);
            inner.pending = pending;
        } else {
            inner.report.unread_at_unregister += 1;
        }
        let mut blocks = inner
            .final_counters
            .take()
            .map_or_else(Blocks::default, |(_, v)| v);
        if let Some(copy) = self.copy_blocks(&inner, &mut blocks) {
            inner.final_counters = Some((copy, blocks));
        }
        inner.area = None;
        tracing::info!("stage channel unregistered");
        Status::Ok
    }

    fn wait(&self, vcpu: u32, timeout_us: u32) -> Status {
        if vcpu >= self.num_vcpus {
            return Status::BadVcpu;
        }
        let us = if timeout_us == 0 {
            WAIT_MAX_US
        } else {
            timeout_us.min(WAIT_MAX_US)
        };
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.parkers
            .park(vcpu, Duration::from_micros(u64::from(us)));
        Status::Ok
    }

    fn wake(&self, target: u32) -> Status {
        if target >= self.num_vcpus {
            return Status::BadVcpu;
        }
        self.wakes.fetch_add(1, Ordering::Relaxed);
        self.parkers.unpark(target);
        Status::Ok
    }

    /// Unparks every parked vCPU once, so each vCPU thread returns from its
    /// WAIT exit: for a VMM that pauses or snapshots the VM by kicking its
    /// vCPU threads (Cloud Hypervisor's `CpuManager::pause`, Firecracker's
    /// `VcpuEvent::Pause`), which would otherwise wait up to
    /// [`WAIT_MAX_US`] for a parked one. A vCPU that was not parked keeps
    /// a wake token and its next WAIT returns at once: a spurious wake,
    /// which the protocol allows (docs/stage-protocol.md §7).
    pub fn kick_parked(&self) {
        for vcpu in 0..self.num_vcpus {
            self.parkers.unpark(vcpu);
        }
    }

    /// Unparks every waiting vCPU for good (the VM is ending).
    pub fn stop(&self) {
        self.parkers.stop();
    }

    /// Drains every ring once (the `stage-sched` thread's periodic work, and
    /// the final pass after the guest stopped). Empty without an area.
    pub fn drain(&self) -> Drained {
        let mut inner = self.lock();
        let mut drained = std::mem::take(&mut inner.pending);
        self.drain_locked(&mut inner, &mut drained);
        drained
    }

    fn drain_locked(&self, inner: &mut Inner, drained: &mut Drained) {
        let Some(area) = inner.area.as_mut() else {
            return;
        };
        inner.report.drains += 1;
        drained.trace_every = self.trace_every();
        let first_new = drained.events.len();
        // A counters guest's rings hold only its trace.
        let out = if area.layout.counters {
            &mut drained.trace
        } else {
            &mut drained.events
        };
        let memory = self.memory.memory();
        for vcpu in 0..area.layout.num_vcpus {
            let ring = Ring {
                memory: &*memory,
                area_gpa: area.gpa,
                layout: area.layout,
                vcpu,
            };
            let v = vcpu as usize;
            let (tail, resynced) = ring.drain(
                area.tails[v],
                &mut inner.report.vcpus[v],
                out,
                &mut inner.slots,
            );
            area.tails[v] = tail;
            if resynced {
                drained.resynced.push(vcpu);
            }
        }
        // Migrations need the order across rings (the guest TSC is shared).
        drained.events[first_new..].sort_by_key(|ev| ev.tsc);
    }

    /// Publishes a new stage map: per stage, the vCPUs serving it (stages
    /// past the registered count are ignored), and `owned`, the vCPUs alone
    /// on their host core (ABI minor 1), and `visit`, the stage-visit policy
    /// of each vCPU's scheduler (ABI minor 3). No-op without an area.
    pub fn publish(&self, stage_vcpus: &[u64], owned: u64, visit: VisitPolicy) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(area) = inner.area.as_mut() else {
            return;
        };
        // Stages past the registered count get no vCPU.
        let masks = (0..MAX_STAGES).map(|s| match stage_vcpus.get(s) {
            Some(m) if s < area.layout.num_stages as usize => *m,
            _ => 0,
        });
        let map = area.gpa + STAGE_MAP_OFFSET;
        let store = |value: u64, offset: u64, order| {
            let _ = self
                .memory
                .memory()
                .store(value, GuestAddress(map + offset), order);
        };
        // Seqlock write: odd epoch, data, even epoch (release).
        store(area.epoch + 1, 0, Ordering::Release);
        std::sync::atomic::fence(Ordering::Release);
        for (i, mask) in masks.enumerate() {
            store(mask, 8 + 8 * i as u64, Ordering::Relaxed);
        }
        store(
            owned,
            core::mem::offset_of!(StageMap, owned) as u64,
            Ordering::Relaxed,
        );
        store(
            ABI_MINOR,
            core::mem::offset_of!(StageMap, minor) as u64,
            Ordering::Relaxed,
        );
        store(
            self.trace_every.load(Ordering::Relaxed),
            core::mem::offset_of!(StageMap, trace_every) as u64,
            Ordering::Relaxed,
        );
        store(
            visit.code(),
            core::mem::offset_of!(StageMap, visit) as u64,
            Ordering::Relaxed,
        );
        area.epoch += 2;
        store(area.epoch, 0, Ordering::Release);
        inner.report.map_epoch = area.epoch;
        inner.report.maps_published += 1;
    }

    /// Asks the guest for an event trace: every `every`th event of each kind
    /// per vCPU also goes to its ring (1 = every event, 0 = no trace). Kept
    /// for later registrations; takes effect at the guest's next report
    /// (one word outside the map's seqlock). Only a counters guest reads it.
    pub fn set_trace(&self, every: u64) {
        self.trace_every.store(every, Ordering::Relaxed);
        let gpa = self.lock().area.as_ref().map(|a| a.gpa);
        if let Some(gpa) = gpa {
            let at = gpa + STAGE_MAP_OFFSET + core::mem::offset_of!(StageMap, trace_every) as u64;
            let _ = self
                .memory
                .memory()
                .store(every, GuestAddress(at), Ordering::Relaxed);
        }
    }

    /// The trace asked of the guest now (0 = off).
    pub fn trace_every(&self) -> u64 {
        self.trace_every.load(Ordering::Relaxed)
    }

    /// What the rings need: [`Drain::Events`] for a guest that reports
    /// through them (every event is its load signal) or events an
    /// UNREGISTER left, [`Drain::Trace`] for a counters guest asked for a
    /// trace or trace events an UNREGISTER left, [`Drain::No`] otherwise
    /// (and without an area).
    pub fn drain_need(&self) -> Drain {
        let inner = self.lock();
        match inner.area.as_ref() {
            Some(area) if !area.layout.counters => Drain::Events,
            _ if !inner.pending.events.is_empty() => Drain::Events,
            Some(_) if self.trace_every() != 0 => Drain::Trace,
            _ if !inner.pending.trace.is_empty() => Drain::Trace,
            _ => Drain::No,
        }
    }

    /// Wakes every vCPU that published `parked` with a non-empty run queue
    /// (the host's safety net of the wake-up protocol, see `VcpuState`).
    pub fn wake_parked_with_work(&self) {
        let gpa = match self.lock().area.as_ref() {
            Some(area) => area.gpa,
            None => return,
        };
        let memory = self.memory.memory();
        for vcpu in 0..self.num_vcpus {
            let base = gpa + Layout::vcpu_state_offset(vcpu);
            let word = |offset: usize| -> u32 {
                memory
                    .load(GuestAddress(base + offset as u64), Ordering::Acquire)
                    .unwrap_or(0)
            };
            let parked = word(core::mem::offset_of!(VcpuState, parked));
            let depth = word(core::mem::offset_of!(VcpuState, runq_depth));
            if parked != 0 && depth != 0 {
                self.host_wakes.fetch_add(1, Ordering::Relaxed);
                self.parkers.unpark(vcpu);
            }
        }
    }

    /// A copy of the device's counters: registrations, drains, rings, map
    /// epochs, doorbells; the per-stage part (`stages`, `requests`,
    /// `busy_ns`, …) is the controller's
    /// ([`crate::sched::Controller::fill_report`]).
    pub fn report(&self) -> ChannelReport {
        let inner = self.lock();
        let mut r = inner.report.clone();
        r.waits = self.waits.load(Ordering::Relaxed);
        r.wakes = self.wakes.load(Ordering::Relaxed);
        r.host_wakes = self.host_wakes.load(Ordering::Relaxed);
        // `full_backoffs` are guest-written: every sum saturates.
        let sum =
            |f: fn(&VcpuRingStats) -> u64| r.vcpus.iter().map(f).fold(0u64, u64::saturating_add);
        r.dropped = sum(VcpuRingStats::dropped);
        r.ring_full_backoffs = sum(|v| v.ring_full_backoffs);
        r.trace_dropped = sum(|v| v.trace_dropped);
        r.trace_every = self.trace_every();
        r.registered = inner.area.is_some();
        r
    }
}

mod block_copy;
pub use block_copy::{Blocks, CounterCopy};
mod ring;
mod vcpu_thread;
use ring::Ring;
pub use ring::{Drain, Drained, Event, DEFAULT_DRAIN_PERIOD_US, MAX_DRAIN_PER_RING};
pub use vcpu_thread::{current_vcpu, set_current_vcpu};

#[cfg(test)]
mod tests;
