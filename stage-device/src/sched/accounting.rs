//! Per-stage accounting of one registered guest: counters since REGISTER
//! (events, arrivals, occupancy, migrations) and the load window the
//! controller reads every policy period.
//!
//! Two sources, by the guest's mode: a counters guest (ABI minor 2) is
//! read once per policy period ([`Accounting::ingest_counters`], through
//! [`CounterReader`]'s rules), and its drained ring events, when a trace is
//! on, are only counted; a rings guest's events are folded in one by one
//! ([`Accounting::ingest`]).

use std::collections::HashMap;

use host_sched::histogram::Histogram;
use hypercall_abi::stage::{stage_code, CODE_IDLE, CODE_NONE, IDLE_THREAD, STAGE_NONE};
use stagevm_report::{ChannelReport, LatencyBucket, LatencyReport, StageStats};

use super::cohorts::Cohorts;
use super::counter_reader::CounterReader;
use super::latency_reader::LatencyReader;
use crate::stage::{Blocks, Drained};

/// Per-vCPU totals of a counters guest.
#[derive(Clone, Copy, Debug, Default)]
struct VcpuTotals {
    events: u64,
    exits: u64,
    idles: u64,
    idle_ticks: u64,
    clamps: u64,
    latency_clamps: u64,
}

/// Most guest threads tracked for migration counting (bounds the map a
/// guest can grow by inventing thread ids).
const MAX_TRACKED_THREADS: usize = 1 << 16;

/// One load window ([`Accounting::take_window`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Window {
    /// Per stage, vCPU time (ns).
    pub busy: Vec<u64>,
    /// Requests completed (`stage_exit`s).
    pub requests: u64,
    /// Stage entries (`stage_enter`s).
    pub entries: u64,
    /// Per stage, its entries (they sum to `entries`).
    pub stage_entries: Vec<u64>,
    /// A counters guest: the window's length (ns, the reads' own); `None`
    /// for a rings guest (the caller's period is the window).
    pub length_ns: Option<u64>,
    /// A counters guest: per vCPU, its idle time in the window (ns).
    pub idle_ns: Vec<u64>,
    /// The requests the guest timed in the window (`None` unless it has
    /// latency histograms, ABI minor 4).
    pub latency: Option<Histogram>,
}

/// Counters per stage since REGISTER, and the load window.
#[derive(Debug, Default)]
pub struct Accounting {
    /// Guest TSC frequency (kHz); 0 = unknown (occupancy in ticks).
    tsc_khz: u64,
    /// Per stage, its counters.
    stages: Vec<StageStats>,
    /// Per vCPU: (stage, tsc) of its last valid enter, for occupancy.
    current: Vec<Option<(u32, u64)>>,
    /// Per guest thread: (vCPU, stage or STAGE_NONE) of its last event.
    threads: HashMap<u32, (u32, u32)>,
    /// Threads not tracked because the map was full.
    untracked: u64,
    /// TSC of the first and last valid events.
    first_tsc: Option<u64>,
    last_tsc: u64,
    /// Per stage, vCPU time (ns) since the last [`Accounting::take_window`].
    window_ns: Vec<u64>,
    /// Requests completed (valid `stage_exit` events) in the same window.
    window_requests: u64,
    /// Per stage, its entries (valid `stage_enter` events) in the same
    /// window.
    window_stage_entries: Vec<u64>,
    /// Requests completed and stage entries since REGISTER.
    total_requests: u64,
    total_entries: u64,
    /// A counters guest: the window's length (ticks of the counter reads
    /// since the last [`Accounting::take_window`]), which the load divides
    /// by, so no vCPU counts for more than one.
    window_ticks: u64,
    /// A counters guest's reader and per-vCPU totals (`None`: rings).
    counters: Option<CounterReader>,
    vcpu_totals: Vec<VcpuTotals>,
    /// A counters guest: per vCPU, idle ticks since the last window.
    window_idle_ticks: Vec<u64>,
    /// A guest with latency histograms (minor 4): their reader, the
    /// window's and the run's timed requests.
    latency: Option<LatencyReader>,
    window_latency: Histogram,
    total_latency: Histogram,
    /// Trace events drained from a counters guest's rings.
    traced: u64,
    /// The cohorts each vCPU served (events, or a complete trace).
    cohorts: Cohorts,
}

impl Accounting {
    /// Accounting for a guest that registered `names` on `num_vcpus` vCPUs
    /// with TSC frequency `tsc_khz` (kHz, 0 if unknown).
    pub fn new(names: &[String], num_vcpus: u32, tsc_khz: u64) -> Self {
        Self {
            tsc_khz,
            stages: names
                .iter()
                .enumerate()
                .map(|(id, name)| StageStats {
                    id: id as u32,
                    name: name.clone(),
                    ..Default::default()
                })
                .collect(),
            current: vec![None; num_vcpus as usize],
            window_ns: vec![0; names.len()],
            window_stage_entries: vec![0; names.len()],
            cohorts: Cohorts::new(names.len(), num_vcpus as usize),
            ..Default::default()
        }
    }

    /// The guest's TSC rate (kHz; 0 when unknown: "ns" are then ticks).
    pub fn tsc_khz(&self) -> u64 {
        self.tsc_khz
    }

    fn ticks_to_ns(&self, ticks: u64) -> u64 {
        ticks_to_ns(self.tsc_khz, ticks)
    }

    /// Makes this a counters guest's accounting: its blocks are read
    /// through `reader` ([`Self::ingest_counters`]), and drained ring events
    /// only count as trace events.
    pub fn with_counters(mut self, reader: CounterReader) -> Self {
        self.vcpu_totals = vec![VcpuTotals::default(); self.current.len()];
        self.window_idle_ticks = vec![0; self.current.len()];
        self.counters = Some(reader);
        self
    }

    /// Makes this counters guest's accounting read its latency histograms
    /// too (ABI minor 4) through `reader`.
    pub fn with_latency(mut self, reader: LatencyReader) -> Self {
        self.latency = Some(reader);
        self
    }

    /// Whether this guest reports through counters.
    pub fn uses_counters(&self) -> bool {
        self.counters.is_some()
    }

    /// Folds in one read of a counters guest's blocks, taken at host TSC
    /// `host_tsc` for registration `generation` (a read of another
    /// registration is ignored): the counters, then the latency
    /// histograms against each vCPU's completed requests. No-op for a
    /// rings guest.
    pub fn ingest_counters(&mut self, generation: u64, blocks: &Blocks, host_tsc: u64) {
        let Some(reader) = self.counters.as_mut() else {
            return;
        };
        if reader.generation() != generation {
            return;
        }
        let (deltas, window) = reader.update(&blocks.counters, host_tsc);
        if let Some(latency) = self.latency.as_mut().filter(|_| !blocks.latency.is_empty()) {
            let done: Vec<u64> = deltas
                .iter()
                .map(|d| d.counts[CODE_NONE as usize])
                .collect();
            let (timed, clamps) = latency.update(&blocks.latency, &done);
            self.window_latency.merge(&timed);
            self.total_latency.merge(&timed);
            for (v, c) in clamps.iter().enumerate().filter(|(_, c)| **c > 0) {
                if let Some(t) = self.vcpu_totals.get_mut(v) {
                    t.latency_clamps = t.latency_clamps.saturating_add(*c);
                    crate::guest_warn!(
                        vcpu = v,
                        clamps = t.latency_clamps,
                        "request latency histogram: impossible values clamped"
                    );
                }
            }
        }
        self.window_ticks = self.window_ticks.saturating_add(window);
        for (v, d) in deltas.iter().enumerate() {
            for (s, stage) in self.stages.iter_mut().enumerate() {
                let code = stage_code(s as u32) as usize;
                let ns = ticks_to_ns(self.tsc_khz, d.ticks[code]);
                stage.events = stage.events.saturating_add(d.counts[code]);
                stage.occupancy_ns = stage.occupancy_ns.saturating_add(ns);
                stage.migrations_in = stage.migrations_in.saturating_add(d.migrations_in[s]);
                stage.migrations_out = stage.migrations_out.saturating_add(d.migrations_out[s]);
                self.window_ns[s] = self.window_ns[s].saturating_add(ns);
                let e = &mut self.window_stage_entries[s];
                *e = e.saturating_add(d.counts[code]);
            }
            let requests = d.counts[CODE_NONE as usize];
            self.window_requests = self.window_requests.saturating_add(requests);
            self.total_requests = self.total_requests.saturating_add(requests);
            let entries = (0..self.stages.len())
                .map(|s| d.counts[stage_code(s as u32) as usize])
                .fold(0u64, u64::saturating_add);
            self.total_entries = self.total_entries.saturating_add(entries);
            if let Some(t) = self.vcpu_totals.get_mut(v) {
                t.events = t
                    .events
                    .saturating_add(d.counts.iter().fold(0u64, |a, c| a.saturating_add(*c)));
                t.exits = t.exits.saturating_add(requests);
                t.idles = t.idles.saturating_add(d.counts[CODE_IDLE as usize]);
                t.idle_ticks = t.idle_ticks.saturating_add(d.ticks[CODE_IDLE as usize]);
                if let Some(w) = self.window_idle_ticks.get_mut(v) {
                    *w = w.saturating_add(d.ticks[CODE_IDLE as usize]);
                }
                t.clamps = t.clamps.saturating_add(d.clamps);
                if d.clamps > 0 {
                    crate::guest_warn!(
                        vcpu = v,
                        clamps = t.clamps,
                        "stage counters: impossible values clamped"
                    );
                }
            }
        }
    }

    /// Folds one drain's events in. Stage ids were validated by the device
    /// against the registered stage count; ids past this accounting's
    /// stages (a re-registration with fewer stages) are ignored. Trace
    /// events (a counters guest's) are counted and logged at trace level
    /// under the target `stagevm::stage_trace`
    /// (`--log-level stagevm::stage_trace=trace`), one line each.
    pub fn ingest(&mut self, drained: &Drained) {
        self.traced = self.traced.saturating_add(drained.trace.len() as u64);
        for v in &drained.resynced {
            self.cohorts.forget(*v);
        }
        let complete = drained.trace_every == 1;
        for ev in &drained.trace {
            if complete {
                self.cohorts.observe(ev);
            }
            tracing::trace!(
                target: "stagevm::stage_trace",
                vcpu = ev.vcpu,
                tsc = ev.tsc,
                stage = ev.stage,
                thread = ev.thread,
                "stage event"
            );
        }
        if self.counters.is_some() {
            // A counters guest's load comes from its counters; events a
            // previous rings registration left are not its load.
            return;
        }
        for v in &drained.resynced {
            if let Some(c) = self.current.get_mut(*v as usize) {
                *c = None;
            }
        }
        for ev in &drained.events {
            self.cohorts.observe(ev);
            let v = ev.vcpu as usize;
            if v >= self.current.len() {
                continue;
            }
            let previous = self.current[v];
            if let Some((prev_stage, since)) = previous {
                if let Some(ticks) = ev.tsc.checked_sub(since) {
                    let ns = self.ticks_to_ns(ticks);
                    if let Some(s) = self.stages.get_mut(prev_stage as usize) {
                        s.occupancy_ns = s.occupancy_ns.saturating_add(ns);
                        let w = &mut self.window_ns[prev_stage as usize];
                        *w = w.saturating_add(ns);
                    }
                }
            }
            if ev.stage == STAGE_NONE {
                self.current[v] = None;
                if ev.thread != IDLE_THREAD {
                    self.window_requests += 1;
                    self.total_requests += 1;
                }
            } else if let Some(s) = self.stages.get_mut(ev.stage as usize) {
                s.events += 1;
                if let Some(e) = self.window_stage_entries.get_mut(ev.stage as usize) {
                    *e += 1;
                }
                self.total_entries += 1;
                if previous.map(|(p, _)| p) != Some(ev.stage) {
                    s.arrivals += 1;
                }
                self.current[v] = Some((ev.stage, ev.tsc));
            }
            if ev.thread != IDLE_THREAD {
                self.track_thread(ev.vcpu, ev.thread, ev.stage, ev.tsc);
            }
        }
    }

    fn track_thread(&mut self, vcpu: u32, thread: u32, stage: u32, tsc: u64) {
        self.first_tsc.get_or_insert(tsc);
        self.last_tsc = self.last_tsc.max(tsc);
        if self.threads.len() >= MAX_TRACKED_THREADS && !self.threads.contains_key(&thread) {
            self.untracked += 1;
            return;
        }
        let previous = self.threads.insert(thread, (vcpu, stage));
        if let Some((prev_vcpu, prev_stage)) = previous {
            if prev_vcpu != vcpu && stage != STAGE_NONE {
                if let Some(s) = self.stages.get_mut(stage as usize) {
                    s.migrations_in += 1;
                }
                if let Some(s) = self.stages.get_mut(prev_stage as usize) {
                    s.migrations_out += 1;
                }
            }
        }
    }

    /// What the guest did since the previous call ([`Window`]); starts a
    /// new window.
    pub fn take_window(&mut self) -> Window {
        let busy = self.window_ns.clone();
        self.window_ns.iter_mut().for_each(|w| *w = 0);
        let stage_entries = std::mem::replace(
            &mut self.window_stage_entries,
            vec![0; self.window_ns.len()],
        );
        let length = std::mem::take(&mut self.window_ticks);
        let idle_ns = self
            .window_idle_ticks
            .iter_mut()
            .map(|t| ticks_to_ns(self.tsc_khz, std::mem::take(t)))
            .collect();
        Window {
            busy,
            requests: std::mem::take(&mut self.window_requests),
            entries: stage_entries.iter().fold(0u64, |a, e| a.saturating_add(*e)),
            stage_entries,
            length_ns: self
                .counters
                .as_ref()
                .map(|_| self.ticks_to_ns(length))
                .filter(|ns| *ns > 0),
            idle_ns,
            latency: self
                .latency
                .as_ref()
                .map(|_| std::mem::take(&mut self.window_latency)),
        }
    }

    /// The run's timed requests so far (`None` unless the guest has
    /// latency histograms).
    pub fn latency_report(&self) -> Option<LatencyReport> {
        self.latency.as_ref()?;
        Some(latency_report(
            &self.total_latency,
            self.vcpu_totals.iter().map(|t| t.latency_clamps).sum(),
        ))
    }

    /// Stage entries per completed request since REGISTER (`None` before
    /// the first request): how many stages a request enters, whatever the
    /// placement or visit order.
    pub fn entries_per_request(&self) -> Option<f64> {
        (self.total_requests > 0 && self.total_entries > 0)
            .then(|| self.total_entries as f64 / self.total_requests as f64)
    }

    /// Writes the accounting's part of the channel report: `stages`,
    /// `requests`, `busy_ns` (guest time from the first to the last event or
    /// transition), `requests_per_s`, `untracked_threads`; for a counters
    /// guest also the per-vCPU events, exits, idles, idle time and clamps,
    /// `counter_clamps` and `traced_events`.
    pub fn fill_report(&self, r: &mut ChannelReport) {
        r.stages = self.stages.clone();
        self.cohorts.fill(&mut r.stages);
        r.untracked_threads = self.untracked;
        let span = match &self.counters {
            Some(reader) => {
                for (v, t) in self.vcpu_totals.iter().enumerate() {
                    if let Some(out) = r.vcpus.get_mut(v) {
                        out.events = t.events;
                        out.exits = t.exits;
                        out.idles = t.idles;
                        out.idle_ns = self.ticks_to_ns(t.idle_ticks);
                        out.counter_clamps = t.clamps;
                    }
                }
                r.counter_clamps = self.vcpu_totals.iter().map(|t| t.clamps).sum();
                r.traced_events = self.traced;
                r.latency = self.latency_report();
                reader.span_ticks()
            }
            None => self
                .first_tsc
                .map_or(0, |first| self.last_tsc.saturating_sub(first)),
        };
        r.requests = r.vcpus.iter().map(|v| v.exits).fold(0, u64::saturating_add);
        r.busy_ns = self.ticks_to_ns(span);
        if r.busy_ns > 0 {
            r.requests_per_s = r.requests as f64 * 1e9 / r.busy_ns as f64;
        }
    }
}

/// The report of the timed requests in `h`, with `clamps` impossible
/// values clamped: quantiles and the cumulative counts at every power of
/// two of ns from 2^7 to 2^38 (each an exact bucket boundary).
pub fn latency_report(h: &Histogram, clamps: u64) -> LatencyReport {
    let us = |q: f64| h.quantile(q).map_or(0.0, |ns| ns / 1000.0);
    LatencyReport {
        samples: h.count(),
        sum_ns: h.sum_ns(),
        mean_us: h.mean_ns().map_or(0.0, |ns| ns / 1000.0),
        p50_us: us(0.5),
        p90_us: us(0.9),
        p99_us: us(0.99),
        p999_us: us(0.999),
        clamps,
        buckets: (7..=38)
            .map(|k| {
                let le_ns = (1u64 << k) - 1;
                LatencyBucket {
                    le_ns,
                    count: h.count_at_or_below(le_ns),
                }
            })
            .collect(),
    }
}

/// Guest TSC ticks as ns at `tsc_khz` (kHz; ticks unchanged when 0).
fn ticks_to_ns(tsc_khz: u64, ticks: u64) -> u64 {
    if tsc_khz == 0 {
        ticks
    } else {
        (u128::from(ticks) * 1_000_000 / u128::from(tsc_khz)).min(u128::from(u64::MAX)) as u64
    }
}
