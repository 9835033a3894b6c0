//! Golden vectors (`docs/spec.md#4-golden-vectors`): conformance cases that other implementations
//! of the three layers (a GPU kernel, a PyTorch port) check themselves
//! against.
//!
//! A case is one `.npz` file in a folder named after its layer:
//! `DIR/split-embeddings/NAME.npz`, `DIR/split-vocabulary/NAME.npz`,
//! `DIR/lm-head/NAME.npz`. [`generate`] writes random cases holding the
//! inputs followed by the results; [`evaluate_dir`] reads every case under
//! a folder, whatever wrote it, and writes `OUT/<layer>/NAME.npz` with the
//! results alone. [`fuzz`] runs another implementation on generated cases,
//! compares its answers and shrinks a case that differs to a minimal one.
//! `docs/golden.md` explains how to test another implementation with them.
//!
//! # File format
//!
//! Scalars are 0-d arrays. Ids are `int64` (any integer dtype is read).
//! Reals are `float64`, or `float32` for a case generated with
//! `--dtype f32`; every real array of a case has the same dtype, and the
//! results are computed and written in it. Arrays a layer does not read
//! (such as the results in a generated case) are ignored.
//!
//! A half-precision case ([`CaseDtype::BF16`], [`CaseDtype::F16`]) holds
//! its layer's parameters, activations and real scalars in bf16 (a
//! `uint16` array of the bits: numpy has no bfloat16) or f16 (`float16`).
//! It is computed in f32 on the widened values: the layer's output (`out`,
//! or the head's `loss`) is written in the half type, rounded once to
//! nearest; every other result in `float32`, exactly those of the f32 case
//! holding the widened values.
//!
//! The scalar loss of a case is the sum of the layer's output times
//! `upstream`, plus the weighted penalties where listed; the gradients are
//! those of that loss.
//!
//! | layer | inputs | results |
//! |---|---|---|
//! | `split-embeddings` | `split_sizes` (S), `split_trainable` (S, uint8), `weight_<k>` (size_k, H) for k in 0..S, `input_ids` (any shape), `upstream` (ids shape + H) | `out`, `grad_weight_<k>` for each trainable split (dense, zeros for untouched rows) |
//! | `split-vocabulary` | `vocab_size`, `n_languages`, `language_index`, `token_index`, `rows`, `gate_logit`, `token_ids` (N), `language_ids` (N), `shared` (N, D), `upstream` (N, D), `use_gate` (0/1), `penalty_weight`, `fusion_weight` | `out`, `penalty`, `fusion_penalty`, `loss`, `grad_shared`, `grad_rows`, `grad_gate_logit` |
//! | `lm-head` | `split_sizes`, `weight_<k>`, `hidden` (…, H), `labels` (…), `upstream` (…) | `loss` (per token, labels' shape), `grad_hidden`, `grad_weight_<k>` |
//!
//! In detail:
//!
//! - `split-embeddings`: split k is named `s<k>` and owns global ids
//!   `[start_k, start_k + size_k)`; `split_trainable[k]` is 0 (frozen) or
//!   1; H is the width of `weight_0` and at least 1. `out = embed(input_ids)`,
//!   shape `input_ids.shape + (H,)`; loss `Σ out ⊙ upstream`. A trainable
//!   split gets `grad_weight_<k>` of shape (size_k, H) even if no id falls
//!   in it (then all zeros); a frozen split gets none.
//! - `split-vocabulary`: `vocab_size` V and `n_languages` L are 0-d
//!   integers ≥ 1; row i of `rows` (n_rows, D) and `gate_logit` (n_rows)
//!   belongs to the pair `(language_index[i], token_index[i])`, as in
//!   `docs/spec.md#23-splitvocabulary` (no duplicate pair, no empty index). `use_gate` is a 0-d 0 or 1;
//!   `penalty_weight` and `fusion_weight` are 0-d reals. `out` (N, D) as
//!   `docs/spec.md#23-splitvocabulary`; `penalty = mean(σ(gate_logit))`, `fusion_penalty` as `docs/spec.md#23-splitvocabulary`
//!   (both 0-d); `loss = (Σ out ⊙ upstream + penalty_weight·penalty) +
//!   fusion_weight·fusion_penalty` (0-d); `rows` and `gate_logit` are
//!   parameters, `shared` an input.
//! - `lm-head`: splits as above, all trainable, the vocabulary not empty;
//!   `labels` has `hidden`'s shape without H, each label in `[0, V)` or
//!   −100. `loss` is the per-token cross-entropy (0 for −100); the scalar
//!   loss is `Σ loss ⊙ upstream`. Every split gets `grad_weight_<k>`, a
//!   split of size 0 a (0, H) array.
//!
//! # Errors and limits
//!
//! A malformed case is an [`Error`] naming the case file and the array: a
//! missing array ([`ErrorKind::Missing`]), a wrong shape
//! ([`ErrorKind::Shape`]), a real array of another dtype than the case's
//! ([`ErrorKind::Dtype`]), an id, label, size or flag out of range
//! ([`ErrorKind::OutOfRange`]), a NaN or infinity ([`ErrorKind::NonFinite`]),
//! an index that `docs/spec.md#23-splitvocabulary` rejects (empty, duplicate pair), a file that is
//! not an npz ([`ErrorKind::Format`]). No input makes evaluation panic.
//!
//! So that a hostile file cannot ask for unbounded memory or time, shapes
//! are checked from the arrays' headers before any data is read, and a case
//! is rejected when its arrays hold more than [`MAX_CASE_ELEMENTS`]
//! elements in all (or one axis is longer than that), when `n_languages ·
//! vocab_size` exceeds [`MAX_PAIR_CELLS`], or when an `lm-head` case needs
//! more than [`MAX_HEAD_WORK`] multiply-adds per pass (N · V · H).
//!
//! # Precision
//!
//! Results are what splitgrad computes, rounded as it rounds; compare with
//! a tolerance (`docs/golden.md` recommends one per dtype). In float32
//! `lm-head` cases with logits in the thousands, the log-sum-exp carries
//! the rounding step of the largest logit, so the loss and gradients of a
//! token whose label has nearly all the probability are only accurate to
//! that step.

mod case;
mod dtype;
mod embeddings;
mod fuzz;
mod head;
mod vocabulary;

use std::fmt;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use ndarray::{ArrayD, IxDyn};

use crate::io::{NpyElement, NpzWriter, write_atomic};
use crate::{Error, ErrorKind, Real, Result, Rng};
use case::Case;
pub use dtype::CaseDtype;
use dtype::Inputs;
pub use fuzz::{Difference, Event, Finding, FuzzConfig, FuzzOutcome, fuzz};

/// At most this many elements in all the arrays of a case that evaluation
/// reads (2²⁴), and along any one axis.
pub const MAX_CASE_ELEMENTS: usize = 1 << 24;

/// At most this many (language, token) cells, `n_languages · vocab_size`,
/// in a `split-vocabulary` case (2³²).
pub const MAX_PAIR_CELLS: u64 = 1 << 32;

/// At most this many multiply-adds, `N · V · H`, in one pass of an
/// `lm-head` case (2³⁶).
pub const MAX_HEAD_WORK: u64 = 1 << 36;

/// The layer a case exercises; its [`name`](Self::name) is the case's folder.
///
/// ```
/// use splitgrad::app::golden::Layer;
/// let layer: Layer = "lm-head".parse()?;
/// assert_eq!(layer, Layer::LmHead);
/// assert_eq!(Layer::SplitVocabulary.name(), "split-vocabulary");
/// let e = "embeddings".parse::<Layer>().unwrap_err();
/// assert!(e.to_string().contains("split-embeddings, split-vocabulary or lm-head"));
/// # Ok::<(), splitgrad::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    /// `split-embeddings`: [`SplitTokenEmbeddings`](crate::layers::SplitTokenEmbeddings).
    SplitEmbeddings,
    /// `split-vocabulary`: [`SplitVocabulary`](crate::layers::SplitVocabulary).
    SplitVocabulary,
    /// `lm-head`: [`SplitLanguageModellingHead`](crate::layers::SplitLanguageModellingHead).
    LmHead,
}

impl Layer {
    /// The three layers, in the order [`evaluate_dir`] visits their folders.
    pub const ALL: [Layer; 3] = [
        Layer::SplitEmbeddings,
        Layer::SplitVocabulary,
        Layer::LmHead,
    ];

    /// `"split-embeddings"`, `"split-vocabulary"` or `"lm-head"`: the
    /// name of the folder of its cases.
    pub fn name(self) -> &'static str {
        match self {
            Layer::SplitEmbeddings => "split-embeddings",
            Layer::SplitVocabulary => "split-vocabulary",
            Layer::LmHead => "lm-head",
        }
    }

    /// The layer's output: the result a half-precision case holds in its
    /// half type (the others are gradients and penalties, in f32).
    fn output(self) -> &'static str {
        match self {
            Layer::SplitEmbeddings | Layer::SplitVocabulary => "out",
            Layer::LmHead => "loss",
        }
    }

    /// The real array whose dtype is the case's real dtype.
    fn anchor(self) -> &'static str {
        match self {
            Layer::SplitEmbeddings => "upstream",
            Layer::SplitVocabulary => "shared",
            Layer::LmHead => "hidden",
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Layer {
    type Err = Error;

    /// Parses a layer's [`name`](Layer::name); anything else is an
    /// [`ErrorKind::Config`] error naming the allowed values.
    fn from_str(s: &str) -> Result<Layer> {
        Layer::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| {
                Error::config(format!(
                    "unknown layer `{s}`: expected split-embeddings, split-vocabulary or lm-head"
                ))
            })
    }
}

/// Named result arrays, in the order they are written.
type Named<T> = Vec<(String, ArrayD<T>)>;

/// The results of a case in its real type.
enum Results {
    F32(Named<f32>),
    F64(Named<f64>),
    /// A bf16 or f16 case's results, computed in f32: the layer's output
    /// (`output`) already rounded to the half type, and written in it; the
    /// others written as f32.
    Half {
        dtype: CaseDtype,
        output: &'static str,
        named: Named<f32>,
    },
}

impl Results {
    fn add_to(&self, w: &mut NpzWriter) {
        fn add<T: NpyElement>(w: &mut NpzWriter, named: &Named<T>) {
            for (name, array) in named {
                w.add(name, array);
            }
        }
        match self {
            Results::F32(named) => add(w, named),
            Results::F64(named) => add(w, named),
            Results::Half {
                dtype,
                output,
                named,
            } => {
                for (name, array) in named {
                    if name == output {
                        // Exact: the values are the half type's already.
                        dtype.add_reals(w, name, &array.mapv(f64::from));
                    } else {
                        w.add(name, array);
                    }
                }
            }
        }
    }
}

/// Reads, validates and evaluates the case in `bytes`.
fn compute(layer: Layer, label: &Path, bytes: Vec<u8>) -> Result<Results> {
    let mut case = Case::open(label, bytes, layer.anchor())?;
    Ok(match case.dtype() {
        CaseDtype::F32 => Results::F32(compute_in::<f32>(layer, &mut case)?),
        CaseDtype::F64 => Results::F64(compute_in::<f64>(layer, &mut case)?),
        dtype @ (CaseDtype::BF16 | CaseDtype::F16) => {
            let output = layer.output();
            let mut named = compute_in::<f32>(layer, &mut case)?;
            for (name, array) in &mut named {
                if name == output {
                    array.mapv_inplace(|x| dtype.round(f64::from(x)) as f32);
                }
            }
            Results::Half {
                dtype,
                output,
                named,
            }
        }
    })
}

fn compute_in<T: Real>(layer: Layer, case: &mut Case) -> Result<Named<T>> {
    match layer {
        Layer::SplitEmbeddings => embeddings::evaluate(case),
        Layer::SplitVocabulary => vocabulary::evaluate(case),
        Layer::LmHead => head::evaluate(case),
    }
}

fn to_bytes(w: &NpzWriter) -> Result<Vec<u8>> {
    let mut out = Cursor::new(Vec::new());
    w.write_to(&mut out)?;
    Ok(out.into_inner())
}

/// Evaluates the case of `layer` held in `bytes` (an `.npz` archive) and
/// returns the `.npz` archive of its results (see the [module
/// docs](self) for the arrays). It computes in the dtype of the case's
/// real arrays.
///
/// `label` names the case in errors. Errors: anything malformed in the
/// case, each naming `label` and the array (see [Errors and
/// limits](self#errors-and-limits)). Never panics, whatever the bytes.
///
/// ```
/// use splitgrad::app::golden::{evaluate_bytes, generate_case, Layer};
/// use splitgrad::io::{NpzReader, RealDtype};
/// use splitgrad::Rng;
/// let case = generate_case(Layer::SplitEmbeddings, &mut Rng::new(1), RealDtype::F64);
/// let results = evaluate_bytes(Layer::SplitEmbeddings, "case.npz", case)?;
/// let r = NpzReader::from_bytes("results.npz", results)?;
/// assert!(r.contains("out"));
/// assert!(!r.contains("upstream")); // results only
///
/// let e = evaluate_bytes(Layer::LmHead, "junk.npz", b"junk".to_vec()).unwrap_err();
/// assert!(e.to_string().starts_with("junk.npz: not an npz file"));
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn evaluate_bytes(layer: Layer, label: &str, bytes: Vec<u8>) -> Result<Vec<u8>> {
    let results = compute(layer, Path::new(label), bytes)?;
    let mut w = NpzWriter::new(label);
    results.add_to(&mut w);
    to_bytes(&w)
}

/// `n` reals of this shape, each `scale`·N(0, 1).
fn random_reals(rng: &mut Rng, shape: &[usize], scale: f64) -> ArrayD<f64> {
    ArrayD::from_shape_simple_fn(IxDyn(shape), || scale * rng.normal())
}

/// Ids of this shape, uniform in `0..high` (`high` ≥ 1).
fn random_ids(rng: &mut Rng, shape: &[usize], high: usize) -> ArrayD<i64> {
    ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.below(high as u64) as i64)
}

/// 1 to 4 split sizes in 0..=6, about one in five 0, not all 0.
fn random_sizes(rng: &mut Rng) -> Vec<usize> {
    let n = 1 + rng.below(4) as usize;
    let mut sizes: Vec<usize> = (0..n)
        .map(|_| match rng.below(5) {
            0 => 0,
            _ => 1 + rng.below(6) as usize,
        })
        .collect();
    if sizes.iter().all(|&s| s == 0) {
        let k = rng.below(n as u64) as usize;
        sizes[k] = 1 + rng.below(6) as usize;
    }
    sizes
}

/// A random case of `layer` with reals of `dtype`, as `.npz` bytes: the
/// inputs, then the results that [`evaluate_bytes`] computes for them
/// (the same code path, on the inputs as written).
///
/// Shapes are small and varied. `split-embeddings`: 1 to 4 splits of
/// sizes 0 to 6 (some 0, not all), about one in four frozen, H in 1..=8,
/// ids of rank 1 to 3 with a repeated id. `split-vocabulary`: V up to 10,
/// L up to 4, D up to 8, up to 12 distinct pairs, up to 16 tokens of which
/// about half aim at a pair with a row, the gate on or off.
/// `lm-head`: splits as for the embeddings, labels of rank 1 or 2 with
/// about one in five −100, and in one case out of four hidden states
/// scaled so that the logits reach the thousands.
///
/// **Panics** only on a bug in this crate: a generated case that its own
/// evaluation rejects.
///
/// ```
/// use splitgrad::app::golden::{generate_case, Layer};
/// use splitgrad::io::{NpzReader, RealDtype};
/// use splitgrad::Rng;
/// let bytes = generate_case(Layer::LmHead, &mut Rng::new(3), RealDtype::F32);
/// let mut r = NpzReader::from_bytes("case.npz", bytes)?;
/// assert_eq!(r.real_dtype("hidden")?, RealDtype::F32);
/// assert_eq!(r.real_dtype("grad_hidden")?, RealDtype::F32);
/// assert_eq!(r.shape("loss")?, r.shape("labels")?);
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn generate_case(layer: Layer, rng: &mut Rng, dtype: impl Into<CaseDtype>) -> Vec<u8> {
    let mut w = NpzWriter::new("generated.npz");
    let mut inputs = Inputs::new(&mut w, dtype.into());
    match layer {
        Layer::SplitEmbeddings => embeddings::random_inputs(rng, &mut inputs),
        Layer::SplitVocabulary => vocabulary::random_inputs(rng, &mut inputs),
        Layer::LmHead => head::random_inputs(rng, &mut inputs),
    }
    let label = Path::new("generated case");
    let results = to_bytes(&w)
        .and_then(|inputs| compute(layer, label, inputs))
        .unwrap_or_else(|e| panic!("golden: a generated {layer} case is rejected: {e}"));
    results.add_to(&mut w);
    to_bytes(&w).unwrap_or_else(|e| panic!("golden: cannot encode a {layer} case: {e}"))
}

/// The file name of case `i`: `case-0000.npz`, `case-0001.npz`, ….
fn case_file_name(i: usize) -> String {
    format!("case-{i:04}.npz")
}

/// Writes `cases` random cases of `layer` to
/// `out_dir/<layer>/case-0000.npz`, `case-0001.npz`, … (each atomically,
/// creating the folders) and returns their paths.
///
/// Case i is drawn from `Rng::new(seed).fork(i)`, so it is the same for a
/// seed whatever the number of cases, on every platform.
///
/// Errors: `cases` 0 ([`ErrorKind::Config`]); a folder or file that
/// cannot be written ([`ErrorKind::Io`], naming it).
///
/// ```
/// use splitgrad::app::golden::{generate, Layer};
/// use splitgrad::io::RealDtype;
/// let dir = std::env::temp_dir().join(format!("splitgrad-doc-golden-gen-{}", std::process::id()));
/// let paths = generate(Layer::SplitVocabulary, 2, 7, &dir, RealDtype::F64)?;
/// assert_eq!(paths[1], dir.join("split-vocabulary").join("case-0001.npz"));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn generate(
    layer: Layer,
    cases: usize,
    seed: u64,
    out_dir: &Path,
    dtype: impl Into<CaseDtype>,
) -> Result<Vec<PathBuf>> {
    let dtype = dtype.into();
    if cases == 0 {
        return Err(Error::config("the number of cases must be at least 1"));
    }
    let dir = out_dir.join(layer.name());
    std::fs::create_dir_all(&dir).map_err(|e| Error::from(e).in_file(&dir))?;
    let base = Rng::new(seed);
    (0..cases)
        .map(|i| {
            let bytes = generate_case(layer, &mut base.fork(i as u64), dtype);
            let path = dir.join(case_file_name(i));
            write_atomic(&path, |f| Ok(f.write_all(&bytes)?))?;
            Ok(path)
        })
        .collect()
}

/// A case that [`evaluate_dir`] evaluated.
#[derive(Debug)]
pub struct CaseResult {
    /// Its layer.
    pub layer: Layer,
    /// Its name: the input file's name without `.npz`.
    pub name: String,
    /// The result file written.
    pub path: PathBuf,
}

/// A case that [`evaluate_dir`] could not evaluate.
#[derive(Debug)]
pub struct CaseFailure {
    /// Its layer.
    pub layer: Layer,
    /// Its name: the input file's name without `.npz`.
    pub name: String,
    /// Why, naming the file and the array.
    pub error: Error,
}

/// What [`evaluate_dir`] did, case by case, in the order it visited them.
#[derive(Debug, Default)]
pub struct EvalSummary {
    /// The cases evaluated, each with its result file.
    pub ok: Vec<CaseResult>,
    /// The cases that failed; none of them has a result file.
    pub failed: Vec<CaseFailure>,
    /// The entries of the input folder that are not cases, each with why
    /// (a folder that is not a layer's, a file that is not `.npz`, …).
    pub skipped: Vec<(PathBuf, String)>,
}

impl EvalSummary {
    /// The number of cases found.
    pub fn total(&self) -> usize {
        self.ok.len() + self.failed.len()
    }

    /// Whether every case was evaluated.
    pub fn all_ok(&self) -> bool {
        self.failed.is_empty()
    }
}

/// The `.npz` entries of a layer's folder, as (name without `.npz`, path),
/// sorted by name, and the other entries with why they are skipped. An
/// `.npz` entry that is not a readable regular file (a FIFO, a dangling or
/// looping link) is a case, and fails with the reason when it is read.
/// A layer folder's cases (name, path) and skipped entries (path, why).
type Listing = (Vec<(String, PathBuf)>, Vec<(PathBuf, String)>);

fn list_cases(dir: &Path) -> Result<Listing> {
    let io = |e: std::io::Error| Error::from(e).in_file(dir);
    let mut cases = Vec::new();
    let mut skipped = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().is_some_and(|x| x == "npz")
            && let Some(stem) = path.file_stem()
        {
            cases.push((stem.to_string_lossy().into_owned(), path));
            continue;
        }
        let why = if path.is_dir() {
            "a folder inside a layer's folder (cases are NAME.npz files)"
        } else {
            "not an .npz file"
        };
        skipped.push((path, why.to_string()));
    }
    cases.sort();
    skipped.sort();
    Ok((cases, skipped))
}

/// Why a top-level entry of the inputs is not a layer's folder.
fn why_not_a_layer(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let squeezed: String = name.chars().filter(char::is_ascii_alphanumeric).collect();
    if let Some(layer) = Layer::ALL.iter().find(|l| {
        l.name()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect::<String>()
            == squeezed
    }) {
        return format!("not a layer's folder: did you mean `{}`?", layer.name());
    }
    let names: Vec<&str> = Layer::ALL.iter().map(|l| l.name()).collect();
    if path.is_dir() {
        format!("not a layer's folder (the layers are {})", names.join(", "))
    } else {
        format!(
            "a file outside the layers' folders (cases are <layer>/NAME.npz, <layer> one of {})",
            names.join(", ")
        )
    }
}

fn evaluate_file(layer: Layer, input: &Path, output: &Path) -> Result<()> {
    // A case's arrays hold at most MAX_CASE_ELEMENTS reals or ids of 8
    // bytes; with the zip's own bytes a valid case file is far smaller
    // than this, so a larger one is refused before it is read.
    let limit = (MAX_CASE_ELEMENTS as u64) * 8 + (1 << 20);
    let len = crate::io::regular_file(input)?.len();
    if len > limit {
        return Err(Error::format(format!(
            "a case file of {} is larger than any case can be ({} at most: {MAX_CASE_ELEMENTS} elements)",
            crate::error::human_bytes(len),
            crate::error::human_bytes(limit)
        ))
        .in_file(input));
    }
    let bytes = crate::io::read_regular(input, "the golden case")?;
    let results = evaluate_bytes(layer, &input.display().to_string(), bytes)?;
    write_atomic(output, |f| Ok(f.write_all(&results)?))
}

/// Evaluates every case `inputs/<layer>/NAME.npz` (for the three layer
/// folders, in the order of [`Layer::ALL`], each sorted by name) and
/// writes its results to `out/<layer>/NAME.npz`, atomically.
///
/// A case that fails is recorded with its error and the others still run;
/// it gets no result file (a stale one from an earlier run is removed).
/// Every other entry (a file not ending in `.npz`, a folder other than the
/// three) is listed in [`EvalSummary::skipped`] with why; a layer folder
/// may be absent.
///
/// Errors: `inputs` missing or not a folder ([`ErrorKind::Io`] naming
/// it); no case under it at all ([`ErrorKind::Empty`] naming it); `out`
/// the same folder as `inputs` ([`ErrorKind::Config`]); a folder that
/// cannot be listed or created ([`ErrorKind::Io`] naming it).
///
/// ```
/// use splitgrad::app::golden::{evaluate_dir, generate, Layer};
/// use splitgrad::io::RealDtype;
/// let dir = std::env::temp_dir().join(format!("splitgrad-doc-golden-eval-{}", std::process::id()));
/// generate(Layer::LmHead, 2, 0, &dir.join("cases"), RealDtype::F64)?;
/// std::fs::write(dir.join("cases/lm-head/broken.npz"), b"not an npz")?;
/// let summary = evaluate_dir(&dir.join("cases"), &dir.join("results"))?;
/// assert_eq!((summary.total(), summary.ok.len()), (3, 2));
/// assert!(!summary.all_ok());
/// assert_eq!(summary.failed[0].name, "broken");
/// assert!(dir.join("results/lm-head/case-0001.npz").exists());
/// assert!(!dir.join("results/lm-head/broken.npz").exists());
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn evaluate_dir(inputs: &Path, out: &Path) -> Result<EvalSummary> {
    let meta = std::fs::metadata(inputs).map_err(|e| Error::from(e).in_file(inputs))?;
    if !meta.is_dir() {
        let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a folder");
        return Err(Error::from(e).in_file(inputs));
    }
    if let (Ok(a), Ok(b)) = (inputs.canonicalize(), out.canonicalize())
        && a == b
    {
        return Err(Error::config(format!(
            "the output folder {} is the input folder: results would replace the cases",
            out.display()
        )));
    }
    let mut summary = EvalSummary::default();
    let io = |e: std::io::Error| Error::from(e).in_file(inputs);
    for entry in std::fs::read_dir(inputs).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let is_layer = path
            .file_name()
            .is_some_and(|n| Layer::ALL.iter().any(|l| n == l.name()));
        if !is_layer || !path.is_dir() {
            let why = why_not_a_layer(&path);
            summary.skipped.push((path, why));
        }
    }
    summary.skipped.sort();
    for layer in Layer::ALL {
        let dir = inputs.join(layer.name());
        if !dir.is_dir() {
            continue;
        }
        let (cases, skipped) = list_cases(&dir)?;
        summary.skipped.extend(skipped);
        if cases.is_empty() {
            continue;
        }
        let out_dir = out.join(layer.name());
        std::fs::create_dir_all(&out_dir).map_err(|e| Error::from(e).in_file(&out_dir))?;
        for (name, input) in cases {
            let output = out_dir.join(format!("{name}.npz"));
            match evaluate_file(layer, &input, &output) {
                Ok(()) => summary.ok.push(CaseResult {
                    layer,
                    name,
                    path: output,
                }),
                Err(error) => {
                    if output.is_file() {
                        let _ = std::fs::remove_file(&output);
                    }
                    summary.failed.push(CaseFailure { layer, name, error });
                }
            }
        }
    }
    if summary.total() == 0 {
        return Err(Error::new(ErrorKind::Empty).in_file(inputs));
    }
    Ok(summary)
}
