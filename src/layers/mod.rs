//! The three layers: [`SplitTokenEmbeddings`], [`SplitVocabulary`] and
//! [`SplitLanguageModellingHead`], each recording its forward pass on a
//! [`Tape`](crate::Tape).

pub mod fused_ce;
pub mod fused_ce_sum;
pub mod gated_mix;
pub mod lm_head;
pub mod split_embeddings;
pub mod split_vocabulary;
mod splits;

pub use lm_head::SplitLanguageModellingHead;
pub use split_embeddings::SplitTokenEmbeddings;
pub use split_vocabulary::SplitVocabulary;
pub use splits::SplitTables;
