//! Prompt tuning at the size of d9d's documentation, in bf16: a frozen
//! vocabulary `orig` of 151,936 tokens of width 2,048 (Qwen's) and 16 new
//! `prompt` tokens, every table kept in bf16 from the start, the math in
//! f32, lazy Adam with its moments in bf16 and stochastic rounding.
//!
//! The embeddings stand in for the input of a frozen model: the loss is
//! the mean squared distance, over the prompt positions of each sequence,
//! between the embeddings and fixed target vectors (what the frozen model
//! would want to see there). Each sequence is the 16 prompt tokens then
//! 48 ordinary ones, so every step gathers `orig` rows too.
//!
//! The same steps run three ways on the same start: bf16 with stochastic
//! rounding, bf16 rounded to nearest, and f32 (the tables widened from the
//! same bf16 values). The learning rate is small next to the weights, so
//! most updates are below half a bf16 unit in the last place: rounded to
//! nearest they vanish and the loss stalls, rounded stochastically the
//! loss follows f32's. The bf16 run stops halfway, writes a checkpoint
//! (BF16 tensors under d9d's names), starts again from it and ends bit for
//! bit where an uninterrupted run ends. The memory of each layout is
//! printed: the tables' bytes, the optimiser's, and the process's peak.
//!
//! Run: `cargo run --release --example prompt_tuning_bf16 [-- [--steps N]
//! [--hidden H] [--train-orig]]` (`--train-orig` also trains the orig
//! table, so the optimiser keeps moments for all of it). d9d's module
//! loads the checkpoint after `.to(torch.bfloat16)`.

use std::collections::BTreeMap;
use std::path::Path;

use ndarray::{Array3, ArrayD, s};
use splitgrad::checkpoint::{load_state, save_state};
use splitgrad::layers::SplitTokenEmbeddings;
use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer, StateValue};
use splitgrad::param::{Dtype, Rounding, Stored};
use splitgrad::prelude::*;
use splitgrad::tape::Pool;

const ORIG: usize = 151_936;
const PROMPT: usize = 16;
const BATCH: usize = 4;
const LEN: usize = PROMPT + 48;
const MIB: f64 = 1024.0 * 1024.0;

/// The example's options.
struct Options {
    steps: u64,
    hidden: usize,
    train_orig: bool,
}

fn options() -> std::result::Result<Options, String> {
    let mut o = Options {
        steps: 200,
        hidden: 2048,
        train_orig: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |flag: &str| -> std::result::Result<u64, String> {
            let v = args.next().ok_or(format!("{flag} needs a number"))?;
            v.parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(format!("{flag} must be a whole number ≥ 1, got `{v}`"))
        };
        match a.as_str() {
            "--steps" => o.steps = number("--steps")?.max(2),
            "--hidden" => o.hidden = number("--hidden")? as usize,
            "--train-orig" => o.train_orig = true,
            _ => {
                return Err(format!(
                    "unknown argument `{a}` (options: --steps N, --hidden H, --train-orig)"
                ));
            }
        }
    }
    Ok(o)
}

/// A run: the layer, its optimiser, the step, a pool of buffers.
struct Run {
    embeddings: SplitTokenEmbeddings<f32>,
    adam: LazyAdam<f32>,
    step: u64,
    pool: Pool<f32>,
}

impl Run {
    /// A fresh run kept as `dtype`, the optimiser rounding as `rounding`;
    /// every layout starts from the same (bf16-representable) values.
    fn new(o: &Options, dtype: Dtype, rounding: Rounding) -> Result<Self> {
        let splits = [("orig", ORIG), ("prompt", PROMPT)];
        let order = ["orig", "prompt"];
        let mut embeddings = SplitTokenEmbeddings::<f32>::with_dtype(
            &splits,
            &order,
            o.hidden,
            if dtype == Dtype::F32 {
                Dtype::BF16
            } else {
                dtype
            },
        )?;
        // N(0, 1) draws, rounded to bf16 once; the f32 layout widens them.
        embeddings.reset_parameters(&mut Rng::new(7));
        if dtype == Dtype::F32 {
            embeddings.set_dtype(Dtype::F32)?;
        }
        embeddings.set_trainable("orig", o.train_orig)?;
        let mut adam = LazyAdam::new(LazyAdamConfig {
            lr: 2e-4,
            ..LazyAdamConfig::default()
        })?;
        if dtype.is_half() {
            adam.set_state_dtype(Dtype::BF16)?;
        }
        adam.set_rounding(rounding);
        Ok(Run {
            embeddings,
            adam,
            step: 0,
            pool: Pool::new(),
        })
    }

    /// One step; returns the loss before it.
    fn step(&mut self, ids: &ArrayD<i64>, target: &ArrayD<f32>, mask: &ArrayD<f32>) -> Result<f32> {
        let (loss, grads) = {
            let mut tape = Tape::with_pool(&self.pool);
            let out = self.embeddings.forward(&mut tape, ids)?;
            let target = tape.constant_view(target.view());
            let mask = tape.constant_view(mask.view());
            let diff = tape.sub(out, target);
            let diff = tape.mul(diff, mask);
            let sq = tape.mul(diff, diff);
            // The mean over the prompt positions' elements.
            let loss = tape.sum(sq);
            let loss = tape.scale(loss, 1.0 / (BATCH * PROMPT * self.hidden()) as f32);
            (tape.scalar(loss), tape.backward(loss))
        };
        self.adam.step(self.embeddings.parameters_mut(), &grads)?;
        self.step += 1;
        Ok(loss)
    }

    fn hidden(&self) -> usize {
        self.embeddings.hidden_size()
    }

    /// Bytes of the optimiser's state as it is kept (from a copy of it).
    fn state_bytes(&self) -> u64 {
        self.adam
            .state()
            .iter()
            .map(|(_, v)| match v {
                StateValue::Array(a) => 4 * a.len() as u64,
                StateValue::Half(h) => h.nbytes(),
                StateValue::Step(_) => 8,
            })
            .sum()
    }

    fn save(&self, path: &Path) -> Result<()> {
        let meta = BTreeMap::from([("step".to_string(), self.step.to_string())]);
        save_state(path, &[&self.embeddings], Some(&self.adam), &[], &meta)
    }

    fn load(&mut self, path: &Path) -> Result<()> {
        let (meta, _) = load_state(path, &mut [&mut self.embeddings], Some(&mut self.adam))?;
        self.step = meta["step"].parse().expect("the step is a number");
        Ok(())
    }
}

/// Whether two layers hold the same bits in every table.
fn same_bits(a: &SplitTokenEmbeddings<f32>, b: &SplitTokenEmbeddings<f32>) -> bool {
    let same = |x: &Stored<f32>, y: &Stored<f32>| match (x, y) {
        (Stored::Full(x), Stored::Full(y)) => {
            x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits())
        }
        (Stored::BF16(x), Stored::BF16(y)) => {
            x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits())
        }
        (Stored::F16(x), Stored::F16(y)) => {
            x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits())
        }
        _ => false,
    };
    let (pa, pb) = (a.parameters(), b.parameters());
    pa.len() == pb.len()
        && pa
            .iter()
            .zip(&pb)
            .all(|(x, y)| x.shape() == y.shape() && same(x.stored(), y.stored()))
}

/// The process's peak resident memory (Linux), MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}

fn main() -> Result<()> {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    // The sequences, the targets of the prompt positions, and the mask
    // that keeps the loss to them.
    let mut rng = Rng::new(11);
    let mut ids = ndarray::Array2::<i64>::zeros((BATCH, LEN));
    for b in 0..BATCH {
        for p in 0..PROMPT {
            ids[[b, p]] = (ORIG + p) as i64;
        }
        for t in PROMPT..LEN {
            ids[[b, t]] = rng.below(ORIG as u64) as i64;
        }
    }
    let ids = ids.into_dyn();
    let mut target = Array3::<f32>::zeros((BATCH, LEN, o.hidden));
    let mut mask = Array3::<f32>::zeros((BATCH, LEN, o.hidden));
    let wanted: Vec<f32> = (0..PROMPT * o.hidden)
        .map(|_| rng.normal() as f32)
        .collect();
    for b in 0..BATCH {
        for p in 0..PROMPT {
            let row = &wanted[p * o.hidden..(p + 1) * o.hidden];
            target
                .slice_mut(s![b, p, ..])
                .assign(&ndarray::ArrayView1::from(row));
            mask.slice_mut(s![b, p, ..]).fill(1.0);
        }
    }
    let (target, mask) = (target.into_dyn(), mask.into_dyn());
    let report = |every: u64, step: u64| step.is_multiple_of(every) || step + 1 == o.steps;
    let every = (o.steps / 5).max(1);
    let dir = std::env::temp_dir().join(format!("splitgrad-prompt-bf16-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("prompt.safetensors");

    println!(
        "orig {ORIG} × {h} ({}), prompt {PROMPT} × {h}; {BATCH} sequences of {LEN} tokens; \
         {} steps of lazy Adam (lr 2e-4)",
        if o.train_orig { "trained" } else { "frozen" },
        o.steps,
        h = o.hidden,
    );

    // bf16, stochastic rounding: half the steps, a checkpoint, a fresh
    // start from it, the other half.
    let sr = Rounding::Stochastic { seed: 0 };
    let mut losses = BTreeMap::<&str, Vec<f32>>::new();
    let half = o.steps / 2;
    let mut first = Run::new(&o, Dtype::BF16, sr)?;
    let params_bytes = first.embeddings.parameter_bytes();
    let mut l = Vec::new();
    for _ in 0..half {
        l.push(first.step(&ids, &target, &mask)?);
    }
    // (before `state_bytes`, which copies the state)
    let peak_training = peak_rss_mib();
    let state_bytes = first.state_bytes();
    first.save(&path)?;
    let peak_saved = peak_rss_mib();
    let file_bytes = std::fs::metadata(&path)?.len();
    drop(first);
    let mut resumed = Run::new(&o, Dtype::BF16, sr)?;
    resumed.load(&path)?;
    let peak_loaded = peak_rss_mib();
    for _ in half..o.steps {
        l.push(resumed.step(&ids, &target, &mask)?);
    }
    losses.insert("bf16, stochastic", l);

    let mut straight = Run::new(&o, Dtype::BF16, sr)?;
    for _ in 0..o.steps {
        straight.step(&ids, &target, &mask)?;
    }
    let same = same_bits(&resumed.embeddings, &straight.embeddings)
        && resumed.adam.state() == straight.adam.state();
    drop((resumed, straight));
    let peak_bf16 = peak_rss_mib();

    let mut nearest = Run::new(&o, Dtype::BF16, Rounding::Nearest)?;
    let l = (0..o.steps)
        .map(|_| nearest.step(&ids, &target, &mask))
        .collect::<Result<Vec<_>>>()?;
    losses.insert("bf16, to nearest", l);
    drop(nearest);

    let mut full = Run::new(&o, Dtype::F32, sr)?;
    let l = (0..o.steps)
        .map(|_| full.step(&ids, &target, &mask))
        .collect::<Result<Vec<_>>>()?;
    let f32_params = full.embeddings.parameter_bytes();
    let f32_state = full.state_bytes();
    losses.insert("f32", l);
    drop(full);
    std::fs::remove_dir_all(&dir)?;

    println!("\nloss (mean squared distance of the prompt embeddings from their targets)");
    print!("{:>6}", "step");
    for name in losses.keys() {
        print!("  {name:>16}");
    }
    println!();
    for step in 0..o.steps {
        if report(every, step) {
            print!("{step:>6}");
            for l in losses.values() {
                print!("  {:>16.6}", l[step as usize]);
            }
            println!();
        }
    }
    println!(
        "\nbf16 stopped at step {half}, wrote {} ({:.1} MiB: BF16 tensors, the optimiser's \
         state), started again from it: {}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
        file_bytes as f64 / MIB,
        if same {
            "the result equals the uninterrupted run's, bit for bit"
        } else {
            "THE RESULT DIFFERS from the uninterrupted run's"
        }
    );
    println!("\nmemory          tables        optimiser state");
    println!(
        "bf16       {:>9.1} MiB  {:>9.1} MiB (bf16 moments)",
        params_bytes as f64 / MIB,
        state_bytes as f64 / MIB
    );
    println!(
        "f32        {:>9.1} MiB  {:>9.1} MiB",
        f32_params as f64 / MIB,
        f32_state as f64 / MIB
    );
    let peaks = [
        ("training in bf16", peak_training),
        ("with the checkpoint written", peak_saved),
        ("with the checkpoint read back", peak_loaded),
        ("with two runs compared", peak_bf16),
        ("with the f32 run", peak_rss_mib()),
    ];
    for (what, peak) in peaks {
        if let Some(peak) = peak {
            println!("peak resident memory, {what}: {peak:.1} MiB");
        }
    }
    assert!(same, "a resumed run ends where an uninterrupted one does");
    Ok(())
}
