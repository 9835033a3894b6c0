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

use super::{CaseDtype, Layer, Results, case_file_name, compute, generate_case, to_bytes};
use crate::io::{NpzReader, NpzWriter, write_atomic};
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
    pub dtype: CaseDtype,
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
        /// The case's (`float64`, `float32`), or for a half-precision case
        /// the output's half type and `float32` for the other results.
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

/// numpy's name of a case's real dtype.
fn numpy_name(dtype: CaseDtype) -> &'static str {
    dtype.numpy_name()
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
    pub dtype: CaseDtype,
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
            let w = CaseDtype::read_any(r, &format!("weight_{k}"))?;
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

    fn write(&self, w: &mut NpzWriter, dtype: CaseDtype, with_trainable: bool) {
        let sizes: Array1<i64> = self.sizes.iter().map(|&s| s as i64).collect();
        w.add("split_sizes", &sizes);
        if with_trainable {
            let flags: Array1<u8> = self.trainable.iter().map(|&t| u8::from(t)).collect();
            w.add("split_trainable", &flags);
        }
        for (k, weight) in self.weights.iter().enumerate() {
            dtype.add_reals(w, &format!("weight_{k}"), weight);
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
    dtype: CaseDtype,
    inputs: Inputs,
}

fn to_rows(a: ArrayD<f64>, rows: usize, cols: usize) -> Result<Array2<f64>> {
    let found = a.shape().to_vec();
    Array2::from_shape_vec((rows, cols), a.iter().copied().collect())
        .map_err(|_| Error::shape("array", format!("({rows}, {cols})"), &found))
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

mod run;
mod shrink;
#[cfg(test)]
mod tests;

pub use run::fuzz;
#[allow(unused_imports)]
use run::*;
#[allow(unused_imports)]
use shrink::*;
