//! One trial of `auto`: the modes' interleaved epochs, what was measured in
//! them ([`Measured`]), the early cut and the verdict.
//!
//! Every mode is scored by the trial's [`Objective`] (the rate, or minus
//! the CPU per request), and gaps between two modes are fractions of the
//! unstaged mode's score (the reference every mode is judged against, as
//! the margin is). A pair of modes is *decided* when one leads the other
//! by [`AutoParams::decisive`] with a full epoch measured in each, or by
//! twice that with one measured period in each. A mode other than unstaged
//! that a decided pair puts behind any other mode is dropped from the rest
//! of the trial (its epochs are skipped, its running epoch ends at once),
//! unless that other mode is one the verdict would refuse (over the
//! latency bound, behind the arrivals): a refused mode drops no other.
//! The trial ends early when no mode is left besides unstaged, or only one
//! that unstaged is decided behind (and whose latency is known, when the
//! guest times requests); otherwise when every mode left has
//! [`AutoParams::rounds`] full epochs measured.
//!
//! The verdict keeps the best mode by the objective that beats unstaged by
//! the margin (and, under the rate objective, by more than [`KEEP_Z`]
//! standard errors of the periods' noise), among those the latency bound allows (p99 within
//! [`LatencyBound::limit_ns`] of unstaged's) and, under the CPU objective,
//! that kept up with the arrivals (a rate within the margin of
//! unstaged's, or below it by no more than the periods' own noise); else
//! unstaged.

use super::measure::{LatencyBound, Measured, ModeSummary, Objective, TrialSummary};
use super::{AutoParams, Mode, Modes};
use crate::policy::Observation;

/// Standard errors by which a mode's rate must fall below unstaged's to
/// count as behind the arrivals: one-sided, a mode that keeps up is
/// called behind by noise alone in 0.13 % of verdicts (normal
/// approximation of the mean of a trial's periods).
const BEHIND_Z: f64 = 3.0;

/// Standard errors by which a mode's rate must lead unstaged's, beside the
/// margin, for the verdict to keep it under the rate objective: one-sided,
/// a mode no faster than unstaged is kept by the periods' noise alone in
/// 2.3 % of verdicts (normal approximation). Without it a busy host's
/// noise (two trials of the same guest measured unstaged at 6.0 and 4.5
/// million requests/s in one CI run) kept a slower mode that led by 5 %.
const KEEP_Z: f64 = 2.0;

/// A running trial.
#[derive(Debug)]
pub(super) struct Trial {
    /// The mode of the current epoch.
    pub mode: Mode,
    /// The period within the epoch (0: the threads move, not measured).
    pub period: u32,
    /// Per mode ([`Mode::index`]), its measured periods.
    measured: [Measured; 4],
    /// Per mode, its measured periods of each round (index: the round).
    by_round: [Vec<Measured>; 4],
    /// The round the current epoch belongs to (0 first; a round starts
    /// with an unstaged epoch).
    round: usize,
    /// Per mode, still in the trial (unstaged always is).
    live: [bool; 4],
    /// Per mode, the periods it ran in this trial (measured or not).
    ran: [u64; 4],
}

/// The verdict of a trial: the mode to keep, the timeline's line and the
/// summary.
pub(super) struct Verdict {
    pub kept: Mode,
    pub what: String,
    pub summary: TrialSummary,
    /// The objective that decided it.
    pub objective: Objective,
}

impl Trial {
    /// A trial of `candidates` (and unstaged), starting with an unstaged
    /// epoch.
    pub fn new(candidates: Modes) -> Self {
        Self {
            mode: Mode::Unstaged,
            period: 0,
            measured: Default::default(),
            by_round: Default::default(),
            round: 0,
            live: Mode::ALL.map(|m| m == Mode::Unstaged || candidates.contains(m)),
            ran: [0; 4],
        }
    }

    fn of(&self, m: Mode) -> &Measured {
        &self.measured[m.index()]
    }

    /// The unstaged mode's measurements so far.
    pub fn unstaged(&self) -> &Measured {
        self.of(Mode::Unstaged)
    }

    /// Periods the trial ran in modes other than `kept`.
    pub fn losing_periods(&self, kept: Mode) -> u64 {
        Mode::ALL
            .iter()
            .filter(|m| **m != kept)
            .map(|m| self.ran[m.index()])
            .sum()
    }

    /// Records the period that just ended (it ran [`Trial::mode`]) and
    /// what was measured in it; returns the period within the epoch that
    /// follows.
    pub fn record(&mut self, o: &Observation) -> u32 {
        let i = self.mode.index();
        self.ran[i] += 1;
        // The first period of an epoch is the move to the new plan; a period
        // without a completed request says nothing about any mode.
        let r = o.requests_per_s;
        if self.period > 0 && r.is_finite() && r > 0.0 {
            self.measured[i].record(o);
            let rounds = &mut self.by_round[i];
            if rounds.len() <= self.round {
                rounds.resize_with(self.round + 1, Measured::default);
            }
            rounds[self.round].record(o);
        }
        self.period += 1;
        self.period
    }

    /// The objective: the rate when the unstaged epochs were saturated
    /// (utilisation ≥ [`AutoParams::saturation`]) or either figure is
    /// missing (an older guest, no CPU figures), else CPU per request.
    pub fn objective(&self, p: &AutoParams) -> Objective {
        let u = self.unstaged();
        match (u.utilisation(), u.cpu_per_request_ns()) {
            (Some(util), Some(_)) if util < p.saturation => Objective::CpuPerRequest,
            _ => Objective::Rate,
        }
    }

    /// Measured periods of a full epoch.
    fn full(p: &AutoParams) -> usize {
        (p.epoch_periods - 1).max(1) as usize
    }

    /// By how much (a fraction of the unstaged mode's score) `a` leads
    /// `b` under `objective`, when the pair is decided.
    fn lead(&self, p: &AutoParams, objective: Objective, a: Mode, b: Mode) -> Option<f64> {
        let u = self.unstaged().score(objective)?.abs();
        let (ma, mb) = (self.of(a), self.of(b));
        let gap = (ma.score(objective)? - mb.score(objective)?) / u.max(f64::MIN_POSITIVE);
        let full = Self::full(p);
        let enough = ma.periods() >= full && mb.periods() >= full;
        (gap >= 2.0 * p.decisive || (enough && gap >= p.decisive)).then_some(gap)
    }

    fn candidates(&self) -> impl Iterator<Item = Mode> + '_ {
        Mode::ALL[1..]
            .iter()
            .copied()
            .filter(|m| self.live[m.index()])
    }

    /// The highest p99 (ns) a mode may keep: the latency bound applied to
    /// unstaged's p99, once enough of its requests were timed.
    fn p99_limit(&self, p: &AutoParams, bound: &LatencyBound) -> Option<f64> {
        self.unstaged()
            .p99_ns(p.min_latency_samples)
            .map(|pu| bound.limit_ns(pu))
    }

    /// True when `m`'s p99 is known and beyond `limit` (ns).
    fn over_bound(&self, p: &AutoParams, limit: Option<f64>, m: Mode) -> bool {
        limit
            .zip(self.of(m).p99_ns(p.min_latency_samples))
            .is_some_and(|(l, pm)| pm > l)
    }

    /// True when, under the CPU objective, `m` did not keep up with the
    /// arrivals: its rate is below unstaged's by the margin and by more
    /// than the periods' own noise ([`BEHIND_Z`] standard errors of the
    /// difference). Open-loop arrivals make each period's rate vary by
    /// itself; a mode that serves every arrival is not behind because its
    /// periods happened to see fewer.
    fn behind_arrivals(&self, p: &AutoParams, objective: Objective, m: Mode) -> bool {
        let (u, x) = (self.unstaged(), self.of(m));
        let (Some(ur), Some(r)) = (u.rate(), x.rate()) else {
            return false;
        };
        let se = x.rate_se().unwrap_or(0.0).hypot(u.rate_se().unwrap_or(0.0));
        objective == Objective::CpuPerRequest && r < ur * (1.0 - p.margin) && ur - r > BEHIND_Z * se
    }

    /// Drops the modes decidedly behind another, and those whose p99 is
    /// beyond twice the latency bound's limit already (a trial exposes the
    /// server's requests to every mode it runs: a mode with such a tail is
    /// not run again); returns what it dropped, for the timeline (empty
    /// when nothing).
    pub fn cut(&mut self, p: &AutoParams, bound: &LatencyBound) -> String {
        let objective = self.objective(p);
        let limit = self.p99_limit(p, bound);
        let mut what = Vec::new();
        if let Some(limit) = limit {
            let tails: Vec<(Mode, f64)> = self
                .candidates()
                .filter_map(|c| {
                    let p99 = self.of(c).p99_ns(p.min_latency_samples)?;
                    (p99 > 2.0 * limit).then_some((c, p99))
                })
                .collect();
            for (c, p99) in tails {
                self.live[c.index()] = false;
                what.push(format!(
                    "drop {} (p99 {:.0} µs, over twice the latency bound of {:.0} µs)",
                    c.name(),
                    p99 / 1000.0,
                    limit / 1000.0
                ));
            }
        }
        let dropped: Vec<(Mode, Mode, f64)> = self
            .candidates()
            .filter_map(|c| {
                Mode::ALL
                    .iter()
                    .filter(|m| self.live[m.index()] && **m != c)
                    // A leader the verdict would refuse (over the latency
                    // bound, behind the arrivals) drops no other mode.
                    .filter(|m| {
                        !self.over_bound(p, limit, **m) && !self.behind_arrivals(p, objective, **m)
                    })
                    .find_map(|m| self.lead(p, objective, *m, c).map(|gap| (c, *m, gap)))
            })
            .collect();
        for (c, by, gap) in dropped {
            self.live[c.index()] = false;
            let gap = gap * 100.0;
            what.push(match by {
                Mode::Unstaged => format!(
                    "drop {} ({gap:.1} % behind unstaged by {})",
                    c.name(),
                    objective.name()
                ),
                _ => format!(
                    "drop {} (behind {} by {gap:.1} % of unstaged's {})",
                    c.name(),
                    by.name(),
                    objective.name()
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
        if self.mode == Mode::Unstaged {
            self.round += 1;
        }
        self.period = 0;
        self.mode
    }

    /// Whether `m` beat the unstaged epoch of its own round under
    /// `objective` in every round where both were measured (and there were
    /// `p.rounds` such rounds).
    fn wins_every_round(&self, p: &AutoParams, objective: Objective, m: Mode) -> bool {
        let (mine, base) = (
            &self.by_round[m.index()],
            self.by_round[Mode::Unstaged.index()].as_slice(),
        );
        let pairs: Vec<bool> = mine
            .iter()
            .zip(base)
            .filter_map(|(a, u)| Some(a.score(objective)? > u.score(objective)?))
            .collect();
        pairs.len() >= p.rounds.max(1) as usize && pairs.iter().all(|w| *w)
    }

    /// Whether mode `m`'s lead `lead` over unstaged (the objective's units)
    /// is more than the periods' own noise: under the rate objective more
    /// than [`KEEP_Z`] standard errors of the difference of the two rates
    /// (from their periods' spread; with fewer than two periods in either,
    /// no noise is known and the margin alone decides). The CPU objective's
    /// figure is a ratio of sums, with no per-period spread: the margin
    /// alone decides it.
    fn beyond_noise(&self, objective: Objective, m: Mode, lead: f64) -> bool {
        if objective != Objective::Rate || m == Mode::Unstaged {
            return true;
        }
        match (self.of(m).rate_se(), self.unstaged().rate_se()) {
            (Some(a), Some(b)) => lead > KEEP_Z * a.hypot(b),
            _ => true,
        }
    }

    /// The verdict of the trial, if it has one: at the end of an epoch
    /// (`epoch_over`) when every mode left has its rounds measured, or at
    /// once when the cut left no mode besides unstaged.
    pub fn verdict(
        &self,
        p: &AutoParams,
        epoch_over: bool,
        bound: &LatencyBound,
    ) -> Option<Verdict> {
        let objective = self.objective(p);
        let u = self.unstaged().score(objective)?;
        let left: Vec<Mode> = self.candidates().collect();
        let decided = left.is_empty();
        let rounds = Self::full(p) * p.rounds.max(1) as usize;
        let done = epoch_over
            && Mode::ALL
                .iter()
                .filter(|m| self.live[m.index()])
                .all(|m| self.of(*m).periods() >= rounds);
        if !decided && !done {
            return None;
        }
        let limit = self.p99_limit(p, bound);
        let over = |m: Mode| self.over_bound(p, limit, m);
        let behind = |m: Mode| self.behind_arrivals(p, objective, m);
        // The best mode left by the objective, with and without the
        // latency bound; on a tie the simpler (earlier in ALL).
        let best = |allowed: &dyn Fn(Mode) -> bool| {
            let mut best = (Mode::Unstaged, u);
            for c in left.iter().copied().filter(|c| allowed(*c)) {
                if let Some(s) = self.of(c).score(objective).filter(|s| *s > best.1) {
                    best = (c, s);
                }
            }
            best
        };
        let keep = |(m, s): (Mode, f64)| {
            if s > u + p.margin * u.abs() && self.beyond_noise(objective, m, s - u) {
                m
            } else {
                Mode::Unstaged
            }
        };
        let paired = |c: Mode| self.wins_every_round(p, objective, c);
        let kept = keep(best(&|c| !over(c) && !behind(c) && paired(c)));
        let by_objective = keep(best(&|c| !behind(c) && paired(c)));
        let decided_by = if kept != by_objective && over(by_objective) {
            "latency bound"
        } else {
            objective.name()
        };
        let summary = TrialSummary {
            kept: kept.name(),
            objective: objective.name(),
            decided_by,
            unstaged_utilisation: self.unstaged().utilisation(),
            p99_limit_ns: limit,
            modes: Mode::ALL
                .iter()
                .map(|m| {
                    let x = self.of(*m);
                    ModeSummary {
                        mode: m.name(),
                        periods: x.periods(),
                        rate: x.rate(),
                        cpu_per_request_ns: x.cpu_per_request_ns(),
                        p99_ns: x.p99_ns(p.min_latency_samples),
                        utilisation: x.utilisation(),
                        dropped: !self.live[m.index()],
                        over_latency_bound: over(*m),
                    }
                })
                .collect(),
        };
        let what = describe(p, &summary, objective, behind);
        Some(Verdict {
            kept,
            what,
            summary,
            objective,
        })
    }
}

/// "keep temporal: unstaged 1000, temporal 1100 (+10.0 %), spatial 900
/// dropped, both 1050 requests/s (margin 3 %, measured periods 6/6/6/6);
/// by rate, unstaged utilisation 99 %; p99 unstaged 812 µs, …": every
/// mode's figure under the objective, the gain of the best over unstaged,
/// dropped, unmeasured and refused modes marked, then what decided and the
/// other figures.
fn describe(
    p: &AutoParams,
    s: &TrialSummary,
    objective: Objective,
    behind: impl Fn(Mode) -> bool,
) -> String {
    let value = |m: &ModeSummary| match objective {
        Objective::Rate => m.rate,
        Objective::CpuPerRequest => m.cpu_per_request_ns.map(|ns| ns / 1000.0),
    };
    let (unit, digits) = match objective {
        Objective::Rate => ("requests/s", 0),
        Objective::CpuPerRequest => ("µs of CPU per request", 2),
    };
    let u = value(&s.modes[0]);
    let mut parts = Vec::new();
    for (m, mode) in s.modes.iter().zip(Mode::ALL) {
        let Some(v) = value(m) else {
            parts.push(format!("{} -", m.mode));
            continue;
        };
        let mut part = format!("{} {v:.digits$}", m.mode);
        if let Some(u) = u.filter(|u| *u > 0.0 && mode != Mode::Unstaged && m.mode == s.kept) {
            part += &format!(" ({:+.1} %)", (v / u - 1.0) * 100.0);
        }
        if m.dropped {
            part += " dropped";
        }
        if m.over_latency_bound {
            part += " over the latency bound";
        }
        if behind(mode) {
            part += " behind the arrivals";
        }
        parts.push(part);
    }
    let periods: Vec<String> = s.modes.iter().map(|m| m.periods.to_string()).collect();
    let mut line = format!(
        "keep {}: {} {unit} (margin {:.0} %, measured periods {}); by {}",
        s.kept,
        parts.join(", "),
        p.margin * 100.0,
        periods.join("/"),
        s.decided_by
    );
    if let Some(util) = s.unstaged_utilisation {
        line += &format!(", unstaged utilisation {:.0} %", util * 100.0);
    }
    if objective == Objective::CpuPerRequest {
        let rates: Vec<String> = s
            .modes
            .iter()
            .map(|m| m.rate.map_or("-".into(), |r| format!("{r:.0}")))
            .collect();
        line += &format!("; rates {} requests/s", rates.join("/"));
    }
    if s.modes.iter().any(|m| m.p99_ns.is_some()) {
        let p99: Vec<String> = s
            .modes
            .iter()
            .map(|m| {
                m.p99_ns
                    .map_or("-".into(), |ns| format!("{:.0}", ns / 1000.0))
            })
            .collect();
        line += &format!("; p99 {} µs", p99.join("/"));
        if let Some(l) = s.p99_limit_ns {
            line += &format!(" (bound {:.0} µs)", l / 1000.0);
        }
    }
    line
}
