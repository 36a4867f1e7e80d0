//! Thin, checked wrapper over `matrixmultiply::sgemm` for strided (possibly transposed) views.
//!
//! One thread pool: matrixmultiply runs single-threaded (no `threading` feature) and a large GEMM
//! is split into blocks of output rows (or columns) run as rayon tasks. On a small machine two pools
//! (rayon's workers and matrixmultiply's) used to compete for the cores, spinning and yielding to
//! each other. Every output element is still computed by the same serial kernel over the same
//! k blocks, so results do not depend on the split or the thread count.

use rayon::prelude::*;

/// Multiply-adds (m*n*k) below which a GEMM runs on the calling thread.
pub use dmc_plan::cpu::PAR_WORK;
use dmc_plan::cpu::{gemm_split, GemmSplit};

/// A read-only strided matrix view: element (i, j) is `data[i*rs + j*cs]`.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> View<'a> {
    /// Row-major `rows x cols`.
    pub fn rm(data: &'a [f32], rows: usize, cols: usize) -> Self {
        View {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose of a row-major `rows x cols` matrix (a `cols x rows` view, no copy).
    pub fn rm_t(data: &'a [f32], rows: usize, cols: usize) -> Self {
        View {
            data,
            rows: cols,
            cols: rows,
            rs: 1,
            cs: cols,
        }
    }
    fn max_index(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.rows - 1) * self.rs + (self.cols - 1) * self.cs + 1
        }
    }
}

/// `c[i*rsc + j*csc] = alpha * (a b)[i,j] + beta * c[..]` for an `a.rows x b.cols` result.
/// When `beta == 0`, `c` is not read (it may hold NaN).
///
/// Panics if a view reaches past its slice, if the inner dimensions differ, or if the strides of
/// `c` could make two elements alias.
#[allow(clippy::too_many_arguments)]
pub fn sgemm(alpha: f32, a: View, b: View, beta: f32, c: &mut [f32], rsc: usize, csc: usize) {
    sgemm_on(rayon::current_num_threads(), alpha, a, b, beta, c, rsc, csc)
}

/// [`sgemm`] as one block on the calling thread: for a caller that already runs one task per
/// thread (a convolution's rows split over the threads). Same results as [`sgemm`].
pub fn sgemm_serial(
    alpha: f32,
    a: View,
    b: View,
    beta: f32,
    c: &mut [f32],
    rsc: usize,
    csc: usize,
) {
    sgemm_on(1, alpha, a, b, beta, c, rsc, csc)
}

/// [`sgemm`] split for `threads` threads ([`gemm_split`]).
#[allow(clippy::too_many_arguments)]
fn sgemm_on(
    threads: usize,
    alpha: f32,
    a: View,
    b: View,
    beta: f32,
    c: &mut [f32],
    rsc: usize,
    csc: usize,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(k, b.rows, "sgemm: inner dimensions differ");
    assert!(a.max_index() <= a.data.len(), "sgemm: A out of bounds");
    assert!(b.max_index() <= b.data.len(), "sgemm: B out of bounds");
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        (m - 1) * rsc + (n - 1) * csc < c.len(),
        "sgemm: C out of bounds"
    );
    // Distinct (i, j) must map to distinct offsets: one stride must step over the whole other axis.
    assert!(
        (m == 1 || rsc > 0)
            && (n == 1 || csc > 0)
            && (m == 1 || n == 1 || rsc >= n * csc || csc >= m * rsc),
        "sgemm: C strides alias"
    );
    if k == 0 {
        for i in 0..m {
            for j in 0..n {
                let e = &mut c[i * rsc + j * csc];
                *e = if beta == 0.0 { 0.0 } else { beta * *e };
            }
        }
        return;
    }
    // Blocks for rayon (or one, on this thread, when small): the split the CPU time model
    // counts too ([`gemm_split`]). Every block packs its own operands, so the packing memory of
    // the blocks running at once stays that of one unsplit call (`kc x nc` of B).
    let GemmSplit {
        rows: split_rows,
        per,
        parts,
    } = gemm_split(m, n, k, threads);
    let len = if split_rows { m } else { n };
    let cp = SendPtr(c.as_mut_ptr());
    let block = |p: usize| {
        let (s, e) = (p * per, ((p + 1) * per).min(len));
        if s >= e {
            return;
        }
        let (mm, nn, a_off, b_off, c_off) = if split_rows {
            (e - s, n, s * a.rs, 0, s * rsc)
        } else {
            (m, e - s, 0, s * b.cs, s * csc)
        };
        // SAFETY: the asserts above keep every element of A, B and C that sgemm touches inside its
        // slice (a block's view is a sub-view: its first element is offset by whole rows/columns);
        // C is borrowed mutably and A, B immutably, so C cannot alias A or B; C's strides were
        // checked not to map two elements to one offset, so the blocks (disjoint row or column
        // ranges) write disjoint elements, and nothing else touches C while they run.
        unsafe {
            matrixmultiply::sgemm(
                mm,
                k,
                nn,
                alpha,
                a.data.as_ptr().add(a_off),
                a.rs as isize,
                a.cs as isize,
                b.data.as_ptr().add(b_off),
                b.rs as isize,
                b.cs as isize,
                beta,
                cp.get().add(c_off),
                rsc as isize,
                csc as isize,
            )
        }
    };
    if parts == 1 {
        block(0);
    } else {
        (0..parts).into_par_iter().for_each(block);
    }
}

/// C's base pointer, shared by the blocks of one GEMM (which write disjoint elements).
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used inside `sgemm`, whose blocks write disjoint elements of C (see there).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}
