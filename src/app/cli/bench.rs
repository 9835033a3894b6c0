//! `splitgrad bench`: times one workload of `docs/spec.md#5-benchmark-workloads` and relates it
//! to the memory copy and sgemm rates of the same process; or, with
//! `--sweep`, the scaling table of the bigram model's training step.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::app::bench::{
    BenchConfig, BenchReport, SweepConfig, SweepRow, VERSUS_BLOCK, Versus, Workload,
    run as run_bench, sweep,
};
use crate::param::Dtype;
use clap::Args;
use serde_json::{Value, json};

use super::{CliResult, plots, set_threads};

/// Options of `splitgrad bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Workload: embed_prompt, embed_full, splitvocab or lmhead (none with --sweep).
    pub workload: Option<Workload>,
    /// Timed steps after one warm-up step [default: 10; 3 for each row of --sweep].
    #[arg(long)]
    pub steps: Option<usize>,
    /// Worker threads, of rayon and of the matrix products (default: RAYON_NUM_THREADS if set, else all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Divide every size by this, for a quick smoke run (1: as specified).
    #[arg(long, default_value_t = 1)]
    pub scale: usize,
    /// Also print the report as one JSON object on the last line of standard output.
    #[arg(long)]
    pub json: bool,
    /// lmhead: also time every step on matrixmultiply, the reference kernel, alternating with the
    /// tile kernel step by step.
    #[arg(long)]
    pub reference: bool,
    /// How the parameters are kept: f32, bf16 or f16 (the math is f32).
    #[arg(long, default_value = "f32", value_parser = super::options::param_dtype_arg)]
    pub dtype: Dtype,
    /// How the optimisers keep their moments: f32 or bf16.
    #[arg(long, default_value = "f32", value_parser = super::options::state_dtype_arg)]
    pub state_dtype: Dtype,
    /// With --dtype or --state-dtype in half precision: also build the workload in f32 and time
    /// its steps alternating with these, in blocks of --versus-block steps, and report the ratios.
    #[arg(long)]
    pub versus_f32: bool,
    /// Right after each timed step (each side's with --versus-f32), time a copy of as many bytes
    /// as the step moves, and report each step against its copy (the median of the pairs). The
    /// copies leave the caches cold for the next step.
    #[arg(long)]
    pub paired_copy: bool,
    /// With --versus-f32: the steps each side takes before the other takes its turn [default: 1,
    /// step by step: every step starts on the caches the other workload left]. In a longer block
    /// the steps after the first follow steps of their own workload, as in a training loop.
    #[arg(long, value_name = "STEPS")]
    pub versus_block: Option<usize>,
    /// Instead of a workload: the bigram model's training step on the synthetic corpus for every
    /// V of --sweep-v and D of --sweep-d (time per step, tokens per second, fractions of the
    /// sgemm and copy rates measured beside them).
    #[arg(long)]
    pub sweep: bool,
    /// The sweep's vocabulary sizes [default: 500,2000,8000,32000,128000].
    #[arg(long, value_delimiter = ',')]
    pub sweep_v: Option<Vec<usize>>,
    /// The sweep's widths D [default: 64,512].
    #[arg(long, value_delimiter = ',')]
    pub sweep_d: Option<Vec<usize>>,
    /// The sweep's plot (SVG): tokens per second and the two fractions against V.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// Runs `bench` and prints the report.
pub fn run(args: BenchArgs) -> CliResult<ExitCode> {
    if args.steps == Some(0) {
        return Err("--steps must be at least 1".into());
    }
    if args.scale == 0 {
        return Err("--scale must be at least 1".into());
    }
    if args.sweep {
        if args.workload.is_some() {
            return Err("--sweep times the bigram model: give no workload with it".into());
        }
        refuse_with_sweep(&args)?;
        return run_sweep(&args);
    }
    if args.sweep_v.is_some() || args.sweep_d.is_some() {
        return Err("--sweep-v and --sweep-d are the sizes of --sweep: use them with it".into());
    }
    let Some(workload) = args.workload else {
        return Err(
            "give a workload (embed_prompt, embed_full, splitvocab or lmhead) or --sweep".into(),
        );
    };
    if args.svg.is_some() {
        return Err("--svg plots the sweep: use it with --sweep".into());
    }
    if args.scale > workload.largest_size() {
        return Err(format!(
            "--scale {} is above {workload}'s largest size ({}): every size would be 1",
            args.scale,
            workload.largest_size()
        )
        .into());
    }
    if args.reference && workload != Workload::LmHead {
        return Err(format!(
            "--reference times lmhead's matrix products on matrixmultiply too, and {workload} has none: \
             use it with lmhead"
        )
        .into());
    }
    // `--dtype` and `--state-dtype` held to what a training run keeps,
    // with the same messages.
    super::options::PrecisionArgs {
        dtype: args.dtype,
        state_dtype: args.state_dtype,
        rounding: None,
    }
    .precision()?;
    if args.versus_f32 && !(args.dtype.is_half() || args.state_dtype.is_half()) {
        return Err(
            "--versus-f32 sets a run kept in half precision beside the same run in f32, \
                    and this one keeps everything in f32: give --dtype bf16 or f16, or \
                    --state-dtype bf16"
                .into(),
        );
    }
    if args.versus_block.is_some() && !args.versus_f32 {
        return Err(
            "--versus-block sets how --versus-f32 alternates the two workloads' steps: use it \
             with --versus-f32"
                .into(),
        );
    }
    if args.versus_block == Some(0) {
        return Err(
            "--versus-block must be at least 1: each workload takes at least one step a turn"
                .into(),
        );
    }
    if args.versus_f32 && args.reference {
        return Err(
            "--versus-f32 and --reference each alternate the steps with another run's: give one of them"
                .into(),
        );
    }
    set_threads(args.threads)?;
    let cfg = BenchConfig {
        workload,
        steps: args.steps.unwrap_or(10),
        threads: None,
        scale: args.scale,
        reference: args.reference,
        dtype: args.dtype,
        state_dtype: args.state_dtype,
        versus_f32: args.versus_f32,
        versus_block: args.versus_block.unwrap_or(VERSUS_BLOCK),
        paired_copy: args.paired_copy,
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

fn ms2(s: f64) -> String {
    format!("{:.2} ms", s * 1e3)
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
                    "{m:.0} MiB (parameters {:.0} MiB in {}, optimiser state {:.0} MiB in {})",
                    r.params_bytes as f64 / (1 << 20) as f64,
                    r.dtype,
                    r.state_bytes as f64 / (1 << 20) as f64,
                    r.state_dtype
                ),
                None => "unknown".into(),
            },
        ),
        (
            "bytes moved".into(),
            format!(
                "{} per step: {:.1} GB/s, {:.0} % of the copy rate {:.1} GB/s \
                 (the fastest step: {:.0} %)",
                mb(r.bytes_moved),
                r.bytes_moved as f64 / r.median_s / 1e9,
                100.0 * r.bandwidth_fraction,
                r.memcpy_gbps,
                100.0 * r.best_bandwidth_fraction
            ),
        ),
    ];
    if let (Some(f), Some(rate)) = (r.paired_bandwidth_fraction, r.paired_memcpy_gbps) {
        rows.push((
            "paired copy".into(),
            format!(
                "each step against a copy of as many bytes right after it: {:.0} % \
                 (median of the pairs; the copies' median {rate:.1} GB/s)",
                100.0 * f
            ),
        ));
    }
    if let (Some(n), Some(rate), Some(floor)) =
        (r.lazy_adam_elements, r.lazy_adam_gelems, r.update_floor_s)
    {
        rows.push((
            "update floor".into(),
            format!(
                "lazy Adam from cache {rate:.2} G elements/s ({} rows, {} moments): \
                 the step's {:.2} M elements take at least {}, {:.0} % of its median",
                r.dtype,
                r.state_dtype,
                n as f64 / 1e6,
                ms2(floor),
                100.0 * floor / r.median_s
            ),
        ));
    }
    if let (Some(g), Some(s), Some(f)) = (r.gflops, r.sgemm_gflops, r.gflops_fraction) {
        rows.push((
            "matmul".into(),
            format!(
                "{g:.1} GFLOP/s on 6·N·V·H, {:.0} % of the sgemm rate {s:.1} GFLOP/s",
                100.0 * f
            ),
        ));
    }
    if let (Some(f), Some(s)) = (r.useful_fraction, r.sgemm_gflops) {
        rows.push((
            "useful".into(),
            format!(
                "{:.1} GFLOP/s on 6·N_active·V·H, {:.0} % of the sgemm rate {s:.1} GFLOP/s",
                f * s,
                100.0 * f
            ),
        ));
    }
    if let Some(t) = r.tile_sgemm_gflops {
        rows.push((
            "tile sgemm".into(),
            format!("{t:.1} GFLOP/s (the same sgemm on the tile kernel)"),
        ));
    }
    if let Some(m) = r.reference_median_s {
        rows.push((
            "reference".into(),
            format!(
                "median {} on matrixmultiply, alternating: the tile kernel is {:.2}× faster",
                ms(m),
                m / r.median_s
            ),
        ));
    }
    if let Some(v) = &r.versus_f32 {
        rows.push((
            "versus f32".into(),
            format!(
                "median {} in f32, alternating {}: this run takes {:.2}× its time \
                 (median of the paired steps' ratios {:.2}×); parameters + state {:.2}× its bytes",
                ms(v.median_s),
                match v.block {
                    1 => "step by step".to_string(),
                    b => format!("in blocks of {b} steps"),
                },
                v.median_ratio,
                v.pair_ratio,
                v.bytes_ratio
            ),
        ));
        rows.push((
            "f32 bytes".into(),
            format!(
                "{} per step: {:.0} % of the copy rate (the fastest step: {:.0} %{}){}",
                mb(v.bytes_moved),
                100.0 * v.bandwidth_fraction,
                100.0 * v.best_bandwidth_fraction,
                match v.paired_bandwidth_fraction {
                    Some(f) => format!("; against the paired copies: {:.0} %", 100.0 * f),
                    None => String::new(),
                },
                match v.update_floor_s {
                    Some(f) => format!(
                        "; update floor {}, {:.0} % of its median",
                        ms2(f),
                        100.0 * f / v.median_s
                    ),
                    None => String::new(),
                }
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
    if !r.op_median_s.is_empty() {
        out += "time per step (medians):\n";
        for (what, s) in &r.op_median_s {
            out += &format!("  {:>7.2} ms  {what}\n", s * 1e3);
        }
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
        "op_s": r.op_median_s.iter().map(|&(k, s)| json!([k, s])).collect::<Vec<Value>>(),
        "cpu_s_per_step": r.cpu_s_per_step,
        "wait_s_per_step": r.wait_s_per_step,
        "peak_rss_mib": r.peak_rss_mib,
        "dtype": r.dtype.name(),
        "state_dtype": r.state_dtype.name(),
        "params_bytes": r.params_bytes,
        "state_bytes": r.state_bytes,
        "bytes_moved": r.bytes_moved,
        "bytes_terms": terms,
        "memcpy_gbps": r.memcpy_gbps,
        "bandwidth_fraction": r.bandwidth_fraction,
        "best_bandwidth_fraction": r.best_bandwidth_fraction,
        "paired_memcpy_gbps": r.paired_memcpy_gbps,
        "paired_bandwidth_fraction": r.paired_bandwidth_fraction,
        "copy_gbps": r.copy_gbps,
        "lazy_adam_elements": r.lazy_adam_elements,
        "lazy_adam_gelems": r.lazy_adam_gelems,
        "update_floor_s": r.update_floor_s,
        "flops": r.flops,
        "gflops": r.gflops,
        "sgemm_gflops": r.sgemm_gflops,
        "gflops_fraction": r.gflops_fraction,
        "workspace_bytes": r.workspace_bytes,
        "useful_flops": r.useful_flops,
        "useful_fraction": r.useful_fraction,
        "tile_sgemm_gflops": r.tile_sgemm_gflops,
        "reference_median_s": r.reference_median_s,
        "reference_step_s": r.reference_step_s,
        "versus_f32": r.versus_f32.as_ref().map(versus_json),
        "pytorch_s": r.workload.pytorch_s(),
        "speedup_vs_pytorch": r.speedup_vs_pytorch(),
        "loss": r.loss,
    })
}

/// [`BenchReport::versus_f32`] as a JSON object.
fn versus_json(v: &Versus) -> Value {
    json!({
        "median_s": v.median_s,
        "step_s": v.step_s,
        "block": v.block,
        "median_ratio": v.median_ratio,
        "pair_ratio": v.pair_ratio,
        "params_bytes": v.params_bytes,
        "state_bytes": v.state_bytes,
        "bytes_ratio": v.bytes_ratio,
        "bytes_moved": v.bytes_moved,
        "bandwidth_fraction": v.bandwidth_fraction,
        "best_bandwidth_fraction": v.best_bandwidth_fraction,
        "paired_memcpy_gbps": v.paired_memcpy_gbps,
        "paired_bandwidth_fraction": v.paired_bandwidth_fraction,
        "copy_gbps": v.copy_gbps,
        "update_floor_s": v.update_floor_s,
        "loss": v.loss,
    })
}

/// The options of a workload that `--sweep` would not honour, refused by
/// name rather than ignored.
fn refuse_with_sweep(args: &BenchArgs) -> CliResult<()> {
    let not = |what: &str, why: &str| -> CliResult<()> {
        Err(format!("{what} with --sweep: {why}").into())
    };
    for (flag, d) in [("--dtype", args.dtype), ("--state-dtype", args.state_dtype)] {
        if d != Dtype::F32 {
            return not(
                &format!("{flag} {d}"),
                "the sweep times the bigram model's step in f32 (the workloads time bf16 and \
                 f16, with --versus-f32 beside f32)",
            );
        }
    }
    if args.versus_f32 {
        return not(
            "--versus-f32",
            "it compares a workload's steps: give a workload instead",
        );
    }
    if args.reference {
        return not("--reference", "it times lmhead's step: give lmhead instead");
    }
    if args.paired_copy {
        return not(
            "--paired-copy",
            "it pairs a workload's steps with copies: give a workload instead",
        );
    }
    if args.scale != 1 {
        return not(
            "--scale",
            "it divides a workload's sizes; the sweep's are --sweep-v and --sweep-d",
        );
    }
    Ok(())
}

/// `bench --sweep`: the table, row by row as each is done, then the JSON
/// and the plot.
fn run_sweep(args: &BenchArgs) -> CliResult<ExitCode> {
    set_threads(args.threads)?;
    let defaults = SweepConfig::default();
    let cfg = SweepConfig {
        vocab_sizes: args.sweep_v.clone().unwrap_or(defaults.vocab_sizes),
        dims: args.sweep_d.clone().unwrap_or(defaults.dims),
        steps: args.steps.unwrap_or(3),
        ..SweepConfig::default()
    };
    println!(
        "bigram training step, batch {}, {} languages, {} threads; m: distinct contexts a step, GFLOP/s: the head's 6·m·V·D",
        cfg.batch,
        cfg.n_languages,
        rayon::current_num_threads()
    );
    println!(
        "{:>7} {:>4} {:>7} {:>10} {:>10} {:>9} {:>8} {:>7} {:>8} {:>7}",
        "V", "D", "m", "step", "tokens/s", "GFLOP/s", "sgemm", "of it", "copy", "of it"
    );
    let rows = sweep(&cfg, |r| {
        println!(
            "{:>7} {:>4} {:>7.0} {:>10} {:>10.0} {:>9.1} {:>8.1} {:>6.0}% {:>8.1} {:>6.1}%",
            r.vocab_size,
            r.dim,
            r.hidden_rows,
            ms(r.median_s),
            r.tokens_per_s,
            r.gflops,
            r.sgemm_gflops,
            100.0 * r.sgemm_fraction,
            r.memcpy_gbps,
            100.0 * r.copy_fraction
        );
    })?;
    if let Some(path) = &args.svg {
        plots::bench_sweep(path, &rows)?;
    }
    if args.json {
        let v: Vec<Value> = rows.iter().map(sweep_json).collect();
        println!("{}", serde_json::to_string(&v)?);
    }
    Ok(ExitCode::SUCCESS)
}

fn sweep_json(r: &SweepRow) -> Value {
    json!({
        "vocab_size": r.vocab_size,
        "dim": r.dim,
        "batch": r.batch,
        "split_rows": r.split_rows,
        "hidden_rows": r.hidden_rows,
        "step_s": r.step_s,
        "median_s": r.median_s,
        "tokens_per_s": r.tokens_per_s,
        "head_flops": r.head_flops,
        "gflops": r.gflops,
        "sgemm_gflops": r.sgemm_gflops,
        "sgemm_fraction": r.sgemm_fraction,
        "bytes": r.bytes,
        "memcpy_gbps": r.memcpy_gbps,
        "copy_fraction": r.copy_fraction,
    })
}
