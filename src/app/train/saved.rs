//! Reading back what [`Trainer::save`](super::Trainer::save) wrote: the
//! model, its record and its index, for reports.

use std::collections::BTreeMap;
use std::path::Path;

use super::precision::RoundingMode;
use super::{HELDOUT_CURVE, HISTORY, RunLabels, StepStats, split_joined};
use crate::app::eval::HeldOut;
use crate::app::model::{BigramModel, ModelConfig};
use crate::checkpoint::{Checkpoint, Snapshot};
use crate::error::{Error, ErrorKind, Result};
use crate::io::SplitIndex;
use crate::kernels::Real;
use crate::param::Dtype;
use crate::state::{Module, TensorData};

/// A model read back from a checkpoint of [`Trainer::save`](super::Trainer::save), for reports.
#[derive(Clone, Debug)]
pub struct SavedModel<T> {
    /// The model, its index (with `score` when saved) and weights.
    pub model: BigramModel<T>,
    /// The checkpoint's metadata (sizes, settings, step, corpus fingerprint).
    pub metadata: BTreeMap<String, String>,
    /// The loss terms of every step run.
    pub history: Vec<StepStats>,
    /// What the run is about.
    pub labels: RunLabels,
    /// Held-out cross-entropy at each evaluation: (step, model, closed).
    pub heldout_curve: Vec<(u64, f64, f64)>,
    /// The held-out evaluation of the trained model, if the run ended.
    pub evaluation: Option<HeldOut>,
    /// Bytes of the optimiser state saved with it (not loaded), as kept.
    pub state_bytes: u64,
}

impl<T> SavedModel<T> {
    /// Whether the run was gated (its metadata says `use_gate` is not
    /// `false`).
    pub fn use_gate(&self) -> bool {
        self.metadata.get("use_gate").map(String::as_str) != Some("false")
    }

    /// A metadata value, or `default` where the checkpoint has none.
    pub fn meta_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.metadata.get(key).map_or(default, String::as_str)
    }
}

/// The bytes of a tensor as a checkpoint keeps it.
fn tensor_bytes(t: &TensorData) -> u64 {
    // Anything else (a step count, U64) is 8 bytes an element.
    let size = Dtype::from_safetensors(t.dtype()).map_or(8, Dtype::size) as u64;
    size.saturating_mul(t.shape().iter().product::<usize>() as u64)
}

/// A run's labels, held-out curve and evaluation.
pub(super) type Record = (RunLabels, Vec<(u64, f64, f64)>, Option<HeldOut>);

/// The run's labels, held-out curve and evaluation, from a checkpoint.
pub(super) fn record_from(
    snap: &Snapshot,
    rest: &crate::state::StateDict,
    n_rows: usize,
    n_languages: usize,
) -> Result<Record> {
    let meta = |k: &str| snap.metadata.get(k).map(String::as_str);
    let mut labels = RunLabels {
        corpus: meta("corpus").unwrap_or("a corpus").to_string(),
        language_names: meta("language_names").map(split_joined),
        token_strings: meta("token_strings").map(split_joined),
        planted: None,
    };
    if rest.contains("eval.planted") {
        let p = rest.i64s("eval.planted", &[n_rows])?;
        labels.planted = Some(p.iter().map(|&x| x != 0).collect());
    }
    let curve = match rest.get(HELDOUT_CURVE) {
        Some(t) => {
            let k = t.shape().first().copied().unwrap_or(0);
            let c = rest.real::<f64>(HELDOUT_CURVE, &[k, 3])?;
            (0..k)
                .map(|i| (c[[i, 0]] as u64, c[[i, 1]], c[[i, 2]]))
                .collect()
        }
        None => Vec::new(),
    };
    let evaluation = if rest.contains("eval.rows") {
        Some(HeldOut::from_state(
            rest,
            &snap.metadata,
            n_rows,
            n_languages,
        )?)
    } else {
        None
    };
    Ok((labels, curve, evaluation))
}

/// The history of `step` steps from a checkpoint's tensor.
pub(super) fn history_from(rest: &crate::state::StateDict, step: u64) -> Result<Vec<StepStats>> {
    let n = usize::try_from(step).unwrap_or(usize::MAX);
    let hist = rest.real::<f64>(HISTORY, &[n, 4])?;
    Ok((0..n)
        .map(|i| StepStats {
            step: i as u64,
            total: hist[[i, 0]],
            ce: hist[[i, 1]],
            penalty: hist[[i, 2]],
            fusion: hist[[i, 3]],
        })
        .collect())
}

/// How a checkpoint of [`Trainer::save`](super::Trainer::save) keeps its
/// parameters and its moments, from its metadata (`dtype`, and
/// `state_dtype`, which a checkpoint from before it was recorded does not
/// have: its moments are kept as its parameters).
pub(crate) fn kept_dtypes(ck: &Checkpoint) -> Result<(Dtype, Dtype)> {
    let read = |key: &str, raw: &str, allowed: &[Dtype]| {
        raw.parse::<Dtype>()
            .ok()
            .filter(|d| allowed.contains(d) && d.name() == raw)
            .ok_or_else(|| {
                let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
                Error::format(format!(
                    "metadata `{key}` = {raw:?}: a checkpoint keeps {}",
                    names.join(", ")
                ))
                .in_file(ck.path())
            })
    };
    let dtype = match ck.metadata().get("dtype") {
        Some(raw) => read("dtype", raw, &[Dtype::F32, Dtype::BF16, Dtype::F16])?,
        None => Dtype::F32,
    };
    let state = match ck.metadata().get("state_dtype") {
        Some(raw) => read("state_dtype", raw, &[Dtype::F32, Dtype::BF16])?,
        None => dtype,
    };
    Ok((dtype, state))
}

/// How a checkpoint of [`Trainer::save`](super::Trainer::save) rounds its
/// narrowing stores, from its metadata (`rounding`, which a checkpoint
/// from before it was recorded does not have: it rounded stochastically,
/// or rounded nothing).
pub(crate) fn kept_rounding(ck: &Checkpoint) -> Result<RoundingMode> {
    match ck.metadata().get("rounding") {
        Some(raw) => raw.parse::<RoundingMode>().map_err(|_| {
            Error::format(format!(
                "metadata `rounding` = {raw:?}: a checkpoint keeps stochastic or nearest"
            ))
            .in_file(ck.path())
        }),
        None => Ok(RoundingMode::Stochastic),
    }
}

/// Checks the header of a checkpoint of [`Trainer::save`](super::Trainer::save) against its
/// own metadata before any tensor is read: each weight of the model in the
/// metadata's `dtype` and of the shape its sizes give, each moment in its
/// `state_dtype` and no larger than a weight, each step count a U64
/// scalar, the history `(step, 4)`, and every other tensor no larger than
/// the sizes allow. A file whose header says otherwise (a tensor of
/// another dtype, or of billions of rows under metadata of hundreds) is
/// refused naming the tensor, not read.
pub(crate) fn check_header(ck: &Checkpoint) -> Result<()> {
    let v: usize = ck.meta_parse("vocab_size")?;
    let l: usize = ck.meta_parse("n_languages")?;
    let d: usize = ck.meta_parse("dim")?;
    let step: u64 = ck.meta_parse("step")?;
    let (dtype, state) = kept_dtypes(ck)?;
    // The split rows: as many as the index has, at most one a pair.
    let index = "split_vocabulary.token_index";
    let n = match ck.shape(index)? {
        &[n] if n <= v.saturating_mul(l) => n,
        other => {
            return Err(Error::shape(
                "tensor",
                format!(
                    "(n,) with n ≤ {} (vocab_size × n_languages)",
                    v.saturating_mul(l)
                ),
                other,
            )
            .in_file(ck.path())
            .in_array(index));
        }
    };
    let kept = dtype.safetensors_dtype();
    for (name, shape) in [
        ("token_embedding.vocab.weight", vec![v, d]),
        ("lm_head.vocab.weight", vec![v, d]),
        ("split_vocabulary.rows", vec![n, d]),
    ] {
        ck.expect(name, kept, &shape)?;
    }
    if ck.names().contains(&"split_vocabulary.gate_logit") {
        ck.expect("split_vocabulary.gate_logit", kept, &[n])?;
    }
    for name in [index, "split_vocabulary.language_index"] {
        ck.expect(name, safetensors::Dtype::I64, &[n])?;
    }
    let steps = usize::try_from(step).unwrap_or(usize::MAX);
    ck.expect(super::HISTORY, safetensors::Dtype::F64, &[steps, 4])?;
    // No tensor larger than the largest the sizes give (a run's records:
    // its rows' evaluation (n, 7), its languages' (L, 3), its held-out
    // curve, at most one entry a step and two more, (k, 3)).
    let largest = [
        v.saturating_mul(d),
        n.saturating_mul(d.max(7)),
        steps.saturating_mul(4),
        steps.saturating_add(2).saturating_mul(3),
        l.saturating_mul(3),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    for name in ck.names() {
        if name.starts_with(crate::checkpoint::OPTIMIZER) {
            if name.ends_with(".step") {
                ck.expect(name, safetensors::Dtype::U64, &[])?;
                continue;
            }
            ck.expect(name, state.safetensors_dtype(), ck.shape(name)?)?;
        }
        let elements = ck
            .shape(name)?
            .iter()
            .try_fold(1usize, |a, &x| a.checked_mul(x));
        if elements.is_none_or(|e| e > largest) {
            return Err(ck.error(
                name,
                ErrorKind::Format {
                    message: format!(
                        "has shape {:?}, larger than any tensor of the run its metadata describes \
                         (vocab_size {v}, dim {d}, {n} split rows, step {step}: at most {largest} elements)",
                        ck.shape(name)?
                    ),
                },
            ));
        }
    }
    Ok(())
}

/// Checks that every optimiser step count of a checkpoint of
/// [`Trainer::save`](super::Trainer::save) is the run's step (every
/// parameter is updated at every step).
pub(crate) fn check_steps(snap: &Snapshot, step: u64) -> Result<()> {
    for (name, _) in snap.state.iter() {
        if name.starts_with(crate::checkpoint::OPTIMIZER) && name.ends_with(".step") {
            let theirs = snap.state.step(name)?;
            if theirs != step {
                let e = Error::format(format!(
                    "an optimiser's step count of {theirs}, where the run's metadata says step {step}"
                ));
                return Err(snap.state.locate(e, name));
            }
        }
    }
    Ok(())
}

/// Reads the model of a checkpoint written by [`Trainer::save`](super::Trainer::save) (no corpus
/// needed): sizes from the metadata, the index and every weight checked.
pub fn load_model<T: Real>(path: impl AsRef<Path>) -> Result<SavedModel<T>> {
    let path = path.as_ref();
    // The model's memory from the metadata, then the header held to the
    // metadata, before any tensor is read.
    let snap = Snapshot::read_checked(path, |ck| {
        let dtype = match kept_dtypes(ck)?.0 {
            d if d.is_half() => Some(d),
            _ => None,
        };
        let n_rows = match ck.shape("split_vocabulary.token_index") {
            Ok(&[n]) => n,
            _ => 0,
        };
        crate::app::plan::Plan {
            vocab_size: ck.meta_parse("vocab_size")?,
            vocab_source: "the checkpoint's metadata".into(),
            n_languages: ck.meta_parse("n_languages")?,
            languages_source: "the checkpoint's metadata".into(),
            dim: ck.meta_parse("dim")?,
            n_rows,
            real_bytes: std::mem::size_of::<T>(),
            param_dtype: dtype,
            action: "loading",
            ..Default::default()
        }
        .check("")
        .map_err(|e| e.in_file(path))?;
        check_header(ck)
    })?;
    let config = ModelConfig {
        vocab_size: snap.meta_parse("vocab_size")?,
        n_languages: snap.meta_parse("n_languages")?,
        dim: snap.meta_parse("dim")?,
        gate_init: snap.meta_parse("gate_init")?,
    };
    let index = index_of(&snap.state)?;
    // The parameters are kept as the checkpoint keeps them (bf16 or f16
    // tensors for a run of `--dtype bf16` or `f16`).
    let dtype = match snap.metadata.get("dtype").map(String::as_str) {
        Some(d @ ("bf16" | "f16")) => d.parse::<Dtype>().ok(),
        _ => None,
    };
    let mut model = BigramModel::new(config, index).map_err(|e| e.in_file(path))?;
    // Kept as the metadata says (the header was held to it).
    if let Some(kept) = dtype {
        for p in model.parameters_mut() {
            p.set_dtype(kept).map_err(|e| e.in_file(path))?;
        }
    }
    let rest = snap.restore(&mut [&mut model], None)?;
    let state_bytes = snap
        .state
        .iter()
        .filter(|(name, _)| name.starts_with(crate::checkpoint::OPTIMIZER))
        .map(|(_, t)| tensor_bytes(t))
        .sum();
    let step: u64 = snap.meta_parse("step")?;
    check_steps(&snap, step)?;
    let history = history_from(&rest, step)?;
    let (labels, heldout_curve, evaluation) =
        record_from(&snap, &rest, model.split.n_rows(), config.n_languages)?;
    Ok(SavedModel {
        model,
        metadata: snap.metadata,
        history,
        labels,
        heldout_curve,
        evaluation,
        state_bytes,
    })
}

/// The split vocabulary's index stored in a checkpoint (with its `score`
/// when there is one).
pub fn index_of(state: &crate::state::StateDict) -> Result<SplitIndex> {
    let name = "split_vocabulary.token_index";
    let n = match state.get(name) {
        Some(t) => t.shape().first().copied().unwrap_or(0),
        None => return Err(state.error(name, ErrorKind::Missing)),
    };
    let ids = |name: &str| -> Result<Vec<usize>> {
        state
            .i64s(name, &[n])?
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                usize::try_from(x).map_err(|_| {
                    let e = Error::out_of_range("index entry", vec![i], x, 0, i64::MAX);
                    state.locate(e, name)
                })
            })
            .collect()
    };
    let mut index = SplitIndex::new(
        ids("split_vocabulary.language_index")?,
        ids("split_vocabulary.token_index")?,
    );
    if state.contains("split_vocabulary.score") {
        index.score = Some(
            state
                .real::<f64>("split_vocabulary.score", &[n])?
                .iter()
                .copied()
                .collect(),
        );
    }
    Ok(index)
}
