//! The verdict of issue 40: where temporal staging of a real server pays.
//! Its own section of `bench/RESULTS.md` (between [`BEGIN`] and [`END`],
//! written by `stagesim results --temporal`, `just bench-sim --temporal`):
//! per trace, the visit orders of `pinned` with idle stealing (temporal),
//! `static` (spatial) and `static` with a visit order (both), per stage
//! map, switch mechanism, core count and L2 size, against the baseline's
//! misses and the better unstaged model's throughput; `auto` trialling
//! all four modes; the switch-cost sweep and its break-even.
//!
//! Files (from `stagesim/bench-sim.sh --temporal`, in the results
//! folder): `<trace>-t<L2>-ref.json` (baseline, `pinned`, `pinned/steal`),
//! `<trace>-t<L2>-ref4.json` (the same over `auto`'s laps),
//! `<trace>-t<L2>-<mech>-<map>{,-v,-s}.json` (temporal; more visit
//! policies; spatial and both),
//! `<trace>-t<L2>-<mech>-<map>-auto.json` and
//! `<trace>-tsweep-<L2>-<map>.json` (switch cost sweep); `temporal-env.txt`
//! (machine, run time) and `temporal-commands.txt`.

use std::fmt::Write as _;
use std::path::Path;

use super::input::{self, short_trace};
use super::{break_even, BreakEven};
use crate::report::Report;
use crate::sim::SimResult;

/// Start marker of the section.
pub const BEGIN: &str =
    "<!-- stagesim-temporal:begin (written by `just bench-sim --temporal`: stagesim results --temporal) -->";
/// End marker of the section.
pub const END: &str = "<!-- stagesim-temporal:end -->";

/// L2 sizes of the grid, KiB: the seeds' Xeons (256), this project's
/// earlier model (512), this host's (2 MiB per core).
pub const L2_KIB: [u32; 3] = [256, 512, 2048];
/// Core counts of the grid.
pub const CORES: [usize; 4] = [2, 4, 6, 8];

/// Switch mechanisms: file tag and what a switch (temporal) and a
/// migration (spatial) cost. The cycle figures are set by
/// `stagesim/bench-sim.sh`; this is their documentation.
pub const MECHANISMS: [(&str, &str); 3] = [
    (
        "unikernel",
        "the test unikernel: a yield 163 cycles (65 ns local switch, `just bench-migration` saturated; bench/RESULTS.md, migration microbenchmark); a migration 500 + 500 cycles CPU and 1700 cycles latency (issue 25)",
    ),
    (
        "scx",
        "a sched_ext-class yield in a Linux guest: a uprobe hit at the stage's function (≈ 0.3 µs: 100–500 ns per hit, https://kernel-internals.org/tracing/uprobes-usdt) and the scheduler handing the core to the next thread of the stage without a sleep/wake pair (≈ 0.5 µs, assumed: no published figure found), 0.8 µs = 2000 cycles; steals as `linux`",
    ),
    (
        "linux",
        "the Linux agent's own gate at a uprobe hit: the uprobe (≈ 0.3 µs) and a voluntary switch — the thread sleeps, the next is woken (≈ 1.1 µs per switch between two threads of one process, pipe ping-pong on Linux 6.6: https://ddumbying.vercel.app/experiments/ctx-switch-overhead) — 1.4 µs = 3500 cycles; a migration (and a steal) as issue 25's `sched_setaffinity` class, 25 000 cycles",
    ),
];

/// Replaces the text between this section's markers in `old` (appending
/// them at the end when absent); nothing else changes.
pub fn splice(old: &str, section: &str) -> String {
    let body = if section.ends_with('\n') {
        section.to_string()
    } else {
        format!("{section}\n")
    };
    let prefix = "<!-- stagesim-temporal:begin";
    if let Some(b) = old.find(prefix) {
        if let Some(e_rel) = old[b..].find(END) {
            let e = b + e_rel;
            return format!("{}{BEGIN}\n{body}{}", &old[..b], &old[e..]);
        }
    }
    format!("{}\n\n{BEGIN}\n{body}{END}\n", old.trim_end())
}

fn results(dir: &Path, name: &str) -> Vec<SimResult> {
    input::load::<Report>(dir, name).map_or_else(Vec::new, |r| r.results)
}

/// The better unstaged replay (`baseline`, `pinned`, `pinned/steal`, by
/// throughput) of `cores` cores in `refs`.
fn unstaged(refs: &[SimResult], cores: usize) -> Option<&SimResult> {
    refs.iter()
        .filter(|b| b.cores == cores && (b.policy == "baseline" || b.mode == "unstaged"))
        .reduce(|a, b| {
            if b.throughput_ipc > a.throughput_ipc {
                b
            } else {
                a
            }
        })
}

/// `(L1i Δ, L2i Δ, ×unstaged)` of `r` against the baseline's misses and
/// the better unstaged model's throughput at the same cores.
fn cell(r: &SimResult, refs: &[SimResult]) -> Option<(f64, f64, f64)> {
    let b = refs
        .iter()
        .find(|b| b.cores == r.cores && b.policy == "baseline")?;
    let u = unstaged(refs, r.cores)?;
    Some((
        r.total.l1i_mpki / b.total.l1i_mpki - 1.0,
        r.total.l2i_mpki / b.total.l2i_mpki - 1.0,
        r.throughput_ipc / u.throughput_ipc,
    ))
}

/// A map's label from its file tag and a result's grouping.
fn map_label(tag: &str, r: &SimResult) -> String {
    let k = r.group_spec.split(';').filter(|g| !g.is_empty()).count();
    match tag {
        "hand" => format!("hand map ({k})"),
        "tbest" => format!("discovered for temporal ({k})"),
        _ => format!("discovered ({k})"),
    }
}

/// The mode `auto` ran last (its last decision's mode).
fn auto_mode(r: &SimResult) -> &str {
    r.auto_decisions
        .last()
        .and_then(|(_, d)| d.split(':').next())
        .unwrap_or("unstaged")
}

/// `auto`'s decisions that kept a mode: `mode at N M instructions`, in order.
fn auto_keeps(r: &SimResult) -> String {
    let v: Vec<String> = r
        .auto_decisions
        .iter()
        .filter(|(_, d)| d.contains(": keep "))
        .map(|(at, d)| {
            let mode = d.split(':').next().unwrap_or("?");
            format!("{mode} at {:.0} M", *at as f64 / 1e6)
        })
        .collect();
    v.join(", ")
}

/// A best cell: (×unstaged, description).
type Best = Option<(f64, String)>;

fn keep_best(best: &mut Best, x: f64, what: impl FnOnce() -> String) {
    if best.as_ref().is_none_or(|(b, _)| x > *b) {
        *best = Some((x, what()));
    }
}

/// Map tags in table order.
fn map_tags(dir: &Path, t: &str) -> Vec<String> {
    let mut tags: Vec<String> = Vec::new();
    for f in input::files_with_prefix(dir, &format!("{t}-t")) {
        // <t>-t<L2>-<mech>-<map>.json
        let rest = f
            .trim_start_matches(&format!("{t}-t"))
            .trim_end_matches(".json");
        let parts: Vec<&str> = rest.split('-').collect();
        if parts.len() >= 3 && MECHANISMS.iter().any(|(m, _)| *m == parts[1]) {
            let tag = parts[2].to_string();
            if !tags.contains(&tag) {
                tags.push(tag);
            }
        }
    }
    tags.sort_by_key(|t| {
        (
            ["hand", "best", "tbest"]
                .iter()
                .position(|x| *x == t.as_str()),
            t.clone(),
        )
    });
    tags
}

/// The section's text from the files in `dir` for `traces`; `notes`:
/// hand-written interpretation.
pub fn section(dir: &Path, traces: &[String], notes: Option<&str>) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "## Temporal staging of MariaDB: visit orders beside spatial staging (issue 40)\n"
    );
    let env = std::fs::read_to_string(dir.join("temporal-env.txt")).unwrap_or_default();
    let _ = writeln!(o, "Written by `just bench-sim --temporal` (`stagesim results --temporal`); a trace whose grid is done is not replayed again by a later invocation (its time is kept), so the traces may come from more than one; the commands are at the end. {}\n", env.trim());
    let _ = writeln!(o, "Temporal staging in the replay: every core keeps a queue per stage and orders its threads' visits with the guest agent's own `guest_agent::visit::Visitor` (the code the test guest's scheduler runs); a thread yields at every stage switch into its core's queue for the stage it enters, paying the mechanism's switch cost; new threads first; an idle core steals a queued thread, and under a visit policy up to half of that stage's other waiting threads with it (the guest's rule), each steal charged as a migration. **temporal** = `pinned` with idle stealing and a visit policy (no migration at stage switches; `auto`'s temporal mode), **spatial** = `static` with load weights (issue 25's model), **both** = `static` with a visit policy (a thread migrates where its core does not serve the new stage, yields where it does). OS model as in issue 25: slices 100 000 × [0.5, 1.5] instructions, threads block at `net_read` for 100 000 cycles on average, cross-core transfers 150 cycles. Each cell: L1i misses / L2 instruction misses against the baseline, and throughput against the **better unstaged model** at the same cores and L2 — `baseline`, `pinned` or `pinned` with idle stealing (the same scheduler as temporal, FIFO order), so neither a gain from affinity nor one from stealing is counted as staging. Cut to fit the hour on one job (`stagesim/bench-sim.sh`, `temporal_trace`): each replay runs the first P % of its trace in replay order (10 % of that warm-up; `auto` and its references run whole laps); all five visit policies at 4 cores only, and not on the map discovered for temporal staging; the sched_ext and Linux mechanisms with SRPT only, not at 512 KiB; `both` with SRPT and the unikernel's costs only; `auto` and the switch-cost sweep at 256 KiB and 2 MiB only. Maps: the hand map; `discover --binary`'s best request-level map scored for spatial staging (issue 25's search); and its best map scored by the temporal replay (`discover --binary --policy pinned --visit srpt`: up to 6 stages of ≥ 5 % of a request each). Mechanisms:\n");
    for (tag, label) in MECHANISMS {
        let _ = writeln!(o, "- `{tag}`: {label}");
    }
    let _ = writeln!(o, "\nThe seeds and earlier results, for comparison: cohort scheduling (Larus & Parkes 2002; seed 002 §2.4.2) −50 % L2 misses, up to +20 % throughput; seed 000 −65 % L2 code misses, 1.22× (spatial, 6 cores, 256 KiB L2); seed 004 −52.3 % L2 misses, 1.086× (spatial, 4 cores, 256 KiB L2); our test guest on 2 cores (bench/RESULTS.md, shape `temporal`): temporal G 0.87–0.99 with 4 stages; issue 25's spatial verdict on these traces: 0.97–1.06× at best.\n");
    for t in traces {
        write_trace(&mut o, dir, t);
    }
    write_sweep(&mut o, dir, traces);
    if let Some(n) = notes {
        let _ = writeln!(o, "### What it means (issue 40)\n\n{}\n", n.trim());
    }
    let commands = std::fs::read_to_string(dir.join("temporal-commands.txt")).unwrap_or_default();
    if !commands.trim().is_empty() {
        let _ = writeln!(
            o,
            "### Commands (this run)\n\n```sh\n{}\n```",
            commands.trim()
        );
    }
    o
}

/// One trace's tables, best cells and `auto` line.
fn write_trace(o: &mut String, dir: &Path, t: &str) {
    let tags = map_tags(dir, t);
    if tags.is_empty() {
        return;
    }
    let _ = writeln!(o, "### {}\n", short_trace(t));
    let mut best_t: Vec<(u32, Best)> = Vec::new();
    let mut best_s: Vec<(u32, Best)> = Vec::new();
    let mut auto_lines = Vec::new();
    for l2 in L2_KIB {
        let refs = results(dir, &format!("{t}-t{l2}-ref.json"));
        if refs.is_empty() {
            continue;
        }
        let base: Vec<String> = CORES
            .iter()
            .filter_map(|c| {
                let b = refs
                    .iter()
                    .find(|r| r.policy == "baseline" && r.cores == *c)?;
                let u = unstaged(&refs, *c)?;
                Some(format!(
                    "{c} cores {:.2} / {:.2} MPKI, better unstaged `{}` ({:.2}× baseline)",
                    b.total.l1i_mpki,
                    b.total.l2i_mpki,
                    u.label,
                    u.throughput_ipc / b.throughput_ipc
                ))
            })
            .collect();
        let _ = writeln!(
            o,
            "**L2 {l2} KiB** — baseline L1i / L2i: {}\n",
            base.join("; ")
        );
        let _ = writeln!(
            o,
            "| map | mechanism | mode | visit | 2 cores | 4 | 6 | 8 |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|");
        let (mut bt, mut bs): (Best, Best) = (None, None);
        for tag in &tags {
            for (mech, _) in MECHANISMS {
                // `<mech>-<map>.json` and its `-v` (more visit policies)
                // and `-s` (spatial, both) parts.
                let rs: Vec<SimResult> = ["", "-v", "-s"]
                    .iter()
                    .flat_map(|x| results(dir, &format!("{t}-t{l2}-{mech}-{tag}{x}.json")))
                    .collect();
                let mut rows: Vec<(String, String)> = rs
                    .iter()
                    .map(|r| (r.mode.clone(), r.visit.clone()))
                    .collect();
                rows.sort_by_key(|(m, v)| {
                    let order = ["temporal", "spatial", "both"];
                    (order.iter().position(|x| *x == m.as_str()), v.clone())
                });
                rows.dedup();
                for (mode, visit) in rows {
                    let Some(first) = rs.iter().find(|r| r.mode == mode && r.visit == visit) else {
                        continue;
                    };
                    let label = map_label(tag, first);
                    let mut row = format!("| {label} | {mech} | {mode} | {visit} |");
                    for cores in CORES {
                        let r = rs
                            .iter()
                            .find(|r| r.mode == mode && r.visit == visit && r.cores == cores);
                        match r.and_then(|r| Some((r, cell(r, &refs)?))) {
                            Some((_, (d1, d2, x))) => {
                                let _ = write!(
                                    row,
                                    " {:+.0} / {:+.0} % / {x:.2}× |",
                                    d1 * 100.0,
                                    d2 * 100.0
                                );
                                let what = || {
                                    format!("{label}, {mech}, {mode} {visit}, {cores} cores, L1i {:+.0} %, L2i {:+.0} %", d1 * 100.0, d2 * 100.0)
                                };
                                match mode.as_str() {
                                    "temporal" => keep_best(&mut bt, x, what),
                                    "spatial" => keep_best(&mut bs, x, what),
                                    _ => {}
                                }
                            }
                            None => row.push_str(" – |"),
                        }
                    }
                    let _ = writeln!(o, "{row}");
                }
                let autos = results(dir, &format!("{t}-t{l2}-{mech}-{tag}-auto.json"));
                let refs4 = results(dir, &format!("{t}-t{l2}-ref4.json"));
                for r in &autos {
                    if let Some((d1, d2, x)) = cell(r, &refs4) {
                        auto_lines.push(format!(
                            "{}, {mech}, {} cores, {l2} KiB, {} laps ({:.0} M instructions): ends **{}** ({:+.0} / {:+.0} %, {x:.2}×); kept {}",
                            map_label(tag, r),
                            r.cores,
                            r.repeat,
                            (r.warmup_instrs + r.total.counters.instrs) as f64 / 1e6,
                            auto_mode(r),
                            d1 * 100.0,
                            d2 * 100.0,
                            auto_keeps(r)
                        ));
                    }
                }
            }
        }
        let _ = writeln!(o);
        best_t.push((l2, bt));
        best_s.push((l2, bs));
    }
    for (l2, b) in &best_t {
        if let Some((x, what)) = b {
            let _ = writeln!(
                o,
                "- best **temporal** cell, {l2} KiB: **{x:.2}×** ({what})"
            );
        }
    }
    for (l2, b) in &best_s {
        if let Some((x, what)) = b {
            let _ = writeln!(o, "- best **spatial** cell, {l2} KiB: **{x:.2}×** ({what})");
        }
    }
    if !auto_lines.is_empty() {
        let _ = writeln!(o, "- `auto` trialling unstaged, temporal (SRPT), spatial and both (host-sched's code; against the references over the same laps):");
        for l in auto_lines {
            let _ = writeln!(o, "  - {l}");
        }
    }
    let _ = writeln!(o);
}

/// The switch-cost sweep: ×unstaged per cost and the break-even.
fn write_sweep(o: &mut String, dir: &Path, traces: &[String]) {
    let mut rows = Vec::new();
    let mut costs: Vec<u64> = Vec::new();
    for t in traces {
        for f in input::files_with_prefix(dir, &format!("{t}-tsweep-")) {
            let rest = f
                .trim_start_matches(&format!("{t}-tsweep-"))
                .trim_end_matches(".json");
            let Some((l2, tag)) = rest.split_once('-') else {
                continue;
            };
            let refs = results(dir, &format!("{t}-t{l2}-ref.json"));
            let rs = results(dir, &f);
            let mut keys: Vec<(usize, String)> =
                rs.iter().map(|r| (r.cores, r.visit.clone())).collect();
            keys.sort();
            keys.dedup();
            for (cores, visit) in keys {
                let mut pts: Vec<(f64, f64)> = rs
                    .iter()
                    .filter(|r| r.cores == cores && r.visit == visit)
                    .filter_map(|r| Some((r.switch_cycles as f64, cell(r, &refs)?.2)))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                costs.extend(pts.iter().map(|p| p.0 as u64));
                let label = rs.first().map_or_else(String::new, |r| map_label(tag, r));
                rows.push((
                    format!(
                        "{} | {l2} KiB | {cores} | {label} | {visit}",
                        short_trace(t)
                    ),
                    pts,
                ));
            }
        }
    }
    if rows.is_empty() {
        return;
    }
    costs.sort_unstable();
    costs.dedup();
    let _ = writeln!(o, "### Switch cost: where temporal staging stops paying\n");
    let _ = writeln!(o, "Temporal (`pinned` with idle stealing and a visit policy; steals charged as the unikernel's migrations) with the switch cost swept, ×unstaged (the better unstaged model, as above); *break-even* is the cost at which it falls to 1 (linear between the costs measured; \"none\": below 1 even with free switches; \"above\": ≥ 1 at every cost). 1 µs = 2500 cycles.\n");
    let mut head = "| trace | L2 | cores | map | visit |".to_string();
    for c in &costs {
        let _ = write!(head, " {c} |");
    }
    head.push_str(" break-even |");
    let _ = writeln!(o, "{head}");
    let _ = writeln!(o, "|{}", "---|".repeat(6 + costs.len()));
    for (key, pts) in rows {
        let mut row = format!("| {key} |");
        for c in &costs {
            match pts.iter().find(|p| p.0 as u64 == *c) {
                Some((_, x)) => {
                    let _ = write!(row, " {x:.3} |");
                }
                None => row.push_str(" – |"),
            }
        }
        let be = match break_even(&pts) {
            BreakEven::Below => "none".to_string(),
            BreakEven::Above => "above".to_string(),
            BreakEven::At(c) => format!("≈ {c:.0} ({:.2} µs)", c / 2500.0),
        };
        let _ = writeln!(o, "{row} {be} |");
    }
    let _ = writeln!(o);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_keeps_everything_outside_its_markers() {
        let main = "# r\n<!-- stagesim:begin x -->\nmain\n<!-- stagesim:end -->\ntail\n";
        let once = splice(main, "t1");
        assert_eq!(once, format!("{}\n\n{BEGIN}\nt1\n{END}\n", main.trim_end()));
        let twice = splice(&once, "t2\n");
        assert_eq!(
            twice,
            format!("{}\n\n{BEGIN}\nt2\n{END}\n", main.trim_end())
        );
        // The main section's splice leaves this one alone.
        let main_again = super::super::splice(&twice, "main2");
        assert!(main_again.contains(&format!("{BEGIN}\nt2\n{END}")));
        assert!(main_again.contains("main2"));
    }
}
