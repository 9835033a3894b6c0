//! Named splits of one vocabulary, each with its own `(size_k, H)` table:
//! the part [`SplitTokenEmbeddings`](super::SplitTokenEmbeddings) and
//! [`SplitLanguageModellingHead`](super::SplitLanguageModellingHead) share.

use ndarray::{Array2, ArrayViewD};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::io::{bytes_of, check_memory};
use crate::kernels::Real;
use crate::kernels::routing::{Routed, SplitRouting};
use crate::param::{Dtype, Parameter, Stored, StoredMut};
use crate::rng::Rng;

/// Named tables that own contiguous ranges of one vocabulary, in order.
///
/// Table k is a [`Parameter`] named `<prefix>.<split>.weight` of shape
/// `(size_k, H)`; split k owns global ids `[start_k, start_k + size_k)`.
///
/// ```
/// use splitgrad::layers::SplitTables;
/// let t = SplitTables::<f32>::new("token_embedding", &[("orig", 10), ("prompt", 2)], &["orig", "prompt"], 4)?;
/// assert_eq!(t.vocab_size(), 12);
/// assert_eq!(t.table("prompt").unwrap().name(), "token_embedding.prompt.weight");
/// assert!(SplitTables::<f32>::new("x", &[("a", 1)], &["a", "a"], 4).is_err());
/// # Ok::<(), splitgrad::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SplitTables<T> {
    order: Vec<String>,
    routing: SplitRouting,
    hidden: usize,
    tables: Vec<Parameter<T>>,
}

impl<T: Real> SplitTables<T> {
    /// Validates the splits and makes zero tables.
    ///
    /// Errors ([`ErrorKind::Config`](crate::ErrorKind::Config)): empty
    /// order; a name in the order with no size; a name twice in the order
    /// or in the sizes; a sized split missing from the order; hidden size 0.
    pub fn new<S: AsRef<str>, O: AsRef<str>>(
        prefix: &str,
        split_vocab_size: &[(S, usize)],
        split_order: &[O],
        hidden_size: usize,
    ) -> Result<Self> {
        Self::with_dtype(
            prefix,
            split_vocab_size,
            split_order,
            hidden_size,
            Dtype::of::<T>(),
        )
    }

    /// [`Self::new`] with the zero tables kept as `dtype` from the start
    /// (no f32 table is ever made), the memory check counting its bytes.
    ///
    /// Errors: those of [`Self::new`]; a dtype `T` cannot hold (f64
    /// tables in an f32 layer).
    ///
    /// ```
    /// use splitgrad::{layers::SplitTables, param::Dtype};
    /// let t = SplitTables::<f32>::with_dtype("e", &[("a", 10)], &["a"], 4, Dtype::BF16)?;
    /// assert_eq!((t.tables()[0].dtype(), t.tables()[0].nbytes()), (Dtype::BF16, 80));
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn with_dtype<S: AsRef<str>, O: AsRef<str>>(
        prefix: &str,
        split_vocab_size: &[(S, usize)],
        split_order: &[O],
        hidden_size: usize,
        dtype: Dtype,
    ) -> Result<Self> {
        if dtype != Dtype::of::<T>() && !dtype.is_half() {
            return Err(Error::config(format!(
                "a {} layer cannot keep its tables as {dtype}",
                T::NAME
            )));
        }
        if split_order.is_empty() {
            return Err(Error::config("split_order is empty"));
        }
        if hidden_size == 0 {
            return Err(Error::config("hidden_size must be positive, got 0"));
        }
        for (i, (name, _)) in split_vocab_size.iter().enumerate() {
            if split_vocab_size[..i]
                .iter()
                .any(|(n, _)| n.as_ref() == name.as_ref())
            {
                return Err(Error::config(format!(
                    "split `{}` is given a size twice",
                    name.as_ref()
                )));
            }
        }
        let mut order = Vec::with_capacity(split_order.len());
        let mut sizes = Vec::with_capacity(split_order.len());
        for name in split_order {
            let name = name.as_ref();
            if order.iter().any(|n: &String| n == name) {
                return Err(Error::config(format!(
                    "split `{name}` appears twice in split_order"
                )));
            }
            let Some((_, size)) = split_vocab_size.iter().find(|(n, _)| n.as_ref() == name) else {
                return Err(Error::config(format!(
                    "split `{name}` in split_order has no size in split_vocab_size"
                )));
            };
            order.push(name.to_string());
            sizes.push(*size);
        }
        if let Some((name, _)) = split_vocab_size
            .iter()
            .find(|(n, _)| !order.iter().any(|o| o == n.as_ref()))
        {
            return Err(Error::config(format!(
                "split `{}` has a size but is missing from split_order",
                name.as_ref()
            )));
        }
        if sizes
            .iter()
            .try_fold(0usize, |a, &s| a.checked_add(s))
            .is_none()
        {
            return Err(Error::config(format!(
                "the split sizes add up to more than {} ids",
                usize::MAX
            )));
        }
        let mut total = 0u64;
        for (name, &size) in order.iter().zip(&sizes) {
            let bytes = table_bytes(size, hidden_size, dtype);
            total = total.saturating_add(bytes);
            check_memory(
                || {
                    format!(
                        "`{prefix}.{name}.weight` ({size} × {hidden_size} {dtype}{})",
                        if total > bytes {
                            ", with the tables before it"
                        } else {
                            ""
                        }
                    )
                },
                total,
                "",
            )?;
        }
        let tables = order
            .iter()
            .zip(&sizes)
            .map(|(name, &size)| {
                let name = format!("{prefix}.{name}.weight");
                if dtype.is_half() {
                    Ok(Parameter::new_stored(
                        name,
                        Stored::zeros(&[size, hidden_size], dtype)?,
                    ))
                } else {
                    Ok(Parameter::new(
                        name,
                        Array2::<T>::zeros((size, hidden_size)).into_dyn(),
                    ))
                }
            })
            .collect::<Result<_>>()?;
        Ok(SplitTables {
            order,
            routing: SplitRouting::new(&sizes),
            hidden: hidden_size,
            tables,
        })
    }

    /// Split names, in vocabulary order.
    pub fn split_order(&self) -> &[String] {
        &self.order
    }

    /// H.
    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    /// V, the sum of the split sizes.
    pub fn vocab_size(&self) -> usize {
        self.routing.vocab_size()
    }

    /// The id ranges of the splits.
    pub fn routing(&self) -> &SplitRouting {
        &self.routing
    }

    /// The tables, in split order.
    pub fn tables(&self) -> &[Parameter<T>] {
        &self.tables
    }

    /// The tables, to change in place.
    pub fn tables_mut(&mut self) -> &mut [Parameter<T>] {
        &mut self.tables
    }

    /// Position of a split in the order.
    pub fn index_of(&self, split: &str) -> Option<usize> {
        self.order.iter().position(|n| n == split)
    }

    /// The table of a split.
    pub fn table(&self, split: &str) -> Option<&Parameter<T>> {
        self.index_of(split).map(|k| &self.tables[k])
    }

    /// The table of a split, to change in place.
    pub fn table_mut(&mut self, split: &str) -> Option<&mut Parameter<T>> {
        self.index_of(split).map(move |k| &mut self.tables[k])
    }

    /// Freezes (`false`) or unfreezes a split; an unknown split is an error.
    pub fn set_trainable(&mut self, split: &str, trainable: bool) -> Result<()> {
        let k = self.index_of(split).ok_or_else(|| {
            Error::config(format!(
                "no split named `{split}` (splits: {})",
                self.order.join(", ")
            ))
        })?;
        self.tables[k].set_trainable(trainable);
        Ok(())
    }

    /// Routes ids (of any shape) to their splits; an id outside `[0, V)` is
    /// an error naming it, its position and the range.
    pub fn route(&self, ids: ArrayViewD<'_, i64>, what: &'static str) -> Result<Routed> {
        let flat: Vec<i64> = ids.iter().copied().collect();
        self.routing.route_all_as(&flat, what).map_err(|u| {
            let multi = crate::kernels::unravel(u.position, ids.shape());
            Error::out_of_range(what, multi, u.id, 0, u.vocab_size)
        })
    }

    /// Fills every table element by `draw`, deterministically: table k,
    /// block b of rows draws from `rng.fork((k << 32) | b)`, so the result
    /// does not depend on the number of threads.
    pub(crate) fn fill(&mut self, rng: &mut Rng, draw: impl Fn(&mut Rng) -> T + Sync) {
        const BLOCK: usize = 1024;
        let base = rng.clone();
        rng.next_u64();
        let width = self.hidden;
        for (k, p) in self.tables.iter_mut().enumerate() {
            let block = |b: usize, chunk: &mut [T]| {
                let mut r = base.fork(((k as u64) << 32) | b as u64);
                chunk.iter_mut().for_each(|x| *x = draw(&mut r));
            };
            // A half-precision table gets the same draws, rounded to
            // nearest.
            fn narrowed<T: Real, H: crate::kernels::HalfFloat>(
                data: &mut [H],
                n: usize,
                block: &(impl Fn(usize, &mut [T]) + Sync),
            ) {
                data.par_chunks_mut(n).enumerate().for_each(|(b, chunk)| {
                    let mut full = vec![T::zero(); chunk.len()];
                    block(b, &mut full);
                    T::narrow_half(&full, chunk, None);
                });
            }
            let n = (BLOCK * width).max(1);
            match p.stored_mut().flat_mut() {
                StoredMut::Full(data) => data
                    .par_chunks_mut(n)
                    .enumerate()
                    .for_each(|(b, chunk)| block(b, chunk)),
                StoredMut::BF16(data) => narrowed(data, n, &block),
                StoredMut::F16(data) => narrowed(data, n, &block),
            }
        }
    }
}

/// The accessors and the [`Module`](crate::state::Module) impl that the
/// layers made of [`SplitTables`] (a field `splits`) share.
macro_rules! split_layer_api {
    ($layer:ident) => {
        impl<T: Real> $layer<T> {
            /// The table of a split (its `<prefix>.<split>.weight`, (size_k, H)).
            pub fn split(&self, name: &str) -> Option<&Parameter<T>> {
                self.splits.table(name)
            }

            /// The table of a split, to change in place.
            pub fn split_mut(&mut self, name: &str) -> Option<&mut Parameter<T>> {
                self.splits.table_mut(name)
            }

            /// Freezes (`false`) or unfreezes a split: a frozen split
            /// receives no gradient and is never updated. An unknown split
            /// is an error.
            pub fn set_trainable(&mut self, split: &str, trainable: bool) -> Result<()> {
                self.splits.set_trainable(split, trainable)
            }

            /// The splits: names, sizes, routing.
            pub fn splits(&self) -> &SplitTables<T> {
                &self.splits
            }

            /// The splits, to change in place.
            pub fn splits_mut(&mut self) -> &mut SplitTables<T> {
                &mut self.splits
            }

            /// V.
            pub fn vocab_size(&self) -> usize {
                self.splits.vocab_size()
            }

            /// H.
            pub fn hidden_size(&self) -> usize {
                self.splits.hidden_size()
            }
        }

        impl<T: Real> Module<T> for $layer<T> {
            /// The tables, in split order.
            fn parameters(&self) -> Vec<&Parameter<T>> {
                self.splits.tables().iter().collect()
            }

            fn parameters_mut(&mut self) -> Vec<&mut Parameter<T>> {
                self.splits.tables_mut().iter_mut().collect()
            }
        }
    };
}
pub(crate) use split_layer_api;

/// The bytes of a `(rows, width)` table kept as `dtype` (`u64::MAX` when
/// that overflows): what is checked against the memory available
/// ([`check_memory`]) before a layer allocates one.
pub(crate) fn table_bytes(rows: usize, width: usize, dtype: Dtype) -> u64 {
    bytes_of(&[rows as u64, width as u64, dtype.size() as u64])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(sizes: &[(&str, usize)], order: &[&str], h: usize) -> String {
        SplitTables::<f32>::new("t", sizes, order, h)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn construction_errors() {
        assert_eq!(err(&[("a", 1)], &[], 4), "split_order is empty");
        assert_eq!(
            err(&[("a", 1)], &["a", "b"], 4),
            "split `b` in split_order has no size in split_vocab_size"
        );
        assert_eq!(
            err(&[("a", 1)], &["a", "a"], 4),
            "split `a` appears twice in split_order"
        );
        assert_eq!(
            err(&[("a", 1), ("b", 2)], &["a"], 4),
            "split `b` has a size but is missing from split_order"
        );
        assert_eq!(
            err(&[("a", 1)], &["a"], 0),
            "hidden_size must be positive, got 0"
        );
        assert_eq!(
            err(&[("a", 1), ("a", 2)], &["a"], 4),
            "split `a` is given a size twice"
        );
    }

    #[test]
    fn unravel_row_major() {
        assert_eq!(crate::kernels::unravel(5, &[2, 3]), vec![1, 2]);
        assert_eq!(crate::kernels::unravel(0, &[]), Vec::<usize>::new());
    }

    #[test]
    fn route_error_names_multi_index() {
        let t = SplitTables::<f32>::new("t", &[("a", 3)], &["a"], 2).unwrap();
        let ids = ndarray::array![[0i64, 1], [2, 3]].into_dyn();
        let e = t.route(ids.view(), "input id").unwrap_err();
        assert_eq!(
            e.to_string(),
            "input id 3 at position [1, 1] is out of range 0..3"
        );
    }
}
