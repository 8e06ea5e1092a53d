//! Row tables of replay results in the results section: the model variants
//! (`<trace>-variants*.json`) and footprint-host (the seeds' 256 KiB L2 is
//! in `policies.rs`).

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
