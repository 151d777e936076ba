//! Plots of campaign results, SVG and PNG, with plotters. The font (DejaVu Sans, see
//! `assets/fonts/DejaVu-LICENSE`) is embedded, so plotting needs nothing on the host.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// One line of a chart: a name and (x, y) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x_max, mut y_max) = (0.0f64, 0.0f64);
    for (x, y) in all {
        x_max = x_max.max(*x);
        y_max = y_max.max(*y);
    }
    let x_max = if x_max > 0.0 { x_max * 1.02 } else { 1.0 };
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

/// Writes `<stem>.svg` and `<stem>.png` in `dir`.
pub fn line_chart(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> anyhow::Result<()> {
    register_font();
    let svg = dir.join(format!("{stem}.svg"));
    draw(
        SVGBackend::new(&svg, (960, 540)).into_drawing_area(),
        title,
        x_label,
        y_label,
        series,
    )
    .with_context(|| format!("cannot draw '{}'", svg.display()))?;
    let png = dir.join(format!("{stem}.png"));
    draw(
        BitMapBackend::new(&png, (960, 540)).into_drawing_area(),
        title,
        x_label,
        y_label,
        series,
    )
    .with_context(|| format!("cannot draw '{}'", png.display()))?;
    Ok(())
}
