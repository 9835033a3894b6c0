//! Unit tests of `bench::run`: the medians, each workload's report and
//! the alternation with f32 and with the reference kernel.

use super::*;

#[test]
fn median_of_odd_and_even_counts() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
}

#[test]
fn lmhead_alternates_with_its_reference() {
    let cfg = BenchConfig {
        steps: 3,
        scale: 64,
        reference: true,
        ..BenchConfig::new(Workload::LmHead)
    };
    let r = run(&cfg).unwrap();
    assert_eq!(r.reference_step_s.len(), 3);
    assert!(
        r.reference_median_s
            .is_some_and(|m| m.is_finite() && m > 0.0)
    );
    let (useful, all) = (r.useful_flops.unwrap(), r.flops.unwrap());
    assert!(useful > 0.0 && useful < all, "{useful} vs {all}");
    assert!(r.useful_fraction.is_some_and(f64::is_finite));
    // Only the head has a second kernel to compare with.
    let e = run(&BenchConfig {
        steps: 1,
        scale: 256,
        reference: true,
        ..BenchConfig::new(Workload::EmbedFull)
    })
    .unwrap();
    assert!(e.reference_step_s.is_empty() && e.reference_median_s.is_none());
    assert!(e.useful_flops.is_none() && e.tile_sgemm_gflops.is_none());
}

#[test]
fn half_precision_workloads_keep_half_the_bytes() {
    for w in [
        Workload::EmbedPrompt,
        Workload::EmbedFull,
        Workload::SplitVocab,
        Workload::LmHead,
    ] {
        let c = BenchConfig {
            steps: 2,
            scale: 64,
            ..BenchConfig::new(w)
        };
        let f32_run = run(&c).unwrap();
        for (dtype, state) in [(Dtype::BF16, Dtype::BF16), (Dtype::F16, Dtype::F32)] {
            let r = run(&BenchConfig {
                dtype,
                state_dtype: state,
                ..c
            })
            .unwrap();
            assert_eq!((r.dtype, r.state_dtype), (dtype, state));
            assert_eq!(2 * r.params_bytes, f32_run.params_bytes, "{w} {dtype}");
            // Step counts are 8 bytes each, whatever the dtype.
            let arrays = |r: &BenchReport| r.state_bytes - r.state_bytes % 8;
            assert!(r.state_bytes > 0 && f32_run.state_bytes > 0);
            if state == Dtype::BF16 {
                assert!(arrays(&r) * 2 <= arrays(&f32_run) + 64, "{w}");
            }
            if state == Dtype::BF16 && w != Workload::LmHead {
                assert!(r.bytes_moved < f32_run.bytes_moved, "{w}");
            }
            assert!(r.loss.is_finite());
            // The same loss to the rounding of the tables.
            let rel = (r.loss - f32_run.loss).abs() / f32_run.loss.abs().max(1.0);
            assert!(rel < 0.05, "{w} {dtype}: {} vs {}", r.loss, f32_run.loss);
        }
    }
    let c = BenchConfig {
        state_dtype: Dtype::F16,
        ..BenchConfig::new(Workload::EmbedFull)
    };
    assert!(run(&c).unwrap_err().to_string().contains("bf16"));
}

/// The update floor counts the elements lazy Adam moves, as the bytes
/// model's lazy Adam terms do (f32: 28 bytes an element, the split
/// rows' term less the gradient it does not read), at the rate
/// measured; `lmhead`, updated by dense Adam, has none.
#[test]
fn the_update_floor_counts_lazy_adams_elements() {
    let term = |r: &BenchReport, what: &str| {
        r.bytes_terms
            .iter()
            .find(|t| t.0.starts_with(what))
            .unwrap_or_else(|| panic!("{what}"))
            .1
    };
    for w in Workload::ALL {
        let r = run(&BenchConfig {
            steps: 1,
            scale: 64,
            versus_f32: true,
            dtype: Dtype::BF16,
            state_dtype: Dtype::BF16,
            ..BenchConfig::new(w)
        })
        .unwrap();
        let v = r.versus_f32.as_ref().unwrap();
        let f32_run = run(&BenchConfig {
            steps: 1,
            scale: 64,
            ..BenchConfig::new(w)
        })
        .unwrap();
        let expected = match w {
            Workload::LmHead => None,
            Workload::EmbedPrompt | Workload::EmbedFull => {
                Some(term(&f32_run, "lazy Adam: read p, m, v, g") / 28)
            }
            Workload::SplitVocab => {
                let d = 512 / 64;
                Some(term(&f32_run, "lazy Adam, shared table") / 28 + (20000 / 64) * d)
            }
        };
        assert_eq!(r.lazy_adam_elements, expected, "{w}");
        assert_eq!(f32_run.lazy_adam_elements, expected, "{w}");
        match (expected, r.lazy_adam_gelems, r.update_floor_s) {
            (None, None, None) => {
                assert!(v.update_floor_s.is_none() && f32_run.update_floor_s.is_none())
            }
            (Some(n), Some(rate), Some(floor)) => {
                assert!(n > 0 && rate.is_finite() && rate > 0.0, "{w}: {rate}");
                assert_eq!(floor, n as f64 / rate / 1e9, "{w}");
                assert!(v.update_floor_s.is_some_and(|f| f.is_finite() && f > 0.0));
                assert!(f32_run.update_floor_s.is_some() && f32_run.versus_f32.is_none());
            }
            other => panic!("{w}: {other:?}"),
        }
    }
}

/// Versus f32: the f32 workload beside the run takes its own steps,
/// neither disturbing the other (each ends on the loss it reaches
/// alone, bit for bit), and the ratios are of the two.
#[test]
fn versus_f32_times_the_f32_workload_beside_the_run() {
    for w in Workload::ALL {
        let c = BenchConfig {
            steps: 3,
            scale: 64,
            ..BenchConfig::new(w)
        };
        let f32_alone = run(&c).unwrap();
        let half = BenchConfig {
            dtype: Dtype::BF16,
            state_dtype: Dtype::BF16,
            ..c
        };
        let half_alone = run(&half).unwrap();
        // Step by step (the default), in blocks of 2 (the last block
        // shorter) and of 5 (one block): each side takes its 3 steps.
        for block in [VERSUS_BLOCK, 2, 5] {
            let r = run(&BenchConfig {
                versus_f32: true,
                versus_block: block,
                ..half
            })
            .unwrap();
            let v = r.versus_f32.as_ref().expect("the f32 steps");
            assert_eq!(
                (r.step_s.len(), v.step_s.len(), v.block),
                (3, 3, block),
                "{w}"
            );
            assert_eq!(v.loss.to_bits(), f32_alone.loss.to_bits(), "{w}: f32");
            assert_eq!(r.loss.to_bits(), half_alone.loss.to_bits(), "{w}: bf16");
        }
        // With paired copies (which change no loss either).
        let r = run(&BenchConfig {
            versus_f32: true,
            paired_copy: true,
            ..half
        })
        .unwrap();
        let v = r.versus_f32.as_ref().expect("the f32 steps");
        assert_eq!(v.loss.to_bits(), f32_alone.loss.to_bits(), "{w}: f32");
        assert_eq!(r.loss.to_bits(), half_alone.loss.to_bits(), "{w}: bf16");
        assert_eq!(
            (v.params_bytes, v.state_bytes, v.bytes_moved),
            (
                f32_alone.params_bytes,
                f32_alone.state_bytes,
                f32_alone.bytes_moved
            ),
            "{w}"
        );
        assert_eq!(v.median_s, median(&v.step_s));
        assert_eq!(v.median_ratio, r.median_s / v.median_s);
        let pairs: Vec<f64> = r.step_s.iter().zip(&v.step_s).map(|(a, b)| a / b).collect();
        assert_eq!(v.pair_ratio, median(&pairs));
        // Each side's steps against the copies paired with them.
        for (moved, steps, copies, fraction, rate) in [
            (
                r.bytes_moved,
                &r.step_s,
                &r.copy_gbps,
                r.paired_bandwidth_fraction,
                r.paired_memcpy_gbps,
            ),
            (
                v.bytes_moved,
                &v.step_s,
                &v.copy_gbps,
                v.paired_bandwidth_fraction,
                v.paired_memcpy_gbps,
            ),
        ] {
            assert_eq!(copies.len(), steps.len(), "{w}");
            assert!(copies.iter().all(|c| c.is_finite() && *c > 0.0), "{w}");
            assert_eq!(rate, Some(median(copies)), "{w}");
            let of: Vec<f64> = steps
                .iter()
                .zip(copies)
                .map(|(s, c)| moved as f64 / s / (c * 1e9))
                .collect();
            assert_eq!(fraction, Some(median(&of)), "{w}");
        }
        let bytes = (r.params_bytes + r.state_bytes) as f64;
        assert_eq!(
            v.bytes_ratio,
            bytes / (v.params_bytes + v.state_bytes) as f64
        );
        assert!(v.bytes_ratio < 0.55, "{w}: {}", v.bytes_ratio);
        assert!(v.bandwidth_fraction > 0.0);
        assert!(run(&c).unwrap().versus_f32.is_none());
    }
}

#[test]
fn bad_configs_are_errors() {
    let c = BenchConfig::new(Workload::EmbedFull);
    for bad in [
        BenchConfig { steps: 0, ..c },
        BenchConfig { scale: 0, ..c },
        BenchConfig {
            threads: Some(0),
            ..c
        },
    ] {
        assert!(run(&bad).is_err(), "{bad:?}");
    }
    // Versus f32 needs something in half precision, and no reference.
    let e = run(&BenchConfig {
        versus_f32: true,
        ..c
    })
    .unwrap_err();
    assert!(e.to_string().contains("everything in f32 already"), "{e}");
    let e = run(&BenchConfig {
        versus_f32: true,
        reference: true,
        dtype: Dtype::BF16,
        ..BenchConfig::new(Workload::LmHead)
    })
    .unwrap_err();
    assert!(e.to_string().contains("one of them"), "{e}");
    let e = run(&BenchConfig {
        versus_f32: true,
        versus_block: 0,
        dtype: Dtype::BF16,
        ..c
    })
    .unwrap_err();
    assert!(e.to_string().contains("at least 1 step"), "{e}");
}
