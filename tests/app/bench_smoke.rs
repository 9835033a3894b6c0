//! Every workload of `splitgrad bench` runs at a small scale and reports
//! finite figures. No timing is asserted: the machine may be busy.

use splitgrad::app::bench::{BenchConfig, Workload, run};

#[test]
fn every_workload_runs_and_reports_finite_figures() {
    for w in Workload::ALL {
        let cfg = BenchConfig {
            steps: 3,
            threads: Some(3),
            scale: 64,
            paired_copy: true,
            ..BenchConfig::new(w)
        };
        let r = run(&cfg).unwrap_or_else(|e| panic!("{w}: {e}"));
        assert_eq!(r.workload, w);
        assert_eq!((r.steps, r.threads, r.scale), (3, 3, 64));
        assert_eq!(r.step_s.len(), 3, "{w}");
        assert!(r.step_s.iter().all(|s| s.is_finite() && *s > 0.0), "{w}");
        assert!(r.min_s <= r.median_s, "{w}");
        assert!(
            r.phase_median_s.iter().all(|s| s.is_finite() && *s >= 0.0),
            "{w}"
        );
        assert!(r.loss.is_finite(), "{w}: loss {}", r.loss);
        // The tape-free steps are timed operation by operation.
        let ops: Vec<&str> = r.op_median_s.iter().map(|o| o.0).collect();
        match w {
            Workload::SplitVocab => {
                assert_eq!(ops.len(), 8, "{ops:?}");
                assert!(
                    ops.contains(&"lazy Adam by blocks, split rows, with the fusion penalty"),
                    "{ops:?}"
                );
            }
            Workload::EmbedPrompt | Workload::EmbedFull => {
                assert_eq!(ops.len(), 3, "{ops:?}");
                assert_eq!(ops[0], "gather", "{ops:?}");
            }
            Workload::LmHead => assert!(ops.is_empty(), "{w}: {ops:?}"),
        }
        assert!(
            r.op_median_s.iter().all(|o| o.1.is_finite() && o.1 >= 0.0),
            "{w}"
        );
        for x in [r.cpu_s_per_step, r.wait_s_per_step] {
            assert!(x.is_none_or(|x| x.is_finite() && x >= 0.0), "{w}");
        }
        assert!(r.bytes_moved > 0, "{w}");
        assert_eq!(
            r.bytes_moved,
            r.bytes_terms.iter().map(|t| t.1).sum::<u64>()
        );
        assert!(r.memcpy_gbps.is_finite() && r.memcpy_gbps > 0.0, "{w}");
        assert!(
            r.bandwidth_fraction.is_finite() && r.bandwidth_fraction > 0.0,
            "{w}"
        );
        // The fastest step is at least as fast as the median one.
        assert!(
            r.best_bandwidth_fraction >= r.bandwidth_fraction,
            "{w}: {} < {}",
            r.best_bandwidth_fraction,
            r.bandwidth_fraction
        );
        // A copy of the step's size after each step, and the pairs' median.
        assert_eq!(r.copy_gbps.len(), r.step_s.len(), "{w}");
        let rate = r.paired_memcpy_gbps.expect("paired copies");
        assert!(rate.is_finite() && rate > 0.0, "{w}");
        let fraction = r.paired_bandwidth_fraction.expect("paired copies");
        let (lo, hi) = r
            .step_s
            .iter()
            .zip(&r.copy_gbps)
            .map(|(s, c)| r.bytes_moved as f64 / s / (c * 1e9))
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), f| {
                (lo.min(f), hi.max(f))
            });
        assert!(
            (lo..=hi).contains(&fraction),
            "{w}: {fraction} outside the pairs' {lo}..={hi}"
        );
        assert!(r.params_bytes > 0, "{w}");
        if cfg!(target_os = "linux") {
            let rss = r.peak_rss_mib.expect("VmHWM on Linux");
            // The peak covers at least the parameters.
            assert!(
                rss * (1 << 20) as f64 >= r.params_bytes as f64,
                "{w}: {rss} MiB"
            );
        }
        let head = w == Workload::LmHead;
        for x in [r.flops, r.gflops, r.sgemm_gflops, r.gflops_fraction] {
            assert_eq!(x.is_some(), head, "{w}");
            assert!(x.is_none_or(|x| x.is_finite() && x > 0.0), "{w}");
        }
        assert_eq!(r.workspace_bytes.is_some(), head, "{w}");
    }
}

#[test]
fn names_round_trip() {
    for w in Workload::ALL {
        assert_eq!(w.name().parse::<Workload>().unwrap(), w);
    }
    let e = "lm_head".parse::<Workload>().unwrap_err();
    assert!(e.to_string().contains("unknown workload `lm_head`"), "{e}");
}
