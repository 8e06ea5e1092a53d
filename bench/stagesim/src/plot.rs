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
    let mut buf = vec![0u8; width as usize * 480 * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (width, 480)).into_drawing_area();
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
    }
    save_png(path, width, 480, &buf)?;
    Ok(())
}

/// Writes `<out_dir>/<prefix>-{cpu,sim}.png` for a migration-cost sweep
/// (`replay --migration-cycles A,B,… --json`): one panel per core count,
/// migration cost on the x axis, one line per (model, stage grouping); the
/// y axis is the throughput relative to `baseline` at the same cores and
/// slice — busy-cycle efficiency (`cpu`) or simulated machine throughput
/// (`sim`). Returns the files written.
pub fn plot_sweep(report: &Value, out_dir: &Path, prefix: &str) -> anyhow::Result<Vec<PathBuf>> {
    register_font();
    let all: Vec<&Value> = report["results"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("report has no \"results\" array"))?
        .iter()
        .collect();
    let num = |r: &Value, k: &str| r[k].as_u64().unwrap_or(0);
    let text = |r: &Value, k: &str| r[k].as_str().unwrap_or("").to_string();
    let mut cores: Vec<u64> = all.iter().map(|r| num(r, "cores")).collect();
    cores.sort_unstable();
    cores.dedup();
    let mut costs: Vec<u64> = all
        .iter()
        .filter(|r| text(r, "policy") != "baseline")
        .map(|r| num(r, "migration_cycles"))
        .collect();
    costs.sort_unstable();
    costs.dedup();
    anyhow::ensure!(!costs.is_empty(), "report has no staged replays");
    // Short names of the groupings, as in RESULTS.md: `hand map (9)` for the
    // trace's own stages, then letters in the report's order.
    let mut short: Vec<(String, String)> = Vec::new();
    let mut letter = b'A';
    for g in report["groupings"].as_array().into_iter().flatten() {
        let label = {
            let names: Vec<&str> = g["names"]
                .as_array()
                .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
                .unwrap_or_default();
            let k = names.len();
            if g["spec"].as_str() == Some("-") {
                format!("stages({k})")
            } else {
                format!("{}({k})", names.join("+"))
            }
        };
        let name = if g["spec"].as_str() == Some("-") {
            format!(
                "hand map ({})",
                g["names"].as_array().map_or(0, |a| a.len())
            )
        } else {
            let n = format!(
                "{} ({})",
                letter as char,
                g["names"].as_array().map_or(0, |a| a.len())
            );
            letter = letter.saturating_add(1);
            n
        };
        short.push((label, name));
    }
    let short_name = |groups: &str| {
        short
            .iter()
            .find(|(l, _)| l == groups)
            .map_or(groups.to_string(), |(_, n)| n.clone())
    };
    let mut series: Vec<(String, String)> = Vec::new();
    for r in &all {
        let k = (text(r, "label"), text(r, "groups"));
        if k.0 != "baseline" && !series.contains(&k) {
            series.push(k);
        }
    }
    let base = |c: u64, slice: u64| {
        all.iter().copied().find(|b| {
            text(b, "policy") == "baseline" && num(b, "cores") == c && num(b, "slice") == slice
        })
    };
    let trace = report["trace"].as_str().unwrap_or("trace");
    let trace_name = Path::new(trace)
        .file_name()
        .map_or(trace.to_string(), |f| f.to_string_lossy().into_owned());
    std::fs::create_dir_all(out_dir)?;
    let mut written = Vec::new();
    for (suffix, what) in [
        ("cpu", "busy-cycle efficiency"),
        ("sim", "simulated throughput"),
    ] {
        let path = out_dir.join(format!("{prefix}-{suffix}.png"));
        let value = |r: &Value| -> Option<f64> {
            let b = base(num(r, "cores"), num(r, "slice"))?;
            let v = if suffix == "cpu" {
                r["total"]["ipc"].as_f64()? / b["total"]["ipc"].as_f64()?
            } else {
                r["throughput_ipc"].as_f64()? / b["throughput_ipc"].as_f64()?
            };
            v.is_finite().then_some(v)
        };
        let draw = || -> Result<(), Box<dyn std::error::Error>> {
            let width = 60 + 520 * cores.len() as u32;
            let mut buf = vec![0u8; width as usize * 520 * 3];
            {
                let root = BitMapBackend::with_buffer(&mut buf, (width, 520)).into_drawing_area();
                root.fill(&WHITE)?;
                let root = root.titled(
                    &format!("{what} relative to baseline vs migration cost — {trace_name}"),
                    (FONT, 20),
                )?;
                let panels = root.split_evenly((1, cores.len()));
                let ymax = all
                    .iter()
                    .filter(|r| text(r, "policy") != "baseline")
                    .filter_map(|r| value(r))
                    .fold(1.0f64, f64::max)
                    * 1.1;
                for (panel, c) in panels.iter().zip(&cores) {
                    let mut chart = ChartBuilder::on(panel)
                        .caption(format!("{c} cores"), (FONT, 15))
                        .margin(12)
                        .x_label_area_size(40)
                        .y_label_area_size(55)
                        .build_cartesian_2d(-0.5f64..(costs.len() as f64 - 0.5), 0f64..ymax)?;
                    let fmt = |x: &f64| {
                        let i = x.round();
                        if (x - i).abs() < 1e-6 && i >= 0.0 {
                            costs
                                .get(i as usize)
                                .map_or(String::new(), |c| c.to_string())
                        } else {
                            String::new()
                        }
                    };
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
                    for (si, (label, groups)) in series.iter().enumerate() {
                        let color = Palette99::pick(si).to_rgba();
                        let pts: Vec<(f64, f64)> = costs
                            .iter()
                            .enumerate()
                            .filter_map(|(ci, cost)| {
                                let r = all.iter().find(|r| {
                                    num(r, "cores") == *c
                                        && num(r, "migration_cycles") == *cost
                                        && text(r, "label") == *label
                                        && text(r, "groups") == *groups
                                })?;
                                Some((ci as f64, value(r)?))
                            })
                            .collect();
                        let name = format!("{label}, {}", short_name(groups));
                        chart
                            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                            .label(name)
                            .legend(move |(x, y)| {
                                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                            });
                        chart
                            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
                    }
                    chart
                        .configure_series_labels()
                        .position(SeriesLabelPosition::LowerLeft)
                        .label_font((FONT, 12))
                        .background_style(WHITE.mix(0.85))
                        .border_style(BLACK)
                        .draw()?;
                }
                root.present()?;
            }
            save_png(&path, width, 520, &buf)?;
            Ok(())
        };
        draw().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
