//! `stagevm-discover`: runs a server under the stgtrace Valgrind tool while
//! a load drives it, finds its request-level stage points in the cache
//! simulator, and writes `NAME.stagemap` and a report (see the crate docs).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;

use stagevm_discover::capture::{self, CaptureSpec};
use stagevm_discover::elf::{self, ServerBinary};
use stagevm_discover::model::{
    self, Mechanism, Prediction, Route, L2, MIN_PRESENT_PCT, SLICE, TRANSFER_CYCLES,
};
use stagevm_discover::{report, tools};

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

/// The program `p` as the shell would find it.
fn which(p: &Path) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return Some(p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
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

/// The temporal route: the switch cost given (`--switch-ns`), or the
/// preload library's gate handoff measured on this host now, on the last CPU
/// this process may use; cycles at this host's clock (/proc/cpuinfo).
fn temporal_route(given: Option<f64>, say: &mut dyn FnMut(&str)) -> anyhow::Result<Route> {
    let (mhz, clock) = match model::host_mhz() {
        Some(m) => (m, format!("{m:.0} MHz")),
        None => (
            2500.0,
            "2500 MHz assumed: /proc/cpuinfo gives no clock".to_string(),
        ),
    };
    if let Some(ns) = given {
        return Ok(Route::temporal(
            ns,
            mhz,
            format!("--switch-ns {ns}, at {clock}"),
        ));
    }
    let cpu = stagevm_preload::costs::default_cpu()?;
    say(&format!(
        "measuring the stage point and the gate's handoff on CPU {cpu} (~3 s; \
         anything else running there is in the figure)"
    ));
    let k = stagevm_preload::costs::measure(cpu, 5, 200_000).with_context(|| {
        format!("measuring the gate on CPU {cpu} (give the switch cost with --switch-ns NS)")
    })?;
    let src = format!(
        "the gate's handoff measured here: {:.2} µs (spread {:.2}) with {} threads on CPU {cpu}; \
         a stage point {:.1} ns with the gate off, {:.0} ns through it alone; at {clock}",
        k.handoff.median_ns / 1000.0,
        k.handoff.spread_ns / 1000.0,
        stagevm_preload::costs::HANDOFF_THREADS,
        k.point_off.median_ns,
        k.point_on.median_ns
    );
    say(&src);
    Ok(Route::temporal(k.handoff.median_ns, mhz, src))
}

fn run(a: Args) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let mut say = |m: &str| {
        eprintln!(
            "[stagevm-discover {:>5.1}s] {m}",
            t0.elapsed().as_secs_f64()
        )
    };
    let program = which(Path::new(&a.server[0]))
        .with_context(|| format!("{}: not found in PATH", a.server[0].to_string_lossy()))?;
    let given = a.binary.clone().unwrap_or_else(|| program.clone());
    // A link (Debian's /usr/bin/redis-server → redis-check-rdb) is traced
    // as the file it names: the tool matches the mapped file's name.
    let binary =
        std::fs::canonicalize(&given).with_context(|| format!("--binary {}", given.display()))?;
    let bin = ServerBinary::open(&binary)?;
    let (request, table, marker_names) = match &a.table {
        Some(t) => {
            let text =
                std::fs::read_to_string(t).with_context(|| format!("--table {}", t.display()))?;
            ("(the table's trigger)".to_string(), text, Vec::new())
        }
        None => {
            let (name, f) = bin.request_marker(a.request.as_deref())?;
            let names: Vec<String> = f.iter().map(|f| f.name.clone()).collect();
            (name, elf::request_table(&f), names)
        }
    };
    // The model's host, checked before the capture's minutes.
    let cores = a
        .cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    if !(1..=64).contains(&cores) {
        bail!("--cores {cores}: must be 1..=64");
    }
    let l2 = match &a.l2 {
        Some(s) => L2 {
            kib: model::parse_size(s).map_err(|e| anyhow::anyhow!("--l2 {e}"))? / 1024,
            ways: L2::of_host().map_or(8, |h| h.ways),
        },
        None => L2::of_host().unwrap_or(L2 { kib: 512, ways: 8 }),
    };
    stagesim::cache::Geometry::kib(l2.kib, l2.ways, 64)
        .validate("L2")
        .with_context(|| format!("--l2: {} KiB {}-way cannot be modelled", l2.kib, l2.ways))?;
    if let Some(ns) = a.switch_ns {
        if a.mechanism != Mechanism::Temporal {
            bail!(
                "--switch-ns is the temporal mechanism's cost; --mechanism is {:?}",
                a.mechanism
            );
        }
        if !(ns.is_finite() && (0.0..=1e6).contains(&ns)) {
            bail!("--switch-ns {ns}: must be 0..=1000000 ns");
        }
    }
    let exe_name = binary
        .file_name()
        .context("--binary: no file name")?
        .to_string_lossy()
        .into_owned();
    let tool = tools::stgtrace()?;
    let sim = if a.trace_only.is_none() {
        Some(tools::stagesim()?)
    } else {
        None
    };
    let vglib = tools::ValgrindLib::new(&tool)?;
    let tmp;
    let work = match &a.work_dir {
        Some(w) => w.clone(),
        None => {
            tmp = tempfile::Builder::new()
                .prefix("stagevm-discover.")
                .tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    if binary != given {
        say(&format!(
            "{} is a link to {}: tracing that file",
            given.display(),
            binary.display()
        ));
    }
    say(&format!(
        "{}: {} function symbols; request marker {request}; work folder {}",
        binary.display(),
        bin.functions.len(),
        work.display()
    ));
    capture::catch_interrupts();
    let spec = CaptureSpec {
        server: a.server.clone(),
        exe_name,
        binary: binary.clone(),
        table,
        ready: a.ready.clone(),
        warmup: a.warmup.clone(),
        load: a.load.clone(),
        close: a.close.clone(),
        ready_timeout: Duration::from_secs(a.ready_timeout),
        duration: Duration::from_secs(a.duration),
        stop_timeout: Duration::from_secs(a.stop_timeout),
        max_instrs: a.max_instrs,
        work: work.clone(),
        valgrind_lib: vglib.path().to_path_buf(),
    };
    let cap = capture::run(&spec, &mut say)?;
    let instrs = cap
        .stats
        .get("window_instructions_fetch_records")
        .copied()
        .unwrap_or(0);
    let threads = cap.stats.get("threads").copied().unwrap_or(0) as usize;
    if instrs == 0 {
        bail!(
            "no request was traced: the window opens at the first entry of {request} after the \
             server is ready, and none came while the load ran ({:.1} s). Check that the load \
             reaches this server, or name the function a thread enters for each request with \
             --request SYMBOL",
            cap.load_seconds
        );
    }
    say(&format!(
        "traced {instrs} instructions in {threads} threads{}",
        if cap.stats.get("max_instrs_reached") == Some(&1) {
            " (--max-instrs reached)"
        } else {
            ""
        }
    ));
    if let Some(dest) = &a.trace_only {
        std::fs::copy(&cap.trace, dest)
            .with_context(|| format!("--trace-only {}", dest.display()))?;
        say(&format!("wrote {}", dest.display()));
        return Ok(());
    }
    let sim = sim.expect("stagesim found unless --trace-only");
    // Measured once the server is stopped, so it is not in the figure.
    let route = match a.mechanism {
        Mechanism::Temporal => temporal_route(a.switch_ns, &mut say)?,
        m => Route::spatial(m),
    };
    let sidecar = stagesim::trace::Sidecar {
        stages: vec![stagesim::trace::StageEntry {
            id: 0,
            name: "request".into(),
            symbols: marker_names,
        }],
        capture: Some(stagesim::trace::CaptureMeta {
            text_bias: cap.text_bias.map(|b| format!("{b:#x}")),
        }),
    };
    let side = stagesim::trace::Sidecar::path_for(&cap.trace);
    std::fs::write(&side, toml::to_string(&sidecar)?)
        .with_context(|| side.display().to_string())?;

    let mut common: Vec<String> = vec![
        "--trace".into(),
        cap.trace.display().to_string(),
        "--binary".into(),
        binary.display().to_string(),
        "--block-at".into(),
        "request".into(),
        "--cores".into(),
        cores.to_string(),
        "--l2".into(),
        l2.arg(),
        "--slice".into(),
        SLICE.to_string(),
        "--transfer-cycles".into(),
        TRANSFER_CYCLES.to_string(),
        // The VMM's `static` without budgets: equal weights (host-sched).
        "--static-weights".into(),
        "equal".into(),
    ];
    common.extend(route.cost_args());
    let prefix = work.join("points");
    let djson = work.join("discover.json");
    say(&format!(
        "request-level discovery (seed 004) for {}..{} stages at {cores} cores, L2 {} KiB \
         (minutes on a large trace; stagesim's output: {})",
        a.stages.0,
        a.stages.1,
        l2.kib,
        work.join("discover.log").display()
    ));
    let mut dargs = common.clone();
    dargs.extend(route.discover_args());
    dargs.extend([
        "--max-parts".into(),
        a.stages.1.max(2).to_string(),
        "--min-present-pct".into(),
        MIN_PRESENT_PCT.to_string(),
        "--map-out".into(),
        prefix.display().to_string(),
        "--json".into(),
        djson.display().to_string(),
    ]);
    let mut args = vec!["discover".to_string()];
    args.extend(dargs);
    model::stagesim(
        &sim,
        "discover",
        &args,
        &work.join("discover.log"),
        &mut say,
    )?;
    let d = model::read_discovery(&djson, a.stages.0)?;
    let chosen = work.join(format!("points-{}.stagemap", d.parts));
    let out = a.out.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "{}.stagemap",
            binary
                .file_name()
                .map_or("server".into(), |n| n.to_string_lossy())
        ))
    });
    let text = std::fs::read_to_string(&chosen).with_context(|| chosen.display().to_string())?;
    stagesim::stagemap::StageMapFile::parse(&text)
        .with_context(|| format!("{} as written", chosen.display()))?;
    std::fs::write(&out, &text).with_context(|| format!("--out {}", out.display()))?;
    say(&format!(
        "{} stages chosen; replaying the map against the unstaged models",
        d.parts
    ));
    let rjson = work.join("replay.json");
    let mut args = vec!["replay".to_string()];
    args.extend(common);
    args.extend(route.replay_args());
    args.extend([
        "--stage-map".into(),
        out.display().to_string(),
        "--json".into(),
        rjson.display().to_string(),
    ]);
    model::stagesim(&sim, "replay", &args, &work.join("replay.log"), &mut say)?;
    let p = Prediction::read(&rjson, route.mechanism)?;
    let facts = report::Facts {
        binary: &binary,
        request: &request,
        instrs,
        threads,
        load_seconds: cap.load_seconds,
        cores,
        l2,
        route: &route,
        map: &out,
    };
    print!("{}", report::render(&facts, &d, &p));
    Ok(())
}
