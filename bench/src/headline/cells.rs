//! What the sweep measured and the statistics over its rounds.
//!
//! Every cell (workload, vCPUs, scheduling — a [`crate::modes::Sched`]'s
//! label such as `pinned+cohort`) gets one run per round and the
//! rounds are interleaved, so run `r` of two cells ran close together:
//! ratios are taken per round (run `r` of one cell over run `r` of the
//! other) and summarised as median and min–max ([`Spread`]).

use std::collections::BTreeMap;

use stagevm_bench::guest::GuestRun;
use stagevm_bench::stats::{median, Spread};

use crate::modes::{OFF, PINNED};

/// Which workload a cell ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Work {
    /// The i-cache-bound footprint workload at point `i` of the sweep.
    Footprint(usize),
    /// The test guest's default staged workload (`bench-policies`).
    Staged,
}

/// Which throughput of a run a comparison uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// The steady middle of the run (between the 10 % and 90 % marks of
    /// the requests: [`GuestRun::steady_rps`]).
    Steady,
    /// The whole run ([`GuestRun::rps`]).
    Whole,
}

impl Measure {
    /// `run`'s requests/s by this measure.
    pub fn of(self, run: &GuestRun) -> f64 {
        match self {
            Measure::Steady => run.steady_rps,
            Measure::Whole => run.rps,
        }
    }
}

/// The guest runs, keyed (workload, vCPUs, cell label), one per round.
#[derive(Debug, Default)]
pub struct Cells(BTreeMap<(Work, u32, String), Vec<GuestRun>>);

impl Cells {
    /// Adds a round's run of a cell.
    pub fn push(&mut self, w: Work, v: u32, policy: &str, run: GuestRun) {
        self.0
            .entry((w, v, policy.to_string()))
            .or_default()
            .push(run);
    }

    /// A cell's runs, if it ran.
    pub fn runs(&self, w: Work, v: u32, policy: &str) -> Option<&[GuestRun]> {
        self.0.get(&(w, v, policy.to_string())).map(Vec::as_slice)
    }

    /// A cell's requests/s by `m` per round (empty if it did not run).
    pub fn rps(&self, m: Measure, w: Work, v: u32, policy: &str) -> Vec<f64> {
        self.runs(w, v, policy)
            .map_or_else(Vec::new, |r| r.iter().map(|x| m.of(x)).collect())
    }

    /// Median requests/s of a cell by `m` (NaN if it did not run).
    pub fn med_rps(&self, m: Measure, w: Work, v: u32, policy: &str) -> f64 {
        median(self.rps(m, w, v, policy))
    }

    /// Median of a per-run count of a cell (NaN if it did not run).
    pub fn med_count(&self, w: Work, v: u32, policy: &str, f: impl Fn(&GuestRun) -> u64) -> f64 {
        self.runs(w, v, policy).map_or(f64::NAN, |r| {
            median(r.iter().map(|x| f(x) as f64).collect())
        })
    }

    /// Median idle % of a cell (NaN if it did not run or has no figures).
    pub fn idle(&self, w: Work, v: u32, policy: &str) -> f64 {
        self.runs(w, v, policy)
            .map_or(f64::NAN, |r| median(r.iter().map(|x| x.idle_pct).collect()))
    }

    /// Per round, `policy`'s requests/s over `base`'s, by `m`.
    pub fn ratio(&self, m: Measure, w: Work, v: u32, policy: &str, base: &str) -> Spread {
        let (x, b) = (self.rps(m, w, v, policy), self.rps(m, w, v, base));
        let per_round: Vec<f64> = x.iter().zip(&b).map(|(x, b)| x / b).collect();
        Spread::of(&per_round)
    }

    /// `policy` over the better (by median) of the unstaged baselines
    /// `off` and `pinned+fifo`, by `m`, and which one that was (`None`
    /// when neither ran).
    pub fn vs_better(
        &self,
        m: Measure,
        w: Work,
        v: u32,
        policy: &str,
    ) -> Option<(Spread, &'static str)> {
        let better = self.best_of(m, w, v, [OFF, PINNED])?;
        Some((self.ratio(m, w, v, policy, better), better))
    }

    /// Of `labels`, the cell with the highest median requests/s by `m`
    /// (`None` when none ran).
    pub fn best_of<'a>(
        &self,
        m: Measure,
        w: Work,
        v: u32,
        labels: impl IntoIterator<Item = &'a str>,
    ) -> Option<&'a str> {
        let med = |b: &str| self.med_rps(m, w, v, b);
        labels
            .into_iter()
            .filter(|b| med(b).is_finite())
            .max_by(|a, b| med(a).total_cmp(&med(b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rps: f64) -> GuestRun {
        GuestRun {
            rps,
            steady_rps: rps * 2.0,
            ..GuestRun::default()
        }
    }

    #[test]
    fn ratios_are_taken_per_round() {
        let mut c = Cells::default();
        for (off, pinned, auto) in [(100.0, 90.0, 110.0), (50.0, 60.0, 45.0), (80.0, 70.0, 88.0)] {
            c.push(Work::Staged, 2, "off", run(off));
            c.push(Work::Staged, 2, PINNED, run(pinned));
            c.push(Work::Staged, 2, "auto", run(auto));
        }
        let r = c.ratio(Measure::Whole, Work::Staged, 2, "auto", "off");
        assert!((r.med - 1.1).abs() < 1e-9 && (r.min - 0.9).abs() < 1e-9);
        assert!((r.max - 1.1).abs() < 1e-9);
        let (_, better) = c
            .vs_better(Measure::Whole, Work::Staged, 2, "auto")
            .unwrap();
        assert_eq!(better, "off");
        let best = c.best_of(
            Measure::Whole,
            Work::Staged,
            2,
            [PINNED, "auto", "static+cohort"],
        );
        assert_eq!(best, Some("auto"));
        assert!(c
            .ratio(Measure::Whole, Work::Staged, 4, "auto", "off")
            .med
            .is_nan());
        assert_eq!(c.med_rps(Measure::Steady, Work::Staged, 2, "off"), 160.0);
        assert_eq!(c.med_rps(Measure::Whole, Work::Staged, 2, "off"), 80.0);
        assert_eq!(
            Spread::of(&[1.0, f64::NAN, 3.0, 2.0]).ratio(),
            "2.000× (1.000–3.000)"
        );
    }
}
