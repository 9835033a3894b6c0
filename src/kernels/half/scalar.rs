//! The plain code of the half-precision kernels, on the bits: each
//! element's widening and rounding (the definitions the vector paths give
//! the bits of, and their tails), and the loops over slices.

use super::{Format, HalfFloat, SrKey, bf16_sr_bits, sr_bits};

// One element, on the bits: the plain code, and the tails of the vector paths.

/// `x << n`, 0 when `n ≥ 32` (as `vpsllvd`).
#[inline(always)]
fn shl_or_zero(x: u32, n: u32) -> u32 {
    x.checked_shl(n).unwrap_or(0)
}

/// `x >> n`, 0 when `n ≥ 32` (as `vpsrlvd`).
#[inline(always)]
fn shr_or_zero(x: u32, n: u32) -> u32 {
    x.checked_shr(n).unwrap_or(0)
}

#[inline(always)]
pub(super) fn bf16_widen(h: u16) -> u32 {
    let quiet = if h & 0x7FFF > 0x7F80 { 0x0040 } else { 0 };
    ((h | quiet) as u32) << 16
}

/// The quiet NaN of the f32 NaN `x` (bf16).
#[inline(always)]
fn bf16_nan(x: u32) -> u16 {
    ((x >> 16) | 0x40) as u16
}

#[inline(always)]
pub(super) fn bf16_nearest(x: u32) -> u16 {
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        return bf16_nan(x);
    }
    // Adds just under half an ulp, plus one when the kept part is odd: a
    // tie then carries only from an odd value. The largest finite value
    // carries into ∞; no finite value carries into the sign.
    ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) as u16
}

#[inline(always)]
pub(super) fn bf16_stochastic(x: u32, r: u32) -> u16 {
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        return bf16_nan(x);
    }
    // The low 16 bits plus 16 random bits carry with probability low/2¹⁶.
    ((x + (r >> 16)) >> 16) as u16
}

#[inline(always)]
pub(super) fn f16_widen(h: u16) -> u32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let e = ((h >> 10) & 0x1F) as u32;
    let m = (h & 0x3FF) as u32;
    if e == 0x1F {
        let quiet = if m != 0 { 0x40_0000 } else { 0 };
        sign | 0x7F80_0000 | quiet | (m << 13)
    } else if e == 0 {
        // m·2⁻²⁴, exact in f32 (and 0 for m = 0).
        sign | (m as f32 * f32::from_bits(0x3380_0000)).to_bits()
    } else {
        sign | ((e + 112) << 23) | (m << 13)
    }
}

/// The quiet f16 NaN of the f32 NaN whose magnitude bits are `a`, with
/// `sign` (0 or 0x8000).
#[inline(always)]
fn f16_nan(sign: u32, a: u32) -> u16 {
    (sign | 0x7E00 | ((a >> 13) & 0x3FF)) as u16
}

/// The f16 magnitude bits of f32 magnitude bits `a` (not NaN) truncated
/// toward zero (≥ 0x7C00 past the finite range), and the part below the
/// f16 ulp as a 32-bit fraction (bits beyond 32 places dropped).
#[inline(always)]
fn f16_split(a: u32) -> (u32, u32) {
    let e = a >> 23;
    if e > 112 {
        // f16 normal (or beyond): 13 f32 bits below the f16 ulp.
        ((a >> 13) - 0x1_C000, a << 19)
    } else {
        // |x| < 2⁻¹⁴, ulp 2⁻²⁴: |x|/2⁻²⁴ = m·2⁻ˢ.
        let m = (a & 0x7F_FFFF) | if e == 0 { 0 } else { 0x80_0000 };
        let s = 126 - e.max(1);
        let frac = shl_or_zero(m, 32u32.wrapping_sub(s)) | shr_or_zero(m, s.wrapping_sub(32));
        (shr_or_zero(m, s), frac)
    }
}

#[inline(always)]
pub(super) fn f16_nearest(x: u32) -> u16 {
    let sign = (x >> 16) & 0x8000;
    let a = x & 0x7FFF_FFFF;
    // Written without branches on the value (a branch on the dropped bits
    // would be mispredicted half the time). f16 normal or beyond: as
    // `bf16_nearest`, on the 13 bits below the f16 ulp, then rebiased.
    let normal = ((a + 0x0FFF + ((a >> 13) & 1)) >> 13).wrapping_sub(0x1_C000);
    // |x| < 2⁻¹⁴: |x|·2²⁴ < 2¹⁰ is exact; adding and taking away 2²³ rounds
    // it to an integer, ties to even: the subnormal's bits (1024 is 2⁻¹⁴'s).
    let t = f32::from_bits(a) * 16_777_216.0;
    let subnormal = ((t + 8_388_608.0) - 8_388_608.0) as u32;
    let mag = if a >> 23 > 112 {
        normal.min(0x7C00)
    } else {
        subnormal
    };
    if a > 0x7F80_0000 {
        f16_nan(sign, a)
    } else {
        (sign | mag) as u16
    }
}

#[inline(always)]
pub(super) fn f16_stochastic(x: u32, r: u32) -> u16 {
    let sign = (x >> 16) & 0x8000;
    let a = x & 0x7FFF_FFFF;
    if a > 0x7F80_0000 {
        return f16_nan(sign, a);
    }
    let (t, frac) = f16_split(a);
    let up = frac.checked_add(r).is_none() as u32;
    (sign | (t + up).min(0x7C00)) as u16
}

// The plain code on slices.

pub(super) fn widen_scalar<H: HalfFloat>(src: &[u16], dst: &mut [f32]) {
    match H::FORMAT {
        Format::Bf16 => {
            for (d, &h) in dst.iter_mut().zip(src) {
                *d = f32::from_bits(bf16_widen(h));
            }
        }
        Format::F16 => {
            for (d, &h) in dst.iter_mut().zip(src) {
                *d = f32::from_bits(f16_widen(h));
            }
        }
    }
}

pub(super) fn nearest_scalar<H: HalfFloat>(src: &[f32], dst: &mut [u16]) {
    match H::FORMAT {
        Format::Bf16 => {
            for (d, &x) in dst.iter_mut().zip(src) {
                *d = bf16_nearest(x.to_bits());
            }
        }
        Format::F16 => {
            for (d, &x) in dst.iter_mut().zip(src) {
                *d = f16_nearest(x.to_bits());
            }
        }
    }
}

pub(super) fn stochastic_scalar<H: HalfFloat>(
    src: &[f32],
    dst: &mut [u16],
    key: SrKey,
    first_index: u64,
) {
    let index = |i: usize| first_index.wrapping_add(i as u64);
    match H::FORMAT {
        Format::Bf16 => {
            for (i, (d, &x)) in dst.iter_mut().zip(src).enumerate() {
                *d = bf16_stochastic(x.to_bits(), bf16_sr_bits(key, index(i)));
            }
        }
        Format::F16 => {
            for (i, (d, &x)) in dst.iter_mut().zip(src).enumerate() {
                *d = f16_stochastic(x.to_bits(), sr_bits(key, index(i)));
            }
        }
    }
}
