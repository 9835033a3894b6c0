//! Copies that bypass the cache for large outputs.
//!
//! A gather writes an (N, H) array that is far larger than the cache and
//! read again only by the next op. An ordinary store first reads the
//! destination line into the cache (a read for ownership), so writing
//! 32 MiB moves 64 MiB; a streaming (non-temporal) store writes the line
//! out directly. On x86-64 the body of each row is copied with SSE2's
//! `movntdq` (every x86-64 CPU has it); the unaligned head and tail, other
//! architectures, and `SPLITGRAD_SIMD=baseline` use ordinary copies. The
//! bytes written are the same either way.

use std::mem::MaybeUninit;

/// Outputs at least this large (bytes) are written with streaming stores.
pub(crate) const STREAM_MIN_BYTES: usize = 4 << 20;

/// Whether an output of `bytes` is written with streaming stores.
pub(crate) fn use_streaming(bytes: usize) -> bool {
    cfg!(target_arch = "x86_64") && bytes >= STREAM_MIN_BYTES && !super::exp::baseline_forced()
}

/// `dst ← src` (same length), with streaming stores when `streaming`.
/// Call [`fence`] on the same thread before another thread reads `dst`.
///
/// **Panics** if the lengths differ.
#[track_caller]
pub(crate) fn copy<T: Copy>(dst: &mut [MaybeUninit<T>], src: &[T], streaming: bool) {
    assert_eq!(dst.len(), src.len(), "stream::copy: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if streaming {
        // SAFETY: `dst` and `src` are valid for `len` elements of `T` and
        // do not overlap (one is borrowed mutably); every byte of `dst` is
        // written once from the byte at the same offset of `src`, so `dst`
        // ends up a bitwise copy of `src`. SSE2 is part of x86-64.
        unsafe {
            copy_nt(
                dst.as_mut_ptr().cast::<u8>(),
                src.as_ptr().cast::<u8>(),
                std::mem::size_of_val(src),
            )
        };
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(s);
    }
}

/// Orders this thread's streaming stores before its later stores (and
/// before the synchronisation that hands `dst` to another thread).
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Byte copy: ordinary head up to 16-byte alignment of `dst`, streaming
/// 16-byte body, ordinary tail.
///
/// # Safety
/// `dst` and `src` valid for `len` bytes and not overlapping.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_nt(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let head = dst.align_offset(16).min(len);
    // SAFETY (whole body): offsets stay below `len`, as the caller allows.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let mut i = head;
        while i + 16 <= len {
            let v = _mm_loadu_si128(src.add(i).cast::<__m128i>());
            _mm_stream_si128(dst.add(i).cast::<__m128i>(), v);
            i += 16;
        }
        std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_copy_equals_the_plain_one_at_every_offset() {
        let src: Vec<f32> = (0..300).map(|i| i as f32 * 0.5 - 7.0).collect();
        for start in 0..6 {
            for len in [0, 1, 3, 4, 5, 17, 64, 250] {
                let s = &src[start..start + len];
                let mut a = vec![MaybeUninit::<f32>::uninit(); len + 3];
                let mut b = vec![MaybeUninit::<f32>::uninit(); len + 3];
                copy(&mut a[start % 3..start % 3 + len], s, true);
                fence();
                copy(&mut b[start % 3..start % 3 + len], s, false);
                for k in 0..len {
                    // SAFETY: both copies wrote elements start % 3 .. + len.
                    let (x, y) = unsafe {
                        (
                            a[start % 3 + k].assume_init(),
                            b[start % 3 + k].assume_init(),
                        )
                    };
                    assert_eq!(x.to_bits(), y.to_bits());
                    assert_eq!(x.to_bits(), s[k].to_bits());
                }
            }
        }
    }
}
