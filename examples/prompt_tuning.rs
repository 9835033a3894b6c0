//! Prompt tuning with SplitTokenEmbeddings, the d9d documentation's case:
//! a pretrained vocabulary `orig` of 151936 tokens stays frozen and 16 new
//! `prompt` tokens (global ids 151936..151952) are the only weights that
//! learn. The embeddings feed a frozen LM head (same two splits); the loss
//! is the mean next-token cross-entropy of a few sequences that start with
//! the prompt.
//!
//! Run: `cargo run --release --example prompt_tuning`

use ndarray::Array2;
use splitgrad::layers::{SplitLanguageModellingHead, SplitTokenEmbeddings};
use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
use splitgrad::{Rng, Tape};

fn main() -> Result<(), splitgrad::Error> {
    // Large per-step buffers stay in the heap instead of being mapped afresh.
    splitgrad::keep_large_buffers();
    const ORIG: usize = 151_936;
    const PROMPT: usize = 16;
    // d9d's models use 1024 and more; 64 keeps the example light on memory
    // (the orig table is 151936 × 64 f32 = 39 MB).
    const HIDDEN: usize = 64;
    let splits = [("orig", ORIG), ("prompt", PROMPT)];
    let order = ["orig", "prompt"];
    let mut rng = Rng::new(7);
    let mut embeddings = SplitTokenEmbeddings::<f32>::new(&splits, &order, HIDDEN)?;
    embeddings.reset_parameters(&mut rng);
    embeddings.set_trainable("orig", false)?;
    let mut head = SplitLanguageModellingHead::<f32>::new(&splits, &order, HIDDEN)?;
    head.reset_parameters(&mut rng);
    for name in order {
        head.set_trainable(name, false)?;
    }

    // 4 sequences: the 16 prompt tokens, then 48 ordinary tokens; each
    // position predicts the next token.
    let (batch, len) = (4, PROMPT + 48);
    let mut ids = Array2::<i64>::zeros((batch, len));
    for b in 0..batch {
        for p in 0..PROMPT {
            ids[[b, p]] = (ORIG + p) as i64;
        }
        for t in PROMPT..len {
            ids[[b, t]] = rng.below(ORIG as u64) as i64;
        }
    }
    let inputs = ids.slice(ndarray::s![.., ..len - 1]).to_owned().into_dyn();
    let labels = ids.slice(ndarray::s![.., 1..]).to_owned().into_dyn();

    let orig_before = embeddings.split("orig").expect("split").value().clone();
    let prompt_before = embeddings.split("prompt").expect("split").value().clone();
    let mut adam = LazyAdam::new(LazyAdamConfig {
        lr: 1e-2,
        ..LazyAdamConfig::default()
    })?;
    for step in 0..30 {
        let (loss, grads) = {
            let mut tape = Tape::new();
            let hidden = embeddings.forward(&mut tape, inputs.view())?;
            let per_token = head.forward(&mut tape, hidden, labels.view())?;
            let loss = tape.mean(per_token);
            (tape.scalar(loss), tape.backward(loss))
        };
        // Only the prompt split has a gradient: orig is frozen.
        assert!(
            grads
                .param(embeddings.split("orig").expect("split"))
                .is_none()
        );
        for p in embeddings.parameters_mut() {
            if let Some(g) = grads.by_id(p.id()) {
                adam.update(p, g)?;
            }
        }
        if step % 10 == 0 || step == 29 {
            println!("step {step:>2}  loss {loss:.4}");
        }
    }
    let orig_after = embeddings.split("orig").expect("split").value();
    let prompt_after = embeddings.split("prompt").expect("split").value();
    assert_eq!(&orig_before, orig_after, "a frozen split never moves");
    let moved: f32 = (prompt_after - &prompt_before)
        .iter()
        .map(|d| d * d)
        .sum::<f32>()
        .sqrt();
    println!("orig unchanged; the prompt rows moved by {moved:.4} (L2 over all 16 rows)");
    Ok(())
}
