//! The workloads of [`super::run`]: how each is built
//! (`docs/spec.md#5-benchmark-workloads`), one training step, and the bytes
//! the step must move.

use std::time::Instant;

use ndarray::{ArrayD, IxDyn};

use super::{F32, Workload};
use crate::error::Result;
use crate::kernels::reduce::{dot_half, dot_slices};
use crate::layers::{SplitLanguageModellingHead, SplitTokenEmbeddings};
use crate::ops::fused_ce::HeadKernel;
use crate::ops::fused_ce_sum::SumChunks;
use crate::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer};
use crate::param::{Dtype, Parameter, Rounding, Stored};
use crate::rng::{Rng, Zipf};
use crate::state::Module;
use crate::tape::{Gradients, Pool, Tape, Var};

mod splitvocab;
use splitvocab::SplitVocabBench;

/// The learning rate of every workload.
const LR: f64 = 1e-3;
/// The Zipf exponent of the ids.
const ZIPF_S: f64 = 1.2;

/// Adam at the workloads' learning rate.
fn adam() -> Result<Adam<f32>> {
    Adam::new(AdamConfig {
        lr: LR,
        ..AdamConfig::default()
    })
}

/// Lazy Adam at the workloads' learning rate.
pub(super) fn lazy_adam() -> Result<LazyAdam<f32>> {
    LazyAdam::new(LazyAdamConfig {
        lr: LR,
        ..LazyAdamConfig::default()
    })
}

/// A size divided by the scale, at least 1.
fn div(x: usize, scale: usize) -> usize {
    (x / scale).max(1)
}

/// `n` Zipf draws over `[0, v)`.
fn zipf_ids(rng: &mut Rng, v: usize, n: usize) -> Vec<usize> {
    let z = Zipf::new(v, ZIPF_S);
    (0..n).map(|_| z.sample(rng)).collect()
}

/// An `f32` array of N(0, 1) draws.
fn normal(rng: &mut Rng, shape: &[usize]) -> ArrayD<f32> {
    ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.normal() as f32)
}

/// Bytes per element of what a workload keeps: parameters, optimiser
/// state; activations and gradients are f32 (the tape's).
#[derive(Clone, Copy, Debug)]
struct Widths {
    /// A parameter's element.
    p: u64,
    /// An optimiser moment's element.
    s: u64,
}

impl Widths {
    fn new(dtype: Dtype, state: Dtype) -> Self {
        Widths {
            p: dtype.size() as u64,
            s: state.size() as u64,
        }
    }

    /// An Adam-family update of one element: read and write the parameter
    /// and its two moments, read the f32 gradient.
    fn adam(self) -> u64 {
        2 * self.p + 4 * self.s + F32
    }

    /// Whether the parameters are kept in half precision.
    fn half(self) -> bool {
        self.p < F32
    }
}

/// The optimisers' state dtype and rounding for a workload (stochastic,
/// seed 0), or the error of an unsupported state dtype.
pub(super) fn keep<O: Optimizer<f32>>(mut o: O, state: Dtype) -> Result<O> {
    o.set_state_dtype(state)?;
    o.set_rounding(Rounding::Stochastic { seed: 0 });
    Ok(o)
}

/// Bytes of an optimiser's state as it is kept.
fn state_bytes_of(o: &dyn Optimizer<f32>) -> u64 {
    o.state()
        .iter()
        .map(|(_, v)| match v {
            crate::optim::StateValue::Array(a) => F32 * a.len() as u64,
            crate::optim::StateValue::Half(h) => h.nbytes(),
            crate::optim::StateValue::Step(_) => 8,
        })
        .sum()
}

/// The elements of a fresh (standard-layout) array.
fn flat<E>(a: &ArrayD<E>) -> &[E] {
    a.as_slice().expect("a standard-layout array")
}

/// Hands an array of any dtype back to the pool.
fn give_back(pool: &Pool<f32>, a: Stored<f32>) {
    match a {
        Stored::Full(a) => pool.give(a),
        Stored::BF16(a) => pool.give_half_vec(a.into_raw_vec_and_offset().0),
        Stored::F16(a) => pool.give_half_vec(a.into_raw_vec_and_offset().0),
    }
}

/// Number of distinct values.
fn n_unique(xs: impl IntoIterator<Item = usize>) -> u64 {
    let mut v: Vec<usize> = xs.into_iter().collect();
    v.sort_unstable();
    v.dedup();
    v.len() as u64
}

/// A built workload.
pub(super) enum Built {
    Embed(Box<EmbedBench>),
    SplitVocab(Box<SplitVocabBench>),
    LmHead(Box<LmHeadBench>),
}

/// Builds workload `w` at `scale`, its parameters kept as `dtype` (drawn
/// in f32 and rounded to nearest) and its optimisers' moments as `state`.
pub(super) fn build(w: Workload, scale: usize, dtype: Dtype, state: Dtype) -> Result<Built> {
    let mut rng = Rng::new(0x5eed ^ w as u64);
    let mut built = match w {
        Workload::EmbedPrompt | Workload::EmbedFull => {
            Built::Embed(Box::new(EmbedBench::new(w, scale, &mut rng)?))
        }
        Workload::SplitVocab => Built::SplitVocab(Box::new(SplitVocabBench::new(scale, &mut rng)?)),
        Workload::LmHead => Built::LmHead(Box::new(LmHeadBench::new(scale, &mut rng)?)),
    };
    let widths = Widths::new(dtype, state);
    match &mut built {
        Built::Embed(b) => {
            b.emb.set_dtype(dtype)?;
            b.opt = keep(lazy_adam()?, state)?;
            b.widths = widths;
            // Every array of the step in the tables' dtype, as torch keeps
            // a bf16 model's activations: the constant too.
            let r = std::mem::replace(&mut b.r, Stored::Full(ArrayD::zeros(IxDyn(&[0]))));
            b.r = Stored::from_full(r.into_full(), dtype)?;
        }
        Built::SplitVocab(b) => b.keep_as(dtype, state)?,
        Built::LmHead(b) => {
            b.head.set_dtype(dtype)?;
            b.opt = keep(adam()?, state)?;
            b.widths = widths;
        }
    }
    Ok(built)
}

impl Built {
    /// One training step.
    pub(super) fn step(&mut self) -> Result<StepOut> {
        match self {
            Built::Embed(b) => b.step(),
            Built::SplitVocab(b) => b.step(),
            Built::LmHead(b) => b.step(),
        }
    }

    pub(super) fn bytes_terms(&self) -> Vec<(&'static str, u64)> {
        match self {
            Built::Embed(b) => b.bytes_terms(),
            Built::SplitVocab(b) => b.bytes_terms(),
            Built::LmHead(b) => b.bytes_terms(),
        }
    }

    pub(super) fn params_bytes(&self) -> u64 {
        let params: Vec<&Parameter<f32>> = match self {
            Built::Embed(b) => b.emb.parameters(),
            Built::SplitVocab(b) => b.parameters(),
            Built::LmHead(b) => b.head.parameters(),
        };
        params.iter().map(|p| p.nbytes()).sum()
    }

    /// Bytes of the optimisers' state now, as it is kept.
    pub(super) fn state_bytes(&self) -> u64 {
        match self {
            Built::Embed(b) => state_bytes_of(&b.opt),
            Built::SplitVocab(b) => b.state_bytes(),
            Built::LmHead(b) => state_bytes_of(&b.opt),
        }
    }

    pub(super) fn workspace_bytes(&self) -> Option<u64> {
        match self {
            Built::LmHead(b) => Some(b.head.sum_chunks().workspace_bytes::<f32>(
                b.labels.len(),
                b.head.vocab_size(),
                b.head.hidden_size(),
            ) as u64),
            _ => None,
        }
    }

    pub(super) fn flops(&self) -> Option<f64> {
        self.sgemm_shape()
            .map(|(n, h, v)| 6.0 * n as f64 * v as f64 * h as f64)
    }

    /// For `lmhead`: 6·N_active·V·H, the products the summed head does.
    pub(super) fn useful_flops(&self) -> Option<f64> {
        match self {
            Built::LmHead(b) => {
                let active = b
                    .labels
                    .iter()
                    .filter(|&&l| l != crate::ops::cross_entropy::IGNORE_INDEX)
                    .count();
                let (h, v) = (b.head.hidden_size(), b.head.vocab_size());
                Some(6.0 * active as f64 * v as f64 * h as f64)
            }
            _ => None,
        }
    }

    /// Sets the head's products (`lmhead` only; `false` for the others).
    pub(super) fn set_kernel(&mut self, kernel: HeadKernel) -> bool {
        match self {
            Built::LmHead(b) => {
                b.head.set_kernel(kernel);
                true
            }
            _ => false,
        }
    }

    /// The elements lazy Adam moves in a step and the width of their rows
    /// (the embedding workloads' touched rows; `splitvocab`'s touched
    /// shared rows and every split row); `None` for `lmhead`, whose update
    /// is dense Adam.
    pub(super) fn lazy_adam_elements(&self) -> Option<(u64, usize)> {
        match self {
            Built::Embed(b) => Some(b.lazy_adam_elements()),
            Built::SplitVocab(b) => Some(b.lazy_adam_elements()),
            Built::LmHead(_) => None,
        }
    }

    /// (N, H, V) of the head: the shape of its logits gemm.
    pub(super) fn sgemm_shape(&self) -> Option<(usize, usize, usize)> {
        match self {
            Built::LmHead(b) => Some((b.labels.len(), b.head.hidden_size(), b.head.vocab_size())),
            _ => None,
        }
    }
}

/// One step's loss and the seconds of its three phases, and of its
/// operations where the workload times them apart.
#[derive(Clone, Debug, Default)]
pub(super) struct StepOut {
    pub(super) loss: f64,
    /// Forward (tape built up to the loss), backward (gradients taken, the
    /// tape dropped), optimiser update.
    pub(super) phase_s: [f64; 3],
    /// The step's operations in order, (what, seconds), covering the
    /// three phases; empty where a workload does not time them apart.
    pub(super) op_s: Vec<(&'static str, f64)>,
}

/// Seconds between successive calls to [`Laps::lap`].
struct Laps(Instant);

impl Laps {
    fn start() -> Self {
        Laps(Instant::now())
    }

    fn lap(&mut self) -> f64 {
        let now = Instant::now();
        let s = (now - self.0).as_secs_f64();
        self.0 = now;
        s
    }
}

/// Seconds of each named operation of a step, in order ([`StepOut::op_s`]).
struct Ops(Laps, Vec<(&'static str, f64)>);

impl Ops {
    fn start() -> Self {
        Ops(Laps::start(), Vec::with_capacity(16))
    }

    /// The operation `what` ended now.
    fn lap(&mut self, what: &'static str) {
        let s = self.0.lap();
        self.1.push((what, s));
    }

    fn done(self) -> Vec<(&'static str, f64)> {
        self.1
    }
}

/// A step's forward and backward pass, timed: its loss, the gradients, and
/// the laps of the two phases (the update is the third).
struct Backward {
    loss: f32,
    grads: Gradients<f32>,
    phase_s: [f64; 2],
    laps: Laps,
}

/// Records the loss with `forward` on a tape of `pool`, then takes its
/// gradients and drops the tape.
fn forward_backward<'p>(
    pool: &Pool<f32>,
    forward: impl FnOnce(&mut Tape<'p, f32>) -> Result<Var>,
) -> Result<Backward> {
    let mut laps = Laps::start();
    let (loss, grads, forward_s) = {
        let mut tape = Tape::with_pool(pool);
        let loss = forward(&mut tape)?;
        let forward_s = laps.lap();
        let g = tape.backward(loss);
        (tape.scalar(loss), g, forward_s)
    };
    let backward_s = laps.lap();
    Ok(Backward {
        loss,
        grads,
        phase_s: [forward_s, backward_s],
        laps,
    })
}

impl Backward {
    /// The step, once its update has run: the gradients dropped, the
    /// third lap taken.
    fn updated(self) -> StepOut {
        let Backward {
            loss,
            grads,
            phase_s: [forward_s, backward_s],
            mut laps,
        } = self;
        drop(grads);
        StepOut {
            loss: loss as f64,
            phase_s: [forward_s, backward_s, laps.lap()],
            op_s: Vec::new(),
        }
    }
}

/// `embed_prompt` and `embed_full`.
pub(super) struct EmbedBench {
    emb: SplitTokenEmbeddings<f32>,
    ids: ArrayD<i64>,
    /// R, in the tables' dtype (every activation of the step is).
    r: Stored<f32>,
    opt: LazyAdam<f32>,
    pool: Pool<f32>,
    widths: Widths,
}

impl EmbedBench {
    fn new(w: Workload, scale: usize, rng: &mut Rng) -> Result<Self> {
        let h = div(1024, scale);
        let n = div(8192, scale);
        let (mut emb, ids) = if w == Workload::EmbedPrompt {
            let (orig, prompt) = (div(151936, scale), div(16, scale));
            let mut emb = SplitTokenEmbeddings::new(
                &[("orig", orig), ("prompt", prompt)],
                &["orig", "prompt"],
                h,
            )?;
            emb.set_trainable("orig", false)?;
            let (zo, zp) = (Zipf::new(orig, ZIPF_S), Zipf::new(prompt, ZIPF_S));
            let ids: Vec<i64> = (0..n)
                .map(|i| match i % 8 {
                    7 => (orig + zp.sample(rng)) as i64,
                    _ => zo.sample(rng) as i64,
                })
                .collect();
            (emb, ids)
        } else {
            let sizes = [
                ("orig", div(32000, scale)),
                ("special", div(256, scale)),
                ("prompt", div(64, scale)),
            ];
            let emb = SplitTokenEmbeddings::new(&sizes, &["orig", "special", "prompt"], h)?;
            let v = emb.vocab_size();
            let ids = zipf_ids(rng, v, n).into_iter().map(|i| i as i64).collect();
            (emb, ids)
        };
        emb.reset_parameters(rng);
        let r = Stored::Full(normal(rng, &[n, h]));
        let opt = lazy_adam()?;
        Ok(EmbedBench {
            emb,
            ids: ArrayD::from_shape_vec(IxDyn(&[n]), ids).expect("n ids"),
            r,
            opt,
            pool: Pool::new(),
            widths: Widths::new(Dtype::F32, Dtype::F32),
        })
    }

    /// One step without a tape, every activation in the tables' dtype:
    /// the embeddings gathered, the loss `Σ out ⊙ R` summed in f32, and the
    /// backward inside lazy Adam's update (each touched row's gradient, R's
    /// rows of its ids summed in a buffer of the task, updated at once:
    /// `SplitTokenEmbeddings::backward_update_saved`). The backward phase
    /// is 0: its time is the update's.
    fn step(&mut self) -> Result<StepOut> {
        let mut laps = Laps::start();
        let mut ops = Ops::start();
        let (out, saved) = self.emb.forward_saved_stored(&self.pool, &self.ids)?;
        ops.lap("gather");
        let loss: f32 = match (&out, &self.r) {
            (Stored::Full(o), Stored::Full(r)) => dot_slices(flat(o), flat(r)),
            (Stored::BF16(o), Stored::BF16(r)) => dot_half(flat(o), flat(r)),
            (Stored::F16(o), Stored::F16(r)) => dot_half(flat(o), flat(r)),
            _ => unreachable!("the output and r share the tables' dtype"),
        };
        give_back(&self.pool, out);
        ops.lap("loss: Σ out ⊙ R");
        let forward_s = laps.lap();
        let opt = &mut self.opt;
        self.emb
            .backward_update_saved(&self.pool, &saved, self.r.view(), &mut |p, g| {
                opt.update_sparse_by_rows(p, g)
            })?;
        ops.lap("lazy Adam with the backward (∂out's rows summed per touched row)");
        Ok(StepOut {
            loss: loss as f64,
            phase_s: [forward_s, 0.0, laps.lap()],
            op_s: ops.done(),
        })
    }

    /// The touched rows' elements of the trainable tables, and H.
    fn lazy_adam_elements(&self) -> (u64, usize) {
        let h = self.emb.hidden_size();
        (self.trainable_rows().1 * h as u64, h)
    }

    /// The trainable ids (N_t) and the distinct rows they touch (U_t).
    fn trainable_rows(&self) -> (u64, u64) {
        let routing = self.emb.splits().routing();
        let params = self.emb.parameters();
        let global = |(k, l): (usize, usize)| routing.start(k) + l;
        let mine: Vec<usize> = self
            .ids
            .iter()
            .map(|&i| routing.route(i).expect("ids are in range"))
            .filter(|o| params[o.0].is_trainable())
            .map(global)
            .collect();
        let n_t = mine.len() as u64;
        (n_t, n_unique(mine))
    }

    /// See `docs/bench.md#embed_prompt-and-embed_full`.
    fn bytes_terms(&self) -> Vec<(&'static str, u64)> {
        let h = self.emb.hidden_size() as u64;
        let n = self.ids.len() as u64;
        let routing = self.emb.splits().routing();
        let owners: Vec<(usize, usize)> = self
            .ids
            .iter()
            .map(|&i| routing.route(i).expect("ids are in range"))
            .collect();
        let global = |&(k, l): &(usize, usize)| routing.start(k) + l;
        let u_all = n_unique(owners.iter().map(global));
        let (n_t, u_t) = self.trainable_rows();
        let row = F32 * h;
        let w = self.widths;
        // Activations in the tables' dtype on the half-precision path.
        let act = w.p * h;
        vec![
            ("gather: read the distinct rows", u_all * w.p * h),
            ("gather: write out (N, H)", n * act),
            ("loss: read out and R", 2 * n * act),
            ("backward: read ∂out rows of trainable ids", n_t * act),
            ("backward: write the coalesced rows", u_t * row),
            (
                "lazy Adam: read p, m, v, g; write p, m, v",
                u_t * h * w.adam(),
            ),
        ]
    }
}

/// `lmhead`.
pub(super) struct LmHeadBench {
    head: SplitLanguageModellingHead<f32>,
    hidden: ArrayD<f32>,
    labels: ArrayD<i64>,
    opt: Adam<f32>,
    pool: Pool<f32>,
    widths: Widths,
}

impl LmHeadBench {
    fn new(scale: usize, rng: &mut Rng) -> Result<Self> {
        let h = div(512, scale);
        let n = div(2048, scale);
        let sizes = [("orig", div(32000, scale)), ("new", div(256, scale))];
        let mut head = SplitLanguageModellingHead::new(&sizes, &["orig", "new"], h)?;
        head.set_sum_chunks(SumChunks::default());
        head.reset_parameters(rng);
        let v = head.vocab_size();
        let mut labels: Vec<i64> = zipf_ids(rng, v, n).into_iter().map(|i| i as i64).collect();
        // Exactly 10 % of the positions (rounded), chosen at random, ignored.
        let mut pos: Vec<usize> = (0..n).collect();
        rng.shuffle(&mut pos);
        for &p in &pos[..(n as f64 * 0.1).round() as usize] {
            labels[p] = crate::ops::cross_entropy::IGNORE_INDEX;
        }
        Ok(LmHeadBench {
            head,
            hidden: normal(rng, &[n, h]),
            labels: ArrayD::from_shape_vec(IxDyn(&[n]), labels).expect("n labels"),
            opt: adam()?,
            pool: Pool::new(),
            widths: Widths::new(Dtype::F32, Dtype::F32),
        })
    }

    fn step(&mut self) -> Result<StepOut> {
        let mut hidden = None;
        let b = forward_backward(&self.pool, |tape| {
            let h = tape.input_view(self.hidden.view());
            hidden = Some(h);
            self.head.forward_sum(tape, h, &self.labels)
        })?;
        debug_assert!(
            hidden.is_some_and(|h| b.grads.input(h).is_some()),
            "hidden's gradient"
        );
        self.opt.step(self.head.parameters_mut(), &b.grads)?;
        Ok(b.updated())
    }

    /// See `docs/bench.md#lmhead`.
    fn bytes_terms(&self) -> Vec<(&'static str, u64)> {
        let h = self.head.hidden_size() as u64;
        let (n, v) = (self.labels.len() as u64, self.head.vocab_size() as u64);
        let row = F32 * h;
        let w = self.widths;
        let mut terms = vec![
            (
                "forward: read hidden and W, write ∂hidden and ∂W",
                2 * (n + v) * row,
            ),
            (
                "backward: read the held ∂hidden and ∂W, add them into the gradients",
                3 * (n + v) * row,
            ),
            ("Adam: read p, m, v, g; write p, m, v", v * h * w.adam()),
        ];
        if w.half() {
            terms.push(("the head: widen W once", v * h * (w.p + F32)));
        }
        terms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_ids_sit_at_every_eighth_position() {
        let b = EmbedBench::new(Workload::EmbedPrompt, 64, &mut Rng::new(1)).unwrap();
        let orig = b.emb.split("orig").unwrap().shape()[0] as i64;
        for (i, &id) in b.ids.iter().enumerate() {
            assert_eq!(id >= orig, i % 8 == 7, "position {i}, id {id}");
        }
    }

    /// The step of the tables' gradients stored, then the update: on a
    /// tape in f32 (the workload as it was once written), through the
    /// saved pair in half precision.
    fn stored_step(b: &mut EmbedBench) {
        match &b.r {
            Stored::Full(r) => {
                let grads = {
                    let mut tape = Tape::new();
                    let out = b.emb.forward(&mut tape, &b.ids).unwrap();
                    let loss = tape.dot_const_view(out, r.view());
                    tape.backward(loss)
                };
                b.opt.step(b.emb.parameters_mut(), &grads).unwrap();
            }
            r => {
                let saved = b.emb.route(&b.ids).unwrap();
                let grads = b.emb.backward_saved(&b.pool, &saved, r.view()).unwrap();
                b.opt.step(b.emb.parameters_mut(), &grads).unwrap();
            }
        }
    }

    /// Three steps of each embedding workload, f32 and bf16 (bf16 state):
    /// the tables after the step that sums each row's gradient inside the
    /// update are those after the gradients stored and then applied, bit
    /// for bit.
    #[test]
    fn the_backward_inside_the_update_is_the_stored_gradients_update() {
        for w in [Workload::EmbedPrompt, Workload::EmbedFull] {
            for dtype in [Dtype::F32, Dtype::BF16] {
                let built = || match build(w, 16, dtype, dtype).unwrap() {
                    Built::Embed(b) => b,
                    _ => unreachable!("an embedding workload"),
                };
                let (mut fused, mut stored) = (built(), built());
                for _ in 0..3 {
                    fused.step().unwrap();
                    stored_step(&mut stored);
                }
                for (a, b) in fused.emb.parameters().iter().zip(stored.emb.parameters()) {
                    assert_eq!(
                        a.widened().mapv(f32::to_bits),
                        b.widened().mapv(f32::to_bits),
                        "{w:?} {dtype}: {}",
                        a.name()
                    );
                }
            }
        }
    }
}
