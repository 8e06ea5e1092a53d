//! The steps of a `stagevm-discover` run, in the order `run` (in main.rs)
//! takes them: the server and its request marker, the model's host, the
//! tools, the work folder, the capture, the route, the sidecar, the
//! discovery, the map, the replay. A module of the binary, not the library:
//! the steps read the command line's [`Args`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};

use stagevm_discover::capture::{self, CaptureSpec};
use stagevm_discover::elf::{self, ServerBinary};
use stagevm_discover::model::{
    self, Mechanism, Prediction, Route, L2, MIN_PRESENT_PCT, SLICE, TRANSFER_CYCLES,
};
use stagevm_discover::tools;

use crate::Args;

/// The program `p` as the shell would find it.
fn which(p: &Path) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return Some(p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
}

/// The server as the capture and the model see it ([`resolve_server`]).
pub(crate) struct Server {
    /// The binary named: `--binary`, else the server's program from PATH.
    pub(crate) given: PathBuf,
    /// `given` with its links resolved: the file traced.
    pub(crate) binary: PathBuf,
    /// `binary`'s file name (the tool matches the mapped file's name).
    pub(crate) exe_name: String,
    /// How many function symbols `binary` has.
    pub(crate) functions: usize,
    /// The request marker's name (for messages and the report).
    pub(crate) request: String,
    /// The tool's stage table: `--table`'s text, else the marker's.
    pub(crate) table: String,
    /// The marker's function names (none with `--table`): the sidecar's.
    pub(crate) marker_names: Vec<String>,
}

/// Resolves the server to trace: its program as the shell finds it, the
/// binary (`--binary`, else that program; a link — Debian's
/// /usr/bin/redis-server → redis-check-rdb — is traced as the file it
/// names), its function symbols, and the tool's stage table (`--table`'s
/// text, else the request marker's: `--request`, else the first known name
/// the binary has).
///
/// Errors: the program not in PATH, the binary missing or not an ELF file
/// with symbols, no request marker (or `--request` naming no function),
/// `--table` unreadable.
pub(crate) fn resolve_server(a: &Args) -> anyhow::Result<Server> {
    let program = which(Path::new(&a.server[0]))
        .with_context(|| format!("{}: not found in PATH", a.server[0].to_string_lossy()))?;
    let given = a.binary.clone().unwrap_or_else(|| program.clone());
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
    // A canonical path has a file name unless it is `/`, which is no ELF
    // file: this cannot fail once `open` succeeded.
    let exe_name = binary
        .file_name()
        .context("--binary: no file name")?
        .to_string_lossy()
        .into_owned();
    Ok(Server {
        functions: bin.functions.len(),
        given,
        binary,
        exe_name,
        request,
        table,
        marker_names,
    })
}

/// The host the model stands for ([`model_host`]).
pub(crate) struct ModelHost {
    /// Cores, 1..=64.
    pub(crate) cores: usize,
    /// The per-core L2 (size KiB, ways), one the simulator can model.
    pub(crate) l2: L2,
}

/// The host to model, checked before the capture's minutes: `--cores`
/// (default: this host's online CPUs, else 2), `--l2` (a size; default this
/// host's from sysfs, else 512 KiB; ways this host's, else 8), and that
/// `--switch-ns` (ns) goes with the temporal mechanism.
///
/// Errors: cores outside 1..=64, an L2 size that does not parse or that the
/// cache simulator cannot model (64-byte lines), `--switch-ns` with a
/// spatial mechanism or outside 0..=1,000,000 ns.
pub(crate) fn model_host(a: &Args) -> anyhow::Result<ModelHost> {
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
    Ok(ModelHost { cores, l2 })
}

/// The programs a run needs ([`find_tools`]).
pub(crate) struct Tools {
    /// `stagesim`; none with `--trace-only` (not needed, not looked for).
    pub(crate) sim: Option<PathBuf>,
    /// Valgrind's support folder for the stgtrace tool; removed on drop.
    pub(crate) vglib: tools::ValgrindLib,
}

/// Finds the stgtrace tool, `stagesim` unless `--trace-only`, and makes the
/// tool's `VALGRIND_LIB` folder.
///
/// Errors: a program not found (the error says where it was looked for),
/// Valgrind not installed, the folder not made.
pub(crate) fn find_tools(a: &Args) -> anyhow::Result<Tools> {
    let tool = tools::stgtrace()?;
    let sim = if a.trace_only.is_none() {
        Some(tools::stagesim()?)
    } else {
        None
    };
    let vglib = tools::ValgrindLib::new(&tool)?;
    Ok(Tools { sim, vglib })
}

/// The work folder: `--work-dir` (kept), else a new temporary folder.
/// Returns the folder and, for a temporary one, its guard, which removes it
/// on drop. Errors: the temporary folder not made.
pub(crate) fn work_folder(a: &Args) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    Ok(match &a.work_dir {
        Some(w) => (w.clone(), None),
        None => {
            let tmp = tempfile::Builder::new()
                .prefix("stagevm-discover.")
                .tempdir()?;
            (tmp.path().to_path_buf(), Some(tmp))
        }
    })
}

/// What the capture traced ([`capture_trace`]).
pub(crate) struct Traced {
    /// The trace, its load bias, the tool's counters, the load's seconds.
    pub(crate) cap: capture::Captured,
    /// Instructions in the traced window (count, > 0).
    pub(crate) instrs: u64,
    /// Threads in the trace.
    pub(crate) threads: usize,
}

/// Captures the trace ([`capture::run`]): the server under the stgtrace
/// tool (`vglib` its `VALGRIND_LIB`), the warm-up, the load in the traced
/// window, the close and the stop, its files in `work`; interrupts stop the
/// server instead of this process. Says how much was traced.
///
/// Errors: the capture's (the server exits early or is not ready in time, a
/// command fails, an interrupt), and an empty window (no request traced:
/// the marker was not entered while the load ran).
pub(crate) fn capture_trace(
    a: &Args,
    server: &Server,
    vglib: &Path,
    work: &Path,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Traced> {
    capture::catch_interrupts();
    let spec = CaptureSpec {
        server: a.server.clone(),
        exe_name: server.exe_name.clone(),
        binary: server.binary.clone(),
        table: server.table.clone(),
        ready: a.ready.clone(),
        warmup: a.warmup.clone(),
        load: a.load.clone(),
        close: a.close.clone(),
        ready_timeout: Duration::from_secs(a.ready_timeout),
        duration: Duration::from_secs(a.duration),
        stop_timeout: Duration::from_secs(a.stop_timeout),
        max_instrs: a.max_instrs,
        work: work.to_path_buf(),
        valgrind_lib: vglib.to_path_buf(),
    };
    let cap = capture::run(&spec, say)?;
    let instrs = cap
        .stats
        .get("window_instructions_fetch_records")
        .copied()
        .unwrap_or(0);
    let threads = cap.stats.get("threads").copied().unwrap_or(0) as usize;
    if instrs == 0 {
        bail!(
            "no request was traced: the window opens at the first entry of {} after the \
             server is ready, and none came while the load ran ({:.1} s). Check that the load \
             reaches this server, or name the function a thread enters for each request with \
             --request SYMBOL",
            server.request,
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
    Ok(Traced {
        cap,
        instrs,
        threads,
    })
}

/// `--trace-only DEST`: copies the capture's `trace` to `dest` and says so.
/// Errors: the copy failing.
pub(crate) fn write_trace(
    trace: &Path,
    dest: &Path,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<()> {
    std::fs::copy(trace, dest).with_context(|| format!("--trace-only {}", dest.display()))?;
    say(&format!("wrote {}", dest.display()));
    Ok(())
}

/// The mechanism the model charges and its cost, once the server is
/// stopped (so the capture is not in a measured figure): temporal's from
/// [`temporal_route`], a spatial mechanism's fixed. Errors: temporal's.
pub(crate) fn route(
    mechanism: Mechanism,
    switch_ns: Option<f64>,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Route> {
    Ok(match mechanism {
        Mechanism::Temporal => temporal_route(switch_ns, say)?,
        m => Route::spatial(m),
    })
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

/// Writes the trace's sidecar beside it ([`stagesim::trace::Sidecar`]): one
/// stage, `request`, entered at `marker_names` (none: the table's trigger),
/// and the binary's load bias under Valgrind (hex). Errors: serialising or
/// writing it.
pub(crate) fn write_sidecar(
    cap: &capture::Captured,
    marker_names: &[String],
) -> anyhow::Result<()> {
    let sidecar = stagesim::trace::Sidecar {
        stages: vec![stagesim::trace::StageEntry {
            id: 0,
            name: "request".into(),
            symbols: marker_names.to_vec(),
        }],
        capture: Some(stagesim::trace::CaptureMeta {
            text_bias: cap.text_bias.map(|b| format!("{b:#x}")),
        }),
    };
    let side = stagesim::trace::Sidecar::path_for(&cap.trace);
    std::fs::write(&side, toml::to_string(&sidecar)?)
        .with_context(|| side.display().to_string())?;
    Ok(())
}

/// `stagesim`'s arguments common to the discovery and the replay: the
/// `trace` of `binary` blocked at `request`, the modelled host, the slice
/// and transfer cost ([`SLICE`], [`TRANSFER_CYCLES`], cycles), equal static
/// weights (the VMM's `static` without budgets, host-sched), and the
/// route's cost.
pub(crate) fn sim_args(
    trace: &Path,
    binary: &Path,
    host: &ModelHost,
    route: &Route,
) -> Vec<String> {
    let mut common: Vec<String> = vec![
        "--trace".into(),
        trace.display().to_string(),
        "--binary".into(),
        binary.display().to_string(),
        "--block-at".into(),
        "request".into(),
        "--cores".into(),
        host.cores.to_string(),
        "--l2".into(),
        host.l2.arg(),
        "--slice".into(),
        SLICE.to_string(),
        "--transfer-cycles".into(),
        TRANSFER_CYCLES.to_string(),
        // The VMM's `static` without budgets: equal weights (host-sched).
        "--static-weights".into(),
        "equal".into(),
    ];
    common.extend(route.cost_args());
    common
}

/// Runs the request-level discovery (seed 004) in `sim` (`stagesim
/// discover`, `common` from [`sim_args`]) for `stages` = (min, max) stages:
/// its maps to `work/points-N.stagemap`, its choice to `work/discover.json`,
/// its output to `work/discover.log` (minutes on a large trace). Returns the
/// choice read back.
///
/// Errors: `stagesim` failing, its JSON unreadable, or no choice of at least
/// `stages.0` stages.
pub(crate) fn discover_stages(
    sim: &Path,
    common: &[String],
    route: &Route,
    stages: (usize, usize),
    host: &ModelHost,
    work: &Path,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<model::Discovery> {
    let prefix = work.join("points");
    let djson = work.join("discover.json");
    say(&format!(
        "request-level discovery (seed 004) for {}..{} stages at {} cores, L2 {} KiB \
         (minutes on a large trace; stagesim's output: {})",
        stages.0,
        stages.1,
        host.cores,
        host.l2.kib,
        work.join("discover.log").display()
    ));
    let mut dargs = common.to_vec();
    dargs.extend(route.discover_args());
    dargs.extend([
        "--max-parts".into(),
        stages.1.max(2).to_string(),
        "--min-present-pct".into(),
        MIN_PRESENT_PCT.to_string(),
        "--map-out".into(),
        prefix.display().to_string(),
        "--json".into(),
        djson.display().to_string(),
    ]);
    let mut args = vec!["discover".to_string()];
    args.extend(dargs);
    model::stagesim(sim, "discover", &args, &work.join("discover.log"), say)?;
    Ok(model::read_discovery(&djson, stages.0)?)
}

/// Writes the map of `parts` stages the discovery chose
/// (`work/points-PARTS.stagemap`, checked to parse) to `out`, default
/// `./NAME.stagemap` with NAME `binary`'s file name. Returns the path
/// written.
///
/// Errors: the chosen map unreadable or not a valid stage map, `out` not
/// written.
pub(crate) fn write_map(
    out: Option<&Path>,
    binary: &Path,
    work: &Path,
    parts: usize,
) -> anyhow::Result<PathBuf> {
    let chosen = work.join(format!("points-{parts}.stagemap"));
    let out = out.map(Path::to_path_buf).unwrap_or_else(|| {
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
    Ok(out)
}

/// Replays the stage map at `map` against the unstaged models in `sim`
/// (`stagesim replay`, `common` from [`sim_args`]): its results to
/// `work/replay.json`, its output to `work/replay.log`. Returns the
/// prediction for the route's mechanism.
///
/// Errors: `stagesim` failing or its JSON unreadable.
pub(crate) fn replay(
    sim: &Path,
    common: Vec<String>,
    route: &Route,
    map: &Path,
    work: &Path,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Prediction> {
    let rjson = work.join("replay.json");
    let mut args = vec!["replay".to_string()];
    args.extend(common);
    args.extend(route.replay_args());
    args.extend([
        "--stage-map".into(),
        map.display().to_string(),
        "--json".into(),
        rjson.display().to_string(),
    ]);
    model::stagesim(sim, "replay", &args, &work.join("replay.log"), say)?;
    Ok(Prediction::read(&rjson, route.mechanism)?)
}
