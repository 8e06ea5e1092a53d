//! `api-bench`: what the operator API costs (issue 15): the latency of
//! `GET /api/v1/stages` and the VMM's CPU while a client polls it at 10 Hz,
//! against the same VM with the API socket open and nobody polling.
//!
//! Each run boots the staged test guest (2 vCPUs, the default `static`
//! configuration, a staged workload longer than the run) with
//! `--api-socket`, waits 1 s, then measures for `--window-s` seconds:
//!
//! * `polled`: a client (`stagevm_api::client` through the test kit, a
//!   new connection per request, as `stagevm-remote` and a Prometheus
//!   scrape) sends
//!   `GET /api/v1/stages` every 100 ms and times each answer;
//! * `idle`: nobody calls.
//!
//! From `/proc/<pid>/stat`: the VMM's CPU (cores, vCPUs included); from
//! `/proc/<pid>/task/<api>/schedstat`: the `api` thread's (% of one core,
//! ns resolution); from the
//! API itself at both ends of the window: the guest's requests/s. Modes
//! alternate round by round; medians (min–max) are printed, with the
//! background load, which must stay under 0.2 cores for the figures to
//! count.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use stagevm_report::api::StagesView;
use stagevm_testkit::api::Api;
use stagevm_testkit::Running;

use stagevm_bench::load::{Meter, BUSY_CORES};
use stagevm_bench::stats::Spread;
use stagevm_bench::target::Target;

/// Measures the operator API's latency and CPU cost.
#[derive(Parser, Debug)]
#[command(name = "api-bench", about)]
struct Args {
    #[command(flatten)]
    target: Target,
    /// Rounds (each runs both modes once).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Measured window per run (s).
    #[arg(long, default_value_t = 5)]
    window_s: u64,
    /// Polling rate of the `polled` mode (Hz).
    #[arg(long, default_value_t = 10)]
    hz: u32,
}

/// What one run measured.
#[derive(Debug, Default)]
struct Sample {
    /// `GET /api/v1/stages` latencies (ms), polled mode only.
    latencies_ms: Vec<f64>,
    /// The VMM's CPU over the window (cores).
    vmm_cores: f64,
    /// The `api` thread's CPU over the window (% of one core).
    api_pct: f64,
    /// The guest's requests/s over the window.
    requests_per_s: f64,
}

/// utime + stime (s) of a `/proc/.../stat` file.
fn cpu_s(stat: &Path) -> Result<f64> {
    let text = std::fs::read_to_string(stat).with_context(|| stat.display().to_string())?;
    // Fields after the `(comm)`: state is field 3; utime, stime are 14, 15.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("stat without comm")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // SAFETY: sysconf has no memory arguments.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

/// CPU time (s) of a thread from its `schedstat` (ns on the CPU, the
/// first field: finer than `stat`'s clock ticks for a thread that runs
/// microseconds at a time).
fn thread_cpu_s(schedstat: &Path) -> Result<f64> {
    let text =
        std::fs::read_to_string(schedstat).with_context(|| schedstat.display().to_string())?;
    let ns: f64 = text
        .split_whitespace()
        .next()
        .context("empty schedstat")?
        .parse()?;
    Ok(ns / 1e9)
}

/// The `api` thread's `schedstat` file of `pid`.
fn api_schedstat(pid: u32) -> Result<PathBuf> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == "api" {
            return Ok(task.path().join("schedstat"));
        }
    }
    bail!("no api thread in /proc/{pid}/task")
}

fn requests(client: &Api) -> Result<u64> {
    let a = client.request("GET", "/api/v1/stages?timeline=0", b"")?;
    let view: StagesView = serde_json::from_slice(&a.body)?;
    Ok(view.stage_channel.map_or(0, |c| c.requests))
}

/// Boots the guest with the API on `socket`; the VMM and a client of its
/// API once the socket answers (10 s at most).
fn boot(args: &Args, socket: &Path) -> Result<(Running, Api)> {
    let _ = std::fs::remove_file(socket);
    let child = args
        .target
        .launch()
        .vcpus(2)
        .args(["--serial", "null"])
        .api_socket(socket)
        .cmdline("iters=1000 threads=2 requests=1000000000 work=100")
        .stdin(Stdio::inherit())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting stagevm")?;
    let client = Api::wait_ready(socket, Duration::from_secs(10))?;
    Ok((child, client))
}

fn run_once(args: &Args, polled: bool) -> Result<Sample> {
    let socket =
        std::env::temp_dir().join(format!("stagevm-api-bench-{}.sock", std::process::id()));
    let (child, client) = boot(args, &socket)?;
    std::thread::sleep(Duration::from_secs(1));
    let pid = child.id();
    let (proc_stat, api) = (
        PathBuf::from(format!("/proc/{pid}/stat")),
        api_schedstat(pid)?,
    );
    let window = Duration::from_secs(args.window_s);
    let (vmm0, api0, req0) = (cpu_s(&proc_stat)?, thread_cpu_s(&api)?, requests(&client)?);
    let start = Instant::now();
    let mut sample = Sample::default();
    let tick = Duration::from_secs_f64(1.0 / f64::from(args.hz.max(1)));
    let mut next = start;
    while start.elapsed() < window {
        if polled {
            let t = Instant::now();
            let a = client.request("GET", "/api/v1/stages", b"")?;
            if a.status != 200 {
                bail!("GET /api/v1/stages: {}", a.status);
            }
            sample.latencies_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        next += tick;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let (vmm1, api1, req1) = (cpu_s(&proc_stat)?, thread_cpu_s(&api)?, requests(&client)?);
    sample.vmm_cores = (vmm1 - vmm0) / elapsed;
    sample.api_pct = (api1 - api0) / elapsed * 100.0;
    sample.requests_per_s = req1.saturating_sub(req0) as f64 / elapsed;
    let _ = client.request("PUT", "/api/v1/vm.shutdown", b"");
    let status = child.finish()?.status;
    if !status.success() {
        bail!("stagevm ended with {status}");
    }
    Ok(sample)
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() -> Result<()> {
    let args = Args::parse();
    let meter = Meter::start();
    let (mut polled, mut idle) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        for mode in if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        } {
            eprintln!(
                "api-bench: round {}/{}: {}",
                round + 1,
                args.rounds,
                if mode { "polled" } else { "idle" }
            );
            let s = run_once(&args, mode)?;
            if mode {
                polled.push(s)
            } else {
                idle.push(s)
            }
        }
    }
    let load = meter.others_cores();
    let col =
        |v: &[Sample], f: fn(&Sample) -> f64| Spread::of(&v.iter().map(f).collect::<Vec<_>>());
    let lat: Vec<f64> = polled.iter().flat_map(|s| s.latencies_ms.clone()).collect();
    println!(
        "\nOperator API cost: 2 vCPUs running the staged guest, {} rounds of {} s per mode, GET /api/v1/stages at {} Hz ({} requests)\n",
        args.rounds,
        args.window_s,
        args.hz,
        lat.len()
    );
    println!("| mode | GET /api/v1/stages p50 / p99 / max (ms) | api thread (% of a core) | VMM CPU (cores) | guest requests/s |");
    println!("|---|---:|---:|---:|---:|");
    for (name, v) in [("polled (10 Hz)", &polled), ("idle", &idle)] {
        let latency = if v.iter().any(|s| !s.latencies_ms.is_empty()) {
            format!(
                "{:.2} / {:.2} / {:.2}",
                percentile(lat.clone(), 0.5),
                percentile(lat.clone(), 0.99),
                percentile(lat.clone(), 1.0)
            )
        } else {
            "-".into()
        };
        println!(
            "| {name} | {latency} | {} | {} | {} |",
            col(v, |s| s.api_pct).plain(3),
            col(v, |s| s.vmm_cores).plain(3),
            col(v, |s| s.requests_per_s).rate()
        );
    }
    let ratio: Vec<f64> = polled
        .iter()
        .zip(&idle)
        .map(|(p, i)| p.requests_per_s / i.requests_per_s)
        .collect();
    println!(
        "\nguest requests/s polled / idle, per round: {}",
        Spread::of(&ratio).ratio()
    );
    println!(
        "background load: {load:.2} cores{}",
        if load > BUSY_CORES {
            " — BUSY: these figures do not count"
        } else {
            ""
        }
    );
    Ok(())
}
