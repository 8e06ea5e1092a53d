//! Per-stage accounting of one registered guest: counters since REGISTER
//! (events, arrivals, occupancy, migrations) and the load window the
//! controller reads every policy period.

use std::collections::HashMap;

use hypercall_abi::stage::{IDLE_THREAD, STAGE_NONE};
use stagevm_report::{ChannelReport, StageStats};

use crate::stage::Drained;

/// Most guest threads tracked for migration counting (bounds the map a
/// guest can grow by inventing thread ids).
const MAX_TRACKED_THREADS: usize = 1 << 16;

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
            ..Default::default()
        }
    }

    fn ticks_to_ns(&self, ticks: u64) -> u64 {
        if self.tsc_khz == 0 {
            ticks
        } else {
            (u128::from(ticks) * 1_000_000 / u128::from(self.tsc_khz)).min(u128::from(u64::MAX))
                as u64
        }
    }

    /// Folds one drain's events in. Stage ids were validated by the device
    /// against the registered stage count; ids past this accounting's
    /// stages (a re-registration with fewer stages) are ignored.
    pub fn ingest(&mut self, drained: &Drained) {
        for v in &drained.resynced {
            if let Some(c) = self.current.get_mut(*v as usize) {
                *c = None;
            }
        }
        for ev in &drained.events {
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
                }
            } else if let Some(s) = self.stages.get_mut(ev.stage as usize) {
                s.events += 1;
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

    /// vCPU time per stage (ns) and requests completed since the previous
    /// call; starts a new window.
    pub fn take_window(&mut self) -> (Vec<u64>, u64) {
        let window = self.window_ns.clone();
        self.window_ns.iter_mut().for_each(|w| *w = 0);
        (window, std::mem::take(&mut self.window_requests))
    }

    /// Writes the per-stage part of the channel report: `stages`, `busy_ns`
    /// (guest time from the first to the last event), `requests_per_s` (of
    /// the `requests` the device counted) and `untracked_threads`.
    pub fn fill_report(&self, r: &mut ChannelReport) {
        r.stages = self.stages.clone();
        r.untracked_threads = self.untracked;
        if let Some(first) = self.first_tsc {
            r.busy_ns = self.ticks_to_ns(self.last_tsc.saturating_sub(first));
            if r.busy_ns > 0 {
                r.requests_per_s = r.requests as f64 * 1e9 / r.busy_ns as f64;
            }
        }
    }
}
