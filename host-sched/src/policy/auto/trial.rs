//! One trial of `auto`: the modes' interleaved epochs, the rates measured in
//! them, the early cut and the verdict.
//!
//! Gaps between two modes are fractions of the unstaged rate the trial
//! measured (the reference every mode is judged against, as the margin is).
//! A pair of modes is *decided* when one leads the other by
//! [`AutoParams::decisive`] with a full epoch measured in each, or by twice
//! that with one measured period in each. A mode other than unstaged that a
//! decided pair puts behind any other mode is dropped from the rest of the
//! trial (its epochs are skipped, its running epoch ends at once). The trial
//! ends early when no mode is left besides unstaged, or only one that
//! unstaged is decided behind; otherwise when every mode left has
//! [`AutoParams::rounds`] full epochs measured.

use super::{AutoParams, Mode, Modes};

/// A running trial.
#[derive(Debug)]
pub(super) struct Trial {
    /// The mode of the current epoch.
    pub mode: Mode,
    /// The period within the epoch (0: the threads move, not measured).
    pub period: u32,
    /// Per mode ([`Mode::index`]), the rates of its measured periods
    /// (requests/s).
    rates: [Vec<f64>; 4],
    /// Per mode, still in the trial (unstaged always is).
    live: [bool; 4],
    /// Per mode, the periods it ran in this trial (measured or not).
    ran: [u64; 4],
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

impl Trial {
    /// A trial of `candidates` (and unstaged), starting with an unstaged
    /// epoch.
    pub fn new(candidates: Modes) -> Self {
        Self {
            mode: Mode::Unstaged,
            period: 0,
            rates: Default::default(),
            live: Mode::ALL.map(|m| m == Mode::Unstaged || candidates.contains(m)),
            ran: [0; 4],
        }
    }

    fn mean(&self, m: Mode) -> Option<f64> {
        mean(&self.rates[m.index()])
    }

    /// The unstaged rate measured so far (requests/s; 0 before any).
    pub fn unstaged_rate(&self) -> f64 {
        self.mean(Mode::Unstaged).unwrap_or(0.0)
    }

    /// Periods the trial ran in modes other than `kept`.
    pub fn losing_periods(&self, kept: Mode) -> u64 {
        Mode::ALL
            .iter()
            .filter(|m| **m != kept)
            .map(|m| self.ran[m.index()])
            .sum()
    }

    /// Records the period that just ended (it ran [`Trial::mode`]) and its
    /// rate, if any; returns the period within the epoch that follows.
    pub fn record(&mut self, rate: Option<f64>) -> u32 {
        let i = self.mode.index();
        self.ran[i] += 1;
        // The first period of an epoch is the move to the new plan; a period
        // without a completed request says nothing about any mode.
        if self.period > 0 {
            if let Some(r) = rate.filter(|r| r.is_finite() && *r > 0.0) {
                self.rates[i].push(r);
            }
        }
        self.period += 1;
        self.period
    }

    /// Measured periods of a full epoch.
    fn full(p: &AutoParams) -> usize {
        (p.epoch_periods - 1).max(1) as usize
    }

    /// By how much (a fraction of the unstaged rate) `a` leads `b`, when
    /// the pair is decided.
    fn lead(&self, p: &AutoParams, a: Mode, b: Mode) -> Option<f64> {
        let u = self.mean(Mode::Unstaged)?;
        let (ra, rb) = (&self.rates[a.index()], &self.rates[b.index()]);
        let gap = (mean(ra)? - mean(rb)?) / u;
        let full = Self::full(p);
        let enough = ra.len() >= full && rb.len() >= full;
        (gap >= 2.0 * p.decisive || (enough && gap >= p.decisive)).then_some(gap)
    }

    fn candidates(&self) -> impl Iterator<Item = Mode> + '_ {
        Mode::ALL[1..]
            .iter()
            .copied()
            .filter(|m| self.live[m.index()])
    }

    /// Drops the modes decidedly behind another; returns what it dropped,
    /// for the timeline (empty when nothing).
    pub fn cut(&mut self, p: &AutoParams) -> String {
        let dropped: Vec<(Mode, Mode, f64)> = self
            .candidates()
            .filter_map(|c| {
                Mode::ALL
                    .iter()
                    .filter(|m| self.live[m.index()] && **m != c)
                    .find_map(|m| self.lead(p, *m, c).map(|gap| (c, *m, gap)))
            })
            .collect();
        let mut what = Vec::new();
        for (c, by, gap) in dropped {
            self.live[c.index()] = false;
            let gap = gap * 100.0;
            what.push(match by {
                Mode::Unstaged => format!("drop {} ({gap:.1} % behind unstaged)", c.name()),
                _ => format!(
                    "drop {} (behind {} by {gap:.1} % of unstaged)",
                    c.name(),
                    by.name()
                ),
            });
        }
        what.join(", ")
    }

    /// True when the running epoch is over: its periods ran, or its mode
    /// was dropped.
    pub fn epoch_over(&self, p: &AutoParams) -> bool {
        self.period >= p.epoch_periods || !self.live[self.mode.index()]
    }

    /// Starts the epoch of the next mode left, in [`Mode::ALL`] order
    /// (unstaged after the last: a new round); returns it.
    pub fn advance(&mut self) -> Mode {
        let i = self.mode.index();
        self.mode = (1..=4)
            .map(|k| Mode::ALL[(i + k) % 4])
            .find(|m| self.live[m.index()])
            .unwrap_or(Mode::Unstaged);
        self.period = 0;
        self.mode
    }

    /// The decision of the trial, if it has one: at the end of an epoch
    /// (`epoch_over`) when every mode left has its rounds measured, or at
    /// once when the cut left no mode besides unstaged, or only one that
    /// leads unstaged decidedly. Returns the mode to keep and the line for
    /// the timeline.
    pub fn verdict(&self, p: &AutoParams, epoch_over: bool) -> Option<(Mode, String)> {
        let u = self.mean(Mode::Unstaged)?;
        let left: Vec<Mode> = self.candidates().collect();
        let decided = match left[..] {
            [] => true,
            [c] => self.lead(p, c, Mode::Unstaged).is_some(),
            _ => false,
        };
        let rounds = Self::full(p) * p.rounds.max(1) as usize;
        let done = epoch_over
            && Mode::ALL
                .iter()
                .filter(|m| self.live[m.index()])
                .all(|m| self.rates[m.index()].len() >= rounds);
        if !decided && !done {
            return None;
        }
        // The fastest mode left; on a tie the simpler (earlier in ALL).
        let mut best = (Mode::Unstaged, u);
        for c in left {
            if let Some(r) = self.mean(c).filter(|r| *r > best.1) {
                best = (c, r);
            }
        }
        let kept = if best.1 > u * (1.0 + p.margin) {
            best.0
        } else {
            Mode::Unstaged
        };
        Some((kept, self.describe(p, kept, best.0)))
    }

    /// "keep temporal: unstaged 1000, temporal 1100 (+10.0 %), spatial 950,
    /// both 1050 requests/s (margin 3 %, measured periods 6/6/6/6)": every
    /// mode's mean rate, the gain of the fastest over unstaged, dropped and
    /// unmeasured modes marked.
    fn describe(&self, p: &AutoParams, kept: Mode, best: Mode) -> String {
        let u = self.unstaged_rate();
        let rates: Vec<String> = Mode::ALL
            .iter()
            .map(|m| {
                let Some(r) = self.mean(*m) else {
                    return format!("{} -", m.name());
                };
                let mut s = format!("{} {r:.0}", m.name());
                if *m != Mode::Unstaged && *m == best {
                    s += &format!(" ({:+.1} %)", (r / u - 1.0) * 100.0);
                }
                if !self.live[m.index()] {
                    s += " dropped";
                }
                s
            })
            .collect();
        let periods: Vec<String> = self.rates.iter().map(|r| r.len().to_string()).collect();
        format!(
            "keep {}: {} requests/s (margin {:.0} %, measured periods {})",
            kept.name(),
            rates.join(", "),
            p.margin * 100.0,
            periods.join("/")
        )
    }
}
