//! Every vector path gives the same bits end to end: the embedding
//! workloads of `splitgrad bench` (gathers, the gated mix, the fusion
//! penalty, coalescing, the lazy Adam and Adam updates, stochastic
//! rounding) run under `SPLITGRAD_SIMD=baseline`, `=avx2` and the CPU's
//! widest path, and their losses after a few steps agree to the bit. A
//! path the CPU lacks falls back to a narrower one, so the test holds on
//! any machine (and checks the most where AVX-512 is there).

use std::process::Command;

use crate::common::cli::BIN;

/// The loss `bench` reports after its steps, as the JSON's last line
/// prints it, under `SPLITGRAD_SIMD=simd` (`None`: unset), its sizes
/// divided by `scale`.
fn loss(simd: Option<&str>, args: &[&str], scale: &str) -> String {
    let mut cmd = Command::new(BIN);
    cmd.args(["bench"]).args(args).args([
        "--steps",
        "3",
        "--scale",
        scale,
        "--threads",
        "2",
        "--json",
    ]);
    match simd {
        Some(s) => cmd.env("SPLITGRAD_SIMD", s),
        None => cmd.env_remove("SPLITGRAD_SIMD"),
    };
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{simd:?} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    json["loss"].to_string()
}

#[test]
fn every_vector_path_gives_the_embedding_workloads_losses_to_the_bit() {
    // Scale 8: widths 64 and 128. Scales 7 and 9: splitvocab's rows 73
    // wide and embed_prompt's 113, so that every other row starts at an
    // odd index (bf16's random words, one a pair of elements, then
    // straddle a row's first pair).
    let runs: [(&[&str], &str); 7] = [
        (&["embed_full", "--dtype", "f32"], "8"),
        (
            &["embed_full", "--dtype", "bf16", "--state-dtype", "bf16"],
            "8",
        ),
        (&["embed_prompt", "--dtype", "f16"], "8"),
        (&["splitvocab", "--dtype", "f32"], "8"),
        (
            &["splitvocab", "--dtype", "bf16", "--state-dtype", "bf16"],
            "8",
        ),
        (
            &["splitvocab", "--dtype", "bf16", "--state-dtype", "bf16"],
            "7",
        ),
        (&["embed_prompt", "--dtype", "bf16"], "9"),
    ];
    for (args, scale) in runs {
        let widest = loss(None, args, scale);
        for simd in ["baseline", "avx2"] {
            assert_eq!(
                loss(Some(simd), args, scale),
                widest,
                "{simd} {args:?} scale {scale}"
            );
        }
    }
}
