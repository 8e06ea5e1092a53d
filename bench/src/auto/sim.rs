//! O1 and O2 of `just bench-auto` in the simulator: stagesim replays the
//! MariaDB traces with each fixed mode of `auto` and with `auto` itself
//! (host-sched's code, unchanged), and with `auto`'s null experiment
//! (`--auto-twin`: its one candidate is unstaged under another name).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// One cell: a trace, a stage map, an L2 size and a core count.
#[derive(Clone, Debug)]
pub struct Cell {
    pub trace: String,
    pub map: String,
    pub l2_kib: u32,
    pub cores: u64,
}

/// What the replays of one cell measured.
#[derive(Clone, Debug, Default)]
pub struct Oracle {
    /// Full-replay throughput (IPC over all cores) of each fixed mode, in
    /// `unstaged, temporal, spatial, both` order.
    pub modes: [f64; 4],
    /// `auto`'s own throughput, the mode it held at the end, and its cost:
    /// (periods, periods in trials, periods in losing slices, those
    /// periods priced by what their modes lost against the kept one).
    pub auto: f64,
    pub kept: String,
    pub cost: (u64, u64, u64, f64),
    /// The null experiment: its duels' outcomes (`no better`, `capped`,
    /// `better`).
    pub twin: Vec<String>,
}

/// The modes' names, in [`Oracle::modes`] order.
pub const MODES: [&str; 4] = ["unstaged", "temporal", "spatial", "both"];

/// The replay options every line shares: the RESULTS.md model (bench-sim's
/// costs), `repeat` laps of the trace.
fn common(trace: &Path, map: Option<&Path>, l2: u32, repeat: u32, period: u64) -> String {
    let mut s = format!(
        "--trace {} --slice 100000 --l2 {l2}:8 --transfer-cycles 150 --migration-cycles 500 \
         --migration-target-cycles 500 --migration-latency 1700 --switch-cycles 163 \
         --repeat {repeat} --period {period} --cores 2,4 --jobs 2 --binary /usr/sbin/mariadbd",
        trace.display()
    );
    if let Some(m) = map {
        s += &format!(" --stage-map {}", m.display());
    }
    s
}

/// The maps of `trace`: its captured stages, and the map stagevm-discover
/// wrote for it, if any (`target/stagesim/NAME.stagemap`).
pub fn maps(trace: &Path) -> Vec<(String, Option<PathBuf>)> {
    let name = trace_name(trace);
    let mut v = vec![("captured".to_string(), None)];
    let discovered = PathBuf::from(format!("target/stagesim/{name}.stagemap"));
    if discovered.exists() {
        v.push(("discovered".into(), Some(discovered)));
    }
    v
}

/// `mariadb-tpcc` from `…/mariadb-tpcc.strace.zst`.
pub fn trace_name(trace: &Path) -> String {
    let f = trace
        .file_name()
        .map_or(String::new(), |f| f.to_string_lossy().into_owned());
    f.split('.').next().unwrap_or_default().to_string()
}

/// Laps of the trace a replay runs: the fixed modes' full replays (the
/// oracle: their throughput is the same lap after lap) and `auto`'s runs
/// (a server runs for hours; trials take a fixed number of periods).
#[derive(Clone, Copy, Debug)]
pub struct Laps {
    pub oracle: u32,
    pub auto: u32,
}

/// Runs the replays of one trace (every map and L2 size, 2 and 4 cores)
/// in one `stagesim replay-batch` (the trace loads once); returns its
/// cells.
///
/// # Errors
/// When stagesim fails or leaves a result it cannot read.
pub fn run_trace(
    stagesim: &Path,
    trace: &Path,
    l2s: &[u32],
    laps: Laps,
    period: u64,
    dir: &Path,
) -> Result<Vec<(Cell, Oracle)>> {
    let name = trace_name(trace);
    let mut lines = Vec::new();
    let mut outs = Vec::new();
    for (map_name, map) in maps(trace) {
        for &l2 in l2s {
            for (k, policy) in [
                "--policy pinned --visit fifo,srpt --steal on",
                "--policy static --visit fifo,srpt",
                "--policy auto --visit srpt",
                "--policy auto --auto-twin",
            ]
            .iter()
            .enumerate()
            {
                let repeat = if k < 2 { laps.oracle } else { laps.auto };
                let base = common(trace, map.as_deref(), l2, repeat, period);
                let out = dir.join(format!("{name}-{map_name}-{l2}-{k}.json"));
                lines.push(format!("{base} {policy} --json {}", out.display()));
                outs.push((map_name.clone(), l2, k, out));
            }
        }
    }
    let batch = dir.join(format!("{name}.batch"));
    std::fs::write(&batch, lines.join("\n") + "\n")?;
    eprintln!("bench-auto: O1/O2 {name}: {} replay lines", lines.len());
    let st = Command::new(stagesim)
        .arg("replay-batch")
        .arg(&batch)
        .status()
        .with_context(|| format!("running {}", stagesim.display()))?;
    if !st.success() {
        bail!("stagesim replay-batch {} failed: {st}", batch.display());
    }
    let mut cells: Vec<(Cell, Oracle)> = Vec::new();
    for (map, l2, k, out) in outs {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&out)?)
            .with_context(|| format!("reading {}", out.display()))?;
        let results = v["results"].as_array().cloned().unwrap_or_default();
        for r in results {
            let cores = r["cores"].as_u64().unwrap_or(0);
            let at = match cells
                .iter()
                .position(|(c, _)| c.map == map && c.l2_kib == l2 && c.cores == cores)
            {
                Some(i) => i,
                None => {
                    cells.push((
                        Cell {
                            trace: name.clone(),
                            map: map.clone(),
                            l2_kib: l2,
                            cores,
                        },
                        Oracle::default(),
                    ));
                    cells.len() - 1
                }
            };
            let o = &mut cells[at].1;
            let tput = r["throughput_ipc"].as_f64().unwrap_or(f64::NAN);
            let temporal = r["visit"].as_str().is_some_and(|v| v != "fifo");
            match k {
                0 | 1 => o.modes[2 * k + usize::from(temporal)] = tput,
                2 => {
                    o.auto = tput;
                    o.kept = last_kept(&r);
                    if let Some(c) = r["auto_cost"].as_array() {
                        let n = |i: usize| c.get(i).and_then(Value::as_u64).unwrap_or(0);
                        let priced = c.get(3).and_then(Value::as_f64).unwrap_or(f64::NAN);
                        o.cost = (n(0), n(1), n(2), priced);
                    }
                }
                _ => o.twin = twin_outcomes(&r),
            }
        }
    }
    Ok(cells)
}

/// The mode `auto` held at the end: its last verdict's ("MODE: keep KEPT
/// by …"), else unstaged.
fn last_kept(r: &Value) -> String {
    decisions(r)
        .iter()
        .rev()
        .find_map(|d| {
            d.split("keep ")
                .nth(1)
                .and_then(|s| s.split([' ', ':']).next())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unstaged".into())
}

fn decisions(r: &Value) -> Vec<String> {
    r["auto_decisions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| d.get(1).and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The null experiment's duel outcomes, one per verdict ("temporal vs
/// unstaged: OUTCOME (…").
fn twin_outcomes(r: &Value) -> Vec<String> {
    decisions(r)
        .iter()
        .filter(|d| d.contains(": keep "))
        .filter_map(|d| {
            let rest = d.split("temporal vs unstaged: ").nth(1)?;
            Some(
                ["no better", "capped", "better", "over twice"]
                    .into_iter()
                    .find(|o| rest.starts_with(o))
                    .unwrap_or("?")
                    .to_string(),
            )
        })
        .collect()
}
