//! `auto`: stage scheduling that pays or steps aside.
//!
//! The policy runs short, interleaved **trial epochs** of a staged plan
//! (the `static` policy's) and the unstaged `pinned` plan, measures the
//! guest's completed-request rate in each (the VMM counts `stage_exit`
//! events per policy period), and keeps the faster mode: staged only when it
//! beats unstaged by a margin, so noise never flips it towards the mode that
//! can lose (do no harm). It trials again after a hold time and when the
//! stage mix (each stage's share of the load) moves.
//!
//! Why trials and not a model: on these machines the cost of a migration
//! (exits, idle, hand-off) and the gain in i-cache misses both depend on the
//! workload and the host, and neither can be read from counters here (no
//! cache counters); measuring the request rate under both plans is the one
//! signal that decides what the user wants. The seeds' result that staging
//! wins only when code overflows the caches (seed 000 §5, seed 004) is why
//! the unstaged plan is the default whenever the difference is in the noise.

use super::{build, Context, Plan, Policy, PolicyKind};

/// Parameters of `auto` (policy periods are the unit of time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoParams {
    /// Periods per trial epoch, the first of which is not measured (the
    /// threads move to the new plan then).
    pub epoch_periods: u32,
    /// Epochs of each mode in a full trial (interleaved: unstaged, staged,
    /// unstaged, …).
    pub rounds: u32,
    /// Fraction by which staged must beat unstaged to be kept (0.03 = 3 %).
    pub margin: f64,
    /// A difference this large after any round decides at once (cuts the
    /// time spent in a clearly worse mode).
    pub decisive: f64,
    /// Periods a decision holds before the next trial.
    pub hold_periods: u32,
    /// L1 distance between the stage-load shares measured early in a hold
    /// and their moving average now that counts as a new stage mix and
    /// starts a trial (0..=2).
    pub mix_change: f64,
    /// Periods of a hold whose load shares, averaged, are the reference mix
    /// (the threads settle into the chosen plan first).
    pub mix_settle: u32,
    /// Weight of the newest period in the moving average of the shares.
    pub mix_smoothing: f64,
    /// Consecutive periods the averaged shares must stay `mix_change` away
    /// from the reference before a new trial starts (a burst is not a new
    /// mix).
    pub mix_persist: u32,
    /// Periods run unstaged before the first trial: a guest that does not
    /// run that long never pays for a trial (do no harm on short runs).
    pub first_trial_after: u32,
    /// Weight of the newest period in the moving average of the rate while
    /// staged is held. Once the hold settled (`mix_settle` periods), staged
    /// falling below the unstaged rate its trial measured (by the margin)
    /// ends the hold unstaged: a trial's few periods can catch a staged
    /// transient (every core busy, caches warm, before threads queue at the
    /// busiest stage's cores) that the sustained rate does not keep.
    pub fall_back_smoothing: f64,
}

impl Default for AutoParams {
    fn default() -> Self {
        Self {
            epoch_periods: 3,
            rounds: 3,
            margin: 0.03,
            decisive: 0.15,
            hold_periods: 1500,
            mix_change: 0.3,
            mix_settle: 10,
            mix_smoothing: 0.05,
            mix_persist: 10,
            first_trial_after: 10,
            fall_back_smoothing: 0.25,
        }
    }
}

/// Which plan `auto` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The staged plan (`static`).
    Staged,
    /// The unstaged plan (`pinned`).
    Unstaged,
}

impl Mode {
    /// `staged` or `unstaged`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Staged => "staged",
            Mode::Unstaged => "unstaged",
        }
    }
}

/// What `auto` decided in a period, for the timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoDecision {
    /// The mode it runs next.
    pub mode: Mode,
    /// One line: a trial step or the decision with the rates it compared.
    pub what: String,
}

#[derive(Debug)]
enum State {
    /// Measuring: the mode of the current epoch, the period within it, and
    /// the measured rates of each mode (requests/s per measured period).
    Trial {
        mode: Mode,
        period: u32,
        staged: Vec<f64>,
        unstaged: Vec<f64>,
    },
    /// Running `mode` for `left` more periods; `average` is the moving
    /// average of the stage-load shares, `reference` their average over the
    /// hold's first periods.
    Hold {
        mode: Mode,
        left: u32,
        average: Vec<f64>,
        reference: Option<Vec<f64>>,
        /// Staged holds: the unstaged rate the trial measured and the
        /// moving average of the rate since.
        guard: Option<(f64, Option<f64>)>,
        /// Consecutive periods the shares have been away from `reference`.
        away: u32,
    },
}

/// What `auto` has spent on trials so far (policy periods), for the report:
/// a server runs for hours, so what matters is the share of its time spent
/// in the mode that lost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AutoStats {
    /// Policy periods `auto` planned.
    pub periods: u64,
    /// Trials started (the first, hold-overs and stage-mix changes).
    pub trials: u64,
    /// Periods spent in trials (both modes).
    pub trial_periods: u64,
    /// Periods a finished trial spent in the mode it did not keep (its
    /// losing epochs, each with its unmeasured first period).
    pub losing_periods: u64,
    /// Holds whose mode differs from the previous hold's: switches of mode
    /// outside trials.
    pub mode_switches: u64,
}

/// The `auto` policy (see the module docs).
pub struct Auto {
    staged: Box<dyn Policy>,
    unstaged: Box<dyn Policy>,
    params: AutoParams,
    state: State,
    /// Requests/s of the period that just ended (set by `observe_rate`).
    rate: Option<f64>,
    decision: Option<AutoDecision>,
    stats: AutoStats,
    /// Periods of the running trial in each mode: (staged, unstaged).
    trial_modes: (u64, u64),
    /// The mode of the last hold (`None` before the first decision).
    last_hold: Option<Mode>,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn shares(load: &[f64]) -> Vec<f64> {
    let total: f64 = load.iter().filter(|l| l.is_finite()).sum();
    load.iter()
        .map(|l| {
            if total > 0.0 && l.is_finite() {
                l / total
            } else {
                0.0
            }
        })
        .collect()
}

impl Auto {
    /// `auto` over `ctx` with `params`.
    pub fn new(ctx: Context, params: AutoParams) -> Self {
        Self {
            staged: build(PolicyKind::Static, ctx.clone()),
            unstaged: build(PolicyKind::Pinned, ctx),
            params,
            state: State::Hold {
                mode: Mode::Unstaged,
                left: params.first_trial_after,
                average: Vec::new(),
                reference: None,
                guard: None,
                away: 0,
            },
            rate: None,
            decision: None,
            stats: AutoStats::default(),
            trial_modes: (0, 0),
            last_hold: None,
        }
    }

    /// What trials have cost so far.
    pub fn stats(&self) -> AutoStats {
        self.stats
    }

    fn start_trial(&mut self) -> Mode {
        self.stats.trials += 1;
        self.trial_modes = (0, 0);
        self.state = State::Trial {
            mode: Mode::Unstaged,
            period: 0,
            staged: Vec::new(),
            unstaged: Vec::new(),
        };
        Mode::Unstaged
    }

    /// The decision of a trial from the rates measured so far, if there is
    /// one: staged only when it beats unstaged by the margin.
    fn verdict(&self, staged: &[f64], unstaged: &[f64], done: bool) -> Option<(Mode, String)> {
        if staged.is_empty() || unstaged.is_empty() {
            return None;
        }
        let (s, u) = (mean(staged), mean(unstaged));
        let gain = if u > 0.0 { s / u - 1.0 } else { 0.0 };
        let full = (self.params.epoch_periods - 1).max(1) as usize;
        let enough = staged.len() >= full && unstaged.len() >= full;
        // Twice the decisive difference decides on one sample each: a mode
        // that bad is not worth the rest of its epoch.
        let glaring = gain.abs() >= 2.0 * self.params.decisive;
        if !done && !glaring && (!enough || gain.abs() < self.params.decisive) {
            return None;
        }
        let mode = if gain > self.params.margin {
            Mode::Staged
        } else {
            Mode::Unstaged
        };
        Some((
            mode,
            format!(
                "keep {}: staged {s:.0} vs unstaged {u:.0} requests/s ({:+.1} %, margin {:.0} %, {} + {} periods)",
                mode.name(),
                gain * 100.0,
                self.params.margin * 100.0,
                staged.len(),
                unstaged.len()
            ),
        ))
    }

    /// Ends the trial: holds `mode` (see [`AutoParams::hold_periods`]);
    /// `unstaged_rate` is the unstaged rate the trial measured (a staged
    /// hold falls back when it drops below it).
    fn hold(
        &mut self,
        mode: Mode,
        what: String,
        load: &[f64],
        unstaged_rate: f64,
    ) -> (Mode, String) {
        if matches!(self.state, State::Trial { .. }) {
            let (staged, unstaged) = std::mem::take(&mut self.trial_modes);
            self.stats.losing_periods += match mode {
                Mode::Staged => unstaged,
                Mode::Unstaged => staged,
            };
        }
        if self.last_hold.is_some_and(|m| m != mode) {
            self.stats.mode_switches += 1;
        }
        self.last_hold = Some(mode);
        self.state = State::Hold {
            mode,
            left: self.params.hold_periods,
            average: shares(load),
            reference: None,
            guard: (mode == Mode::Staged).then_some((unstaged_rate, None)),
            away: 0,
        };
        (mode, what)
    }

    /// Advances the trial by the period that just ended; returns the next
    /// mode and what happened.
    fn step_trial(&mut self, load: &[f64]) -> (Mode, String) {
        let p = self.params;
        let rate = self.rate.take();
        let State::Trial {
            mode,
            period,
            staged,
            unstaged,
        } = &mut self.state
        else {
            unreachable!("step_trial runs in a trial");
        };
        // The period that just ended ran `mode`.
        self.stats.trial_periods += 1;
        match mode {
            Mode::Staged => self.trial_modes.0 += 1,
            Mode::Unstaged => self.trial_modes.1 += 1,
        }
        // The first period of an epoch is the move to the new plan; a period
        // without a completed request says nothing about either mode.
        if *period > 0 {
            if let Some(r) = rate.filter(|r| r.is_finite() && *r > 0.0) {
                match mode {
                    Mode::Staged => staged.push(r),
                    Mode::Unstaged => unstaged.push(r),
                }
            }
        }
        *period += 1;
        if *period < p.epoch_periods {
            let (s, u) = (staged.clone(), unstaged.clone());
            let (current, next_period) = (*mode, *period + 1);
            if current == Mode::Staged {
                if let Some((next, what)) = self.verdict(&s, &u, false) {
                    return self.hold(next, what, load, mean(&u));
                }
            }
            let what = format!("trial {} {next_period}/{}", current.name(), p.epoch_periods);
            return (current, what);
        }
        // Epoch over: after a staged epoch a round is complete.
        let rounds_done = (staged.len().min(unstaged.len()) as u32) / (p.epoch_periods - 1).max(1);
        let (s, u) = (staged.clone(), unstaged.clone());
        let finished_mode = *mode;
        if finished_mode == Mode::Staged {
            let done = rounds_done >= p.rounds;
            if let Some((next, what)) = self.verdict(&s, &u, done) {
                return self.hold(next, what, load, mean(&u));
            }
        }
        let next = match finished_mode {
            Mode::Staged => Mode::Unstaged,
            Mode::Unstaged => Mode::Staged,
        };
        if let State::Trial { mode, period, .. } = &mut self.state {
            *mode = next;
            *period = 0;
        }
        (next, format!("trial {} 1/{}", next.name(), p.epoch_periods))
    }

    fn step(&mut self, load: &[f64]) -> (Mode, String) {
        let p = self.params;
        let rate = self.rate.take();
        self.stats.periods += 1;
        if let State::Hold {
            mode,
            left,
            average,
            reference,
            guard,
            away,
        } = &mut self.state
        {
            let settled = p.hold_periods.saturating_sub(*left) >= p.mix_settle;
            if let (Some((unstaged, avg)), Some(r)) =
                (guard.as_mut(), rate.filter(|r| r.is_finite() && *r > 0.0))
            {
                let a = avg.map_or(r, |a| a + p.fall_back_smoothing * (r - a));
                *avg = Some(a);
                if settled && a < *unstaged * (1.0 - p.margin) {
                    let what = format!(
                        "keep unstaged: staged fell to {a:.0} requests/s in its hold, below the {:.0} unstaged ran at in the trial",
                        *unstaged
                    );
                    return self.hold(Mode::Unstaged, what, load, 0.0);
                }
            }
            if load.iter().any(|l| *l > 0.0) {
                for (a, s) in average.iter_mut().zip(shares(load)) {
                    *a += p.mix_smoothing * (s - *a);
                }
            }
            if reference.is_none() && settled {
                *reference = Some(average.clone());
            }
            let moved: f64 = reference.as_ref().map_or(0.0, |r| {
                r.iter()
                    .zip(average.iter())
                    .map(|(a, b)| (a - b).abs())
                    .sum()
            });
            *away = if moved > p.mix_change { *away + 1 } else { 0 };
            if *left == 0 || *away >= p.mix_persist.max(1) {
                let why = if *left == 0 {
                    "hold over"
                } else {
                    "stage mix changed"
                };
                let mode = self.start_trial();
                return (mode, format!("{why}: trial {}", mode.name()));
            }
            *left -= 1;
            return (*mode, String::new());
        }
        self.rate = rate;
        self.step_trial(load)
    }
}

impl Policy for Auto {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Auto
    }

    fn plan(&mut self, load: &[f64]) -> Plan {
        // Both plans follow the load, so either is ready when chosen.
        let staged = self.staged.plan(load);
        let unstaged = self.unstaged.plan(load);
        let (mode, what) = self.step(load);
        self.decision = (!what.is_empty()).then_some(AutoDecision { mode, what });
        match mode {
            Mode::Staged => staged,
            Mode::Unstaged => unstaged,
        }
    }

    fn observe_rate(&mut self, requests_per_s: f64) {
        self.rate = Some(requests_per_s);
    }

    fn decision(&self) -> Option<AutoDecision> {
        self.decision.clone()
    }

    fn auto_stats(&self) -> Option<AutoStats> {
        Some(self.stats)
    }
}
