//! Stochastic rounding's random bits: a pure function of (seed, step,
//! parameter, element), so that a rounding does not depend on threads,
//! call boundaries or a resume.

/// The key of one stochastic narrowing: a pure function of the run's seed,
/// the optimiser step and the parameter, mixed into 64 bits.
///
/// `SrKey::new(seed, step, param)` is `h = s(s(s(seed) ^ step) ^ param)`
/// with `s` SplitMix64's output function of `z + 0x9E3779B97F4A7C15`; its
/// words are `k0 = h mod 2³²` and `k1 = h >> 32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SrKey {
    k0: u32,
    k1: u32,
}

/// SplitMix64: the output function of the state `z + γ`.
fn splitmix64(z: u64) -> u64 {
    let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SrKey {
    /// The key for `step` of the parameter whose name hashes to `param`
    /// ([`SrKey::param_hash`]) in the run seeded with `seed`.
    pub fn new(seed: u64, step: u64, param: u64) -> SrKey {
        let h = splitmix64(splitmix64(splitmix64(seed) ^ step) ^ param);
        SrKey {
            k0: h as u32,
            k1: (h >> 32) as u32,
        }
    }

    /// A stable 64-bit hash of a parameter's name: FNV-1a 64 of its UTF-8
    /// bytes.
    ///
    /// ```
    /// use splitgrad::kernels::half::SrKey;
    /// assert_eq!(SrKey::param_hash(""), 0xcbf2_9ce4_8422_2325);
    /// assert_eq!(SrKey::param_hash("a"), 0xaf63_dc4c_8601_ec8c);
    /// ```
    pub fn param_hash(name: &str) -> u64 {
        name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
        })
    }

    /// The key's two words, `(k0, k1)`.
    pub fn words(self) -> (u32, u32) {
        (self.k0, self.k1)
    }

    /// What the low word `lo` of an index whose high word is `hi` is
    /// mixed with: `k0 ^ mix32(hi ^ k1)` ([`sr_bits`]).
    #[inline]
    pub(crate) fn word(self, hi: u32) -> u32 {
        self.k0 ^ mix32(hi ^ self.k1)
    }
}

pub(super) const MIX1: u32 = 0x7FEB_352D;
pub(super) const MIX2: u32 = 0x846C_A68B;

/// A bijective 32-bit mixer ("lowbias32": xor-shift 16, multiply, xor-shift
/// 15, multiply, xor-shift 16).
#[inline(always)]
fn mix32(x: u32) -> u32 {
    let x = (x ^ (x >> 16)).wrapping_mul(MIX1);
    let x = (x ^ (x >> 15)).wrapping_mul(MIX2);
    x ^ (x >> 16)
}

/// The 32 random bits of the element with global index `index` under
/// `key`: `mix32(lo ^ k0 ^ mix32(hi ^ k1))` with `lo`, `hi` the low and
/// high 32 bits of `index`. For one key and one `hi` it is a bijection of
/// `lo`, so over 2³² consecutive indices every value comes once. The
/// indices of one vector share `hi` (but for one vector in 2³²), so the
/// vector paths fold it into the key once (`k0 ^ mix32(hi ^ k1)`) and run one
/// `mix32` a lane.
///
/// ```
/// use splitgrad::kernels::half::{SrKey, sr_bits};
/// let key = SrKey::new(7, 1, SrKey::param_hash("table"));
/// assert_eq!(sr_bits(key, 5), sr_bits(key, 5));
/// assert_ne!(sr_bits(key, 5), sr_bits(key, 6));
/// ```
#[inline]
pub fn sr_bits(key: SrKey, index: u64) -> u32 {
    mix32(index as u32 ^ key.word((index >> 32) as u32))
}

/// The rounding word of the bf16 element with global index `index` under
/// `key`, whose top 16 bits its stochastic rounding adds
/// ([`narrow_stochastic`](super::narrow_stochastic)): bf16 keeps the top
/// half of an f32, so a rounding takes exactly 16 random bits, and one
/// [`sr_bits`] word serves the two elements of a pair, `2j` and `2j + 1`:
/// `sr_bits(key, j)` for the even one (its top half), that word shifted
/// left by 16 for the odd one (its bottom half). (f16 rounding may drop
/// more than 16 bits, below its normal range, and takes [`sr_bits`]'s 32
/// bits an element.)
///
/// ```
/// use splitgrad::kernels::half::{SrKey, bf16_sr_bits, sr_bits};
/// let key = SrKey::new(7, 1, SrKey::param_hash("table"));
/// assert_eq!(bf16_sr_bits(key, 10) >> 16, sr_bits(key, 5) >> 16);
/// assert_eq!(bf16_sr_bits(key, 11) >> 16, sr_bits(key, 5) & 0xFFFF);
/// ```
#[inline]
pub fn bf16_sr_bits(key: SrKey, index: u64) -> u32 {
    let r = sr_bits(key, index >> 1);
    if index & 1 == 0 { r } else { r << 16 }
}
