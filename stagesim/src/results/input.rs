//! What the results section reads, typed: the replay [`Report`]s, the
//! `stagesim stats` and `stagesim discover` JSON files, and the short names
//! of stage groupings ([`GroupNames`]); plus the helpers every table uses
//! (the baseline of a replay, throughput ratios, percentages).

use std::fmt::Write as _;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::analysis::TraceStats;
use crate::discover::Step;
use crate::groups::StageGroups;
use crate::report::Report;
use crate::sim::SimResult;

/// One entry of `stagesim stats --json` (an array of them).
#[derive(Debug, Deserialize)]
pub struct StatsEntry {
    /// The grouping the statistics are for.
    pub grouping: StageGroups,
    /// The statistics.
    pub stats: TraceStats,
}

/// `stagesim discover --json`.
#[derive(Debug, Deserialize)]
pub struct DiscoverFile {
    /// Staged policy the candidates ran under.
    pub policy: String,
    /// Simulated cores.
    pub cores: u64,
    /// Time slice, instructions.
    pub slice: u64,
    /// Migration cost, cycles.
    pub migration_cycles: u64,
    /// Score minimised.
    pub objective: String,
    /// Part of every thread's stream replayed, %.
    pub prefix_pct: f64,
    /// Instructions per candidate.
    pub prefix_instrs: u64,
    /// Warm-up, % of the prefix.
    pub warmup_pct: f64,
    /// Wall-clock seconds of the search.
    pub seconds: f64,
    /// One step per group count.
    pub steps: Vec<Step>,
}

/// `dir/name` parsed as `T`; `None` when missing or not a `T`.
pub fn load<T: DeserializeOwned>(dir: &Path, name: &str) -> Option<T> {
    let text = std::fs::read_to_string(dir.join(name)).ok()?;
    serde_json::from_str(&text).ok()
}

/// File names in `dir` that start with `prefix` and end with `.json`, sorted.
pub fn files_with_prefix(dir: &Path, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(prefix) && n.ends_with(".json"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The replay JSON files of trace `t` (main, sweep, variants, L2).
pub fn replay_files(dir: &Path, t: &str) -> Vec<String> {
    let mut v = vec![format!("{t}.json")];
    for x in ["-sweep", "-l2-256", "-variants"] {
        v.extend(files_with_prefix(dir, &format!("{t}{x}")));
    }
    v.dedup();
    v
}

/// `new` relative to `base` as a signed percentage.
pub fn pct(new: f64, base: f64) -> String {
    if base > 0.0 && new.is_finite() {
        format!("{:+.0} %", (new / base - 1.0) * 100.0)
    } else {
        "–".into()
    }
}

/// The baseline of a result (same cores and slice) in `all`.
pub fn baseline<'a>(all: &'a [SimResult], r: &SimResult) -> Option<&'a SimResult> {
    all.iter()
        .find(|b| b.policy == "baseline" && b.cores == r.cores && b.slice == r.slice)
}

/// Simulated throughput and CPU-efficiency ratios of `r` against `b`.
pub fn ratios(r: &SimResult, b: &SimResult) -> (f64, f64) {
    (
        r.throughput_ipc / b.throughput_ipc,
        r.total.ipc / b.total.ipc,
    )
}

/// A trace name without the `mariadb-` prefix.
pub fn short_trace(name: &str) -> &str {
    name.strip_prefix("mariadb-").unwrap_or(name)
}

/// Short names for a trace's stage groupings: `hand map (9)` for the
/// trace's own stages, letters for the others, with a legend.
pub struct GroupNames {
    /// (full spec, short name, legend line).
    entries: Vec<(String, String, String)>,
}

impl GroupNames {
    /// The groupings of trace `t`'s sweep, L2, variants and stats files.
    pub fn new(dir: &Path, t: &str) -> Self {
        let discovered: Vec<(String, String)> =
            std::fs::read_to_string(dir.join(format!("{t}-discover.txt")))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_once('\t'))
                .map(|(k, spec)| (k.to_string(), spec.to_string()))
                .collect();
        let mut objs: Vec<StageGroups> = Vec::new();
        for name in [format!("{t}-sweep.json"), format!("{t}-l2-256.json")]
            .into_iter()
            .chain(files_with_prefix(dir, &format!("{t}-variants")))
        {
            if let Some(v) = load::<Report>(dir, &name) {
                objs.extend(v.groupings);
            }
        }
        if let Some(v) = load::<Vec<StatsEntry>>(dir, &format!("{t}-stats.json")) {
            objs.extend(v.into_iter().map(|e| e.grouping));
        }
        let mut entries: Vec<(String, String, String)> = Vec::new();
        let mut letter = b'A';
        for g in objs {
            let full = g.full_spec();
            if entries.iter().any(|e| e.0 == full) {
                continue;
            }
            let k = g.names.len();
            if g.spec == "-" {
                entries.push((full, format!("hand map ({k})"), String::new()));
                continue;
            }
            let short = format!("{} ({k})", letter as char);
            let origin = match discovered.iter().find(|(_, d)| *d == full) {
                Some((kk, _)) => format!(" — found by `stagesim discover` ({kk} groups)"),
                None => " — chosen by hand".to_string(),
            };
            let pretty = full
                .split(';')
                .map(|grp| match grp.split_once('=') {
                    Some((n, m)) if n.contains('+') => m.replace(',', "+"),
                    Some((n, m)) => format!("{n}: {}", m.replace(',', "+")),
                    None => grp.to_string(),
                })
                .collect::<Vec<_>>()
                .join(" · ");
            entries.push((
                full,
                short.clone(),
                format!("* **{short}** = {pretty}{origin}"),
            ));
            letter = letter.saturating_add(1);
        }
        Self { entries }
    }

    /// The short name of a grouping (its full spec when unknown).
    pub fn short(&self, full_spec: &str) -> String {
        self.entries
            .iter()
            .find(|e| e.0 == full_spec)
            .map_or_else(|| full_spec.to_string(), |e| e.1.clone())
    }

    /// One line per grouping with a letter.
    pub fn legend(&self) -> String {
        let mut o = String::new();
        for (_, _, l) in &self.entries {
            if !l.is_empty() {
                let _ = writeln!(o, "{l}");
            }
        }
        o
    }
}
