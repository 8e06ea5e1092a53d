//! The tables of `open-bench`: per shape and vCPU count, the closed loop's
//! throughput and the open loop's rate, CPU per request and latency at each
//! load, every cell beside the better unstaged cell of the same round, and
//! the native references.

use std::fmt::Write as _;
use std::time::Duration;

use stagevm_bench::stats::{median, Spread};

use crate::runs::Run;
use crate::{Args, Cell, Shape, Sweep};

/// What the tables and targets read.
pub struct View<'a> {
    /// The command line.
    pub args: &'a Args,
    /// The shapes.
    pub shapes: &'a [Shape],
    /// The cells.
    pub cells: &'a [Cell],
    /// The runs.
    pub sweep: &'a Sweep,
}

impl View<'_> {
    /// The runs of a cell (empty if it did not run).
    pub fn runs(&self, i: usize, v: u32, load: u32, cell: &str) -> &[Run] {
        self.sweep
            .runs
            .get(&(i, v, load, cell.to_string()))
            .map_or(&[], Vec::as_slice)
    }

    /// The unstaged cells.
    fn unstaged(&self) -> impl Iterator<Item = &Cell> {
        self.cells.iter().filter(|c| c.unstaged())
    }

    /// Per round, the better unstaged cell's run: the higher rate closed
    /// loop (`load` 0), the lower CPU per request open loop.
    pub fn reference(&self, i: usize, v: u32, load: u32) -> Vec<Run> {
        let rounds = self.args.rounds;
        (0..rounds)
            .filter_map(|r| {
                self.unstaged()
                    .filter_map(|c| self.runs(i, v, load, &c.label).get(r))
                    .min_by(|a, b| {
                        if load == 0 {
                            b.rps.total_cmp(&a.rps)
                        } else {
                            a.cpu_us.total_cmp(&b.cpu_us)
                        }
                    })
                    .cloned()
            })
            .collect()
    }

    /// Per round, `cell`'s figure over the better unstaged cell's (`f` of
    /// each run).
    pub fn ratio(&self, i: usize, v: u32, load: u32, cell: &str, f: fn(&Run) -> f64) -> Vec<f64> {
        self.runs(i, v, load, cell)
            .iter()
            .zip(self.reference(i, v, load))
            .map(|(a, b)| f(a) / f(&b))
            .collect()
    }

    /// Per round, how `cell` does against the better unstaged cell by the
    /// loop's measure, ≥ 1 better: throughput ratio closed loop, the
    /// unstaged CPU per request over the cell's open loop.
    pub fn score(&self, i: usize, v: u32, load: u32, cell: &str) -> Vec<f64> {
        if load == 0 {
            self.ratio(i, v, 0, cell, |r| r.rps)
        } else {
            self.ratio(i, v, load, cell, |r| r.cpu_us)
                .into_iter()
                .map(|x| 1.0 / x)
                .collect()
        }
    }
}

fn med(v: Vec<f64>) -> String {
    let m = median(v);
    if m.is_finite() {
        format!("{m:.1}")
    } else {
        "-".into()
    }
}

/// `auto`'s decisions over the rounds: `spatial by CPU per request ×3,
/// unstaged by latency bound ×2`.
fn decisions(runs: &[Run]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for r in runs.iter().filter(|r| !r.auto_kept.is_empty()) {
        let what = format!("{} by {}", r.auto_kept, r.decided_by);
        match counts.iter_mut().find(|(w, _)| *w == what) {
            Some((_, n)) => *n += 1,
            None => counts.push((what, 1)),
        }
    }
    let staged = median(runs.iter().map(|r| r.staged_share).collect());
    let mut s: Vec<String> = counts.iter().map(|(w, n)| format!("{w} ×{n}")).collect();
    if staged.is_finite() {
        s.push(format!(
            "staged {:.0} % of the steady periods",
            staged * 100.0
        ));
    }
    if s.is_empty() {
        "-".into()
    } else {
        s.join("; ")
    }
}

fn closed(s: &mut String, view: &View, i: usize, v: u32) {
    let _ = writeln!(
        s,
        "\nClosed loop, {v} vCPUs (steady throughput; latency: the VMM's timed requests):\n"
    );
    let _ = writeln!(
        s,
        "| cell | steady req/s | vs better unstaged | worst round | p50 µs | p99 µs | auto |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|");
    for c in view.cells {
        let runs = view.runs(i, v, 0, &c.label);
        if runs.is_empty() {
            continue;
        }
        let score = Spread::of(&view.score(i, v, 0, &c.label));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.3}× | {} | {} | {} |",
            c.label,
            Spread::of(&runs.iter().map(|r| r.rps).collect::<Vec<_>>()).rate(),
            score.ratio(),
            score.min,
            med(runs.iter().map(|r| r.p50_us).collect()),
            med(runs.iter().map(|r| r.p99_us).collect()),
            decisions(runs)
        );
    }
}

fn open(s: &mut String, view: &View, i: usize, v: u32, load: u32) {
    let cap = view.sweep.capacity[&(i, v)];
    let rate = cap * f64::from(load) / 100.0;
    let _ = writeln!(
        s,
        "\nOpen loop, {v} vCPUs, {load} % of the unstaged capacity ({rate:.0} requests/s, Poisson; the native references at the {} vCPUs' rate):\n",
        view.args.vcpus[0]
    );
    let _ = writeln!(s, "| cell | achieved req/s | CPU µs/request | vs better unstaged | worst round | p50 µs | p99 µs | p99 vs unstaged | dropped | auto |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for (m, name) in ["native whole", "native spatial"].iter().enumerate() {
        let first = view.args.vcpus[0];
        let Some(runs) = view.sweep.native_open.get(&(i, first, load, m)) else {
            continue;
        };
        let q = |q: f64| {
            med(runs
                .iter()
                .map(|r| r.latency.quantile(q).unwrap_or(f64::NAN) / 1e3)
                .collect())
        };
        let _ = writeln!(
            s,
            "| {name} | {} | {} | – | – | {} | {} | – | {} | – |",
            Spread::of(&runs.iter().map(|r| r.rps).collect::<Vec<_>>()).rate(),
            Spread::of(
                &runs
                    .iter()
                    .map(|r| r.cpu_per_request_us)
                    .collect::<Vec<_>>()
            )
            .plain(2),
            q(0.5),
            q(0.99),
            median(runs.iter().map(|r| r.dropped as f64).collect())
        );
    }
    for c in view.cells {
        let runs = view.runs(i, v, load, &c.label);
        if runs.is_empty() {
            continue;
        }
        let cpu = Spread::of(&view.ratio(i, v, load, &c.label, |r| r.cpu_us));
        let p99 = Spread::of(&view.ratio(i, v, load, &c.label, |r| r.p99_us));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.3}× | {} | {} | {} | {} | {} |",
            c.label,
            Spread::of(&runs.iter().map(|r| r.rps).collect::<Vec<_>>()).rate(),
            Spread::of(&runs.iter().map(|r| r.cpu_us).collect::<Vec<_>>()).plain(2),
            cpu.ratio(),
            cpu.max,
            med(runs.iter().map(|r| r.p50_us).collect()),
            med(runs.iter().map(|r| r.p99_us).collect()),
            p99.ratio(),
            median(runs.iter().map(|r| r.dropped as f64).collect()),
            decisions(runs)
        );
    }
}

/// The report's tables: machine, command and method, then per shape and
/// vCPU count the closed loop and each load.
pub fn report(view: &View, elapsed: Duration, others: f64) -> String {
    let a = view.args;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Open loop: CPU per request, throughput and tail latency (issue 35)\n"
    );
    let _ = writeln!(
        s,
        "Machine: {}.\nBackground load: other processes used {others:.2} cores on average during the sweep.",
        stagevm_bench::machine()
    );
    let _ = writeln!(
        s,
        "Command: `open-bench --shapes {} --vcpus {} --loads {} --cells {} --rounds {} --seconds {} --open-seconds {} --threads {} --queue {} --section {}{}` (`just bench-open`), {:.1} min; median (min–max) of {} interleaved rounds, ratios per round against the better unstaged cell of the same round (closed loop: the higher throughput of `off`/`pinned`; open loop: the lower CPU per request), and each cell's worst round.\n",
        a.shapes.join(","),
        a.vcpus.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        a.loads.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        a.cells.join(","),
        a.rounds,
        a.seconds,
        a.open_seconds,
        a.threads,
        a.queue,
        a.section,
        if a.no_closed { " --no-closed" } else { "" },
        elapsed.as_secs_f64() / 60.0,
        a.rounds
    );
    let _ = writeln!(
        s,
        "Open loop: requests arrive in a Poisson process at the load's rate into a queue of {} (a full queue drops them); threads wait for them off the run queues. Achieved rate: requests completed over the time from the first arrival to the last completion. CPU µs/request: the vCPU threads' CPU time less the guest's idle spinning, over the requests, in the middle 80 % of the run's policy periods (the VMM's timeline; docs/design.md, \"CPU per request\"). Latency: from arrival to `stage_exit` of the steady 10–90 % of the requests, every one (the guest's own; bucket midpoints, ≤ 6.25 % error). The native references run the same requests on the same schedule on two host cores, whole (either core takes the next arrival) or spatial (one core per half of the stages); their CPU is the cores' busy time.",
        a.queue
    );
    for (i, shape) in view.shapes.iter().enumerate() {
        let p = &shape.params;
        let _ = writeln!(
            s,
            "\n### Shape {}: {} KiB of code, {} stages × {} calls, {} data words per thread\n",
            shape.name,
            shape.code_kib(),
            p.stages,
            p.calls,
            p.data_words
        );
        let w = Spread::of(&shape.native[0]);
        let sp = Spread::of(&shape.native[1]);
        let gain: Vec<f64> = shape.native[1]
            .iter()
            .zip(&shape.native[0])
            .map(|(s, w)| s / w)
            .collect();
        let _ = writeln!(
            s,
            "Native closed loop (2 cores): whole {} requests/s, spatial {} ({}).",
            w.rate(),
            sp.rate(),
            Spread::of(&gain).ratio()
        );
        for &v in &a.vcpus {
            let _ = writeln!(
                s,
                "\nUnstaged capacity at {v} vCPUs (sizing runs): {:.0} requests/s.",
                view.sweep.capacity[&(i, v)]
            );
            if !a.no_closed {
                closed(&mut s, view, i, v);
            }
            for &load in &a.loads {
                open(&mut s, view, i, v, load);
            }
        }
    }
    s
}
