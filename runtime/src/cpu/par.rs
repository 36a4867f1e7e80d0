//! Deterministic parallel helpers.
//!
//! Rayon's adaptive splitting makes `par_iter().sum()` of floats depend on the schedule, so every
//! reduction here is split into a *fixed* number of parts whose partial sums live on the stack and
//! are combined serially in a fixed order: bit-identical results run to run, whatever the thread
//! count, and no allocation.

use std::ops::Range;

use rayon::prelude::*;

/// Elements per parallel task of elementwise kernels.
pub const ELEM_CHUNK: usize = 1 << 13;

/// Number of parts of a deterministic reduction.
pub const SUM_PARTS: usize = 64;

/// `sum_{i in 0..n}` computed as `SUM_PARTS` contiguous parts (`part(range)` returns the f64 sum of
/// its range), combined in index order.
pub fn det_sum(n: usize, part: impl Fn(Range<usize>) -> f64 + Sync) -> f64 {
    let mut parts = [0f64; SUM_PARTS];
    let per = n.div_ceil(SUM_PARTS).max(1);
    parts.par_iter_mut().enumerate().for_each(|(i, p)| {
        let s = (i * per).min(n);
        let e = ((i + 1) * per).min(n);
        *p = if s < e { part(s..e) } else { 0.0 };
    });
    parts.iter().sum()
}

/// `f(offset, out_chunk)` over `ELEM_CHUNK`-sized chunks of `out`, in parallel.
pub fn for_chunks<T: Send>(out: &mut [T], f: impl Fn(usize, &mut [T]) + Sync + Send) {
    out.par_chunks_mut(ELEM_CHUNK)
        .enumerate()
        .for_each(|(i, c)| f(i * ELEM_CHUNK, c));
}
