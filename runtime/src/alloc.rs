//! A counting global allocator: wraps [`System`] (or, [`CountingOver`], another allocator) and tracks the bytes currently allocated and the
//! peak since the last [`reset_peak`]. The `dmc` binary installs it with
//! `#[global_allocator] static GLOBAL: CountingAlloc = CountingAlloc;` to report real memory next
//! to the planned arena.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static CURRENT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Bytes this thread has allocated (never decreased): what one allocation of this thread
    /// added, whatever other threads allocate or free meanwhile ([`thread_allocated`]).
    static THREAD_ALLOCATED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Whether allocations are counted (see [`stop_counting`]).
static COUNTING: AtomicBool = AtomicBool::new(true);

/// The counting allocator (counters are process-wide statics).
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAlloc;

impl CountingAlloc {
    /// Bytes currently allocated through this allocator.
    pub fn current(&self) -> usize {
        current()
    }
    /// Highest `current()` since start or the last `reset_peak()`.
    pub fn peak(&self) -> usize {
        peak()
    }
    /// Sets the peak to the current value.
    pub fn reset_peak(&self) {
        reset_peak()
    }
}

/// Bytes currently allocated (only meaningful when `CountingAlloc` is the global allocator).
pub fn current() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

/// Bytes the calling thread has allocated so far through the counting allocator (never
/// decreased; only meaningful when `CountingAlloc` is the global allocator): the difference
/// around an allocation is that allocation alone, even while other threads allocate or free.
pub fn thread_allocated() -> usize {
    THREAD_ALLOCATED.try_with(|c| c.get()).unwrap_or(0)
}

/// Peak bytes since start or the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Sets the peak to the current value.
pub fn reset_peak() {
    PEAK.store(CURRENT.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Stops counting, for good: from now on allocations and frees leave [`current`] and [`peak`] as
/// they are. For a process that never reads them (the compiling commands): counting costs two
/// atomic read-modify-writes per allocation and free on counters shared by every thread, a few
/// percent of compiling a deep network, more when two threads allocate at once.
pub fn stop_counting() {
    COUNTING.store(false, Ordering::Relaxed);
}

/// Whether allocations are still counted ([`stop_counting`] not called).
pub fn counting() -> bool {
    COUNTING.load(Ordering::Relaxed)
}

fn added(n: usize) {
    if !counting() {
        return;
    }
    // (a thread being torn down has no counter left: nothing to add to)
    let _ = THREAD_ALLOCATED.try_with(|t| t.set(t.get().wrapping_add(n)));
    let c = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
    // Most allocations do not raise the peak: a plain load then, not a read-modify-write (an
    // allocation-heavy compile makes millions of them).
    if c > PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(c, Ordering::Relaxed);
    }
}

fn removed(n: usize) {
    if !counting() {
        return;
    }
    CURRENT.fetch_sub(n, Ordering::Relaxed);
}

/// [`CountingAlloc`] over another allocator `A`: the same counters, `A` doing the allocating (the
/// `dmc` binary counts over mimalloc, which allocates and frees a deep network's millions of
/// small names and shapes faster than the system allocator).
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingOver<A>(pub A);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees hold; the counters are only bookkeeping.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract (non-zero-size layout guaranteed by the caller).
        unsafe { CountingOver(System).alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { CountingOver(System).alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract (ptr was allocated by us, i.e. by System, with `layout`).
        unsafe { CountingOver(System).dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { CountingOver(System).realloc(ptr, layout, new_size) }
    }
}

// SAFETY: every method forwards to `A` with the caller's arguments unchanged, so `A`'s guarantees
// hold; the counters are only bookkeeping.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingOver<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract (non-zero-size layout guaranteed by the caller).
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            added(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            added(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract (ptr was allocated by us, i.e. by `A`, with `layout`).
        unsafe { self.0.dealloc(ptr, layout) };
        removed(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                added(new_size - layout.size());
            } else {
                removed(layout.size() - new_size);
            }
        }
        p
    }
}

/// The machine's physical memory in bytes (`None` where it cannot be read): the bound for what a
/// host-side buffer (the CPU arena, a data file read whole, a synthetic data set) may need.
pub fn physical_memory() -> Option<u64> {
    #[cfg(unix)]
    {
        // SAFETY: sysconf only reads system configuration values.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if pages > 0 && page > 0 {
            return (pages as u64).checked_mul(page as u64);
        }
        None
    }
    #[cfg(not(unix))]
    {
        None
    }
}
