//! `stagevm-remote`: the operator API's command-line client (as Cloud
//! Hypervisor's `ch-remote`). One request per command over the VMM's
//! `--api-socket`; the answer's JSON on stdout (`stages` prints a table
//! unless `--json`).
//!
//! Exit status: 0 on success; 1 when the VMM refused the request (its
//! one-line error on stderr, e.g. a budget naming key and value); 2 when
//! the socket cannot be reached, the command line or a file is bad, or the
//! answer cannot be read.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use clap::{Parser, Subcommand};
use stagevm::api::body::{BudgetsUpdate, CpuWeightUpdate, PolicyUpdate};
use stagevm_api::client::Client;
use stagevm_report::api::{ApiError, HostView, StagesView, PREFIX};

/// Watches and steers a running stagevm through its --api-socket.
#[derive(Parser, Debug)]
#[command(name = "stagevm-remote", version, about, long_about)]
struct Cli {
    /// The VMM's API socket (stagevm --api-socket PATH).
    #[arg(long, value_name = "PATH")]
    api_socket: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The VM's configuration, state, vCPU threads and their affinities (JSON).
    Info,
    /// The live stage report: a table per stage, or the raw JSON.
    Stages {
        /// Print the JSON answer instead of the table.
        #[arg(long)]
        json: bool,
        /// Timeline entries to include (in the JSON).
        #[arg(long, value_name = "N", default_value_t = 5)]
        timeline: usize,
        /// The policy's last decisions and operator changes to include.
        #[arg(long, value_name = "N", default_value_t = 5)]
        decisions: usize,
    },
    /// Changes the scheduling policy at the next policy period.
    Policy {
        /// off, pinned, static, proportional or auto.
        name: String,
        /// Policy period (ms, 1..=60000).
        #[arg(long, value_name = "MS")]
        period_ms: Option<u64>,
        /// EWMA weight of the newest load sample, in (0, 1].
        #[arg(long, value_name = "W")]
        smoothing: Option<f64>,
        /// Cores a new allocation must gain (≥ 0).
        #[arg(long, value_name = "CORES")]
        hysteresis: Option<f64>,
        /// Stage-visit policy: fifo, cohort, srpt, dbr, mg1 or color.
        #[arg(long, value_name = "NAME")]
        visit: Option<String>,
        /// auto: the most a mode may raise p99 latency over unstaged's, a
        /// fraction (0.1 = 10 %).
        #[arg(long, value_name = "FRACTION", allow_negative_numbers = true)]
        max_p99_increase: Option<f64>,
        /// auto: a p99 latency the operator accepts (µs), in place of
        /// --max-p99-increase; 0 removes it.
        #[arg(long, value_name = "US", allow_negative_numbers = true)]
        latency_slo_us: Option<f64>,
    },
    /// Replaces `[host]` cores and the `[[stage]]` budgets from a stages file
    /// (its `[policy]` table, if any, is not sent: use `policy`).
    Budgets {
        /// A --stages TOML file.
        file: PathBuf,
    },
    /// The VM's CPU weight on cores it shares with other VMs
    /// (`host.cpu_weight`, 1..=10000, 100 an ordinary process; `none` takes
    /// it back), a change of its own that keeps the policy's state.
    CpuWeight {
        /// The weight, or none.
        weight: String,
    },
    /// The event trace of a guest that reports through stage counters, at
    /// once: on (every event), off, or every=N (every Nth event per vCPU).
    Trace {
        /// on, off or every=N.
        setting: stagevm::config::TraceConfig,
    },
    /// Ends the VM (exit status 0).
    Shutdown,
    /// stagevm-hostd's view (its --api-socket): the host's stage cores and
    /// each VM's cores, demand and moves, as a table or the raw JSON.
    Host {
        /// Print the JSON answer instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// The Prometheus metrics (text).
    Metrics,
}

fn budgets_body(file: &Path) -> anyhow::Result<Vec<u8>> {
    let text = std::fs::read_to_string(file).with_context(|| format!("{}", file.display()))?;
    let origin = file.display().to_string();
    let config = host_sched::config::Config::from_toml(&text, &origin)?;
    if text.lines().any(|l| l.trim_start().starts_with("[policy]")) {
        eprintln!("stagevm-remote: {origin}: its [policy] table is not part of a budget change and is not sent (use `policy`)");
    }
    let update = BudgetsUpdate {
        host: config.host,
        stages: Some(config.stages),
    };
    Ok(serde_json::to_vec(&update)?)
}

/// The stage table: the policy, cores and epoch, one line per stage, then
/// the last decisions.
fn print_table(view: &StagesView) {
    let s = &view.sched;
    println!(
        "policy {} · visit {} · period {} ms · stage cores {} · housekeeping {} · map changes {}{}",
        s.policy,
        s.visit,
        s.period_ms,
        s.stage_cores,
        s.housekeeping,
        s.map_changes,
        view.stage_channel
            .as_ref()
            .map(|c| format!(
                " · epoch {} · requests {} · dropped {} · {}{}",
                c.map_epoch,
                c.requests,
                c.dropped,
                c.mode,
                match c.trace_every {
                    0 => String::new(),
                    n => format!(
                        " · trace every {n}: {} kept, {} dropped",
                        c.traced_events, c.trace_dropped
                    ),
                }
            ))
            .unwrap_or_default()
    );
    if let Some(line) = requests_line(view) {
        println!("{line}");
    }
    if let Some(p) = &view.pending {
        println!("pending: {p}");
    }
    println!(
        "{:<16} {:>12} {:>12} {:>12}  {:<10} cores",
        "stage", "events", "migrations", "occupancy ms", "vCPUs"
    );
    let stats = view
        .stage_channel
        .as_ref()
        .map(|c| c.stages.as_slice())
        .unwrap_or_default();
    for p in &s.stages {
        let st = stats.iter().find(|st| st.name == p.name);
        let vcpus: Vec<String> = p.vcpus.iter().map(u32::to_string).collect();
        println!(
            "{:<16} {:>12} {:>12} {:>12.1}  {:<10} {}",
            stagevm_report::escape(&p.name),
            st.map_or(0, |st| st.events),
            st.map_or(0, |st| st.migrations_in),
            st.map_or(0.0, |st| st.occupancy_ns as f64 / 1e6),
            vcpus.join(","),
            p.cores
        );
    }
    for t in &view.decisions {
        println!(
            "t={:.0} ms{}: {}",
            t.t_ms,
            t.source
                .as_ref()
                .map(|s| format!(" [{s}]"))
                .unwrap_or_default(),
            t.decision.as_deref().unwrap_or_default()
        );
    }
}

/// `requests: latency p50 … p99 … (N timed) · CPU per request … ·
/// utilisation …`: the run's figures so far, when there are any.
fn requests_line(view: &StagesView) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(l) = view
        .stage_channel
        .as_ref()
        .and_then(|c| c.latency.as_ref())
        .filter(|l| l.samples > 0)
    {
        parts.push(format!(
            "latency p50 {:.1} µs p99 {:.1} µs ({} timed)",
            l.p50_us, l.p99_us, l.samples
        ));
    }
    if let Some(c) = view.sched.cpu.as_ref() {
        parts.push(format!(
            "CPU per request {:.2} µs · utilisation {:.1} %",
            c.cpu_per_request_us,
            c.utilisation * 100.0
        ));
    }
    if let Some(t) = view.sched.auto.as_ref().and_then(|a| a.last_trial.as_ref()) {
        parts.push(format!("auto kept {} by {}", t.kept, t.decided_by));
    }
    (!parts.is_empty()).then(|| format!("requests: {}", parts.join(" · ")))
}

/// stagevm-hostd's table: one line per VM.
fn print_host(view: &HostView) {
    println!(
        "stage cores {} · housekeeping {} · period {} ms · {} periods",
        view.cores,
        if view.housekeeping.is_empty() {
            "each VM's own"
        } else {
            &view.housekeeping
        },
        view.period_ms,
        view.periods
    );
    println!(
        "{:<16} {:>8} {:>7} {:>5} {:>6} {:>10} {:>9} {:>6} {:>6} {:>7} {:>7} {:>6}",
        "vm",
        "cores",
        "demand",
        "vcpus",
        "weight",
        "cpu_weight",
        "min..max",
        "moves",
        "errors",
        "skipped",
        "waited",
        "shared"
    );
    for vm in &view.vms {
        let max = vm.max_cores.map_or("all".to_string(), |m| m.to_string());
        let cores = if vm.fixed.is_empty() {
            vm.cores.clone()
        } else {
            format!("{} fixed", vm.cores)
        };
        println!(
            "{:<16} {:>8} {:>7.2} {:>5} {:>6} {:>10} {:>9} {:>6} {:>6} {:>7} {:>7} {:>6}",
            vm.name,
            cores,
            vm.demand,
            vm.vcpus,
            vm.weight,
            vm.cpu_weight.map_or("-".to_string(), |w| w.to_string()),
            format!("{}..{max}", vm.min_cores),
            vm.moves,
            vm.errors,
            vm.skipped,
            vm.waited,
            match (vm.shared, vm.lent) {
                (_, true) => "lent",
                (true, false) => "yes",
                (false, false) => "no",
            }
        );
    }
}

fn run(cli: Cli) -> Result<(), (u8, String)> {
    let usage = |e: anyhow::Error| (2, format!("{e:#}"));
    let (method, path, body) = match &cli.command {
        Command::Info => ("GET", format!("{PREFIX}/vm.info"), Vec::new()),
        Command::Stages {
            timeline,
            decisions,
            ..
        } => (
            "GET",
            format!("{PREFIX}/stages?timeline={timeline}&decisions={decisions}"),
            Vec::new(),
        ),
        Command::Policy {
            name,
            period_ms,
            smoothing,
            hysteresis,
            visit,
            max_p99_increase,
            latency_slo_us,
        } => {
            let update = PolicyUpdate {
                name: name.clone(),
                period_ms: *period_ms,
                smoothing: *smoothing,
                hysteresis: *hysteresis,
                visit: visit.clone(),
                max_p99_increase: *max_p99_increase,
                latency_slo_us: *latency_slo_us,
            };
            (
                "PUT",
                format!("{PREFIX}/stages.policy"),
                serde_json::to_vec(&update).map_err(|e| usage(e.into()))?,
            )
        }
        Command::Budgets { file } => (
            "PUT",
            format!("{PREFIX}/stages.budgets"),
            budgets_body(file).map_err(usage)?,
        ),
        Command::CpuWeight { weight } => {
            let weight = match weight.as_str() {
                "none" => None,
                w => Some(w.parse::<u32>().map_err(|e| {
                    usage(anyhow!(
                        "cpu-weight '{w}': {e} (expected 1..=10000 or none)"
                    ))
                })?),
            };
            (
                "PUT",
                format!("{PREFIX}/stages.cpu_weight"),
                serde_json::to_vec(&CpuWeightUpdate { weight }).map_err(|e| usage(e.into()))?,
            )
        }
        Command::Trace { setting } => (
            "PUT",
            format!("{PREFIX}/stages.trace"),
            serde_json::to_vec(&stagevm_report::api::TraceUpdate {
                every: setting.every,
            })
            .map_err(|e| usage(e.into()))?,
        ),
        Command::Shutdown => ("PUT", format!("{PREFIX}/vm.shutdown"), Vec::new()),
        Command::Host { .. } => ("GET", format!("{PREFIX}/host"), Vec::new()),
        Command::Metrics => ("GET", "/metrics".to_string(), Vec::new()),
    };
    let client = Client::new(&cli.api_socket).map_err(|e| usage(e.into()))?;
    let answer = client
        .request(method, &path, body)
        .map_err(|e| usage(e.into()))?;
    if answer.status >= 400 {
        let msg = serde_json::from_slice::<ApiError>(&answer.body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&answer.body).into_owned());
        return Err((1, format!("{} {path}: {} {msg}", method, answer.status)));
    }
    match cli.command {
        Command::Stages { json: false, .. } => {
            let view: StagesView = serde_json::from_slice(&answer.body)
                .map_err(|e| usage(anyhow!("reading the answer: {e}")))?;
            print_table(&view);
        }
        Command::Host { json: false } => {
            let view: HostView = serde_json::from_slice(&answer.body)
                .map_err(|e| usage(anyhow!("reading the answer: {e}")))?;
            print_host(&view);
        }
        _ => println!("{}", String::from_utf8_lossy(&answer.body).trim_end()),
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            eprintln!("stagevm-remote: error: {msg}");
            ExitCode::from(code)
        }
    }
}
