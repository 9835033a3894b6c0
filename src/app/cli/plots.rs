//! SVG plots of a run: the loss curve and the histogram of gates.

use std::io::Write;
use std::path::Path;

use plotters::prelude::*;

use super::CliResult;

/// Draws the total loss per step.
pub fn loss_curve(path: &Path, losses: &[f64]) -> CliResult<()> {
    let mut svg = String::new();
    {
        draw_loss(&mut svg, losses)?;
    }
    save(path, &svg)
}

/// Writes an SVG atomically (a failed write leaves the old plot).
fn save(path: &Path, svg: &str) -> CliResult<()> {
    crate::io::write_atomic(path, |w| Ok(w.write_all(svg.as_bytes())?))?;
    Ok(())
}

fn draw_loss(svg: &mut String, losses: &[f64]) -> CliResult<()> {
    let root = SVGBackend::with_string(svg, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let finite: Vec<f64> = losses.iter().copied().filter(|x| x.is_finite()).collect();
    let lo = finite
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .min(0.0);
    let hi = finite
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max)
        .max(lo + 1e-9);
    let mut chart = ChartBuilder::on(&root)
        .caption("training loss", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0f64..(losses.len().max(1) as f64), lo..hi * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .draw()?;
    chart.draw_series(LineSeries::new(
        losses.iter().enumerate().map(|(i, &l)| (i as f64, l)),
        &BLUE,
    ))?;
    root.present()?;
    Ok(())
}

/// Draws the histogram of gate values in 20 bins over [0, 1].
pub fn gate_histogram(path: &Path, gates: &[f64]) -> CliResult<()> {
    let mut svg = String::new();
    {
        draw_gates(&mut svg, gates)?;
    }
    save(path, &svg)
}

fn draw_gates(svg: &mut String, gates: &[f64]) -> CliResult<()> {
    let bins = 20usize;
    let mut counts = vec![0u32; bins];
    for &g in gates {
        let b = ((g * bins as f64) as usize).min(bins - 1);
        counts[b] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(1).max(1);
    let root = SVGBackend::with_string(svg, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("gates σ(gate_logit)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0f64..1f64, 0u32..top + 1)?;
    chart
        .configure_mesh()
        .x_desc("gate")
        .y_desc("rows")
        .draw()?;
    chart.draw_series(counts.iter().enumerate().map(|(b, &c)| {
        let x0 = b as f64 / bins as f64;
        Rectangle::new(
            [(x0, 0), (x0 + 1.0 / bins as f64, c)],
            BLUE.mix(0.6).filled(),
        )
    }))?;
    root.present()?;
    Ok(())
}
