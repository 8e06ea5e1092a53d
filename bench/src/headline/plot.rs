//! The headline plot: guest speed-up over `off` vs code footprint, one line
//! per cell (policy + visit policy) and vCPU count, plus the native
//! references (spatial ÷ whole, cohort ÷ whole).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// One guest line.
pub struct Line {
    /// Legend text.
    pub label: String,
    /// vCPUs (2 vCPUs draw thick, others thin).
    pub vcpus: u32,
    /// Colour index (the cell's: a cell keeps its colour across vCPU
    /// counts).
    pub color: usize,
    /// (footprint KiB, median speed-up over `off`).
    pub points: Vec<(f64, f64)>,
}

/// What to draw.
pub struct Series {
    /// (footprint KiB, native spatial ÷ whole, median).
    pub native: Vec<(f64, f64)>,
    /// (footprint KiB, native cohort ÷ whole, median).
    pub cohort: Vec<(f64, f64)>,
    /// The guest's lines.
    pub lines: Vec<Line>,
}

/// Writes `series` as a 1200×700 PNG at `path`.
///
/// # Errors
/// When the font cannot be read or the PNG cannot be written.
pub fn write(path: &Path, series: &Series) -> Result<()> {
    stagevm_bench::register_plot_font()?;
    let root = BitMapBackend::new(path, (1200, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let all = series
        .native
        .iter()
        .chain(series.cohort.iter())
        .chain(series.lines.iter().flat_map(|l| l.points.iter()));
    let (mut xmin, mut xmax, mut ymin, mut ymax) = (f64::MAX, 0f64, f64::MAX, 0f64);
    for (x, y) in all {
        xmin = xmin.min(*x);
        xmax = xmax.max(*x);
        ymin = ymin.min(*y);
        ymax = ymax.max(*y);
    }
    if xmax <= 0.0 {
        return Err(anyhow!("nothing to plot"));
    }
    let (ymin, ymax) = ((ymin.min(1.0) - 0.05).max(0.0), ymax.max(1.0) + 0.05);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Speed-up over --policy off vs code footprint (2 stages)",
            ("sans-serif", 26),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d((xmin * 0.9..xmax * 1.1).log_scale(), ymin..ymax)
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_labels(8)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .x_desc("total code footprint (KiB, log scale)")
        .y_desc("requests/s ÷ off (native: spatial or cohort ÷ whole)")
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    let palette = [
        BLUE,
        RED,
        GREEN,
        MAGENTA,
        CYAN,
        RGBColor(200, 120, 0),
        RGBColor(120, 60, 180),
        RGBColor(0, 120, 120),
        RGBColor(160, 160, 0),
        RGBColor(120, 120, 120),
    ];
    chart
        .draw_series(LineSeries::new(
            series.native.iter().copied(),
            BLACK.stroke_width(3),
        ))
        .map_err(|e| anyhow!("{e}"))?
        .label("native spatial reference (2 cores)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(3)));
    let grey = RGBColor(90, 90, 90).stroke_width(3);
    chart
        .draw_series(LineSeries::new(series.cohort.iter().copied(), grey))
        .map_err(|e| anyhow!("{e}"))?
        .label("native cohort reference (2 cores)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey));
    for line in &series.lines {
        let (label, pts) = (&line.label, &line.points);
        let color = palette[line.color % palette.len()];
        let style = if line.vcpus == 2 {
            color.stroke_width(2)
        } else {
            color.stroke_width(1)
        };
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), style))
            .map_err(|e| anyhow!("{e}"))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| anyhow!("{e}"))?;
    }
    chart
        .draw_series(LineSeries::new(
            [(xmin * 0.9, 1.0), (xmax * 1.1, 1.0)],
            BLACK.mix(0.3),
        ))
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
