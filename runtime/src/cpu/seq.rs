//! The sequence family on the CPU: token embeddings (a gather, and its backward as a per-row sum
//! in position order), position embeddings, and fused multi-head attention.
//!
//! Attention is FlashAttention's algorithm on tiles of [`ATTN_TILE`] queries and keys, the tile
//! products through `matrixmultiply` (single-threaded, on strided views of `qkv`, no copies):
//! * the forward is one task per (sample, head, query tile); it folds the key tiles in order
//!   into the output rows with an online softmax (a running max and sum per row) and writes each
//!   row's log-sum-exp; the scores of one tile live on the stack, never the `T x T` matrix;
//! * the backward is one task per (sample, head): it computes `delta = rowsum(do * o)` into the
//!   planned workspace, then for each key tile in order and each query tile in order recomputes
//!   `p = exp(s - lse)` and adds to dv, dq and dk. Every element's sum runs in one task in a
//!   fixed order, so results do not depend on the thread count.

use rayon::prelude::*;

use super::args::Args;
use super::loss::BadLabel;
use dmc_plan::op::{SeqOp, ATTN_TILE};

const TILE: usize = ATTN_TILE;

/// `y[n, d] = table[tokens[n]]` (a row of zeros for a token outside the table).
pub fn embedding(tokens: &[i32], table: &[f32], d: usize, y: &mut [f32]) {
    assert!(d > 0 && table.len().is_multiple_of(d) && y.len() == tokens.len() * d);
    let vocab = table.len() / d;
    y.par_chunks_mut(d)
        .with_min_len(64)
        .zip(tokens.par_iter())
        .for_each(|(row, &t)| match usize::try_from(t) {
            Ok(v) if v < vocab => row.copy_from_slice(&table[v * d..(v + 1) * d]),
            _ => row.fill(0.0),
        });
}

/// `dtable[v] = sum of dy[n] over the positions n with tokens[n] = v`, in position order (each
/// task owns a block of table rows and scans every token).
pub fn embedding_bwd(tokens: &[i32], dy: &[f32], d: usize, dtable: &mut [f32]) {
    assert!(d > 0 && dtable.len().is_multiple_of(d) && dy.len() == tokens.len() * d);
    let vocab = dtable.len() / d;
    let per = vocab.div_ceil(16).max(1);
    dtable
        .par_chunks_mut(per * d)
        .enumerate()
        .for_each(|(blk, rows)| {
            rows.fill(0.0);
            let v0 = blk * per;
            let v1 = v0 + rows.len() / d;
            for (n, &t) in tokens.iter().enumerate() {
                let Ok(v) = usize::try_from(t) else { continue };
                if v < v0 || v >= v1 {
                    continue;
                }
                let dst = &mut rows[(v - v0) * d..(v - v0 + 1) * d];
                for (o, g) in dst.iter_mut().zip(&dy[n * d..(n + 1) * d]) {
                    *o += g;
                }
            }
        });
}

/// `y = x + p` for each sample (`p` is one sample's worth of x).
pub fn add_positions(x: &[f32], p: &[f32], y: &mut [f32]) {
    assert!(!p.is_empty() && x.len().is_multiple_of(p.len()) && y.len() == x.len());
    y.par_chunks_mut(p.len())
        .zip(x.par_chunks(p.len()))
        .for_each(|(y, x)| {
            for ((y, x), p) in y.iter_mut().zip(x).zip(p) {
                *y = x + p;
            }
        });
}

/// `y[c, r] = x[r, c]` for `x` `rows x cols`, in blocks of 32 x 32 (each task a block row of y).
pub fn transpose(x: &[f32], rows: usize, y: &mut [f32]) {
    assert!(rows > 0 && x.len().is_multiple_of(rows) && y.len() == x.len());
    let cols = x.len() / rows;
    const B: usize = 32;
    y.par_chunks_mut(B * rows)
        .enumerate()
        .for_each(|(blk, out)| {
            let c0 = blk * B;
            let nc = out.len() / rows;
            for r0 in (0..rows).step_by(B) {
                for c in 0..nc {
                    for r in r0..(r0 + B).min(rows) {
                        out[c * rows + r] = x[r * cols + c0 + c];
                    }
                }
            }
        });
}

/// The geometry of one attention launch: `qkv [b, t, 3d]`, `heads` heads of `dh` columns.
#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub b: usize,
    pub t: usize,
    pub d: usize,
    pub heads: usize,
    pub causal: bool,
}

impl AttnDims {
    fn dh(&self) -> usize {
        self.d / self.heads
    }
    fn scale(&self) -> f32 {
        1.0 / (self.dh() as f32).sqrt()
    }
    /// Offset in `qkv` of row `i` of sample `b`, the query (`part` 0), key (1) or value (2) of
    /// head `h`.
    fn at(&self, b: usize, i: usize, part: usize, h: usize) -> usize {
        (b * self.t + i) * 3 * self.d + part * self.d + h * self.dh()
    }
    /// The key tiles query tile `[i0, i1)` reads: up to its last query with a causal mask.
    fn keys(&self, i1: usize) -> usize {
        if self.causal {
            i1
        } else {
            self.t
        }
    }
    fn check(&self) {
        assert!(self.heads > 0 && self.d.is_multiple_of(self.heads) && self.t > 0);
    }
}

/// A pointer shared by tasks that write disjoint elements behind it.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: only used by the attention kernels below, whose tasks write disjoint elements (each
// task its own (sample, head) columns and rows), and nothing else touches the buffer meanwhile.
unsafe impl Send for SharedMut {}
// SAFETY: as above.
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// The pointer (a method, so that a closure captures the whole `Send` wrapper).
    fn at(self, off: usize) -> *mut f32 {
        self.0.wrapping_add(off)
    }
}

/// `c[i*rsc + j] = alpha (a b)[i, j] + beta c[..]`, `a` `m x k` and `b` `k x n` strided.
///
/// # Safety
/// Every element the views and `c` reach must be in bounds, and no other thread may write the
/// elements of `c` (or any element of `a`, `b`) meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn mm(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    (a, rsa, csa): (*const f32, usize, usize),
    (b, rsb, csb): (*const f32, usize, usize),
    beta: f32,
    (c, rsc): (*mut f32, usize),
) {
    // SAFETY: per this function's contract.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a,
            rsa as isize,
            csa as isize,
            b,
            rsb as isize,
            csb as isize,
            beta,
            c,
            rsc as isize,
            1,
        )
    }
}

/// The scaled scores `q k^T / sqrt(dh)` of head `h` of sample `b`, queries `i0..i0 + nq` against
/// keys `j0..j0 + nk`, into the tile `s` (row stride [`TILE`]).
fn scores(
    qkv: &[f32],
    dims: AttnDims,
    (b, h): (usize, usize),
    (i0, nq): (usize, usize),
    (j0, nk): (usize, usize),
    s: &mut [f32; TILE * TILE],
) {
    let d = dims.d;
    assert!(nq <= TILE && nk <= TILE && i0 + nq <= dims.t && j0 + nk <= dims.t && b < dims.b);
    let (q, k) = (dims.at(b, i0, 0, h), dims.at(b, j0, 1, h));
    // SAFETY: the rows i0..i0+nq and j0..j0+nk of sample b exist (asserted), so the views of q
    // (nq x dh, row stride 3d) and k^T (dh x nk) stay inside qkv; `s` holds TILE x TILE.
    unsafe {
        mm(
            (nq, dims.dh(), nk),
            dims.scale(),
            (qkv.as_ptr().add(q), 3 * d, 1),
            (qkv.as_ptr().add(k), 1, 3 * d),
            0.0,
            (s.as_mut_ptr(), TILE),
        )
    }
}

/// `qkv [b, t, 3d] -> o [b, t, d], lse [b, heads, t]` (see the module's doc).
pub fn attention(qkv: &[f32], dims: AttnDims, o: &mut [f32], lse: &mut [f32]) {
    dims.check();
    let AttnDims { b, t, d, heads, .. } = dims;
    assert!(qkv.len() == b * t * 3 * d && o.len() == b * t * d && lse.len() == b * heads * t);
    let dh = dims.dh();
    let tiles = t.div_ceil(TILE);
    let op = SharedMut(o.as_mut_ptr());
    let lp = SharedMut(lse.as_mut_ptr());
    (0..b * heads * tiles).into_par_iter().for_each(|task| {
        let (bh, qt) = (task / tiles, task % tiles);
        let (bi, h) = (bh / heads, bh % heads);
        let (i0, i1) = (qt * TILE, ((qt + 1) * TILE).min(t));
        let nq = i1 - i0;
        let mut s = [0f32; TILE * TILE];
        let mut mx = [f32::NEG_INFINITY; TILE];
        let mut sum = [0f32; TILE];
        let orow = |i: usize| (bi * t + i) * d + h * dh;
        // SAFETY: this task alone writes o's rows i0..i1 of (bi, h)'s columns and lse's
        // entries i0..i1 of (bi, h); qkv is only read; every offset below is inside qkv, o,
        // lse or the stack tiles (asserted sizes).
        unsafe {
            for i in i0..i1 {
                std::slice::from_raw_parts_mut(op.at(orow(i)), dh).fill(0.0);
            }
            let kend = dims.keys(i1);
            for j0 in (0..kend).step_by(TILE) {
                let nk = (j0 + TILE).min(kend) - j0;
                scores(qkv, dims, (bi, h), (i0, nq), (j0, nk), &mut s);
                for r in 0..nq {
                    let row = &mut s[r * TILE..r * TILE + nk];
                    if dims.causal {
                        for (c, v) in row.iter_mut().enumerate() {
                            if j0 + c > i0 + r {
                                *v = f32::NEG_INFINITY;
                            }
                        }
                    }
                    let m_new = row.iter().fold(mx[r], |a, &v| a.max(v));
                    let corr = (mx[r] - m_new).exp();
                    let mut l = 0f32;
                    for v in row.iter_mut() {
                        *v = (*v - m_new).exp();
                        l += *v;
                    }
                    sum[r] = sum[r] * corr + l;
                    mx[r] = m_new;
                    if corr != 1.0 {
                        for x in std::slice::from_raw_parts_mut(op.at(orow(i0 + r)), dh) {
                            *x *= corr;
                        }
                    }
                }
                let v = qkv.as_ptr().add(dims.at(bi, j0, 2, h));
                mm(
                    (nq, nk, dh),
                    1.0,
                    (s.as_ptr(), TILE, 1),
                    (v, 3 * d, 1),
                    1.0,
                    (op.at(orow(i0)), d),
                );
            }
            for r in 0..nq {
                let inv = 1.0 / sum[r];
                for x in std::slice::from_raw_parts_mut(op.at(orow(i0 + r)), dh) {
                    *x *= inv;
                }
                *lp.at(bh * t + i0 + r) = mx[r] + sum[r].ln();
            }
        }
    });
}

/// `qkv, o, lse, do -> dqkv`, `delta` the workspace `[b, heads, t]` (see the module's doc).
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd(
    qkv: &[f32],
    o: &[f32],
    lse: &[f32],
    dout: &[f32],
    dims: AttnDims,
    dqkv: &mut [f32],
    delta: &mut [f32],
) {
    dims.check();
    let AttnDims { b, t, d, heads, .. } = dims;
    assert!(qkv.len() == b * t * 3 * d && dqkv.len() == qkv.len());
    assert!(o.len() == b * t * d && dout.len() == o.len() && lse.len() == b * heads * t);
    assert!(delta.len() >= lse.len());
    let dh = dims.dh();
    let scale = dims.scale();
    let dp = SharedMut(dqkv.as_mut_ptr());
    delta[..b * heads * t]
        .par_chunks_mut(t)
        .enumerate()
        .for_each(|(bh, delta)| {
            let (bi, h) = (bh / heads, bh % heads);
            let orow = |i: usize| (bi * t + i) * d + h * dh;
            for (i, dl) in delta.iter_mut().enumerate() {
                let (o, g) = (&o[orow(i)..orow(i) + dh], &dout[orow(i)..orow(i) + dh]);
                *dl = o.iter().zip(g).map(|(a, b)| a * b).sum();
            }
            let lse = &lse[bh * t..(bh + 1) * t];
            let mut p = [0f32; TILE * TILE];
            let mut ds = [0f32; TILE * TILE];
            // SAFETY: this task alone writes dqkv's columns of (bi, h) (its q, k and v thirds),
            // every row; the inputs are only read; offsets stay inside the asserted sizes.
            unsafe {
                for i in 0..t {
                    for part in 0..3 {
                        std::slice::from_raw_parts_mut(dp.at(dims.at(bi, i, part, h)), dh)
                            .fill(0.0);
                    }
                }
                for j0 in (0..t).step_by(TILE) {
                    let nk = (j0 + TILE).min(t) - j0;
                    let k = qkv.as_ptr().add(dims.at(bi, j0, 1, h));
                    let v = qkv.as_ptr().add(dims.at(bi, j0, 2, h));
                    let i_first = if dims.causal { j0 / TILE * TILE } else { 0 };
                    for i0 in (i_first..t).step_by(TILE) {
                        let nq = (i0 + TILE).min(t) - i0;
                        let q = qkv.as_ptr().add(dims.at(bi, i0, 0, h));
                        let g = dout.as_ptr().add(orow(i0));
                        // p = exp(scale q k^T - lse), masked
                        scores(qkv, dims, (bi, h), (i0, nq), (j0, nk), &mut p);
                        for r in 0..nq {
                            for c in 0..nk {
                                let e = &mut p[r * TILE + c];
                                *e = if dims.causal && j0 + c > i0 + r {
                                    0.0
                                } else {
                                    (*e - lse[i0 + r]).exp()
                                };
                            }
                        }
                        // dv_j += p^T do_i
                        mm(
                            (nk, nq, dh),
                            1.0,
                            (p.as_ptr(), 1, TILE),
                            (g, d, 1),
                            1.0,
                            (dp.at(dims.at(bi, j0, 2, h)), 3 * d),
                        );
                        // dp = do_i v_j^T; ds = p (dp - delta)
                        mm(
                            (nq, dh, nk),
                            1.0,
                            (g, d, 1),
                            (v, 1, 3 * d),
                            0.0,
                            (ds.as_mut_ptr(), TILE),
                        );
                        for r in 0..nq {
                            for c in 0..nk {
                                let e = r * TILE + c;
                                ds[e] = p[e] * (ds[e] - delta[i0 + r]);
                            }
                        }
                        // dq_i += scale ds k_j; dk_j += scale ds^T q_i
                        mm(
                            (nq, nk, dh),
                            scale,
                            (ds.as_ptr(), TILE, 1),
                            (k, 3 * d, 1),
                            1.0,
                            (dp.at(dims.at(bi, i0, 0, h)), 3 * d),
                        );
                        mm(
                            (nk, nq, dh),
                            scale,
                            (ds.as_ptr(), 1, TILE),
                            (q, 3 * d, 1),
                            1.0,
                            (dp.at(dims.at(bi, j0, 1, h)), 3 * d),
                        );
                    }
                }
            }
        });
}

/// Runs one op of the family on a step's arguments.
///
/// # Safety
/// As [`super::executor`]'s `exec`: validated arguments, written slots disjoint from the rest.
pub(super) unsafe fn exec(op: &SeqOp, a: &Args) -> Result<(), BadLabel> {
    let last = |i: usize| a.shape(i).last().copied().unwrap_or(1);
    // SAFETY: (all calls below) see this function's contract; slot indices follow the signature.
    unsafe {
        match op {
            SeqOp::Embedding => {
                let (tokens, vocab) = (a.i32(0), a.shape(1).first().copied().unwrap_or(0));
                if let Some(row) = tokens.iter().position(|&t| t < 0 || t as usize >= vocab) {
                    return Err(BadLabel {
                        row,
                        label: tokens[row],
                        classes: vocab,
                    });
                }
                embedding(tokens, a.f32(1), last(1), a.f32_mut(2))
            }
            SeqOp::EmbeddingBwd { .. } => embedding_bwd(a.i32(0), a.f32(1), last(1), a.f32_mut(2)),
            SeqOp::AddPositions => add_positions(a.f32(0), a.f32(1), a.f32_mut(2)),
            SeqOp::Transpose => transpose(a.f32(0), a.shape(0)[0], a.f32_mut(1)),
            SeqOp::Attention { heads, causal } | SeqOp::AttentionBwd { heads, causal } => {
                let s = a.shape(0);
                let dims = AttnDims {
                    b: s[0],
                    t: s[1],
                    d: s[2] / 3,
                    heads: *heads,
                    causal: *causal,
                };
                if matches!(op, SeqOp::Attention { .. }) {
                    attention(a.f32(0), dims, a.f32_mut(1), a.f32_mut(2))
                } else {
                    attention_bwd(
                        a.f32(0),
                        a.f32(1),
                        a.f32(2),
                        a.f32(3),
                        dims,
                        a.f32_mut(4),
                        a.f32_mut(5),
                    )
                }
            }
        }
    }
    Ok(())
}
