//! `splitgrad bench`: times one workload of `docs/spec.md#5-benchmark-workloads` and relates it
//! to the memory copy and sgemm rates of the same process.

use std::process::ExitCode;

use crate::app::bench::{BenchConfig, BenchReport, Workload, run as run_bench};
use clap::Args;
use serde_json::{Value, json};

use super::{CliResult, set_threads};

/// Options of `splitgrad bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Workload: embed_prompt, embed_full, splitvocab or lmhead.
    pub workload: Workload,
    /// Timed steps after one warm-up step.
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Worker threads, of rayon and of the matrix products (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Divide every size by this, for a quick smoke run (1: as specified).
    #[arg(long, default_value_t = 1)]
    pub scale: usize,
    /// Also print the report as one JSON object on the last line of standard output.
    #[arg(long)]
    pub json: bool,
}

/// Runs `bench` and prints the report.
pub fn run(args: BenchArgs) -> CliResult<ExitCode> {
    if args.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    if args.scale == 0 {
        return Err("--scale must be at least 1".into());
    }
    set_threads(args.threads)?;
    let cfg = BenchConfig {
        workload: args.workload,
        steps: args.steps,
        threads: None,
        scale: args.scale,
    };
    let r = run_bench(&cfg)?;
    print!("{}", table(&r));
    if args.json {
        println!("{}", serde_json::to_string(&to_json(&r))?);
    }
    Ok(ExitCode::SUCCESS)
}

fn ms(s: f64) -> String {
    format!("{:.1} ms", s * 1e3)
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// The human-readable report.
fn table(r: &BenchReport) -> String {
    let mut rows: Vec<(String, String)> = vec![
        (
            "workload".into(),
            format!(
                "{} (scale {}, {} steps, {} threads)",
                r.workload, r.scale, r.steps, r.threads
            ),
        ),
        (
            "step".into(),
            format!("median {}, min {}", ms(r.median_s), ms(r.min_s)),
        ),
        (
            "phases".into(),
            format!(
                "forward {}, backward {}, update {} (medians)",
                ms(r.phase_median_s[0]),
                ms(r.phase_median_s[1]),
                ms(r.phase_median_s[2])
            ),
        ),
        (
            "vs PyTorch".into(),
            format!(
                "{:.2}× its {}{}",
                r.speedup_vs_pytorch(),
                ms(r.workload.pytorch_s()),
                if r.scale == 1 {
                    ""
                } else {
                    " (not comparable: scaled down)"
                }
            ),
        ),
        (
            "cpu".into(),
            match (r.cpu_s_per_step, r.wait_s_per_step) {
                (Some(c), Some(w)) => format!(
                    "{} on a CPU, {} waiting for one, per step (all threads)",
                    ms(c),
                    ms(w)
                ),
                _ => "unknown".into(),
            },
        ),
        (
            "peak memory".into(),
            match r.peak_rss_mib {
                Some(m) => format!(
                    "{m:.0} MiB (parameters {:.0} MiB)",
                    r.params_bytes as f64 / (1 << 20) as f64
                ),
                None => "unknown".into(),
            },
        ),
        (
            "bytes moved".into(),
            format!(
                "{} per step: {:.1} GB/s, {:.0} % of the copy rate {:.1} GB/s",
                mb(r.bytes_moved),
                r.bytes_moved as f64 / r.median_s / 1e9,
                100.0 * r.bandwidth_fraction,
                r.memcpy_gbps
            ),
        ),
    ];
    if let (Some(g), Some(s), Some(f)) = (r.gflops, r.sgemm_gflops, r.gflops_fraction) {
        rows.push((
            "matmul".into(),
            format!(
                "{g:.1} GFLOP/s on 6·N·V·H, {:.0} % of the sgemm rate {s:.1} GFLOP/s",
                100.0 * f
            ),
        ));
    }
    if let Some(w) = r.workspace_bytes {
        rows.push((
            "workspace".into(),
            format!("{:.1} MiB", w as f64 / (1 << 20) as f64),
        ));
    }
    let mut out = String::new();
    for (k, v) in rows {
        out += &format!("{k:<12} {v}\n");
    }
    out += "bytes per step:\n";
    for (what, b) in &r.bytes_terms {
        out += &format!("  {:>10}  {what}\n", mb(*b));
    }
    out
}

/// The report as one JSON object.
fn to_json(r: &BenchReport) -> Value {
    let terms: Vec<Value> = r.bytes_terms.iter().map(|&(k, b)| json!([k, b])).collect();
    json!({
        "workload": r.workload.name(),
        "median_s": r.median_s,
        "min_s": r.min_s,
        "steps": r.steps,
        "threads": r.threads,
        "scale": r.scale,
        "step_s": r.step_s,
        "forward_s": r.phase_median_s[0],
        "backward_s": r.phase_median_s[1],
        "update_s": r.phase_median_s[2],
        "cpu_s_per_step": r.cpu_s_per_step,
        "wait_s_per_step": r.wait_s_per_step,
        "peak_rss_mib": r.peak_rss_mib,
        "params_bytes": r.params_bytes,
        "bytes_moved": r.bytes_moved,
        "bytes_terms": terms,
        "memcpy_gbps": r.memcpy_gbps,
        "bandwidth_fraction": r.bandwidth_fraction,
        "flops": r.flops,
        "gflops": r.gflops,
        "sgemm_gflops": r.sgemm_gflops,
        "gflops_fraction": r.gflops_fraction,
        "workspace_bytes": r.workspace_bytes,
        "pytorch_s": r.workload.pytorch_s(),
        "speedup_vs_pytorch": r.speedup_vs_pytorch(),
        "loss": r.loss,
    })
}
