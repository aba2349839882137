//! PNG bar charts of an experiment's main figure, one bar per peer, or lines over time, one per
//! peer (pressure's summed RSS). Text is drawn with a font
//! compiled into the binary (Ubuntu Light, from the `epaint_default_fonts` crate) so that a
//! machine without system fonts draws the same charts.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use crate::experiments::{Chart, Lines};

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
        return draw_lines(chart, lines, path);
    }
    let bars: Vec<&(String, f64)> = chart.bars.iter().filter(|(_, v)| v.is_finite() && *v >= 0.0).collect();
    let height = 120 + 34 * bars.len().max(1) as u32;
    let root = BitMapBackend::new(path, (900, height)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
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
    let tick = |x: &f64| if log { format_value(10f64.powf(*x)) } else { format_value(*x) };
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
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Line colours, one per series in turn: the malloc-like peers first in blues and greens, then
/// fallow's in oranges (the peers' order in the experiments).
const LINE_COLORS: [RGBColor; 9] = [
    RGBColor(70, 110, 170),
    RGBColor(60, 150, 90),
    RGBColor(140, 90, 170),
    RGBColor(120, 120, 120),
    RGBColor(230, 170, 60),
    RGBColor(200, 90, 30),
    RGBColor(160, 60, 60),
    RGBColor(90, 170, 200),
    RGBColor(200, 120, 170),
];

/// Draw `lines` (over the chart's title and unit) into the PNG file `path`: one line per series
/// with a legend, and the limit as a black line labelled with its value.
fn draw_lines(chart: &Chart, lines: &Lines, path: &Path) -> Result<(), String> {
    let root = BitMapBackend::new(path, (1000, 560)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let finite = |&(x, y): &&(f64, f64)| x.is_finite() && y.is_finite();
    let pts = || lines.series.iter().flat_map(|(_, p)| p.iter().filter(finite));
    let x_max = pts().map(|p| p.0).fold(0.0f64, f64::max).max(1e-3);
    let limit = lines.limit.as_ref().map(|(_, v)| *v).filter(|v| v.is_finite());
    let y_max = pts().map(|p| p.1).fold(limit.unwrap_or(0.0), f64::max).max(1.0) * 1.1;
    let mut ctx = ChartBuilder::on(&root)
        .caption(&chart.title, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max * 1.02, 0.0..y_max)
        .map_err(|e| err(&e))?;
    ctx.configure_mesh()
        .x_desc(lines.x_desc.as_str())
        .y_desc(chart.unit.as_str())
        .x_label_formatter(&|x| axis_tick(*x))
        .y_label_formatter(&|y| axis_tick(*y))
        .label_style(("sans-serif", 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(|e| err(&e))?;
    if let (Some((label, _)), Some(v)) = (&lines.limit, limit) {
        let style = BLACK.stroke_width(1);
        ctx.draw_series(LineSeries::new([(0.0, v), (x_max * 1.02, v)], style))
            .map_err(|e| err(&e))?
            .label(format!("{label} {}", format_value(v)))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
    }
    for (k, (label, points)) in lines.series.iter().enumerate() {
        let style = LINE_COLORS[k % LINE_COLORS.len()].stroke_width(2);
        ctx.draw_series(LineSeries::new(points.iter().filter(finite).copied(), style))
            .map_err(|e| err(&e))?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
    }
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// An axis tick: whole numbers without decimals (5, 250), else as few as it takes (2.5, 0.25).
fn axis_tick(v: f64) -> String {
    (0..4)
        .map(|d| format!("{v:.d$}"))
        .find(|s| (s.parse::<f64>().unwrap_or(f64::NAN) - v).abs() <= 1e-6 * v.abs().max(1e-3))
        .unwrap_or_else(|| format_value(v))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_ticks_have_no_needless_decimals() {
        assert_eq!(axis_tick(0.0), "0");
        assert_eq!(axis_tick(250.0), "250");
        assert_eq!(axis_tick(2.5), "2.5");
        assert_eq!(axis_tick(0.25), "0.25");
        assert_eq!(axis_tick(0.1 + 0.2), "0.3");
        // Ticks computed in floating point land near round values.
        assert_eq!(axis_tick(50.000000001), "50");
        assert_eq!(axis_tick(1e-11), "0");
    }
}
