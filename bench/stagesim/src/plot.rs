//! PNG plots of a JSON report (`stagesim replay --json`): for each metric
//! one image with a panel per time slice, simulated cores on the x axis and
//! one line per policy. Text is drawn with an embedded TTF font (Hack, from
//! the `epaint_default_fonts` crate), so no system fonts are needed.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde_json::Value;

/// The plotted metrics: (file suffix, axis label, value of a result).
type Metric = (&'static str, &'static str, fn(&Value) -> Option<f64>);

const METRICS: [Metric; 4] = [
    ("l1i-mpki", "L1i misses / 1000 instructions", |r| {
        r["total"]["l1i_mpki"].as_f64()
    }),
    (
        "l2i-mpki",
        "L2 instruction misses / 1000 instructions",
        |r| r["total"]["l2i_mpki"].as_f64(),
    ),
    ("l2d-mpki", "L2 data misses / 1000 instructions", |r| {
        r["total"]["l2d_mpki"].as_f64()
    }),
    (
        "throughput",
        "modelled throughput (instructions / cycle, all cores)",
        |r| r["throughput_ipc"].as_f64(),
    ),
];

const FONT: &str = "sans-serif";

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

struct Row {
    policy: String,
    cores: u64,
    slice: u64,
    result: Value,
}

/// Writes `<out_dir>/<prefix>-{l1i-mpki,l2i-mpki,l2d-mpki,throughput}.png`
/// from a report; returns the files written.
pub fn plot_report(report: &Value, out_dir: &Path, prefix: &str) -> anyhow::Result<Vec<PathBuf>> {
    register_font();
    let rows: Vec<Row> = report["results"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("report has no \"results\" array"))?
        .iter()
        .filter_map(|r| {
            Some(Row {
                policy: r["policy"].as_str()?.to_string(),
                cores: r["cores"].as_u64()?,
                slice: r["slice"].as_u64()?,
                result: r.clone(),
            })
        })
        .collect();
    anyhow::ensure!(!rows.is_empty(), "report has no results to plot");
    let mut cores: Vec<u64> = rows.iter().map(|r| r.cores).collect();
    cores.sort_unstable();
    cores.dedup();
    let mut slices: Vec<u64> = rows.iter().map(|r| r.slice).collect();
    slices.sort_unstable();
    slices.dedup();
    let mut policies: Vec<String> = Vec::new();
    for r in &rows {
        if !policies.contains(&r.policy) {
            policies.push(r.policy.clone());
        }
    }
    let trace = report["trace"].as_str().unwrap_or("trace");
    let trace_name = Path::new(trace)
        .file_name()
        .map_or(trace.to_string(), |f| f.to_string_lossy().into_owned());
    std::fs::create_dir_all(out_dir)?;
    let mut written = Vec::new();
    for (suffix, label, get) in METRICS {
        let path = out_dir.join(format!("{prefix}-{suffix}.png"));
        draw(
            &path,
            &rows,
            &cores,
            &slices,
            &policies,
            label,
            get,
            &trace_name,
        )
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[allow(clippy::too_many_arguments)]
fn draw(
    path: &Path,
    rows: &[Row],
    cores: &[u64],
    slices: &[u64],
    policies: &[String],
    label: &str,
    get: fn(&Value) -> Option<f64>,
    trace: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let width = 60 + 420 * slices.len() as u32;
    let root = BitMapBackend::new(path, (width, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&format!("{label} — {trace}"), (FONT, 20))?;
    let panels = root.split_evenly((1, slices.len()));
    for (panel, slice) in panels.iter().zip(slices) {
        let value = |p: &str, c: u64| {
            rows.iter()
                .find(|r| r.policy == p && r.cores == c && r.slice == *slice)
                .and_then(|r| get(&r.result))
        };
        let ymax = rows
            .iter()
            .filter(|r| r.slice == *slice)
            .filter_map(|r| get(&r.result))
            .fold(0.0f64, f64::max)
            .max(1e-3)
            * 1.15;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("time slice {slice} instructions"), (FONT, 15))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(-0.5f64..(cores.len() as f64 - 0.5), 0f64..ymax)?;
        let fmt = |x: &f64| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                cores
                    .get(i as usize)
                    .map_or(String::new(), |c| c.to_string())
            } else {
                String::new()
            }
        };
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
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(width)))?
                .label(p.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width))
                });
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FONT, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
