//! PNG bar charts of an experiment's main figure, one bar per peer, and line charts over time
//! (pressure's summed RSS, one line per peer; `fallow run --timeline`), each with a legend. Text is drawn with a font
//! compiled into the binary (Ubuntu Light, from the `epaint_default_fonts` crate) so that a
//! machine without system fonts draws the same charts.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use crate::experiments::Chart;

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, epaint_default_fonts::UBUNTU_LIGHT);
    });
}

/// Draw `chart` as a horizontal bar chart into the PNG file `path`. When the values span more
/// than two decades the axis is logarithmic (the bars start at the decade below the smallest).
pub fn draw(chart: &Chart, path: &Path) -> Result<(), String> {
    register_font();
    if let Some(lines) = &chart.lines {
        let limit = lines.limit.as_ref().map(|(label, v)| (label.as_str(), *v));
        return draw_lines(&chart.title, &lines.x_desc, &chart.unit, &lines.series, limit, path);
    }
    let bars: Vec<&(String, f64)> = chart.bars.iter().filter(|(_, v)| v.is_finite() && *v >= 0.0).collect();
    let height = 150 + 34 * bars.len().max(1) as u32;
    let whole = BitMapBackend::new(path, (900, height)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    whole.fill(&WHITE).map_err(|e| err(&e))?;
    // The legend in a strip of its own under the chart, where no bar can hide it.
    let (root, legend) = whole.split_vertically(height - 30);
    let max = bars.iter().map(|(_, v)| *v).fold(0.0f64, f64::max);
    let min_pos = bars.iter().map(|(_, v)| *v).filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
    let log = max > 0.0 && min_pos.is_finite() && max / min_pos > 100.0;
    // Bar lengths in axis units: the value, or its log10 on a log axis.
    let (lo, hi) = if log {
        (min_pos.log10().floor(), max.log10() + 0.25)
    } else {
        (0.0, if max > 0.0 { max * 1.15 } else { 1.0 })
    };
    let x_of = |v: f64| if log { v.max(10f64.powf(lo)).log10() } else { v };
    let n = bars.len().max(1) as i32;
    let unit = if log { format!("{} (log scale)", chart.unit) } else { chart.unit.clone() };
    // Room for the longest label (about 7 pixels a character at this size).
    let longest = bars.iter().map(|(l, _)| l.chars().count()).max().unwrap_or(0) as u32;
    let mut ctx = ChartBuilder::on(&root)
        .caption(&chart.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size((7 * longest + 16).max(170))
        .build_cartesian_2d(lo..hi, (0..(n - 1).max(1)).into_segmented())
        .map_err(|e| err(&e))?;
    let labels: Vec<String> = bars.iter().map(|(l, _)| l.clone()).collect();
    let label_of = |seg: &SegmentValue<i32>| match seg {
        SegmentValue::CenterOf(i) => labels.get((n - 1 - *i) as usize).cloned().unwrap_or_default(),
        _ => String::new(),
    };
    let linear = tick_format(hi - lo);
    let tick = |x: &f64| if log { format_value(10f64.powf(*x)) } else { linear(x) };
    ctx.configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len().max(1))
        .y_label_formatter(&label_of)
        .x_label_formatter(&tick)
        .x_desc(unit.as_str())
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    let fallow_color = RGBColor(200, 120, 50);
    let peer_color = RGBColor(70, 110, 170);
    ctx.draw_series(bars.iter().enumerate().map(|(k, (label, v))| {
        let y = n - 1 - k as i32;
        let color = if label.starts_with("fallow") { fallow_color } else { peer_color };
        let mut r = Rectangle::new(
            [(lo, SegmentValue::Exact(y)), (x_of(*v), SegmentValue::Exact(y + 1))],
            color.filled(),
        );
        r.set_margin(4, 4, 0, 0);
        r
    }))
    .map_err(|e| err(&e))?;
    let style = TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    ctx.draw_series(bars.iter().enumerate().map(|(k, (_, v))| {
        let y = n - 1 - k as i32;
        Text::new(format!(" {}", format_value(*v)), (x_of(*v), SegmentValue::CenterOf(y)), style.clone())
    }))
    .map_err(|e| err(&e))?;
    let key = TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let keys = [(fallow_color, "fallow (and its variants)"), (peer_color, "other allocators")];
    for (i, (color, what)) in keys.iter().enumerate() {
        let x = 20 + 260 * i as i32;
        legend.draw(&Rectangle::new([(x, 8), (x + 18, 22)], color.filled())).map_err(|e| err(&e))?;
        legend.draw(&Text::new(*what, (x + 26, 15), key.clone())).map_err(|e| err(&e))?;
    }
    whole.present().map_err(|e| err(&e))?;
    Ok(())
}

/// `text` cut to `max` characters, with an ellipsis when cut (a chart title must fit its width).
pub fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let cut: String = text.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// Axis ticks with one number of decimals for the whole axis, chosen from its span (`0`, `20`, `40`
/// rather than `0.00`, `20.0`, `40.0`).
pub fn tick_format(span: f64) -> impl Fn(&f64) -> String {
    let decimals = if span >= 20.0 {
        0
    } else if span >= 2.0 {
        1
    } else if span > 0.0 {
        (2.0 - span.log10().floor()).clamp(2.0, 6.0) as usize
    } else {
        0
    };
    move |v: &f64| format!("{v:.decimals$}")
}

pub fn format_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 0.01 || v <= 0.0 {
        format!("{v:.2}")
    } else {
        // Two significant digits below 0.01 (0.0038), rather than 0.00.
        let decimals = (-v.log10()).ceil() as usize + 1;
        format!("{v:.decimals$}")
    }
}

/// Draw `series` (name, points) as lines over a shared x axis into the PNG file `path`, with a
/// legend naming each line (`fallow run --timeline`, pressure's summed RSS per peer), and `limit`
/// (label, value) as a black horizontal line labelled with its value.
pub fn draw_lines(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
    limit: Option<(&str, f64)>,
    path: &Path,
) -> Result<(), String> {
    register_font();
    let whole = BitMapBackend::new(path, (1100, 560)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    whole.fill(&WHITE).map_err(|e| err(&e))?;
    // The legend in a column of its own right of the chart, where no line can hide it or be hidden.
    let (root, legend) = whole.split_horizontally(860);
    let limit = limit.filter(|(_, v)| v.is_finite());
    let finite = |&&(x, y): &&(f64, f64)| x.is_finite() && y.is_finite();
    let pts = series.iter().flat_map(|(_, p)| p.iter().filter(finite));
    let (mut x_max, mut y_max) = (0.0f64, limit.map_or(0.0, |l| l.1));
    for &(x, y) in pts {
        x_max = x_max.max(x);
        y_max = y_max.max(y);
    }
    let x_max = if x_max > 0.0 { x_max * 1.02 } else { 1.0 };
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let mut ctx = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| err(&e))?;
    ctx.configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(10)
        .y_labels(8)
        .x_label_formatter(&tick_format(x_max))
        .y_label_formatter(&tick_format(y_max))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    let colors = [
        RGBColor(40, 40, 40),
        RGBColor(200, 120, 50),
        RGBColor(190, 60, 60),
        RGBColor(60, 150, 80),
        RGBColor(140, 100, 180),
        RGBColor(70, 110, 170),
    ];
    let key = TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let mut keys = 0;
    let mut legend_line = |name: &str, style: ShapeStyle| -> Result<(), String> {
        let y = 60 + 24 * keys;
        keys += 1;
        legend.draw(&PathElement::new(vec![(4, y), (26, y)], style)).map_err(|e| err(&e))?;
        legend.draw(&Text::new(name, (32, y), key.clone())).map_err(|e| err(&e))
    };
    if let Some((label, v)) = limit {
        let style = BLACK.stroke_width(1);
        ctx.draw_series(LineSeries::new([(0.0, v), (x_max, v)], style)).map_err(|e| err(&e))?;
        legend_line(&format!("{label} {}", format_value(v)), style)?;
    }
    for (i, (name, p)) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        ctx.draw_series(LineSeries::new(p.iter().filter(finite).copied(), c.stroke_width(2))).map_err(|e| err(&e))?;
        legend_line(name, c.stroke_width(3))?;
    }
    whole.present().map_err(|e| err(&e))?;
    Ok(())
}
