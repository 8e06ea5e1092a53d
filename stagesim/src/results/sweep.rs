//! The migration-cost × stage-granularity part of the results section: per
//! trace, ×base CPU (×base sim) per migration cost with the break-even
//! cost, and the stage-visit statistics of each grouping.

use std::fmt::Write as _;

use super::input::{self, baseline, ratios, short_trace, GroupNames, StatsEntry};
use super::{break_even, BreakEven, Ctx};
use crate::report::Report;
use crate::sim::SimResult;

/// The migration-cost sweep tables.
pub(super) fn write_sweep(o: &mut String, ctx: &Ctx) {
    let _ = writeln!(o, "\n### Migration cost and stage granularity\n");
    let _ = writeln!(
        o,
        "Cost in cycles at ~2.5 GHz: 500 ≈ 0.2 µs; 1700 ≈ 0.68 µs, the mean migration `just bench-migration` measured between vCPUs that own their cores (this project's own mechanism on this machine); 4250 ≈ 1.7 µs, seed 000's fast migration (the bare-metal IPI propagation it cites); 35 000 ≈ 14 µs ≈ the queue hand-off our test guest measures between vCPUs on this machine (README: \"migration latency 13889 ns\"); libstage's `sched_setaffinity` path in a Linux guest costs 35–115 µs ≈ 90 000–290 000 cycles (guest-agent/linux/README.md; the footprint-host sweep goes that far). *Break-even* is the cost at which ×base CPU falls to 1 (linear between the measured costs); \"none\" means the policy is below baseline even with free migrations.\n"
    );
    for t in ctx.traces {
        let Some(v) = input::load::<Report>(ctx.dir, &format!("{t}-sweep.json")) else {
            continue;
        };
        sweep_table(o, t, &v.results, &GroupNames::new(ctx.dir, t));
    }
}

/// One trace's sweep table and grouping legend.
fn sweep_table(o: &mut String, t: &str, all: &[SimResult], gn: &GroupNames) {
    let costs = crate::report::staged_costs(all);
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
    let mut keys: Vec<(usize, &str, &str)> = Vec::new();
    for r in all {
        let k = (r.cores, r.label.as_str(), r.group_spec.as_str());
        if r.policy != "baseline" && !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (cores, label, groups) in keys {
        let row: Vec<&SimResult> = all
            .iter()
            .filter(|r| r.cores == cores && r.label == label && r.group_spec == groups)
            .collect();
        let mut pts = Vec::new();
        let migr = row.first().map_or(f64::NAN, |r| r.total.migrations_pki);
        let _ = write!(
            o,
            "| {cores} | {label} | {} | {migr:.2} |",
            gn.short(groups)
        );
        for c in &costs {
            match row.iter().find(|r| r.migration_cycles == *c) {
                Some(r) => {
                    let (sim, cpu) =
                        baseline(all, r).map_or((f64::NAN, f64::NAN), |b| ratios(r, b));
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

/// The stage-visit statistics per grouping (`<trace>-stats.json`).
pub(super) fn write_visits(o: &mut String, ctx: &Ctx) {
    for t in ctx.traces {
        let Some(v) = input::load::<Vec<StatsEntry>>(ctx.dir, &format!("{t}-stats.json")) else {
            continue;
        };
        let gn = GroupNames::new(ctx.dir, t);
        let _ = writeln!(o, "**{}** — stage visits (a visit = a thread's run of instructions in one group; every visit of a group the thread's core does not serve starts with a migration):\n", short_trace(t));
        let _ = writeln!(o, "| grouping | group | share % | visits | mean visit | median | 90th pct | code KiB |\n|---|---|---:|---:|---:|---:|---:|---:|");
        for e in &v {
            let st = &e.stats;
            let total = st.instrs as f64;
            let kib = |lines: u64| lines as f64 * st.line_bytes as f64 / 1024.0;
            let glabel = gn.short(&e.grouping.full_spec());
            for g in &st.groups {
                let _ = writeln!(
                    o,
                    "| {glabel} | {} | {:.1} | {} | {:.0} | {} | {} | {:.0} |",
                    g.name,
                    g.instrs as f64 * 100.0 / total,
                    g.visits,
                    g.mean_visit,
                    g.p50_visit,
                    g.p90_visit,
                    kib(g.code_lines)
                );
            }
            let _ = writeln!(
                o,
                "| {glabel} | **all** | 100 | {} | {:.0} | | | {:.0} |",
                st.visits,
                total / (st.visits.max(1) as f64),
                kib(st.code_lines)
            );
        }
        let _ = writeln!(o);
    }
}
