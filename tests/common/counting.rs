//! A counting global allocator for the memory tests (`tests/memory.rs`,
//! `tests/checkpoint_memory.rs`): the System allocator plus atomics for the
//! bytes live now, the peak, and the largest single allocation. Each of
//! those files holds exactly one test, so that nothing else allocates while
//! it measures; each includes this file with `#[path]`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The System allocator, counting.
struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn grow(n: usize) {
    let now = CURRENT.fetch_add(n, Ordering::SeqCst) + n;
    PEAK.fetch_max(now, Ordering::SeqCst);
    LARGEST.fetch_max(n, Ordering::SeqCst);
}

fn shrink(n: usize) {
    CURRENT.fetch_sub(n, Ordering::SeqCst);
}

// SAFETY: every call is forwarded to `System` with the caller's arguments,
// so `System`'s guarantees hold; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is (the caller's layout has non-zero size).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with
        // this layout.
        unsafe { System.dealloc(ptr, layout) };
        shrink(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller
        // guarantees `new_size` is valid for it.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grow(new_size - layout.size());
                LARGEST.fetch_max(new_size, Ordering::SeqCst);
            } else {
                shrink(layout.size() - new_size);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes above the level at the start that `f` had live at its peak, and
/// its largest single allocation.
pub fn measure<R>(f: impl FnOnce() -> R) -> (usize, usize, R) {
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    LARGEST.store(0, Ordering::SeqCst);
    let r = f();
    let peak = PEAK.load(Ordering::SeqCst);
    (peak - base, LARGEST.load(Ordering::SeqCst), r)
}
