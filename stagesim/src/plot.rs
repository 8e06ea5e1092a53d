//! PNG plots of a JSON report (`stagesim replay --json`): for each metric
//! one image with a panel per time slice, simulated cores on the x axis and
//! one line per policy. Text is drawn with an embedded TTF font (Hack, from
//! the `epaint_default_fonts` crate), so no system fonts are needed.

use std::error::Error;
use std::path::{Path, PathBuf};

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::Report;
use crate::sim::SimResult;

/// The plotted metrics: (file suffix, axis label, value of a result).
type Metric = (&'static str, &'static str, fn(&SimResult) -> Option<f64>);

const METRICS: [Metric; 4] = [
    ("l1i-mpki", "L1i misses / 1000 instructions", |r| {
        Some(r.total.l1i_mpki)
    }),
    (
        "l2i-mpki",
        "L2 instruction misses / 1000 instructions",
        |r| Some(r.total.l2i_mpki),
    ),
    ("l2d-mpki", "L2 data misses / 1000 instructions", |r| {
        Some(r.total.l2d_mpki)
    }),
    (
        "throughput",
        "modelled throughput (instructions / cycle, all cores)",
        |r| Some(r.throughput_ipc),
    ),
];

const FONT: &str = "sans-serif";

/// Writes an RGB buffer as PNG with the best compression (plots are
/// committed, so size matters more than speed).
fn save_png(path: &Path, width: u32, height: u32, rgb: &[u8]) -> std::io::Result<()> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut enc = png::Encoder::new(file, width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Best);
    enc.set_filter(png::FilterType::Paeth);
    enc.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
    let mut w = enc.write_header().map_err(std::io::Error::other)?;
    w.write_image_data(rgb).map_err(std::io::Error::other)?;
    w.finish().map_err(std::io::Error::other)
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The font bytes are a valid TTF shipped by the crate.
        let _ = plotters::style::register_font(
            FONT,
            FontStyle::Normal,
            epaint_default_fonts::HACK_REGULAR,
        );
    });
}

/// A result drawing failed with.
type DrawResult = Result<(), Box<dyn Error>>;
/// One panel's chart: x = the index of a tick value, y = the metric.
type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;
/// One panel of an image.
type Panel<'b> = DrawingArea<BitMapBackend<'b>, Shift>;

/// Draws a `width` × `height` image titled `title` with `panels` panels
/// side by side (`draw(i, panel)` draws panel `i`) and saves it as PNG.
fn render_png(
    path: &Path,
    (width, height): (u32, u32),
    title: &str,
    panels: usize,
    mut draw: impl FnMut(usize, &Panel) -> DrawResult,
) -> DrawResult {
    let mut buf = vec![0u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, (FONT, 20))?;
        for (i, panel) in root.split_evenly((1, panels)).iter().enumerate() {
            draw(i, panel)?;
        }
        root.present()?;
    }
    save_png(path, width, height, &buf)?;
    Ok(())
}

/// A panel's chart captioned `caption`, x from -0.5 to `ticks` - 0.5, y
/// from 0 to `ymax`.
fn panel_chart<'a, 'b>(
    panel: &'a Panel<'b>,
    caption: String,
    ticks: usize,
    ymax: f64,
) -> Result<Chart<'a, 'b>, Box<dyn Error>> {
    Ok(ChartBuilder::on(panel)
        .caption(caption, (FONT, 15))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(-0.5f64..(ticks as f64 - 0.5), 0f64..ymax)?)
}

/// The x-axis label at `x`: `ticks[x]` where `x` is an index, else blank.
fn tick_label(ticks: &[u64], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() < 1e-6 && i >= 0.0 {
        ticks
            .get(i as usize)
            .map_or(String::new(), |c| c.to_string())
    } else {
        String::new()
    }
}

/// One line with dots of `radius` and a legend entry `name`.
fn draw_line(
    chart: &mut Chart,
    pts: Vec<(f64, f64)>,
    color: RGBAColor,
    width: u32,
    radius: i32,
    name: String,
) -> DrawResult {
    chart
        .draw_series(LineSeries::new(pts.clone(), color.stroke_width(width)))?
        .label(name)
        .legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width))
        });
    chart.draw_series(pts.iter().map(|p| Circle::new(*p, radius, color.filled())))?;
    Ok(())
}

/// The legend box at `position`.
fn draw_legend<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    position: SeriesLabelPosition,
    font: u32,
) -> DrawResult {
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FONT, font))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// The file name of a report's trace.
fn trace_name(report: &Report) -> String {
    Path::new(&report.trace)
        .file_name()
        .map_or(report.trace.clone(), |f| f.to_string_lossy().into_owned())
}

/// Writes `<out_dir>/<prefix>-{l1i-mpki,l2i-mpki,l2d-mpki,throughput}.png`
/// from a report; returns the files written.
pub fn plot_report(report: &Report, out_dir: &Path, prefix: &str) -> anyhow::Result<Vec<PathBuf>> {
    register_font();
    let rows = &report.results;
    anyhow::ensure!(!rows.is_empty(), "report has no results to plot");
    let mut cores: Vec<u64> = rows.iter().map(|r| r.cores as u64).collect();
    cores.sort_unstable();
    cores.dedup();
    let mut slices: Vec<u64> = rows.iter().map(|r| r.slice).collect();
    slices.sort_unstable();
    slices.dedup();
    let mut policies: Vec<String> = Vec::new();
    for r in rows {
        if !policies.contains(&r.policy) {
            policies.push(r.policy.clone());
        }
    }
    let trace_name = trace_name(report);
    std::fs::create_dir_all(out_dir)?;
    let mut written = Vec::new();
    for (suffix, label, get) in METRICS {
        let path = out_dir.join(format!("{prefix}-{suffix}.png"));
        // At least 960 px: the title names the metric and the trace file.
        let width = (60 + 420 * slices.len() as u32).max(960);
        let title = format!("{label} — {trace_name}");
        render_png(&path, (width, 480), &title, slices.len(), |i, panel| {
            draw_panel(panel, rows, &cores, slices[i], &policies, get)
        })
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// The panel of time slice `slice`: one line per policy over `cores`.
fn draw_panel(
    panel: &Panel,
    rows: &[SimResult],
    cores: &[u64],
    slice: u64,
    policies: &[String],
    get: fn(&SimResult) -> Option<f64>,
) -> DrawResult {
    let value = |p: &str, c: u64| {
        rows.iter()
            .find(|r| r.policy == p && r.cores as u64 == c && r.slice == slice)
            .and_then(get)
    };
    let ymax = rows
        .iter()
        .filter(|r| r.slice == slice)
        .filter_map(get)
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.15;
    let caption = format!("time slice {slice} instructions");
    let mut chart = panel_chart(panel, caption, cores.len(), ymax)?;
    let fmt = |x: &f64| tick_label(cores, *x);
    chart
        .configure_mesh()
        .x_labels(cores.len() * 2 + 1)
        .x_label_formatter(&fmt)
        .x_desc("simulated cores")
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 13))
        .draw()?;
    for (pi, p) in policies.iter().enumerate() {
        let color = Palette99::pick(pi).to_rgba();
        // Earlier policies are drawn thicker so coinciding lines stay visible.
        let width = 2 + 2 * (policies.len() - 1 - pi) as u32;
        let pts: Vec<(f64, f64)> = cores
            .iter()
            .enumerate()
            .filter_map(|(ci, c)| value(p, *c).map(|v| (ci as f64, v)))
            .collect();
        draw_line(&mut chart, pts, color, width, 4, p.clone())?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 13)
}

/// Short names of a report's groupings, as in RESULTS.md: (label as in
/// [`SimResult::groups`], `hand map (9)` for the trace's own stages, then
/// letters in the report's order).
fn grouping_names(report: &Report) -> Vec<(String, String)> {
    let mut short: Vec<(String, String)> = Vec::new();
    let mut letter = b'A';
    for g in &report.groupings {
        let k = g.names.len();
        let (label, name) = if g.spec == "-" {
            (format!("stages({k})"), format!("hand map ({k})"))
        } else {
            let n = format!("{} ({k})", letter as char);
            letter = letter.saturating_add(1);
            (format!("{}({k})", g.names.join("+")), n)
        };
        short.push((label, name));
    }
    short
}

/// A migration-cost sweep: its replays, core counts, costs and series.
struct Sweep<'a> {
    all: &'a [SimResult],
    costs: Vec<u64>,
    /// (model label, grouping label) of each line.
    series: Vec<(String, String)>,
    short: Vec<(String, String)>,
}

impl Sweep<'_> {
    /// The baseline replay at `r`'s cores and slice.
    fn base(&self, r: &SimResult) -> Option<&SimResult> {
        self.all
            .iter()
            .find(|b| b.policy == "baseline" && b.cores == r.cores && b.slice == r.slice)
    }

    /// `r` relative to baseline: busy-cycle efficiency (`cpu`) or
    /// simulated throughput.
    fn value(&self, r: &SimResult, cpu: bool) -> Option<f64> {
        let b = self.base(r)?;
        let v = if cpu {
            r.total.ipc / b.total.ipc
        } else {
            r.throughput_ipc / b.throughput_ipc
        };
        v.is_finite().then_some(v)
    }

    fn short_name(&self, groups: &str) -> String {
        self.short
            .iter()
            .find(|(l, _)| l == groups)
            .map_or(groups.to_string(), |(_, n)| n.clone())
    }

    /// The panel of `cores` cores.
    fn draw_panel(&self, panel: &Panel, cores: usize, cpu: bool, ymax: f64) -> DrawResult {
        let costs = &self.costs;
        let mut chart = panel_chart(panel, format!("{cores} cores"), costs.len(), ymax)?;
        let fmt = |x: &f64| tick_label(costs, *x);
        chart
            .configure_mesh()
            .x_labels(costs.len() * 2 + 1)
            .x_label_formatter(&fmt)
            .x_desc("migration cost, cycles")
            .y_desc("× baseline")
            .light_line_style(TRANSPARENT)
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 13))
            .draw()?;
        chart.draw_series(LineSeries::new(
            [(-0.5, 1.0), (costs.len() as f64 - 0.5, 1.0)],
            BLACK.stroke_width(1),
        ))?;
        for (si, (label, groups)) in self.series.iter().enumerate() {
            let color = Palette99::pick(si).to_rgba();
            let pts: Vec<(f64, f64)> = costs
                .iter()
                .enumerate()
                .filter_map(|(ci, cost)| {
                    let r = self.all.iter().find(|r| {
                        r.cores == cores
                            && r.migration_cycles == *cost
                            && r.label == *label
                            && r.groups == *groups
                    })?;
                    Some((ci as f64, self.value(r, cpu)?))
                })
                .collect();
            let name = format!("{label}, {}", self.short_name(groups));
            draw_line(&mut chart, pts, color, 2, 3, name)?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerLeft, 12)
    }
}

/// Writes `<out_dir>/<prefix>-{cpu,sim}.png` for a migration-cost sweep
/// (`replay --migration-cycles A,B,… --json`): one panel per core count,
/// migration cost on the x axis, one line per (model, stage grouping); the
/// y axis is the throughput relative to `baseline` at the same cores and
/// slice — busy-cycle efficiency (`cpu`) or simulated machine throughput
/// (`sim`). Returns the files written.
pub fn plot_sweep(report: &Report, out_dir: &Path, prefix: &str) -> anyhow::Result<Vec<PathBuf>> {
    register_font();
    let all = &report.results[..];
    let mut cores: Vec<usize> = all.iter().map(|r| r.cores).collect();
    cores.sort_unstable();
    cores.dedup();
    let costs = crate::report::staged_costs(all);
    anyhow::ensure!(!costs.is_empty(), "report has no staged replays");
    let mut series: Vec<(String, String)> = Vec::new();
    for r in all {
        let k = (r.label.clone(), r.groups.clone());
        if k.0 != "baseline" && !series.contains(&k) {
            series.push(k);
        }
    }
    let sweep = Sweep {
        all,
        costs,
        series,
        short: grouping_names(report),
    };
    let trace_name = trace_name(report);
    std::fs::create_dir_all(out_dir)?;
    let mut written = Vec::new();
    for (suffix, what) in [
        ("cpu", "busy-cycle efficiency"),
        ("sim", "simulated throughput"),
    ] {
        let path = out_dir.join(format!("{prefix}-{suffix}.png"));
        let cpu = suffix == "cpu";
        let ymax = all
            .iter()
            .filter(|r| r.policy != "baseline")
            .filter_map(|r| sweep.value(r, cpu))
            .fold(1.0f64, f64::max)
            * 1.1;
        let width = (60 + 520 * cores.len() as u32).max(960);
        let title = format!("{what} relative to baseline vs migration cost — {trace_name}");
        render_png(&path, (width, 520), &title, cores.len(), |i, panel| {
            sweep.draw_panel(panel, cores[i], cpu, ymax)
        })
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
