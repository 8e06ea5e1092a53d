//! What the sweep measured and the statistics over its rounds.
//!
//! Every cell (workload, vCPUs, policy) gets one run per round and the
//! rounds are interleaved, so run `r` of two cells ran close together:
//! ratios are taken per round (run `r` of one cell over run `r` of the
//! other) and summarised as median and min–max ([`Spread`]).

use std::collections::BTreeMap;

use stagevm_bench::guest::GuestRun;
use stagevm_bench::stats::{median, Spread};

/// Which workload a cell ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Work {
    /// The i-cache-bound footprint workload at point `i` of the sweep.
    Footprint(usize),
    /// The test guest's default staged workload (`bench-policies`).
    Staged,
}

/// The guest runs, keyed (workload, vCPUs, policy), one per round.
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

    /// A cell's requests/s per round (empty if it did not run).
    pub fn rps(&self, w: Work, v: u32, policy: &str) -> Vec<f64> {
        self.runs(w, v, policy)
            .map_or_else(Vec::new, |r| r.iter().map(|x| x.rps).collect())
    }

    /// Median requests/s of a cell (NaN if it did not run).
    pub fn med_rps(&self, w: Work, v: u32, policy: &str) -> f64 {
        median(self.rps(w, v, policy))
    }

    /// Median idle % of a cell (NaN if it did not run or has no figures).
    pub fn idle(&self, w: Work, v: u32, policy: &str) -> f64 {
        self.runs(w, v, policy)
            .map_or(f64::NAN, |r| median(r.iter().map(|x| x.idle_pct).collect()))
    }

    /// Per round, `policy`'s requests/s over `base`'s.
    pub fn ratio(&self, w: Work, v: u32, policy: &str, base: &str) -> Spread {
        let (x, b) = (self.rps(w, v, policy), self.rps(w, v, base));
        let per_round: Vec<f64> = x.iter().zip(&b).map(|(x, b)| x / b).collect();
        Spread::of(&per_round)
    }

    /// `policy` over the better (by median) of `off` and `pinned`, and
    /// which one that was (`None` when neither ran).
    pub fn vs_better(&self, w: Work, v: u32, policy: &str) -> Option<(Spread, &'static str)> {
        let better = ["off", "pinned"]
            .into_iter()
            .filter(|b| self.med_rps(w, v, b).is_finite())
            .max_by(|a, b| self.med_rps(w, v, a).total_cmp(&self.med_rps(w, v, b)))?;
        Some((self.ratio(w, v, policy, better), better))
    }

    /// The guest's speed-up of `policy`: the lower of its median ratios to
    /// `off` and to `pinned` (so neither floating nor pinning alone counts).
    pub fn speedup(&self, w: Work, v: u32, policy: &str) -> f64 {
        let off = self.ratio(w, v, policy, "off").med;
        let pinned = self.ratio(w, v, policy, "pinned").med;
        match (off.is_finite(), pinned.is_finite()) {
            (true, true) => off.min(pinned),
            (true, false) => off,
            (false, true) => pinned,
            _ => f64::NAN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rps: f64) -> GuestRun {
        GuestRun {
            rps,
            ..GuestRun::default()
        }
    }

    #[test]
    fn ratios_are_taken_per_round() {
        let mut c = Cells::default();
        for (off, pinned, auto) in [(100.0, 90.0, 110.0), (50.0, 60.0, 45.0), (80.0, 70.0, 88.0)] {
            c.push(Work::Staged, 2, "off", run(off));
            c.push(Work::Staged, 2, "pinned", run(pinned));
            c.push(Work::Staged, 2, "auto", run(auto));
        }
        let r = c.ratio(Work::Staged, 2, "auto", "off");
        assert!((r.med - 1.1).abs() < 1e-9 && (r.min - 0.9).abs() < 1e-9);
        assert!((r.max - 1.1).abs() < 1e-9);
        let (_, better) = c.vs_better(Work::Staged, 2, "auto").unwrap();
        assert_eq!(better, "off");
        assert!(c.ratio(Work::Staged, 4, "auto", "off").med.is_nan());
        assert_eq!(
            Spread::of(&[1.0, f64::NAN, 3.0, 2.0]).ratio(),
            "2.000× (1.000–3.000)"
        );
    }
}
