//! Dense (fully connected) layer and its backward ops, all through sgemm on strided views.

use rayon::prelude::*;

use super::args::{state_slices, Args, Ctx};
use super::epilogue;
use super::gemm::{sgemm, View};
use super::optim::{bias_grad, bias_grad_update};
use super::shard;
use dmc_plan::op::{DenseOp, EpilogueSide};

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
    mut apply: impl FnMut(usize, usize, &mut [f32]),
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

/// Runs one step of an op of the dense family: the step's arguments, taken by signature slot,
/// handed to the kernels above.
///
/// # Safety
/// As [`exec`](super::executor::exec): a validated step, exclusive access to the arena; each
/// mutable slice is taken only for a slot with role Out, InOut or Workspace.
pub(super) unsafe fn exec(op: &DenseOp, a: &Args, ctx: &Ctx) {
    // SAFETY: (all calls below) see this function's contract; slot indices follow the signature.
    unsafe {
        match op {
            DenseOp::Dense { bias, epi } => {
                let w = a.shape(1);
                let (k, m) = (w[0], w[1]);
                let n = a.shape(0).iter().product::<usize>() / k.max(1);
                let yi = DenseOp::y_slot(*bias, epi);
                let b = bias.then(|| a.f32(2));
                let y = a.f32_mut(yi);
                dense_fwd(n, k, m, a.f32(0), a.f32(1), b, y);
                let r = epi.add.then(|| a.f32(2 + *bias as usize));
                epilogue::forward_all(epi, y, r);
            }
            DenseOp::DenseBwdData { epi } => {
                let w = a.shape(1);
                let (k, m) = (w[0], w[1]);
                let n = a.shape(0).iter().product::<usize>() / m.max(1);
                let dx = a.f32_mut(2 + epi.num_inputs(EpilogueSide::DataGradient));
                dense_bwd_data(n, k, m, a.f32(0), a.f32(1), dx);
                let ga = epi.add.then(|| a.f32(2));
                let saved = epi.act.map(|_| a.f32(2 + epi.add as usize));
                epilogue::backward_all(epi, dx, ga, saved);
            }
            DenseOp::DenseBwdWeight => {
                let dw = a.shape(2);
                let (k, m) = (dw[0], dw[1]);
                let n = a.shape(0).iter().product::<usize>() / k.max(1);
                dense_bwd_weight(n, k, m, a.f32(0), a.f32(1), a.f32_mut(2));
            }
            DenseOp::DenseBwdWeightUpdate {
                rule,
                chunk,
                bias,
                shards,
                keep_rows,
            } => {
                let ws = a.shape(2);
                let (k, m) = (ws[0], ws[1]);
                let n = a.shape(0).iter().product::<usize>() / k.max(1);
                let ns = rule.state_names().len();
                let w = a.f32_mut(2);
                let mut states = state_slices(a, 3, ns);
                // workspaces after the weight's and (when fused) the bias' InOut slots; a sharded
                // update's `comm` last
                let wsi = 3 + ns + if *bias { 1 + ns } else { 0 };
                let mut comm = (*shards > 1).then(|| a.f32_mut(wsi + 1 + *bias as usize));
                dense_bwd_weight_chunked(
                    n,
                    k,
                    m,
                    a.f32(0),
                    a.f32(1),
                    *chunk,
                    a.f32_mut(wsi),
                    |c0, nc, gw| {
                        shard::update_columns(
                            ctx,
                            rule,
                            w,
                            m,
                            (c0, nc),
                            gw,
                            comm.as_deref_mut(),
                            &mut states[..ns],
                        )
                    },
                );
                // (sharded parameters: this rank's rows are kept, the others' not gathered)
                if comm.is_some() && !keep_rows {
                    shard::gather_rows(ctx, w, m);
                }
                if *bias {
                    let mut bstates = state_slices(a, 4 + ns, ns);
                    let b = a.f32_mut(3 + ns);
                    let db = a.f32_mut(wsi + 1);
                    match comm {
                        Some(tmp) => {
                            bias_grad(a.f32(1), &mut db[..m]);
                            let db = &mut db[..m];
                            shard::update_bias(
                                ctx,
                                rule,
                                (b, db, tmp),
                                &mut bstates[..ns],
                                !keep_rows,
                            );
                        }
                        None => bias_grad_update(
                            &ctx.rule(rule),
                            ctx.step_counter,
                            a.f32(1),
                            b,
                            db,
                            &mut bstates[..ns],
                        ),
                    }
                }
            }
        }
    }
}
