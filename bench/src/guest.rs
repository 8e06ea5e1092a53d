//! Booting the test guest once on stagevm and reading what it reports:
//! shared by `policy-bench` and `headline-bench`.
//!
//! [`Boot::run`] starts stagevm with a JSON report, fails on a non-zero exit
//! and returns the guest's console output and the report; [`GuestRun::parse`]
//! reads one run's figures from them (the guest's own requests/s of its
//! staged phase, its migrations, and the VMM's stage-channel counters).

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};
use stagevm_report::Report;

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
        self.stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or("")
    }
}

impl Boot<'_> {
    /// Runs stagevm once and reads its report.
    ///
    /// # Errors
    /// When stagevm cannot be started, exits unsuccessfully, or leaves no
    /// readable report.
    pub fn run(&self) -> Result<Output> {
        static RUN: AtomicU64 = AtomicU64::new(0);
        let report = std::env::temp_dir().join(format!(
            "stagevm-bench-{}-{}.json",
            std::process::id(),
            RUN.fetch_add(1, Ordering::Relaxed)
        ));
        let mut cmd = Command::new(&self.target.stagevm);
        cmd.arg("--kernel")
            .arg(&self.target.kernel)
            .args(["--cpus", &format!("boot={}", self.vcpus)]);
        if let Some(m) = self.memory {
            cmd.args(["--memory", &format!("size={m}")]);
        }
        cmd.args(["--policy", self.policy]);
        if let Some(s) = self.stages {
            cmd.arg("--stages").arg(s);
        }
        cmd.args(self.extra)
            .arg("--report")
            .arg(&report)
            .args(["--cmdline", self.cmdline]);
        let out = cmd
            .output()
            .with_context(|| format!("running {}", self.target.stagevm.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            let _ = std::fs::remove_file(&report);
            bail!(
                "stagevm --policy {} --cpus boot={} --cmdline \"{}\" failed ({}):\n{stdout}\n{}",
                self.policy,
                self.vcpus,
                self.cmdline,
                out.status,
                String::from_utf8_lossy(&out.stderr)
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

/// The value after `key` on `line`, up to a space or comma.
pub fn field<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split([' ', ',']).find(|w| !w.is_empty())?.parse().ok()
}

/// One guest run's figures.
#[derive(Clone, Debug, Default)]
pub struct GuestRun {
    /// Requests/s of the guest's staged phase (from its own TSC).
    pub rps: f64,
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
        Ok(Self {
            rps,
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
    use super::field;

    #[test]
    fn field_reads_the_value_after_its_key() {
        let l = "testguest: staged phase 8000 requests in 12 ms, 666666 requests/s";
        assert_eq!(field::<f64>(l, "ms, "), Some(666_666.0));
        assert_eq!(
            field::<u64>("testguest: migrations 7, fallbacks 0", "migrations "),
            Some(7)
        );
        assert_eq!(field::<u64>(l, "absent "), None);
        let idle = "testguest: idle waits 3, wakes sent 2, idle 12.5 % of the vCPUs' time";
        assert_eq!(field::<f64>(idle, ", idle "), Some(12.5));
    }
}
