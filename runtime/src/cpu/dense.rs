//! Dense (fully connected) layer and its backward ops, all through sgemm on strided views.

use rayon::prelude::*;

use super::gemm::{sgemm, View};

/// `y[N,M] = x[N,K] w[K,M] (+ b[M])`.
pub fn dense_fwd(
    n: usize,
    k: usize,
    m: usize,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    y: &mut [f32],
) {
    assert_eq!(x.len(), n * k, "dense: x size");
    assert_eq!(w.len(), k * m, "dense: w size");
    assert_eq!(y.len(), n * m, "dense: y size");
    let beta = match b {
        Some(b) => {
            assert_eq!(b.len(), m, "dense: bias size");
            if m > 0 {
                y.par_chunks_mut(m)
                    .with_min_len(64)
                    .for_each(|row| row.copy_from_slice(b));
            }
            1.0
        }
        None => 0.0,
    };
    sgemm(1.0, View::rm(x, n, k), View::rm(w, k, m), beta, y, m, 1);
}

/// `dx[N,K] = dy[N,M] w[K,M]^T` (w read transposed by strides).
pub fn dense_bwd_data(n: usize, k: usize, m: usize, dy: &[f32], w: &[f32], dx: &mut [f32]) {
    assert_eq!(dy.len(), n * m, "dense_bwd_data: dy size");
    assert_eq!(w.len(), k * m, "dense_bwd_data: w size");
    assert_eq!(dx.len(), n * k, "dense_bwd_data: dx size");
    sgemm(1.0, View::rm(dy, n, m), View::rm_t(w, k, m), 0.0, dx, k, 1);
}

/// `dw[K,M] = x[N,K]^T dy[N,M]` (x read transposed by strides).
pub fn dense_bwd_weight(n: usize, k: usize, m: usize, x: &[f32], dy: &[f32], dw: &mut [f32]) {
    assert_eq!(x.len(), n * k, "dense_bwd_weight: x size");
    assert_eq!(dy.len(), n * m, "dense_bwd_weight: dy size");
    assert_eq!(dw.len(), k * m, "dense_bwd_weight: dw size");
    sgemm(1.0, View::rm_t(x, n, k), View::rm(dy, n, m), 0.0, dw, m, 1);
}

/// `db[C]` = sum of `dy[R, C]` over its rows. Parallel over column blocks; every column is summed
/// serially in row order (deterministic, no scratch).
pub fn bias_grad(dy: &[f32], db: &mut [f32]) {
    let c = db.len();
    if c == 0 {
        return;
    }
    assert_eq!(dy.len() % c, 0, "bias_grad: dy size");
    const COLS: usize = 16;
    db.par_chunks_mut(COLS).enumerate().for_each(|(bi, dbc)| {
        let c0 = bi * COLS;
        let nc = dbc.len();
        dbc.fill(0.0);
        for row in dy.chunks_exact(c) {
            for (o, v) in dbc.iter_mut().zip(&row[c0..c0 + nc]) {
                *o += *v;
            }
        }
    });
}

/// The weight gradient `x[N,K]^T dy[N,M]` by blocks of `chunk` columns: for each block
/// `c0..c0+nc`, `gw[K, nc]` (the first `K*nc` floats of the workspace) receives that block of
/// the gradient and `apply(c0, nc, gw)` consumes it (the optimizer update of those columns).
/// Never holds more than one block.
#[allow(clippy::too_many_arguments)]
pub fn dense_bwd_weight_chunked(
    n: usize,
    k: usize,
    m: usize,
    x: &[f32],
    dy: &[f32],
    chunk: usize,
    gw: &mut [f32],
    mut apply: impl FnMut(usize, usize, &[f32]),
) {
    assert_eq!(x.len(), n * k, "dense_bwd_weight: x size");
    assert_eq!(dy.len(), n * m, "dense_bwd_weight: dy size");
    assert!(chunk >= 1, "dense_bwd_weight: chunk 0");
    assert!(
        gw.len() >= k * chunk.min(m),
        "dense_bwd_weight: workspace too small"
    );
    let mut c0 = 0;
    while c0 < m {
        let nc = chunk.min(m - c0);
        let block = &mut gw[..k * nc];
        let dyv = View {
            data: &dy[c0..],
            rows: n,
            cols: nc,
            rs: m,
            cs: 1,
        };
        sgemm(1.0, View::rm_t(x, n, k), dyv, 0.0, block, nc, 1);
        apply(c0, nc, block);
        c0 += nc;
    }
}
