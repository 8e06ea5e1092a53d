//! The subcommands' drivers: [`run`] dispatches a parsed command line;
//! `synth`, `plot`, `results`, `stats` and `info` are here, `replay` and
//! `discover` in their own files. [`load`] reads a trace with a progress bar.

use std::path::Path;
use std::time::Instant;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};

use stagesim::groups::StageGroups;
use stagesim::report::Report;
use stagesim::stream::Trace;
use stagesim::synth::{self, SynthConfig};
use stagesim::trace::Sidecar;

use crate::cli::args::{PlotArgs, SynthArgs};
use crate::cli::{Cli, Cmd};

mod batch;
mod discover;
mod points;
mod replay;

/// Runs the command `cli` names.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Replay(a) => replay::replay(*a),
        Cmd::ReplayBatch { file } => batch::replay_batch(&file),
        Cmd::Synth(a) => synth(a),
        Cmd::Plot(a) => plot(a),
        Cmd::Discover(a) => discover::discover(*a),
        Cmd::Results {
            dir,
            traces,
            out,
            notes,
            plots,
            print,
            temporal,
        } => {
            if temporal {
                results_temporal(&dir, &traces, &out, notes.as_deref(), print)
            } else {
                results(&dir, &traces, &out, notes.as_deref(), &plots, print)
            }
        }
        Cmd::Stats {
            trace,
            sidecar,
            stage_groups,
            line,
            json,
        } => stats(
            &trace,
            sidecar.as_deref(),
            &stage_groups,
            line,
            json.as_deref(),
        ),
        Cmd::Info { trace, sidecar } => info(&trace, sidecar.as_deref()),
    }
}

/// `stagesim synth`.
fn synth(a: SynthArgs) -> anyhow::Result<()> {
    let cfg = SynthConfig {
        threads: a.threads,
        stages: a.stages,
        stage_kib: a.stage_kib,
        common_kib: a.common_kib,
        requests: a.requests,
        visit_instrs: a.visit_instrs,
        visit_weights: a.visit_weights.unwrap_or_default(),
        heap_kib: a.heap_kib,
        stack_kib: a.stack_kib,
        data_per_block: a.data_per_block,
        seed: a.seed,
    };
    let t0 = Instant::now();
    let s = synth::write(&a.out, &cfg)?;
    println!(
        "stagesim synth: {} ({} threads, {} stages × {} KiB): {} instructions, {} records, {:.1} MB raw, {:.1} MB compressed, {:.1} s",
        a.out.display(),
        cfg.threads,
        cfg.stages,
        cfg.stage_kib,
        s.instrs,
        s.records,
        s.raw_bytes as f64 / 1e6,
        std::fs::metadata(&a.out)?.len() as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `stagesim plot`.
fn plot(a: PlotArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.json).with_context(|| format!("{}", a.json.display()))?;
    let rep: Report =
        serde_json::from_str(&text).with_context(|| format!("{}", a.json.display()))?;
    let prefix = a.prefix.unwrap_or_else(|| {
        a.json
            .file_stem()
            .map_or("stagesim".into(), |s| s.to_string_lossy().into_owned())
    });
    let files = if a.sweep {
        stagesim::plot::plot_sweep(&rep, &a.out_dir, &prefix)?
    } else {
        stagesim::plot::plot_report(&rep, &a.out_dir, &prefix)?
    };
    for p in files {
        println!("stagesim plot: wrote {}", p.display());
    }
    Ok(())
}

/// `stagesim results`.
fn results(
    dir: &Path,
    traces: &[String],
    out: &Path,
    notes: Option<&Path>,
    plots: &Path,
    print: bool,
) -> anyhow::Result<()> {
    let notes = read_notes(notes)?;
    let mut pngs: Vec<String> = std::fs::read_dir(plots)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".png"))
                .collect()
        })
        .unwrap_or_default();
    pngs.sort();
    let text = stagesim::results::section(dir, traces, notes.as_deref(), &pngs);
    if print {
        print!("{text}");
    } else {
        stagesim::results::write_section(out, &text)?;
        println!(
            "stagesim results: wrote the stagesim section of {}",
            out.display()
        );
    }
    Ok(())
}

/// The hand-written notes file of `results --notes`, if one is given.
fn read_notes(notes: Option<&Path>) -> anyhow::Result<Option<String>> {
    notes
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("--notes {}", p.display())))
        .transpose()
}

/// `stagesim results --temporal`: issue 40's section, between its own
/// markers.
fn results_temporal(
    dir: &Path,
    traces: &[String],
    out: &Path,
    notes: Option<&Path>,
    print: bool,
) -> anyhow::Result<()> {
    let notes = read_notes(notes)?;
    let text = stagesim::results::temporal::section(dir, traces, notes.as_deref());
    if print {
        print!("{text}");
    } else {
        let old = std::fs::read_to_string(out).unwrap_or_default();
        std::fs::write(out, stagesim::results::temporal::splice(&old, &text))
            .with_context(|| format!("{}", out.display()))?;
        println!(
            "stagesim results: wrote the temporal section of {}",
            out.display()
        );
    }
    Ok(())
}

/// `stagesim stats`.
fn stats(
    trace: &Path,
    sidecar: Option<&Path>,
    stage_groups: &[String],
    line: u64,
    json: Option<&Path>,
) -> anyhow::Result<()> {
    anyhow::ensure!(line.is_power_of_two(), "--line {line}: not a power of two");
    let t = load(trace, sidecar)?;
    let mut all = Vec::new();
    for spec in stage_groups {
        let g = StageGroups::parse(spec, &t.stages)?;
        let st = stagesim::analysis::analyze(&t, &g, line);
        println!(
            "stagesim stats: {} grouped as {}",
            trace.display(),
            g.full_spec()
        );
        print!("{}", stagesim::analysis::render(&st));
        all.push(serde_json::json!({ "grouping": g, "stats": st }));
    }
    if let Some(p) = json {
        write_file(p, &serde_json::to_string_pretty(&all)?)?;
        println!("stagesim stats: wrote {}", p.display());
    }
    Ok(())
}

/// `stagesim info`.
fn info(trace: &Path, sidecar: Option<&Path>) -> anyhow::Result<()> {
    let t = load(trace, sidecar)?;
    println!(
        "{}: {} instructions, {} records, {} threads, {:.1} MB decompressed, {:.1} MB in memory",
        trace.display(),
        t.instrs,
        t.records,
        t.threads.len(),
        t.raw_bytes as f64 / 1e6,
        t.memory_bytes() as f64 / 1e6
    );
    for s in &t.stages {
        println!("  stage id {:>5} {}", s.id, s.name);
    }
    for th in &t.threads {
        println!(
            "  thread {:>8}: {:>12} instructions, {:>10} events",
            th.tid,
            th.instrs,
            th.events.len()
        );
    }
    Ok(())
}

/// Writes `text` to `path`, naming the path in errors.
pub fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("{}", path.display()))
}

/// A progress bar with `template` (indicatif syntax).
pub fn progress_bar(len: u64, template: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// The sidecar of the trace at `path`: `sidecar` if given, else its own
/// `<trace>.stages.toml`, else an empty one.
pub fn read_sidecar(path: &Path, sidecar: Option<&Path>) -> anyhow::Result<Sidecar> {
    Ok(match sidecar {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("--sidecar {}", p.display()))?;
            Sidecar::parse(&text, &p.display().to_string())?
        }
        None => Sidecar::load_for(path)?.unwrap_or_default(),
    })
}

/// The function symbols of the traced `binary` at trace addresses, moved by
/// `text_bias` (`--text-bias`), else by `sidecar`'s `[capture] text_bias`,
/// else not at all; and that bias.
pub fn binary_symbols(
    binary: &Path,
    text_bias: Option<&str>,
    sidecar: &Sidecar,
) -> anyhow::Result<(stagesim::symbols::Symbols, u64)> {
    let from_sidecar = sidecar
        .capture
        .as_ref()
        .and_then(|c| c.text_bias.as_deref());
    let bias = match text_bias.or(from_sidecar) {
        Some(b) => stagesim::symbols::parse_bias(b)?,
        None => 0,
    };
    Ok((stagesim::symbols::Symbols::from_elf(binary, bias)?, bias))
}

/// The dense index of the request-marker stage `name` (`--block-at`) in
/// `trace`; the error says `what` needs it.
pub fn marker_stage(trace: &Trace, name: &str, what: &str) -> anyhow::Result<usize> {
    trace
        .stages
        .iter()
        .position(|s| s.name == name)
        .with_context(|| {
            format!("{what} needs the request-marker stage '{name}' (--block-at) in the trace")
        })
}

/// Loads a trace (with `sidecar` or its own `<trace>.stages.toml`), showing progress.
pub fn load(path: &Path, sidecar: Option<&Path>) -> anyhow::Result<Trace> {
    let t0 = Instant::now();
    let size = std::fs::metadata(path)
        .with_context(|| format!("{}", path.display()))?
        .len();
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("loading {msg} {bytes} decompressed [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(path.display().to_string());
    let sidecar = read_sidecar(path, sidecar)?;
    let reader = stagesim::trace::RecordReader::open(path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let t = Trace::from_reader(reader, &sidecar, |off| pb.set_position(off))
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    pb.finish_and_clear();
    eprintln!(
        "stagesim: loaded {} ({:.1} MB compressed) in {:.1} s: {} instructions, {} threads, {} stages, {:.0} MB of events",
        path.display(),
        size as f64 / 1e6,
        t0.elapsed().as_secs_f64(),
        t.instrs,
        t.threads.len(),
        t.stages.len(),
        t.memory_bytes() as f64 / 1e6
    );
    Ok(t)
}
