//! The `splitvocab` workload: a shared table gathered, the split
//! vocabulary's gated mix over it, the gate and fusion penalties, and the
//! three parameters' updates, without a tape.

use ndarray::{ArrayD, IxDyn};

use super::{
    F32, Laps, Ops, StepOut, Widths, adam, div, flat, give_back, keep, lazy_adam, n_unique, normal,
    state_bytes_of, zipf_ids,
};
use crate::error::Result;
use crate::io::SplitIndex;
use crate::kernels::reduce::{dot_half, dot_slices};
use crate::layers::{RowsBlocks, SplitTokenEmbeddings, SplitVocabulary, SplitVocabularyConfig};
use crate::optim::{Adam, LazyAdam, Optimizer};
use crate::param::{Dtype, ParamGrad, Parameter, RowSparse, Stored};
use crate::rng::Rng;
use crate::state::Module;
use crate::tape::{Pool, Tape};

/// `splitvocab`.
pub(in crate::app::bench) struct SplitVocabBench {
    /// The shared table: one split, `shared`.
    shared: SplitTokenEmbeddings<f32>,
    sv: SplitVocabulary<f32>,
    tokens: Vec<i64>,
    langs: Vec<i64>,
    /// R in the tables' dtype (the activations').
    r: Stored<f32>,
    tables: LazyAdam<f32>,
    dense: Adam<f32>,
    pool: Pool<f32>,
    widths: Widths,
}

/// Weights of the gate penalty and of the fusion penalty in the loss.
const PENALTY: f32 = 0.01;
const FUSION: f32 = 0.01;

impl SplitVocabBench {
    pub(super) fn new(scale: usize, rng: &mut Rng) -> Result<Self> {
        let (v, d, l) = (div(32000, scale), div(512, scale), 8usize);
        let n_rows = div(20000, scale).min(l * v);
        let n = div(8192, scale);
        // Distinct (language, token) cells, uniformly.
        let mut cells: Vec<usize> = (0..l * v).collect();
        rng.shuffle(&mut cells);
        cells.truncate(n_rows);
        cells.sort_unstable();
        let index = SplitIndex::new(
            cells.iter().map(|c| c / v).collect(),
            cells.iter().map(|c| c % v).collect(),
        );
        let mut sv = SplitVocabulary::new(index, &SplitVocabularyConfig::new(v, d, l))?;
        let mut shared = SplitTokenEmbeddings::new(&[("shared", v)], &["shared"], d)?;
        shared.parameters_mut()[0]
            .value_mut()
            .assign(&normal(rng, &[v, d]));
        sv.seed_from(shared.parameters()[0])?;
        // Rows a little away from their shared row, so that every fusion
        // deviation is non-zero.
        sv.rows_mut()
            .value_mut()
            .mapv_inplace(|x| x + 0.01 * rng.normal() as f32);
        let tokens = zipf_ids(rng, v, n).into_iter().map(|t| t as i64).collect();
        let langs = (0..n).map(|_| rng.below(l as u64) as i64).collect();
        let r = Stored::Full(normal(rng, &[n, d]));
        Ok(SplitVocabBench {
            shared,
            sv,
            tokens,
            langs,
            r,
            tables: lazy_adam()?,
            dense: adam()?,
            pool: Pool::new(),
            widths: Widths::new(Dtype::F32, Dtype::F32),
        })
    }

    /// One step without a tape, every activation in the tables' dtype:
    /// the shared rows gathered, the gated mix, `Σ out ⊙ R` in f32 plus
    /// the two penalties; the backward through the layers' saved pairs;
    /// lazy Adam on the shared table's rows with the table's backward
    /// inside it (each touched row's gradient summed from ∂shared, then
    /// the row updated), lazy Adam on the split rows
    /// with the fusion penalty and its gradient formed a block of groups
    /// at a time inside the update (their norms and terms from the block's
    /// rows, which the update then moves while they are in cache), plus
    /// the mix's gradient; Adam on the gate logits.
    pub(super) fn step(&mut self) -> Result<StepOut> {
        let pool = &self.pool;
        let mut laps = Laps::start();
        let mut ops = Ops::start();
        let (shared, esaved) = self.shared.forward_saved_stored(pool, &self.tokens)?;
        ops.lap("shared gather");
        let (out, vsaved) =
            self.sv
                .forward_saved_stored(pool, &self.tokens, &self.langs, shared.view(), true)?;
        ops.lap("gate and gated mix");
        let fit: f32 = match (&out, &self.r) {
            (Stored::Full(o), Stored::Full(r)) => dot_slices(flat(o), flat(r)),
            (Stored::BF16(o), Stored::BF16(r)) => dot_half(flat(o), flat(r)),
            (Stored::F16(o), Stored::F16(r)) => dot_half(flat(o), flat(r)),
            _ => unreachable!("the output and r share the tables' dtype"),
        };
        give_back(pool, out);
        // The fusion penalty is formed inside the rows' update, below.
        let gate_penalty = self.sv.penalty();
        ops.lap("loss: Σ out ⊙ R; gate penalty");
        let forward_s = laps.lap();

        let g = self.sv.backward_saved_stored(
            pool,
            &vsaved,
            shared.view(),
            self.r.view(),
            true,
            true,
        )?;
        give_back(pool, shared);
        ops.lap("gated mix backward");
        let dshared = g.input.expect("∂shared was asked for");
        // The gate logits: the mix's gradient plus the penalty's.
        let mut gates = {
            let mut tape = Tape::with_pool(pool);
            let p = self.sv.penalty_var(&mut tape);
            let p = tape.scale(p, PENALTY);
            tape.backward(p).dense(self.sv.gate_logit())
        };
        let rows_name = self.sv.rows().name().to_string();
        let mut mix_rows = None;
        for named in g.params {
            match named.grad {
                ParamGrad::Dense(d) if named.name == self.sv.gate_logit().name() => gates += &d,
                ParamGrad::RowSparse(rs) if named.name == rows_name => mix_rows = Some(rs),
                _ => unreachable!("the vocabulary's two parameters"),
            }
        }
        ops.lap("gate logits' gradient");
        let backward_s = laps.lap();

        // The shared table's backward inside its update: each touched row's
        // gradient summed from ∂shared's rows in a buffer of the task, then
        // the row updated at once.
        let tables = &mut self.tables;
        self.shared
            .backward_update_saved(pool, &esaved, dshared.view(), &mut |p, g| {
                tables.update_sparse_by_rows(p, g)
            })?;
        give_back(pool, dshared);
        ops.lap("lazy Adam, shared table, with its backward (∂shared coalesced)");
        let parts: Vec<&RowSparse<f32>> = mix_rows.iter().collect();
        let (rows, blocks) = self.sv.rows_and_fusion_blocks(FUSION);
        self.tables
            .update_by_blocks(rows, &RowsBlocks::new(&blocks, &parts))?;
        // The penalty of the rows before the update (every block formed).
        let (fusion, _) = blocks.penalty(rows.stored().view());
        let loss = fit + PENALTY * gate_penalty + FUSION * fusion;
        ops.lap("lazy Adam by blocks, split rows, with the fusion penalty");
        self.dense
            .update(self.sv.gate_logit_mut(), &ParamGrad::Dense(gates))?;
        if let Some(rs) = mix_rows {
            pool.give(rs.values);
        }
        ops.lap("Adam, gate logits; buffers returned");
        Ok(StepOut {
            loss: loss as f64,
            phase_s: [forward_s, backward_s, laps.lap()],
            op_s: ops.done(),
        })
    }

    /// The tables kept as `dtype` (rounded to nearest) and the moments as
    /// `state`; every activation in the tables' dtype, R too.
    pub(super) fn keep_as(&mut self, dtype: Dtype, state: Dtype) -> Result<()> {
        self.shared.set_dtype(dtype)?;
        self.sv.set_dtype(dtype)?;
        self.tables = keep(lazy_adam()?, state)?;
        self.dense = keep(adam()?, state)?;
        self.widths = Widths::new(dtype, state);
        let r = std::mem::replace(&mut self.r, Stored::Full(ArrayD::zeros(IxDyn(&[0]))));
        self.r = Stored::from_full(r.into_full(), dtype)?;
        Ok(())
    }

    /// The shared table, the rows and the gate logits.
    pub(super) fn parameters(&self) -> Vec<&Parameter<f32>> {
        vec![
            self.shared.parameters()[0],
            self.sv.rows(),
            self.sv.gate_logit(),
        ]
    }

    /// Bytes of both optimisers' state now, as it is kept.
    pub(super) fn state_bytes(&self) -> u64 {
        state_bytes_of(&self.tables) + state_bytes_of(&self.dense)
    }

    /// The elements lazy Adam moves in a step: the shared table's touched
    /// rows and every split row (the fusion penalty's gradient is dense);
    /// and D.
    pub(super) fn lazy_adam_elements(&self) -> (u64, usize) {
        let d = self.sv.dim();
        let u_s = n_unique(self.tokens.iter().map(|&t| t as usize));
        ((u_s + self.sv.n_rows() as u64) * d as u64, d)
    }

    /// See `docs/bench.md#splitvocab`.
    pub(super) fn bytes_terms(&self) -> Vec<(&'static str, u64)> {
        let d = self.sv.dim() as u64;
        let n = self.tokens.len() as u64;
        let n_rows = self.sv.n_rows() as u64;
        let hit: Vec<usize> = self
            .tokens
            .iter()
            .zip(&self.langs)
            .filter_map(|(&t, &l)| self.sv.row_of(l as usize, t as usize))
            .collect();
        let u_s = n_unique(self.tokens.iter().map(|&t| t as usize));
        let u_r = n_unique(hit.iter().copied());
        let w = self.widths;
        // A row of an activation ((N, D) arrays: shared, out, R, ∂out,
        // ∂shared) in the tables' dtype; of a T array (gradients); of the
        // split rows as they are kept.
        let (act, row, kept) = (w.p * d, F32 * d, w.p * d);
        let mut terms = vec![
            (
                "shared gather: read the distinct rows, write (N, D)",
                u_s * kept + n * act,
            ),
            ("gate: read logits, write σ", (w.p + F32) * n_rows),
            (
                "mix: read shared and the rows hit, write out",
                2 * n * act + u_r * kept,
            ),
            (
                "loss: read out and R; penalty: read σ",
                2 * n * act + F32 * n_rows,
            ),
            (
                "mix backward: read ∂out, shared, rows hit; write ∂shared, ∂rows hit",
                3 * n * act + u_r * (kept + row),
            ),
            (
                "shared backward: read ∂shared, write the coalesced rows",
                n * act + u_s * row,
            ),
            (
                "lazy Adam, shared table: the touched rows",
                u_s * d * w.adam(),
            ),
            (
                "lazy Adam by blocks, split rows, with the fusion penalty: read and write p, m, v of every row; ∂rows hit read",
                n_rows * d * (w.adam() - F32) + u_r * row,
            ),
            ("Adam, gate logits", n_rows * w.adam()),
        ];
        if w.half() {
            terms.push(("the gate: widen the gate logits", n_rows * (w.p + F32)));
        }
        terms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tape's step of `splitvocab`, as the workload was once written:
    /// the reference the tape-free step is held to.
    fn tape_step(b: &mut SplitVocabBench) -> f32 {
        let r = b.r.as_full().expect("an f32 workload").clone();
        let token_rows: Vec<usize> = b.tokens.iter().map(|&t| t as usize).collect();
        let g = {
            let mut tape = Tape::new();
            let table = tape.param(b.shared.parameters()[0]);
            let shared = tape.gather(table, &token_rows);
            let out =
                b.sv.forward(&mut tape, &b.tokens, &b.langs, shared, true)
                    .unwrap();
            let fit = tape.dot_const_view(out, r.view());
            let pen = b.sv.penalty_var(&mut tape);
            let pen = tape.scale(pen, PENALTY);
            let fus = b.sv.fusion_penalty_var(&mut tape);
            let fus = tape.scale(fus, FUSION);
            let loss = tape.add(fit, pen);
            let loss = tape.add(loss, fus);
            (tape.scalar(loss), tape.backward(loss))
        };
        let (loss, grads) = g;
        let table = b.shared.parameters_mut().into_iter().next().unwrap();
        b.tables.step(vec![table, b.sv.rows_mut()], &grads).unwrap();
        b.dense.step(vec![b.sv.gate_logit_mut()], &grads).unwrap();
        loss
    }

    /// Three steps: the parameters bit for bit (the rows' gradient formed
    /// inside the update sums as the tape's dense gradient does), the loss
    /// to rounding (summed in another order).
    #[test]
    fn the_tape_free_splitvocab_step_is_the_tapes() {
        let mut fast = SplitVocabBench::new(16, &mut Rng::new(3)).unwrap();
        let mut tape = SplitVocabBench::new(16, &mut Rng::new(3)).unwrap();
        for step in 0..3 {
            let a = fast.step().unwrap().loss as f32;
            let b = tape_step(&mut tape);
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "step {step}: {a} vs {b}"
            );
            let params = |x: &SplitVocabBench| -> Vec<ArrayD<f32>> {
                vec![
                    x.shared.parameters()[0].value().clone(),
                    x.sv.rows().value().clone(),
                    x.sv.gate_logit().value().clone(),
                ]
            };
            for (p, q) in params(&fast).iter().zip(&params(&tape)) {
                let bits = |a: &ArrayD<f32>| a.mapv(f32::to_bits);
                assert_eq!(bits(p), bits(q), "step {step}");
            }
        }
    }
}
