//! Thin, checked wrapper over `matrixmultiply::sgemm` for strided (possibly transposed) views.

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
    // SAFETY: the asserts above keep every element of A, B and C that sgemm touches inside its
    // slice; C is borrowed mutably and A, B immutably, so C cannot alias A or B; C's strides were
    // checked not to map two elements to one offset.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.as_mut_ptr(),
            rsc as isize,
            csc as isize,
        )
    }
}
