//! Deterministic parallel helpers.
//!
//! Rayon's adaptive splitting makes `par_iter().sum()` of floats depend on the schedule, so every
//! reduction here is split into a *fixed* number of parts whose partial sums live on the stack and
//! are combined serially in a fixed order: bit-identical results run to run, whatever the thread
//! count, and no allocation.

use std::ops::Range;

use rayon::prelude::*;

/// `$body` with `$w` a `const usize` equal to `$v` when `$v` is one of the listed widths (loops of
/// `$w` elements then unroll and keep their sums in registers: a narrow row's loop overhead had
/// been most of its time), else with `$w` the value `$v` itself, or the constant after
/// `else const` (for a const generic argument). Used by batchnorm's per-row loops and the
/// depthwise convolutions' channel blocks.
macro_rules! const_width {
    ($v:expr, [$($n:literal),+], |$w:ident| $body:expr, else const $o:expr) => {
        match $v {
            $($n => {
                const $w: usize = $n;
                $body
            })+
            _ => {
                const $w: usize = $o;
                $body
            }
        }
    };
    ($v:expr, [$($n:literal),+], |$w:ident| $body:expr) => {
        match $v {
            $($n => {
                const $w: usize = $n;
                $body
            })+
            #[allow(non_snake_case)]
            $w => $body,
        }
    };
}
pub(crate) use const_width;

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

/// Rows of `row` elements per task of [`for_rows`] over `len` elements: whole rows, at least
/// [`ELEM_CHUNK`] elements a task, the rows shared evenly by the tasks (1,152 rows of 8 went
/// in tasks of 1,024 and 128 rows: one thread did nearly all the work after the hand-off).
fn rows_per_task(row: usize, len: usize) -> usize {
    let row = row.max(1);
    let rows = len / row;
    let tasks = (rows / ELEM_CHUNK.div_ceil(row).max(1)).max(1);
    rows.div_ceil(tasks).max(1)
}

/// `f(r, out_row_r)` for every `row`-element row of `out`, the rows grouped into parallel tasks
/// of at least [`ELEM_CHUNK`] elements: an output of one task's size runs on the calling thread,
/// with no hand-off to the pool (what a per-row loop of a small kernel spent most of its time
/// on). Each row is computed alone, so the grouping changes no result.
pub fn for_rows<T: Send>(out: &mut [T], row: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    if row == 0 {
        return;
    }
    let per = rows_per_task(row, out.len());
    out.par_chunks_mut(per * row)
        .enumerate()
        .for_each(|(t, block)| {
            for (j, r) in block.chunks_mut(row).enumerate() {
                f(t * per + j, r);
            }
        });
}

/// [`for_rows`] over two outputs with the same rows (`row` elements of each per row), e.g. a
/// pooling's values and its argmax.
pub fn for_rows2<A: Send, B: Send>(
    a: &mut [A],
    b: &mut [B],
    row: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync + Send,
) {
    if row == 0 {
        return;
    }
    let per = rows_per_task(row, a.len());
    a.par_chunks_mut(per * row)
        .zip(b.par_chunks_mut(per * row))
        .enumerate()
        .for_each(|(t, (ba, bb))| {
            for (j, (ra, rb)) in ba.chunks_mut(row).zip(bb.chunks_mut(row)).enumerate() {
                f(t * per + j, ra, rb);
            }
        });
}
