//! PNG bar charts of an experiment's main figure, one bar per peer. Text is drawn with a font
//! compiled into the binary (Ubuntu Light, from the `epaint_default_fonts` crate) so that a
//! machine without system fonts draws the same charts.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::experiments::Chart;

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, epaint_default_fonts::UBUNTU_LIGHT);
    });
}

/// Draw `chart` as a horizontal bar chart into the PNG file `path`.
pub fn draw(chart: &Chart, path: &Path) -> Result<(), String> {
    register_font();
    let bars: Vec<&(String, f64)> = chart.bars.iter().filter(|(_, v)| v.is_finite()).collect();
    let height = 120 + 34 * bars.len().max(1) as u32;
    let root = BitMapBackend::new(path, (900, height)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let max = bars.iter().map(|(_, v)| *v).fold(0.0f64, f64::max);
    let top = if max > 0.0 { max * 1.15 } else { 1.0 };
    let n = bars.len().max(1) as i32;
    let mut ctx = ChartBuilder::on(&root)
        .caption(&chart.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(170)
        .build_cartesian_2d(0.0..top, 0..n)
        .map_err(|e| err(&e))?;
    let labels: Vec<String> = bars.iter().map(|(l, _)| l.clone()).collect();
    ctx.configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len().max(1))
        .y_label_formatter(&|i| labels.get((n - 1 - *i) as usize).cloned().unwrap_or_default())
        .x_desc(chart.unit.as_str())
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    let palette = [RGBColor(70, 110, 170), RGBColor(200, 120, 50), RGBColor(90, 160, 90), RGBColor(150, 90, 160)];
    ctx.draw_series(bars.iter().enumerate().map(|(k, (label, v))| {
        let y = n - 1 - k as i32;
        let color = if label.starts_with("fallow") { palette[1] } else { palette[0] };
        let mut r = Rectangle::new([(0.0, y), (*v, y + 1)], color.filled());
        r.set_margin(4, 4, 0, 0);
        r
    }))
    .map_err(|e| err(&e))?;
    ctx.draw_series(bars.iter().enumerate().map(|(k, (_, v))| {
        let y = n - 1 - k as i32;
        Text::new(format_value(*v), (*v + top * 0.01, y + 1), ("sans-serif", 13).into_font())
    }))
    .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

pub fn format_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
