//! Checkpoints (`save_checkpoint`, `load_checkpoint`: the layers' and an
//! optimiser's state in one safetensors file) and golden vectors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use pyo3::types::{PyAny, PyBytes, PyDict};
use splitgrad::Rng;
use splitgrad::app::golden::{self, CaseDtype, Layer};
use splitgrad::checkpoint::{load_state, save_state};
use splitgrad::optim::Optimizer;
use splitgrad::param::Dtype as StorageDtype;
use splitgrad::state::{Module, StateDict, TensorRef};

use crate::convert::{Dtype, OrRaise, PyReal, state_from_py, state_to_py};
use crate::layer::{ByDtype, LayerRef, layers_of, lock_layers, typed};
use crate::optim::{Boxed, PyOptimizer};

fn metadata_of(obj: Option<&Bound<'_, PyAny>>) -> PyResult<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if let Some(d) = obj {
        for item in d.call_method0("items")?.try_iter()? {
            let (k, v): (String, Bound<'_, PyAny>) = item?.extract()?;
            out.insert(k, v.str()?.to_string());
        }
    }
    Ok(out)
}

/// Writes the state of `modules`, of `optimizer` (under `optimizer.`),
/// the `extra` arrays and string `metadata` to one safetensors file,
/// atomically.
#[pyfunction]
#[pyo3(signature = (path, modules, optimizer = None, metadata = None, extra = None))]
pub fn save_checkpoint(
    path: PathBuf,
    modules: &Bound<'_, PyAny>,
    optimizer: Option<PyRef<'_, PyOptimizer>>,
    metadata: Option<&Bound<'_, PyAny>>,
    extra: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let objs = layers_of(modules)?;
    let meta = metadata_of(metadata)?;
    let extra_sd = match extra {
        Some(e) => state_from_py(e)?,
        None => StateDict::new(),
    };
    let extra_refs: Vec<(String, TensorRef<'_>)> = extra_sd
        .iter()
        .map(|(n, t)| (n.to_string(), t.view()))
        .collect();
    let dt = match (&optimizer, objs.first()) {
        (Some(o), _) => o.dtype(),
        (None, Some(m)) => m.dtype(),
        (None, None) => Dtype::F32,
    };
    // The optimiser first, then the layers (`crate::sync`).
    let py = modules.py();
    let opt = optimizer.as_ref().map(|o| o.write(py)).transpose()?;
    let opt = opt.as_deref();
    let mut mods = lock_layers(py, &objs)?;
    match dt {
        Dtype::F32 => save_typed::<f32>(&path, &mut mods, dt, opt, &extra_refs, &meta),
        Dtype::F64 => save_typed::<f64>(&path, &mut mods, dt, opt, &extra_refs, &meta),
    }
}

/// `save_checkpoint` for the real type `dt` (the optimiser's, checked).
fn save_typed<T: PyReal>(
    path: &Path,
    layers: &mut [LayerRef<'_>],
    dt: Dtype,
    optimizer: Option<&ByDtype<Boxed<f32>, Boxed<f64>>>,
    extra: &[(String, TensorRef<'_>)],
    meta: &BTreeMap<String, String>,
) -> PyResult<()> {
    let ms = typed::<T>(layers, dt)?;
    let refs: Vec<&dyn Module<T>> = ms.iter().map(|m| &**m as &dyn Module<T>).collect();
    let opt = optimizer.map(|o| {
        let b = o.get::<Boxed<T>>().expect("dtype checked");
        b.as_ref() as &dyn Optimizer<T>
    });
    save_state(path, &refs, opt, extra, meta).or_raise()
}

/// Loads `modules` and `optimizer` saved by `save_checkpoint`, checking
/// every tensor before anything changes: `(metadata, other tensors)`.
#[pyfunction]
#[pyo3(signature = (path, modules, optimizer = None))]
pub fn load_checkpoint<'py>(
    py: Python<'py>,
    path: PathBuf,
    modules: &Bound<'py, PyAny>,
    optimizer: Option<PyRef<'py, PyOptimizer>>,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyDict>)> {
    let objs = layers_of(modules)?;
    let dt = match (&optimizer, objs.first()) {
        (Some(o), _) => o.dtype(),
        (None, Some(m)) => m.dtype(),
        (None, None) => Dtype::F32,
    };
    // The optimiser first, then the layers (`crate::sync`).
    let mut opt = optimizer.as_ref().map(|o| o.write(py)).transpose()?;
    let opt = opt.as_deref_mut();
    let mut mods = lock_layers(py, &objs)?;
    let (meta, rest) = match dt {
        Dtype::F32 => load_typed::<f32>(&path, &mut mods, dt, opt)?,
        Dtype::F64 => load_typed::<f64>(&path, &mut mods, dt, opt)?,
    };
    let m = PyDict::new(py);
    for (k, v) in meta {
        m.set_item(k, v)?;
    }
    Ok((m, state_to_py(py, rest)?))
}

fn layer_of(name: &str) -> PyResult<Layer> {
    name.parse::<Layer>().or_raise()
}

/// Evaluates one golden case (the bytes of its `.npz`) and returns the
/// results as `.npz` bytes; `label` names the case in errors.
#[pyfunction]
#[pyo3(signature = (layer, case, label = "case.npz"))]
pub fn golden_evaluate<'py>(
    py: Python<'py>,
    layer: &str,
    case: Vec<u8>,
    label: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let layer = layer_of(layer)?;
    let out = py
        .detach(|| golden::evaluate_bytes(layer, label, case))
        .or_raise()?;
    Ok(PyBytes::new(py, &out))
}

/// A random golden case of `layer` (inputs and results) as `.npz` bytes.
#[pyfunction]
#[pyo3(signature = (layer, seed, dtype = None))]
pub fn golden_generate<'py>(
    py: Python<'py>,
    layer: &str,
    seed: u64,
    dtype: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let layer = layer_of(layer)?;
    let dt = match dtype {
        None => CaseDtype::F64,
        Some(d) => match crate::params::storage_dtype(d)? {
            StorageDtype::F32 => CaseDtype::F32,
            StorageDtype::F64 => CaseDtype::F64,
            StorageDtype::BF16 => CaseDtype::BF16,
            StorageDtype::F16 => CaseDtype::F16,
        },
    };
    let out = golden::generate_case(layer, &mut Rng::new(seed), dt);
    Ok(PyBytes::new(py, &out))
}

/// `splitgrad golden eval`: every case under `inputs` evaluated into
/// `out`; returns `{"ok": [names], "failed": [(name, message)]}`.
#[pyfunction]
pub fn golden_evaluate_dir<'py>(
    py: Python<'py>,
    inputs: PathBuf,
    out: PathBuf,
) -> PyResult<Bound<'py, PyDict>> {
    let summary = py
        .detach(|| golden::evaluate_dir(&inputs, &out))
        .or_raise()?;
    let d = PyDict::new(py);
    let ok: Vec<String> = summary
        .ok
        .iter()
        .map(|c| format!("{}/{}", c.layer.name(), c.name))
        .collect();
    let failed: Vec<(String, String)> = summary
        .failed
        .iter()
        .map(|c| {
            (
                format!("{}/{}", c.layer.name(), c.name),
                c.error.to_string(),
            )
        })
        .collect();
    d.set_item("ok", ok)?;
    d.set_item("failed", failed)?;
    Ok(d)
}

/// `load_checkpoint` for the real type `dt` (the optimiser's, checked):
/// `(metadata, other tensors)`.
fn load_typed<T: PyReal>(
    path: &Path,
    layers: &mut [LayerRef<'_>],
    dt: Dtype,
    optimizer: Option<&mut ByDtype<Boxed<f32>, Boxed<f64>>>,
) -> PyResult<(BTreeMap<String, String>, StateDict)> {
    let mut ms = typed::<T>(layers, dt)?;
    let opt = optimizer.map(|o| {
        let b = o.get_mut::<Boxed<T>>().expect("dtype checked");
        b.as_mut() as &mut dyn Optimizer<T>
    });
    load_state(path, &mut ms, opt).or_raise()
}
