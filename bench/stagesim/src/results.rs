//! The `bench/RESULTS.md` section of `just bench-sim` (`stagesim results`):
//! reads the JSON files the recipe leaves in `target/stagesim/` and writes
//! the text between `<!-- stagesim:begin … -->` and `<!-- stagesim:end -->`,
//! leaving everything else in the file untouched.
//!
//! Files read from the results folder (each optional; missing ones are
//! skipped with a note): `<trace>.json` (main matrix), `<trace>-sweep.json`
//! (migration cost × grouping), `<trace>-variants.json` (model variants),
//! `<trace>-l2-256.json` (seed machines' L2), `<trace>-stats.json`
//! (`stagesim stats`), `<trace>-discover.json` (`stagesim discover`),
//! `commands.txt` (the commands the recipe ran) and `env.txt` (machine).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde_json::Value;

/// Start marker of the section.
pub const BEGIN: &str = "<!-- stagesim:begin (written by `just bench-sim`: stagesim results) -->";
/// End marker of the section.
pub const END: &str = "<!-- stagesim:end -->";
const BEGIN_PREFIX: &str = "<!-- stagesim:begin";

/// Replaces the text between the stagesim markers of `old` with `section`
/// (appending the markers at the end when absent); nothing else changes.
pub fn splice(old: &str, section: &str) -> String {
    let body = if section.ends_with('\n') {
        section.to_string()
    } else {
        format!("{section}\n")
    };
    if let Some(b) = old.find(BEGIN_PREFIX) {
        if let Some(e_rel) = old[b..].find(END) {
            let e = b + e_rel;
            return format!("{}{BEGIN}\n{body}{}", &old[..b], &old[e..]);
        }
    }
    let head = if old.trim().is_empty() {
        "# stagevm benchmark results\n".to_string()
    } else {
        format!("{}\n", old.trim_end())
    };
    format!("{head}\n{BEGIN}\n{body}{END}\n")
}

/// Writes `section` into `path` between the markers (re-reading the file
/// right before writing).
pub fn write_section(path: &Path, section: &str) -> anyhow::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    std::fs::write(path, splice(&old, section)).with_context(|| format!("{}", path.display()))
}

/// Linear interpolation of the cost at which `ratio(cost)` crosses 1 on
/// sorted `(cost, ratio)` points. `Some(0.0)`-like answers: `Below` when
/// even the cheapest point is below 1, `Above` when every point is ≥ 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BreakEven {
    /// Below 1 at every cost measured (no break-even ≥ the cheapest cost).
    Below,
    /// At or above 1 at every cost measured.
    Above,
    /// Crosses 1 at this cost (cycles).
    At(f64),
}

/// The break-even cost of sorted `(cost, ratio)` points.
pub fn break_even(points: &[(f64, f64)]) -> BreakEven {
    match points.first() {
        None => return BreakEven::Below,
        Some((_, r)) if *r < 1.0 => return BreakEven::Below,
        _ => {}
    }
    for w in points.windows(2) {
        let ((c0, r0), (c1, r1)) = (w[0], w[1]);
        if r0 >= 1.0 && r1 < 1.0 {
            return BreakEven::At(c0 + (r0 - 1.0) / (r0 - r1) * (c1 - c0));
        }
    }
    BreakEven::Above
}

fn f(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64().unwrap_or(f64::NAN)
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

fn pct(new: f64, base: f64) -> String {
    if base > 0.0 && new.is_finite() {
        format!("{:+.0} %", (new / base - 1.0) * 100.0)
    } else {
        "–".into()
    }
}

fn load(dir: &Path, name: &str) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join(name)).ok()?;
    serde_json::from_str(&text).ok()
}

/// File names in `dir` that start with `prefix` and end with `.json`, sorted.
fn files_with_prefix(dir: &Path, prefix: &str) -> Vec<String> {
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
fn replay_files(dir: &Path, t: &str) -> Vec<String> {
    let mut v = vec![format!("{t}.json")];
    for x in ["-sweep", "-l2-256", "-variants"] {
        v.extend(files_with_prefix(dir, &format!("{t}{x}")));
    }
    v.dedup();
    v
}

fn results(rep: &Value) -> Vec<&Value> {
    rep["results"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// A grouping object's full spec (as [`crate::groups::StageGroups::full_spec`]).
fn full_spec_of(g: &Value) -> String {
    let names = g["names"].as_array().cloned().unwrap_or_default();
    let members = g["members"].as_array().cloned().unwrap_or_default();
    names
        .iter()
        .zip(&members)
        .map(|(n, m)| {
            format!(
                "{}={}",
                n.as_str().unwrap_or(""),
                m.as_array()
                    .map(|x| x
                        .iter()
                        .filter_map(|y| y.as_str())
                        .collect::<Vec<_>>()
                        .join(","))
                    .unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Short names for a trace's stage groupings: `hand map (9)` for the
/// trace's own stages, letters for the others, with a legend.
struct GroupNames {
    /// (full spec, short name, legend line).
    entries: Vec<(String, String, String)>,
}

impl GroupNames {
    fn new(dir: &Path, t: &str) -> Self {
        let discovered: Vec<(String, String)> =
            std::fs::read_to_string(dir.join(format!("{t}-discover.txt")))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_once('\t'))
                .map(|(k, spec)| (k.to_string(), spec.to_string()))
                .collect();
        let mut objs: Vec<Value> = Vec::new();
        for name in [format!("{t}-sweep.json"), format!("{t}-l2-256.json")]
            .into_iter()
            .chain(files_with_prefix(dir, &format!("{t}-variants")))
        {
            if let Some(v) = load(dir, &name) {
                objs.extend(v["groupings"].as_array().cloned().unwrap_or_default());
            }
        }
        if let Some(v) = load(dir, &format!("{t}-stats.json")) {
            for e in v.as_array().into_iter().flatten() {
                objs.push(e["grouping"].clone());
            }
        }
        let mut entries: Vec<(String, String, String)> = Vec::new();
        let mut letter = b'A';
        for g in objs {
            let full = full_spec_of(&g);
            if entries.iter().any(|e| e.0 == full) {
                continue;
            }
            let k = g["names"].as_array().map_or(0, |a| a.len());
            if g["spec"].as_str() == Some("-") {
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

    fn short(&self, full_spec: &str) -> String {
        self.entries
            .iter()
            .find(|e| e.0 == full_spec)
            .map_or_else(|| full_spec.to_string(), |e| e.1.clone())
    }

    fn legend(&self) -> String {
        let mut o = String::new();
        for (_, _, l) in &self.entries {
            if !l.is_empty() {
                let _ = writeln!(o, "{l}");
            }
        }
        o
    }
}

/// The baseline of a result (same cores and slice) in `all`.
fn baseline<'a>(all: &[&'a Value], r: &Value) -> Option<&'a Value> {
    all.iter().copied().find(|b| {
        s(b, "policy") == "baseline"
            && u(b, "cores") == u(r, "cores")
            && u(b, "slice") == u(r, "slice")
    })
}

/// Simulated throughput and CPU-efficiency ratios of `r` against `b`.
fn ratios(r: &Value, b: &Value) -> (f64, f64) {
    (
        f(r, &["throughput_ipc"]) / f(b, &["throughput_ipc"]),
        f(r, &["total", "ipc"]) / f(b, &["total", "ipc"]),
    )
}

fn short_trace(name: &str) -> &str {
    name.strip_prefix("mariadb-").unwrap_or(name)
}

/// Text of the section from the files in `dir`; `traces` are the trace
/// names (file stems) in table order, `notes` optional hand-written text
/// appended as "Interpretation".
pub fn section(
    dir: &Path,
    traces: &[String],
    notes: Option<&str>,
    checked_in_plots: &[String],
) -> String {
    let mut o = String::new();
    let env = std::fs::read_to_string(dir.join("env.txt")).unwrap_or_default();
    let commands = std::fs::read_to_string(dir.join("commands.txt")).unwrap_or_default();
    let _ = writeln!(
        o,
        "## Cache simulator: MariaDB and footprint-host under the stage policies (issue 7)\n"
    );
    let _ = writeln!(
        o,
        "Written by `just bench-sim` (`stagesim results`) from one run; the commands are at the end. \
Model and caveats: `bench/stagesim/README.md`; traces: `bench/capture/README.md`.\n"
    );
    if !env.trim().is_empty() {
        let _ = writeln!(o, "{}\n", env.trim());
    }

    // Traces, warm-up, replay speed.
    let mut mains: Vec<(String, Value)> = Vec::new();
    for t in traces {
        if let Some(v) = load(dir, &format!("{t}.json")) {
            mains.push((t.clone(), v));
        }
    }
    let mut speeds: Vec<f64> = Vec::new();
    let mut slowest = f64::INFINITY;
    let mut replays = 0usize;
    for name in traces.iter().flat_map(|t| replay_files(dir, t)) {
        if let Some(v) = load(dir, &name) {
            for r in results(&v) {
                let m = f(r, &["replay_mips"]);
                if m.is_finite() && m > 0.0 {
                    speeds.push(f(r, &["replay_seconds"]));
                    slowest = slowest.min(m);
                    replays += 1;
                }
            }
        }
    }
    let mut instr_total = 0.0;
    let mut secs_total = 0.0;
    for name in traces.iter().flat_map(|t| replay_files(dir, t)) {
        if let Some(v) = load(dir, &name) {
            let lim = u(&v, "trace_instrs") as f64;
            for r in results(&v) {
                let done = (u(r, "warmup_instrs") + u(&r["total"]["counters"], "instrs")) as f64;
                instr_total += if done > 0.0 { done } else { lim };
                secs_total += f(r, &["replay_seconds"]);
            }
        }
    }
    let _ = writeln!(o, "### Traces and replay\n");
    let _ = writeln!(
        o,
        "| trace | instructions | threads | stages | warm-up excluded | measured per replay |\n|---|---:|---:|---|---:|---:|"
    );
    for (t, v) in &mains {
        let first = results(v).first().copied().cloned().unwrap_or(Value::Null);
        let _ = writeln!(
            o,
            "| `{t}` | {} | {} | {} | first {} % = {} instr. | {} instr. |",
            u(v, "trace_instrs"),
            u(v, "threads"),
            v["stages"].as_array().map_or(0, |a| a.len()),
            f(v, &["warmup_pct"]),
            u(&first, "warmup_instrs"),
            u(&first["total"]["counters"], "instrs"),
        );
    }
    if replays > 0 {
        let _ = writeln!(
            o,
            "\nReplay speed: **{:.0} M instructions/s** per replay (single-threaded, mean over {} replays of this run; slowest replay {:.0} M instr/s; the issue asks for ≥ 10 M). Every MariaDB replay runs the whole trace (261 M / 371 M instructions), so each configuration replays ≥ 200 M instructions.",
            instr_total / secs_total.max(1e-9) / 1e6,
            replays,
            slowest
        );
    }
    if let Some((_, v)) = mains.first() {
        let c = &v["caches"];
        let m = &v["model"];
        let _ = writeln!(
            o,
            "\nModel: per core L1i {} KiB / L1d {} KiB ({}-way) and a private L2 of {} KiB ({}-way), 64 B lines, LRU, non-inclusive, no L3 simulated (an L2 miss costs an L3 hit); cycle model base CPI {}, L2 hit +{} cycles, L2 miss +{} cycles. Time slice 100 000 instructions unless stated; policy period {} instructions per core; migration cost 4000 cycles unless stated. `static` runs host-sched's static policy with equal weights (no budgets file), `proportional` its proportional policy (smoothing 0.7, hysteresis 0.1).",
            u(&c["l1i"], "size_bytes") / 1024,
            u(&c["l1d"], "size_bytes") / 1024,
            u(&c["l1i"], "ways"),
            u(&c["l2"], "size_bytes") / 1024,
            u(&c["l2"], "ways"),
            f(m, &["base_cpi"]),
            f(m, &["l2_hit"]),
            f(m, &["l3_hit"]),
            u(v, "period"),
        );
    }
    let _ = writeln!(
        o,
        "\nTwo throughput ratios against `baseline` (same cores and slice): **×base sim** is the simulated machine throughput (instructions per cycle over all cores, idle time included: load imbalance, the victim core, convoys of threads queueing at one stage's core); **×base CPU** is the ratio of instructions per *busy* cycle (CPU time per instruction, migrations included) — the throughput if every core were kept busy, an upper bound for a perfectly balanced staged scheduler."
    );

    // Acceptance table.
    let _ = writeln!(
        o,
        "\n### Acceptance: instruction MPKI and modelled throughput (hand-written 9-stage map)\n"
    );
    let _ = writeln!(
        o,
        "| trace | cores | policy | L1i MPKI | ΔL1i | L2i MPKI | ΔL2i | L1d MPKI | L2d MPKI | migr./kI | util | ×base sim | ×base CPU |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut best_l2: Option<(f64, String)> = None;
    let mut best_tput: Option<(f64, String)> = None;
    for (t, v) in &mains {
        if !t.starts_with("mariadb") {
            continue;
        }
        let all = results(v);
        for cores in [4u64, 8] {
            for pol in ["baseline", "pinned", "static", "proportional"] {
                let Some(r) = all.iter().copied().find(|r| {
                    s(r, "policy") == pol
                        && u(r, "cores") == cores
                        && u(r, "slice") == 100_000
                        && u(r, "min_visit") == 0
                }) else {
                    continue;
                };
                let Some(b) = baseline(&all, r) else { continue };
                let tt = &r["total"];
                let bt = &b["total"];
                let (sim, cpu) = ratios(r, b);
                let _ = writeln!(
                    o,
                    "| {} | {cores} | {pol} | {:.2} | {} | {:.2} | {} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2} |",
                    short_trace(t),
                    f(tt, &["l1i_mpki"]),
                    if pol == "baseline" { "–".into() } else { pct(f(tt, &["l1i_mpki"]), f(bt, &["l1i_mpki"])) },
                    f(tt, &["l2i_mpki"]),
                    if pol == "baseline" { "–".into() } else { pct(f(tt, &["l2i_mpki"]), f(bt, &["l2i_mpki"])) },
                    f(tt, &["l1d_mpki"]),
                    f(tt, &["l2d_mpki"]),
                    f(tt, &["migrations_pki"]),
                    f(r, &["utilization"]),
                    sim,
                    cpu
                );
                if pol == "static" || pol == "proportional" {
                    let red = 1.0 - f(tt, &["l2i_mpki"]) / f(bt, &["l2i_mpki"]);
                    let lbl = format!("{pol} at {cores} cores on {}", short_trace(t));
                    if best_l2.as_ref().is_none_or(|(x, _)| red > *x) {
                        best_l2 = Some((red, lbl.clone()));
                    }
                    if best_tput.as_ref().is_none_or(|(x, _)| sim > *x) {
                        best_tput = Some((sim, lbl));
                    }
                }
            }
        }
    }
    let _ = writeln!(o, "\n### Against the seeds\n");
    if let (Some((l2, l2w)), Some((tp, tpw))) = (&best_l2, &best_tput) {
        let _ = writeln!(
            o,
            "* L2 instruction misses: the stage policies cut L2i MPKI by up to **{:.0} %** ({l2w}); seed 000 reports −65 % L2 code misses, seed 004 52.3 % fewer L2 misses per transaction (instruction and data together).",
            l2 * 100.0
        );
        let verdict = if *tp >= 1.0 {
            "above baseline"
        } else {
            "below baseline: the cache effect is there, the throughput gain is not"
        };
        let _ = writeln!(
            o,
            "* Modelled throughput at 4000 cycles per migration: the best stage policy reaches **{tp:.2}×** baseline ({tpw}) — {verdict}. Seed 000 measured **+22 %**, seed 004 **+8.6 %** (both MySQL, TPC-C, fast in-kernel migration in OSv).\n"
        );
    }

    // Migration-cost sweep and granularity.
    let _ = writeln!(o, "\n### Migration cost and stage granularity\n");
    let _ = writeln!(
        o,
        "Cost in cycles at ~2.5 GHz: 500 ≈ 0.2 µs; 4000 ≈ 1.6 µs ≈ seed 000's fast migration (≈ 1.7 µs, the bare-metal IPI propagation it cites); 35 000 ≈ 14 µs ≈ the queue hand-off our test guest measures between vCPUs on this machine (README: \"migration latency 13889 ns\"); libstage's `sched_setaffinity` path in a Linux guest costs 35–115 µs ≈ 90 000–290 000 cycles (guest-agent/linux/README.md; the footprint-host sweep goes that far). *Break-even* is the cost at which ×base CPU falls to 1 (linear between the measured costs); \"none\" means the policy is below baseline even with free migrations.\n"
    );
    for t in traces {
        let Some(v) = load(dir, &format!("{t}-sweep.json")) else {
            continue;
        };
        let gn = GroupNames::new(dir, t);
        let all = results(&v);
        let mut costs: Vec<u64> = all
            .iter()
            .filter(|r| s(r, "policy") != "baseline")
            .map(|r| u(r, "migration_cycles"))
            .collect();
        costs.sort_unstable();
        costs.dedup();
        let _ = writeln!(
            o,
            "**{}** — ×base CPU (×base sim) per migration cost:\n",
            short_trace(t)
        );
        let _ = write!(o, "| cores | policy | stages | migr./kI |");
        for c in &costs {
            let _ = write!(o, " {c} |");
        }
        let _ = writeln!(o, " break-even |");
        let _ = write!(o, "|---:|---|---|---:|");
        for _ in &costs {
            let _ = write!(o, "---:|");
        }
        let _ = writeln!(o, "---:|");
        let mut keys: Vec<(u64, String, String)> = Vec::new();
        for r in &all {
            if s(r, "policy") == "baseline" {
                continue;
            }
            let k = (
                u(r, "cores"),
                s(r, "label").to_string(),
                s(r, "group_spec").to_string(),
            );
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        for (cores, label, groups) in &keys {
            let row: Vec<&Value> = all
                .iter()
                .copied()
                .filter(|r| {
                    u(r, "cores") == *cores
                        && s(r, "label") == label
                        && s(r, "group_spec") == groups
                })
                .collect();
            let mut pts = Vec::new();
            let migr = row
                .first()
                .map_or(f64::NAN, |r| f(r, &["total", "migrations_pki"]));
            let _ = write!(
                o,
                "| {cores} | {label} | {} | {migr:.2} |",
                gn.short(groups)
            );
            for c in &costs {
                match row.iter().find(|r| u(r, "migration_cycles") == *c) {
                    Some(r) => {
                        let (sim, cpu) =
                            baseline(&all, r).map_or((f64::NAN, f64::NAN), |b| ratios(r, b));
                        pts.push((*c as f64, cpu));
                        let _ = write!(o, " {cpu:.2} ({sim:.2}) |");
                    }
                    None => {
                        let _ = write!(o, " – |");
                    }
                }
            }
            let be = match break_even(&pts) {
                BreakEven::Below => "none".to_string(),
                BreakEven::Above => format!("> {}", costs.last().copied().unwrap_or(0)),
                BreakEven::At(c) => format!("≈ {c:.0}"),
            };
            let _ = writeln!(o, " {be} |");
        }
        let _ = writeln!(o);
        let _ = writeln!(o, "{}", gn.legend());
    }

    // Visit statistics per grouping.
    for t in traces {
        let Some(v) = load(dir, &format!("{t}-stats.json")) else {
            continue;
        };
        let gn = GroupNames::new(dir, t);
        let _ = writeln!(o, "**{}** — stage visits (a visit = a thread's run of instructions in one group; every visit of a group the thread's core does not serve starts with a migration):\n", short_trace(t));
        let _ = writeln!(o, "| grouping | group | share % | visits | mean visit | median | 90th pct | code KiB |\n|---|---|---:|---:|---:|---:|---:|---:|");
        for e in v.as_array().into_iter().flatten() {
            let st = &e["stats"];
            let total = f(st, &["instrs"]);
            let glabel = gn.short(&full_spec_of(&e["grouping"]));
            for g in st["groups"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    o,
                    "| {glabel} | {} | {:.1} | {} | {:.0} | {} | {} | {:.0} |",
                    s(g, "name"),
                    f(g, &["instrs"]) * 100.0 / total,
                    u(g, "visits"),
                    f(g, &["mean_visit"]),
                    u(g, "p50_visit"),
                    u(g, "p90_visit"),
                    u(g, "code_lines") as f64 * f(st, &["line_bytes"]) / 1024.0
                );
            }
            let _ = writeln!(
                o,
                "| {glabel} | **all** | 100 | {} | {:.0} | | | {:.0} |",
                u(st, "visits"),
                total / (u(st, "visits").max(1) as f64),
                u(st, "code_lines") as f64 * f(st, &["line_bytes"]) / 1024.0
            );
        }
        let _ = writeln!(o);
    }

    // Variants.
    for t in traces {
        let files = files_with_prefix(dir, &format!("{t}-variants"));
        let docs: Vec<Value> = files.iter().filter_map(|n| load(dir, n)).collect();
        if docs.is_empty() {
            continue;
        }
        let gn = GroupNames::new(dir, t);
        let _ = writeln!(
            o,
            "### Model variants ({}, not host-sched defaults)\n",
            short_trace(t)
        );
        let _ = writeln!(o, "`/load-weights`: static with budgets weighted by each group's share of the trace's instructions (a profile). `/steal`: idle cores take queued threads whose stage they serve (Linux's idle balancing within the affinity mask libstage sets). `/min-visit N oracle|history`: migrate only into visits of ≥ N instructions — `oracle` reads the visit's length ahead in the trace (an upper bound, not implementable), `history` predicts it from the stage's past visits. Slice 100 000.\n");
        let _ = writeln!(o, "| cores | model | stages | migr. cycles | L1i MPKI | L2i MPKI | L1d MPKI | migr./kI | kept/kI | util | ×base sim | ×base CPU |\n|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let mut shown_base = false;
        for d in &docs {
            let all = results(d);
            for r in &all {
                if s(r, "policy") == "baseline" {
                    if shown_base {
                        continue;
                    }
                    shown_base = true;
                }
                let Some(b) = baseline(&all, r) else { continue };
                let tt = &r["total"];
                let (sim, cpu) = ratios(r, b);
                let instrs = f(tt, &["counters", "instrs"]).max(1.0);
                let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} |",
                u(r, "cores"),
                s(r, "label"),
                gn.short(s(r, "group_spec")),
                u(r, "migration_cycles"),
                f(tt, &["l1i_mpki"]),
                f(tt, &["l2i_mpki"]),
                f(tt, &["l1d_mpki"]),
                f(tt, &["migrations_pki"]),
                f(tt, &["counters", "kept"]) * 1000.0 / instrs,
                f(r, &["utilization"]),
                sim,
                cpu
            );
            }
        }
        let _ = writeln!(o);
    }

    // L2 256 KiB.
    let mut wrote_l2 = false;
    for t in traces {
        let Some(v) = load(dir, &format!("{t}-l2-256.json")) else {
            continue;
        };
        let gn = GroupNames::new(dir, t);
        if !wrote_l2 {
            let _ = writeln!(o, "### With the seeds' L2 (256 KiB, 8-way, as on seed 000's Xeon E5-2618L v3 and seed 004's E5-2620 v4)\n");
            let _ = writeln!(o, "| trace | cores | model | stages | migr. cycles | L1i MPKI | ΔL1i | L2i MPKI | ΔL2i | L2d MPKI | util | ×base sim | ×base CPU |\n|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
            wrote_l2 = true;
        }
        let all = results(&v);
        for r in &all {
            let Some(b) = baseline(&all, r) else { continue };
            let tt = &r["total"];
            let bt = &b["total"];
            let (sim, cpu) = ratios(r, b);
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                short_trace(t),
                u(r, "cores"),
                s(r, "label"),
                gn.short(s(r, "group_spec")),
                u(r, "migration_cycles"),
                f(tt, &["l1i_mpki"]),
                pct(f(tt, &["l1i_mpki"]), f(bt, &["l1i_mpki"])),
                f(tt, &["l2i_mpki"]),
                pct(f(tt, &["l2i_mpki"]), f(bt, &["l2i_mpki"])),
                f(tt, &["l2d_mpki"]),
                f(r, &["utilization"]),
                sim,
                cpu
            );
        }
    }
    if wrote_l2 {
        let _ = writeln!(o);
    }

    // Discovery.
    let mut wrote_disc = false;
    for t in traces {
        let Some(v) = load(dir, &format!("{t}-discover.json")) else {
            continue;
        };
        if !wrote_disc {
            let _ = writeln!(
                o,
                "### Automatic stage discovery (stretch goal, partly done)\n"
            );
            let _ = writeln!(o, "Seed 004 picks migration points by simulating candidate splits and keeping the one with the fewest misses. `stagesim discover` does this over the migration points the trace has — the 9 stages' entry functions — by greedy merging: from 9 groups, simulate every merge of two groups and keep the best, down to 1 group; every candidate replays the same first part of every thread's stream. Where several group counts show the same score, the extra merges joined groups that shared the victim core anyway. It does **not** look for new migration points inside or between the hand map's functions (that needs function boundaries in the trace), so it refines the hand map's granularity rather than discovering stages from scratch.\n");
            wrote_disc = true;
        }
        let _ = writeln!(
            o,
            "**{}**: candidates replayed under {} (load weights) at {} cores, slice {}, {} migration cycles, score `{}` (cpi = busy cycles per instruction), each on the first {} % of every thread's stream ({:.0} M instructions, {} % of them warm-up); {} replays in {:.0} s. The chosen grouping per group count:\n",
            short_trace(t),
            s(&v, "policy"),
            u(&v, "cores"),
            u(&v, "slice"),
            u(&v, "migration_cycles"),
            s(&v, "objective"),
            f(&v, &["prefix_pct"]),
            u(&v, "prefix_instrs") as f64 / 1e6,
            f(&v, &["warmup_pct"]),
            v["steps"].as_array().map_or(0, |a| a.iter().map(|s| u(s, "candidates")).sum::<u64>()),
            f(&v, &["seconds"])
        );
        let _ = writeln!(o, "| groups | CPI | L1i MPKI | L2i MPKI | L1d MPKI | migr./kI | grouping |\n|---:|---:|---:|---:|---:|---:|---|");
        for st in v["steps"].as_array().into_iter().flatten() {
            let tt = &st["result"]["total"];
            let ipc = f(tt, &["ipc"]);
            let _ = writeln!(
                o,
                "| {} | {:.3} | {:.2} | {:.2} | {:.2} | {:.3} | `{}` |",
                u(st, "k"),
                1.0 / ipc,
                f(tt, &["l1i_mpki"]),
                f(tt, &["l2i_mpki"]),
                f(tt, &["l1d_mpki"]),
                f(tt, &["migrations_pki"]),
                s(st, "spec")
                    .split(';')
                    .map(|g| g.split('=').nth(1).unwrap_or(g).replace(',', "+"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
        }
        let _ = writeln!(o);
    }

    // footprint-host.
    for (t, v) in &mains {
        if t.starts_with("mariadb") {
            continue;
        }
        let all = results(v);
        let _ = writeln!(o, "### `{t}` (the headline workload built for the host)\n");
        let _ = writeln!(o, "{} instructions (the whole trace; shorter than the MariaDB traces), {} threads, stages {}.\n", u(v, "trace_instrs"), u(v, "threads"), v["stages"].as_array().map(|a| a.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(", ")).unwrap_or_default());
        let _ = writeln!(o, "| cores | policy | L1i MPKI | ΔL1i | L2i MPKI | ΔL2i | L1d MPKI | migr./kI | util | ×base sim | ×base CPU |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for cores in [2u64, 4] {
            for r in all
                .iter()
                .filter(|r| u(r, "cores") == cores && u(r, "slice") == 100_000)
            {
                let Some(b) = baseline(&all, r) else { continue };
                let tt = &r["total"];
                let bt = &b["total"];
                let (sim, cpu) = ratios(r, b);
                let _ = writeln!(
                    o,
                    "| {cores} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2} |",
                    s(r, "label"),
                    f(tt, &["l1i_mpki"]),
                    pct(f(tt, &["l1i_mpki"]), f(bt, &["l1i_mpki"])),
                    f(tt, &["l2i_mpki"]),
                    pct(f(tt, &["l2i_mpki"]), f(bt, &["l2i_mpki"])),
                    f(tt, &["l1d_mpki"]),
                    f(tt, &["migrations_pki"]),
                    f(r, &["utilization"]),
                    sim,
                    cpu
                );
            }
        }
        let _ = writeln!(o);
    }

    // Slice length.
    let _ = writeln!(o, "### Time slice (baseline)\n");
    let _ = writeln!(o, "| trace | cores | slice | L1i MPKI | L2i MPKI | L1d MPKI | L2d MPKI | IPC |\n|---|---:|---:|---:|---:|---:|---:|---:|");
    for (t, v) in &mains {
        for r in results(v)
            .iter()
            .filter(|r| s(r, "policy") == "baseline" && [4, 8].contains(&u(r, "cores")))
        {
            let tt = &r["total"];
            let _ = writeln!(
                o,
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                short_trace(t),
                u(r, "cores"),
                u(r, "slice"),
                f(tt, &["l1i_mpki"]),
                f(tt, &["l2i_mpki"]),
                f(tt, &["l1d_mpki"]),
                f(tt, &["l2d_mpki"]),
                f(tt, &["ipc"])
            );
        }
    }
    let _ = writeln!(o, "\nThe traces have a fixed number of connections (16), so the thread count is not varied here; `stagesim synth --threads N` varies it on synthetic traces.\n");

    // Plots.
    let _ = writeln!(o, "### Plots\n");
    let _ = writeln!(o, "Checked in: `bench/stagesim/plots/` (copied by the recipe). All of them: `target/stagesim/plots/` — per trace `<trace>-{{l1i-mpki,l2i-mpki,l2d-mpki,throughput}}.png` (policies × 2/4/8/16 cores × three slices) and `<trace>-sweep-*.png` (migration-cost sweep).\n");
    for n in checked_in_plots {
        let _ = writeln!(o, "![{n}](stagesim/plots/{n})");
    }
    let _ = writeln!(o);

    if let Some(n) = notes {
        let _ = writeln!(o, "### Interpretation\n");
        let _ = writeln!(o, "{}\n", n.trim());
    }
    if !commands.trim().is_empty() {
        let _ = writeln!(o, "### Commands (this run)\n");
        let _ = writeln!(o, "```sh\n{}\n```", commands.trim());
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_only_between_the_markers() {
        let old = format!(
            "# results\n\nintro\n<!-- headline-bench:begin (x) -->\nlead's\n<!-- headline-bench:end -->\n{BEGIN}\nold table\n{END}\ntail\n"
        );
        let new = splice(&old, "new table");
        assert_eq!(
            new,
            format!(
                "# results\n\nintro\n<!-- headline-bench:begin (x) -->\nlead's\n<!-- headline-bench:end -->\n{BEGIN}\nnew table\n{END}\ntail\n"
            )
        );
        // A begin marker with other text after "stagesim:begin" is found too.
        let other = "a\n<!-- stagesim:begin -->\nx\n<!-- stagesim:end -->\nb\n";
        assert_eq!(splice(other, "y\n"), format!("a\n{BEGIN}\ny\n{END}\nb\n"));
    }

    #[test]
    fn splice_appends_markers_when_absent() {
        let old = "# r\n\n<!-- headline-bench:begin -->\nx\n<!-- headline-bench:end -->\n\n\n";
        assert_eq!(
            splice(old, "s"),
            format!("# r\n\n<!-- headline-bench:begin -->\nx\n<!-- headline-bench:end -->\n\n{BEGIN}\ns\n{END}\n")
        );
        assert_eq!(
            splice("", "s"),
            format!("# stagevm benchmark results\n\n{BEGIN}\ns\n{END}\n")
        );
    }

    #[test]
    fn break_even_interpolates() {
        assert_eq!(break_even(&[(0.0, 0.9), (1000.0, 0.5)]), BreakEven::Below);
        assert_eq!(break_even(&[(0.0, 1.2), (1000.0, 1.1)]), BreakEven::Above);
        match break_even(&[(0.0, 1.2), (1000.0, 1.1), (2000.0, 0.9)]) {
            BreakEven::At(c) => assert!((c - 1500.0).abs() < 1e-6, "{c}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(break_even(&[]), BreakEven::Below);
    }
}
