//! One trial of `auto`: duels of paired, alternating slices, each stopped by
//! a sequential test.
//!
//! A trial starts from unstaged, the **incumbent**, and takes the
//! candidates one at a time (the mode held before first: a re-trial
//! re-tests it before anything else). A **duel** alternates the incumbent
//! and the candidate in slices of [`AutoParams::slice_periods`] measured
//! periods, in pairs of one slice each, in the balanced order A B, B A,
//! A B, … (so a drift of the load that is linear in time cancels over two
//! pairs, and the plan changes only every other slice). After each change
//! of plan the slice skips the **settling** periods, which the trial
//! measures (the [`Settle`] meter, the `settle` submodule). Each pair's
//! difference of the objective goes to the sequential test ([`Sprt`]): the
//! duel ends when the test shows the candidate better by the margin (it
//! becomes the incumbent), or not better, or at the cap on pairs. The
//! objective's p99 is a veto: a candidate whose p99 over the duel passes the latency bound
//! (against the incumbent's) is refused, and one past twice the bound is
//! refused at once; below saturation a candidate whose rate falls behind
//! the incumbent's (it does not keep up with the arrivals) is refused. The
//! trial keeps the last incumbent.

use super::measure::{
    mix_correction, LatencyBound, Measured, ModeSummary, Objective, TrialSummary,
};
use super::settle::Settle;
use super::sprt::{Outcome, Sprt, SprtParams};
use super::{AutoParams, Mode};
use crate::policy::Observation;

/// The log ratio a pair counts when one side's slice completed no request
/// and the other's did: a loss of 1 − e⁻¹ = 63 %, decisive over a few
/// pairs. It is also the most any pair counts either way: a slice that
/// completed next to nothing (stagesim's temporal slices while InnoDB's
/// background threads ran first: −99.9 %, log ratios near −7) would
/// otherwise swell the pairs' spread until no bound could stop the duel
/// before its least pairs.
const STARVED: f64 = 1.0;

/// How a duel ended, for the summary.
#[derive(Clone, Debug, PartialEq)]
pub struct DuelSummary {
    /// The incumbent's name.
    pub incumbent: &'static str,
    /// The candidate's name.
    pub candidate: &'static str,
    /// Pairs measured.
    pub pairs: u32,
    /// The pairs' mean difference as a fraction of the incumbent's figure
    /// (positive: the candidate better): `e^m − 1` of the mean log ratio
    /// `m` the test ran on.
    pub mean: Option<f64>,
    /// Its standard error (a fraction; the delta method, `e^m · se(m)`).
    pub se: Option<f64>,
    /// The test's log-likelihood ratio at the end.
    pub llr: Option<f64>,
    /// The test's verdict: `better`, `no better` or `capped`
    /// ([`Outcome::name`]).
    pub outcome: &'static str,
    /// The one-sided confidence that the candidate is better at all.
    pub confidence: Option<f64>,
    /// Why a candidate the test found better was refused: `latency bound`
    /// or `behind the arrivals`.
    pub veto: Option<&'static str>,
    /// The pairs' mean difference of the rates (a fraction; negative: the
    /// candidate completed fewer requests) and its standard error.
    pub rate_diff: Option<(f64, f64)>,
    /// The candidate became the incumbent.
    pub won: bool,
    /// The duel stopped as futile: its first pairs fell behind by far more
    /// than the trial's noise ([`Sprt::with_prior_sigma`]).
    pub futile: bool,
}

/// The running duel.
#[derive(Debug)]
struct Duel {
    incumbent: Mode,
    candidate: Mode,
    /// The pair being measured and which of its slices runs (false: the
    /// first).
    pair: u32,
    second: bool,
    /// The running slice: its measurements, its per-period scores, whether
    /// it began with a change of plan.
    slice: Measured,
    scores: Vec<Option<f64>>,
    switched: bool,
    /// The pair's finished slice of each side (0: incumbent).
    done: [Option<Measured>; 2],
    /// Both sides over the whole duel (latency, rates).
    sides: [Measured; 2],
    test: Sprt,
    /// Per pair, the candidate's rate minus the incumbent's (a fraction).
    rate_diff: Sprt,
}

impl Duel {
    /// `noise`: the prior spread of a pair's difference (the futility
    /// stop's, [`Sprt::with_prior_sigma`]).
    fn new(
        incumbent: Mode,
        candidate: Mode,
        sprt: SprtParams,
        switched: bool,
        noise: Option<f64>,
    ) -> Self {
        Self {
            incumbent,
            candidate,
            pair: 0,
            second: false,
            slice: Measured::default(),
            scores: Vec::new(),
            switched,
            done: [None, None],
            sides: Default::default(),
            test: Sprt::new(sprt).with_prior_sigma(noise),
            rate_diff: Sprt::new(sprt),
        }
    }

    /// The side the running slice measures (0: the incumbent): pair k's
    /// order is A B for even k, B A for odd.
    fn side(&self) -> usize {
        usize::from((self.pair % 2 == 1) != self.second)
    }

    fn mode(&self) -> Mode {
        [self.incumbent, self.candidate][self.side()]
    }
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

/// A running trial.
#[derive(Debug)]
pub(super) struct Trial {
    /// The mode of the running period.
    pub mode: Mode,
    /// The period within the running slice.
    pub period: u32,
    incumbent: Mode,
    /// Candidates still to duel, next first.
    queue: Vec<Mode>,
    duel: Option<Duel>,
    duels: Vec<DuelSummary>,
    /// Modes not trialled and why.
    skipped: Vec<(Mode, String)>,
    pub settle: Settle,
    objective: Option<Objective>,
    /// Per mode, its measured periods over the trial (the summary).
    measured: [Measured; 4],
    /// Per mode, the periods it ran (measured or not).
    ran: [u64; 4],
    /// The latency bound's limit of the duel that set the kept mode.
    limit_ns: Option<f64>,
    /// The largest spread of a pair's difference the trial's finished
    /// duels of at least their least pairs measured: the prior of the
    /// next duel's futility stop
    /// ([`Sprt::with_prior_sigma`]).
    noise: Option<f64>,
}

impl Trial {
    /// A trial of `candidates` (in order) against unstaged, with `skipped`
    /// modes and why, `settle` the settling measured so far; `from` is the
    /// mode that ran in the period before (a change of plan if not
    /// unstaged).
    pub fn new(
        candidates: Vec<Mode>,
        skipped: Vec<(Mode, String)>,
        settle: Settle,
        from: Mode,
        p: &AutoParams,
    ) -> Self {
        let mut t = Self {
            mode: Mode::Unstaged,
            period: 0,
            incumbent: Mode::Unstaged,
            queue: candidates.into_iter().rev().collect(),
            duel: None,
            duels: Vec::new(),
            skipped,
            settle,
            objective: None,
            measured: Default::default(),
            ran: [0; 4],
            limit_ns: None,
            noise: None,
        };
        t.next_duel(p, from);
        t
    }

    /// Starts the next duel (or none: the trial is over); `last` ran the
    /// period before, so its first slice changes plan unless it runs it.
    fn next_duel(&mut self, p: &AutoParams, last: Mode) {
        while self.queue.last() == Some(&Mode::Both) && self.both_ruled_out() {
            self.queue.pop();
            self.skipped.push((
                Mode::Both,
                "neither temporal nor spatial beat unstaged: both pays for the two".into(),
            ));
        }
        self.duel = self.queue.pop().map(|c| {
            Duel::new(
                self.incumbent,
                c,
                p.sprt(),
                self.incumbent != last,
                self.noise,
            )
        });
        self.mode = self.duel.as_ref().map_or(self.incumbent, Duel::mode);
        self.period = 0;
    }

    /// The candidate of the running duel (the incumbent when none runs).
    pub fn candidate(&self) -> Mode {
        self.duel.as_ref().map_or(self.incumbent, |d| d.candidate)
    }

    /// True when `both`'s parts each lost their duel against unstaged (at
    /// least one of them ran): `both` pays the migrations of spatial and
    /// the yields of temporal, and on every workload measured (the headline
    /// shapes, the MariaDB traces) it beat unstaged only where one of its
    /// parts did.
    fn both_ruled_out(&self) -> bool {
        let parts: Vec<&DuelSummary> = self
            .duels
            .iter()
            .filter(|d| d.candidate == "temporal" || d.candidate == "spatial")
            .collect();
        !parts.is_empty() && parts.iter().all(|d| !d.won && d.incumbent == "unstaged")
    }

    /// Periods the trial ran in modes other than `kept`.
    pub fn losing_periods(&self, kept: Mode) -> u64 {
        Mode::ALL
            .iter()
            .filter(|m| **m != kept)
            .map(|m| self.ran[m.index()])
            .sum()
    }

    /// The trial's cost in periods of the kept mode (the objective it
    /// delivers per period): every period run in another mode, settling
    /// included, priced at the share by which that mode's measured periods
    /// fell short of `kept`'s (the rate lost, or at CPU per request the
    /// kept mode's efficiency lost, `1 − cpu(kept) ÷ cpu(m)`), from 0 (no
    /// worse) to 1 (nothing measured). What an operator pays for a trial:
    /// a duel of two modes within 0.3 % of each other may run 30 pairs,
    /// and costs ~0.3 % of their candidate slices, not all of them
    /// ([`Trial::losing_periods`] counts them all). The transient of a
    /// change of plan is priced at the mode's steady shortfall.
    pub fn cost_periods(&self, kept: Mode) -> f64 {
        let objective = self.objective.unwrap_or(Objective::Rate);
        let k = self.measured[kept.index()].score(objective);
        Mode::ALL
            .iter()
            .filter(|m| **m != kept)
            .map(|m| {
                let loss = match (self.measured[m.index()].score(objective), k) {
                    (Some(s), Some(k)) if s * k > 0.0 => {
                        let ratio = match objective {
                            Objective::Rate => s / k,
                            Objective::CpuPerRequest => k / s,
                        };
                        (1.0 - ratio).clamp(0.0, 1.0)
                    }
                    _ => 1.0,
                };
                self.ran[m.index()] as f64 * loss
            })
            .sum()
    }

    /// The objective: the rate when the trial's first incumbent slice ran
    /// the vCPUs saturated (utilisation ≥ [`AutoParams::saturation`]) or a
    /// figure is missing (an older guest, no CPU figures), else CPU per
    /// request. Fixed for the trial once a slice measured it.
    fn objective_of(p: &AutoParams, m: &Measured) -> Objective {
        match (m.utilisation(), m.cpu_per_request_ns()) {
            (Some(util), Some(_)) if util < p.saturation => Objective::CpuPerRequest,
            _ => Objective::Rate,
        }
    }

    /// Records the period that just ended (it ran [`Trial::mode`]); returns
    /// the trial's verdict when it ended, and otherwise, for the timeline,
    /// what ended (a duel), if anything.
    pub fn record(
        &mut self,
        p: &AutoParams,
        o: &Observation,
        bound: &LatencyBound,
    ) -> Result<Verdict, Option<String>> {
        self.ran[self.mode.index()] += 1;
        let settle = self.settle.periods(p);
        let objective = self.objective;
        let Some(d) = self.duel.as_mut() else {
            return Ok(self.verdict(p));
        };
        let skip = if d.switched { settle } else { 0 };
        let has_requests = o.requests_per_s.is_finite() && o.requests_per_s > 0.0;
        let score = has_requests
            .then(|| match objective.unwrap_or(Objective::Rate) {
                Objective::Rate => Some(o.requests_per_s),
                Objective::CpuPerRequest => o.cpu_per_request_ns().map(|c| -c),
            })
            .flatten();
        d.scores.push(score);
        if self.period >= skip && has_requests {
            d.slice.record(o);
            d.sides[d.side()].record(o);
            self.measured[self.mode.index()].record(o);
        }
        self.period += 1;
        // A slice ends with its periods measured, or (periods without
        // requests) at three times its length.
        let len = p.slice_periods.max(1);
        if (d.slice.periods() as u32) < len && self.period < skip + 3 * len {
            return Err(None);
        }
        if d.switched {
            self.settle.add(p, d.mode(), &d.scores, skip as usize);
        }
        let slice = std::mem::take(&mut d.slice);
        if self.objective.is_none() && slice.periods() > 0 {
            self.objective = Some(Self::objective_of(p, &slice));
        }
        let side = d.side();
        d.done[side] = Some(slice);
        let before = d.mode();
        if d.second {
            let objective = self.objective.unwrap_or(Objective::Rate);
            if let [Some(i), Some(c)] = &d.done {
                // The log ratio, candidate over incumbent (CPU per request:
                // incumbent over candidate), ≈ the relative difference for
                // small ones. A plain ratio of two noisy figures leans
                // towards the candidate (E[c / i] > 1 for alike modes, by
                // ~1 % at 14 % noise, a third of the margin: 27 of 200
                // noisy trials kept an identical mode). Both sides are
                // then judged at the pair's stage mix (`mix_correction`).
                let diff = |a: Option<f64>, b: Option<f64>| match (a, b) {
                    (Some(a), Some(b)) if a * b > 0.0 => {
                        Some(if b > 0.0 { (a / b).ln() } else { (b / a).ln() })
                    }
                    _ => None,
                };
                // A slice that completed no request against one that did
                // counts as a pair lost (or won) by STARVED: a mode that
                // starves the guest must lose its duel, not stall it.
                let x = match (c.periods(), i.periods()) {
                    (0, n) if n > 0 => Some(-STARVED),
                    (n, 0) if n > 0 => Some(STARVED),
                    _ => diff(c.score(objective), i.score(objective))
                        .map(|x| (x + mix_correction(i, c)).clamp(-STARVED, STARVED)),
                };
                if let Some(x) = x {
                    d.test.push(x);
                }
                if let Some(x) = diff(c.rate(), i.rate()) {
                    d.rate_diff.push(x);
                }
            }
            d.done = [None, None];
            d.pair += 1;
        }
        d.second = !d.second;
        d.scores.clear();
        d.switched = d.mode() != before;
        self.period = 0;
        self.mode = d.mode();
        if let Some(what) = self.duel_over(p, bound) {
            if self.duel.is_none() {
                return Ok(self.verdict(p));
            }
            return Err(Some(what));
        }
        Err(None)
    }

    /// Ends the duel when its test stopped or a veto came early; what it
    /// found, for the timeline.
    fn duel_over(&mut self, p: &AutoParams, bound: &LatencyBound) -> Option<String> {
        let d = self.duel.as_ref()?;
        let objective = self.objective.unwrap_or(Objective::Rate);
        let limit = d.sides[0]
            .p99_ns(p.min_latency_samples)
            .map(|u| bound.limit_ns(u));
        let p99 = d.sides[1].p99_ns(p.min_latency_samples);
        let over = limit.zip(p99).is_some_and(|(l, c)| c > l);
        let far_over = limit.zip(p99).is_some_and(|(l, c)| c > 2.0 * l);
        // Behind the arrivals: the rate more than the margin below the
        // incumbent's, and its 99.9 % upper bound below it too (one-sided,
        // a mode that keeps up is called behind by noise alone in 0.1 % of
        // duels; a normal quantile would be ten times that at 8 pairs,
        // whose spread is itself estimated).
        let behind = objective == Objective::CpuPerRequest
            && d.rate_diff.mean().is_some_and(|m| m < -p.margin)
            && d.rate_diff
                .bounds999()
                .is_some_and(|(_, upper)| upper < 0.0);
        // The cap counts the pairs run, measured or not (a pair whose two
        // slices completed no request measures nothing): a duel always ends.
        let outcome = if far_over && d.pair >= 1 {
            Some(d.test.outcome().unwrap_or(Outcome::NoBetter))
        } else if d.pair >= p.max_pairs.max(1) {
            Some(d.test.outcome().unwrap_or(Outcome::Capped))
        } else {
            d.test.outcome()
        }?;
        let veto = match outcome {
            Outcome::Better if over => Some("latency bound"),
            Outcome::Better if behind => Some("behind the arrivals"),
            _ => None,
        };
        let won = outcome == Outcome::Better && veto.is_none();
        let pairs = d.test.pairs();
        let s = DuelSummary {
            incumbent: d.incumbent.name(),
            candidate: d.candidate.name(),
            pairs,
            mean: d.test.mean().map(f64::exp_m1),
            se: d.test.mean().zip(d.test.se()).map(|(m, se)| m.exp() * se),
            llr: d.test.llr(),
            outcome: if far_over && outcome != Outcome::Better {
                "over twice the latency bound"
            } else {
                outcome.name()
            },
            confidence: d.test.confidence(),
            veto,
            won,
            rate_diff: d.rate_diff.mean().zip(d.rate_diff.se()),
            futile: outcome == Outcome::NoBetter && d.test.futile(),
        };
        let what = describe_duel(&s);
        let last = d.mode();
        if won {
            self.incumbent = d.candidate;
            self.limit_ns = p99.map(|c| bound.limit_ns(c));
        } else if self.incumbent == d.incumbent && self.limit_ns.is_none() {
            self.limit_ns = limit;
        }
        // Only a duel that ran its least pairs measured the noise: a
        // decisive or starved one stops at 3 pairs that agree (their
        // spread is the floor's), and a prior that small would call a
        // candidate 7 % behind on its first pair futile.
        if let Some(spread) = d.test.spread().filter(|_| pairs >= p.min_pairs) {
            self.noise = Some(self.noise.map_or(spread, |n| n.max(spread)));
        }
        self.duels.push(s);
        self.next_duel(p, last);
        Some(what)
    }

    /// The trial's verdict: the last incumbent.
    fn verdict(&self, p: &AutoParams) -> Verdict {
        let objective = self.objective.unwrap_or(Objective::Rate);
        let kept = self.incumbent;
        let latency = self.duels.iter().any(|d| d.veto == Some("latency bound"));
        let summary = TrialSummary {
            kept: kept.name(),
            objective: objective.name(),
            decided_by: if latency {
                "latency bound"
            } else {
                objective.name()
            },
            unstaged_utilisation: self.measured[0].utilisation(),
            p99_limit_ns: self.limit_ns,
            modes: Mode::ALL
                .iter()
                .map(|m| {
                    let x = &self.measured[m.index()];
                    let lost = self.duels.iter().any(|d| d.candidate == m.name() && !d.won);
                    ModeSummary {
                        mode: m.name(),
                        periods: x.periods(),
                        rate: x.rate(),
                        cpu_per_request_ns: x.cpu_per_request_ns(),
                        p99_ns: x.p99_ns(p.min_latency_samples),
                        utilisation: x.utilisation(),
                        dropped: lost,
                        over_latency_bound: self
                            .duels
                            .iter()
                            .any(|d| d.candidate == m.name() && d.veto == Some("latency bound")),
                    }
                })
                .collect(),
            duels: self.duels.clone(),
            skipped: self
                .skipped
                .iter()
                .map(|(m, why)| (m.name(), why.clone()))
                .collect(),
            settle_periods: self.settle.periods(p),
        };
        let what = describe(&summary);
        Verdict {
            kept,
            what,
            summary,
            objective,
        }
    }
}

/// "spatial vs unstaged: better (+8.1 % ± 1.2 %, 7 pairs, Λ 3.2,
/// confidence 100 %)".
fn describe_duel(d: &DuelSummary) -> String {
    let mut s = format!("{} vs {}: {}", d.candidate, d.incumbent, d.outcome);
    if let (Some(m), Some(se)) = (d.mean, d.se) {
        s += &format!(" ({:+.1} % ± {:.1} %", m * 100.0, se * 100.0);
        s += &format!(", {} pairs", d.pairs);
        if let Some(l) = d.llr {
            s += &format!(", Λ {l:.1}");
        }
        if let Some(c) = d.confidence {
            s += &format!(", confidence {:.1} %", c * 100.0);
        }
        s += ")";
    } else if let Some(m) = d.mean.filter(|_| d.futile) {
        s += &format!(
            " ({:+.1} %, {} pair{}: futile beside the trial's noise)",
            m * 100.0,
            d.pairs,
            if d.pairs == 1 { "" } else { "s" }
        );
    }
    if let Some(v) = d.veto {
        s += &format!(", refused: {v}");
        if let Some((m, se)) = d.rate_diff.filter(|_| v == "behind the arrivals") {
            s += &format!(" (rate {:+.1} % ± {:.1} %)", m * 100.0, se * 100.0);
        }
    }
    s
}

/// "keep spatial by rate (settling 1 period): temporal vs unstaged: no
/// better (…); spatial vs unstaged: better (…); both skipped (why)".
fn describe(s: &TrialSummary) -> String {
    let mut parts: Vec<String> = s.duels.iter().map(describe_duel).collect();
    parts.extend(
        s.skipped
            .iter()
            .map(|(m, why)| format!("{m} skipped ({why})")),
    );
    let mut line = format!(
        "keep {} by {} (settling {} period{})",
        s.kept,
        s.decided_by,
        s.settle_periods,
        if s.settle_periods == 1 { "" } else { "s" }
    );
    if let Some(u) = s.unstaged_utilisation {
        line += &format!(", unstaged utilisation {:.0} %", u * 100.0);
    }
    if !parts.is_empty() {
        line += ": ";
        line += &parts.join("; ");
    }
    line
}
