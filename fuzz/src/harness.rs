//! Case counts, per-case timing and the result line of each target.
//!
//! A target run is a [`Run`]: [`Run::case`] times one case (the slowest
//! case is how a hang shows), and dropping the run prints one result line,
//! `fuzz-result <target> <cases> <mode> <seconds> <crashes> <slowest µs>`,
//! to stderr and appends it to the file named by `STAGEVM_FUZZ_REPORT` if
//! set. A run dropped while its test panics (an assertion or a crash in a
//! target) reports one crash; bolero prints the failing input and its
//! `BOLERO_RANDOM_SEED` to reproduce it.

use std::io::Write;
use std::time::{Duration, Instant};

/// `debug` or `release`: how the targets were compiled (`debug` builds
/// check integer overflow, release builds wrap).
pub fn mode() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// How many cases to run for `target`: `STAGEVM_FUZZ_CASES_<TARGET>`
/// (upper case), else `STAGEVM_FUZZ_CASES`, else `default`.
pub fn cases(target: &str, default: usize) -> usize {
    let specific = format!("STAGEVM_FUZZ_CASES_{}", target.to_uppercase());
    [specific.as_str(), "STAGEVM_FUZZ_CASES"]
        .iter()
        .find_map(|var| std::env::var(var).ok()?.parse().ok())
        .unwrap_or(default)
}

/// One target's run: counts and times its cases.
pub struct Run {
    target: &'static str,
    start: Instant,
    cases: u64,
    slowest: Duration,
}

impl Run {
    /// Starts timing `target`.
    pub fn new(target: &'static str) -> Self {
        Self {
            target,
            start: Instant::now(),
            cases: 0,
            slowest: Duration::ZERO,
        }
    }

    /// Runs one case of `f` on `data`, timing it.
    pub fn case(&mut self, data: &[u8], f: fn(&[u8])) {
        let t = Instant::now();
        f(data);
        self.slowest = self.slowest.max(t.elapsed());
        self.cases += 1;
    }

    /// The result line (see the module documentation).
    pub fn line(&self, crashes: u32) -> String {
        format!(
            "fuzz-result {} {} {} {:.1} {} {}",
            self.target,
            self.cases,
            mode(),
            self.start.elapsed().as_secs_f64(),
            crashes,
            self.slowest.as_micros()
        )
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let line = self.line(u32::from(std::thread::panicking()));
        eprintln!("{line}");
        if let Ok(path) = std::env::var("STAGEVM_FUZZ_REPORT") {
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = writeln!(f, "{line}");
            }
        }
    }
}
