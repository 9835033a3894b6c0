//! A pool of large buffers, reused from one training step to the next.
//!
//! A training step allocates the same big arrays every time: gathered rows,
//! gradient buffers, coalesced row gradients, the head's gradients. Freed
//! and allocated again, an array of 32 MiB or more is given back to the
//! kernel by glibc's `malloc` and mapped afresh on the next step, where the
//! kernel faults in and zeroes every page: for the embedding workloads that
//! is most of the step. A [`Pool`] keeps such buffers instead and hands them
//! out again, so a loop that keeps one pool allocates its big arrays once,
//! with no process-wide allocator setting.
//!
//! Only buffers of at least [`Pool::MIN_BYTES`] are kept; smaller ones go
//! back to the allocator, which reuses them well. The pool holds at most
//! [`Pool::MAX_BUFFERS`] buffers and gives the oldest back when more come.
//! A request takes the smallest held buffer that fits and is at most twice
//! the size asked for; one that finds none frees the held buffers it
//! outgrew (see [`take_fitting`]), so growing sizes keep one buffer each.
//!
//! A `Pool` is a handle: cloning it shares the same buffers (it is `Send`
//! and `Sync`, so tasks on other threads may take from it too).

use std::mem::{ManuallyDrop, MaybeUninit};
use std::sync::{Arc, Mutex};

use ndarray::{Array, ArrayD, IxDyn};

use super::Real;

/// A shared pool of large buffers of `T`.
///
/// ```
/// use splitgrad::kernels::pool::Pool;
/// let pool = Pool::<f32>::new();
/// let a = pool.zeros(&[1024, 1024]); // 4 MiB: pooled when given back
/// let ptr = a.as_ptr();
/// pool.give(a);
/// assert_eq!(pool.held_bytes(), 4 << 20);
/// let b = pool.zeros(&[1024, 1000]); // fits in the same buffer
/// assert_eq!(b.as_ptr(), ptr);
/// assert!(b.iter().all(|&x| x == 0.0));
/// ```
pub struct Pool<T> {
    inner: Arc<Mutex<Vec<Vec<T>>>>,
    /// Buffers of half-precision elements (activations in bf16 or f16),
    /// kept as their bits.
    halves: Arc<Mutex<Vec<Vec<u16>>>>,
}

impl<T> Clone for Pool<T> {
    fn clone(&self) -> Self {
        Pool {
            inner: Arc::clone(&self.inner),
            halves: Arc::clone(&self.halves),
        }
    }
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Pool {
            inner: Arc::new(Mutex::new(Vec::new())),
            halves: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

/// The smallest held buffer with room for `n` elements and at most twice
/// that, taken out of `free` (its length and contents as they were).
///
/// When none fits, the held buffers that `n` outgrew (room for at least
/// half of `n` but not all of it) are freed: the new buffer made for `n`
/// serves the requests they served, so sizes that grow a little at a time
/// (batches of varying length) keep one buffer, not one per size. Two held
/// buffers within a factor of two of each other are then both buffers that
/// were in use at once, so beyond what a step holds at once the held bytes
/// stay under twice the largest buffer.
pub fn take_fitting<E>(free: &mut Vec<Vec<E>>, n: usize) -> Option<Vec<E>> {
    let best = free
        .iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= n && v.capacity() / 2 <= n)
        .min_by_key(|(_, v)| v.capacity())
        .map(|(i, _)| i);
    match best {
        Some(i) => Some(free.swap_remove(i)),
        None => {
            free.retain(|v| v.capacity() >= n || v.capacity() < n.div_ceil(2));
            None
        }
    }
}

/// Keeps `v` in `free` (the oldest given back when `free` holds `max`).
pub fn keep<E>(free: &mut Vec<Vec<E>>, v: Vec<E>, max: usize) {
    if free.len() >= max {
        free.remove(0);
    }
    free.push(v);
}

impl<T> std::fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("buffers", &self.lock().len())
            .finish()
    }
}

impl<T> Pool<T> {
    /// Buffers smaller than this (bytes) are not kept.
    pub const MIN_BYTES: usize = 1 << 20;
    /// At most this many buffers are kept.
    pub const MAX_BUFFERS: usize = 64;

    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<T>>> {
        // A panic while the lock was held left only a list of free buffers
        // behind, which is still valid.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An empty `Vec` with room for at least `n` elements: a held buffer
    /// when one fits (at most twice `n`), else a new allocation.
    pub fn take_vec(&self, n: usize) -> Vec<T> {
        if n * std::mem::size_of::<T>() >= Self::MIN_BYTES
            && let Some(mut v) = take_fitting(&mut self.lock(), n)
        {
            v.clear();
            return v;
        }
        Vec::with_capacity(n)
    }

    /// Keeps `v`'s allocation for later requests (or frees it when it is
    /// small or the pool is full).
    pub fn give_vec(&self, v: Vec<T>) {
        if v.capacity() * std::mem::size_of::<T>() < Self::MIN_BYTES {
            return;
        }
        keep(&mut self.lock(), v, Self::MAX_BUFFERS);
    }

    fn lock_halves(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u16>>> {
        self.halves.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Pool::take_vec`] for half-precision elements (bf16 or f16).
    pub fn take_half_vec<H: super::HalfFloat>(&self, n: usize) -> Vec<H> {
        if n * 2 >= Self::MIN_BYTES
            && let Some(mut v) = take_fitting(&mut self.lock_halves(), n)
        {
            v.clear();
            return H::vec_from_bits(v);
        }
        Vec::with_capacity(n)
    }

    /// [`Pool::give_vec`] for half-precision elements.
    pub fn give_half_vec<H: super::HalfFloat>(&self, v: Vec<H>) {
        if v.capacity() * 2 < Self::MIN_BYTES {
            return;
        }
        keep(
            &mut self.lock_halves(),
            H::vec_into_bits(v),
            Self::MAX_BUFFERS,
        );
    }

    /// Keeps the allocation of an owned array.
    pub fn give<D: ndarray::Dimension>(&self, a: Array<T, D>) {
        let (v, _) = a.into_raw_vec_and_offset();
        self.give_vec(v);
    }

    /// Bytes of the buffers held now.
    pub fn held_bytes(&self) -> usize {
        let full: usize = self
            .lock()
            .iter()
            .map(|v| v.capacity() * std::mem::size_of::<T>())
            .sum();
        full + self
            .lock_halves()
            .iter()
            .map(|v| v.capacity() * 2)
            .sum::<usize>()
    }

    /// An array of `shape` whose elements are not yet written, in a pooled
    /// buffer when one fits. Write every element, then `assume_init`.
    pub fn uninit(&self, shape: &[usize]) -> Array<MaybeUninit<T>, IxDyn> {
        let n = shape.iter().product::<usize>();
        let mut v = ManuallyDrop::new(self.take_vec(n));
        let (ptr, cap) = (v.as_mut_ptr(), v.capacity());
        // SAFETY: `MaybeUninit<T>` has the size and alignment of `T`, so the
        // allocation of `v` (capacity `cap` ≥ n, never dropped as a `Vec<T>`
        // thanks to `ManuallyDrop`) is a valid allocation of `cap`
        // `MaybeUninit<T>`; a length of n ≤ cap needs no initialised element.
        let u = unsafe { Vec::from_raw_parts(ptr.cast::<MaybeUninit<T>>(), n, cap) };
        Array::from_shape_vec(IxDyn(shape), u).expect("n elements for the shape")
    }
}

impl<T: Real> Pool<T> {
    /// [`Pool::uninit`] for a 2-D shape.
    pub fn uninit_2d(&self, (rows, cols): (usize, usize)) -> ndarray::Array2<MaybeUninit<T>> {
        self.uninit(&[rows, cols])
            .into_dimensionality()
            .expect("a 2-D shape")
    }

    /// [`Pool::zeros`] for a 2-D shape.
    pub fn zeros_2d(&self, (rows, cols): (usize, usize)) -> ndarray::Array2<T> {
        self.zeros(&[rows, cols])
            .into_dimensionality()
            .expect("a 2-D shape")
    }

    /// An array of zeros of `shape`, in a pooled buffer when one fits.
    pub fn zeros(&self, shape: &[usize]) -> ArrayD<T> {
        let n = shape.iter().product::<usize>();
        let mut v = self.take_vec(n);
        v.resize(n, T::zero());
        ArrayD::from_shape_vec(IxDyn(shape), v).expect("n elements for the shape")
    }

    /// A copy of `a` in standard layout, in a pooled buffer when one fits.
    pub fn copy_of(&self, a: ndarray::ArrayViewD<'_, T>) -> ArrayD<T> {
        let mut v = self.take_vec(a.len());
        match a.as_slice() {
            Some(s) => v.extend_from_slice(s),
            None => v.extend(a.iter().copied()),
        }
        ArrayD::from_shape_vec(a.raw_dim(), v).expect("one element per element")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_buffers_are_not_kept_and_big_ones_are_reused() {
        let pool = Pool::<f64>::new();
        pool.give(ArrayD::<f64>::zeros(IxDyn(&[10])));
        assert_eq!(pool.held_bytes(), 0);
        let big = pool.zeros(&[1 << 18]); // 2 MiB
        let p = big.as_ptr();
        pool.give(big);
        // Too small a request for that buffer: a new one.
        let small = pool.take_vec(1 << 10);
        assert_ne!(small.as_ptr(), p);
        let mut u = pool.uninit(&[1 << 17, 2]);
        assert_eq!(u.as_ptr().cast::<f64>(), p);
        u.fill(MaybeUninit::new(1.5));
        // SAFETY: every element was written just above.
        let a = unsafe { u.assume_init() };
        assert!(a.iter().all(|&x| x == 1.5));
        assert_eq!(pool.held_bytes(), 0);
        pool.give(a);
        assert_eq!(pool.held_bytes(), 2 << 20);
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_buffers() {
        let pool = Pool::<f32>::new();
        for _ in 0..Pool::<f32>::MAX_BUFFERS + 5 {
            pool.give_vec(Vec::<f32>::with_capacity(1 << 18));
        }
        assert_eq!(pool.held_bytes(), Pool::<f32>::MAX_BUFFERS << 20);
    }

    #[test]
    fn sizes_that_grow_a_little_at_a_time_keep_one_buffer() {
        let pool = Pool::<f32>::new();
        for k in 0..20 {
            let v = pool.take_vec((1 << 20) + k * 1000);
            pool.give_vec(v);
        }
        let held = pool.held_bytes();
        assert!(held < 5 << 20, "{held} bytes held");
    }

    #[test]
    fn held_bytes_stay_under_twice_the_largest_buffer_for_any_one_at_a_time_sizes() {
        // Sizes from 1 to 64 MiB in a fixed pseudo-random order, one out at
        // a time.
        let pool = Pool::<u8>::new();
        let mut x = 12345u64;
        let mut largest = 0;
        for _ in 0..500 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = (1 << 20) + (x >> 38) as usize; // up to 65 MiB
            let v = pool.take_vec(n);
            largest = largest.max(v.capacity());
            pool.give_vec(v);
            assert!(
                pool.held_bytes() <= 2 * largest,
                "{} > 2 × {largest}",
                pool.held_bytes()
            );
        }
    }

    #[test]
    fn a_step_that_takes_the_same_sizes_again_reuses_every_buffer() {
        let pool = Pool::<f32>::new();
        let sizes = [1 << 18, 3 << 18, 5 << 18, 1 << 21, 1 << 21];
        let step = |pool: &Pool<f32>| -> Vec<*const f32> {
            let taken: Vec<Vec<f32>> = sizes.iter().map(|&n| pool.take_vec(n)).collect();
            let ptrs = taken.iter().map(|v| v.as_ptr()).collect();
            taken.into_iter().for_each(|v| pool.give_vec(v));
            ptrs
        };
        let mut first = step(&pool);
        let mut again = step(&pool);
        first.sort();
        again.sort();
        assert_eq!(first, again);
    }
}
