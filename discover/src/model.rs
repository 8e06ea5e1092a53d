//! The model's side: this host's cores and L2, the migration mechanism,
//! and the `stagesim` runs — seed 004's request-level discovery
//! (`stagesim discover --binary`) and a replay of the chosen map against
//! the unstaged models (`stagesim replay --stage-map`), the same commands
//! `just bench-sim`'s verdict runs (stagesim/bench-sim.sh).

use std::path::{Path, PathBuf};
use std::process::Command;

use stagesim::sim::SimResult;

/// Cross-core transfer of a data line last written on another core, cycles
/// (60 ns at 2.5 GHz; the verdict's `--transfer-cycles 150`,
/// stagesim/bench-sim.sh, issue 25).
pub const TRANSFER_CYCLES: u64 = 150;

/// A candidate stage point is a function called (at most once) in at least
/// this share of requests, % (seed 004 §3.1: 80; passed to `stagesim
/// discover --min-present-pct` and said in the report).
pub const MIN_PRESENT_PCT: f64 = 80.0;

/// The OS time slice modelled, instructions (the verdict's `--slice 100000`:
/// ~40 µs at 2.5 GHz and 1 IPC, stagesim/bench-sim.sh).
pub const SLICE: u64 = 100_000;

/// Least modelled throughput gain, against the better unstaged model, at
/// which the report says staging pays (the model is deterministic; 2 %
/// is about the spread of its replays between slice-jitter seeds,
/// bench/RESULTS.md "Verdict").
pub const PAYS_AT: f64 = 1.02;

/// How a thread reaches its next stage in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mechanism {
    /// Temporal staging by the preload library's gate (issue 48): threads
    /// stay on their cores, each core serves its threads' visits by stage
    /// (SRPT), and a stage switch costs the gate's handoff, measured on
    /// this host (`stagevm_preload::costs`) unless `--switch-ns` gives it.
    Temporal,
    /// Spatial staging in a Linux guest with the agent: a
    /// `sched_setaffinity`-class migration, 25 000 cycles (10 µs) of the
    /// source's CPU (seeds 000 and 004: 9–14 µs;
    /// stagesim/src/results/verdict.rs).
    Linux,
    /// Spatial staging in the test unikernel, its measured migration: 500 +
    /// 500 cycles CPU (source + target) and 1 700 cycles (677 ns) latency
    /// (`just bench-migration`; verdict.rs).
    Unikernel,
}

/// The mechanism the model charges, with its cost.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// [`Mechanism::Temporal`]: the CPU a stage switch costs its core,
    /// cycles (stagesim's `--switch-cycles`); 0 otherwise.
    pub switch_cycles: u64,
    /// Where the switch cost comes from (said in the report).
    pub source: String,
}

impl Route {
    /// Spatial staging by `mechanism`'s migration (not [`Mechanism::Temporal`]).
    pub fn spatial(mechanism: Mechanism) -> Self {
        Self {
            mechanism,
            switch_cycles: 0,
            source: String::new(),
        }
    }

    /// Temporal staging at a switch cost of `switch_ns` ns on a `mhz` MHz
    /// clock, found as `source` says.
    pub fn temporal(switch_ns: f64, mhz: f64, source: String) -> Self {
        Self {
            mechanism: Mechanism::Temporal,
            switch_cycles: (switch_ns * mhz / 1000.0).round().max(0.0) as u64,
            source,
        }
    }

    /// The `stagesim` arguments of the cost, for both `discover` and `replay`.
    pub fn cost_args(&self) -> Vec<String> {
        let (cpu, target, latency) = match self.mechanism {
            Mechanism::Temporal => {
                return vec!["--switch-cycles".into(), self.switch_cycles.to_string()]
            }
            Mechanism::Linux => (25_000, 0, 0),
            Mechanism::Unikernel => (500, 500, 1_700),
        };
        [
            "--migration-cycles",
            &cpu.to_string(),
            "--migration-target-cycles",
            &target.to_string(),
            "--migration-latency",
            &latency.to_string(),
        ]
        .map(String::from)
        .to_vec()
    }

    /// `stagesim discover`'s policy: temporal candidates are scored by the
    /// temporal replay (`pinned` with the SRPT visit order, issue 40),
    /// spatial ones by `static` (its default).
    pub fn discover_args(&self) -> Vec<String> {
        match self.mechanism {
            Mechanism::Temporal => ["--policy", "pinned", "--visit", "srpt"]
                .map(String::from)
                .to_vec(),
            _ => Vec::new(),
        }
    }

    /// `stagesim replay`'s models: the OS-like baseline, `pinned`, and the
    /// staged one ([`Prediction::read`] finds them).
    pub fn replay_args(&self) -> Vec<String> {
        match self.mechanism {
            // Idle cores steal, as the gate is work-conserving
            // (bench/native/native_model.py runs the same).
            Mechanism::Temporal => [
                "--policy",
                "baseline,pinned",
                "--visit",
                "fifo,srpt",
                "--steal",
                "on",
            ]
            .map(String::from)
            .to_vec(),
            _ => ["--policy", "baseline,pinned,static"]
                .map(String::from)
                .to_vec(),
        }
    }

    /// How the report names it.
    pub fn describe(&self) -> String {
        match self.mechanism {
            Mechanism::Temporal => format!(
                "temporal staging by the preload library's gate (SRPT), a switch {} cycles ({})",
                self.switch_cycles, self.source
            ),
            Mechanism::Linux => "spatial staging in a Linux guest, a migration 10 µs".to_string(),
            Mechanism::Unikernel => "spatial staging in the test unikernel, a migration \
                                     0.4 µs CPU + 0.7 µs latency"
                .to_string(),
        }
    }

    /// The mechanism in a few words, for the verdict.
    pub fn short(&self) -> &'static str {
        match self.mechanism {
            Mechanism::Temporal => "temporal staging (the preload library's gate)",
            Mechanism::Linux => "spatial staging (a Linux guest's migrations)",
            Mechanism::Unikernel => "spatial staging (the test unikernel's migrations)",
        }
    }
}

/// This host's CPU clock, MHz: the median of /proc/cpuinfo's `cpu MHz`
/// lines, if it has any.
pub fn host_mhz() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mut v: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("cpu MHz"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse().ok())
        .filter(|m: &f64| m.is_finite() && *m > 0.0)
        .collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// A per-core L2 cache: size and associativity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L2 {
    /// Size, KiB.
    pub kib: u64,
    /// Ways.
    pub ways: u32,
}

impl L2 {
    /// cpu0's unified level-2 cache from sysfs
    /// (`/sys/devices/system/cpu/cpu0/cache/index*/`), if the kernel says.
    pub fn of_host() -> Option<Self> {
        let base = Path::new("/sys/devices/system/cpu/cpu0/cache");
        for e in std::fs::read_dir(base).ok()?.flatten() {
            let read = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
            if read("level").trim() == "2" && read("type").trim() != "Instruction" {
                let kib = parse_size(read("size").trim()).ok()? / 1024;
                let ways = read("ways_of_associativity").trim().parse().unwrap_or(8);
                return Some(Self { kib, ways });
            }
        }
        None
    }

    /// `KIB:WAYS`, as stagesim's `--l2` takes it.
    pub fn arg(self) -> String {
        format!("{}:{}", self.kib, self.ways)
    }
}

/// Bytes of a size written `524288`, `512K`, `512KiB`, `2M`, `2MiB` (powers of 1024).
///
/// Errors: a message naming the value.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("'{s}': expected a size such as 512K or 2M"))?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "KiB" | "k" => 1 << 10,
        "M" | "MB" | "MiB" => 1 << 20,
        other => return Err(format!("'{s}': unknown unit '{other}' (K or M)")),
    };
    n.checked_mul(mult)
        .filter(|b| *b > 0)
        .ok_or_else(|| format!("'{s}': out of range"))
}

/// A `stagesim` run that failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// It could not be started.
    #[error("{}: {source}", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// It exited with an error.
    #[error("stagesim {what} failed ({status}): {output}")]
    Failed {
        /// Which run.
        what: &'static str,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The tail of its output.
        output: String,
    },
    /// Its JSON could not be read.
    #[error("{}: {why}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
}

/// Runs `stagesim ARGS`, its output into `log`; `progress` gets the log's
/// newest line when it changed (checked every 15 s) or once a minute (a
/// long discovery shows where it is).
pub fn stagesim(
    program: &Path,
    what: &'static str,
    args: &[String],
    log: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(), ModelError> {
    let spawn = |source| ModelError::Spawn {
        program: program.to_path_buf(),
        source,
    };
    let f = std::fs::File::create(log).map_err(spawn)?;
    let e = f.try_clone().map_err(spawn)?;
    let mut child = Command::new(program)
        .args(args)
        .stdout(f)
        .stderr(e)
        .spawn()
        .map_err(spawn)?;
    let t0 = std::time::Instant::now();
    let (mut said, mut said_at) = (String::new(), t0);
    let status = loop {
        if let Some(s) = child.try_wait().map_err(spawn)? {
            break s;
        }
        if said_at.elapsed() >= std::time::Duration::from_secs(15) {
            // indicatif draws no bar into a file; the log's own lines say
            // which step it is in, and a line a minute says it still runs.
            let line = crate::capture::tail(log, 1).trim().to_string();
            if line != said || said_at.elapsed() >= std::time::Duration::from_secs(60) {
                progress(&format!(
                    "stagesim {what}, {} s: {}",
                    t0.elapsed().as_secs(),
                    line.chars().take(160).collect::<String>()
                ));
                (said, said_at) = (line, std::time::Instant::now());
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    if !status.success() {
        return Err(ModelError::Failed {
            what,
            status,
            output: crate::capture::tail(log, 12),
        });
    }
    Ok(())
}

/// What the discovery chose (from `stagesim discover --json`).
#[derive(Clone, Debug)]
pub struct Discovery {
    /// Complete requests in the trace.
    pub requests: u64,
    /// Mean instructions per request.
    pub request_instrs: f64,
    /// Candidate functions (called at most once in ≥ [`MIN_PRESENT_PCT`] % of requests).
    pub candidates: usize,
    /// The chosen choice: stages.
    pub parts: usize,
    /// Its points' function names, in request order.
    pub points: Vec<String>,
    /// Stage visits per request.
    pub visits_per_request: f64,
}

fn json_err(path: &Path, why: impl Into<String>) -> ModelError {
    ModelError::Json {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| json_err(path, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| json_err(path, e.to_string()))
}

/// Reads `stagesim discover --json`'s file and picks the best choice with
/// at least `min_parts` stages (lowest score).
///
/// Errors: [`ModelError::Json`] when the file is unreadable or has no such choice.
pub fn read_discovery(path: &Path, min_parts: usize) -> Result<Discovery, ModelError> {
    let v = read_json(path)?;
    let out = &v["outcome"];
    let census = &out["census"];
    let names: Vec<&str> = census["candidates"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    let best = out["choices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["parts"].as_u64().unwrap_or(0) as usize >= min_parts)
        .min_by(|a, b| {
            let s = |c: &serde_json::Value| c["score"].as_f64().unwrap_or(f64::INFINITY);
            s(a).total_cmp(&s(b))
        })
        .ok_or_else(|| json_err(path, format!("no choice of ≥ {min_parts} stages")))?;
    let points = best["points"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| names.get(i.as_u64()? as usize).map(|s| s.to_string()))
        .collect();
    Ok(Discovery {
        requests: census["requests"].as_u64().unwrap_or(0),
        request_instrs: census["request_instrs"].as_f64().unwrap_or(0.0),
        candidates: names.len(),
        parts: best["parts"].as_u64().unwrap_or(0) as usize,
        points,
        visits_per_request: best["visits_per_request"].as_f64().unwrap_or(0.0),
    })
}

/// The replays of the chosen map: the OS-like baseline, `pinned`, and the
/// staged model (`stagesim replay --json`).
#[derive(Clone, Debug)]
pub struct Prediction {
    /// The OS-like model.
    pub baseline: SimResult,
    /// Threads pinned to cores, unstaged.
    pub pinned: SimResult,
    /// Staged by the map: temporal, `pinned` with the SRPT visit order;
    /// spatial, host-sched `static` with equal weights, as the VMM runs it
    /// without budgets.
    pub staged: SimResult,
}

impl Prediction {
    /// Reads `stagesim replay --json`'s file of [`Route::replay_args`]'s
    /// models for `mechanism`.
    ///
    /// Errors: [`ModelError::Json`] when a model is missing.
    pub fn read(path: &Path, mechanism: Mechanism) -> Result<Self, ModelError> {
        let v = read_json(path)?;
        let results: Vec<SimResult> = serde_json::from_value(v["results"].clone())
            .map_err(|e| json_err(path, format!("results: {e}")))?;
        let get = |p: &str, visit: &str| {
            results
                .iter()
                .find(|r| r.policy == p && (r.visit == visit || p == "baseline"))
                .cloned()
                .ok_or_else(|| json_err(path, format!("no '{p}' replay with visit {visit}")))
        };
        Ok(Self {
            baseline: get("baseline", "fifo")?,
            pinned: get("pinned", "fifo")?,
            staged: match mechanism {
                Mechanism::Temporal => get("pinned", "srpt")?,
                _ => get("static", "fifo")?,
            },
        })
    }

    /// The staged model's stage switches (temporal) or migrations
    /// (spatial) per 1000 instructions.
    pub fn moves_pki(&self) -> f64 {
        let c = &self.staged.total.counters;
        (c.switches + c.migrations) as f64 * 1000.0 / c.instrs.max(1) as f64
    }

    /// The better unstaged model by throughput, and its name.
    pub fn better_unstaged(&self) -> &SimResult {
        if self.pinned.throughput_ipc > self.baseline.throughput_ipc {
            &self.pinned
        } else {
            &self.baseline
        }
    }

    /// Staged throughput ÷ the better unstaged model's.
    pub fn throughput_ratio(&self) -> f64 {
        self.staged.throughput_ipc / self.better_unstaged().throughput_ipc.max(1e-12)
    }

    /// Staged L2 instruction misses ÷ the baseline's (per instruction).
    pub fn l2i_ratio(&self) -> f64 {
        self.staged.total.l2i_mpki / self.baseline.total.l2i_mpki.max(1e-12)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_bad_ones_are_named() {
        assert_eq!(parse_size("2048K"), Ok(2 << 20));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("2G").unwrap_err().contains("'2G'"));
        assert!(parse_size("big").unwrap_err().contains("'big'"));
        assert!(parse_size("0K").is_err());
    }

    #[test]
    fn the_best_choice_with_enough_stages_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.json");
        let v = serde_json::json!({"outcome": {
        "census": {"requests": 10, "request_instrs": 5000.0,
                   "candidates": [{"name": "a"}, {"name": "b"}, {"name": "c"}]},
        "choices": [
            {"parts": 2, "points": [0, 2], "score": -3.0, "visits_per_request": 2.0},
            {"parts": 3, "points": [0, 1, 2], "score": -2.0, "visits_per_request": 3.0}
        ]}});
        std::fs::write(&p, v.to_string()).unwrap();
        let d = read_discovery(&p, 2).unwrap();
        assert_eq!(
            (d.parts, d.points.clone()),
            (2, vec!["a".to_string(), "c".into()])
        );
        assert_eq!((d.requests, d.candidates), (10, 3));
        assert_eq!(read_discovery(&p, 3).unwrap().parts, 3);
        assert!(read_discovery(&p, 4).is_err());
    }
}
