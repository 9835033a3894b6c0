//! Prompt tuning with SplitTokenEmbeddings, the d9d documentation's case:
//! a pretrained vocabulary `orig` of 151936 tokens stays frozen and 16 new
//! `prompt` tokens (global ids 151936..151952) are the only weights that
//! learn. The embeddings feed a frozen LM head (same two splits); the loss
//! is the mean next-token cross-entropy of a few sequences that start with
//! the prompt.
//!
//! The loop trains 20 steps and writes a checkpoint (the embeddings' and
//! the head's state dicts, the optimiser's state and the step) with one
//! call; then a fresh process-like restart builds the layers again, loads
//! the checkpoint with one call and trains 10 more steps; the result is
//! the same, bit for bit, as 30 steps without a stop. The checkpoint is a
//! safetensors file under d9d's names (`token_embedding.orig.weight`,
//! `token_embedding.prompt.weight`, `lm_head.<split>.weight`), so d9d's
//! modules load it by name.
//!
//! Run: `cargo run --release --example prompt_tuning [-- KEEP.safetensors]`
//! (with a path, the checkpoint is kept there). In PyTorch, d9d's module
//! loads it by name:
//!
//! ```text
//! from safetensors.torch import load_file
//! from d9d.module.block.embedding import SplitTokenEmbeddings
//! emb = SplitTokenEmbeddings({"orig": 151936, "prompt": 16}, ["orig", "prompt"], 64)
//! state = load_file("KEEP.safetensors")
//! emb.load_state_dict({k: v for k, v in state.items() if k.startswith("token_embedding.")})
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use ndarray::{Array2, ArrayD};
use splitgrad::checkpoint::{load_state, save_state};
use splitgrad::layers::{SplitLanguageModellingHead, SplitTokenEmbeddings};
use splitgrad::optim::{LazyAdam, LazyAdamConfig};
use splitgrad::prelude::*;
use splitgrad::tape::Pool;

const ORIG: usize = 151_936;
const PROMPT: usize = 16;
// d9d's models use 1024 and more; 64 keeps the example light on memory
// (the orig table is 151936 × 64 f32 = 39 MB).
const HIDDEN: usize = 64;

/// The layers and the optimiser of the run, freshly built.
struct Run {
    embeddings: SplitTokenEmbeddings<f32>,
    head: SplitLanguageModellingHead<f32>,
    adam: LazyAdam<f32>,
    step: u64,
    pool: Pool<f32>,
}

impl Run {
    fn new() -> Result<Self> {
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
        let adam = LazyAdam::new(LazyAdamConfig {
            lr: 1e-2,
            ..LazyAdamConfig::default()
        })?;
        Ok(Run {
            embeddings,
            head,
            adam,
            step: 0,
            pool: Pool::new(),
        })
    }

    /// One step on (inputs, labels); returns the loss.
    fn step(&mut self, inputs: &ArrayD<i64>, labels: &ArrayD<i64>) -> Result<f32> {
        let (loss, grads) = {
            let mut tape = Tape::with_pool(&self.pool);
            let hidden = self.embeddings.forward(&mut tape, inputs)?;
            let per_token = self.head.forward(&mut tape, hidden, labels)?;
            let loss = tape.mean(per_token);
            (tape.scalar(loss), tape.backward(loss))
        };
        // Only the prompt split has a gradient: orig is frozen.
        let orig = self.embeddings.split("orig").expect("split");
        assert!(grads.param(orig).is_none());
        self.adam.step(self.embeddings.parameters_mut(), &grads)?;
        self.step += 1;
        Ok(loss)
    }

    /// Saves everything a resume needs, in one call.
    fn save(&self, path: &Path) -> Result<()> {
        let meta = BTreeMap::from([("step".to_string(), self.step.to_string())]);
        save_state(
            path,
            &[&self.embeddings, &self.head],
            Some(&self.adam),
            &[],
            &meta,
        )
    }

    /// Loads everything back, in one call: every tensor is checked (names,
    /// dtypes, shapes, finiteness) before anything changes.
    fn load(&mut self, path: &Path) -> Result<()> {
        let (meta, _) = load_state(
            path,
            &mut [&mut self.embeddings, &mut self.head],
            Some(&mut self.adam),
        )?;
        self.step = meta["step"].parse().expect("the step is a number");
        Ok(())
    }
}

fn main() -> Result<()> {
    // 4 sequences: the 16 prompt tokens, then 48 ordinary tokens; each
    // position predicts the next token.
    let mut rng = Rng::new(11);
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
    let keep = std::env::args().nth(1).map(std::path::PathBuf::from);
    let dir = std::env::temp_dir().join(format!("splitgrad-prompt-tuning-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = keep
        .clone()
        .unwrap_or_else(|| dir.join("prompt.safetensors"));

    // 30 steps without a stop: the reference.
    let mut straight = Run::new()?;
    let orig_before = straight
        .embeddings
        .split("orig")
        .expect("split")
        .value()
        .clone();
    for _ in 0..30 {
        straight.step(&inputs, &labels)?;
    }

    // 20 steps, a checkpoint, a fresh start from it, 10 more steps.
    let mut first = Run::new()?;
    for step in 0..20 {
        let loss = first.step(&inputs, &labels)?;
        if step % 10 == 0 {
            println!("step {step:>2}  loss {loss:.4}");
        }
    }
    first.save(&path)?;
    println!(
        "saved {} ({} tensors: the two state dicts and the optimiser's state)",
        path.display(),
        splitgrad::checkpoint::Checkpoint::open(&path)?
            .names()
            .len()
    );
    drop(first);
    let mut resumed = Run::new()?;
    resumed.load(&path)?;
    println!("resumed at step {}", resumed.step);
    for step in resumed.step..30 {
        let loss = resumed.step(&inputs, &labels)?;
        if step % 10 == 0 || step == 29 {
            println!("step {step:>2}  loss {loss:.4}");
        }
    }

    let same = straight.embeddings.state_dict() == resumed.embeddings.state_dict()
        && straight.adam.state() == resumed.adam.state();
    assert!(same, "a resumed run ends where an uninterrupted one does");
    let orig_after = resumed.embeddings.split("orig").expect("split").value();
    assert_eq!(&orig_before, orig_after, "a frozen split never moves");
    let prompt = resumed.embeddings.split("prompt").expect("split").value();
    let start = Run::new()?;
    let moved: f32 = (prompt - start.embeddings.split("prompt").expect("split").value())
        .iter()
        .map(|d| d * d)
        .sum::<f32>()
        .sqrt();
    println!(
        "orig unchanged; the prompt rows moved by {moved:.4} (L2 over all 16 rows); \
         the resumed run equals the uninterrupted one bit for bit"
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
