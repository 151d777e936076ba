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

/// One line of a chart: a name and (x, y) points; with `markers`, each point is also
/// drawn as a dot (for a few measured points, like reader counts). A point whose `y` is NaN
/// was not measured: the line stops there and starts again at the next measured point
/// (a gap, never a ramp drawn across it).
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub markers: bool,
}

/// A horizontal line at `y` (a cgroup's memory limit), named in the legend.
pub struct Limit {
    pub name: String,
    pub y: f64,
}

/// How the x axis is ticked: any value (seconds), or whole numbers only (counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XTicks {
    Continuous,
    Integer,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// A line's dashes: (on, off) pixels, `None` for a solid line.
type Dash = Option<(u32, u32)>;

/// Each series' dashes (on, off pixels; `None` solid) beside its colour, so that lines
/// lying on each other (anon and page cache when the model is both) stay apart.
const DASHES: [Dash; 4] = [None, Some((10, 5)), Some((3, 4)), Some((14, 4))];

/// The limit line's colour (no series uses it).
const LIMIT: RGBColor = RGBColor(60, 60, 60);

/// Width of the legend column right of the plot: the legend never covers data.
const LEGEND_WIDTH: u32 = 230;

/// The most characters of a title that fit over a 960-pixel chart at 22 px.
const TITLE_CHARS: usize = 80;

/// `s` cut to `max` characters, the cut marked with an ellipsis.
fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut t: String = s.chars().take(max - 1).collect();
    t.push('…');
    t
}

/// A title in at most two lines of about `max` characters, broken at a space.
fn split_title(s: &str, max: usize) -> (String, Option<String>) {
    if s.chars().count() <= max {
        return (s.to_string(), None);
    }
    let cut: String = s.chars().take(max).collect();
    let at = cut.rfind(' ').filter(|&i| i > max / 2).unwrap_or(cut.len());
    (s[..at].to_string(), Some(s[at..].trim_start().to_string()))
}

/// Tick positions (of the labels) from 0 to at least `max`: steps of 1, 2 or 5 times a power of ten,
/// about eight of them; whole numbers only (at least 1 apart) for `XTicks::Integer`.
pub fn ticks(max: f64, kind: XTicks) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / 8.0;
    let pow = 10f64.powf(raw.log10().floor());
    let mut step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * pow)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * pow);
    if kind == XTicks::Integer {
        step = step.ceil().max(1.0);
    }
    let n = (max / step).floor() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("{e:?}")
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    chart: &Chart,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    // The title over the whole width (long commands shortened), then the plot and, in a
    // column of its own, the legend.
    // A long title wraps onto a second line (then is shortened), never cut mid-command.
    let (first, rest) = split_title(chart.title, TITLE_CHARS);
    let body = match rest {
        None => root.titled(&first, ("sans-serif", 22)).map_err(err)?,
        Some(second) => {
            let body = root.titled(&first, ("sans-serif", 20)).map_err(err)?;
            body.titled(&shorten(&second, TITLE_CHARS + 8), ("sans-serif", 16))
                .map_err(err)?
        }
    };
    let (w, _) = body.dim_in_pixel();
    let (plot, legend) = body.split_horizontally(w.saturating_sub(LEGEND_WIDTH));
    let all = chart.series.iter().flat_map(|s| s.points.iter());
    let (mut x_max, mut y_max) = (0.0f64, 0.0f64);
    for (x, y) in all.filter(|(_, y)| y.is_finite()) {
        x_max = x_max.max(*x);
        y_max = y_max.max(*y);
    }
    if let Some(l) = chart.limit {
        y_max = y_max.max(l.y);
    }
    let x_max = match chart.x_ticks {
        // Counts: one more than the largest, so its marker is not on the edge.
        XTicks::Integer => x_max.floor() + 1.0,
        XTicks::Continuous if x_max > 0.0 => x_max * 1.02,
        XTicks::Continuous => 1.0,
    };
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let mut ctx = ChartBuilder::on(&plot)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?;
    let integer = chart.x_ticks == XTicks::Integer;
    // plotters picks the finest step of 1, 2 or 5 times a power of ten that gives at
    // most this many labels: the step of `ticks`, whole numbers for counts.
    ctx.configure_mesh()
        .x_labels(ticks(x_max, chart.x_ticks).len())
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .x_label_formatter(&|x| {
            if integer {
                format!("{}", x.round() as i64)
            } else {
                // No float noise (0.6000000000000001) in a label.
                format!("{}", (x * 1e6).round() / 1e6)
            }
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    let mut names: Vec<(String, RGBColor, bool, Dash)> = Vec::new();
    for (i, s) in chart.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let dash = DASHES[i % DASHES.len()];
        // Each run of measured points is a line of its own; a lone one is a dot.
        for run in s.points.split(|(_, y)| !y.is_finite()) {
            match (run.len(), dash) {
                (0, _) => {}
                (1, _) => {
                    ctx.draw_series(run.iter().map(|p| Circle::new(*p, 3, color.filled())))
                        .map_err(err)?;
                }
                (_, None) => {
                    ctx.draw_series(LineSeries::new(run.iter().copied(), color.stroke_width(2)))
                        .map_err(err)?;
                }
                (_, Some((on, off))) => {
                    ctx.draw_series(DashedLineSeries::new(
                        run.iter().copied(),
                        on,
                        off,
                        color.stroke_width(2),
                    ))
                    .map_err(err)?;
                }
            }
        }
        if s.markers {
            let measured = s.points.iter().filter(|(_, y)| y.is_finite());
            ctx.draw_series(measured.map(|p| Circle::new(*p, 5, color.filled())))
                .map_err(err)?;
        }
        names.push((s.name.clone(), color, s.markers, dash));
    }
    if let Some(l) = chart.limit {
        ctx.draw_series(DashedLineSeries::new(
            [(0.0, l.y), (x_max, l.y)],
            8,
            6,
            LIMIT.stroke_width(2),
        ))
        .map_err(err)?;
        names.push((l.name.clone(), LIMIT, false, Some((8, 6))));
    }
    // The legend, in its own column: a swatch and the name of each line.
    let font = ("sans-serif", 14).into_font().color(&BLACK);
    for (i, (name, color, markers, dashed)) in names.iter().enumerate() {
        let y = 60 + 24 * i as i32;
        if let Some((on, off)) = *dashed {
            // The swatch in the line's own dashes.
            let mut x = 8i32;
            while x < 30 {
                let end = (x + on as i32).min(30);
                legend
                    .draw(&PathElement::new(
                        vec![(x, y), (end, y)],
                        color.stroke_width(2),
                    ))
                    .map_err(err)?;
                x = end + off as i32;
            }
        } else {
            legend
                .draw(&PathElement::new(
                    vec![(8, y), (30, y)],
                    color.stroke_width(2),
                ))
                .map_err(err)?;
        }
        if *markers {
            legend
                .draw(&Circle::new((19, y), 4, color.filled()))
                .map_err(err)?;
        }
        legend
            .draw(&Text::new(name.clone(), (38, y - 8), font.clone()))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// What a chart shows.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub series: &'a [Series],
    pub limit: Option<&'a Limit>,
    pub x_ticks: XTicks,
}

/// Writes `<stem>.svg` and `<stem>.png` in `dir`.
pub fn write_chart(dir: &Path, stem: &str, chart: &Chart) -> anyhow::Result<()> {
    register_font();
    let svg = dir.join(format!("{stem}.svg"));
    draw(SVGBackend::new(&svg, (960, 540)).into_drawing_area(), chart)
        .with_context(|| format!("cannot draw '{}'", svg.display()))?;
    let png = dir.join(format!("{stem}.png"));
    draw(
        BitMapBackend::new(&png, (960, 540)).into_drawing_area(),
        chart,
    )
    .with_context(|| format!("cannot draw '{}'", png.display()))?;
    Ok(())
}

/// One PNG of `rows` x `cols` charts, each `cell` pixels, in row order (the scaling
/// curves of bench/scaling.sh).
pub fn write_grid_png(
    png: &Path,
    (rows, cols): (usize, usize),
    cell: (u32, u32),
    charts: &[Chart],
) -> anyhow::Result<()> {
    register_font();
    let size = (cell.0 * cols as u32, cell.1 * rows as u32);
    let root = BitMapBackend::new(png, size).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    for (area, chart) in root.split_evenly((rows, cols)).into_iter().zip(charts) {
        draw(area, chart).with_context(|| format!("cannot draw '{}'", png.display()))?;
    }
    root.present()
        .map_err(err)
        .with_context(|| format!("cannot write '{}'", png.display()))?;
    Ok(())
}

/// A line chart over time (seconds) as `<stem>.{svg,png}`, with an optional limit line.
pub fn line_chart(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    limit: Option<&Limit>,
) -> anyhow::Result<()> {
    write_chart(
        dir,
        stem,
        &Chart {
            title,
            x_label,
            y_label,
            series,
            limit,
            x_ticks: XTicks::Continuous,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_title_wraps_at_a_space() {
        let t = "twofold run: python3 -c 'import torch; m = torch.load(\"/models/llama/consolidated.00.pth\", mmap=True)'";
        let (a, b) = split_title(t, 80);
        assert!(a.chars().count() <= 80 && !a.ends_with(' '), "{a}");
        assert_eq!(format!("{a} {}", b.unwrap()), t);
        assert_eq!(split_title("short", 80), ("short".to_string(), None));
    }

    /// Unmeasured samples are gaps: the SVG has two line pieces for one series with a gap,
    /// and no segment crosses the gap.
    #[test]
    fn an_unmeasured_stretch_is_a_gap_not_a_ramp() {
        let dir = tempfile::tempdir().unwrap();
        let mut points: Vec<(f64, f64)> = (0..5).map(|i| (i as f64, 10.0)).collect();
        points.extend((5..14).map(|i| (i as f64, f64::NAN)));
        points.extend((14..20).map(|i| (i as f64, 90.0)));
        let series = [Series {
            name: "model resident".into(),
            points,
            markers: false,
        }];
        let chart = Chart {
            title: "gaps",
            x_label: "seconds",
            y_label: "MiB",
            series: &series,
            limit: None,
            x_ticks: XTicks::Continuous,
        };
        write_chart(dir.path(), "g", &chart).unwrap();
        let svg = std::fs::read_to_string(dir.path().join("g.svg")).unwrap();
        // The series' colour: two pieces of line and the legend's swatch.
        let lines = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("stroke=\"#1F77B4\""))
            .count();
        assert_eq!(lines, 3, "{svg}");
        assert!(!svg.contains("NaN"), "{svg}");
    }

    #[test]
    fn integer_ticks_are_whole_numbers() {
        assert_eq!(
            ticks(11.0, XTicks::Integer),
            [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        assert_eq!(
            ticks(4.0, XTicks::Integer),
            [0.0, 1.0, 2.0, 3.0, 4.0],
            "never 0.5 readers"
        );
        assert_eq!(ticks(2.0, XTicks::Integer), [0.0, 1.0, 2.0]);
        assert_eq!(ticks(1.0, XTicks::Continuous).len(), 6, "0, 0.2, .. 1");
        for t in ticks(1000.0, XTicks::Integer) {
            assert_eq!(t.fract(), 0.0);
        }
    }

    #[test]
    fn a_long_title_is_shortened_with_an_ellipsis() {
        assert_eq!(shorten("abc", 3), "abc");
        assert_eq!(shorten("abcdef", 4), "abc…");
    }

    fn svg(chart: &Chart) -> String {
        let d = tempfile::tempdir().unwrap();
        write_chart(d.path(), "c", chart).unwrap();
        assert!(std::fs::read(d.path().join("c.png"))
            .unwrap()
            .starts_with(b"\x89PNG"));
        std::fs::read_to_string(d.path().join("c.svg")).unwrap()
    }

    /// The x of each text element whose content is `label`.
    fn text_x(svg: &str, label: &str) -> Vec<f64> {
        svg.split("<text")
            .filter(|t| {
                t.contains(&format!(">{label}</text>"))
                    || t.contains(&format!(">\n{label}\n</text>"))
            })
            .filter_map(|t| {
                let x = t.split("x=\"").nth(1)?.split('"').next()?;
                x.parse().ok()
            })
            .collect()
    }

    #[test]
    fn readers_plot_has_markers_whole_ticks_a_limit_and_the_legend_beside_the_data() {
        let series = [Series {
            name: "copy arm: peak".into(),
            points: vec![(1.0, 10.0), (6.0, 60.0), (10.0, 100.0)],
            markers: true,
        }];
        let limit = Limit {
            name: "memory limit (200.0 MiB)".into(),
            y: 200.0,
        };
        let s = svg(&Chart {
            title: "readers",
            x_label: "readers",
            y_label: "MiB",
            series: &series,
            limit: Some(&limit),
            x_ticks: XTicks::Integer,
        });
        // Three markers (circles), one per measured point, and one in the legend.
        assert_eq!(s.matches("<circle").count(), 4, "{s}");
        // Tick labels are whole numbers: never 0.5 or 2.5 readers.
        assert!(text_x(&s, "0.5").is_empty() && text_x(&s, "2.5").is_empty());
        assert!(!text_x(&s, "10").is_empty(), "{s}");
        // The limit is in the legend, and the legend is right of every tick label.
        let legend = text_x(&s, "memory limit (200.0 MiB)");
        assert_eq!(legend.len(), 1, "{s}");
        let rightmost_tick = text_x(&s, "10")[0];
        assert!(
            legend[0] > rightmost_tick + 20.0,
            "{legend:?} vs {rightmost_tick}"
        );
        assert!(legend[0] >= (960 - LEGEND_WIDTH) as f64);
    }
}
