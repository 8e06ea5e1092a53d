//! Cohorts as the host sees them: on each vCPU, a run of consecutive
//! entries into one stage by different threads — the threads a vCPU serves
//! in one visit of the stage under temporal staging (seed 002 §3.1: a
//! cohort shares the stage's instructions in the cache; `cohort` is also
//! the visit policy that waits for one). Mean cohort size = entries ÷
//! cohorts of a stage; 1 means every visit served one thread.
//!
//! Counted from the event stream the device drained: a rings guest's
//! events, or a counters guest's trace when it is complete (`trace_every`
//! = 1: a sampled trace has no runs). A stage exit (a request ends) leaves
//! the run open — the next thread may still join it; an idle marker ends
//! it, as does a resynchronised ring ([`Cohorts::forget`]). The same thread
//! entering the stage again starts a new cohort. Events lost on a full ring
//! merge or split runs: the report counts them beside (`trace_dropped`).
//! Events are validated by the device; a stage or vCPU past this guest's
//! is ignored, and every count saturates.

use hypercall_abi::stage::{IDLE_THREAD, STAGE_NONE};
use stagevm_report::StageStats;

use crate::stage::Event;

/// One vCPU's open run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    stage: u32,
    last_thread: u32,
}

/// Runs per vCPU, entries and cohorts per stage.
#[derive(Clone, Debug, Default)]
pub struct Cohorts {
    runs: Vec<Option<Run>>,
    /// Per stage: (entries counted in cohorts, cohorts).
    stages: Vec<(u64, u64)>,
}

impl Cohorts {
    /// For a guest of `num_stages` stages on `num_vcpus` vCPUs.
    pub fn new(num_stages: usize, num_vcpus: usize) -> Self {
        Self {
            runs: vec![None; num_vcpus],
            stages: vec![(0, 0); num_stages],
        }
    }

    /// Folds in one validated event, in its vCPU's ring order.
    pub fn observe(&mut self, ev: &Event) {
        let Some(run) = self.runs.get_mut(ev.vcpu as usize) else {
            return;
        };
        if ev.stage == STAGE_NONE {
            if ev.thread == IDLE_THREAD {
                *run = None;
            }
            return;
        }
        let Some((entries, cohorts)) = self.stages.get_mut(ev.stage as usize) else {
            return;
        };
        *entries = entries.saturating_add(1);
        match run {
            Some(r) if r.stage == ev.stage && r.last_thread != ev.thread => {
                r.last_thread = ev.thread;
            }
            _ => {
                *cohorts = cohorts.saturating_add(1);
                *run = Some(Run {
                    stage: ev.stage,
                    last_thread: ev.thread,
                });
            }
        }
    }

    /// vCPU `vcpu`'s ring was resynchronised (events skipped): its open run ends.
    pub fn forget(&mut self, vcpu: u32) {
        if let Some(r) = self.runs.get_mut(vcpu as usize) {
            *r = None;
        }
    }

    /// Writes `cohorts` and `cohort_entries` of each stage in `out` (by stage id).
    pub fn fill(&self, out: &mut [StageStats]) {
        for s in out {
            if let Some((entries, cohorts)) = self.stages.get(s.id as usize) {
                s.cohort_entries = *entries;
                s.cohorts = *cohorts;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(vcpu: u32, thread: u32, stage: u32) -> Event {
        Event {
            vcpu,
            thread,
            stage,
            tsc: 0,
        }
    }

    fn sizes(c: &Cohorts) -> Vec<(u64, u64)> {
        c.stages.clone()
    }

    #[test]
    fn consecutive_entries_of_one_stage_by_different_threads_are_one_cohort() {
        let mut c = Cohorts::new(2, 2);
        // vCPU 0: A, B, C enter stage 0 (one cohort of 3), then A, B
        // stage 1 (one of 2); A's request ends in between (no break).
        for e in [ev(0, 1, 0), ev(0, 2, 0), ev(0, 1, STAGE_NONE), ev(0, 3, 0)] {
            c.observe(&e);
        }
        c.observe(&ev(0, 1, 1));
        c.observe(&ev(0, 2, 1));
        // vCPU 1 interleaved: its own run of stage 0.
        c.observe(&ev(1, 4, 0));
        assert_eq!(sizes(&c), vec![(4, 2), (2, 1)]);
    }

    #[test]
    fn idle_a_resync_or_the_same_thread_again_start_a_new_cohort() {
        let mut c = Cohorts::new(1, 1);
        c.observe(&ev(0, 1, 0));
        c.observe(&ev(0, 1, 0)); // the same thread: its next request
        c.observe(&ev(0, 2, 0));
        c.observe(&ev(0, IDLE_THREAD, STAGE_NONE));
        c.observe(&ev(0, 3, 0));
        c.forget(0);
        c.observe(&ev(0, 4, 0));
        assert_eq!(sizes(&c), vec![(5, 4)]);
    }

    #[test]
    fn stages_and_vcpus_past_the_guest_are_ignored() {
        let mut c = Cohorts::new(1, 1);
        c.observe(&ev(5, 1, 0));
        c.observe(&ev(0, 1, 7));
        c.forget(9);
        assert_eq!(sizes(&c), vec![(0, 0)]);
        let mut out = vec![StageStats {
            id: 0,
            ..Default::default()
        }];
        c.observe(&ev(0, 1, 0));
        c.fill(&mut out);
        assert_eq!((out[0].cohort_entries, out[0].cohorts), (1, 1));
    }
}
