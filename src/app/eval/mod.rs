//! Held-out evaluation of the bigram model: the answer to "which pairs
//! needed a row of their own?" on text the model did not train on.
//!
//! [`split_heldout`] sets aside a deterministic part of a corpus, by
//! sequence. [`evaluate`] computes, on it:
//!
//! - the mean cross-entropy of the trained model, and of the same model
//!   with every gate closed (every context reads its shared row: the
//!   shared-only ablation), overall and per language;
//! - for every split row r, its **held-out gain**: what the held-out
//!   tokens whose context is r's pair lose when that one gate is closed,
//!   `d_n = ce_closed_n − ce_n`, summed (nats) and as a mean per token with
//!   its standard error. Closing one gate changes only the tokens of that
//!   context, so every row's gain comes from the two per-token losses.
//!
//! [`Rule`] decides which rows to keep, by testing each row against the
//! hypothesis that its pair needs no row: that its tokens follow the
//! shared row's distribution q° (the model with that gate closed). Under
//! that hypothesis each held-out token's saving `d(y) = ln q(y) − ln q°(y)`
//! is a draw of a known distribution — its mean `μ₀ = −KL(q° ‖ q) ≤ 0`,
//! its variance `σ₀²` and its largest value follow from the two rows of
//! logits — so the n tokens' total saving `S` exceeds `n·μ₀ + r` with
//! probability at most `exp(−(v/b²)·h(b·r/v))`, `v = n·σ₀²`,
//! `h(u) = (1 + u)·ln(1 + u) − u` (Bennett's inequality, b the largest
//! `d − μ₀`). A row is kept when
//!
//! - `S − n·μ₀ > r`, with r set so that this probability is α/n_rows
//!   (α = 5 %, Bonferroni over all rows): its tokens do not follow the
//!   shared distribution;
//! - the saving per token `S/n` exceeds [`Rule::margin`], a quarter of a
//!   nat (the row cuts its contexts' perplexity by a fifth): the row is
//!   worth having. A pair that follows its own distribution saves whole
//!   nats a token; a row that only adds capacity — it fits its token's
//!   shared distribution a little better, or the model learned to rely on
//!   the mix — saves a few hundredths, even on a corpus where the language
//!   carries no information at all;
//! - it was seen at least [`Rule::min_count`] times.
//!
//! The bound holds for any number of tokens and any shape of q°, so a
//! handful of tokens that happen to agree (a sample variance of 0) cannot
//! pass for evidence. No fixed cut-off on the gates enters: a gate that
//! closed to 0.2 after a long run still keeps its row if the row still
//! saves loss on held-out text, and a gate that opened on noise does not.
//!
//! Cost: the model's hidden state depends only on the context (l, t), so
//! the held-out tokens read at most one shared row per distinct context
//! token and one mixed row per split row they visit (never more than V +
//! n_rows, and rows no held-out token visits cost nothing). Their
//! log-sum-exp is computed once, with the fused head's kernel (no V × n
//! logits), and each token's loss is then one dot product:
//! `loss_n = (m_h − h·W_y) + ln Σ_v e^{z_hv − m_h}`. Tokens run in parallel
//! in chunks whose sums are added in a fixed order, so the figures do not
//! depend on the thread count.

mod figures;
mod measure;
mod rule;
mod split;

pub use figures::{HeldOut, LanguageEval, RowEval};
pub use measure::{evaluate, heldout_ce};
pub use rule::Rule;
pub use split::{heldout_sequences, split_heldout};
