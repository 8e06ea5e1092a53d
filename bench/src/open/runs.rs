//! One guest run of `open-bench` and what it measured: a closed-loop run's
//! steady throughput, or an open-loop run's achieved rate, CPU per request
//! (the VMM's, steady), latency from arrival (the guest's, steady) and
//! drops; for `auto`, what its trials decided.

use anyhow::{Context, Result};
use stagevm_bench::guest::{Boot, Output};
use stagevm_report::Report;
use stagevm_testkit::console::field;

/// The figures of one run (NaN where a figure does not apply).
#[derive(Clone, Debug)]
pub struct Run {
    /// Closed loop: steady requests/s (10–90 % of the requests); open
    /// loop: the rate achieved.
    pub rps: f64,
    /// Work CPU per request (µs) over the middle 80 % of the run's policy
    /// periods, from the VMM's timeline.
    pub cpu_us: f64,
    /// The same over the whole run (the report's `sched.cpu`).
    pub cpu_whole_us: f64,
    /// Median and 99th percentile latency (µs): open loop from arrival of
    /// the steady requests (the guest's own, every request); closed loop
    /// the VMM's timed requests over the run.
    pub p50_us: f64,
    /// See `p50_us`.
    pub p99_us: f64,
    /// Open loop: requests dropped at a full queue.
    pub dropped: u64,
    /// `auto`: the mode its last trial kept and what decided it (empty for
    /// other cells).
    pub auto_kept: String,
    /// See `auto_kept`.
    pub decided_by: String,
    /// `auto`: the share of the middle 80 % of the periods spent in each
    /// mode other than unstaged (temporal, spatial, both).
    pub staged_share: f64,
    /// `auto`: trials a change point started.
    pub change_points: u64,
}

/// Work CPU per request (µs) over the middle 80 % (by time) of the policy
/// periods that completed requests: Σ CPU ÷ Σ requests, each period's CPU
/// being its CPU per request × its requests (∝ its rate; periods are of
/// equal length).
fn steady_cpu_us(r: &Report) -> f64 {
    let periods: Vec<_> = r
        .sched
        .timeline
        .iter()
        .filter(|e| e.requests_per_s > 0.0)
        .collect();
    let (Some(first), Some(last)) = (periods.first(), periods.last()) else {
        return f64::NAN;
    };
    let (t0, t1) = (first.t_ms, last.t_ms);
    let (lo, hi) = (t0 + 0.1 * (t1 - t0), t0 + 0.9 * (t1 - t0));
    let (mut cpu, mut req) = (0.0, 0.0);
    for e in periods.iter().filter(|e| e.t_ms >= lo && e.t_ms <= hi) {
        if let Some(c) = e.cpu_per_request_us {
            cpu += c * e.requests_per_s;
            req += e.requests_per_s;
        }
    }
    if req > 0.0 {
        cpu / req
    } else {
        f64::NAN
    }
}

/// The share of the middle 80 % of the run's periods `auto` ran a mode
/// other than unstaged.
fn staged_share(r: &Report) -> f64 {
    let t = &r.sched.timeline;
    let n = t.len();
    let mid = &t[n / 10..n - n / 10];
    let mut mode = "unstaged".to_string();
    let mut staged = 0usize;
    // A period's `mode` is set only when it changes.
    for e in &t[..n / 10] {
        if let Some(m) = &e.mode {
            mode = m.clone();
        }
    }
    for e in mid {
        if let Some(m) = &e.mode {
            mode = m.clone();
        }
        staged += usize::from(mode != "unstaged");
    }
    staged as f64 / mid.len().max(1) as f64
}

impl Run {
    /// Reads a run's figures; `open` when it ran under open-loop load.
    ///
    /// # Errors
    /// When the guest did not print the lines the run needs.
    pub fn parse(out: &Output, open: bool) -> Result<Self> {
        let r = &out.report;
        let (rps, p50_us, p99_us, dropped) = if open {
            let line = out.line("testguest: open loop:");
            let achieved = field(line, "; achieved ").with_context(|| {
                format!("no open-loop line in the guest output:\n{}", out.stdout)
            })?;
            (
                achieved,
                field(line, "arrival p50 ").unwrap_or(f64::NAN),
                field(line, " p99 ").unwrap_or(f64::NAN),
                field(line, "dropped ").unwrap_or(0),
            )
        } else {
            let steady = field(out.line("testguest: steady phase"), "ms, ").with_context(|| {
                format!("no steady-phase line in the guest output:\n{}", out.stdout)
            })?;
            let lat = r.stage_channel.as_ref().and_then(|c| c.latency.as_ref());
            (
                steady,
                lat.map_or(f64::NAN, |l| l.p50_us),
                lat.map_or(f64::NAN, |l| l.p99_us),
                0,
            )
        };
        let trial = r.sched.auto.as_ref().and_then(|a| a.last_trial.as_ref());
        Ok(Self {
            rps,
            cpu_us: steady_cpu_us(r),
            cpu_whole_us: r
                .sched
                .cpu
                .as_ref()
                .map_or(f64::NAN, |c| c.cpu_per_request_us),
            p50_us,
            p99_us,
            dropped,
            auto_kept: trial.map(|t| t.kept.clone()).unwrap_or_default(),
            decided_by: trial.map(|t| t.decided_by.clone()).unwrap_or_default(),
            staged_share: if r.sched.auto.is_some() {
                staged_share(r)
            } else {
                f64::NAN
            },
            change_points: r.sched.auto.as_ref().map_or(0, |a| a.change_points),
        })
    }
}

/// Boots `boot` and reads its figures.
///
/// # Errors
/// When the run fails or misses a figure.
pub fn run(boot: &Boot, open: bool) -> Result<Run> {
    Run::parse(&boot.run()?, open)
}
