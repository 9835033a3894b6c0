//! temporary stub
use crate::Result;
use std::path::Path;
#[derive(Clone, Debug)]
pub struct SplitIndex {
    pub language_index: Vec<usize>,
    pub token_index: Vec<usize>,
    pub score: Option<Vec<f64>>,
}
impl SplitIndex {
    pub fn new(language_index: Vec<usize>, token_index: Vec<usize>) -> Self {
        SplitIndex {
            language_index,
            token_index,
            score: None,
        }
    }
    pub fn validate(&self, _l: usize, _v: usize) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for (i, p) in self
            .language_index
            .iter()
            .zip(&self.token_index)
            .enumerate()
        {
            if !seen.insert(p) {
                return Err(crate::Error::config(format!("dup {i}")));
            }
        }
        Ok(())
    }
    pub fn lookup(&self, l: usize, v: usize) -> PairLookup {
        let mut m = vec![u32::MAX; l * v];
        for (i, (&a, &b)) in self
            .language_index
            .iter()
            .zip(&self.token_index)
            .enumerate()
        {
            m[a * v + b] = i as u32;
        }
        PairLookup { m, v }
    }
}
#[derive(Clone, Debug)]
pub struct PairLookup {
    m: Vec<u32>,
    v: usize,
}
impl PairLookup {
    pub fn get(&self, l: usize, t: usize) -> Option<usize> {
        let r = self.m[l * self.v + t];
        (r != u32::MAX).then_some(r as usize)
    }
}
pub fn load_index(_p: &Path, _l: usize, _v: usize) -> Result<SplitIndex> {
    todo!()
}
/// stub
#[derive(Clone, Debug)]
pub struct Corpus {
    pub token_ids: Vec<u32>,
    pub language_ids: Vec<u32>,
    pub sequence_starts: Vec<usize>,
}
