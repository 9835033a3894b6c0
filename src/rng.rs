//! A small seeded random-number generator whose stream is part of the
//! crate's contract.
//!
//! Initial weights, synthetic corpora, golden vectors and benchmark inputs
//! must be the same for a seed on every platform and in every release. The
//! bits come from `rand_xoshiro`'s xoshiro256++, seeded through SplitMix64,
//! a crate that promises that exact stream ("the output is stable across
//! versions", as Vigna's reference code gives it). What no crate fixes is
//! written here, in a few lines each, so that it cannot change under us:
//! uniform reals from the top 53 bits, integers below n by Lemire's method,
//! normals by Box–Muller, Fisher–Yates shuffles, Zipf draws by inverting
//! the CDF, and [`Rng::fork`], the independent stream k of a generator.

use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};

/// xoshiro256++ (Blackman and Vigna), seeded by SplitMix64, with the
/// draws the crate needs.
///
/// ```
/// use splitgrad::Rng;
/// let mut a = Rng::new(7);
/// let mut b = Rng::new(7);
/// assert_eq!(a.next_u64(), b.next_u64());
/// let u = a.uniform();
/// assert!((0.0..1.0).contains(&u));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    core: Xoshiro256PlusPlus,
}

impl Rng {
    /// A generator seeded with `seed` (SplitMix64 fills the state).
    pub fn new(seed: u64) -> Self {
        Rng {
            core: Xoshiro256PlusPlus::seed_from_u64(seed),
        }
    }

    /// An independent generator for stream `k` of this one (used to give
    /// each step, block of rows or case its own stream, so that results do
    /// not depend on the order or the threads that draw them). It depends
    /// on this generator's position and on `k`, and does not advance this
    /// generator: two draws from the copy, mixed with k, seed a new one.
    pub fn fork(&self, k: u64) -> Self {
        let mut c = self.core.clone();
        let (a, b) = (c.next_u64(), c.next_u64());
        Rng::new(a ^ b.rotate_left(17) ^ k.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.core.next_u64()
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[low, high)`.
    pub fn uniform_in(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.uniform()
    }

    /// Uniform integer in `[0, n)` (Lemire's method, unbiased).
    ///
    /// **Panics** if `n == 0`.
    #[track_caller]
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        loop {
            let m = (self.next_u64() as u128) * (n as u128);
            let low = m as u64;
            if low >= n || low >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }

    /// Standard normal N(0, 1) (Box–Muller; one draw per call).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Shuffles a slice in place (Fisher–Yates).
    pub fn shuffle<X>(&mut self, xs: &mut [X]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            xs.swap(i, j);
        }
    }
}

/// Draws integers in `[0, n)` with probability ∝ `1 / (k + 1)^s`, as token
/// frequencies in text are (Zipf's law; the benchmarks use s = 1.2).
///
/// ```
/// use splitgrad::{Rng, rng::Zipf};
/// let z = Zipf::new(1000, 1.2);
/// let mut rng = Rng::new(1);
/// let draws: Vec<usize> = (0..1000).map(|_| z.sample(&mut rng)).collect();
/// assert!(draws.iter().all(|&d| d < 1000));
/// assert!(draws.iter().filter(|&&d| d == 0).count() > draws.iter().filter(|&&d| d == 999).count());
/// ```
#[derive(Clone, Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// The distribution over `[0, n)` with exponent `s`.
    ///
    /// **Panics** if `n == 0`.
    #[track_caller]
    pub fn new(n: usize, s: f64) -> Self {
        assert!(n > 0, "Zipf::new: n must be positive");
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for k in 0..n {
            acc += 1.0 / ((k + 1) as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    /// One draw.
    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.uniform();
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_is_fixed() {
        // The stream is part of the contract: these values must never change.
        let mut r = Rng::new(0);
        let first: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            first,
            [
                5987356902031041503,
                7051070477665621255,
                6633766593972829180
            ]
        );
        let forked = Rng::new(42).fork(7).next_u64();
        assert_eq!(forked, Rng::new(42).fork(7).next_u64());
        assert_ne!(forked, Rng::new(42).fork(8).next_u64());
        assert_ne!(forked, Rng::new(43).fork(7).next_u64());
    }

    #[test]
    fn normal_moments() {
        let mut r = Rng::new(3);
        let xs: Vec<f64> = (0..200_000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    #[test]
    fn below_is_in_range_and_covers() {
        let mut r = Rng::new(5);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let x = r.below(7) as usize;
            seen[x] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
