//! SVG charts of the transaction benchmark, as the LIXA report draws them.
//!
//! Two charts per report: the characteristic curve (throughput on Y against the 95th
//! percentile of the total latency the TM adds on X, one series per engine and RPO), and
//! the total-latency percentiles (p25, p50, p75, p95) against the thread count. Latencies
//! are drawn in milliseconds. Charts are written with plotters' SVG backend, whose text
//! needs no font files.

use crate::tx::BenchPoint;
use crate::BenchError;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Picks one total-latency percentile (in microseconds) out of a point.
type Quantile = fn(&BenchPoint) -> f64;

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 650;

/// The percentile chart's path beside the main one: `x.svg` gives `x-percentiles.svg`.
pub fn percentiles_path(chart: &Path) -> PathBuf {
    let stem = chart.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "chart".into());
    chart.with_file_name(format!("{stem}-percentiles.svg"))
}

/// Groups points by series name, each sorted by thread count.
fn series(points: &[BenchPoint]) -> BTreeMap<String, Vec<&BenchPoint>> {
    let mut map: BTreeMap<String, Vec<&BenchPoint>> = BTreeMap::new();
    for p in points {
        map.entry(p.series()).or_default().push(p);
    }
    for list in map.values_mut() {
        list.sort_by_key(|p| p.threads);
    }
    map
}

fn chart_error(path: &Path, e: impl std::fmt::Display) -> BenchError {
    BenchError::Chart { path: path.to_path_buf(), message: e.to_string() }
}

fn upper(values: impl Iterator<Item = f64>) -> f64 {
    let max = values.fold(0.0f64, f64::max);
    if max > 0.0 {
        max * 1.1
    } else {
        1.0
    }
}

/// Writes both charts: `path` and [`percentiles_path`]`(path)`; returns the second path.
pub fn write_charts(path: &Path, title: &str, points: &[BenchPoint]) -> Result<PathBuf, BenchError> {
    if points.is_empty() {
        return Err(chart_error(path, "no measured run to draw"));
    }
    characteristic(path, title, points)?;
    let second = percentiles_path(path);
    percentiles(&second, title, points)?;
    Ok(second)
}

/// Throughput against p95 total latency, one line per series.
pub fn characteristic(path: &Path, title: &str, points: &[BenchPoint]) -> Result<(), BenchError> {
    let err = |e: &dyn std::fmt::Display| chart_error(path, e);
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let x_max = upper(points.iter().map(|p| p.total.p95 / 1e3));
    let y_max = upper(points.iter().map(|p| p.tps));
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{title}: throughput against p95 latency added by the TM"), ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("total latency p95 (ms)")
        .y_desc("transactions per second")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (name, list)) in series(points).into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let coords: Vec<(f64, f64)> = list.iter().map(|p| (p.total.p95 / 1e3, p.tps)).collect();
        chart
            .draw_series(LineSeries::new(coords.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(coords.iter().map(|&c| Circle::new(c, 4, color.filled()))).map_err(|e| err(&e))?;
        let labels = list
            .iter()
            .map(|p| Text::new(format!("{}t", p.threads), (p.total.p95 / 1e3, p.tps), ("sans-serif", 12)));
        chart.draw_series(labels).map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Total-latency percentiles against the thread count, four lines per series.
pub fn percentiles(path: &Path, title: &str, points: &[BenchPoint]) -> Result<(), BenchError> {
    let err = |e: &dyn std::fmt::Display| chart_error(path, e);
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let x_max = points.iter().map(|p| p.threads).max().unwrap_or(1) as f64 * 1.05 + 1.0;
    let y_max = upper(points.iter().map(|p| p.total.p95 / 1e3));
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{title}: total latency added by the TM, percentiles"), ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("threads")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("total latency (ms)")
        .draw()
        .map_err(|e| err(&e))?;
    let mut index = 0;
    for (name, list) in series(points) {
        let quantiles: [(&str, Quantile); 4] = [
            ("p25", |p| p.total.p25),
            ("p50", |p| p.total.p50),
            ("p75", |p| p.total.p75),
            ("p95", |p| p.total.p95),
        ];
        for (label, value) in quantiles {
            let color = Palette99::pick(index).to_rgba();
            index += 1;
            let coords: Vec<(f64, f64)> = list.iter().map(|p| (p.threads as f64, value(p) / 1e3)).collect();
            chart
                .draw_series(LineSeries::new(coords.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(format!("{name} {label}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart
                .draw_series(coords.iter().map(|&c| Circle::new(c, 3, color.filled())))
                .map_err(|e| err(&e))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
