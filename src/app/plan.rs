//! The memory a run will need, known before anything is allocated.
//!
//! V, L, D, the number of split rows and the batch come from files and
//! flags; a corpus holding token id 4·10⁹ implies V = 4·10⁹ + 1, and
//! `--dim 1000000000` means what it says. [`Plan::check`] adds up what the
//! model, its optimiser state, one training step and the held-out
//! evaluation take for those sizes and refuses, naming every size and where
//! it came from, a run that the machine cannot hold, before the first
//! allocation that depends on them.

use crate::error::human_bytes;
use crate::error::{Error, ErrorKind, Result};
use crate::io::{bytes_of, memory_available};
use crate::param::Dtype;

/// The sizes of a run and where they came from.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// V.
    pub vocab_size: usize,
    /// Where V came from ("stated by corpus.npz", "the largest token id of
    /// corpus.npz + 1", …).
    pub vocab_source: String,
    /// L.
    pub n_languages: usize,
    /// Where L came from.
    pub languages_source: String,
    /// D.
    pub dim: usize,
    /// Split rows.
    pub n_rows: usize,
    /// Bigrams a step (0 when nothing is trained, as in `report`).
    pub batch: usize,
    /// The corpus in memory (training and held-out parts), or zero when
    /// there is none (a model alone, as `report` loads it).
    pub corpus: CorpusSize,
    /// Bytes of one real (4 for `f32`): the math, the gradients, the
    /// activations.
    pub real_bytes: usize,
    /// How the parameters are kept (`None`: as reals).
    pub param_dtype: Option<Dtype>,
    /// How the optimiser's moments are kept (`None`: as reals).
    pub state_dtype: Option<Dtype>,
    /// What is done with the model, for the error: "training" (the
    /// default, when empty) or "loading".
    pub action: &'static str,
}

/// The size of a corpus in memory: its tokens at the widths their ids are
/// kept at ([`crate::io::Column`]) and its sequence starts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CorpusSize {
    /// Tokens, training and held-out parts together.
    pub tokens: u64,
    /// Sequences.
    pub sequences: u64,
    /// Bytes a token: its id's width plus its language's.
    pub bytes_per_token: u64,
    /// The part of the tokens copied out as the held-out split while the
    /// corpus is split (0 for a held-out file, read apart).
    pub heldout_fraction: f64,
}

impl CorpusSize {
    /// Bytes at the peak: the corpus, its starts, and the held-out part
    /// copied out of it.
    pub fn bytes(&self) -> u64 {
        let whole = bytes_of(&[self.tokens, self.bytes_per_token])
            .saturating_add(bytes_of(&[self.sequences, 8]));
        let f = self.heldout_fraction.clamp(0.0, 1.0);
        whole.saturating_add((whole as f64 * f).ceil() as u64)
    }
}

/// Workspace that does not grow with the sizes: the fused head's chunks,
/// the evaluation's blocks, the pool's spare buffers.
const FIXED: u64 = 96 << 20;

impl Plan {
    /// The bytes the run needs, by its largest parts (an upper estimate:
    /// the corpus with its held-out split, every table with its two Adam
    /// moments at the bytes of their dtypes, the head's dense gradient, a step's activations and
    /// gradients, the evaluation's hidden rows and per-language sums).
    /// `u64::MAX` if that overflows.
    pub fn bytes(&self) -> u64 {
        self.parts()
            .into_iter()
            .try_fold(0u64, |acc, (_, b)| acc.checked_add(b))
            .unwrap_or(u64::MAX)
    }

    /// [`bytes`](Self::bytes) by part, named for a person.
    pub fn parts(&self) -> [(&'static str, u64); 4] {
        let (v, l, d, n) = (
            self.vocab_size as u64,
            self.n_languages as u64,
            self.dim as u64,
            self.n_rows as u64,
        );
        let t = self.real_bytes as u64;
        let size = |d: Option<Dtype>| d.map_or(t, |d| d.size() as u64);
        let (p, m) = (size(self.param_dtype), size(self.state_dtype));
        // A parameter kept narrower than a real is widened for each step
        // (the tape's copy) and for each evaluation.
        let widened = if p < t { 2 * t } else { 0 };
        let sum = |parts: &[u64]| {
            parts
                .iter()
                .try_fold(0u64, |acc, &b| acc.checked_add(b))
                .unwrap_or(u64::MAX)
        };
        let model = sum(&[
            // Shared table and head, each with two moments; the head's
            // dense gradient; the evaluation's copy of the head and its
            // hidden rows (at most V + n of them); the widened copies.
            bytes_of(&[v, d, 2 * p + 4 * m + 3 * t + 2 * widened]),
            // Split rows with two moments and their gradient (and their
            // widened copies), gates.
            bytes_of(&[n, d, p + 2 * m + t + widened]),
            bytes_of(&[8, n, 8]),
            // The index, its lookup and the evaluation's per-row figures.
            bytes_of(&[n, 96]),
            // Per language: the evaluation's sums.
            bytes_of(&[l, 64]),
        ]);
        // A step: ids, gathered and mixed rows, their gradients.
        let step = bytes_of(&[self.batch as u64, 12 * d * t + 64]);
        [
            ("the corpus", self.corpus.bytes()),
            ("the model with its optimiser state", model),
            ("a step", step),
            ("workspace", FIXED),
        ]
    }

    /// The sizes in words, for an error.
    fn describe(&self) -> String {
        let mut s = format!("V {}", self.vocab_size);
        if !self.vocab_source.is_empty() {
            s += &format!(" ({})", self.vocab_source);
        }
        s += &format!(", L {}", self.n_languages);
        if !self.languages_source.is_empty() {
            s += &format!(" ({})", self.languages_source);
        }
        s += &format!(", D {}, {} split rows", self.dim, self.n_rows);
        if self.batch > 0 {
            s += &format!(", batch {}", self.batch);
        }
        let c = &self.corpus;
        if c.tokens > 0 {
            s += &format!(
                ", a corpus of {} tokens at {} bytes each",
                c.tokens, c.bytes_per_token
            );
        }
        s
    }

    /// Checks that the run fits in the memory available, before anything
    /// of its size is allocated.
    ///
    /// Errors: [`ErrorKind::TooLarge`] naming every size, its source, the
    /// bytes needed and available, and the flags that change them.
    ///
    /// ```
    /// use splitgrad::app::plan::Plan;
    /// let fits = Plan { vocab_size: 500, n_languages: 4, dim: 64, n_rows: 80, batch: 4096, real_bytes: 4, ..Plan::default() };
    /// assert!(fits.check("--dim or --batch").is_ok());
    /// let huge = Plan { vocab_size: 4_000_000_001, vocab_source: "the largest token id + 1".into(), ..fits };
    /// let e = huge.check("--dim or --batch").unwrap_err().to_string();
    /// assert!(e.starts_with("training this model (V 4000000001 (the largest token id + 1), L 4, D 64, 80 split rows, batch 4096) need"), "{e}");
    /// ```
    pub fn check(&self, flags: &str) -> Result<()> {
        let bytes = self.bytes();
        let available = memory_available();
        if bytes <= available {
            return Ok(());
        }
        Err(Error::new(ErrorKind::TooLarge {
            what: format!(
                "{} this model ({})",
                if self.action.is_empty() {
                    "training"
                } else {
                    self.action
                },
                self.describe()
            ),
            bytes,
            available,
            hint: {
                let parts: Vec<String> = self
                    .parts()
                    .iter()
                    .filter(|(_, b)| *b > 0)
                    .map(|(name, b)| format!("{name} {}", human_bytes(*b)))
                    .collect();
                let mut hint = parts.join(" + ");
                if !flags.is_empty() {
                    hint += &format!("; lower {flags}");
                }
                hint
            },
        }))
    }

    /// The figure [`bytes`](Self::bytes) gives, for a person.
    pub fn human(&self) -> String {
        human_bytes(self.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_run() -> Plan {
        Plan {
            vocab_size: 500,
            n_languages: 4,
            dim: 64,
            n_rows: 80,
            batch: 4096,
            corpus: CorpusSize {
                tokens: 1 << 20,
                sequences: 1 << 10,
                bytes_per_token: 3,
                heldout_fraction: 0.1,
            },
            real_bytes: 4,
            ..Plan::default()
        }
    }

    #[test]
    fn the_default_run_needs_little() {
        let b = default_run().bytes();
        assert!(b < 256 << 20, "{}", human_bytes(b));
        assert!(default_run().check("--dim").is_ok());
    }

    #[test]
    fn every_size_from_outside_can_make_a_run_too_large() {
        let cases = [
            Plan {
                vocab_size: 4_000_000_001,
                ..default_run()
            },
            Plan {
                n_languages: 4_000_000_001,
                ..default_run()
            },
            Plan {
                dim: 1_000_000_000,
                ..default_run()
            },
            Plan {
                batch: 1_000_000_000_000,
                ..default_run()
            },
            Plan {
                n_rows: usize::MAX,
                ..default_run()
            },
            Plan {
                corpus: CorpusSize {
                    tokens: 1 << 50,
                    ..default_run().corpus
                },
                ..default_run()
            },
        ];
        for p in cases {
            let e = p.check("--dim or --batch").unwrap_err();
            assert!(matches!(e.kind(), ErrorKind::TooLarge { .. }), "{e}");
            assert!(e.to_string().ends_with("; lower --dim or --batch"), "{e}");
        }
    }

    #[test]
    fn a_corpus_too_large_is_named_with_every_part() {
        let p = Plan {
            corpus: CorpusSize {
                tokens: 1 << 42,
                sequences: 1 << 30,
                bytes_per_token: 3,
                heldout_fraction: 0.1,
            },
            ..default_run()
        };
        let e = p.check("--dim or --batch").unwrap_err().to_string();
        assert!(
            e.starts_with(
                "training this model (V 500, L 4, D 64, 80 split rows, batch 4096, \
                 a corpus of 4398046511104 tokens at 3 bytes each) needs "
            ),
            "{e}"
        );
        let corpus = human_bytes(p.corpus.bytes());
        assert!(
            e.contains(&format!(
                "; the corpus {corpus} + the model with its optimiser state "
            )),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        // The held-out copy is counted: 3.3 bytes a token at a tenth.
        let whole = (3u64 << 42) + (8 << 30);
        let held = p.corpus.bytes() - whole;
        assert!(held.abs_diff(whole / 10) <= 1, "{held}");
    }

    #[test]
    fn half_precision_takes_less_and_f32_is_the_default() {
        let f32_named = Plan {
            param_dtype: Some(Dtype::F32),
            state_dtype: Some(Dtype::F32),
            ..default_run()
        };
        assert_eq!(f32_named.parts(), default_run().parts());
        let model = |p: &Plan| p.parts()[1].1;
        let bf16 = Plan {
            param_dtype: Some(Dtype::BF16),
            ..default_run()
        };
        let both = Plan {
            state_dtype: Some(Dtype::BF16),
            ..bf16.clone()
        };
        let state_only = Plan {
            state_dtype: Some(Dtype::BF16),
            ..default_run()
        };
        // Per element of a table and the head: 36 bytes in f32; bf16
        // parameters 4 + 16 + 12 + the widened copies 16 = 48; with bf16
        // moments 40; bf16 moments alone 28.
        let (v, d, n) = (500u64, 64u64, 80u64);
        let rest = model(&default_run()) - 36 * v * d - 16 * n * d;
        assert_eq!(model(&bf16), rest + 48 * v * d + 22 * n * d);
        assert_eq!(model(&both), rest + 40 * v * d + 18 * n * d);
        assert_eq!(model(&state_only), rest + 28 * v * d + 12 * n * d);
    }

    #[test]
    fn the_estimate_grows_with_the_work() {
        let small = default_run().bytes();
        let wide = Plan {
            vocab_size: 32_000,
            dim: 512,
            ..default_run()
        }
        .bytes();
        // The head, the table and their moments: 9 · V · D · 4 bytes at least.
        assert!(wide >= 9 * 32_000 * 512 * 4);
        assert!(wide > small);
    }
}
