//! `host-bench` (`just bench-host`): several VMs on the host's stage cores
//! under `stagevm-hostd`, against a fixed split of the cores.
//!
//! Two VMs — one on the headline's 4 MiB shape (staging wins), one on its
//! 128 KiB shape (staging loses) — take turns being busy: each is an
//! open-loop guest whose requests arrive only in its busy windows
//! (`phases=`, offsets 0 and one window), at `--load` × the rate the shape
//! reaches on both cores (measured first, closed loop, in this run), so a
//! VM confined to one core cannot keep up. Each round runs four modes in
//! a rotating order:
//! * `fixed`: VM A on core 0, VM B on core 1 (`--stage-cores`), no daemon;
//! * `hostd`: the daemon with its default rules (one core each while there
//!   are as many cores as VMs: on 2 cores it gives the fixed split's sets);
//! * `hostd+lend`: the daemon with `lend_when_idle = true`: the idle VM
//!   runs on a shared core while the busy one has both;
//! * `fixed-api`: the fixed split again, but given over the API once both
//!   VMs booted on both cores, as the daemon's VMs start (a control for
//!   the start-up).
//!
//! Per mode: requests served by both VMs (the guests' own counts), per-VM
//! served and p99 latency from arrival, core moves per minute and the
//! periods a VM waited for cores (the daemon's `GET /api/v1/host`), and
//! the ratio of each daemon mode's total to the fixed split's in the same
//! round. Targets ([`table::targets`]) are printed met / not met; the
//! section goes into `bench/RESULTS.md`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use stage_workload::Params;
use stagevm_bench::guest::{requests_for, Boot, GuestRun};
use stagevm_bench::load::Meter;
use stagevm_bench::target::Target;
use stagevm_report::api::HostView;
use stagevm_testkit::api::Api;
use stagevm_testkit::console::field;
use stagevm_testkit::Hostd;

mod table;

/// Two VMs busy in turn, under the daemon and under a fixed split.
#[derive(Parser, Debug)]
#[command(
    name = "host-bench",
    about = "Two VMs busy in turn on the stage cores: stagevm-hostd (exclusive and lending) against a fixed half-and-half split"
)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// The stagevm-hostd binary.
    #[arg(long, default_value = "target/release/stagevm-hostd")]
    hostd: PathBuf,
    /// The two VMs' shapes, `KIB:CALLS:DATA` each (code footprint in KiB,
    /// calls per stage, data words per thread).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "4096:400:512,128:400:512"
    )]
    shapes: Vec<String>,
    /// vCPUs per VM.
    #[arg(long, default_value_t = 2)]
    vcpus: u32,
    /// Guest threads per VM (each vCPU gets an equal share).
    #[arg(long, default_value_t = 16)]
    threads: u32,
    /// Each VM's `--policy`.
    #[arg(long, default_value = "proportional")]
    policy: String,
    /// A busy window (ms); the other VM is busy in the next one.
    #[arg(long, default_value_t = 4000)]
    window_ms: u64,
    /// Busy windows per VM in a run (the run lasts twice as many windows).
    #[arg(long, default_value_t = 3)]
    windows: u64,
    /// Offered load in a busy window, × the shape's closed-loop rate on
    /// both cores (above 1: a VM on one core cannot serve it).
    #[arg(long, default_value_t = 1.2)]
    load: f64,
    /// The guests' queue of arrived requests (`queue=`).
    #[arg(long, default_value_t = 256)]
    queue: u64,
    /// The daemon's period (ms).
    #[arg(long, default_value_t = 250)]
    period_ms: u64,
    /// Rounds (the modes rotate within each).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Stage configuration given to stagevm.
    #[arg(long, default_value = "bench/headline-stages.toml")]
    stages: PathBuf,
    /// Guest memory per VM.
    #[arg(long, default_value = "256M")]
    memory: String,
    /// Results file whose section is replaced.
    #[arg(long, default_value = "bench/RESULTS.md")]
    results: PathBuf,
}

/// The ways of sharing the two cores (`fixed-api`: the control).
pub const MODES: [&str; 4] = ["fixed", "hostd", "hostd+lend", "fixed-api"];

/// One VM's shape, with its rate on both cores (requests/s).
#[derive(Clone, Debug)]
pub struct Vm {
    /// `KIB:CALLS:DATA` as given.
    pub shape: String,
    params: Params,
    /// Closed-loop steady rate on both cores, measured in this run.
    pub capacity: f64,
}

/// What one VM did in one run.
#[derive(Clone, Debug, Default)]
pub struct VmRun {
    /// Requests served (the guest's `served`).
    pub served: u64,
    /// Requests its full queue dropped.
    pub dropped: u64,
    /// p99 latency from arrival (µs) of its steady requests.
    pub p99_us: f64,
    /// Cores moved to it (daemon modes).
    pub moves: u64,
    /// Periods it waited for a core (daemon modes).
    pub waited: u64,
}

/// One run of a mode: both VMs, the daemon's periods and the run's length.
#[derive(Clone, Debug, Default)]
pub struct ModeRun {
    /// VM A, VM B.
    pub vms: [VmRun; 2],
    /// Wall time from the first VM's start to the last one's end (s).
    pub seconds: f64,
}

impl ModeRun {
    /// Requests both VMs served.
    pub fn served(&self) -> u64 {
        self.vms.iter().map(|v| v.served).sum()
    }
    /// Core moves per minute, both VMs.
    pub fn moves_per_min(&self) -> f64 {
        self.vms.iter().map(|v| v.moves).sum::<u64>() as f64 * 60.0 / self.seconds.max(1e-3)
    }
}

/// Each shape's closed-loop steady rate on both cores (no daemon).
fn size(args: &Args, bar: &ProgressBar) -> Result<Vec<Vm>> {
    let per_vcpu = (args.threads / args.vcpus).max(1);
    let mut vms = Vec::new();
    for s in &args.shapes {
        bar.set_message(format!("sizing {s}"));
        let params = stagevm_bench::shape::parse("--shapes", s, 2)?;
        let mut requests = 200;
        let mut run = GuestRun::default();
        // A first short run, then one of ~3 s at its rate.
        for _ in 0..2 {
            let cmd = stagevm_bench::shape::cmdline(&params, per_vcpu, requests);
            let boot = Boot {
                target: &args.target,
                vcpus: args.vcpus,
                policy: &args.policy,
                cmdline: &cmd,
                memory: Some(&args.memory),
                stages: Some(&args.stages),
                extra: &[],
            };
            run = GuestRun::parse(&boot.run()?)?;
            requests = requests_for(3.0, run.rps, u64::from(per_vcpu * args.vcpus), 200);
        }
        let capacity = if run.steady_rps.is_finite() {
            run.steady_rps
        } else {
            run.rps
        };
        vms.push(Vm {
            shape: s.clone(),
            params,
            capacity,
        });
    }
    Ok(vms)
}

/// The guest's `open loop:` line: served, dropped, p99 (µs).
fn open_loop(stdout: &str) -> Result<(u64, u64, f64)> {
    let line = stagevm_testkit::console::line(stdout, "testguest: open loop")
        .with_context(|| format!("no open-loop line in the guest output:\n{stdout}"))?;
    let served = field(line, "served ").context("served")?;
    let dropped = line
        .split("dropped ")
        .nth(1)
        .and_then(|r| r.split(';').next()?.trim().parse().ok())
        .context("dropped")?;
    // The guest prints its latencies in µs ("p99 5.3 us").
    let p99_us = field::<f64>(line, " p99 ").context("p99")?;
    Ok((served, dropped, p99_us))
}

/// One run of `mode`: both VMs busy in turn, under the daemon or fixed.
fn run_mode(args: &Args, vms: &[Vm], mode: &str) -> Result<ModeRun> {
    let dir = stagevm_testkit::temp_path("host-bench", "d");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = run_in(args, vms, mode, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(args: &Args, vms: &[Vm], mode: &str, dir: &Path) -> Result<ModeRun> {
    let daemon_socket = dir.join("hostd.sock");
    let vm_dir = dir.join("vms");
    std::fs::create_dir_all(&vm_dir)?;
    let daemon = if mode.starts_with("fixed") {
        None
    } else {
        let config = dir.join("host.toml");
        std::fs::write(
            &config,
            format!(
                "[host]\ncores = \"0-1\"\nperiod_ms = {}\ntimeout_ms = {}\nlend_when_idle = {}\n",
                args.period_ms,
                (args.period_ms / 2).max(10),
                mode == "hostd+lend"
            ),
        )?;
        Some(
            Hostd::new(&args.hostd, &vm_dir)
                .config(&config)
                .api_socket(&daemon_socket)
                .spawn()
                .with_context(|| format!("starting {}", args.hostd.display()))?,
        )
    };
    let per_vcpu = (args.threads / args.vcpus).max(1);
    let active_s = (args.windows * args.window_ms) as f64 / 1000.0;
    let started = std::time::Instant::now();
    let mut running = Vec::new();
    for (i, vm) in vms.iter().enumerate() {
        let rate = (vm.capacity * args.load).round().max(1.0) as u64;
        let requests = requests_for(active_s, rate as f64, u64::from(per_vcpu * args.vcpus), 1);
        let cmdline = format!(
            "{} arrival={rate} arrival_dist=poisson queue={} phases={}:{}:{} hold=1",
            stagevm_bench::shape::cmdline(&vm.params, per_vcpu, requests),
            args.queue,
            args.window_ms,
            args.window_ms,
            i as u64 * args.window_ms
        );
        let name = format!("vm{i}");
        let mut launch = args
            .target
            .launch()
            .vcpus(args.vcpus)
            .memory(&args.memory)
            .args(["--policy", &args.policy])
            .arg("--stages")
            .arg(&args.stages)
            .cmdline(&cmdline);
        launch = if daemon.is_some() || mode == "fixed-api" {
            launch.api_socket(vm_dir.join(format!("{name}.sock")))
        } else {
            launch.args(["--stage-cores", &i.to_string()])
        };
        let mut vm = launch.spawn()?;
        // Both outputs read as they come: a full pipe would stop the VMM.
        let (out, err) = (vm.stdout_lines()?, vm.stderr_lines()?);
        running.push((vm, out, err));
    }
    if mode == "fixed-api" {
        for i in 0..vms.len() {
            let api =
                Api::wait_ready(&vm_dir.join(format!("vm{i}.sock")), Duration::from_secs(10))?;
            api.put(
                "/api/v1/stages.budgets",
                format!("{{\"host\":{{\"cores\":\"{i}\"}}}}").as_bytes(),
            )?;
        }
    }
    let timeout =
        Duration::from_millis(2 * args.windows * args.window_ms) + Duration::from_secs(120);
    let mut out = ModeRun::default();
    // The guests hold (`hold=1`) once their load is over: neither VM's end
    // frees a core for the other while it still has windows to serve (the
    // daemon would rightly give it away). Both stop when both are done.
    let mut lines = Vec::new();
    for (i, (_, out, err)) in running.iter().enumerate() {
        let line = out
            .wait_for(
                "testguest: open loop",
                timeout,
                &["panicked", "exit status"],
            )
            .with_context(|| {
                format!(
                    "VM {i} of mode {mode} did not finish its load; its log:\n{}",
                    err.rest().join("\n")
                )
            })?;
        lines.push(line);
    }
    out.seconds = started.elapsed().as_secs_f64();
    for (vm, _, _) in running {
        vm.kill()?;
    }
    for (i, line) in lines.iter().enumerate() {
        let (served, dropped, p99_us) = open_loop(line)?;
        out.vms[i] = VmRun {
            served,
            dropped,
            p99_us,
            ..VmRun::default()
        };
    }
    if let Some(daemon) = daemon {
        let view: HostView = Api::new(&daemon_socket)?.get_json("/api/v1/host")?;
        for (i, v) in out.vms.iter_mut().enumerate() {
            if let Some(h) = view.vms.iter().find(|h| h.name == format!("vm{i}")) {
                v.moves = h.moves;
                v.waited = h.waited;
            }
        }
        let _ = daemon.kill();
    }
    Ok(out)
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.shapes.len() != 2 {
        bail!(
            "--shapes takes two shapes (VM A, VM B), got {}",
            args.shapes.len()
        );
    }
    if !(args.load > 0.0 && args.load.is_finite()) || args.windows == 0 || args.window_ms < 100 {
        bail!("--load must be positive, --windows ≥ 1, --window-ms ≥ 100");
    }
    for (what, path) in [
        ("--hostd", &args.hostd),
        ("--stagevm", &args.target.stagevm),
    ] {
        if !path.is_file() {
            bail!(
                "{what} {}: no such binary (just bench-host builds them)",
                path.display()
            );
        }
    }
    let bar = ProgressBar::new((args.rounds * MODES.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let meter = Meter::start();
    let started = std::time::Instant::now();
    let vms = size(&args, &bar)?;
    let mut runs: Vec<Vec<ModeRun>> = vec![Vec::new(); MODES.len()];
    for r in 0..args.rounds {
        for k in 0..MODES.len() {
            let m = (r + k) % MODES.len();
            bar.set_message(format!("round {} {}", r + 1, MODES[m]));
            runs[m].push(run_mode(&args, &vms, MODES[m])?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let others = meter.others_cores();
    let text = table::report(&table::View {
        args: &args,
        vms: &vms,
        runs: &runs,
        elapsed: started.elapsed(),
        others,
    });
    print!("{text}");
    stagevm_bench::write_section(
        &args.results,
        "<!-- host-bench:begin (written by `just bench-host`) -->",
        "<!-- host-bench:end -->",
        &text,
    )?;
    println!("wrote {}", args.results.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_open_loop_line_is_read_with_its_unit() {
        let line = "testguest: open loop: arrival 2000 requests/s poisson, queue 256: released 2000, served 1990, dropped 10; achieved 1143 requests/s; latency from arrival p50 2.9 us p99 5300.5 us p999 10240.0 us (1600 steady requests)\n";
        let (served, dropped, p99) = super::open_loop(line).unwrap();
        assert_eq!((served, dropped), (1990, 10));
        assert!((p99 - 5300.5).abs() < 1e-6, "{p99}");
        assert!(super::open_loop("nothing").is_err());
    }
}
