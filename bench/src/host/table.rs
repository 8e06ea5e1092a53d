//! `host-bench`'s table and targets (Markdown, printed and written to
//! `bench/RESULTS.md`).

use std::fmt::Write as _;
use std::time::Duration;

use stagevm_bench::load::BUSY_CORES;
use stagevm_bench::stats::Spread;

use crate::{Args, ModeRun, Vm, MODES};

/// What the report is made of.
pub struct View<'a> {
    /// The command line.
    pub args: &'a Args,
    /// VM A and VM B.
    pub vms: &'a [Vm],
    /// Per mode (as [`MODES`]), one run per round.
    pub runs: &'a [Vec<ModeRun>],
    /// The benchmark's wall time.
    pub elapsed: Duration,
    /// Other processes' load during the run (cores).
    pub others: f64,
}

impl View<'_> {
    /// Per round, mode `m`'s total served ÷ the fixed split's.
    fn ratios(&self, m: usize) -> Vec<f64> {
        self.runs[m]
            .iter()
            .zip(&self.runs[0])
            .map(|(a, f)| a.served() as f64 / f.served().max(1) as f64)
            .collect()
    }

    /// Most core moves a run should need: one to each VM at the start and
    /// at most two per change of the busy VM (the waking one takes a core,
    /// the one going idle gives one).
    fn move_bound(&self) -> u64 {
        2 + 2 * (2 * self.args.windows - 1)
    }

    fn verdict(&self, met: bool) -> &'static str {
        match (met, self.others > BUSY_CORES) {
            (_, true) => "not judged: the machine was busy",
            (true, _) => "**met**",
            (false, _) => "**not met**",
        }
    }
}

fn spread<T: Into<f64> + Copy>(runs: &[ModeRun], f: impl Fn(&ModeRun) -> T) -> Spread {
    Spread::of(&runs.iter().map(|r| f(r).into()).collect::<Vec<_>>())
}

/// The section: setup, one row per mode, targets.
pub fn report(v: &View<'_>) -> String {
    let a = v.args;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Several VMs on the stage cores: stagevm-hostd against a fixed split\n"
    );
    let _ = writeln!(
        s,
        "`just bench-host` (bench/src/host/), {} rounds, {:.0} s, on {}; other processes' load {:.2} cores.\n",
        a.rounds,
        v.elapsed.as_secs_f64(),
        stagevm_bench::machine(),
        v.others
    );
    let _ = writeln!(
        s,
        "Two VMs of {} vCPUs and {} guest threads, `--policy {}`, busy in turn: windows of {} ms, VM A busy in the 1st, 3rd, … and VM B in the 2nd, 4th, … ({} each), open loop (Poisson) at {:.2}× the rate its shape reaches on both cores (measured closed loop in this run), so that one core cannot serve it; queue {}. Modes, rotating in each round: `fixed` (VM A `--stage-cores 0`, VM B `--stage-cores 1`), `hostd` (the daemon's default rules, period {} ms: one core each while there are as many cores as VMs), `hostd+lend` (`lend_when_idle = true`: the idle VM runs on a shared core and the busy one has both), `fixed-api` (a control: the fixed split given with `PUT /api/v1/stages.budgets` once both VMs booted on both cores, as the daemon's VMs start).\n",
        a.vcpus, a.threads, a.policy, a.window_ms, a.windows, a.load, a.queue, a.period_ms
    );
    for (name, vm) in ["A", "B"].iter().zip(v.vms) {
        let _ = writeln!(
            s,
            "- VM {name}: shape `{}`, {:.0} requests/s on both cores, offered {:.0}/s in its windows.",
            vm.shape,
            vm.capacity,
            vm.capacity * a.load
        );
    }
    let _ = writeln!(
        s,
        "\nMedian (min–max) over the rounds; \"× fixed\" is the ratio to the fixed split's total in the same round.\n"
    );
    let _ = writeln!(
        s,
        "| mode | served, both VMs | × fixed | VM A served | VM B served | VM A p99 (µs) | VM B p99 (µs) | dropped | core moves/min | periods waited |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for (m, mode) in MODES.iter().enumerate() {
        let runs = &v.runs[m];
        let ratio = if m == 0 {
            "1".to_string()
        } else {
            Spread::of(&v.ratios(m)).ratio()
        };
        let daemon = |x: String| {
            if mode.starts_with("fixed") {
                "-".to_string()
            } else {
                x
            }
        };
        let _ = writeln!(
            s,
            "| `{mode}` | {} | {ratio} | {} | {} | {} | {} | {} | {} | {} |",
            spread(runs, |r| r.served() as f64).rate(),
            spread(runs, |r| r.vms[0].served as f64).rate(),
            spread(runs, |r| r.vms[1].served as f64).rate(),
            spread(runs, |r| r.vms[0].p99_us).rate(),
            spread(runs, |r| r.vms[1].p99_us).rate(),
            spread(runs, |r| (r.vms[0].dropped + r.vms[1].dropped) as f64).rate(),
            daemon(spread(runs, |r| r.moves_per_min()).plain(1)),
            daemon(spread(runs, |r| (r.vms[0].waited + r.vms[1].waited) as f64).rate()),
        );
    }
    s.push_str(&targets(v));
    s
}

/// H1–H3, met / not met.
pub fn targets(v: &View<'_>) -> String {
    let lend = Spread::of(&v.ratios(2));
    let exclusive = Spread::of(&v.ratios(1));
    let bound = v.move_bound();
    let moves = |m: usize| spread(&v.runs[m], |r| (r.vms[0].moves + r.vms[1].moves) as f64);
    let (moves_excl, moves_lend) = (moves(1), moves(2));
    let mut s = String::new();
    let _ = writeln!(s, "\n| target | measured | verdict |\n|---|---|---|");
    let _ = writeln!(
        s,
        "| H1: the daemon with lending serves at least the fixed split's requests (median of the per-round ratios ≥ 1.00) | {} | {} |",
        lend.ratio(),
        v.verdict(lend.med >= 1.0)
    );
    let _ = writeln!(
        s,
        "| H2: the daemon with its default rules serves at least the fixed split's requests, within the rounds' noise (median ≥ 0.97: on 2 cores it gives the same sets) | {} | {} |",
        exclusive.ratio(),
        v.verdict(exclusive.med >= 0.97)
    );
    let _ = writeln!(
        s,
        "| H3: no flapping: core moves in a run ≤ {bound} (one per VM at the start, two per change of the busy VM), every round | `hostd` {}, `hostd+lend` {} | {} |",
        moves_excl.plain(0),
        moves_lend.plain(0),
        v.verdict(moves_excl.max <= bound as f64 && moves_lend.max <= bound as f64)
    );
    s
}
