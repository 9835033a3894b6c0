//! Differential testing of another implementation through the golden
//! format, with shrinking: [`fuzz`] (`splitgrad golden fuzz`).
//!
//! [`fuzz`] writes a batch of generated cases of one layer, inputs only,
//! runs the program under test on them, and compares its answers with
//! splitgrad's results (the tolerances of `docs/golden.md`, exact where the
//! result is a copy). On a difference it shrinks the case: it derives
//! smaller valid cases from it (fewer ids, tokens, labels or index rows,
//! fewer or smaller splits, a smaller vocabulary, fewer languages, a
//! narrower H or D, simpler values), runs the program on them, keeps the
//! first that still differs and starts again from it, until none of the
//! cases derived from the current one differs. The minimal case is written
//! as a golden case (its inputs, then splitgrad's results) that
//! `splitgrad golden eval` and the program can replay.
//!
//! # The program's contract
//!
//! The command is a shell command line, run as `sh -c 'CMD "$@"' sh INPUTS
//! OUTPUTS`: the two folders (absolute paths) are its last two arguments,
//! and also `$SPLITGRAD_FUZZ_INPUTS` and `$SPLITGRAD_FUZZ_OUTPUTS`
//! (`$SPLITGRAD_FUZZ_LAYER` names the layer). For each case
//! `INPUTS/<layer>/NAME.npz` it writes `OUTPUTS/<layer>/NAME.npz` holding
//! the results under their names (`docs/golden.md`), in the case's dtype;
//! `OUTPUTS/<layer>` exists when it starts. It must exit with status 0 and
//! finish within the timeout (then its process group is killed). Its
//! standard output and error go to `program.log` beside the folders.
//!
//! # What is a difference
//!
//! For a case: no answer file, an answer that is not an npz, a result
//! array missing, of another shape or another dtype than splitgrad's
//! result, or an element off by more than the tolerance (NaN is never
//! close). For a run of the program on one case: a non-zero exit status, a
//! signal, or the timeout. A run on several cases that fails as a whole
//! says nothing about which case: each is then run alone.
//!
//! Tolerances, per array: `|a − b| ≤ rtol·(1 + max|b|)`, rtol 1e-9 for
//! float64 and 1e-5 for float32; 1e-3 for every result of a float32
//! `lm-head` case with a hidden element above 100 in magnitude (logits in
//! the thousands, `docs/golden.md`). Equal (−0 equals +0), where the
//! result is a copy: `split-embeddings` `out`, and each gradient row that
//! at most one position reached; `lm-head` `loss` and `grad_hidden` at a
//! −100 label (0); `split-vocabulary` `out` and `grad_shared` for a token
//! without a row or in fusion mode (`shared` / `upstream`, the row / 0).
//!
//! # Files
//!
//! `OUT` must be empty or new. `OUT/cases/<layer>/case-NNNN.npz` are the
//! generated inputs, `OUT/answers/<layer>/` the program's answers and
//! `OUT/program.log` its output, for the first run. On a difference:
//! `OUT/minimal/<layer>/minimal.npz` (the minimal case: inputs, then
//! splitgrad's results), `OUT/minimal-answer/<layer>/minimal.npz` (the
//! program's answer to it, when it wrote one) and `OUT/summary.txt`. The
//! runs on derived cases use `OUT/scratch/`, removed when the search ends.

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ndarray::{Array1, Array2, ArrayD, Axis, IxDyn, s};

use super::{Layer, Results, case_file_name, compute, generate_case, to_bytes};
use crate::io::{NpzReader, NpzWriter, RealDtype, write_atomic};
use crate::{Error, Result, Rng};

/// At most this many cases in one run of the program while shrinking.
const BATCH: usize = 64;

/// A label the head ignores.
const IGNORE: i64 = -100;

/// An answer file larger than this is not kept as the minimal case's
/// answer (it is still compared).
const MAX_KEPT_ANSWER: u64 = 64 << 20;

/// What [`fuzz`] does.
#[derive(Clone, Debug)]
pub struct FuzzConfig {
    /// The layer whose cases are generated.
    pub layer: Layer,
    /// How many cases the first run gets (at least 1).
    pub cases: usize,
    /// Case i is generated from `Rng::new(seed).fork(i)`, as by `golden gen`.
    pub seed: u64,
    /// The cases' real dtype.
    pub dtype: RealDtype,
    /// The longest one run of the program may take.
    pub timeout: Duration,
    /// The program: a shell command line, given the inputs and outputs
    /// folders as its last two arguments.
    pub command: String,
    /// The output folder, empty or new.
    pub out: PathBuf,
    /// When it becomes true (a signal handler sets it), the search ends:
    /// the running program's process group is killed and [`fuzz`] returns
    /// an error.
    pub stop: Option<Arc<AtomicBool>>,
}

/// One way a case's answer differs from splitgrad's.
#[derive(Clone, Debug, PartialEq)]
pub enum Difference {
    /// The run of the program on this case alone failed: it exited with
    /// a non-zero status, was killed, or timed out (the text says which).
    Run(String),
    /// The program wrote no answer file for the case.
    NoAnswer,
    /// The answer file is not a readable npz (the reader's error).
    Unreadable(String),
    /// A result array is missing from the answer.
    Missing(String),
    /// A result array has another shape.
    Shape {
        /// The array.
        array: String,
        /// Its shape in the answer.
        found: Vec<usize>,
        /// splitgrad's.
        expected: Vec<usize>,
    },
    /// A result array has another dtype than the case's real dtype.
    Dtype {
        /// The array.
        array: String,
        /// Its dtype in the answer.
        found: String,
        /// The case's: `float64` or `float32`.
        expected: &'static str,
    },
    /// A result array's elements are not close: the worst element.
    Values {
        /// The array.
        array: String,
        /// The worst element's position.
        index: Vec<usize>,
        /// The program's value there.
        found: f64,
        /// splitgrad's.
        expected: f64,
        /// The tolerance of that element (0 where the result is a copy).
        tolerance: f64,
    },
}

impl Difference {
    /// The array concerned, if one is.
    pub fn array(&self) -> Option<&str> {
        match self {
            Difference::Missing(a) => Some(a),
            Difference::Shape { array, .. }
            | Difference::Dtype { array, .. }
            | Difference::Values { array, .. } => Some(array),
            _ => None,
        }
    }
}

/// A number in a message: plain when of ordinary size, else scientific.
fn num(x: f64) -> String {
    let a = x.abs();
    if x == 0.0 || !x.is_finite() || (1e-3..1e6).contains(&a) {
        let s = format!("{x:.6}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s == "-0" { "0".into() } else { s.into() }
    } else {
        format!("{x:.3e}")
    }
}

/// A difference in a message: three decimals, or three digits in
/// scientific notation when small or large.
fn short(x: f64) -> String {
    if (1e-2..1e4).contains(&x.abs()) {
        num(format!("{x:.3}").parse().unwrap_or(x))
    } else {
        format!("{x:.2e}")
    }
}

/// numpy's name of a real dtype.
fn numpy_name(dtype: RealDtype) -> &'static str {
    match dtype {
        RealDtype::F32 => "float32",
        RealDtype::F64 => "float64",
    }
}

fn fmt_list<T: fmt::Display>(v: &[T]) -> String {
    let items: Vec<String> = v.iter().map(T::to_string).collect();
    format!("[{}]", items.join(", "))
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::Run(what) => write!(f, "the program {what}"),
            Difference::NoAnswer => f.write_str("no answer file"),
            Difference::Unreadable(e) => write!(f, "the answer is unreadable: {e}"),
            Difference::Missing(a) => write!(f, "`{a}` is missing"),
            Difference::Shape {
                array,
                found,
                expected,
            } => write!(
                f,
                "`{array}` has shape {}, expected {}",
                fmt_list(found),
                fmt_list(expected)
            ),
            Difference::Dtype {
                array,
                found,
                expected,
            } => write!(f, "`{array}` is {found}, expected {expected}"),
            Difference::Values {
                array,
                index,
                found,
                expected,
                tolerance,
            } => {
                let at = fmt_list(index);
                let error = (found - expected).abs();
                let (found, expected) = (num(*found), num(*expected));
                if *tolerance == 0.0 {
                    write!(
                        f,
                        "`{array}` at {at} is {found}, splitgrad's {expected} (a copy: must be equal)"
                    )
                } else {
                    let by = if error.is_nan() {
                        "NaN".into()
                    } else {
                        short(error)
                    };
                    write!(
                        f,
                        "`{array}` differs by {by} at {at} ({found}, splitgrad's {expected}; tolerance {tolerance:.1e})"
                    )
                }
            }
        }
    }
}

/// A difference found and shrunk.
#[derive(Clone, Debug)]
pub struct Finding {
    /// The layer.
    pub layer: Layer,
    /// The cases' dtype.
    pub dtype: RealDtype,
    /// The generated case the search started from (`case-0003`).
    pub original: String,
    /// The minimal case in words: sizes, ids or labels.
    pub case: String,
    /// How the program's answer to the minimal case differs.
    pub differences: Vec<Difference>,
    /// How many smaller cases were accepted on the way.
    pub steps: usize,
    /// How many times the program ran in all.
    pub runs: usize,
    /// The folder of the minimal case, a golden case folder
    /// (`OUT/minimal`).
    pub minimal_dir: PathBuf,
    /// The minimal case file, `OUT/minimal/<layer>/minimal.npz`.
    pub minimal: PathBuf,
    /// The program's answer to it, if it wrote one.
    pub answer: Option<PathBuf>,
}

impl Finding {
    /// The one-line summary: layer, dtype, the case's sizes, the arrays that
    /// differ and by how much, and where the minimal case is.
    pub fn summary(&self) -> String {
        const SHOWN: usize = 4;
        let mut diffs: Vec<String> = self
            .differences
            .iter()
            .take(SHOWN)
            .map(Difference::to_string)
            .collect();
        if self.differences.len() > SHOWN {
            diffs.push(format!("{} more", self.differences.len() - SHOWN));
        }
        format!(
            "difference: {} {}, {}: {}; minimal case {} ({} shrunk in {} step{}, {} run{} of the program)",
            self.layer,
            numpy_name(self.dtype),
            self.case,
            diffs.join("; "),
            self.minimal.display(),
            self.original,
            self.steps,
            plural(self.steps),
            self.runs,
            plural(self.runs),
        )
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// How a [`fuzz`] ended.
#[derive(Clone, Debug)]
pub enum FuzzOutcome {
    /// Every case's answer agrees with splitgrad's.
    Agree {
        /// The cases run.
        cases: usize,
    },
    /// A case differs; here is the minimal one.
    Differ(Box<Finding>),
    /// The program failed on the cases together (the text says how) but
    /// on none of them alone.
    BatchOnly {
        /// The cases run.
        cases: usize,
        /// How the run on all of them failed.
        failure: String,
    },
}

/// Progress reported while [`fuzz`] runs.
#[derive(Debug)]
pub enum Event<'a> {
    /// The cases are written to `dir`; the program runs on them next.
    Generated {
        /// How many.
        cases: usize,
        /// `OUT/cases`.
        dir: &'a Path,
    },
    /// The program ran on the generated cases.
    Checked {
        /// How many cases.
        cases: usize,
        /// How many of them differ.
        differing: usize,
        /// How long the run took.
        elapsed: Duration,
    },
    /// A run on several cases failed as a whole; they are run one by one.
    BatchFailed {
        /// How many cases the run had.
        cases: usize,
        /// How it failed.
        failure: &'a str,
    },
    /// A case differs: the search starts from it.
    Found {
        /// Its name.
        name: &'a str,
        /// It in words.
        case: &'a str,
        /// How.
        differences: &'a [Difference],
    },
    /// A smaller case still differs and replaces the current one.
    Shrunk {
        /// The step's number, from 1.
        step: usize,
        /// What was made smaller.
        change: &'a str,
        /// The new case in words.
        case: &'a str,
    },
}

// ---------------------------------------------------------------------------
// Cases as values that can be made smaller.

/// Splits with their tables, for the embeddings (`trainable` read) and the
/// head (every split trainable).
#[derive(Clone, Debug)]
struct Splits {
    sizes: Vec<usize>,
    trainable: Vec<bool>,
    /// (size_k, H) each.
    weights: Vec<Array2<f64>>,
    width: usize,
}

/// A reduction of the splits: ids dropped, split entries dropped.
struct SplitCut {
    what: String,
    drop_ids: Vec<bool>,
    drop_splits: Vec<bool>,
}

impl Splits {
    fn read(r: &mut NpzReader, with_trainable: bool) -> Result<Splits> {
        let sizes = r.ints_1d("split_sizes")?;
        let sizes: Vec<usize> = sizes.iter().map(|&s| s.max(0) as usize).collect();
        let trainable = if with_trainable {
            r.ints_1d("split_trainable")?
                .iter()
                .map(|&f| f == 1)
                .collect()
        } else {
            vec![true; sizes.len()]
        };
        let mut weights = Vec::with_capacity(sizes.len());
        for (k, &size) in sizes.iter().enumerate() {
            let w = r.reals::<f64>(&format!("weight_{k}"))?;
            let width = w.shape().get(1).copied().unwrap_or(0);
            weights.push(to_rows(w, size, width)?);
        }
        let width = weights.first().map_or(0, |w| w.ncols());
        Ok(Splits {
            sizes,
            trainable,
            weights,
            width,
        })
    }

    fn write(&self, w: &mut NpzWriter, dtype: RealDtype, with_trainable: bool) {
        let sizes: Array1<i64> = self.sizes.iter().map(|&s| s as i64).collect();
        w.add("split_sizes", &sizes);
        if with_trainable {
            let flags: Array1<u8> = self.trainable.iter().map(|&t| u8::from(t)).collect();
            w.add("split_trainable", &flags);
        }
        for (k, weight) in self.weights.iter().enumerate() {
            add_reals(w, dtype, &format!("weight_{k}"), weight);
        }
    }

    fn vocab(&self) -> usize {
        self.sizes.iter().sum()
    }

    fn starts(&self) -> Vec<usize> {
        let mut next = 0;
        self.sizes
            .iter()
            .map(|&s| {
                let start = next;
                next += s;
                start
            })
            .collect()
    }

    /// The split and row of global id `id`.
    fn locate(&self, id: usize) -> Option<(usize, usize)> {
        let starts = self.starts();
        (0..self.sizes.len())
            .find(|&k| (starts[k]..starts[k] + self.sizes[k]).contains(&id))
            .map(|k| (k, id - starts[k]))
    }

    /// The splits without the ids and split entries `cut` drops (a dropped
    /// split's ids go with it), and each old id's new id; `None` when no
    /// split or no id would be left.
    fn apply(&self, cut: &SplitCut) -> Option<(Splits, Vec<Option<i64>>)> {
        let starts = self.starts();
        let mut map = vec![None; self.vocab()];
        let mut next = 0i64;
        let mut out = Splits {
            sizes: Vec::new(),
            trainable: Vec::new(),
            weights: Vec::new(),
            width: self.width,
        };
        for k in 0..self.sizes.len() {
            if cut.drop_splits[k] {
                continue;
            }
            let keep: Vec<usize> = (0..self.sizes[k])
                .filter(|&r| !cut.drop_ids[starts[k] + r])
                .collect();
            for &r in &keep {
                map[starts[k] + r] = Some(next);
                next += 1;
            }
            out.sizes.push(keep.len());
            out.trainable.push(self.trainable[k]);
            out.weights.push(self.weights[k].select(Axis(0), &keep));
        }
        (!out.sizes.is_empty() && next > 0).then_some((out, map))
    }

    /// The reductions to try, the largest first: one split alone, a split
    /// removed, one row of a split alone, a row removed.
    fn cuts(&self) -> Vec<SplitCut> {
        let n = self.sizes.len();
        let v = self.vocab();
        let starts = self.starts();
        let mut cuts = Vec::new();
        let cut = |what: String, ids: Vec<bool>, splits: Vec<bool>| SplitCut {
            what,
            drop_ids: ids,
            drop_splits: splits,
        };
        if n > 1 {
            for k in 0..n {
                let splits = (0..n).map(|j| j != k).collect();
                cuts.push(cut(format!("kept only split s{k}"), vec![false; v], splits));
            }
            for k in 0..n {
                let splits = (0..n).map(|j| j == k).collect();
                let what = format!("removed split s{k} (of size {})", self.sizes[k]);
                cuts.push(cut(what, vec![false; v], splits));
            }
        }
        for (k, (&start, &size)) in starts.iter().zip(&self.sizes).enumerate() {
            if size > 1 {
                for r in 0..size {
                    let ids = (0..v).map(|i| (start..start + size).contains(&i) && i != start + r);
                    let what = format!("kept only row {r} of split s{k}");
                    cuts.push(cut(what, ids.collect(), vec![false; n]));
                }
            }
        }
        for (k, (&start, &size)) in starts.iter().zip(&self.sizes).enumerate() {
            for r in 0..size {
                let id = start + r;
                let what = format!("removed id {id} (row {r} of split s{k})");
                cuts.push(cut(what, (0..v).map(|i| i == id).collect(), vec![false; n]));
            }
        }
        cuts
    }

    fn narrow(&self, width: usize) -> Splits {
        Splits {
            weights: self
                .weights
                .iter()
                .map(|w| w.slice(s![.., ..width]).to_owned())
                .collect(),
            width,
            ..self.clone()
        }
    }

    fn describe(&self) -> String {
        let frozen: Vec<String> = (0..self.sizes.len())
            .filter(|&k| !self.trainable[k])
            .map(|k| format!("s{k}"))
            .collect();
        let mut s = format!("splits {} (V = {}", fmt_list(&self.sizes), self.vocab());
        if !frozen.is_empty() {
            s += &format!("; {} frozen", frozen.join(", "));
        }
        s + &format!("), H = {}", self.width)
    }
}

/// A `split-embeddings` case.
#[derive(Clone, Debug)]
struct Embeddings {
    splits: Splits,
    /// The shape of `input_ids`.
    shape: Vec<usize>,
    /// `input_ids`, row-major.
    ids: Vec<i64>,
    /// `upstream` as (ids, H).
    upstream: Array2<f64>,
}

/// An `lm-head` case.
#[derive(Clone, Debug)]
struct Head {
    splits: Splits,
    /// The shape of `labels`.
    shape: Vec<usize>,
    labels: Vec<i64>,
    /// `hidden` as (tokens, H).
    hidden: Array2<f64>,
    upstream: Vec<f64>,
}

/// A `split-vocabulary` case.
#[derive(Clone, Debug)]
struct Vocabulary {
    vocab: usize,
    languages: usize,
    language_index: Vec<i64>,
    token_index: Vec<i64>,
    rows: Array2<f64>,
    gate_logit: Vec<f64>,
    token_ids: Vec<i64>,
    language_ids: Vec<i64>,
    shared: Array2<f64>,
    upstream: Array2<f64>,
    use_gate: bool,
    penalty_weight: f64,
    fusion_weight: f64,
}

#[derive(Clone, Debug)]
enum Inputs {
    Embeddings(Embeddings),
    Head(Head),
    Vocabulary(Vocabulary),
}

/// A case's inputs, as values.
#[derive(Clone, Debug)]
struct FuzzCase {
    dtype: RealDtype,
    inputs: Inputs,
}

fn to_rows(a: ArrayD<f64>, rows: usize, cols: usize) -> Result<Array2<f64>> {
    let found = a.shape().to_vec();
    Array2::from_shape_vec((rows, cols), a.iter().copied().collect())
        .map_err(|_| Error::shape("array", format!("({rows}, {cols})"), &found))
}

fn add_reals<D: ndarray::Dimension>(
    w: &mut NpzWriter,
    dtype: RealDtype,
    name: &str,
    a: &ndarray::Array<f64, D>,
) {
    match dtype {
        RealDtype::F64 => w.add(name, a),
        RealDtype::F32 => w.add(name, &a.mapv(|x| x as f32)),
    };
}

fn add_real_scalar(w: &mut NpzWriter, dtype: RealDtype, name: &str, x: f64) {
    match dtype {
        RealDtype::F64 => w.add_scalar(name, x),
        RealDtype::F32 => w.add_scalar(name, x as f32),
    };
}

/// `x` as the dtype holds it.
fn round_to(dtype: RealDtype, x: f64) -> f64 {
    match dtype {
        RealDtype::F64 => x,
        RealDtype::F32 => f64::from(x as f32),
    }
}

fn shaped<T: Clone>(shape: &[usize], values: Vec<T>) -> Result<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(shape), values)
        .map_err(|e| Error::format(format!("a derived case has inconsistent shapes: {e}")))
}

fn with_width(shape: &[usize], width: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s.push(width);
    s
}

/// The ways to keep part of `n` positions, each with what it does: every
/// single position alone, then halves, quarters, … down to single
/// positions removed.
fn subsets(n: usize, what: &str) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    if n <= 1 {
        return out;
    }
    for p in 0..n {
        out.push((format!("kept only {what} {p} of {n}"), vec![p]));
    }
    let mut chunk = n / 2;
    while chunk >= 1 {
        for start in (0..n).step_by(chunk) {
            let end = (start + chunk).min(n);
            let keep: Vec<usize> = (0..start).chain(end..n).collect();
            if keep.len() > 1 {
                let range = if end - start == 1 {
                    format!("{start}")
                } else {
                    format!("{start}..{end}")
                };
                out.push((format!("removed {what} {range} of {n}"), keep));
            }
        }
        if chunk == 1 {
            break;
        }
        chunk /= 2;
    }
    out
}

/// Narrower widths to try: 1, half, one less.
fn widths(h: usize) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for w in [1, h / 2, h.saturating_sub(1)] {
        if w >= 1 && w < h && !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

fn list_short(v: &[i64]) -> String {
    const SHOWN: usize = 8;
    if v.len() <= SHOWN {
        fmt_list(v)
    } else {
        format!("{} …]", fmt_list(&v[..SHOWN]).trim_end_matches(']'))
    }
}

fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", plural(n))
}

impl Embeddings {
    fn read(r: &mut NpzReader) -> Result<Self> {
        let splits = Splits::read(r, true)?;
        let ids = r.ints("input_ids")?;
        let shape = ids.shape().to_vec();
        let n = ids.len();
        let upstream = to_rows(r.reals::<f64>("upstream")?, n, splits.width)?;
        Ok(Embeddings {
            splits,
            shape,
            ids: ids.iter().copied().collect(),
            upstream,
        })
    }

    fn write(&self, w: &mut NpzWriter, dtype: RealDtype) -> Result<()> {
        self.splits.write(w, dtype, true);
        w.add("input_ids", &shaped(&self.shape, self.ids.clone())?);
        let up = shaped(
            &with_width(&self.shape, self.splits.width),
            self.upstream.iter().copied().collect(),
        )?;
        add_reals(w, dtype, "upstream", &up);
        Ok(())
    }

    fn keep_positions(&self, keep: &[usize]) -> Self {
        Embeddings {
            shape: vec![keep.len()],
            ids: keep.iter().map(|&p| self.ids[p]).collect(),
            upstream: self.upstream.select(Axis(0), keep),
            ..self.clone()
        }
    }

    fn size(&self) -> (usize, usize) {
        let (n, h, s) = (self.ids.len(), self.splits.width, self.splits.sizes.len());
        let frozen = self.splits.trainable.iter().filter(|t| !**t).count();
        (
            2 * s + self.splits.vocab() * h + n * (1 + h),
            self.shape.len().saturating_sub(1) + frozen,
        )
    }

    fn candidates(&self) -> Vec<(String, Inputs)> {
        let mut out = Vec::new();
        let wrap = |what: String, c: Embeddings| (what, Inputs::Embeddings(c));
        for (what, keep) in subsets(self.ids.len(), "id position") {
            out.push(wrap(what, self.keep_positions(&keep)));
        }
        for cut in self.splits.cuts() {
            let Some((splits, map)) = self.splits.apply(&cut) else {
                continue;
            };
            let new_id = |id: i64| map.get(id as usize).copied().flatten();
            let keep: Vec<usize> = (0..self.ids.len())
                .filter(|&p| new_id(self.ids[p]).is_some())
                .collect();
            if keep.is_empty() {
                continue;
            }
            let mut c = if keep.len() == self.ids.len() {
                self.clone()
            } else {
                self.keep_positions(&keep)
            };
            c.ids = c.ids.iter().map(|&id| new_id(id).unwrap_or(0)).collect();
            c.splits = splits;
            out.push(wrap(cut.what, c));
        }
        for h in widths(self.splits.width) {
            let c = Embeddings {
                splits: self.splits.narrow(h),
                upstream: self.upstream.slice(s![.., ..h]).to_owned(),
                ..self.clone()
            };
            out.push(wrap(format!("H {} → {h}", self.splits.width), c));
        }
        if self.shape.len() > 1 {
            let c = Embeddings {
                shape: vec![self.ids.len()],
                ..self.clone()
            };
            out.push(wrap(
                format!("ids of shape {} → 1-D", fmt_list(&self.shape)),
                c,
            ));
        }
        for k in 0..self.splits.sizes.len() {
            if !self.splits.trainable[k] {
                let mut c = self.clone();
                c.splits.trainable[k] = true;
                out.push(wrap(format!("split s{k} trainable"), c));
            }
        }
        out
    }

    fn describe(&self) -> String {
        let shape = if self.shape.len() == 1 {
            String::new()
        } else {
            format!(" of shape {}", fmt_list(&self.shape))
        };
        format!(
            "{}, {}{shape} {}",
            self.splits.describe(),
            count(self.ids.len(), "id"),
            list_short(&self.ids)
        )
    }

    /// Whether element `i` of result `name` is a copy (exact).
    fn exact(&self, name: &str) -> Exact {
        if name == "out" {
            return Exact::All;
        }
        let Some(k) = name
            .strip_prefix("grad_weight_")
            .and_then(|k| k.parse::<usize>().ok())
        else {
            return Exact::None;
        };
        // A row that at most one position reached is 0 or that position's
        // upstream row.
        let Some(&size) = self.splits.sizes.get(k) else {
            return Exact::None;
        };
        let mut reached = vec![0usize; size];
        for &id in &self.ids {
            if let Some((j, r)) = self.splits.locate(id.max(0) as usize) {
                if j == k {
                    reached[r] += 1;
                }
            }
        }
        let h = self.splits.width;
        Exact::Mask(
            reached
                .iter()
                .flat_map(|&n| std::iter::repeat_n(n <= 1, h))
                .collect(),
        )
    }
}

impl Head {
    fn read(r: &mut NpzReader) -> Result<Self> {
        let splits = Splits::read(r, false)?;
        let labels = r.ints("labels")?;
        let shape = labels.shape().to_vec();
        let n = labels.len();
        let hidden = to_rows(r.reals::<f64>("hidden")?, n, splits.width)?;
        let upstream = r.reals::<f64>("upstream")?.iter().copied().collect();
        Ok(Head {
            splits,
            shape,
            labels: labels.iter().copied().collect(),
            hidden,
            upstream,
        })
    }

    fn write(&self, w: &mut NpzWriter, dtype: RealDtype) -> Result<()> {
        self.splits.write(w, dtype, false);
        let hidden = shaped(
            &with_width(&self.shape, self.splits.width),
            self.hidden.iter().copied().collect(),
        )?;
        add_reals(w, dtype, "hidden", &hidden);
        w.add("labels", &shaped(&self.shape, self.labels.clone())?);
        add_reals(
            w,
            dtype,
            "upstream",
            &shaped(&self.shape, self.upstream.clone())?,
        );
        Ok(())
    }

    fn keep_tokens(&self, keep: &[usize]) -> Self {
        Head {
            shape: vec![keep.len()],
            labels: keep.iter().map(|&p| self.labels[p]).collect(),
            hidden: self.hidden.select(Axis(0), keep),
            upstream: keep.iter().map(|&p| self.upstream[p]).collect(),
            ..self.clone()
        }
    }

    /// Whether the logits reach the thousands (a hidden element above 100).
    fn large_logits(&self) -> bool {
        self.hidden.iter().any(|x| x.abs() > 100.0)
    }

    fn size(&self) -> (usize, usize) {
        let (n, h, s) = (
            self.labels.len(),
            self.splits.width,
            self.splits.sizes.len(),
        );
        (
            s + self.splits.vocab() * h + n * (2 + h),
            self.shape.len().saturating_sub(1) + usize::from(self.large_logits()),
        )
    }

    fn candidates(&self, dtype: RealDtype) -> Vec<(String, Inputs)> {
        let mut out = Vec::new();
        let wrap = |what: String, c: Head| (what, Inputs::Head(c));
        for (what, keep) in subsets(self.labels.len(), "token") {
            out.push(wrap(what, self.keep_tokens(&keep)));
        }
        for cut in self.splits.cuts() {
            let Some((splits, map)) = self.splits.apply(&cut) else {
                continue;
            };
            let new_label = |l: i64| match l {
                IGNORE => Some(IGNORE),
                l => map.get(l.max(0) as usize).copied().flatten(),
            };
            let keep: Vec<usize> = (0..self.labels.len())
                .filter(|&p| new_label(self.labels[p]).is_some())
                .collect();
            if keep.is_empty() {
                continue;
            }
            let mut c = if keep.len() == self.labels.len() {
                self.clone()
            } else {
                self.keep_tokens(&keep)
            };
            c.labels = c
                .labels
                .iter()
                .map(|&l| new_label(l).unwrap_or(0))
                .collect();
            c.splits = splits;
            out.push(wrap(cut.what, c));
        }
        for h in widths(self.splits.width) {
            let c = Head {
                splits: self.splits.narrow(h),
                hidden: self.hidden.slice(s![.., ..h]).to_owned(),
                ..self.clone()
            };
            out.push(wrap(format!("H {} → {h}", self.splits.width), c));
        }
        if self.shape.len() > 1 {
            let c = Head {
                shape: vec![self.labels.len()],
                ..self.clone()
            };
            out.push(wrap(
                format!("labels of shape {} → 1-D", fmt_list(&self.shape)),
                c,
            ));
        }
        if self.large_logits() {
            let c = Head {
                hidden: self.hidden.mapv(|x| round_to(dtype, x / 3000.0)),
                ..self.clone()
            };
            out.push(wrap("hidden states divided by 3000".into(), c));
        }
        out
    }

    fn describe(&self) -> String {
        let shape = if self.shape.len() == 1 {
            String::new()
        } else {
            format!(" of shape {}", fmt_list(&self.shape))
        };
        let large = if self.large_logits() {
            ", logits in the thousands"
        } else {
            ""
        };
        format!(
            "{}, {}{shape}, labels {}{large}",
            self.splits.describe(),
            count(self.labels.len(), "token"),
            list_short(&self.labels)
        )
    }

    fn exact(&self, name: &str) -> Exact {
        let ignored = self.labels.iter().map(|&l| l == IGNORE);
        match name {
            "loss" => Exact::Mask(ignored.collect()),
            "grad_hidden" => Exact::Mask(
                ignored
                    .flat_map(|i| std::iter::repeat_n(i, self.splits.width))
                    .collect(),
            ),
            _ => Exact::None,
        }
    }
}

impl Vocabulary {
    fn read(r: &mut NpzReader) -> Result<Self> {
        let scalar_int = |r: &mut NpzReader, name: &str| -> Result<i64> {
            Ok(r.ints(name)?.iter().copied().next().unwrap_or(0))
        };
        let scalar_real = |r: &mut NpzReader, name: &str| -> Result<f64> {
            Ok(r.reals::<f64>(name)?.iter().copied().next().unwrap_or(0.0))
        };
        let vocab = scalar_int(r, "vocab_size")?.max(0) as usize;
        let languages = scalar_int(r, "n_languages")?.max(0) as usize;
        let language_index = r.ints_1d("language_index")?;
        let token_index = r.ints_1d("token_index")?;
        let n_rows = language_index.len();
        let rows = r.reals::<f64>("rows")?;
        let dim = rows.shape().get(1).copied().unwrap_or(0);
        let rows = to_rows(rows, n_rows, dim)?;
        let gate_logit = r.reals::<f64>("gate_logit")?.iter().copied().collect();
        let token_ids = r.ints_1d("token_ids")?;
        let language_ids = r.ints_1d("language_ids")?;
        let n = token_ids.len();
        let shared = to_rows(r.reals::<f64>("shared")?, n, dim)?;
        let upstream = to_rows(r.reals::<f64>("upstream")?, n, dim)?;
        Ok(Vocabulary {
            vocab,
            languages,
            language_index,
            token_index,
            rows,
            gate_logit,
            token_ids,
            language_ids,
            shared,
            upstream,
            use_gate: scalar_int(r, "use_gate")? == 1,
            penalty_weight: scalar_real(r, "penalty_weight")?,
            fusion_weight: scalar_real(r, "fusion_weight")?,
        })
    }

    fn write(&self, w: &mut NpzWriter, dtype: RealDtype) {
        let ids = |v: &[i64]| Array1::from(v.to_vec());
        w.add_scalar("vocab_size", self.vocab as i64);
        w.add_scalar("n_languages", self.languages as i64);
        w.add("language_index", &ids(&self.language_index));
        w.add("token_index", &ids(&self.token_index));
        add_reals(w, dtype, "rows", &self.rows);
        add_reals(
            w,
            dtype,
            "gate_logit",
            &Array1::from(self.gate_logit.clone()),
        );
        w.add("token_ids", &ids(&self.token_ids));
        w.add("language_ids", &ids(&self.language_ids));
        add_reals(w, dtype, "shared", &self.shared);
        add_reals(w, dtype, "upstream", &self.upstream);
        w.add_scalar("use_gate", i64::from(self.use_gate));
        add_real_scalar(w, dtype, "penalty_weight", self.penalty_weight);
        add_real_scalar(w, dtype, "fusion_weight", self.fusion_weight);
    }

    fn dim(&self) -> usize {
        self.rows.ncols()
    }

    fn keep_tokens(&self, keep: &[usize]) -> Self {
        Vocabulary {
            token_ids: keep.iter().map(|&p| self.token_ids[p]).collect(),
            language_ids: keep.iter().map(|&p| self.language_ids[p]).collect(),
            shared: self.shared.select(Axis(0), keep),
            upstream: self.upstream.select(Axis(0), keep),
            ..self.clone()
        }
    }

    fn keep_rows(&self, keep: &[usize]) -> Self {
        Vocabulary {
            language_index: keep.iter().map(|&i| self.language_index[i]).collect(),
            token_index: keep.iter().map(|&i| self.token_index[i]).collect(),
            rows: self.rows.select(Axis(0), keep),
            gate_logit: keep.iter().map(|&i| self.gate_logit[i]).collect(),
            ..self.clone()
        }
    }

    /// Without the vocabulary tokens (`tokens`) or the languages marked in
    /// `drop`: their index rows and the tokens that use them go, the others
    /// are renumbered. `None` when no row, no token or no id would be left.
    fn without(&self, drop: &[bool], tokens: bool) -> Option<Self> {
        let mut map = vec![None; drop.len()];
        let mut next = 0i64;
        for (i, &d) in drop.iter().enumerate() {
            if !d {
                map[i] = Some(next);
                next += 1;
            }
        }
        if next == 0 {
            return None;
        }
        let new = |v: i64| map.get(v.max(0) as usize).copied().flatten();
        let (index, ids) = if tokens {
            (&self.token_index, &self.token_ids)
        } else {
            (&self.language_index, &self.language_ids)
        };
        let rows: Vec<usize> = (0..index.len())
            .filter(|&i| new(index[i]).is_some())
            .collect();
        let positions: Vec<usize> = (0..ids.len()).filter(|&p| new(ids[p]).is_some()).collect();
        if rows.is_empty() || positions.is_empty() {
            return None;
        }
        let mut c = self.keep_rows(&rows).keep_tokens(&positions);
        let renumber = |v: &mut Vec<i64>| v.iter_mut().for_each(|x| *x = new(*x).unwrap_or(0));
        if tokens {
            renumber(&mut c.token_index);
            renumber(&mut c.token_ids);
            c.vocab = next as usize;
        } else {
            renumber(&mut c.language_index);
            renumber(&mut c.language_ids);
            c.languages = next as usize;
        }
        Some(c)
    }

    fn size(&self) -> (usize, usize) {
        let (n, d, r) = (self.token_ids.len(), self.dim(), self.rows.nrows());
        let weights = [self.penalty_weight, self.fusion_weight];
        (
            self.vocab + self.languages + r * (3 + d) + n * (2 + 2 * d) + 3,
            weights.iter().filter(|w| **w != 0.0).count(),
        )
    }

    fn candidates(&self) -> Vec<(String, Inputs)> {
        let mut out = Vec::new();
        let wrap = |what: String, c: Vocabulary| (what, Inputs::Vocabulary(c));
        for (what, keep) in subsets(self.token_ids.len(), "token") {
            out.push(wrap(what, self.keep_tokens(&keep)));
        }
        for (what, keep) in subsets(self.rows.nrows(), "index row") {
            out.push(wrap(what, self.keep_rows(&keep)));
        }
        for (n, tokens, what) in [
            (self.vocab, true, "vocabulary token"),
            (self.languages, false, "language"),
        ] {
            if n > 1 {
                for t in 0..n {
                    let drop: Vec<bool> = (0..n).map(|i| i != t).collect();
                    if let Some(c) = self.without(&drop, tokens) {
                        out.push(wrap(format!("kept only {what} {t}"), c));
                    }
                }
                for t in 0..n {
                    let drop: Vec<bool> = (0..n).map(|i| i == t).collect();
                    if let Some(c) = self.without(&drop, tokens) {
                        out.push(wrap(format!("removed {what} {t}"), c));
                    }
                }
            }
        }
        for d in widths(self.dim()) {
            let c = Vocabulary {
                rows: self.rows.slice(s![.., ..d]).to_owned(),
                shared: self.shared.slice(s![.., ..d]).to_owned(),
                upstream: self.upstream.slice(s![.., ..d]).to_owned(),
                ..self.clone()
            };
            out.push(wrap(format!("D {} → {d}", self.dim()), c));
        }
        if self.penalty_weight != 0.0 {
            let c = Vocabulary {
                penalty_weight: 0.0,
                ..self.clone()
            };
            out.push(wrap("penalty_weight → 0".into(), c));
        }
        if self.fusion_weight != 0.0 {
            let c = Vocabulary {
                fusion_weight: 0.0,
                ..self.clone()
            };
            out.push(wrap("fusion_weight → 0".into(), c));
        }
        out
    }

    /// Whether each token has a row.
    fn has_row(&self) -> Vec<bool> {
        let pairs: HashSet<(i64, i64)> = self
            .language_index
            .iter()
            .copied()
            .zip(self.token_index.iter().copied())
            .collect();
        self.language_ids
            .iter()
            .zip(&self.token_ids)
            .map(|(&l, &t)| pairs.contains(&(l, t)))
            .collect()
    }

    fn describe(&self) -> String {
        let pairs: Vec<String> = self
            .language_index
            .iter()
            .zip(&self.token_index)
            .take(8)
            .map(|(l, t)| format!("({l}, {t})"))
            .collect();
        let more = if self.rows.nrows() > 8 { " …" } else { "" };
        let with_row = self.has_row().iter().filter(|h| **h).count();
        format!(
            "V = {}, L = {}, D = {}, {} (language, token) {}{more}, {} ({} with a row), {}, \
             penalty_weight {}, fusion_weight {}",
            self.vocab,
            self.languages,
            self.dim(),
            count(self.rows.nrows(), "index row"),
            pairs.join(" "),
            count(self.token_ids.len(), "token"),
            with_row,
            if self.use_gate {
                "gated"
            } else {
                "fusion mode"
            },
            num(self.penalty_weight),
            num(self.fusion_weight),
        )
    }

    fn exact(&self, name: &str) -> Exact {
        if name != "out" && name != "grad_shared" {
            return Exact::None;
        }
        let d = self.dim();
        Exact::Mask(
            self.has_row()
                .into_iter()
                .flat_map(|has| std::iter::repeat_n(!has || !self.use_gate, d))
                .collect(),
        )
    }
}

/// Which elements of a result must be equal.
enum Exact {
    None,
    All,
    /// Per element, row-major.
    Mask(Vec<bool>),
}

impl Exact {
    fn at(&self, i: usize) -> bool {
        match self {
            Exact::None => false,
            Exact::All => true,
            Exact::Mask(m) => m.get(i).copied().unwrap_or(false),
        }
    }
}

impl FuzzCase {
    fn read(layer: Layer, dtype: RealDtype, bytes: Vec<u8>) -> Result<Self> {
        let mut r = NpzReader::from_bytes("generated case", bytes)?;
        let inputs = match layer {
            Layer::SplitEmbeddings => Inputs::Embeddings(Embeddings::read(&mut r)?),
            Layer::LmHead => Inputs::Head(Head::read(&mut r)?),
            Layer::SplitVocabulary => Inputs::Vocabulary(Vocabulary::read(&mut r)?),
        };
        Ok(FuzzCase { dtype, inputs })
    }

    fn layer(&self) -> Layer {
        match self.inputs {
            Inputs::Embeddings(_) => Layer::SplitEmbeddings,
            Inputs::Head(_) => Layer::LmHead,
            Inputs::Vocabulary(_) => Layer::SplitVocabulary,
        }
    }

    /// The inputs as an npz writer.
    fn writer(&self) -> Result<NpzWriter> {
        let mut w = NpzWriter::new("case.npz");
        match &self.inputs {
            Inputs::Embeddings(c) => c.write(&mut w, self.dtype)?,
            Inputs::Head(c) => c.write(&mut w, self.dtype)?,
            Inputs::Vocabulary(c) => c.write(&mut w, self.dtype),
        }
        Ok(w)
    }

    /// The size that shrinking decreases: the elements of the inputs (and
    /// V, L), then how many features the case has (rank above 1, frozen
    /// splits, logits in the thousands, non-zero penalty weights).
    fn size(&self) -> (usize, usize) {
        match &self.inputs {
            Inputs::Embeddings(c) => c.size(),
            Inputs::Head(c) => c.size(),
            Inputs::Vocabulary(c) => c.size(),
        }
    }

    /// Smaller cases derived from this one, the largest reductions first.
    fn candidates(&self) -> Vec<(String, FuzzCase)> {
        let list = match &self.inputs {
            Inputs::Embeddings(c) => c.candidates(),
            Inputs::Head(c) => c.candidates(self.dtype),
            Inputs::Vocabulary(c) => c.candidates(),
        };
        let size = self.size();
        list.into_iter()
            .map(|(what, inputs)| {
                (
                    what,
                    FuzzCase {
                        dtype: self.dtype,
                        inputs,
                    },
                )
            })
            .filter(|(_, c)| c.size() < size)
            .collect()
    }

    fn describe(&self) -> String {
        match &self.inputs {
            Inputs::Embeddings(c) => c.describe(),
            Inputs::Head(c) => c.describe(),
            Inputs::Vocabulary(c) => c.describe(),
        }
    }

    fn exact(&self, name: &str) -> Exact {
        match &self.inputs {
            Inputs::Embeddings(c) => c.exact(name),
            Inputs::Head(c) => c.exact(name),
            Inputs::Vocabulary(c) => c.exact(name),
        }
    }

    fn rtol(&self) -> f64 {
        match (&self.inputs, self.dtype) {
            (Inputs::Head(h), RealDtype::F32) if h.large_logits() => 1e-3,
            (_, RealDtype::F32) => 1e-5,
            (_, RealDtype::F64) => 1e-9,
        }
    }
}

// ---------------------------------------------------------------------------
// A case ready to run: its bytes and splitgrad's results.

struct Prepared {
    case: FuzzCase,
    /// What made it from the case before (empty for a generated case).
    change: String,
    /// The inputs, as an npz.
    bytes: Vec<u8>,
    /// splitgrad's results, in the order they are written.
    reference: Vec<(String, ArrayD<f64>)>,
}

fn results_f64(results: &Results) -> Vec<(String, ArrayD<f64>)> {
    match results {
        Results::F32(named) => named
            .iter()
            .map(|(n, a)| (n.clone(), a.mapv(f64::from)))
            .collect(),
        Results::F64(named) => named.clone(),
    }
}

impl Prepared {
    /// The case with its reference results; an error when splitgrad
    /// rejects it (a derived case that is not valid).
    fn new(case: FuzzCase, change: String) -> Result<Self> {
        let bytes = to_bytes(&case.writer()?)?;
        let results = compute(case.layer(), Path::new("case"), bytes.clone())?;
        Ok(Prepared {
            reference: results_f64(&results),
            case,
            change,
            bytes,
        })
    }

    /// The golden case file: the inputs, then splitgrad's results.
    fn golden_bytes(&self) -> Result<Vec<u8>> {
        let mut w = self.case.writer()?;
        compute(self.case.layer(), Path::new("case"), self.bytes.clone())?.add_to(&mut w);
        to_bytes(&w)
    }

    /// How the answer at `path` differs from the reference.
    fn compare(&self, path: &Path) -> Vec<Difference> {
        if std::fs::symlink_metadata(path).is_err() {
            return vec![Difference::NoAnswer];
        }
        let unreadable = |e: Error| {
            let msg = e.to_string();
            let prefix = format!("{}: ", path.display());
            Difference::Unreadable(msg.strip_prefix(&prefix).unwrap_or(&msg).to_string())
        };
        let mut r = match NpzReader::open(path) {
            Ok(r) => r,
            Err(e) => return vec![unreadable(e)],
        };
        let expected_dtype = numpy_name(self.case.dtype);
        let rtol = self.case.rtol();
        let mut out = Vec::new();
        for (name, b) in &self.reference {
            if !r.contains(name) {
                out.push(Difference::Missing(name.clone()));
                continue;
            }
            let found = match r.shape(name) {
                Ok(s) => s,
                Err(e) => {
                    out.push(unreadable(e));
                    continue;
                }
            };
            if found != b.shape() {
                out.push(Difference::Shape {
                    array: name.clone(),
                    found,
                    expected: b.shape().to_vec(),
                });
                continue;
            }
            match r.real_dtype(name) {
                Ok(d) if d == self.case.dtype => {}
                _ => {
                    let found = r
                        .dtype(name)
                        .map(|d| d.to_string())
                        .unwrap_or_else(|e| e.to_string());
                    out.push(Difference::Dtype {
                        array: name.clone(),
                        found,
                        expected: expected_dtype,
                    });
                    continue;
                }
            }
            let a = match r.reals::<f64>(name) {
                Ok(a) => a,
                Err(e) => {
                    out.push(unreadable(e));
                    continue;
                }
            };
            if let Some(d) = worst(name, &a, b, &self.case.exact(name), rtol) {
                out.push(d);
            }
        }
        out
    }
}

/// The worst element of `a` against `b`, if any is not close.
fn worst(
    name: &str,
    a: &ArrayD<f64>,
    b: &ArrayD<f64>,
    exact: &Exact,
    rtol: f64,
) -> Option<Difference> {
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let tol = rtol * (1.0 + scale);
    // (excess over the tolerance, element), the largest; NaN is infinite.
    let mut worst: Option<(f64, usize, f64)> = None;
    for (i, (&x, &y)) in a.iter().zip(b.iter()).enumerate() {
        let exact = exact.at(i);
        let bad = if exact {
            x != y
        } else {
            (x - y).is_nan() || (x - y).abs() > tol
        };
        if bad {
            let t = if exact { 0.0 } else { tol };
            let err = (x - y).abs();
            let excess = if err.is_nan() { f64::INFINITY } else { err - t };
            if worst.is_none_or(|(e, _, _)| excess > e) {
                worst = Some((excess, i, t));
            }
        }
    }
    let (_, i, tolerance) = worst?;
    let (found, expected) = (a.iter().nth(i)?, b.iter().nth(i)?);
    Some(Difference::Values {
        array: name.to_string(),
        index: unravel(i, b.shape()),
        found: *found,
        expected: *expected,
        tolerance,
    })
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            index[k] = i % d;
            i /= d;
        }
    }
    index
}

// ---------------------------------------------------------------------------
// Running the program.

/// How a run of the program ended.
enum RunEnd {
    Finished,
    Failed(String),
}

#[cfg(unix)]
unsafe extern "C" {
    // POSIX `int kill(pid_t pid, int sig)`; pid_t is i32 on every Unix
    // Rust supports.
    fn kill(pid: i32, sig: i32) -> i32;
}

/// Kills the child and its process group (it was started as the leader of
/// its own group), and reaps it.
fn stop(child: &mut Child) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: `kill(-pgid, SIGKILL = 9)` takes plain integers and has no
        // memory effects. The group is the child's own (`process_group(0)`);
        // the child is not reaped yet, so its id cannot have been reused.
        unsafe {
            kill(-pid, 9);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn shell(command: &str, inputs: &Path, outputs: &Path) -> Command {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("{command} \"$@\""))
            .arg("sh")
            .arg(inputs)
            .arg(outputs)
            .process_group(0);
        c
    }
    #[cfg(not(unix))]
    {
        let mut c = Command::new("cmd");
        c.arg("/C").arg(format!(
            "{command} \"{}\" \"{}\"",
            inputs.display(),
            outputs.display()
        ));
        c
    }
}

fn describe_status(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("was killed by signal {signal}");
        }
    }
    format!("ended with {status}")
}

/// The last non-empty line of the log, shortened.
fn last_line(log: &Path) -> Option<String> {
    const TAIL: u64 = 4096;
    let mut f = File::open(log).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(TAIL))).ok()?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let full = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    let mut line: String = full.chars().take(160).collect();
    if full.chars().count() > 160 {
        line.push('…');
    }
    Some(line)
}

struct Runner<'a> {
    config: &'a FuzzConfig,
    runs: usize,
    scratch: PathBuf,
}

/// A case that differs: its place in the list, how, and the program's
/// answer file (when it wrote one that can be kept).
type Found = (usize, Vec<Difference>, Option<Vec<u8>>);

/// The result of running the program on several cases.
enum Batch {
    /// Each case's differences (empty when it agrees).
    Judged(Vec<Vec<Difference>>),
    /// The run failed as a whole.
    Failed(String),
}

fn interrupted() -> Error {
    Error::config("interrupted: the program under test was stopped")
}

impl Runner<'_> {
    fn stopped(&self) -> bool {
        self.config
            .stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Relaxed))
    }

    /// Runs the program on `inputs` (holding `<layer>/…`), answers to
    /// `outputs`, its output to `log`.
    fn run(&mut self, inputs: &Path, outputs: &Path, log: &Path) -> Result<RunEnd> {
        let layer = self.config.layer.name();
        let answers = outputs.join(layer);
        std::fs::create_dir_all(&answers).map_err(|e| Error::from(e).in_file(&answers))?;
        let out = File::create(log).map_err(|e| Error::from(e).in_file(log))?;
        let err = out.try_clone().map_err(|e| Error::from(e).in_file(log))?;
        if self.stopped() {
            return Err(interrupted());
        }
        self.runs += 1;
        let mut command = shell(&self.config.command, inputs, outputs);
        command
            .env("SPLITGRAD_FUZZ_INPUTS", inputs)
            .env("SPLITGRAD_FUZZ_OUTPUTS", outputs)
            .env("SPLITGRAD_FUZZ_LAYER", layer)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let mut child = match command.spawn() {
            Ok(c) => c,
            Err(e) => return Ok(RunEnd::Failed(format!("could not be started: {e}"))),
        };
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        let with_log = |what: String| match last_line(log) {
            Some(line) => format!("{what} (its last output: {line})"),
            None => what,
        };
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(RunEnd::Finished),
                Ok(Some(status)) => return Ok(RunEnd::Failed(with_log(describe_status(status)))),
                Ok(None) => {}
                Err(e) => {
                    stop(&mut child);
                    return Ok(RunEnd::Failed(format!("could not be waited for: {e}")));
                }
            }
            if self.stopped() {
                stop(&mut child);
                return Err(interrupted());
            }
            let elapsed = start.elapsed();
            if elapsed >= self.config.timeout {
                stop(&mut child);
                let secs = self.config.timeout.as_secs_f64();
                return Ok(RunEnd::Failed(with_log(format!(
                    "did not finish within the timeout of {} s and was stopped",
                    num(secs)
                ))));
            }
            std::thread::sleep(pause.min(self.config.timeout - elapsed));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Writes `cases` as `cand-NNNN.npz` into a fresh scratch folder, runs
    /// the program on them and judges each answer; returns the verdicts and
    /// the folder (removed by the caller).
    fn batch(&mut self, cases: &[&Prepared]) -> Result<(Batch, PathBuf)> {
        let layer = self.config.layer.name();
        let dir = self.scratch.join(format!("run-{:04}", self.runs + 1));
        let inputs = dir.join("cases");
        let outputs = dir.join("answers");
        let case_dir = inputs.join(layer);
        std::fs::create_dir_all(&case_dir).map_err(|e| Error::from(e).in_file(&case_dir))?;
        for (i, p) in cases.iter().enumerate() {
            // Scratch files, rewritten for every run and removed after it:
            // plain writes (no sync), unlike the results.
            let path = case_dir.join(format!("cand-{i:04}.npz"));
            std::fs::write(&path, &p.bytes).map_err(|e| Error::from(e).in_file(&path))?;
        }
        let end = self.run(&inputs, &outputs, &dir.join("program.log"))?;
        let batch = match end {
            RunEnd::Failed(why) => Batch::Failed(why),
            RunEnd::Finished => Batch::Judged(
                cases
                    .iter()
                    .enumerate()
                    .map(|(i, p)| p.compare(&outputs.join(layer).join(format!("cand-{i:04}.npz"))))
                    .collect(),
            ),
        };
        Ok((batch, dir))
    }

    /// The answer file of case `i` of a batch folder, if it can be kept.
    fn answer_of(&self, dir: &Path, i: usize) -> Option<Vec<u8>> {
        let path = dir
            .join("answers")
            .join(self.config.layer.name())
            .join(format!("cand-{i:04}.npz"));
        read_answer(&path)
    }

    /// The first of `list` whose answer differs, each case run alone.
    fn first_alone(
        &mut self,
        list: &[Prepared],
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<Option<Found>> {
        for (i, p) in list.iter().enumerate() {
            if let Some((_, d, answer)) =
                self.first_difference(std::slice::from_ref(p), progress)?
            {
                return Ok(Some((i, d, answer)));
            }
        }
        Ok(None)
    }

    /// The first of `list` (in order) whose answer differs, with the
    /// differences and the answer's bytes; the runs hold at most [`BATCH`]
    /// cases, and a run that fails as a whole is repeated case by case.
    fn first_difference(
        &mut self,
        list: &[Prepared],
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<Option<Found>> {
        for (chunk_no, chunk) in list.chunks(BATCH).enumerate() {
            let offset = chunk_no * BATCH;
            let refs: Vec<&Prepared> = chunk.iter().collect();
            let (batch, dir) = self.batch(&refs)?;
            let found = match batch {
                Batch::Judged(verdicts) => verdicts
                    .into_iter()
                    .enumerate()
                    .find(|(_, d)| !d.is_empty())
                    .map(|(i, d)| (i, d, self.answer_of(&dir, i))),
                Batch::Failed(why) if chunk.len() == 1 => {
                    Some((0, vec![Difference::Run(why)], self.answer_of(&dir, 0)))
                }
                Batch::Failed(why) => {
                    remove_scratch(&dir);
                    progress(Event::BatchFailed {
                        cases: chunk.len(),
                        failure: &why,
                    });
                    self.first_alone(chunk, progress)?
                }
            };
            remove_scratch(&dir);
            if let Some((i, d, answer)) = found {
                return Ok(Some((offset + i, d, answer)));
            }
        }
        Ok(None)
    }
}

fn remove_scratch(dir: &Path) {
    if dir.is_dir() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn read_answer(path: &Path) -> Option<Vec<u8>> {
    let meta = crate::io::regular_file(path).ok()?;
    if meta.len() > MAX_KEPT_ANSWER {
        return None;
    }
    std::fs::read(path).ok()
}

/// Checks that `out` is empty or absent, creates it and returns its
/// absolute path.
fn prepare_out(out: &Path) -> Result<PathBuf> {
    if out.exists() {
        if !out.is_dir() {
            return Err(Error::config("--out must be a folder; this is a file").in_file(out));
        }
        let mut entries = std::fs::read_dir(out).map_err(|e| Error::from(e).in_file(out))?;
        if entries.next().is_some() {
            return Err(Error::config(
                "the output folder is not empty: fuzz writes only into an empty or new folder, \
                 so that it replaces no earlier results; give another --out",
            )
            .in_file(out));
        }
    }
    std::fs::create_dir_all(out).map_err(|e| Error::from(e).in_file(out))?;
    out.canonicalize().map_err(|e| Error::from(e).in_file(out))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::from(e).in_file(dir))?;
    }
    write_atomic(path, |f| Ok(f.write_all(bytes)?))
}

/// Generates `config.cases` cases of the layer, runs the program on them
/// and compares its answers with splitgrad's; on a difference, shrinks the
/// case to a minimal one and writes it. `docs/golden.md` (*Fuzzing a
/// program*) describes the program's contract, what is a difference, the
/// tolerances, the shrinking and the files written. `progress` is told what
/// happens as it happens.
///
/// Errors: `cases` 0, an empty command or a zero timeout
/// ([`crate::ErrorKind::Config`]); `out` a file or a folder that is not
/// empty ([`crate::ErrorKind::Config`] naming it); a file or folder that
/// cannot be written ([`crate::ErrorKind::Io`] naming it); `config.stop`
/// set ([`crate::ErrorKind::Config`], after the program is stopped). A
/// program that cannot be started is a difference, not an error. The
/// scratch folder is removed in every case.
///
/// ```no_run
/// use std::time::Duration;
/// use splitgrad::app::golden::{FuzzConfig, FuzzOutcome, Layer, fuzz};
/// use splitgrad::io::RealDtype;
/// let config = FuzzConfig {
///     layer: Layer::LmHead,
///     cases: 64,
///     seed: 0,
///     dtype: RealDtype::F64,
///     timeout: Duration::from_secs(60),
///     command: "python3 my_head.py".into(),
///     out: "fuzz-head".into(),
///     stop: None,
/// };
/// match fuzz(&config, &mut |_| {})? {
///     FuzzOutcome::Agree { cases } => println!("{cases} cases agree"),
///     FuzzOutcome::Differ(finding) => println!("{}", finding.summary()),
///     FuzzOutcome::BatchOnly { failure, .. } => println!("the program {failure}"),
/// }
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn fuzz(config: &FuzzConfig, progress: &mut dyn FnMut(Event<'_>)) -> Result<FuzzOutcome> {
    if config.cases == 0 {
        return Err(Error::config("the number of cases must be at least 1"));
    }
    if config.command.trim().is_empty() {
        return Err(Error::config("the command to run is empty"));
    }
    if config.timeout.is_zero() {
        return Err(Error::config("the timeout must be positive"));
    }
    let out = prepare_out(&config.out)?;
    let result = search(config, &out, progress);
    // Whatever happened, the runs on derived cases are over.
    remove_scratch(&out.join("scratch"));
    result
}

/// [`fuzz`] in the prepared folder `out` (absolute).
fn search(
    config: &FuzzConfig,
    out: &Path,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<FuzzOutcome> {
    let layer = config.layer;

    // The generated cases, inputs only.
    let cases_dir = out.join("cases");
    let base = Rng::new(config.seed);
    let mut generated = Vec::with_capacity(config.cases);
    for i in 0..config.cases {
        let bytes = generate_case(layer, &mut base.fork(i as u64), config.dtype);
        let case = FuzzCase::read(layer, config.dtype, bytes)?;
        let prepared = Prepared::new(case, String::new())?;
        write_file(
            &cases_dir.join(layer.name()).join(case_file_name(i)),
            &prepared.bytes,
        )?;
        generated.push(prepared);
    }
    progress(Event::Generated {
        cases: config.cases,
        dir: &cases_dir,
    });

    let mut runner = Runner {
        config,
        runs: 0,
        scratch: out.join("scratch"),
    };
    let answers_dir = out.join("answers");
    let start = Instant::now();
    let end = runner.run(&cases_dir, &answers_dir, &out.join("program.log"))?;
    let name_of = |i: usize| case_file_name(i).trim_end_matches(".npz").to_string();
    let answer_path = |i: usize| answers_dir.join(layer.name()).join(case_file_name(i));
    let first = match end {
        RunEnd::Finished => {
            let verdicts: Vec<Vec<Difference>> = generated
                .iter()
                .enumerate()
                .map(|(i, p)| p.compare(&answer_path(i)))
                .collect();
            let differing = verdicts.iter().filter(|d| !d.is_empty()).count();
            progress(Event::Checked {
                cases: config.cases,
                differing,
                elapsed: start.elapsed(),
            });
            // The smallest differing case, the first of equal ones.
            verdicts
                .into_iter()
                .enumerate()
                .filter(|(_, d)| !d.is_empty())
                .min_by_key(|(i, _)| (generated[*i].case.size(), *i))
                .map(|(i, d)| (i, d, read_answer(&answer_path(i))))
        }
        RunEnd::Failed(why) if config.cases == 1 => {
            Some((0, vec![Difference::Run(why)], read_answer(&answer_path(0))))
        }
        RunEnd::Failed(why) => {
            progress(Event::BatchFailed {
                cases: config.cases,
                failure: &why,
            });
            match runner.first_alone(&generated, progress)? {
                Some(found) => Some(found),
                None => {
                    return Ok(FuzzOutcome::BatchOnly {
                        cases: config.cases,
                        failure: why,
                    });
                }
            }
        }
    };
    let Some((index, mut differences, mut answer)) = first else {
        return Ok(FuzzOutcome::Agree {
            cases: config.cases,
        });
    };
    let original = name_of(index);
    let mut current = generated.swap_remove(index);
    drop(generated);
    let mut description = current.case.describe();
    progress(Event::Found {
        name: &original,
        case: &description,
        differences: &differences,
    });

    // Greedy shrinking: the first smaller case that still differs replaces
    // the current one, until none does.
    let mut steps = 0;
    loop {
        let mut seen = HashSet::new();
        let candidates: Vec<Prepared> = current
            .case
            .candidates()
            .into_iter()
            .filter_map(|(what, c)| Prepared::new(c, what).ok())
            .filter(|p| p.bytes != current.bytes && seen.insert(p.bytes.clone()))
            .collect();
        if candidates.is_empty() {
            break;
        }
        let Some((i, d, a)) = runner.first_difference(&candidates, progress)? else {
            break;
        };
        steps += 1;
        current = candidates
            .into_iter()
            .nth(i)
            .ok_or_else(|| Error::format("a shrink step lost its case"))?;
        differences = d;
        answer = a;
        description = current.case.describe();
        progress(Event::Shrunk {
            step: steps,
            change: &current.change,
            case: &description,
        });
    }
    remove_scratch(&runner.scratch);
    // Written under the absolute path, named as the caller named `out`.
    let minimal_file = Path::new("minimal").join(layer.name()).join("minimal.npz");
    write_file(&out.join(&minimal_file), &current.golden_bytes()?)?;
    let answer_file = Path::new("minimal-answer")
        .join(layer.name())
        .join("minimal.npz");
    let answer = match answer {
        Some(bytes) => {
            write_file(&out.join(&answer_file), &bytes)?;
            Some(config.out.join(answer_file))
        }
        None => None,
    };
    let minimal_dir = config.out.join("minimal");
    let minimal = config.out.join(minimal_file);
    let finding = Finding {
        layer,
        dtype: config.dtype,
        original,
        case: description,
        differences,
        steps,
        runs: runner.runs,
        minimal_dir,
        minimal,
        answer,
    };
    let mut text = finding.summary();
    text.push('\n');
    for d in &finding.differences {
        text += &format!("  {d}\n");
    }
    write_file(&out.join("summary.txt"), text.as_bytes())?;
    Ok(FuzzOutcome::Differ(Box::new(finding)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets_keep_one_then_remove_chunks() {
        let s = subsets(4, "id");
        let keeps: Vec<&[usize]> = s.iter().map(|(_, k)| k.as_slice()).collect();
        assert_eq!(
            keeps,
            [
                &[0][..],
                &[1],
                &[2],
                &[3],
                &[2, 3],
                &[0, 1],
                &[1, 2, 3],
                &[0, 2, 3],
                &[0, 1, 3],
                &[0, 1, 2]
            ]
        );
        assert!(subsets(1, "id").is_empty());
        assert_eq!(widths(8), [1, 4, 7]);
        assert_eq!(widths(2), [1]);
        assert!(widths(1).is_empty());
    }

    #[test]
    fn every_candidate_of_generated_cases_is_valid_and_smaller() {
        for layer in Layer::ALL {
            for dtype in [RealDtype::F64, RealDtype::F32] {
                for i in 0..20 {
                    let bytes = generate_case(layer, &mut Rng::new(5).fork(i), dtype);
                    let case = FuzzCase::read(layer, dtype, bytes).unwrap();
                    let p = Prepared::new(case, String::new()).unwrap();
                    for (what, c) in p.case.candidates() {
                        assert!(c.size() < p.case.size(), "{layer} {i}: {what}");
                        if let Err(e) = Prepared::new(c, what.clone()) {
                            panic!("{layer} {i}: {what}: {e}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_generated_case_reads_back_to_the_same_bytes() {
        for layer in Layer::ALL {
            for dtype in [RealDtype::F64, RealDtype::F32] {
                let bytes = generate_case(layer, &mut Rng::new(2).fork(3), dtype);
                let case = FuzzCase::read(layer, dtype, bytes.clone()).unwrap();
                let p = Prepared::new(case, String::new()).unwrap();
                // The generated case holds the inputs then the results,
                // so the golden bytes are the generated bytes.
                assert_eq!(p.golden_bytes().unwrap(), bytes, "{layer} {dtype:?}");
            }
        }
    }

    #[test]
    fn worst_element_and_exact_copies() {
        let b = ndarray::arr1(&[1.0, -2.0, 0.0]).into_dyn();
        let mut a = b.clone();
        assert!(worst("x", &a, &b, &Exact::None, 1e-9).is_none());
        a[[2]] = -0.0;
        assert!(worst("x", &a, &b, &Exact::All, 1e-9).is_none());
        a[[2]] = 1e-12;
        assert!(worst("x", &a, &b, &Exact::None, 1e-9).is_none());
        let d = worst("x", &a, &b, &Exact::All, 1e-9).unwrap();
        assert_eq!(
            d.to_string(),
            "`x` at [2] is 1.000e-12, splitgrad's 0 (a copy: must be equal)"
        );
        a[[1]] = f64::NAN;
        let d = worst("x", &a, &b, &Exact::None, 1e-9).unwrap();
        assert!(
            matches!(d, Difference::Values { ref index, .. } if index == &[1]),
            "{d}"
        );
        assert_eq!(unravel(5, &[2, 3]), [1, 2]);
    }
}
