//! The timeline: one entry per policy period (and per operator change
//! applied), kept as a ring bounded in bytes so a long run — or a guest
//! that makes the scheduler record in a loop — cannot grow the VMM without
//! bound. The oldest entries go first; how many went is reported.

use std::collections::VecDeque;

use stagevm_report::TimelineEntry;

/// Most bytes the timeline keeps (an estimate of its entries' heap and
/// inline size): 16 MiB hold ~45,000 entries of a 3-stage guest (stage
/// names included), 15 min of 20 ms policy periods.
pub const MAX_TIMELINE_BYTES: usize = 16 << 20;

/// Bytes one entry takes, inline and on the heap.
fn entry_bytes(e: &TimelineEntry) -> usize {
    std::mem::size_of::<TimelineEntry>()
        + e.load.heap_bytes()
        + e.requirement.heap_bytes()
        + [&e.mode, &e.decision, &e.source]
            .iter()
            .map(|s| s.as_ref().map_or(0, String::capacity))
            .sum::<usize>()
        + e.visit.capacity()
}

/// The policy periods, newest last, within [`MAX_TIMELINE_BYTES`] (or the
/// budget given to [`Timeline::with_budget`]).
#[derive(Debug)]
pub struct Timeline {
    entries: VecDeque<TimelineEntry>,
    bytes: usize,
    budget: usize,
    dropped: u64,
}

impl Default for Timeline {
    fn default() -> Self {
        Self::with_budget(MAX_TIMELINE_BYTES)
    }
}

impl Timeline {
    /// An empty timeline that keeps at most `budget` bytes.
    pub fn with_budget(budget: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            bytes: 0,
            budget,
            dropped: 0,
        }
    }

    /// Appends `entry`, dropping the oldest entries while over budget.
    pub fn push(&mut self, entry: TimelineEntry) {
        self.bytes += entry_bytes(&entry);
        self.entries.push_back(entry);
        while self.bytes > self.budget {
            let Some(old) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= entry_bytes(&old);
            self.dropped += 1;
        }
    }

    /// Entries kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries dropped to stay within the budget (the oldest).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Copies of the last `n` entries, oldest first.
    pub fn tail(&self, n: usize) -> Vec<TimelineEntry> {
        let skip = self.entries.len().saturating_sub(n);
        self.entries.iter().skip(skip).cloned().collect()
    }

    /// Copies of the last `n` entries that carry a decision, oldest first.
    pub fn decisions(&self, n: usize) -> Vec<TimelineEntry> {
        let mut last: Vec<_> = self
            .entries
            .iter()
            .rev()
            .filter(|t| t.decision.is_some())
            .take(n)
            .cloned()
            .collect();
        last.reverse();
        last
    }

    /// Moves every entry out (for the final report: no second copy).
    pub fn take(&mut self) -> Vec<TimelineEntry> {
        self.bytes = 0;
        std::mem::take(&mut self.entries).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(t_ms: f64) -> TimelineEntry {
        let names = ["parse".to_string(), "plan".into(), "execute".into()];
        TimelineEntry {
            t_ms,
            load: stagevm_report::PerStage::zip(&names, [0.5; 3]),
            requirement: stagevm_report::PerStage::zip(&names, [1; 3]),
            map_changed: false,
            requests_per_s: 0.0,
            mode: None,
            decision: (t_ms as u64)
                .is_multiple_of(10)
                .then(|| "decided".to_string()),
            source: None,
            visit: "fifo".into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_oldest_entries_go_when_over_budget() {
        let one = entry_bytes(&entry(0.0));
        let mut t = Timeline::with_budget(10 * one);
        for i in 0..100 {
            t.push(entry(f64::from(i)));
        }
        assert_eq!(t.len(), 10);
        assert_eq!(t.dropped(), 90);
        let tail = t.tail(3);
        assert_eq!(
            tail.iter().map(|e| e.t_ms).collect::<Vec<_>>(),
            [97.0, 98.0, 99.0]
        );
        assert_eq!(t.decisions(5).len(), 1, "only t = 90 is left with one");
        assert_eq!(t.take().len(), 10);
        assert!(t.is_empty());
    }
}
