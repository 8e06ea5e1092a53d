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
//!
//! Files: `mod.rs` — the markers, the splice and [`section`], which calls
//! one writer per part: `overview.rs` (traces, replay speed, model),
//! `policies.rs` (issue 16: the baseline against the independent
//! simulation, every model at 2/4/8 cores with both L2 sizes, groupings and
//! migration costs, `auto`'s choice, the acceptance lines), `sweep.rs`
//! (migration cost × grouping, stage visits), `tables.rs` (model variants,
//! footprint-host), `discovery.rs` (stage discovery), `verdict.rs` (issue
//! 25: where staging a database pays), `temporal.rs` (issue 40: temporal
//! staging, a section of its own), `input.rs` (the typed
//! JSON inputs and shared helpers).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;

use crate::report::Report;

mod discovery;
mod input;
mod overview;
mod policies;
mod sweep;
mod tables;
pub mod temporal;
mod verdict;

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

/// What every part of the section reads.
struct Ctx<'a> {
    /// The results folder.
    dir: &'a Path,
    /// Trace names (file stems) in table order.
    traces: &'a [String],
    /// The main replay report of each trace that has one.
    mains: Vec<(String, Report)>,
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
    let commands = std::fs::read_to_string(dir.join("commands.txt")).unwrap_or_default();
    let ctx = Ctx {
        dir,
        traces,
        mains: traces
            .iter()
            .filter_map(|t| Some((t.clone(), input::load(dir, &format!("{t}.json"))?)))
            .collect(),
    };
    overview::write(&mut o, &ctx);
    policies::write(&mut o, &ctx);
    sweep::write_sweep(&mut o, &ctx);
    sweep::write_visits(&mut o, &ctx);
    tables::write_variants(&mut o, &ctx);
    discovery::write(&mut o, &ctx);
    verdict::write(&mut o, &ctx);
    tables::write_footprint(&mut o, &ctx);

    // Plots.
    let _ = writeln!(o, "### Plots\n");
    let _ = writeln!(o, "Checked in: `stagesim/plots/` (copied by the recipe). All of them: `target/stagesim/plots/` — per trace `<trace>-{{l1i-mpki,l2i-mpki,l2d-mpki,throughput}}.png` (policies × 2/4/8/16 cores × three slices) and `<trace>-sweep-*.png` (migration-cost sweep).\n");
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
