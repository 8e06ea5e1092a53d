//! `stagevm-gatectl`: sets and reads the control page of a server running
//! with the preload library (`STAGEVM_CONTROL=PATH`): the gate's mode,
//! visit policy and wait bound, and the library's counters; and measures
//! the mechanism's costs on this host (`measure`, `stagevm_preload::costs`).

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use hypercall_abi::stage::VisitPolicy;
use stagevm_preload::control::{mode, Control, Mapping, MAX_WAIT_US_RANGE};

/// Sets and reads a preload library's control page.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// The control page's file (the server's STAGEVM_CONTROL); for set and show.
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Changes the gate's settings; the library reads them at its next
    /// stage point (or a waiter at its wait bound). With the stage channel
    /// open (a stagevm guest), each new map of the VMM sets the gate and
    /// the visit policy again.
    Set {
        /// `off` or `temporal`.
        #[arg(long)]
        gate: Option<String>,
        /// srpt, cohort, dbr, mg1 or color.
        #[arg(long)]
        visit: Option<String>,
        /// The wait bound, µs (10..=1000000).
        #[arg(long, value_name = "US")]
        max_wait_us: Option<u32>,
    },
    /// Prints the settings and counters (`--json` for a machine).
    Show {
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Times this host's stage point (gate off, gate on) and gate handoff
    /// with the library's own detours and gate, in this process (~3 s;
    /// run it alone: anything else on the CPU is in the figures).
    Measure {
        /// The lane's CPU (default: the last CPU this process may use).
        #[arg(long)]
        cpu: Option<usize>,
        /// Rounds; each figure is their median.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Iterations (two stage points each) per round alone; a tenth per thread in the
        /// handoff rounds.
        #[arg(long, default_value_t = 200_000)]
        calls: u64,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// `stagevm-gatectl measure`.
fn measure(cpu: Option<usize>, rounds: usize, calls: u64, as_json: bool) -> anyhow::Result<()> {
    let cpu = match cpu {
        Some(c) => c,
        None => stagevm_preload::costs::default_cpu()?,
    };
    let k = stagevm_preload::costs::measure(cpu, rounds, calls)
        .with_context(|| format!("measuring on CPU {cpu}"))?;
    if as_json {
        println!("{}", serde_json::to_string(&k)?);
        return Ok(());
    }
    let f = |x: stagevm_preload::costs::Figure| {
        format!("{:8.1} ns  (spread {:.1})", x.median_ns, x.spread_ns)
    };
    println!(
        "mechanism costs on CPU {cpu}, median of {} rounds:",
        k.rounds
    );
    println!("  call, unhooked:           {}", f(k.call));
    println!("  stage point, gate off:    {}", f(k.point_off));
    println!("  stage point, gate alone:  {}", f(k.point_on));
    println!(
        "  switch with a handoff:    {}  ({} handoffs, {} threads)",
        f(k.handoff),
        k.handoffs,
        stagevm_preload::costs::HANDOFF_THREADS
    );
    Ok(())
}

fn json(c: &Control) -> serde_json::Value {
    let h = &c.header;
    let lanes: Vec<_> = c.lanes[..h.lanes.load(Relaxed).min(64) as usize]
        .iter()
        .map(|l| {
            serde_json::json!({
                "cpu": l.cpu.load(Relaxed),
                "threads": l.threads.load(Relaxed),
                "visits": l.visits.load(Relaxed),
                "handoffs": l.handoffs.load(Relaxed),
                "timeouts": l.timeouts.load(Relaxed),
                "cohorts": l.cohorts.load(Relaxed),
                "cohort_threads": l.cohort_threads.load(Relaxed),
                "released": l.released.load(Relaxed),
                "wait_ns": l.wait_ns.load(Relaxed),
                "bypasses": l.bypasses.load(Relaxed),
            })
        })
        .collect();
    let stages = h.stages.load(Relaxed).min(16) as usize;
    serde_json::json!({
        "pid": h.pid.load(Relaxed),
        "gate": if c.mode() == mode::TEMPORAL { "temporal" } else { "off" },
        "visit": c.policy().name(),
        "max_wait_us": c.max_wait_ns() / 1000,
        "stages": stages,
        "hooks_installed": h.hooks_installed.load(Relaxed),
        "hooks_skipped": h.hooks_skipped.load(Relaxed),
        "stage_visits": &c.stage_visits()[..stages],
        "requests": c.requests(),
        "unslotted": h.unslotted.load(Relaxed),
        "releases": h.releases.load(Relaxed),
        "channel": h.channel.load(Relaxed) == 1,
        "map_epoch": h.map_epoch.load(Relaxed),
        "maps_followed": h.map_changes.load(Relaxed),
        "channel_drops": h.channel_drops.load(Relaxed),
        "lanes": lanes,
    })
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Cmd::Measure {
        cpu,
        rounds,
        calls,
        json,
    } = cli.cmd
    {
        return measure(cpu, rounds, calls, json);
    }
    let Some(control) = &cli.control else {
        bail!("--control PATH is needed to set or show a page");
    };
    let page =
        Mapping::open(control, |_| {}).with_context(|| format!("mapping {}", control.display()))?;
    let c = page.get();
    match cli.cmd {
        Cmd::Set {
            gate,
            visit,
            max_wait_us,
        } => {
            if let Some(v) = visit {
                match VisitPolicy::parse(&v).filter(|p| p.is_temporal()) {
                    Some(p) => c.header.policy.store(p.code() as u32, Relaxed),
                    None => bail!("--visit {v}: not srpt, cohort, dbr, mg1 or color"),
                }
            }
            if let Some(us) = max_wait_us {
                if !MAX_WAIT_US_RANGE.contains(&us) {
                    bail!("--max-wait-us {us}: not in {MAX_WAIT_US_RANGE:?}");
                }
                c.header.max_wait_us.store(us, Relaxed);
            }
            if let Some(g) = gate {
                let m = match g.as_str() {
                    "off" => mode::OFF,
                    "temporal" => mode::TEMPORAL,
                    _ => bail!("--gate {g}: not 'off' or 'temporal'"),
                };
                c.header.mode.store(m, Relaxed);
            }
        }
        Cmd::Show { json: as_json } => {
            let j = json(c);
            if as_json {
                println!("{j}");
            } else {
                println!("{}", serde_json::to_string_pretty(&j)?);
            }
        }
        Cmd::Measure { .. } => unreachable!("measured above"),
    }
    Ok(())
}
