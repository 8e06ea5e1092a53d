//! The open-loop plot: per shape (rows) and vCPU count, CPU per request
//! (µs) and p99 latency (µs, log scale) against the load (% of the
//! unstaged capacity), one line per cell (medians over the rounds), the
//! native whole reference in black.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use stagevm_bench::stats::median;

use crate::table::View;

const PALETTE: [RGBColor; 8] = [
    BLUE,
    RED,
    GREEN,
    MAGENTA,
    CYAN,
    RGBColor(200, 120, 0),
    RGBColor(120, 60, 180),
    RGBColor(120, 120, 120),
];

/// One panel's lines: (label, colour, points (load %, value)).
type Lines = Vec<(String, RGBColor, Vec<(f64, f64)>)>;

/// The lines of one panel: `cpu` (CPU per request) or p99.
fn lines(view: &View, i: usize, v: u32, cpu: bool) -> Lines {
    let loads = &view.args.loads;
    let mut out = Lines::new();
    let native: Vec<(f64, f64)> = loads
        .iter()
        .filter_map(|l| {
            let runs = view
                .sweep
                .native_open
                .get(&(i, view.args.vcpus[0], *l, 0))?;
            let y = median(
                runs.iter()
                    .map(|r| {
                        if cpu {
                            r.cpu_per_request_us
                        } else {
                            r.latency.quantile(0.99).unwrap_or(f64::NAN) / 1e3
                        }
                    })
                    .collect(),
            );
            y.is_finite().then_some((f64::from(*l), y))
        })
        .collect();
    out.push(("native whole".into(), BLACK, native));
    for (k, c) in view.cells.iter().enumerate() {
        let pts = loads
            .iter()
            .filter_map(|l| {
                let runs = view.runs(i, v, *l, &c.label);
                let y = median(
                    runs.iter()
                        .map(|r| if cpu { r.cpu_us } else { r.p99_us })
                        .collect(),
                );
                y.is_finite().then_some((f64::from(*l), y))
            })
            .collect();
        out.push((c.label.clone(), PALETTE[k % PALETTE.len()], pts));
    }
    out
}

/// Draws one panel on `area`.
fn panel(
    area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
    title: &str,
    cpu: bool,
    lines: &Lines,
) -> Result<()> {
    let ys = lines.iter().flat_map(|l| l.2.iter().map(|p| p.1));
    let (lo, hi) = ys.fold((f64::MAX, 0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    if hi <= 0.0 {
        return Ok(());
    }
    let e = |e: DrawingAreaErrorKind<_>| anyhow!("{e}");
    let mut b = ChartBuilder::on(area);
    b.caption(title, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(50);
    let x = 0.0..100.0;
    let y_desc = if cpu {
        "CPU µs per request"
    } else {
        "p99 µs (log)"
    };
    if cpu {
        let mut c = b.build_cartesian_2d(x, (lo * 0.9)..(hi * 1.1)).map_err(e)?;
        c.configure_mesh()
            .x_desc("load (% of unstaged capacity)")
            .y_desc(y_desc)
            .draw()
            .map_err(e)?;
        draw(&mut c, lines)?;
    } else {
        let mut c = b
            .build_cartesian_2d(x, ((lo * 0.8).max(1.0)..(hi * 1.25)).log_scale())
            .map_err(e)?;
        c.configure_mesh()
            .x_desc("load (% of unstaged capacity)")
            .y_desc(y_desc)
            .draw()
            .map_err(e)?;
        draw(&mut c, lines)?;
    }
    Ok(())
}

fn draw<'a, X, Y>(
    c: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
    lines: &Lines,
) -> Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (label, color, pts) in lines {
        let style = color.stroke_width(2);
        c.draw_series(LineSeries::new(pts.iter().copied(), style))
            .map_err(|e| anyhow!("{e}"))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
        c.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| anyhow!("{e}"))?;
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 11))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// Writes the plot as a PNG at `path`: a row per shape, per vCPU count a
/// CPU-per-request panel and a p99 panel.
///
/// # Errors
/// When the font cannot be read or the PNG cannot be written.
pub fn write(path: &Path, view: &View) -> Result<()> {
    stagevm_bench::register_plot_font()?;
    let vcpus = &view.args.vcpus;
    let (rows, cols) = (view.shapes.len().max(1), 2 * vcpus.len().max(1));
    let root = BitMapBackend::new(path, (560 * cols as u32, 400 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let areas = root.split_evenly((rows, cols));
    for (i, shape) in view.shapes.iter().enumerate() {
        for (k, &v) in vcpus.iter().enumerate() {
            for (m, cpu) in [true, false].into_iter().enumerate() {
                let what = if cpu {
                    "CPU per request"
                } else {
                    "p99 latency"
                };
                let title = format!(
                    "{} KiB ({}), {v} vCPUs: {what}",
                    shape.code_kib(),
                    shape.name
                );
                panel(
                    &areas[i * cols + 2 * k + m],
                    &title,
                    cpu,
                    &lines(view, i, v, cpu),
                )?;
            }
        }
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
