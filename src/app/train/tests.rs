//! The trainer's unit tests.

use super::*;
use crate::app::model::ModelConfig;
use crate::io::SplitIndex;
use crate::param::Dtype;

#[test]
fn joined_strings_round_trip_any_text() {
    let v: Vec<String> = ["", "\u{1f}", "\\", "\\s", "a\u{1f}b\\", " the", "\n"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(split_joined(&join(&v)), v);
}

/// Found by the `checkpoint_loader` fuzz target: with weights that are
/// finite but huge, one step overflowed a second moment to +∞ while
/// every parameter stayed finite, and `save` wrote a checkpoint that
/// `load` rejects. The run now stops, naming the step and the state.
#[test]
fn an_overflowing_moment_stops_the_run_before_a_checkpoint() {
    let config = ModelConfig::new(4, 1, 2);
    let index = SplitIndex::new(vec![0], vec![1]);
    let mut model = BigramModel::<f32>::new(config, index).unwrap();
    model.reset_parameters(&mut Rng::new(0)).unwrap();
    model.parameters_mut()[3].value_mut().fill(1e30);
    let corpus = Corpus::new(vec![0, 1, 2, 3, 0, 1], vec![0; 6]);
    let train = TrainConfig {
        steps: 2,
        batch: 4,
        lr: 1e-2,
        gate_penalty: 0.0,
        fusion_penalty: 0.0,
        use_gate: true,
        seed: 0,
        precision: Precision::default(),
    };
    let mut trainer = Trainer::new(model, corpus, train).unwrap();
    trainer.step().unwrap();
    let path = std::env::temp_dir().join(format!(
        "splitgrad-train-unit-{}.safetensors",
        std::process::id()
    ));
    let e = trainer.save(&path).unwrap_err();
    match e.kind() {
        ErrorKind::Diverged { step, message } => {
            assert_eq!(*step, 0);
            assert!(
                message.starts_with("optimiser state `optimizer."),
                "{message}"
            );
            assert!(message.contains(".exp_avg_sq` has inf"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!path.exists());
}

/// A trainer keeping its parameters and moments in bf16 saves them as
/// BF16 and, loaded into a fresh trainer, continues bit for bit; one
/// of another precision refuses the checkpoint, naming both values.
#[test]
fn a_half_precision_trainer_resumes_exactly() {
    let make = |precision: Precision| {
        let config = ModelConfig::new(6, 2, 4);
        let index = SplitIndex::new(vec![0, 1], vec![1, 2]);
        let mut model = BigramModel::<f32>::new(config, index).unwrap();
        model.reset_parameters(&mut Rng::new(0)).unwrap();
        let corpus = Corpus::new(
            vec![0, 1, 2, 3, 4, 5, 1, 2, 0],
            vec![0, 0, 1, 1, 0, 1, 1, 0, 0],
        );
        let train = TrainConfig {
            steps: 6,
            batch: 16,
            precision,
            ..TrainConfig::default()
        };
        Trainer::new(model, corpus, train).unwrap()
    };
    let half = Precision {
        dtype: Dtype::BF16,
        state_dtype: Dtype::BF16,
        rounding: RoundingMode::Stochastic,
    };
    let mut whole = make(half);
    assert!(
        whole
            .model()
            .parameters()
            .iter()
            .all(|p| p.dtype() == Dtype::BF16)
    );
    assert_eq!(
        2 * whole.params_bytes(),
        make(Precision::default()).params_bytes()
    );
    for _ in 0..3 {
        whole.step().unwrap();
    }
    let path = std::env::temp_dir().join(format!(
        "splitgrad-train-half-{}.safetensors",
        std::process::id()
    ));
    whole.save(&path).unwrap();
    let mut resumed = make(half);
    resumed.load(&path).unwrap();
    let other = Precision {
        rounding: RoundingMode::Nearest,
        ..half
    };
    let e = make(other).load(&path).unwrap_err().to_string();
    assert!(
        e.contains("written with rounding = stochastic, this run has rounding = nearest"),
        "{e}"
    );
    let _ = std::fs::remove_file(&path);
    for _ in 3..6 {
        whole.step().unwrap();
        resumed.step().unwrap();
    }
    for (a, b) in whole
        .model()
        .parameters()
        .iter()
        .zip(resumed.model().parameters())
    {
        assert_eq!(a.stored(), b.stored(), "{}", a.name());
    }
    assert_eq!(
        whole.optimizer.state_dict().iter().count(),
        resumed.optimizer.state_dict().iter().count()
    );
    for ((na, ta), (nb, tb)) in whole
        .optimizer
        .state_dict()
        .iter()
        .zip(resumed.optimizer.state_dict().iter())
    {
        assert_eq!((na, ta), (nb, tb));
    }
}

/// The batches drawn by bigram number equal those drawn from the list
/// of every bigram (as the trainer kept before), for corpora with
/// sequences of one token among them.
#[test]
fn batches_by_bigram_number_equal_batches_from_the_list() {
    let mut rng = Rng::new(3);
    for case in 0..10u64 {
        let n = 50 + rng.below(500) as usize;
        let tokens: Vec<u32> = (0..n).map(|_| rng.below(9) as u32).collect();
        let langs: Vec<u32> = (0..n).map(|_| rng.below(2) as u32).collect();
        let mut corpus = Corpus::new(tokens, langs);
        corpus.sequence_starts = (0..n).filter(|&p| p == 0 || rng.below(4) == 0).collect();
        let list: Vec<[u32; 3]> = corpus
            .bigrams()
            .map(|(i, j)| {
                [
                    corpus.token_ids.get(i),
                    corpus.language_ids.get(i),
                    corpus.token_ids.get(j),
                ]
            })
            .collect();
        let config = ModelConfig::new(9, 2, 2);
        let model = BigramModel::<f32>::new(config, SplitIndex::new(vec![0], vec![1])).unwrap();
        let train = TrainConfig {
            steps: 3,
            batch: 64,
            lr: 1e-2,
            gate_penalty: 0.0,
            fusion_penalty: 0.0,
            use_gate: true,
            seed: case,
            precision: Precision::default(),
        };
        let trainer = Trainer::new(model, corpus, train).unwrap();
        for step in 0..3 {
            let b = trainer.batch_at(step);
            let mut r = Rng::new(case ^ 0x6261_7463_6865_7321).fork(step);
            for k in 0..64 {
                let [t, l, y] = list[r.below(list.len() as u64) as usize];
                let got = (b.tokens[k], b.languages[k], b.targets[k]);
                assert_eq!(
                    got,
                    (t as i64, l as i64, y as i64),
                    "case {case} step {step} draw {k}"
                );
            }
        }
    }
}
