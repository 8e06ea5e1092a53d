//! `stagevm-discover`: runs a server under the stgtrace Valgrind tool while
//! a load drives it, finds its request-level stage points in the cache
//! simulator, and writes `NAME.stagemap` and a report (see the crate docs).

mod steps;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;

use stagevm_discover::model::Mechanism;
use stagevm_discover::report;

/// From a server binary to a stage map: trace it under a load, discover its stages, and say
/// whether staging is expected to pay on this host.
///
/// Example: stagevm-discover --binary /usr/sbin/mariadbd --request do_command
/// --ready 'mariadb-admin ping' --load 'sysbench oltp_read_only ... run' -- mariadbd --datadir=...
#[derive(Parser, Debug)]
#[command(
    version,
    after_help = "The server runs under Valgrind (~50x slower) only for the capture; it is stopped \
    (SIGTERM, then SIGKILL) when the capture ends, fails or is interrupted. Needs Debian's valgrind package."
)]
struct Args {
    /// The server's ELF binary, with function symbols (.symtab or .dynsym); default: SERVER.
    #[arg(long)]
    binary: Option<PathBuf>,
    /// The function a thread enters to serve each request: a C function or C++ free function by
    /// name, anything else by its mangled symbol (default: the first of do_command,
    /// ap_process_request, handle_request, process_request the binary has).
    #[arg(long, value_name = "SYMBOL")]
    request: Option<String>,
    /// Stages to consider: N or MIN..MAX (2..16).
    #[arg(long, default_value = "2..4", value_parser = parse_stages)]
    stages: (usize, usize),
    /// Per-core L2 to model, e.g. 512K or 2M (default: this host's, from sysfs; else 512K).
    #[arg(long, value_name = "SIZE")]
    l2: Option<String>,
    /// Cores to model (default: this host's online CPUs).
    #[arg(long)]
    cores: Option<usize>,
    /// How a thread reaches its next stage in the model: temporal (the preload library's gate,
    /// its switch cost measured on this host), linux or unikernel (spatial, a vCPU's migration).
    #[arg(long, value_enum, default_value = "temporal")]
    mechanism: Mechanism,
    /// With temporal: the CPU a stage switch costs, ns, instead of measuring the gate's handoff
    /// on this host once the capture ends (~3 s; `stagevm-gatectl measure` prints the same figures).
    #[arg(long, value_name = "NS")]
    switch_ns: Option<f64>,
    /// The load: a shell command that drives the server (it runs inside the traced window).
    #[arg(long, value_name = "CMD")]
    load: String,
    /// A shell command retried every 0.5 s until it succeeds once the server is up
    /// (default: wait until the server listens on a TCP port).
    #[arg(long, value_name = "CMD")]
    ready: Option<String>,
    /// A shell command run before the traced window (warm-up; not traced).
    #[arg(long, value_name = "CMD")]
    warmup: Option<String>,
    /// A shell command run after the load, once the window is asked to close (one request that
    /// makes the server end it at a request's start).
    #[arg(long, value_name = "CMD")]
    close: Option<String>,
    /// Longest load, s: a load still running then is stopped and the capture kept.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Bound on the traced instructions (0: none); the window closes at the next request's start.
    #[arg(long, default_value_t = 400_000_000)]
    max_instrs: u64,
    /// Longest wait for the server to be ready, and longest warm-up or close command, s (one try
    /// of --ready: 10 s at most).
    #[arg(long, default_value_t = 300)]
    ready_timeout: u64,
    /// Longest wait for the server to exit after SIGTERM before SIGKILL, s.
    #[arg(long, default_value_t = 60)]
    stop_timeout: u64,
    /// The stage-map file to write (default: ./NAME.stagemap, NAME the binary's).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Keep the capture's files (trace, logs, simulator output) in this folder (default: a
    /// temporary folder, removed at the end).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Capture only: write the trace here and stop (bench/capture/capture.sh uses this).
    #[arg(long, value_name = "PATH")]
    trace_only: Option<PathBuf>,
    /// The tool's stage table (`HEXADDR STAGE FLAGS NAME` lines, `T` on the window trigger)
    /// instead of the request marker alone; with --trace-only.
    #[arg(long, requires = "trace_only")]
    table: Option<PathBuf>,
    /// The server's command line.
    #[arg(last = true, required = true, value_name = "SERVER")]
    server: Vec<OsString>,
}

/// `N` or `MIN..MAX` within 2..=16.
fn parse_stages(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once("..").unwrap_or((s, s));
    let n = |x: &str| {
        x.trim()
            .parse::<usize>()
            .map_err(|_| format!("'{s}': expected N or MIN..MAX, e.g. 2..4"))
    };
    let (a, b) = (n(a)?, n(b)?);
    if a < 2 || b > stagesim::stagemap::MAX_STAGES || a > b {
        return Err(format!(
            "'{s}': stages must be within 2..{}",
            stagesim::stagemap::MAX_STAGES
        ));
    }
    Ok((a, b))
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STAGEVM_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .init();
    if let Err(e) = run(Args::parse()) {
        eprintln!("stagevm-discover: error: {e:#}");
        std::process::exit(1);
    }
}

/// From the arguments to the stage map and the report: the sequence of steps
/// below, each checked before the next (the arguments and the model's host
/// before the capture's minutes). Progress goes to stderr, the report to
/// stdout. Errors: the first step's that fails.
fn run(a: Args) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let mut say = |m: &str| {
        eprintln!(
            "[stagevm-discover {:>5.1}s] {m}",
            t0.elapsed().as_secs_f64()
        )
    };
    let server = steps::resolve_server(&a)?;
    let host = steps::model_host(&a)?;
    let tools = steps::find_tools(&a)?;
    // Declared after `tools`: the temporary folder goes first on drop.
    let (work, _tmp) = steps::work_folder(&a)?;
    if server.binary != server.given {
        say(&format!(
            "{} is a link to {}: tracing that file",
            server.given.display(),
            server.binary.display()
        ));
    }
    say(&format!(
        "{}: {} function symbols; request marker {}; work folder {}",
        server.binary.display(),
        server.functions,
        server.request,
        work.display()
    ));
    let traced = steps::capture_trace(&a, &server, tools.vglib.path(), &work, &mut say)?;
    if let Some(dest) = &a.trace_only {
        return steps::write_trace(&traced.cap.trace, dest, &mut say);
    }
    let sim = tools.sim.expect("stagesim found unless --trace-only");
    // Measured once the server is stopped, so it is not in the figure.
    let route = steps::route(a.mechanism, a.switch_ns, &mut say)?;
    steps::write_sidecar(&traced.cap, &server.marker_names)?;
    let common = steps::sim_args(&traced.cap.trace, &server.binary, &host, &route);
    let d = steps::discover_stages(&sim, &common, &route, a.stages, &host, &work, &mut say)?;
    let map = steps::write_map(a.out.as_deref(), &server.binary, &work, d.parts)?;
    say(&format!(
        "{} stages chosen; replaying the map against the unstaged models",
        d.parts
    ));
    let p = steps::replay(&sim, common, &route, &map, &work, &mut say)?;
    let facts = report::Facts {
        binary: &server.binary,
        request: &server.request,
        instrs: traced.instrs,
        threads: traced.threads,
        load_seconds: traced.cap.load_seconds,
        cores: host.cores,
        l2: host.l2,
        route: &route,
        map: &map,
    };
    print!("{}", report::render(&facts, &d, &p));
    Ok(())
}
