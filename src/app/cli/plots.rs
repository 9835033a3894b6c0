//! SVG plots of a run: the losses, the histogram of gates, and a sweep.
//!
//! Steps are on a logarithmic axis (step 0, before training, sits at the
//! left edge as step 1), so the first hundred steps and the last thousand
//! are both visible at any run length. Tick labels are whole numbers.

use std::io::Write;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::CliResult;
use crate::app::sweep::FusionPoint;
use crate::app::train::StepStats;

/// Writes an SVG atomically (a failed write leaves the old plot).
fn save(path: &Path, svg: &str) -> CliResult<()> {
    crate::io::write_atomic(path, |w| Ok(w.write_all(svg.as_bytes())?))?;
    Ok(())
}

/// A range around finite values, padded by 5 % (a unit around a constant).
fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-12 {
        return (lo - 0.5, hi + 0.5);
    }
    let pad = 0.05 * (hi - lo);
    (lo - pad, hi + pad)
}

/// A whole step number for a tick of the log axis.
fn step_label(x: &f64) -> String {
    format!("{}", x.round() as u64)
}

/// One panel of the loss plot: series of (step, value) on a log step axis.
#[allow(clippy::type_complexity)]
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    max_step: f64,
    lines: &[(&str, RGBColor, Vec<(f64, f64)>)],
    points: &[(&str, RGBColor, Vec<(f64, f64)>)],
) -> CliResult<()> {
    let (lo, hi) = range(
        lines
            .iter()
            .chain(points)
            .flat_map(|(_, _, v)| v.iter().map(|p| p.1)),
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .margin_right(24)
        .x_label_area_size(34)
        .y_label_area_size(64)
        .build_cartesian_2d((1f64..max_step.max(2.0)).log_scale(), lo..hi)?;
    chart
        .configure_mesh()
        .x_desc("step (log scale)")
        .x_label_formatter(&step_label)
        .y_labels(6)
        .y_label_formatter(&|y| format!("{y:.3}"))
        .draw()?;
    for (name, color, v) in lines {
        let color = *color;
        chart
            .draw_series(LineSeries::new(v.iter().copied(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
    }
    // Later point series are drawn over earlier ones; the first is hollow
    // so that a point under it stays visible.
    for (k, (name, color, v)) in points.iter().enumerate() {
        let style = if k == 0 {
            color.stroke_width(2)
        } else {
            color.filled()
        };
        let size = if k == 0 { 6 } else { 4 };
        chart
            .draw_series(v.iter().map(move |&p| Circle::new(p, size, style)))?
            .label(*name)
            .legend(move |(x, y)| Circle::new((x + 9, y), size, style));
    }
    if lines.len() + points.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    Ok(())
}

/// Draws the training cross-entropy with the held-out cross-entropy at each
/// evaluation (the model, and every gate closed), and below it each
/// penalty on its own axis.
pub fn loss_curve(
    path: &Path,
    history: &[StepStats],
    heldout: &[(u64, f64, f64)],
) -> CliResult<()> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (820, 760)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, bottom) = root.split_vertically(400);
        let (mid, low) = bottom.split_vertically(180);
        // Step s of the history is the loss before update s + 1.
        let at = |s: u64| (s + 1) as f64;
        let max_step = at(history.len().max(1) as u64)
            .max(heldout.iter().map(|c| at(c.0)).fold(2.0, f64::max));
        let ce: Vec<(f64, f64)> = history.iter().map(|s| (at(s.step), s.ce)).collect();
        let held: Vec<(f64, f64)> = heldout.iter().map(|c| (at(c.0), c.1)).collect();
        let closed: Vec<(f64, f64)> = heldout.iter().map(|c| (at(c.0), c.2)).collect();
        panel(
            &top,
            "cross-entropy",
            max_step,
            &[("training batch", RGBColor(31, 119, 180), ce)],
            &[
                (
                    "held-out, every gate closed",
                    RGBColor(120, 120, 120),
                    closed,
                ),
                ("held-out", RGBColor(214, 39, 40), held),
            ],
        )?;
        let penalty: Vec<(f64, f64)> = history.iter().map(|s| (at(s.step), s.penalty)).collect();
        panel(
            &mid,
            "gate penalty: mean(σ(gate_logit))",
            max_step,
            &[("gate penalty", RGBColor(44, 160, 44), penalty)],
            &[],
        )?;
        let fusion: Vec<(f64, f64)> = history.iter().map(|s| (at(s.step), s.fusion)).collect();
        panel(
            &low,
            "fusion penalty: mean distance to the token's centroid",
            max_step,
            &[("fusion penalty", RGBColor(148, 103, 189), fusion)],
            &[],
        )?;
        root.present()?;
    }
    save(path, &svg)
}

/// Draws the histogram of gate values in 20 bins over [0, 1]; with the
/// planted truth, planted rows and the others as stacked colours.
pub fn gate_histogram(path: &Path, gates: &[f64], planted: Option<&[bool]>) -> CliResult<()> {
    let bins = 20usize;
    let bin = |g: f64| ((g * bins as f64) as usize).min(bins - 1);
    let mut other = vec![0u32; bins];
    let mut true_ = vec![0u32; bins];
    for (i, &g) in gates.iter().enumerate() {
        match planted {
            Some(p) if p[i] => true_[bin(g)] += 1,
            _ => other[bin(g)] += 1,
        }
    }
    let top = (0..bins)
        .map(|b| other[b] + true_[b])
        .max()
        .unwrap_or(1)
        .max(1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (820, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("gates σ(gate_logit) after training", ("sans-serif", 18))
            .margin(12)
            .margin_right(24)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..1f64, 0u32..top + top / 10 + 1)?;
        chart
            .configure_mesh()
            .x_desc("gate")
            .y_desc("rows")
            .y_label_formatter(&|y| format!("{y}"))
            .draw()?;
        let w = 1.0 / bins as f64;
        let blue = RGBColor(31, 119, 180);
        let red = RGBColor(214, 39, 40);
        let other_label = if planted.is_some() {
            "other rows"
        } else {
            "rows"
        };
        chart
            .draw_series((0..bins).filter(|&b| other[b] > 0).map(|b| {
                let x0 = b as f64 * w;
                Rectangle::new(
                    [(x0 + w * 0.05, 0), (x0 + w * 0.95, other[b])],
                    blue.mix(0.75).filled(),
                )
            }))?
            .label(other_label)
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 14, y + 5)], blue.mix(0.75).filled())
            });
        if planted.is_some() {
            chart
                .draw_series((0..bins).filter(|&b| true_[b] > 0).map(|b| {
                    let x0 = b as f64 * w;
                    Rectangle::new(
                        [
                            (x0 + w * 0.05, other[b]),
                            (x0 + w * 0.95, other[b] + true_[b]),
                        ],
                        red.mix(0.8).filled(),
                    )
                }))?
                .label("planted pairs")
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], red.mix(0.8).filled())
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
        root.present()?;
    }
    save(path, &svg)
}

/// Draws a sweep: effective vocabularies and held-out cross-entropy against
/// the fusion weight (a weight of 0 sits at the left edge).
pub fn sweep(path: &Path, points: &[FusionPoint]) -> CliResult<()> {
    let positive: Vec<f64> = points
        .iter()
        .map(|p| p.fusion_weight)
        .filter(|&w| w > 0.0)
        .collect();
    let min_w = positive.iter().copied().fold(f64::INFINITY, f64::min);
    let min_w = if min_w.is_finite() { min_w } else { 1.0 };
    let max_w = positive.iter().copied().fold(min_w * 10.0, f64::max);
    let left = min_w / 3.0;
    // A weight of 0 is drawn at `left`.
    let x = |w: f64| if w > 0.0 { w } else { left };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (820, 620)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, bottom) = root.split_vertically(310);
        for (area, title, values, color) in [
            (
                &top,
                "effective number of vocabularies",
                points
                    .iter()
                    .map(|p| (x(p.fusion_weight), p.effective_vocabularies))
                    .collect::<Vec<_>>(),
                RGBColor(31, 119, 180),
            ),
            (
                &bottom,
                "held-out cross-entropy",
                points
                    .iter()
                    .map(|p| (x(p.fusion_weight), p.heldout_ce))
                    .collect::<Vec<_>>(),
                RGBColor(214, 39, 40),
            ),
        ] {
            let (lo, hi) = range(values.iter().map(|p| p.1));
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 16))
                .margin(10)
                .margin_right(24)
                .x_label_area_size(34)
                .y_label_area_size(64)
                .build_cartesian_2d((left * 0.8..max_w * 1.25).log_scale(), lo..hi)?;
            chart
                .configure_mesh()
                .x_desc("fusion weight (log scale; the leftmost point is 0)")
                .x_label_formatter(&|v| {
                    if *v < min_w * 0.99 {
                        "0".to_string()
                    } else {
                        format!("{v}")
                    }
                })
                .y_label_formatter(&|y| format!("{y:.3}"))
                .draw()?;
            chart.draw_series(LineSeries::new(
                values.iter().copied(),
                color.stroke_width(2),
            ))?;
            chart.draw_series(values.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        root.present()?;
    }
    save(path, &svg)
}
