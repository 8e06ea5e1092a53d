//! The guest cells' scheduling: a host policy (`--policy`, spatial staging
//! or none) × a stage-visit policy (`--visit`, temporal staging or none).
//!
//! `pinned` and `static` run once per `--visits` entry (`fifo` always
//! first): `pinned+cohort` is temporal staging alone (Gordon's
//! "replicate"), `static+cohort` spatial and temporal ("partition, then a
//! visit order"). The other policies run without `--visit`: `off` and
//! `proportional` with FIFO visits, `auto` choosing its own visit policy.
//!
//! A cell's [`Staging`] says which native reference its gain capture G is
//! taken against ([`native_ref`]).

use stagevm_bench::stats::Spread;

use crate::Point;
use stagevm_bench::native::Mode;

/// The unstaged baseline without pinning.
pub const OFF: &str = "off";
/// The unstaged baseline with pinned vCPUs (FIFO visits).
pub const PINNED: &str = "pinned+fifo";
/// Spatial staging alone (the earlier headline's `static`).
pub const STATIC: &str = "static+fifo";
/// The policy that chooses its own plan and visit policy.
pub const AUTO: &str = "auto";
/// The host policies that run once per stage-visit policy.
const WITH_VISITS: [&str; 2] = ["pinned", "static"];

/// What a cell stages, which decides the native reference of its G.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// Nothing (`off`, `pinned+fifo`): the baselines, no G.
    Unstaged,
    /// Stages on their own cores, FIFO visits (`static+fifo`,
    /// `proportional`): against the native spatial reference.
    Spatial,
    /// A visit order on pinned vCPUs (`pinned+cohort` …): against the
    /// native cohort reference.
    Temporal,
    /// Both (`static+cohort` …): against the larger native gain.
    Both,
    /// `auto`, which may choose either: against the larger native gain.
    Auto,
}

/// One guest cell's scheduling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sched {
    /// `--policy` (off, pinned, static, proportional, auto).
    pub policy: String,
    /// `--visit`, passed to stagevm only when set (fifo, cohort, srpt, dbr,
    /// mg1, color).
    pub visit: Option<String>,
}

impl Sched {
    /// The cell's name: `policy+visit` (e.g. `pinned+cohort`), or the
    /// policy alone when no visit policy is given.
    pub fn label(&self) -> String {
        match &self.visit {
            Some(v) => format!("{}+{v}", self.policy),
            None => self.policy.clone(),
        }
    }

    /// stagevm arguments beyond `--policy` (`--visit NAME`, or none).
    pub fn extra(&self) -> Vec<&str> {
        self.visit
            .as_deref()
            .map_or_else(Vec::new, |v| vec!["--visit", v])
    }

    /// What the cell stages.
    pub fn staging(&self) -> Staging {
        let temporal = self.visit.as_deref().is_some_and(|v| v != "fifo");
        match (self.policy.as_str(), temporal) {
            ("auto", _) => Staging::Auto,
            ("off", false) | ("pinned", false) => Staging::Unstaged,
            ("off", true) | ("pinned", true) => Staging::Temporal,
            (_, false) => Staging::Spatial,
            (_, true) => Staging::Both,
        }
    }
}

/// Every cell of a round, in order: each policy of `policies`, `pinned`
/// and `static` once per visit policy of `visits` (`fifo` first, added
/// when missing; repeats dropped).
pub fn scheds(policies: &[String], visits: &[String]) -> Vec<Sched> {
    let mut vs: Vec<&str> = vec!["fifo"];
    for v in visits {
        if !vs.contains(&v.as_str()) {
            vs.push(v);
        }
    }
    let mut out: Vec<Sched> = Vec::new();
    for p in policies {
        let cells: Vec<Sched> = if WITH_VISITS.contains(&p.as_str()) {
            vs.iter()
                .map(|v| Sched {
                    policy: p.clone(),
                    visit: Some((*v).to_string()),
                })
                .collect()
        } else {
            vec![Sched {
                policy: p.clone(),
                visit: None,
            }]
        };
        for c in cells {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// The native reference a cell of `staging` is judged against at `point`:
/// the mode and its gain over `whole` per round (`None` for the
/// baselines). The larger of two gains is the one with the larger median.
pub fn native_ref(point: &Point, staging: Staging) -> Option<(Mode, Spread)> {
    let gain = |m: Mode| (m, point.native_gain(m));
    match staging {
        Staging::Unstaged => None,
        Staging::Spatial => Some(gain(Mode::Spatial)),
        Staging::Temporal => Some(gain(Mode::Cohort)),
        Staging::Both | Staging::Auto => {
            let (s, c) = (gain(Mode::Spatial), gain(Mode::Cohort));
            let key = |g: &Spread| {
                if g.med.is_finite() {
                    g.med
                } else {
                    f64::NEG_INFINITY
                }
            };
            Some(if key(&c.1) > key(&s.1) { c } else { s })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn pinned_and_static_run_once_per_visit_policy() {
        let s = scheds(
            &names(&["off", "pinned", "static", "proportional", "auto"]),
            &names(&["cohort", "fifo", "srpt", "cohort"]),
        );
        let labels: Vec<String> = s.iter().map(Sched::label).collect();
        assert_eq!(
            labels,
            [
                "off",
                "pinned+fifo",
                "pinned+cohort",
                "pinned+srpt",
                "static+fifo",
                "static+cohort",
                "static+srpt",
                "proportional",
                "auto"
            ]
        );
        let staging: Vec<Staging> = s.iter().map(Sched::staging).collect();
        use Staging::*;
        assert_eq!(
            staging,
            [Unstaged, Unstaged, Temporal, Temporal, Spatial, Both, Both, Spatial, Auto]
        );
        assert_eq!(s[2].extra(), ["--visit", "cohort"]);
        assert!(s[0].extra().is_empty() && s[8].extra().is_empty());
        assert_eq!(labels[1], PINNED);
        assert_eq!(labels[4], STATIC);
        assert_eq!((labels[0].as_str(), labels[8].as_str()), (OFF, AUTO));
    }
}
