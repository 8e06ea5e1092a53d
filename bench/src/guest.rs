//! Booting the test guest once on stagevm and reading what it reports:
//! shared by `policy-bench` and `headline-bench`.
//!
//! [`Boot::run`] starts stagevm with a JSON report, fails on a non-zero exit
//! and returns the guest's console output and the report; [`GuestRun::parse`]
//! reads one run's figures from them (the guest's own requests/s of its
//! staged phase, its migrations, and the VMM's stage-channel counters).

use std::path::Path;

use anyhow::{bail, Context, Result};
use stagevm_report::Report;
use stagevm_testkit::console::field;

use crate::target::Target;

/// The test guest's default staged workload (`just bench-policies`): not
/// instruction-cache bound.
pub const STAGED_CMDLINE: &str = "iters=1000 threads=4 requests=2000 work=200";

/// One stagevm invocation.
#[derive(Clone, Copy, Debug)]
pub struct Boot<'a> {
    /// The VMM and guest kernel.
    pub target: &'a Target,
    /// `--cpus boot=N`.
    pub vcpus: u32,
    /// `--policy`.
    pub policy: &'a str,
    /// `--cmdline`.
    pub cmdline: &'a str,
    /// `--memory size=…`, if not the VMM's default.
    pub memory: Option<&'a str>,
    /// `--stages`, if any.
    pub stages: Option<&'a Path>,
    /// Further stagevm arguments (e.g. `--no-stage-device`,
    /// `--stage-trace on`).
    pub extra: &'a [&'a str],
}

/// What one run left behind.
#[derive(Debug)]
pub struct Output {
    /// The guest's console output (stagevm's stdout).
    pub stdout: String,
    /// The VMM's JSON report.
    pub report: Report,
}

impl Output {
    /// The first console line starting with `prefix` ("" if none).
    pub fn line(&self, prefix: &str) -> &str {
        stagevm_testkit::console::line(&self.stdout, prefix).unwrap_or("")
    }
}

impl Boot<'_> {
    /// Runs stagevm once and reads its report.
    ///
    /// # Errors
    /// When stagevm cannot be started, exits unsuccessfully, or leaves no
    /// readable report.
    pub fn run(&self) -> Result<Output> {
        let report = stagevm_testkit::temp_path("bench", "json");
        let mut vm = self.target.launch().vcpus(self.vcpus);
        if let Some(m) = self.memory {
            vm = vm.memory(m);
        }
        vm = vm.args(["--policy", self.policy]);
        if let Some(s) = self.stages {
            vm = vm.arg("--stages").arg(s);
        }
        let out = vm
            .args(self.extra)
            .report(&report)
            .cmdline(self.cmdline)
            .output()
            .with_context(|| format!("running {}", self.target.stagevm.display()))?;
        let stdout = out.stdout;
        if !out.status.success() {
            let _ = std::fs::remove_file(&report);
            bail!(
                "stagevm --policy {} --cpus boot={} --cmdline \"{}\" failed ({}):\n{stdout}\n{}",
                self.policy,
                self.vcpus,
                self.cmdline,
                out.status,
                out.stderr
            );
        }
        let json = Report::read(&report).with_context(|| format!("reading {}", report.display()));
        let _ = std::fs::remove_file(&report);
        Ok(Output {
            stdout,
            report: json?,
        })
    }
}

/// Requests per thread for runs of about `seconds` at `rps` requests/s
/// over `threads` threads, at least `least` (`least` when `seconds` or
/// `rps` is not positive).
pub fn requests_for(seconds: f64, rps: f64, threads: u64, least: u64) -> u64 {
    if !(seconds > 0.0 && rps.is_finite() && rps > 0.0) || threads == 0 {
        return least;
    }
    ((seconds * rps / threads as f64).ceil() as u64).max(least)
}

/// `boot`'s command line with its `requests=` raised so that a run takes
/// about `seconds` at the rate one run of `boot` measured (threads per vCPU
/// from its `threads=`). Prints what it chose on stderr.
///
/// # Errors
/// When the command line has no `threads=` and `requests=` words, or the
/// sizing run fails.
pub fn sized_cmdline(boot: &Boot<'_>, seconds: f64) -> Result<String> {
    let word = |k: &str| -> Option<u64> {
        boot.cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k)?.parse().ok())
    };
    let (Some(threads), Some(requests)) = (word("threads="), word("requests=")) else {
        bail!(
            "cannot size the runs of '{}': it needs threads= and requests=",
            boot.cmdline
        );
    };
    let run = GuestRun::parse(&boot.run()?)?;
    let sized = requests_for(seconds, run.rps, threads * u64::from(boot.vcpus), requests);
    let out = boot
        .cmdline
        .split_whitespace()
        .map(|w| {
            if w.starts_with("requests=") {
                format!("requests={sized}")
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!(
        "sized for {seconds} s runs: {:.0} requests/s under --policy {} → {out}",
        run.rps, boot.policy
    );
    Ok(out)
}

/// One guest run's figures.
#[derive(Clone, Debug, Default)]
pub struct GuestRun {
    /// Requests/s of the guest's staged phase, whole run (from its own TSC:
    /// all requests over the time from the release of the threads to the
    /// last thread's end).
    pub rps: f64,
    /// Requests/s in the steady middle of the run: the requests completed
    /// between the 10 % and 90 % marks of all requests over the time
    /// between the marks (the guest's `steady phase` line), excluding the
    /// start-up (`auto`'s first trial, threads spreading out) and the tail
    /// where few threads remain; NaN when the guest did not say.
    pub steady_rps: f64,
    /// Threads an idle vCPU took from another vCPU's queue (work-conserving
    /// steals of the thread's own stage, and balancing under an unstaged
    /// map); 0 when the guest did not say.
    pub steals: u64,
    /// Threads an idle vCPU ran although the map does not give their stage
    /// to it (spills, under the guest's `spill_us=` rule); 0 when the guest
    /// did not say.
    pub spills: u64,
    /// Guest thread migrations between vCPUs.
    pub migrations: u64,
    /// Stage events the VMM received (all stages).
    pub stage_events: u64,
    /// Idle time: % of the vCPUs' time during the staged phase with an
    /// empty run queue, as the guest measured it (its `idle … %` figure);
    /// NaN when it did not say.
    pub idle_pct: f64,
    /// WAITs the VMM received.
    pub waits: u64,
    /// WAKEs (guest-sent and host-side).
    pub wakes: u64,
    /// Stage→vCPU map changes the policy made.
    pub map_changes: u64,
    /// Guest thread migration and local switch latency (ns), if reported.
    pub migration_ns: Option<(f64, f64)>,
}

impl GuestRun {
    /// Reads one run's figures from the guest's output and the report.
    ///
    /// # Errors
    /// When the guest printed no staged-phase line.
    pub fn parse(out: &Output) -> Result<Self> {
        let rps = field(out.line("testguest: staged phase"), "ms, ").with_context(|| {
            format!("no staged-phase line in the guest output:\n{}", out.stdout)
        })?;
        let latency = out.line("testguest: migration latency");
        let migration_ns = field(latency, "latency ").zip(field(latency, "local switch "));
        // Without a stage device every channel counter is 0.
        let ch = out.report.stage_channel.clone().unwrap_or_default();
        let steady = out.line("testguest: steady phase");
        let balance = out.line("testguest: work-conserving");
        Ok(Self {
            rps,
            steady_rps: field(steady, "ms, ").unwrap_or(f64::NAN),
            steals: field(balance, "steals ").unwrap_or(0),
            spills: field(balance, "spills ").unwrap_or(0),
            migrations: field(out.line("testguest: migrations "), "migrations ").unwrap_or(0),
            stage_events: ch.stages.iter().map(|s| s.events).sum(),
            idle_pct: field(out.line("testguest: idle waits"), ", idle ").unwrap_or(f64::NAN),
            waits: ch.waits,
            wakes: ch.wakes + ch.host_wakes,
            map_changes: out.report.sched.map_changes,
            migration_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_are_sized_from_the_rate() {
        use super::requests_for;
        // 5 s at 80,000 requests/s over 32 threads: 12,500 each.
        assert_eq!(requests_for(5.0, 80_000.0, 32, 1500), 12_500);
        assert_eq!(requests_for(5.0, 1000.0, 32, 1500), 1500);
        assert_eq!(requests_for(0.0, 80_000.0, 32, 1500), 1500);
        assert_eq!(requests_for(5.0, f64::NAN, 32, 1500), 1500);
    }
}
