//! The seed's flow with SplitVocabulary: load an index of (language, token)
//! pairs from `.npz`, `seed_from` the shared embedding table, train with the
//! gate's L1 penalty and the fusion penalty, then print the gates.
//!
//! The data is a small synthetic bigram corpus whose planted pairs have a
//! next-token distribution of their own; the index holds them and as many
//! decoys, and training should open the first and close the second.
//!
//! Run: `cargo run --release --example split_vocabulary`

use ndarray::Array1;
use splitgrad::app::synthetic::{SyntheticConfig, generate};
use splitgrad::io::save_index;
use splitgrad::layers::{
    SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary, SplitVocabularyConfig,
};
use splitgrad::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer, ParamGroups};
use splitgrad::state::Module;
use splitgrad::{Rng, Tape};

fn main() -> Result<(), splitgrad::Error> {
    let cfg = SyntheticConfig {
        vocab_size: 100,
        n_languages: 3,
        n_sequences: 512,
        sequence_len: 256,
        n_contested: 8,
        ..SyntheticConfig::default()
    };
    let data = generate(&cfg);
    let (v, l, d) = (cfg.vocab_size, cfg.n_languages, 32);

    // The index file, as `splitgrad select` or a user would write it.
    let path = std::env::temp_dir().join(format!("split-vocabulary-{}.npz", std::process::id()));
    save_index(&path, &data.index)?;

    let mut rng = Rng::new(1);
    let mut shared = SplitTokenEmbeddings::<f32>::new(&[("vocab", v)], &["vocab"], d)?;
    shared.reset_parameters(&mut rng);
    let mut head = SplitLanguageModellingHead::<f32>::new(&[("vocab", v)], &["vocab"], d)?;
    head.reset_parameters(&mut rng);
    let config = SplitVocabularyConfig {
        vocab_size: v,
        dim: d,
        n_languages: l,
        gate_init: 0.0,
    };
    let mut split = SplitVocabulary::<f32>::from_npz(&path, &config)?;
    std::fs::remove_file(&path).ok();
    split.seed_from(shared.split("vocab").expect("the one split"))?;

    let (gate_weight, fusion_weight) = (0.005f32, 0.001f32);
    // Lazy Adam for the tables, Adam for the gates and the head, by name.
    let mut opt = ParamGroups::new()
        .group(
            "tables",
            |name| name.starts_with("token_embedding.") || name == "split_vocabulary.rows",
            LazyAdam::new(LazyAdamConfig {
                lr: 1e-2,
                ..LazyAdamConfig::default()
            })?,
        )
        .group(
            "dense",
            |_| true,
            Adam::new(AdamConfig {
                lr: 1e-2,
                ..AdamConfig::default()
            })?,
        );
    let corpus = &data.corpus;
    let bigrams: Vec<usize> = corpus.bigrams().map(|(i, _)| i).collect();
    let mut batch_rng = Rng::new(2);
    for step in 0..600 {
        let picks: Vec<usize> = (0..1024)
            .map(|_| bigrams[batch_rng.below(bigrams.len() as u64) as usize])
            .collect();
        let tokens: Vec<i64> = picks
            .iter()
            .map(|&i| corpus.token_ids.get(i) as i64)
            .collect();
        let langs: Vec<i64> = picks
            .iter()
            .map(|&i| corpus.language_ids.get(i) as i64)
            .collect();
        let next = Array1::from_iter(picks.iter().map(|&i| corpus.token_ids.get(i + 1) as i64));
        let (loss, grads) = {
            let mut tape = Tape::new();
            let e = shared.forward(&mut tape, &tokens)?;
            let h = split.forward(&mut tape, &tokens, &langs, e, true)?;
            let ce = head.forward(&mut tape, h, &next)?;
            let ce = tape.mean(ce);
            let penalty = split.penalty_var(&mut tape);
            let fusion = split.fusion_penalty_var(&mut tape);
            let p = tape.scale(penalty, gate_weight);
            let f = tape.scale(fusion, fusion_weight);
            let total = tape.add(ce, p);
            let total = tape.add(total, f);
            (tape.scalar(total), tape.backward(total))
        };
        let mut params = shared.parameters_mut();
        params.extend(split.parameters_mut());
        params.extend(head.parameters_mut());
        opt.step(params, &grads)?;
        if step % 100 == 0 {
            println!(
                "step {step:>3}  loss {loss:.4}  penalty {:.4}  fusion {:.4}",
                split.penalty(),
                split.fusion_penalty()
            );
        }
    }

    println!("gates (σ(gate_logit)), most open first:");
    let gate = split.gate();
    let index = split.index();
    let mut order: Vec<usize> = (0..gate.len()).collect();
    order.sort_by(|&a, &b| gate[b].total_cmp(&gate[a]));
    for i in order {
        let pair = (index.language_index[i], index.token_index[i]);
        let planted = if data.contested.contains(&pair) {
            "planted"
        } else {
            "decoy"
        };
        println!(
            "  language {}  token {:>3}  gate {:.3}  {planted}",
            pair.0, pair.1, gate[i]
        );
    }
    Ok(())
}
