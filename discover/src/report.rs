//! The report `stagevm-discover` prints: what was traced, what the
//! discovery chose, and what the model predicts on this host — said plainly
//! when staging is not expected to pay.

use std::fmt::Write as _;
use std::path::Path;

use crate::model::{Discovery, Mechanism, Prediction, Route, L2, MIN_PRESENT_PCT, PAYS_AT};

/// What the report is about.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    /// The binary.
    pub binary: &'a Path,
    /// The request marker's name.
    pub request: &'a str,
    /// Instructions traced.
    pub instrs: u64,
    /// Threads in the trace.
    pub threads: usize,
    /// Seconds the load ran.
    pub load_seconds: f64,
    /// The modelled cores.
    pub cores: usize,
    /// The modelled L2.
    pub l2: L2,
    /// The mechanism modelled and its cost.
    pub route: &'a Route,
    /// The stage-map file written.
    pub map: &'a Path,
}

/// The verdict line for a throughput ratio `tput` (staged ÷ the better
/// unstaged model) of staging by `how` (the mechanism in a few words,
/// [`Route::short`]).
pub fn verdict(tput: f64, how: &str) -> String {
    if tput >= PAYS_AT {
        format!(
            "the model expects {how} to pay on this host: {:+.1} % throughput",
            (tput - 1.0) * 100.0
        )
    } else if tput > 1.0 / PAYS_AT {
        format!(
            "the model expects {how} to break even on this host ({:+.1} % throughput): \
             not worth it; `auto` would keep it unstaged",
            (tput - 1.0) * 100.0
        )
    } else {
        format!(
            "the model does NOT expect {how} to pay on this host: {:.1} % less throughput; \
             `auto` would keep it unstaged",
            (1.0 - tput) * 100.0
        )
    }
}

/// The report's text.
pub fn render(f: &Facts<'_>, d: &Discovery, p: &Prediction) -> String {
    let mut o = String::new();
    let name = f
        .binary
        .file_name()
        .map_or("server".into(), |n| n.to_string_lossy());
    let _ = writeln!(o, "stagevm-discover: {} ({})", name, f.binary.display());
    let _ = writeln!(
        o,
        "  traced:      {} requests (marker {}) in {} instructions, {} threads, {:.1} s of load",
        d.requests, f.request, f.instrs, f.threads, f.load_seconds
    );
    let _ = writeln!(
        o,
        "  candidates:  {} functions called at most once in ≥ {} % of requests ({:.0} instructions per request)",
        d.candidates, MIN_PRESENT_PCT, d.request_instrs
    );
    let _ = writeln!(o, "  chosen:      {} stages, starting at", d.parts);
    for (i, s) in d.points.iter().enumerate() {
        let _ = writeln!(o, "                s{i}: {s}");
    }
    let per_visit = if d.visits_per_request > 0.0 {
        d.request_instrs / d.visits_per_request
    } else {
        0.0
    };
    let _ = writeln!(
        o,
        "  visits:      {:.1} per request, {:.0} instructions per visit",
        d.visits_per_request, per_visit
    );
    let better = p.better_unstaged();
    let _ = writeln!(
        o,
        "  model:       {} cores, L2 {} KiB {}-way, {}:",
        f.cores,
        f.l2.kib,
        f.l2.ways,
        f.route.describe()
    );
    let _ = writeln!(
        o,
        "                L2 instruction misses {:.2} → {:.2} per 1000 instructions ({:.2}× the OS-like baseline)",
        p.baseline.total.l2i_mpki,
        p.staged.total.l2i_mpki,
        p.l2i_ratio()
    );
    let moves = match f.route.mechanism {
        Mechanism::Temporal => "stage switches",
        _ => "migrations",
    };
    let _ = writeln!(
        o,
        "                L1i misses {:.2} → {:.2} per 1000 instructions; {moves} {:.3} per 1000",
        p.baseline.total.l1i_mpki,
        p.staged.total.l1i_mpki,
        p.moves_pki()
    );
    let _ = writeln!(
        o,
        "                throughput {:.3}× the better unstaged model ({})",
        p.throughput_ratio(),
        better.policy
    );
    let _ = writeln!(
        o,
        "  verdict:     {}",
        verdict(p.throughput_ratio(), f.route.short())
    );
    let file = f
        .map
        .file_name()
        .map_or("MAP".into(), |n| n.to_string_lossy());
    let _ = match f.route.mechanism {
        Mechanism::Temporal => writeln!(
            o,
            "  wrote {}: check it with `stagectl --map-file`; run the server under it with \
             LD_PRELOAD=libstagevm_preload.so STAGEVM_STAGEMAP={file} STAGEVM_GATE=temporal \
             (guest-agent/preload/README.md), or in a stagevm guest with the same library, \
             where the host's `auto` turns the gate on or off",
            f.map.display(),
        ),
        _ => writeln!(
            o,
            "  wrote {}: check it with `stagectl --map-file`, attach it in the guest with \
             `stagectl attach --map {file} --binary {}`, and watch `auto` on the host",
            f.map.display(),
            f.binary.display()
        ),
    };
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_says_plainly_when_staging_does_not_pay() {
        let how = "temporal staging (the preload library's gate)";
        assert!(verdict(1.10, how)
            .contains("expects temporal staging (the preload library's gate) to pay"));
        assert!(verdict(1.00, how).contains("break even"));
        assert!(verdict(0.50, how).contains("does NOT expect temporal staging"));
        assert!(verdict(0.50, how).contains("50.0 % less"));
    }
}
