//! The stage device: host side of the stage channel of
//! [`hypercall_abi::stage`].
//!
//! * Doorbell: REGISTER validates the guest's area (inside RAM, above the
//!   VMM's fixed structures, page-aligned size, magic, version, layout) and
//!   snapshots its header; UNREGISTER forgets it; WAIT parks the calling vCPU
//!   thread until a WAKE or a timeout; WAKE unparks a vCPU. Each command's
//!   [`Status`] is read back from [`DOORBELL_STATUS`].
//! * Draining: the scheduler thread calls [`StageDevice::drain`] every drain
//!   period (default 1 ms); it reads each ring's `head` with acquire ordering,
//!   validates every event (sequence number = slot index, stage id in range),
//!   counts it per stage or drops it, and publishes `tail`.
//! * Stage map: published under the seqlock of [`StageMap`](hypercall_abi::stage::StageMap).
//!
//! All guest memory is accessed through `vm-memory` with addresses computed
//! from the validated snapshot, so a guest cannot make the VMM touch memory
//! outside its area; nothing it writes can panic the VMM.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use hypercall_abi::boot::KERNEL_MIN_GPA;
use hypercall_abi::stage::{
    validate_header, AreaHeader, Layout, RingHeader, StageDesc, StageEvent, Status, VcpuState,
    DOORBELL_REGISTER, DOORBELL_STATUS, DOORBELL_UNREGISTER, DOORBELL_WAIT, DOORBELL_WAKE,
    IDLE_THREAD, MAX_STAGES, STAGE_DESCS_OFFSET, STAGE_MAP_OFFSET, STAGE_NONE, WAIT_MAX_US,
};
use serde::Serialize;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::abi::Obj;

/// Default drain period (µs), `../shared/DESIGN.md` "The stage protocol" step 2.
pub const DEFAULT_DRAIN_PERIOD_US: u64 = 1000;

/// Offset of `tail` in a [`RingHeader`].
const TAIL_OFFSET: u64 = core::mem::offset_of!(RingHeader, tail) as u64;

/// How many drops of each kind are logged before logging only every 1000th.
const LOG_FIRST_DROPS: u64 = 10;

/// Per-stage counters.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct StageStats {
    /// Stage id.
    pub id: u32,
    /// Stage name from the guest's descriptor (lossy UTF-8).
    pub name: String,
    /// Valid enter events naming this stage.
    pub events: u64,
    /// Enter events where the vCPU switched into this stage from another one
    /// (or from no stage).
    pub arrivals: u64,
    /// vCPU time spent in this stage, from event timestamps (ns; TSC ticks
    /// converted with the guest TSC frequency).
    pub occupancy_ns: u64,
    /// Threads that entered this stage on a different vCPU than their
    /// previous event's (thread migrations into the stage).
    pub migrations_in: u64,
    /// Threads that left this stage for another stage on a different vCPU.
    pub migrations_out: u64,
}

/// Per-vCPU ring counters.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct VcpuRingStats {
    /// vCPU index.
    pub index: u32,
    /// Valid events (enters and exits).
    pub events: u64,
    /// Valid `stage_exit` events (requests completed).
    pub exits: u64,
    /// Valid idle markers (`STAGE_NONE` with `IDLE_THREAD`).
    pub idles: u64,
    /// Entries dropped because their `seq` was not the slot's index (torn,
    /// stale or forged).
    pub dropped_bad_seq: u64,
    /// Entries dropped because their stage id was out of range.
    pub dropped_bad_stage: u64,
    /// Times `head` was behind `tail` or more than a ring ahead; the ring was
    /// resynchronised to `head` and the skipped range counted here once.
    pub bad_index: u64,
    /// The guest's own count of full-ring back-offs (from its ring header).
    pub ring_full_backoffs: u64,
}

impl VcpuRingStats {
    /// All drops on this ring.
    pub fn dropped(&self) -> u64 {
        self.dropped_bad_seq + self.dropped_bad_stage + self.bad_index
    }
}

/// Everything the device counted; serialised into the VMM's report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChannelReport {
    /// Whether an area is registered at the end.
    pub registered: bool,
    /// Successful registrations.
    pub registrations: u64,
    /// Refused REGISTERs, by status name.
    pub registrations_rejected: std::collections::BTreeMap<String, u64>,
    /// Drain period (µs).
    pub drain_period_us: u64,
    /// Drain passes done.
    pub drains: u64,
    /// Entries per ring of the (last) registered area.
    pub ring_entries: u32,
    /// Stage-map epoch last published.
    pub map_epoch: u64,
    /// Per stage.
    pub stages: Vec<StageStats>,
    /// Per vCPU.
    pub vcpus: Vec<VcpuRingStats>,
    /// Sum of dropped entries over all rings.
    pub dropped: u64,
    /// Sum of the guest's full-ring back-offs.
    pub ring_full_backoffs: u64,
    /// WAIT commands served.
    pub waits: u64,
    /// WAKE commands served (from the guest).
    pub wakes: u64,
    /// Parked vCPUs with queued work woken by the scheduler thread.
    pub host_wakes: u64,
    /// Stage-map epochs published.
    pub maps_published: u64,
    /// Requests completed (valid `stage_exit` events).
    pub requests: u64,
    /// Guest time from the first to the last valid event (ns).
    pub busy_ns: u64,
    /// `requests` per second of `busy_ns` (0 before two events).
    pub requests_per_s: f64,
    /// Threads not tracked for migrations (more than the tracking limit).
    pub untracked_threads: u64,
}

/// Host-side state of a registered area (a snapshot: the header is never read
/// again after REGISTER).
struct Area {
    gpa: u64,
    layout: Layout,
    /// Per ring: next index to read (authoritative; never read from the guest).
    tails: Vec<u64>,
    /// Per ring: (stage, tsc) of the last valid enter, for occupancy.
    current: Vec<Option<(u32, u64)>>,
    epoch: u64,
}

struct Parker {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Parker {
    /// Leaves a wake-up token and wakes the vCPU if it waits (a WAIT that
    /// comes later returns at once).
    fn unpark(&self) {
        *self.woken.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_one();
    }
}

struct Inner {
    area: Option<Area>,
    report: ChannelReport,
    /// Guest TSC frequency (kHz) for occupancy; 0 = unknown (ticks reported).
    tsc_khz: u64,
    /// Per guest thread id: (vCPU, stage or STAGE_NONE) of its last event.
    threads: std::collections::HashMap<u32, (u32, u32)>,
    /// Sum over drains of the runnable threads per stage, and the number of
    /// drains summed (the policy's load input).
    load_sum: Vec<f64>,
    load_samples: u32,
    /// Per stage, `occupancy_ns` at the last `take_load`.
    busy_mark: Vec<u64>,
    /// TSC of the first and last valid events.
    first_tsc: Option<u64>,
    last_tsc: u64,
}

/// Most guest threads tracked for migration counting.
const MAX_TRACKED_THREADS: usize = 1 << 16;
/// A runnable count above this in a guest's VcpuState is clamped (untrusted).
const MAX_RUNNABLE: u16 = 4096;

/// Supplies the stage map published at REGISTER (the scheduler's first plan).
pub trait MapSource: Send + Sync {
    /// Per stage, the vCPU mask for a guest that declared `names`; `None`
    /// keeps the default (every vCPU serves every stage).
    fn initial_map(&self, names: &[String]) -> Option<Vec<u64>>;
}

/// The stage device of one VM. Shared by the vCPU threads (doorbell) and the
/// scheduler thread (drain).
pub struct StageDevice {
    map_source: Mutex<Option<std::sync::Arc<dyn MapSource>>>,
    memory: GuestMemoryMmap,
    mem_size: u64,
    num_vcpus: u32,
    inner: Mutex<Inner>,
    status: Vec<AtomicU32>,
    parkers: Vec<Parker>,
    stopping: AtomicBool,
}

fn status_name(s: Status) -> String {
    format!("{s:?}")
}

impl StageDevice {
    /// A device for a VM of `num_vcpus` vCPUs with RAM `memory` of `mem_size`
    /// bytes; `tsc_khz` is the guest TSC frequency (0 if unknown) and
    /// `drain_period_us` is only recorded for the report.
    pub fn new(
        memory: GuestMemoryMmap,
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
            map_source: Mutex::new(None),
            memory,
            mem_size,
            num_vcpus,
            inner: Mutex::new(Inner {
                area: None,
                report,
                tsc_khz,
                threads: Default::default(),
                load_sum: vec![0.0; MAX_STAGES],
                load_samples: 0,
                busy_mark: vec![0; MAX_STAGES],
                first_tsc: None,
                last_tsc: 0,
            }),
            status: (0..num_vcpus)
                .map(|_| AtomicU32::new(Status::Ok as u32))
                .collect(),
            parkers: (0..num_vcpus)
                .map(|_| Parker {
                    woken: Mutex::new(false),
                    cv: Condvar::new(),
                })
                .collect(),
            stopping: AtomicBool::new(false),
        }
    }

    /// Sets who decides the first stage map at REGISTER.
    pub fn set_map_source(&self, source: std::sync::Arc<dyn MapSource>) {
        *self.map_source.lock().unwrap_or_else(|p| p.into_inner()) = Some(source);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Counters stay consistent field by field; keep serving after a panic elsewhere.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True for the ports this device decodes.
    pub fn handles(port: u16) -> bool {
        matches!(
            port,
            DOORBELL_REGISTER | DOORBELL_UNREGISTER | DOORBELL_WAIT | DOORBELL_WAKE
        )
    }

    /// A doorbell `out` from `vcpu`. WAIT blocks the calling thread.
    pub fn doorbell(&self, vcpu: u32, port: u16, data: &[u8]) {
        let mut raw = [0u8; 4];
        let n = data.len().min(4);
        raw[..n].copy_from_slice(&data[..n]);
        let value = u32::from_le_bytes(raw);
        let status = match port {
            DOORBELL_REGISTER => self.register(value),
            DOORBELL_UNREGISTER => self.unregister(),
            DOORBELL_WAIT => self.wait(vcpu, value),
            DOORBELL_WAKE => self.wake(value),
            _ => return,
        };
        if let Some(slot) = self.status.get(vcpu as usize) {
            slot.store(status as u32, Ordering::Relaxed);
        }
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

    fn register(&self, pfn: u32) -> Status {
        let gpa = u64::from(pfn) << 12;
        let validated = self.validate(gpa);
        // Names (lossy UTF-8, NUL-trimmed) and the first map are worked out
        // before taking the device lock: the map source locks the scheduler,
        // which itself calls into this device (lock order: scheduler, device).
        let mut stages = Vec::new();
        let mut planned = None;
        if let Ok(layout) = &validated {
            for id in 0..layout.num_stages {
                let desc: Obj<StageDesc> = self
                    .memory
                    .read_obj(GuestAddress(gpa + STAGE_DESCS_OFFSET + 32 * u64::from(id)))
                    .unwrap_or_default();
                let end = desc.0.name.iter().position(|b| *b == 0).unwrap_or(32);
                stages.push(StageStats {
                    id,
                    name: String::from_utf8_lossy(&desc.0.name[..end]).into_owned(),
                    ..Default::default()
                });
            }
            let names: Vec<String> = stages.iter().map(|s| s.name.clone()).collect();
            let source = self
                .map_source
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            planned = source.and_then(|s| s.initial_map(&names));
        }
        let mut inner = self.lock();
        let result = match validated {
            Ok(_) if inner.area.is_some() => Err(Status::AlreadyRegistered),
            other => other,
        };
        let layout = match result {
            Ok(layout) => layout,
            Err(s) => {
                self.reject(&mut inner, gpa, s);
                return s;
            }
        };
        let tsc_khz = inner.tsc_khz;
        // Host-written header field; offset inside the validated area.
        let _ = self.memory.write_obj(
            tsc_khz,
            GuestAddress(gpa + core::mem::offset_of!(AreaHeader, tsc_khz) as u64),
        );
        let mut area = Area {
            gpa,
            layout,
            tails: vec![0; layout.num_vcpus as usize],
            current: vec![None; layout.num_vcpus as usize],
            epoch: 0,
        };
        // The scheduler's first plan, or every vCPU serving every stage.
        let mut masks = [hypercall_abi::stage::all_vcpus_mask(self.num_vcpus); MAX_STAGES];
        if let Some(planned) = planned {
            for (m, p) in masks.iter_mut().zip(planned) {
                *m = p;
            }
        }
        self.publish_map(&mut area, &masks);
        tracing::info!(
            gpa = format_args!("{gpa:#x}"),
            stages = layout.num_stages,
            ring_entries = layout.ring_entries,
            "stage channel registered"
        );
        inner.report.registrations += 1;
        inner.report.ring_entries = layout.ring_entries;
        inner.report.map_epoch = area.epoch;
        inner.report.stages = stages;
        inner.area = Some(area);
        Status::Ok
    }

    fn reject(&self, inner: &mut Inner, gpa: u64, status: Status) {
        *inner
            .report
            .registrations_rejected
            .entry(status_name(status))
            .or_default() += 1;
        tracing::warn!(
            gpa = format_args!("{gpa:#x}"),
            ?status,
            "stage channel REGISTER refused"
        );
    }

    /// Checks a candidate area at `gpa` (see [`Status`] for each refusal).
    fn validate(&self, gpa: u64) -> Result<Layout, Status> {
        let header_end = gpa + core::mem::size_of::<AreaHeader>() as u64;
        if gpa < KERNEL_MIN_GPA || header_end > self.mem_size {
            return Err(Status::BadRange);
        }
        let header: Obj<AreaHeader> = self
            .memory
            .read_obj(GuestAddress(gpa))
            .map_err(|_| Status::BadRange)?;
        let layout = validate_header(&header.0, self.num_vcpus)?;
        match gpa.checked_add(header.0.area_size) {
            Some(end) if end <= self.mem_size => Ok(layout),
            _ => Err(Status::BadRange),
        }
    }

    fn unregister(&self) -> Status {
        let mut inner = self.lock();
        if inner.area.is_none() {
            return Status::NotRegistered;
        }
        // Count what is still in the rings before forgetting the area.
        Self::drain_locked(&self.memory, &mut inner);
        inner.area = None;
        tracing::info!("stage channel unregistered");
        Status::Ok
    }

    fn wait(&self, vcpu: u32, timeout_us: u32) -> Status {
        let Some(parker) = self.parkers.get(vcpu as usize) else {
            return Status::BadVcpu;
        };
        let us = if timeout_us == 0 {
            WAIT_MAX_US
        } else {
            timeout_us.min(WAIT_MAX_US)
        };
        self.lock().report.waits += 1;
        let woken = parker.woken.lock().unwrap_or_else(|p| p.into_inner());
        let (mut woken, _) = parker
            .cv
            .wait_timeout_while(woken, Duration::from_micros(u64::from(us)), |w| {
                !*w && !self.stopping.load(Ordering::Acquire)
            })
            .unwrap_or_else(|p| p.into_inner());
        *woken = false;
        Status::Ok
    }

    fn wake(&self, target: u32) -> Status {
        let Some(parker) = self.parkers.get(target as usize) else {
            return Status::BadVcpu;
        };
        self.lock().report.wakes += 1;
        parker.unpark();
        Status::Ok
    }

    /// Unparks every waiting vCPU for good (the VM is ending).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        for p in &self.parkers {
            let _guard = p.woken.lock().unwrap_or_else(|p| p.into_inner());
            p.cv.notify_all();
        }
    }

    /// Publishes `masks` (per stage, the vCPUs serving it) as a new map epoch.
    fn publish_map(&self, area: &mut Area, masks: &[u64; MAX_STAGES]) {
        let map = area.gpa + STAGE_MAP_OFFSET;
        let epoch = area.epoch;
        // Seqlock write: odd epoch, data, even epoch (release).
        let _ = self
            .memory
            .store(epoch + 1, GuestAddress(map), Ordering::Release);
        std::sync::atomic::fence(Ordering::Release);
        for (i, mask) in masks.iter().enumerate() {
            let _ = self.memory.store(
                *mask,
                GuestAddress(map + 8 + 8 * i as u64),
                Ordering::Relaxed,
            );
        }
        let _ = self
            .memory
            .store(epoch + 2, GuestAddress(map), Ordering::Release);
        area.epoch = epoch + 2;
    }

    /// Drains every ring once (the scheduler thread's periodic work, and the
    /// final pass after the guest stopped).
    pub fn drain(&self) {
        let mut inner = self.lock();
        Self::drain_locked(&self.memory, &mut inner);
    }

    fn drain_locked(memory: &GuestMemoryMmap, inner: &mut Inner) {
        let Some(area) = inner.area.as_mut() else {
            return;
        };
        let report = &mut inner.report;
        report.drains += 1;
        let mut events = Vec::new();
        for vcpu in 0..area.layout.num_vcpus {
            drain_ring(memory, area, vcpu, report, inner.tsc_khz, &mut events);
        }
        // Migrations need the order across rings: the guest TSC is shared.
        events.sort_by_key(|(_, ev)| ev.tsc);
        for (vcpu, ev) in &events {
            inner.first_tsc.get_or_insert(ev.tsc);
            inner.last_tsc = inner.last_tsc.max(ev.tsc);
            if inner.threads.len() >= MAX_TRACKED_THREADS && !inner.threads.contains_key(&ev.thread)
            {
                report.untracked_threads += 1;
                continue;
            }
            let previous = inner.threads.insert(ev.thread, (*vcpu, ev.stage));
            if let Some((prev_vcpu, prev_stage)) = previous {
                if prev_vcpu != *vcpu && ev.stage != STAGE_NONE {
                    report.stages[ev.stage as usize].migrations_in += 1;
                    if let Some(st) = report.stages.get_mut(prev_stage as usize) {
                        st.migrations_out += 1;
                    }
                }
            }
        }
        // Runnable threads per stage, summed over vCPUs (seed 000 §4.5's
        // stage load), sampled at every drain for the report's timeline.
        for vcpu in 0..area.layout.num_vcpus {
            let base = area.gpa + Layout::vcpu_state_offset(vcpu);
            for stage in 0..area.layout.num_stages {
                let off = core::mem::offset_of!(VcpuState, runnable) as u64 + 2 * u64::from(stage);
                let n: u16 = memory.read_obj(GuestAddress(base + off)).unwrap_or(0);
                inner.load_sum[stage as usize] += f64::from(n.min(MAX_RUNNABLE));
            }
        }
        inner.load_samples += 1;
    }

    /// Load since the last call, per registered stage, or `None` when no
    /// area is registered: `(busy, runnable)` where `busy` is the vCPU time
    /// spent in the stage (ns, from the events' timestamps) and `runnable`
    /// the mean runnable threads in the stage.
    pub fn take_load(&self) -> Option<(Vec<f64>, Vec<f64>)> {
        let mut inner = self.lock();
        let stages = inner.area.as_ref()?.layout.num_stages as usize;
        let n = f64::from(inner.load_samples.max(1));
        let runnable = inner.load_sum[..stages].iter().map(|s| s / n).collect();
        inner.load_sum.iter_mut().for_each(|s| *s = 0.0);
        inner.load_samples = 0;
        let busy: Vec<f64> = inner.report.stages[..stages]
            .iter()
            .zip(&inner.busy_mark)
            .map(|(st, mark)| st.occupancy_ns.saturating_sub(*mark) as f64)
            .collect();
        inner.busy_mark = inner.report.stages.iter().map(|s| s.occupancy_ns).collect();
        Some((busy, runnable))
    }

    /// Stage names of the registered area (guest stage-id order), if any.
    pub fn stage_names(&self) -> Option<Vec<String>> {
        let inner = self.lock();
        inner.area.as_ref()?;
        Some(inner.report.stages.iter().map(|s| s.name.clone()).collect())
    }

    /// Publishes a new stage map (per stage, the vCPUs serving it); stages
    /// past the registered count are ignored. No-op without an area.
    pub fn publish(&self, stage_vcpus: &[u64]) {
        let mut inner = self.lock();
        let Some(mut area) = inner.area.take() else {
            return;
        };
        let mut masks = [0u64; MAX_STAGES];
        for (m, v) in masks
            .iter_mut()
            .zip(stage_vcpus)
            .take(area.layout.num_stages as usize)
        {
            *m = *v;
        }
        self.publish_map(&mut area, &masks);
        inner.report.map_epoch = area.epoch;
        inner.report.maps_published += 1;
        inner.area = Some(area);
    }

    /// Wakes every vCPU that published `parked` with a non-empty run queue
    /// (the host's safety net of the wake-up protocol, see `VcpuState`).
    pub fn wake_parked_with_work(&self) {
        let gpa = match self.lock().area.as_ref() {
            Some(area) => area.gpa,
            None => return,
        };
        for vcpu in 0..self.num_vcpus {
            let base = gpa + Layout::vcpu_state_offset(vcpu);
            let parked: u32 = self
                .memory
                .load(
                    GuestAddress(base + core::mem::offset_of!(VcpuState, parked) as u64),
                    Ordering::Acquire,
                )
                .unwrap_or(0);
            let depth: u32 = self
                .memory
                .load(
                    GuestAddress(base + core::mem::offset_of!(VcpuState, runq_depth) as u64),
                    Ordering::Acquire,
                )
                .unwrap_or(0);
            if parked != 0 && depth != 0 {
                self.lock().report.host_wakes += 1;
                if let Some(p) = self.parkers.get(vcpu as usize) {
                    p.unpark();
                }
            }
        }
    }

    /// A copy of the counters.
    pub fn report(&self) -> ChannelReport {
        let inner = self.lock();
        let mut r = inner.report.clone();
        r.requests = r.vcpus.iter().map(|v| v.exits).sum();
        if let Some(first) = inner.first_tsc {
            let ticks = inner.last_tsc - first;
            r.busy_ns = if inner.tsc_khz == 0 {
                ticks
            } else {
                (u128::from(ticks) * 1_000_000 / u128::from(inner.tsc_khz)) as u64
            };
            if r.busy_ns > 0 {
                r.requests_per_s = r.requests as f64 * 1e9 / r.busy_ns as f64;
            }
        }
        r.registered = inner.area.is_some();
        r.dropped = r.vcpus.iter().map(VcpuRingStats::dropped).sum();
        r.ring_full_backoffs = r.vcpus.iter().map(|v| v.ring_full_backoffs).sum();
        r
    }
}

fn log_drop(count: u64, vcpu: u32, what: &str, detail: std::fmt::Arguments) {
    if count <= LOG_FIRST_DROPS || count.is_multiple_of(1000) {
        tracing::warn!(vcpu, count, "stage ring: dropped {what}: {detail}");
    }
}

/// Drains one ring: validates and counts events in `[tail, head)`.
fn drain_ring(
    memory: &GuestMemoryMmap,
    area: &mut Area,
    vcpu: u32,
    report: &mut ChannelReport,
    tsc_khz: u64,
    valid: &mut Vec<(u32, StageEvent)>,
) {
    let layout = area.layout;
    let ring = area.gpa + layout.ring_offset(vcpu);
    let v = vcpu as usize;
    let Ok(head) = memory.load::<u64>(GuestAddress(ring), Ordering::Acquire) else {
        return;
    };
    let stats = &mut report.vcpus[v];
    if let Ok(backoffs) = memory.load::<u64>(
        GuestAddress(ring + core::mem::offset_of!(RingHeader, full_backoffs) as u64),
        Ordering::Relaxed,
    ) {
        stats.ring_full_backoffs = backoffs;
    }
    let tail = area.tails[v];
    let pending = head.wrapping_sub(tail);
    if pending == 0 {
        return;
    }
    if pending > u64::from(layout.ring_entries) {
        stats.bad_index += 1;
        log_drop(
            stats.bad_index,
            vcpu,
            "ring index",
            format_args!("head {head} tail {tail} entries {}", layout.ring_entries),
        );
        area.tails[v] = head;
        area.current[v] = None;
        let _ = memory.store(head, GuestAddress(ring + TAIL_OFFSET), Ordering::Release);
        return;
    }
    for index in tail..tail + pending {
        let slot = area.gpa + layout.slot_offset(vcpu, index);
        let Ok(Obj(ev)) = memory.read_obj::<Obj<StageEvent>>(GuestAddress(slot)) else {
            continue;
        };
        if ev.seq != index {
            stats.dropped_bad_seq += 1;
            log_drop(
                stats.dropped_bad_seq,
                vcpu,
                "sequence",
                format_args!("slot {index} has seq {}", ev.seq),
            );
            continue;
        }
        if ev.stage != STAGE_NONE && ev.stage >= layout.num_stages {
            stats.dropped_bad_stage += 1;
            log_drop(
                stats.dropped_bad_stage,
                vcpu,
                "stage id",
                format_args!("stage {} of {}", ev.stage, layout.num_stages),
            );
            continue;
        }
        stats.events += 1;
        if ev.thread != IDLE_THREAD {
            valid.push((vcpu, ev));
        }
        let previous = area.current[v];
        if let Some((prev_stage, since)) = previous {
            if let Some(ticks) = ev.tsc.checked_sub(since) {
                let ns = if tsc_khz == 0 {
                    ticks
                } else {
                    (u128::from(ticks) * 1_000_000 / u128::from(tsc_khz)) as u64
                };
                let s = &mut report.stages[prev_stage as usize];
                s.occupancy_ns = s.occupancy_ns.saturating_add(ns);
            }
        }
        if ev.stage == STAGE_NONE {
            if ev.thread == IDLE_THREAD {
                stats.idles += 1;
            } else {
                stats.exits += 1;
            }
            area.current[v] = None;
        } else {
            let s = &mut report.stages[ev.stage as usize];
            s.events += 1;
            if previous.map(|(p, _)| p) != Some(ev.stage) {
                s.arrivals += 1;
            }
            area.current[v] = Some((ev.stage, ev.tsc));
        }
    }
    let new_tail = tail + pending;
    area.tails[v] = new_tail;
    let _ = memory.store(
        new_tail,
        GuestAddress(ring + TAIL_OFFSET),
        Ordering::Release,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use guest_agent::{Agent, Platform};
    use hypercall_abi::stage::DOORBELL_STATUS;
    use proptest::prelude::*;
    use std::sync::Arc;
    use vm_memory::GuestMemoryBackend;

    const MEM: u64 = 4 << 20;
    const AREA: u64 = 1 << 20;

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap()
    }

    fn register(dev: &StageDevice) -> Status {
        dev.doorbell(0, DOORBELL_REGISTER, &((AREA >> 12) as u32).to_le_bytes());
        let mut st = [0u8; 4];
        dev.read_status(0, DOORBELL_STATUS, &mut st);
        Status::from_u32(u32::from_le_bytes(st)).unwrap()
    }

    /// The real guest agent, with its doorbell wired to the device in-process
    /// and its area in the device's guest memory.
    struct InProcess(Arc<StageDevice>, u32);
    impl Platform for InProcess {
        fn doorbell(&self, port: u16, value: u32) {
            self.0.doorbell(self.1, port, &value.to_le_bytes());
        }
        fn doorbell_status(&self) -> u32 {
            let mut st = [0u8; 4];
            self.0.read_status(self.1, DOORBELL_STATUS, &mut st);
            u32::from_le_bytes(st)
        }
        fn tsc(&self) -> u64 {
            // Any monotonic clock will do for the counters.
            std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos() as u64
        }
    }

    #[test]
    fn agent_and_device_agree_under_concurrent_draining() {
        let mem = memory();
        let host = mem.get_host_address(GuestAddress(AREA)).unwrap();
        let dev = Arc::new(StageDevice::new(mem, MEM, 2, 0, 0));
        let layout = Layout::new(2, 3, 4).unwrap();
        // SAFETY: the area lies in the device's guest memory, which outlives the agent.
        let agent = unsafe {
            Agent::register(
                InProcess(dev.clone(), 0),
                host,
                AREA,
                layout.area_size(),
                2,
                &["a", "b", "c"],
                4,
            )
        }
        .unwrap();
        assert_eq!(agent.status(), Status::Ok);
        assert_eq!(agent.read_map().unwrap().vcpus[..3], [0b11; 3]);
        let done = Arc::new(AtomicBool::new(false));
        let drainer = {
            let (dev, done) = (dev.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Acquire) {
                    dev.drain();
                    std::thread::yield_now();
                }
            })
        };
        let mut written = [0u64; 3];
        for i in 0..20_000u32 {
            let stage = i % 3;
            assert!(matches!(
                agent.stage_enter(0, stage, i),
                guest_agent::Report::Written { .. }
            ));
            written[stage as usize] += 1;
        }
        agent.stage_exit(0, 0);
        done.store(true, Ordering::Release);
        drainer.join().unwrap();
        dev.drain();
        let r = dev.report();
        assert_eq!(r.dropped, 0);
        let counted: Vec<u64> = r.stages.iter().map(|s| s.events).collect();
        assert_eq!(counted, written);
        assert_eq!(r.vcpus[0].exits, 1);
        // A 4-entry ring cannot hold 20 000 events: the guest must have waited.
        assert!(r.ring_full_backoffs > 0);
        assert_eq!(r.ring_full_backoffs, agent.ring_full_backoffs(0));
    }

    #[test]
    fn register_refusals_and_unregister() {
        let mem = memory();
        let dev = StageDevice::new(mem.clone(), MEM, 1, 0, 0);
        let layout = Layout::new(1, 2, 8).unwrap();
        // Below the minimum GPA, past the end of RAM.
        dev.doorbell(0, DOORBELL_REGISTER, &1u32.to_le_bytes());
        dev.doorbell(0, DOORBELL_REGISTER, &u32::MAX.to_le_bytes());
        assert_eq!(register(&dev), Status::BadMagic);
        let mut h = layout.header();
        h.area_size = MEM; // runs past the end of RAM from AREA
        mem.write_obj(Obj(h), GuestAddress(AREA)).unwrap();
        assert_eq!(register(&dev), Status::BadRange);
        mem.write_obj(Obj(layout.header()), GuestAddress(AREA))
            .unwrap();
        assert_eq!(register(&dev), Status::Ok);
        assert_eq!(register(&dev), Status::AlreadyRegistered);
        dev.doorbell(0, DOORBELL_UNREGISTER, &[0]);
        dev.doorbell(0, DOORBELL_WAKE, &7u32.to_le_bytes());
        let mut st = [0u8; 4];
        dev.read_status(0, DOORBELL_STATUS, &mut st);
        assert_eq!(u32::from_le_bytes(st), Status::BadVcpu as u32);
        let r = dev.report();
        assert!(!r.registered);
        assert_eq!(r.registrations, 1);
        assert_eq!(r.registrations_rejected["BadRange"], 3);
        assert_eq!(r.registrations_rejected["BadMagic"], 1);
        assert_eq!(r.registrations_rejected["AlreadyRegistered"], 1);
    }

    #[test]
    fn wait_returns_on_wake_and_on_timeout() {
        let dev = Arc::new(StageDevice::new(memory(), MEM, 2, 0, 0));
        let t0 = std::time::Instant::now();
        dev.doorbell(1, DOORBELL_WAIT, &2000u32.to_le_bytes());
        assert!(t0.elapsed() >= Duration::from_millis(2));
        let waiter = {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                dev.doorbell(1, DOORBELL_WAIT, &0u32.to_le_bytes());
                t.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(5));
        dev.doorbell(0, DOORBELL_WAKE, &1u32.to_le_bytes());
        let waited = waiter.join().unwrap();
        assert!(
            waited < Duration::from_micros(u64::from(WAIT_MAX_US)),
            "{waited:?}"
        );
        assert_eq!(dev.report().wakes, 1);
    }

    proptest! {
        /// Arbitrary bytes as the area header: never a panic; a header that is
        /// accepted has a layout that fits inside RAM.
        #[test]
        fn arbitrary_header_bytes(bytes in proptest::collection::vec(any::<u8>(), 64), vcpus in 1u32..4) {
            let mem = memory();
            mem.write_slice(&bytes, GuestAddress(AREA)).unwrap();
            let dev = StageDevice::new(mem, MEM, vcpus, 0, 0);
            let status = register(&dev);
            let r = dev.report();
            if status == Status::Ok {
                prop_assert_eq!(r.registrations, 1);
            } else {
                prop_assert_eq!(r.registrations_rejected.values().sum::<u64>(), 1);
            }
        }

        /// Arbitrary ring contents and head: never a panic, and every slot the
        /// host looked at is either counted or dropped.
        #[test]
        fn arbitrary_ring_contents(
            slots in proptest::collection::vec(any::<u8>(), 8 * 32),
            seqs_valid in proptest::collection::vec(any::<bool>(), 8),
            head in prop_oneof![0u64..=8, any::<u64>()],
        ) {
            let mem = memory();
            let layout = Layout::new(1, 3, 8).unwrap();
            mem.write_obj(Obj(layout.header()), GuestAddress(AREA)).unwrap();
            let dev = StageDevice::new(mem.clone(), MEM, 1, 0, 0);
            prop_assert_eq!(register(&dev), Status::Ok);
            let first_slot = AREA + layout.slot_offset(0, 0);
            mem.write_slice(&slots, GuestAddress(first_slot)).unwrap();
            // Make some entries plausibly valid so both paths are exercised.
            for (i, valid) in seqs_valid.iter().enumerate() {
                if *valid {
                    mem.write_obj(i as u64, GuestAddress(first_slot + 32 * i as u64)).unwrap();
                }
            }
            mem.write_obj(head, GuestAddress(AREA + layout.ring_offset(0))).unwrap();
            dev.drain();
            dev.drain();
            let v = &dev.report().vcpus[0];
            if head <= 8 {
                prop_assert_eq!(v.events + v.dropped_bad_seq + v.dropped_bad_stage, head);
                prop_assert_eq!(v.bad_index, 0);
            } else {
                prop_assert_eq!(v.bad_index, 1);
                prop_assert_eq!(v.events, 0);
            }
            // The host published its tail.
            let tail: u64 = mem.read_obj(GuestAddress(AREA + layout.ring_offset(0) + TAIL_OFFSET)).unwrap();
            prop_assert_eq!(tail, head);
        }
    }
}
