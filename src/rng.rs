//! A small seeded random-number generator whose stream is part of the
//! crate's contract.
//!
//! Initial weights, synthetic corpora, golden vectors and benchmark inputs
//! must be the same for a seed on every platform and in every release, so
//! the generator is fixed here rather than borrowed from a crate whose
//! stream may change between versions: xoshiro256++ seeded through
//! SplitMix64, uniform reals from the top 53 bits, normals by Box–Muller.

/// xoshiro256++ (Blackman and Vigna), seeded by SplitMix64.
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
    s: [u64; 4],
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        Rng {
            s: [
                splitmix64(&mut x),
                splitmix64(&mut x),
                splitmix64(&mut x),
                splitmix64(&mut x),
            ],
        }
    }

    /// An independent generator for stream `k` of this seed (used to give
    /// each parameter or each worker its own stream).
    pub fn fork(&self, k: u64) -> Self {
        let mut x = self.s[0] ^ self.s[3].rotate_left(17) ^ k.wrapping_mul(0xD1B5_4A32_D192_ED03);
        Rng {
            s: [
                splitmix64(&mut x),
                splitmix64(&mut x),
                splitmix64(&mut x),
                splitmix64(&mut x),
            ],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
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
        assert_eq!(Rng::new(42).fork(7).next_u64(), 5691240043329440019);
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
