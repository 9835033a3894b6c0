//! Checkpoints of modules and optimisers in one call, by name.
//!
//! [`save_state`] writes the state of any set of [`Module`]s, an optimiser
//! (under `optimizer.`), any extra tensors and string metadata to one
//! safetensors file, atomically. [`Snapshot::read`] reads one back;
//! [`Snapshot::restore`] checks every tensor of every module and of the
//! optimiser (names, dtypes, shapes, finiteness, second moments ≥ 0, the
//! index of a split vocabulary) before it changes anything, then loads
//! them. [`load_state`] is both in one call.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::{Checkpoint, save};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::Real;
use crate::optim::{Optimizer, StateRef};
use crate::param::Parameter;
use crate::state::{Module, StateDict, TensorRef};

/// The prefix of the optimiser's entries in a checkpoint.
pub const OPTIMIZER: &str = "optimizer.";

/// Writes the state of `modules`, of `optimizer` (its entries under
/// [`OPTIMIZER`]), the `extra` tensors and `metadata` to `path`,
/// atomically: the previous file stays intact if anything fails. Two
/// tensors of one name are an error.
///
/// ```
/// use std::collections::BTreeMap;
/// use splitgrad::checkpoint::{load_state, save_state};
/// use splitgrad::layers::{SplitLanguageModellingHead, SplitTokenEmbeddings};
/// use splitgrad::optim::{Adam, AdamConfig};
/// use splitgrad::prelude::*;
/// # fn main() -> splitgrad::Result<()> {
/// # let path = std::env::temp_dir().join(format!("splitgrad-doc-state-{}.safetensors", std::process::id()));
/// let mut emb = SplitTokenEmbeddings::<f32>::new(&[("orig", 6)], &["orig"], 4)?;
/// let mut head = SplitLanguageModellingHead::<f32>::new(&[("orig", 6)], &["orig"], 4)?;
/// emb.reset_parameters(&mut Rng::new(0));
/// head.reset_parameters(&mut Rng::new(1));
/// let opt = Adam::<f32>::new(AdamConfig::default())?;
/// save_state(&path, &[&emb, &head], Some(&opt), &[], &BTreeMap::new())?;
///
/// let mut emb2 = SplitTokenEmbeddings::<f32>::new(&[("orig", 6)], &["orig"], 4)?;
/// let mut head2 = SplitLanguageModellingHead::<f32>::new(&[("orig", 6)], &["orig"], 4)?;
/// let mut opt2 = Adam::<f32>::new(AdamConfig::default())?;
/// load_state(&path, &mut [&mut emb2, &mut head2], Some(&mut opt2))?;
/// assert_eq!(emb2.state_dict(), emb.state_dict());
/// assert_eq!(head2.state_dict(), head.state_dict());
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub fn save_state<T: Real>(
    path: impl AsRef<Path>,
    modules: &[&dyn Module<T>],
    optimizer: Option<&dyn Optimizer<T>>,
    extra: &[(String, TensorRef<'_>)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    // The optimiser's arrays borrowed where it lends them, else a copy.
    let lent = optimizer.and_then(|o| o.state_refs());
    let opt_state = optimizer.filter(|_| lent.is_none()).map(|o| o.state_dict());
    let mut steps: Vec<(String, ndarray::ArrayD<u64>)> = Vec::new();
    let mut lent_arrays: Vec<(String, TensorRef<'_>)> = Vec::new();
    for (n, v) in lent.iter().flatten() {
        let name = format!("{OPTIMIZER}{n}");
        match v {
            StateRef::Step(s) => steps.push((name, ndarray::arr0(*s).into_dyn())),
            StateRef::Array(a) => lent_arrays.push((name, TensorRef::from_stored(a.clone()))),
        }
    }
    let held: Vec<Vec<(String, TensorRef<'_>)>> = modules.iter().map(|m| m.state_refs()).collect();
    // Views are invariant in their lifetime: reborrow every one for this call.
    let mut entries: Vec<(&str, TensorRef<'_>)> = Vec::new();
    for refs in &held {
        entries.extend(refs.iter().map(|(n, t)| (n.as_str(), t.reborrow())));
    }
    let opt_names: Vec<(String, TensorRef<'_>)> = opt_state
        .iter()
        .flat_map(|sd| {
            sd.iter()
                .map(|(n, t)| (format!("{OPTIMIZER}{n}"), t.view()))
        })
        .collect();
    entries.extend(opt_names.iter().map(|(n, t)| (n.as_str(), t.reborrow())));
    entries.extend(lent_arrays.iter().map(|(n, t)| (n.as_str(), t.reborrow())));
    // What the load refuses is refused here, before anything is written: a
    // checkpoint keeps finite parameters and moments only (the `extra`
    // tensors are the caller's, loaded back unchecked).
    for (name, t) in &entries {
        if let Some((position, value)) = t.first_non_finite() {
            let e = Error::config(format!(
                "holds the non-finite value {value} at position {}; a checkpoint keeps finite \
                 values only (its load refuses others), so nothing was written",
                crate::error::fmt_position(&position)
            ));
            return Err(e.in_file(path.as_ref()).in_array(*name));
        }
    }
    entries.extend(steps.iter().map(|(n, t)| (n.as_str(), t.into())));
    entries.extend(extra.iter().map(|(n, t)| (n.as_str(), t.reborrow())));
    save(path, &entries, metadata)
}

/// Value `key` of `metadata` (of `file`), or an error naming the key and
/// the file.
pub(super) fn meta_in<'a>(
    metadata: &'a BTreeMap<String, String>,
    file: Option<&Path>,
    key: &str,
) -> Result<&'a str> {
    metadata.get(key).map(String::as_str).ok_or_else(|| {
        let e = Error::new(ErrorKind::Missing).in_array(format!("metadata `{key}`"));
        match file {
            Some(p) => e.in_file(p),
            None => e,
        }
    })
}

/// [`meta_in`], parsed; an error names the key, the value and the file.
pub(super) fn meta_parse_in<V: std::str::FromStr>(
    metadata: &BTreeMap<String, String>,
    file: Option<&Path>,
    key: &str,
) -> Result<V> {
    let raw = meta_in(metadata, file, key)?;
    raw.parse().map_err(|_| {
        let e = Error::format(format!("metadata `{key}` = {raw:?} does not parse"));
        match file {
            Some(p) => e.in_file(p),
            None => e,
        }
    })
}

/// A checkpoint read back: every tensor, decoded, and the metadata.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Every tensor of the file (errors about them name the file).
    pub state: StateDict,
    /// The string metadata.
    pub metadata: BTreeMap<String, String>,
}

impl Snapshot {
    /// Reads and validates the file at `path` and decodes every tensor.
    pub fn read(path: impl AsRef<Path>) -> Result<Snapshot> {
        Self::read_checked(path, |_| Ok(()))
    }

    /// [`Self::read`], with `check` run on the opened file (its header and
    /// metadata, no tensor read yet) before any tensor is decoded: where a
    /// reader knows from the metadata what each tensor must be, a file
    /// whose header says otherwise is refused before its bytes are read.
    pub fn read_checked(
        path: impl AsRef<Path>,
        check: impl FnOnce(&Checkpoint) -> Result<()>,
    ) -> Result<Snapshot> {
        let path = path.as_ref();
        let ck = Checkpoint::open(path)?;
        check(&ck)?;
        let mut state = StateDict::from_file(path);
        for name in ck.names() {
            state.insert(name, ck.get(name)?);
        }
        Ok(Snapshot {
            state,
            metadata: ck.metadata().clone(),
        })
    }

    /// A metadata value, or an error naming the key and the file.
    pub fn meta(&self, key: &str) -> Result<&str> {
        meta_in(&self.metadata, self.state.source(), key)
    }

    /// A metadata value parsed, or an error naming the key, the value and
    /// the file.
    pub fn meta_parse<V: std::str::FromStr>(&self, key: &str) -> Result<V> {
        meta_parse_in(&self.metadata, self.state.source(), key)
    }

    /// Loads `modules` and, when given, `optimizer` from this checkpoint.
    /// Every tensor is checked first — each module's
    /// ([`Module::check_state_dict`]) and the optimiser's (dtypes,
    /// finiteness, second moments ≥ 0, one state per parameter of the
    /// modules, shapes) — so on an error nothing is changed. Returns the
    /// tensors that belong to none of them (a run's history, say).
    pub fn restore<T: Real>(
        &self,
        modules: &mut [&mut dyn Module<T>],
        optimizer: Option<&mut dyn Optimizer<T>>,
    ) -> Result<StateDict> {
        let mut claimed: BTreeSet<String> = BTreeSet::new();
        for m in modules.iter() {
            m.check_state_dict(&self.state)?;
            claimed.extend(m.state_refs().into_iter().map(|(n, _)| n));
        }
        if let Some(opt) = optimizer {
            let sub = self.state.prefixed(OPTIMIZER);
            let params: Vec<&Parameter<T>> = modules.iter().flat_map(|m| m.parameters()).collect();
            opt.load_state_dict(&sub, &params)
                .map_err(|e| e.prefix_array(OPTIMIZER))?;
            claimed.extend(sub.names().map(|n| format!("{OPTIMIZER}{n}")));
        }
        for m in modules.iter_mut() {
            m.load_state_dict(&self.state)?;
        }
        let mut rest = StateDict::new();
        if let Some(p) = self.state.source() {
            rest = StateDict::from_file(p);
        }
        for (name, t) in self.state.iter() {
            if !claimed.contains(name) {
                rest.insert(name, t.clone());
            }
        }
        Ok(rest)
    }
}

/// [`Snapshot::read`] then [`Snapshot::restore`]: loads modules and an
/// optimiser saved by [`save_state`] in one call, and returns the
/// snapshot's metadata and the tensors that belong to none of them.
pub fn load_state<T: Real>(
    path: impl AsRef<Path>,
    modules: &mut [&mut dyn Module<T>],
    optimizer: Option<&mut dyn Optimizer<T>>,
) -> Result<(BTreeMap<String, String>, StateDict)> {
    let snap = Snapshot::read(path)?;
    let rest = snap.restore(modules, optimizer)?;
    Ok((snap.metadata, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;
    use crate::layers::SplitTokenEmbeddings;
    use crate::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, ParamGroups, Sgd, SgdConfig};
    use crate::param::{Dtype, ParamGrad};

    /// The file of `save_state` written from the optimiser's state as
    /// copied (`state_dict`), the way it is written when it is not lent.
    fn copied_file(
        path: &Path,
        module: &dyn Module<f32>,
        optimizer: &dyn Optimizer<f32>,
    ) -> Vec<u8> {
        let sd = optimizer.state_dict();
        let names: Vec<(String, TensorRef<'_>)> = sd
            .iter()
            .map(|(n, t)| (format!("{OPTIMIZER}{n}"), t.view()))
            .collect();
        let held = module.state_refs();
        let mut entries: Vec<(&str, TensorRef<'_>)> = held
            .iter()
            .map(|(n, t)| (n.as_str(), t.reborrow()))
            .collect();
        entries.extend(names.iter().map(|(n, t)| (n.as_str(), t.reborrow())));
        save(path, &entries, &BTreeMap::new()).unwrap();
        std::fs::read(path).unwrap()
    }

    #[test]
    fn a_lent_optimizer_state_writes_the_same_file_as_its_copy() {
        let dir = std::env::temp_dir().join(format!("splitgrad-snapshot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut emb =
            SplitTokenEmbeddings::<f32>::new(&[("a", 5), ("b", 3)], &["a", "b"], 4).unwrap();
        emb.reset_parameters(&mut Rng::new(3));
        let g =
            ndarray::Array2::from_shape_fn((5, 4), |(i, j)| (i + 2 * j) as f32 * 0.1).into_dyn();
        let mut bf16_state = Adam::<f32>::new(AdamConfig::default()).unwrap();
        bf16_state.set_state_dtype(Dtype::BF16).unwrap();
        let groups = ParamGroups::new().group(
            "all",
            |_: &str| true,
            LazyAdam::<f32>::new(LazyAdamConfig::default()).unwrap(),
        );
        let opts: Vec<Box<dyn Optimizer<f32>>> = vec![
            Box::new(Adam::<f32>::new(AdamConfig::default()).unwrap()),
            Box::new(bf16_state),
            Box::new(LazyAdam::<f32>::new(LazyAdamConfig::default()).unwrap()),
            Box::new(Sgd::<f32>::new(SgdConfig::default()).unwrap()),
            Box::new(
                Sgd::<f32>::new(SgdConfig {
                    momentum: 0.9,
                    ..SgdConfig::default()
                })
                .unwrap(),
            ),
            Box::new(groups),
        ];
        for (i, mut opt) in opts.into_iter().enumerate() {
            let p = &mut emb.parameters_mut()[0];
            opt.update(p, &ParamGrad::Dense(g.clone())).unwrap();
            opt.update(p, &ParamGrad::Dense(g.clone())).unwrap();
            let lent = dir.join(format!("lent-{i}.safetensors"));
            save_state(&lent, &[&emb], Some(opt.as_ref()), &[], &BTreeMap::new()).unwrap();
            let copied = copied_file(
                &dir.join(format!("copied-{i}.safetensors")),
                &emb,
                opt.as_ref(),
            );
            assert_eq!(std::fs::read(&lent).unwrap(), copied, "optimiser {i}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_non_finite_parameter_or_moment_is_refused_before_anything_is_written() {
        let dir = crate::checkpoint::test_dir("nonfinite");
        let path = dir.join("run.safetensors");
        std::fs::write(&path, b"the previous checkpoint").unwrap();
        for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
            let mut emb = SplitTokenEmbeddings::<f32>::new(&[("a", 5)], &["a"], 4).unwrap();
            emb.reset_parameters(&mut Rng::new(3));
            emb.parameters_mut()[0]
                .stored_mut()
                .set_dtype(dtype)
                .unwrap();
            let mut w = emb.parameters()[0].stored().widened().into_owned();
            w[[3, 1]] = f32::INFINITY;
            emb.parameters_mut()[0].stored_mut().assign(w.view());
            let err = save_state(&path, &[&emb], None, &[], &BTreeMap::new()).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("token_embedding.a.weight"), "{msg}");
            assert!(msg.contains("inf at position [3, 1]"), "{msg}");
            assert!(msg.contains("nothing was written"), "{msg}");
            assert_eq!(std::fs::read(&path).unwrap(), b"the previous checkpoint");
        }
        // A moment: Adam's first moment after a step on an infinite gradient.
        let mut emb = SplitTokenEmbeddings::<f32>::new(&[("a", 5)], &["a"], 4).unwrap();
        let mut opt = Adam::<f32>::new(AdamConfig::default()).unwrap();
        let mut g = ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[5, 4]));
        g[[0, 0]] = f32::MAX;
        let p = &mut emb.parameters_mut()[0];
        opt.update(p, &ParamGrad::Dense(g.clone())).unwrap();
        opt.update(p, &ParamGrad::Dense(g)).unwrap();
        // (g² overflows f32: the second moment holds an infinity.)
        let sd = opt.state_dict();
        assert!(
            sd.iter()
                .any(|(_, t)| t.view().first_non_finite().is_some())
        );
        let err = save_state(&path, &[], Some(&opt), &[], &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("optimizer."), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"the previous checkpoint");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
