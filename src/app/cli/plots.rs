//! SVG plots of a run: the losses, the histogram of gates, and a sweep.
//!
//! Steps are on a logarithmic axis (step 0, before training, sits at the
//! left edge as step 1), so the first hundred steps and the last thousand
//! are both visible at any run length. Tick labels are whole numbers.

use std::io::Write;
use std::path::Path;

use plotters::coord::combinators::LogCoord;
use plotters::coord::ranged1d::Ranged;
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;

use super::CliResult;
use crate::app::bench::SweepRow;
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

/// A chart of a run's plots on `area`, titled `title`.
fn titled<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut chart = ChartBuilder::on(area);
    chart
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .margin_right(24)
        .x_label_area_size(34)
        .y_label_area_size(64);
    chart
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
    let mut chart =
        titled(area, title).build_cartesian_2d((1f64..max_step.max(2.0)).log_scale(), lo..hi)?;
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
        legend(&mut chart)?;
    }
    Ok(())
}

/// Draws a chart's legend at its upper right, on a light background.
fn legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
) -> CliResult<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}

/// Draws the training cross-entropy with the held-out cross-entropy at each
/// evaluation (the model, and every gate closed), and below it each
/// penalty on its own axis. `kept_as` follows the first panel's title (a
/// run that keeps values in half precision says how,
/// [`kept_as`](super::options::kept_as); empty for f32).
pub fn loss_curve(
    path: &Path,
    history: &[StepStats],
    heldout: &[(u64, f64, f64)],
    kept_as: &str,
) -> CliResult<()> {
    let title = format!("cross-entropy{kept_as}");
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
            &title,
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
        // Each penalty on its own axis.
        let gate: fn(&StepStats) -> f64 = |s| s.penalty;
        for (area, title, name, color, value) in [
            (
                &mid,
                "gate penalty: mean(σ(gate_logit))",
                "gate penalty",
                RGBColor(44, 160, 44),
                gate,
            ),
            (
                &low,
                "fusion penalty: mean distance to the token's centroid",
                "fusion penalty",
                RGBColor(148, 103, 189),
                |s| s.fusion,
            ),
        ] {
            let v: Vec<(f64, f64)> = history.iter().map(|s| (at(s.step), value(s))).collect();
            panel(area, title, max_step, &[(name, color, v)], &[])?;
        }
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
        let mut layers = vec![(other_label, &other, blue.mix(0.75))];
        if planted.is_some() {
            layers.push(("planted pairs", &true_, red.mix(0.8)));
        }
        // Each layer stacked on the ones before it.
        let mut below = vec![0u32; bins];
        for (label, counts, color) in layers {
            chart
                .draw_series((0..bins).filter(|&b| counts[b] > 0).map(|b| {
                    let x0 = b as f64 * w;
                    Rectangle::new(
                        [
                            (x0 + w * 0.05, below[b]),
                            (x0 + w * 0.95, below[b] + counts[b]),
                        ],
                        color.filled(),
                    )
                }))?
                .label(label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled())
                });
            below.iter_mut().zip(counts).for_each(|(b, c)| *b += c);
        }
        legend(&mut chart)?;
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
        let effective: fn(&FusionPoint) -> f64 = |p| p.effective_vocabularies;
        for (area, title, value, color) in [
            (
                &top,
                "effective number of vocabularies",
                effective,
                RGBColor(31, 119, 180),
            ),
            (
                &bottom,
                "held-out cross-entropy",
                |p| p.heldout_ce,
                RGBColor(214, 39, 40),
            ),
        ] {
            let values: Vec<(f64, f64)> = points
                .iter()
                .map(|p| (x(p.fusion_weight), value(p)))
                .collect();
            let (lo, hi) = range(values.iter().map(|p| p.1));
            let mut chart = titled(area, title)
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

/// The bench sweep's two panels against V (log axes): tokens per second,
/// and the step's fractions of the sgemm rate (solid) and of the copy rate
/// (dashed); one colour per D.
pub fn bench_sweep(path: &Path, rows: &[SweepRow]) -> CliResult<()> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let panels = root.split_evenly((1, 2));
        let v_lo = rows.iter().map(|r| r.vocab_size).min().unwrap_or(1) as f64;
        let v_hi = rows.iter().map(|r| r.vocab_size).max().unwrap_or(2) as f64;
        let x = (v_lo / 1.3).max(1.0)..(v_hi * 1.3).max(2.0);
        let t_lo = rows
            .iter()
            .map(|r| r.tokens_per_s)
            .fold(f64::INFINITY, f64::min);
        let t_hi = rows.iter().map(|r| r.tokens_per_s).fold(0.0, f64::max);
        let mut c = ChartBuilder::on(&panels[0])
            .caption(
                "bigram training step: tokens per second",
                ("sans-serif", 16),
            )
            .margin(10)
            .x_label_area_size(34)
            .y_label_area_size(64)
            .build_cartesian_2d(
                x.clone().log_scale(),
                ((t_lo / 1.5).max(1.0)..t_hi * 1.5).log_scale(),
            )?;
        c.configure_mesh()
            .x_desc("V (log scale)")
            .y_desc("tokens/s")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        lines_by_dim(&mut c, rows, |r| r.tokens_per_s, None)?;
        let f_hi = rows
            .iter()
            .flat_map(|r| [r.sgemm_fraction, r.copy_fraction])
            .fold(1.0f64, f64::max);
        let mut c = ChartBuilder::on(&panels[1])
            .caption(
                "fraction of the sgemm (—) and copy (- -) rates",
                ("sans-serif", 16),
            )
            .margin(10)
            .x_label_area_size(34)
            .y_label_area_size(48)
            .build_cartesian_2d(x.log_scale(), 0.0..f_hi * 1.05)?;
        c.configure_mesh()
            .x_desc("V (log scale)")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.1}"))
            .draw()?;
        lines_by_dim(
            &mut c,
            rows,
            |r| r.sgemm_fraction,
            Some(|r: &SweepRow| r.copy_fraction),
        )?;
        root.present()?;
    }
    save(path, &svg)
}

/// One line of `solid` against V per width D, in its colour and in the
/// legend, each followed by a thin dashed line of `dashed`.
fn lines_by_dim<'a, Y: Ranged<ValueType = f64>>(
    c: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<LogCoord<f64>, Y>>,
    rows: &[SweepRow],
    solid: fn(&SweepRow) -> f64,
    dashed: Option<fn(&SweepRow) -> f64>,
) -> CliResult<()> {
    let mut dims: Vec<usize> = rows.iter().map(|r| r.dim).collect();
    dims.sort_unstable();
    dims.dedup();
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    let series = |d: usize, f: fn(&SweepRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter()
            .filter(|r| r.dim == d)
            .map(|r| (r.vocab_size as f64, f(r)))
            .collect()
    };
    for (i, &d) in dims.iter().enumerate() {
        let col = colors[i % colors.len()];
        c.draw_series(LineSeries::new(series(d, solid), col.stroke_width(2)))?
            .label(format!("D {d}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col));
        if let Some(f) = dashed {
            c.draw_series(DashedLineSeries::new(
                series(d, f),
                6,
                4,
                col.stroke_width(1),
            ))?;
        }
    }
    c.configure_series_labels().border_style(BLACK).draw()?;
    Ok(())
}
