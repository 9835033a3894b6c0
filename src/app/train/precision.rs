//! How a run keeps its numbers: [`Precision`] and [`RoundingMode`].

use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::param::{Dtype, Rounding};

/// How a run keeps its numbers: the model's parameters (every one: the
/// shared table, the split rows, the gate logits, the head), the Adam
/// moments, and how the optimiser narrows what it stores in half
/// precision. The math is in the engine's type whatever they are.
///
/// A dtype that is not half (`f32`) means the engine's own precision.
///
/// ```
/// use splitgrad::app::train::{Precision, RoundingMode};
/// use splitgrad::param::Dtype;
/// let p = Precision::default();
/// assert_eq!((p.dtype, p.state_dtype, p.rounding), (Dtype::F32, Dtype::F32, RoundingMode::Stochastic));
/// assert!(!p.is_half());
/// assert!(Precision { dtype: Dtype::BF16, ..p }.is_half());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Precision {
    /// The parameters' dtype: f32, bf16 or f16.
    pub dtype: Dtype,
    /// The optimiser state's dtype: f32 or bf16 (f16 is refused).
    pub state_dtype: Dtype,
    /// Stochastic (keyed by the run's seed) or to nearest.
    pub rounding: RoundingMode,
}

impl Default for Precision {
    /// f32 parameters and state, stochastic rounding.
    fn default() -> Self {
        Precision {
            dtype: Dtype::F32,
            state_dtype: Dtype::F32,
            rounding: RoundingMode::Stochastic,
        }
    }
}

impl Precision {
    /// Whether anything is kept in half precision (only then does the
    /// rounding matter).
    pub fn is_half(&self) -> bool {
        self.dtype.is_half() || self.state_dtype.is_half()
    }

    /// The parameters' dtype on engine `T`: a half dtype, or `T`'s own.
    pub fn dtype_of<T: Real>(&self) -> Dtype {
        on::<T>(self.dtype)
    }

    /// The optimiser state's dtype on engine `T`: a half dtype, or `T`'s
    /// own.
    pub fn state_dtype_of<T: Real>(&self) -> Dtype {
        on::<T>(self.state_dtype)
    }
}

/// `d` when it is a half dtype, else engine `T`'s own.
fn on<T: Real>(d: Dtype) -> Dtype {
    if d.is_half() { d } else { Dtype::of::<T>() }
}

/// How a run's optimiser narrows a value it stores in half precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RoundingMode {
    /// Stochastic rounding, its bits a function of the run's seed, the
    /// step, the parameter and the element ([`Rounding::Stochastic`]).
    #[default]
    Stochastic,
    /// To nearest, ties to even.
    Nearest,
}

impl RoundingMode {
    /// `"stochastic"` or `"nearest"`.
    pub fn name(self) -> &'static str {
        match self {
            RoundingMode::Stochastic => "stochastic",
            RoundingMode::Nearest => "nearest",
        }
    }

    /// The optimiser's rounding for a run of seed `seed`.
    pub fn rounding(self, seed: u64) -> Rounding {
        match self {
            RoundingMode::Stochastic => Rounding::Stochastic { seed },
            RoundingMode::Nearest => Rounding::Nearest,
        }
    }
}

impl std::fmt::Display for RoundingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for RoundingMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "stochastic" => Ok(RoundingMode::Stochastic),
            "nearest" => Ok(RoundingMode::Nearest),
            _ => Err(Error::config(format!(
                "unknown rounding `{s}` (expected stochastic or nearest)"
            ))),
        }
    }
}
