//! The stage-discovery part of the results section
//! (`<trace>-discover.json`): the chosen grouping per group count.

use std::fmt::Write as _;

use super::input::{self, short_trace, DiscoverFile};
use super::Ctx;

/// The discovery tables.
pub(super) fn write(o: &mut String, ctx: &Ctx) {
    let mut wrote_disc = false;
    for t in ctx.traces {
        let Some(v) = input::load::<DiscoverFile>(ctx.dir, &format!("{t}-discover.json")) else {
            continue;
        };
        if !wrote_disc {
            let _ = writeln!(
                o,
                "### Stage discovery by merging the hand map's stages (issue 16)\n"
            );
            let _ = writeln!(o, "Seed 004 picks migration points by simulating candidate splits and keeping the one with the fewest misses. `stagesim discover` does this over the migration points the trace has — the 9 stages' entry functions — by greedy merging: from 9 groups, simulate every merge of two groups and keep the best, down to 1 group; every candidate replays the same first part of every thread's stream. Where several group counts show the same score, the extra merges joined groups that shared the victim core anyway. It looks for no new migration points, so it refines the hand map's granularity; seed 004's request-level search over the traced binary's function entries (`stagesim discover --binary`, issue 25) is in the verdict below.\n");
            wrote_disc = true;
        }
        let _ = writeln!(
            o,
            "**{}**: candidates replayed under {} (load weights) at {} cores, slice {}, {} migration cycles, score `{}` (cpi = busy cycles per instruction), each on the first {} % of every thread's stream ({:.0} M instructions, {} % of them warm-up); {} replays in {:.0} s. The chosen grouping per group count:\n",
            short_trace(t),
            v.policy,
            v.cores,
            v.slice,
            v.migration_cycles,
            v.objective,
            v.prefix_pct,
            v.prefix_instrs as f64 / 1e6,
            v.warmup_pct,
            v.steps.iter().map(|s| s.candidates).sum::<usize>(),
            v.seconds
        );
        let _ = writeln!(o, "| groups | CPI | L1i MPKI | L2i MPKI | L1d MPKI | migr./kI | grouping |\n|---:|---:|---:|---:|---:|---:|---|");
        for st in &v.steps {
            let tt = &st.result.total;
            let _ = writeln!(
                o,
                "| {} | {:.3} | {:.2} | {:.2} | {:.2} | {:.3} | `{}` |",
                st.k,
                1.0 / tt.ipc,
                tt.l1i_mpki,
                tt.l2i_mpki,
                tt.l1d_mpki,
                tt.migrations_pki,
                st.spec
                    .split(';')
                    .map(|g| g.split('=').nth(1).unwrap_or(g).replace(',', "+"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
        }
        let _ = writeln!(o);
    }
}
