//! Row tables of replay results in the results section: the model variants
//! (`<trace>-variants*.json`), the seeds' 256 KiB L2 (`<trace>-l2-256.json`),
//! footprint-host, and the time-slice table of `baseline`.

use std::fmt::Write as _;

use super::input::{self, baseline, files_with_prefix, pct, ratios, short_trace, GroupNames};
use super::Ctx;
use crate::report::Report;

/// `new` MPKI with its change against `base`: `12.34 | +5 %`.
fn mpki_delta(new: f64, base: f64) -> String {
    format!("{new:.2} | {}", pct(new, base))
}

/// The model-variant tables.
pub(super) fn write_variants(o: &mut String, ctx: &Ctx) {
    for t in ctx.traces {
        let files = files_with_prefix(ctx.dir, &format!("{t}-variants"));
        let docs: Vec<Report> = files
            .iter()
            .filter_map(|n| input::load(ctx.dir, n))
            .collect();
        if docs.is_empty() {
            continue;
        }
        let gn = GroupNames::new(ctx.dir, t);
        let _ = writeln!(
            o,
            "### Model variants ({}, not host-sched defaults)\n",
            short_trace(t)
        );
        let _ = writeln!(o, "`/load-weights`: static with budgets weighted by each group's share of the trace's instructions (a profile). `/steal`: idle cores take queued threads whose stage they serve (Linux's idle balancing within the affinity mask libstage sets). `/min-visit N oracle|history`: migrate only into visits of ≥ N instructions — `oracle` reads the visit's length ahead in the trace (an upper bound, not implementable), `history` predicts it from the stage's past visits. Slice 100 000.\n");
        let _ = writeln!(o, "| cores | model | stages | migr. cycles | L1i MPKI | L2i MPKI | L1d MPKI | migr./kI | kept/kI | util | ×base sim | ×base CPU |\n|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let mut shown_base = false;
        for d in &docs {
            let all = &d.results;
            for r in all {
                if r.policy == "baseline" {
                    if shown_base {
                        continue;
                    }
                    shown_base = true;
                }
                let Some(b) = baseline(all, r) else { continue };
                let tt = &r.total;
                let (sim, cpu) = ratios(r, b);
                let instrs = (tt.counters.instrs as f64).max(1.0);
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} |",
                    r.cores,
                    r.label,
                    gn.short(&r.group_spec),
                    r.migration_cycles,
                    tt.l1i_mpki,
                    tt.l2i_mpki,
                    tt.l1d_mpki,
                    tt.migrations_pki,
                    tt.counters.kept as f64 * 1000.0 / instrs,
                    r.utilization,
                    sim,
                    cpu
                );
            }
        }
        let _ = writeln!(o);
    }
}

/// The table with the seeds' L2 (256 KiB).
pub(super) fn write_l2(o: &mut String, ctx: &Ctx) {
    let mut wrote_l2 = false;
    for t in ctx.traces {
        let Some(v) = input::load::<Report>(ctx.dir, &format!("{t}-l2-256.json")) else {
            continue;
        };
        let gn = GroupNames::new(ctx.dir, t);
        if !wrote_l2 {
            let _ = writeln!(o, "### With the seeds' L2 (256 KiB, 8-way, as on seed 000's Xeon E5-2618L v3 and seed 004's E5-2620 v4)\n");
            let _ = writeln!(o, "| trace | cores | model | stages | migr. cycles | L1i MPKI | ΔL1i | L2i MPKI | ΔL2i | L2d MPKI | util | ×base sim | ×base CPU |\n|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
            wrote_l2 = true;
        }
        let all = &v.results;
        for r in all {
            let Some(b) = baseline(all, r) else { continue };
            let (tt, bt) = (&r.total, &b.total);
            let (sim, cpu) = ratios(r, b);
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                short_trace(t),
                r.cores,
                r.label,
                gn.short(&r.group_spec),
                r.migration_cycles,
                mpki_delta(tt.l1i_mpki, bt.l1i_mpki),
                mpki_delta(tt.l2i_mpki, bt.l2i_mpki),
                tt.l2d_mpki,
                r.utilization,
                sim,
                cpu
            );
        }
    }
    if wrote_l2 {
        let _ = writeln!(o);
    }
}

/// The tables of the traces that are not MariaDB (footprint-host).
pub(super) fn write_footprint(o: &mut String, ctx: &Ctx) {
    for (t, v) in &ctx.mains {
        if t.starts_with("mariadb") {
            continue;
        }
        let all = &v.results;
        let _ = writeln!(o, "### `{t}` (the headline workload built for the host)\n");
        let _ = writeln!(o, "{} instructions (the whole trace; shorter than the MariaDB traces), {} threads, stages {}.\n", v.trace_instrs, v.threads, v.stages.join(", "));
        let _ = writeln!(o, "| cores | policy | L1i MPKI | ΔL1i | L2i MPKI | ΔL2i | L1d MPKI | migr./kI | util | ×base sim | ×base CPU |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for cores in [2usize, 4] {
            for r in all
                .iter()
                .filter(|r| r.cores == cores && r.slice == 100_000)
            {
                let Some(b) = baseline(all, r) else { continue };
                let (tt, bt) = (&r.total, &b.total);
                let (sim, cpu) = ratios(r, b);
                let _ = writeln!(
                    o,
                    "| {cores} | {} | {} | {} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2} |",
                    r.label,
                    mpki_delta(tt.l1i_mpki, bt.l1i_mpki),
                    mpki_delta(tt.l2i_mpki, bt.l2i_mpki),
                    tt.l1d_mpki,
                    tt.migrations_pki,
                    r.utilization,
                    sim,
                    cpu
                );
            }
        }
        let _ = writeln!(o);
    }
}

/// MPKI of `baseline` per time slice.
pub(super) fn write_slices(o: &mut String, ctx: &Ctx) {
    let _ = writeln!(o, "### Time slice (baseline)\n");
    let _ = writeln!(o, "| trace | cores | slice | L1i MPKI | L2i MPKI | L1d MPKI | L2d MPKI | IPC |\n|---|---:|---:|---:|---:|---:|---:|---:|");
    for (t, v) in &ctx.mains {
        for r in v
            .results
            .iter()
            .filter(|r| r.policy == "baseline" && [4, 8].contains(&r.cores))
        {
            let tt = &r.total;
            let _ = writeln!(
                o,
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                short_trace(t),
                r.cores,
                r.slice,
                tt.l1i_mpki,
                tt.l2i_mpki,
                tt.l1d_mpki,
                tt.l2d_mpki,
                tt.ipc
            );
        }
    }
    let _ = writeln!(o, "\nThe traces have a fixed number of connections (16), so the thread count is not varied here; `stagesim synth --threads N` varies it on synthetic traces.\n");
}
