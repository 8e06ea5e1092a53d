//! O4 and O2 of `just bench-auto` in a VM: the test guest's open loop
//! alternates 90 % and 30 % of the unstaged capacity (measured first,
//! closed loop) every `phase_s` seconds under `auto`; the report's
//! `sched.auto` counts its trials, change points, switches and duels. For
//! O2 `auto` runs the null experiment (`[policy] auto_twin`): each phase
//! change starts a trial whose one duel is unstaged against itself.

use anyhow::{Context, Result};
use stagevm_bench::guest::Boot;
use stagevm_bench::target::Target;

/// The workload: the headline's short-visit shape, 2 stages.
const WORK: &str = "iters=1000 threads=3 work=2000 weights=8,1,1";

/// What the O4 run measured.
#[derive(Debug)]
pub struct LoadChange {
    /// The closed loop's rate (requests/s) that sized the load.
    pub capacity: f64,
    /// Seconds run, and the phase changes in them.
    pub seconds: f64,
    pub phase_changes: u64,
    /// `sched.auto`: trials, those started by a change point, switches of
    /// mode, periods and losing periods.
    pub trials: u64,
    pub change_points: u64,
    pub switches: u64,
    pub periods: u64,
    pub losing: u64,
    /// `sched.auto.cost_share`: the losing periods priced, ÷ periods.
    pub cost_share: f64,
    /// Duels run, and those whose test found the candidate better.
    pub duels: u64,
    pub duels_better: u64,
    /// The timeline's trial starts still in the report's tail: (s, why).
    pub starts: Vec<(f64, String)>,
}

/// Runs O4 (`twin` false) or O2 (`twin`: the null experiment): a
/// closed-loop probe, then `seconds` of the phased open loop.
///
/// # Errors
/// When a boot fails or its report lacks the figures.
pub fn load_change(target: &Target, seconds: f64, phase_s: f64, twin: bool) -> Result<LoadChange> {
    let config =
        format!("[host]\ncores = \"0-1\"\n[policy]\nname = \"auto\"\nauto_twin = {twin}\n");
    let probe_cmd = format!("{WORK} requests=20000");
    let probe = Boot {
        target,
        vcpus: 2,
        policy: "pinned",
        cmdline: &probe_cmd,
        memory: None,
        stages: None,
        extra: &[],
    }
    .run()?;
    let capacity = probe
        .report
        .stage_channel
        .as_ref()
        .map(|c| c.requests_per_s)
        .filter(|r| *r > 0.0)
        .context("the probe reported no request rate")?;
    // Threads × requests × vCPUs in all: enough for `seconds` at the mean
    // of 90 % and 30 % of the capacity.
    let high = (0.9 * capacity).round() as u64;
    let total = seconds * 0.6 * capacity;
    let requests = (total / 6.0).ceil() as u64;
    let phase_ms = (phase_s * 1000.0) as u64;
    let cmd =
        format!("{WORK} requests={requests} arrival={high} phases={phase_ms}:{phase_ms}:0:33");
    let o = if twin { "O2" } else { "O4" };
    eprintln!("bench-auto: {o}: capacity {capacity:.0} requests/s; {cmd}");
    let cfg = stagevm_testkit::temp_path("bench-auto", "toml");
    std::fs::write(&cfg, &config)?;
    let run = Boot {
        target,
        vcpus: 2,
        policy: "auto",
        cmdline: &cmd,
        memory: None,
        stages: Some(&cfg),
        extra: &[],
    }
    .run();
    let _ = std::fs::remove_file(&cfg);
    let run = run?;
    let a = run
        .report
        .sched
        .auto
        .clone()
        .context("the report has no sched.auto")?;
    let secs = a.periods as f64 * run.report.sched.period_ms as f64 / 1000.0;
    let starts = run
        .report
        .sched
        .timeline
        .iter()
        .filter_map(|t| {
            let d = t.decision.as_deref()?;
            d.contains(": trial, ")
                .then(|| (t.t_ms / 1000.0, d.to_string()))
        })
        .collect();
    Ok(LoadChange {
        capacity,
        seconds: secs,
        // Changes strictly inside the run (one at each multiple of the
        // phase before its end).
        phase_changes: ((secs - 1e-9) / phase_s).floor().max(0.0) as u64,
        trials: a.trials,
        change_points: a.change_points,
        switches: a.mode_switches,
        periods: a.periods,
        losing: a.losing_periods,
        cost_share: a.cost_share,
        duels: a.duels,
        duels_better: a.duels_better,
        starts,
    })
}
