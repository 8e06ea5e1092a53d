//! The saturated mode: what a migration costs in CPU time when every vCPU
//! has other threads to run (issue 23, target T4 ≤ 300 ns).
//!
//! Latency (the main sweep) is the time until a migrated thread runs on an
//! idle target; with many runnable threads that time is hidden behind other
//! threads' work, and what throughput pays is the CPU both vCPUs spend on
//! the hand-off: the queue lock and push, the thread's header and stack
//! lines moving to the other core, the pop. This mode measures it directly:
//! `hopper=2` on 2 vCPUs under `static` (each stage on its own vCPU), with
//! `--threads` threads per vCPU that do `W` mixing iterations
//! (`hop_work=W`) after every switch, in two runs per `W`:
//!
//! * **migrate** (`hop_pass=migrate`): every switch moves the thread to the
//!   other vCPU;
//! * **local** (`hop_pass=local`): the same number of yields through the
//!   thread's own vCPU's queue, with the same work.
//!
//! CPU per migration = (busy vCPU time of the migrate run − busy vCPU time
//! of the local run) ÷ the migrate run's migrations, where busy time is the
//! guest's `testguest: busy` line (the vCPUs' time in the staged phase
//! minus their idle time, from the guest's TSC). Runs of both kinds are
//! interleaved round by round; the figure is taken per round and reported
//! as median (min–max).

use std::path::Path;

use anyhow::{Context, Result};

use stagevm_bench::stats::Spread;

use stagevm_testkit::console::field;

use crate::{boot_hopper, Args};

/// T4 (saturated): the bound on CPU time per migration (ns).
pub const T4_CPU_NS: f64 = 300.0;

/// One saturated run's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Busy {
    /// vCPU time the guest spent not idle in its staged phase (ns, all
    /// vCPUs).
    pub busy_ns: f64,
    /// vCPU time of the staged phase (ns, all vCPUs).
    pub total_ns: f64,
    /// Migrations the guest made.
    pub migrations: u64,
}

/// Parses a run's `testguest: busy B ns of T ns …` and `testguest:
/// migrations M, …` lines.
pub fn parse(stdout: &str) -> Option<Busy> {
    let busy = stdout.lines().find(|l| l.starts_with("testguest: busy "))?;
    let migrations = stdout
        .lines()
        .find(|l| l.starts_with("testguest: migrations "))?;
    Some(Busy {
        busy_ns: field(busy, "busy ")?,
        total_ns: field(busy, " of ")?,
        migrations: field(migrations, "migrations ")?,
    })
}

/// Switches in all for a run with `work` iterations between switches:
/// about a second on 2 vCPUs at ~1.5 ns per iteration and ~150 ns per
/// switch, between 40,000 and 4,000,000.
pub fn hops_for(work: u64) -> u64 {
    (4_000_000_000 / (3 * work + 300)).clamp(40_000, 4_000_000)
}

/// Boots one saturated run: `pass` is `migrate` or `local`.
fn run_once(args: &Args, stages: &Path, work: u64, pass: &str) -> Result<Busy> {
    let cmdline = format!(
        "iters=1 hopper=2 hops={} threads={} hop_work={work} hop_pass={pass}",
        hops_for(work),
        args.threads
    );
    let stdout = boot_hopper(args, 2, stages, &[], &cmdline)?;
    parse(&stdout)
        .with_context(|| format!("no busy/migrations lines in the guest output:\n{stdout}"))
}

/// Per `W`, per round: (migrate run, local run).
pub type Runs = Vec<Vec<(Busy, Busy)>>;

/// Runs the saturated sweep: every `W` of `--works`, migrate and local,
/// `--rounds` interleaved rounds (the order of the `W`s rotates).
///
/// # Errors
/// When a run fails or prints no figures.
pub fn sweep(args: &Args, stages: &Path) -> Result<Runs> {
    let mut runs: Runs = vec![Vec::new(); args.works.len()];
    for round in 0..args.rounds {
        for k in 0..args.works.len() {
            let i = (k + round) % args.works.len();
            let w = args.works[i];
            eprintln!(
                "migration-bench: round {} saturated, {} threads per vCPU, hop_work={w}",
                round + 1,
                args.threads
            );
            // Alternate which kind goes first.
            let (m, l) = if round % 2 == 0 {
                let m = run_once(args, stages, w, "migrate")?;
                (m, run_once(args, stages, w, "local")?)
            } else {
                let l = run_once(args, stages, w, "local")?;
                (run_once(args, stages, w, "migrate")?, l)
            };
            runs[i].push((m, l));
        }
    }
    Ok(runs)
}

/// CPU time per migration of one round (ns): NaN without migrations.
pub fn cpu_per_migration(m: &Busy, l: &Busy) -> f64 {
    if m.migrations == 0 {
        return f64::NAN;
    }
    (m.busy_ns - l.busy_ns) / m.migrations as f64
}

/// Prints the saturated table and its T4 line; `busy` says the machine was
/// not quiet (the target is then not judged).
pub fn report(args: &Args, runs: &Runs, busy: bool) {
    println!(
        "\nSaturated migration cost: `hopper=2` on 2 vCPUs (`static`, stage cores {}), {} threads per vCPU, W mixing iterations after every switch; CPU per migration = (busy vCPU time migrating − busy vCPU time with local switches) ÷ migrations, per round, median (min–max) of {} rounds.\n",
        args.stage_cores, args.threads, args.rounds
    );
    println!("| W (iterations) | switches | migrations | busy % migrating | busy % local | CPU per migration (ns) | busy vCPU time per local switch and its work (ns) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut worst: Option<(u64, f64)> = None;
    for (w, rounds) in args.works.iter().zip(runs) {
        let per = |f: &dyn Fn(&(Busy, Busy)) -> f64| {
            Spread::of(&rounds.iter().map(f).collect::<Vec<_>>())
        };
        let cpu = per(&|(m, l)| cpu_per_migration(m, l));
        let hops = hops_for(*w) as f64;
        let local = per(&|(_, l)| l.busy_ns / hops);
        let migrations = rounds.last().map_or(0, |(m, _)| m.migrations);
        println!(
            "| {w} | {} | {migrations} | {} | {} | {} | {} |",
            hops_for(*w),
            per(&|(m, _)| 100.0 * m.busy_ns / m.total_ns).plain(1),
            per(&|(_, l)| 100.0 * l.busy_ns / l.total_ns).plain(1),
            cpu.plain(0),
            local.plain(0),
        );
        if cpu.med.is_finite() && worst.is_none_or(|(_, c)| cpu.med > c) {
            worst = Some((*w, cpu.med));
        }
    }
    let verdict = match worst {
        _ if busy => "**not met** (not judged: the machine was busy)".to_string(),
        None => "**not met** (no figures)".to_string(),
        Some((_, c)) if c <= T4_CPU_NS => "**met**".to_string(),
        Some(_) => "**not met**".to_string(),
    };
    let measured = worst.map_or("–".into(), |(w, c)| format!("worst {c:.0} ns at W = {w}"));
    println!(
        "\n- T4 (saturated): CPU per migration ≤ {T4_CPU_NS:.0} ns at every W: {measured}: {verdict}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_busy_time_and_computes_the_cost() {
        let out = "testguest: migrations 1000, fallbacks 0, violations 0\n\
            testguest: busy 2000000 ns of 2100000 ns vCPU time in the staged phase\n";
        let m = parse(out).expect("parses");
        assert_eq!(m.migrations, 1000);
        assert_eq!((m.busy_ns, m.total_ns), (2_000_000.0, 2_100_000.0));
        let l = Busy {
            busy_ns: 1_700_000.0,
            total_ns: 1_700_000.0,
            migrations: 0,
        };
        // (2.0 ms − 1.7 ms) over 1000 migrations: 300 ns each.
        assert_eq!(cpu_per_migration(&m, &l), 300.0);
        assert!(cpu_per_migration(&l, &m).is_nan());
        assert_eq!(hops_for(0), 4_000_000);
        assert_eq!(hops_for(20_000), 66_334);
    }
}
