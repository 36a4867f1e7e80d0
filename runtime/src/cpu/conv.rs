//! 2-D convolution (NHWC, HWIO weights) and its two backward ops.
//!
//! Forward and weight-gradient go through im2col into the *planned* workspace buffer, in chunks of
//! at most [`CONV_CHUNK_ROWS`] output rows (row = one output pixel `(n, oy, ox)`, K = kh*kw*Ci
//! columns), followed by one sgemm per chunk. The weight `[kh,kw,Ci,Co]` is, row-major, exactly the
//! `[K, Co]` matrix the GEMM needs; transposed uses are strided views, never copies.
//! Both store their chunk row-major (`cols[r*K + kk]`: a pixel's taps are contiguous runs of its
//! channels, copied whole). The forward splits each chunk's rows over the threads, one task per
//! thread doing its rows' bias, gather, GEMM and epilogue; each task's rows take their own
//! `[rows, K]` block of the workspace (same workspace size).
//!
//! The data gradient has no workspace in its signature ([`Op::signature`](dmc_plan::op::Op)):
//! it computes `dcols = dy_rows w^T` per tile of output pixels into a fixed per-thread tile of
//! [`BWD_DATA_TILE_ELEMS`] floats (up to 4x that for a weight larger than a cache,
//! `dmc_plan::op::bwd_data_tile_rows`; O(threads x tile), reused across calls, independent of the
//! batch), then col2im scatter-adds it into dx. Images are independent (parallel); inside an image
//! the accumulation order is fixed.

use std::cell::RefCell;

use dmc_plan::cpu::gemm_split;
use dmc_plan::op::{ConvGeom, CONV_CHUNK_ROWS};
use rayon::prelude::*;

use super::args::{state_slices, Args, Ctx};
use super::depthwise;
use super::epilogue;
use super::gemm::{sgemm, sgemm_serial, View};
use super::optim::{bias_col_sums, update_block};
use super::par::ELEM_CHUNK;
use super::shard;
use dmc_plan::op::{ConvOp, Epilogue};

/// Sizes of one convolution: x `[n,h,w,ci]`, y `[n,ho,wo,co]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvDims {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub ci: usize,
    pub ho: usize,
    pub wo: usize,
    pub co: usize,
}

impl ConvDims {
    /// From the full shapes of x `[N,H,W,Ci]` and y `[N,Ho,Wo,Co]`.
    pub fn from_shapes(x: &[usize], y: &[usize]) -> Self {
        ConvDims {
            n: x[0],
            h: x[1],
            w: x[2],
            ci: x[3],
            ho: y[1],
            wo: y[2],
            co: y[3],
        }
    }
    /// im2col rows: N*Ho*Wo.
    pub fn rows(&self) -> usize {
        self.n * self.ho * self.wo
    }
    /// im2col columns of one group: kh*kw*Ci/groups (the weight matrix is `[K, Co]`).
    pub fn k(&self, g: &ConvGeom) -> usize {
        g.kh * g.kw * self.cig(g)
    }
    /// Input channels per group.
    pub fn cig(&self, g: &ConvGeom) -> usize {
        self.ci / g.groups
    }
    /// Output channels per group.
    pub fn cog(&self, g: &ConvGeom) -> usize {
        self.co / g.groups
    }
    /// Rows per chunk.
    pub fn chunk_rows(&self) -> usize {
        self.rows().min(CONV_CHUNK_ROWS)
    }
    /// Workspace elements needed (same as `dmc_plan::op::conv_workspace_elems`).
    pub fn workspace_elems(&self, g: &ConvGeom) -> usize {
        self.chunk_rows() * self.k(g)
    }
    fn check(&self, g: &ConvGeom, x: usize, w: usize, y: usize) {
        assert_eq!(x, self.n * self.h * self.w * self.ci, "conv: x size");
        assert_eq!(w, self.k(g) * self.co, "conv: w size");
        assert_eq!(y, self.rows() * self.co, "conv: y size");
        assert!(g.stride_h >= 1 && g.stride_w >= 1, "conv: stride 0");
        assert!(g.dil_h >= 1 && g.dil_w >= 1, "conv: dilation 0");
        assert!(
            g.groups >= 1 && self.ci.is_multiple_of(g.groups) && self.co.is_multiple_of(g.groups),
            "conv: groups do not divide the channels"
        );
    }
}

/// Fills `cols[..nr*K]` with the im2col rows `r0..r0+nr` of group `grp`'s input channels (zeros
/// where the window is in padding).
#[allow(clippy::too_many_arguments)]
fn im2col(
    g: &ConvGeom,
    d: &ConvDims,
    x: &[f32],
    grp: usize,
    r0: usize,
    nr: usize,
    cols: &mut [f32],
) {
    let k = d.k(g);
    if k == 0 {
        return;
    }
    let (h, w, ci, c0) = (d.h as isize, d.w as isize, d.cig(g), grp * d.cig(g));
    // (tasks of at least ELEM_CHUNK elements: a small gather on the calling thread)
    cols[..nr * k]
        .par_chunks_mut(k)
        .with_min_len(ELEM_CHUNK.div_ceil(k).max(8))
        .enumerate()
        .for_each(|(i, crow)| {
            let r = r0 + i;
            let ox = r % d.wo;
            let t = r / d.wo;
            let oy = t % d.ho;
            let n = t / d.ho;
            // a window row's taps are one run of x when they are adjacent pixels of all its
            // channels (no dilation, one group): one copy a row, not one per tap (a 3-channel
            // input's taps are 3 floats each)
            if g.dil_w == 1 && ci == d.ci {
                let (kw, base) = (
                    g.kw as isize,
                    (ox * g.stride_w) as isize - g.pad_left as isize,
                );
                let (kx0, kx1) = ((-base).clamp(0, kw), (w - base).clamp(0, kw));
                let (kx0, kx1) = (kx0 as usize, kx1.max(kx0) as usize);
                for (ky, row) in crow.chunks_exact_mut(g.kw * ci).enumerate() {
                    let iy = (oy * g.stride_h + ky * g.dil_h) as isize - g.pad_top as isize;
                    if iy < 0 || iy >= h {
                        row.fill(0.0);
                        continue;
                    }
                    row[..kx0 * ci].fill(0.0);
                    row[kx1 * ci..].fill(0.0);
                    if kx1 > kx0 {
                        let ix = (base + kx0 as isize) as usize;
                        let src = ((n * d.h + iy as usize) * d.w + ix) * d.ci;
                        row[kx0 * ci..kx1 * ci].copy_from_slice(&x[src..][..(kx1 - kx0) * ci]);
                    }
                }
                return;
            }
            for ky in 0..g.kh {
                let iy = (oy * g.stride_h + ky * g.dil_h) as isize - g.pad_top as isize;
                for kx in 0..g.kw {
                    let ix = (ox * g.stride_w + kx * g.dil_w) as isize - g.pad_left as isize;
                    let dst = &mut crow[(ky * g.kw + kx) * ci..][..ci];
                    if iy >= 0 && iy < h && ix >= 0 && ix < w {
                        let src = ((n * d.h + iy as usize) * d.w + ix as usize) * d.ci + c0;
                        dst.copy_from_slice(&x[src..src + ci]);
                    } else {
                        dst.fill(0.0);
                    }
                }
            }
        });
}

/// y = conv(x, w) (+ b), through im2col chunks in `cols` (at least `d.workspace_elems(g)` long).
pub fn conv2d_fwd(
    g: &ConvGeom,
    d: &ConvDims,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    y: &mut [f32],
    cols: &mut [f32],
) {
    conv2d_fwd_epi(g, d, x, w, b, (&Epilogue::NONE, None), y, cols)
}

/// [`conv2d_fwd`] with an epilogue: `y = epi.act(conv(x, w) + b + r)`, applied to each chunk of
/// output rows right after its GEMM (`r` given when `epi.add`).
#[allow(clippy::too_many_arguments)]
pub fn conv2d_fwd_epi(
    g: &ConvGeom,
    d: &ConvDims,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    (epi, r): (&Epilogue, Option<&[f32]>),
    y: &mut [f32],
    cols: &mut [f32],
) {
    d.check(g, x.len(), w.len(), y.len());
    let (k, co, rows, cr) = (d.k(g), d.co, d.rows(), d.chunk_rows());
    assert!(cols.len() >= cr * k, "conv: workspace too small");
    if let Some(b) = b {
        assert_eq!(b.len(), co, "conv: bias size");
    }
    if depthwise::is_depthwise(g, d) {
        return depthwise::forward(g, d, (x, w, b), (epi, r), y);
    }
    let cog = d.cog(g);
    let beta = if b.is_some() { 1.0 } else { 0.0 };
    let mut r0 = 0;
    while r0 < rows {
        let nr = cr.min(rows - r0);
        let yc = &mut y[r0 * co..(r0 + nr) * co];
        let rc = r.map(|r| &r[r0 * co..(r0 + nr) * co]);
        // A chunk's rows, their bias, per group their im2col rows (`cp`, row-major) times the
        // group's block of the weight's columns, then their epilogue; `serial`: its GEMM on this
        // thread.
        let rows_work = |a: usize, yp: &mut [f32], cp: &mut [f32], serial: bool| {
            let nb = yp.len() / co.max(1);
            if let Some(b) = b {
                for row in yp.chunks_mut(co.max(1)) {
                    row.copy_from_slice(b);
                }
            }
            for grp in 0..g.groups {
                im2col(g, d, x, grp, r0 + a, nb, cp);
                let wv = View {
                    data: &w[grp * cog..],
                    rows: k,
                    cols: cog,
                    rs: co,
                    cs: 1,
                };
                let gemm = if serial { sgemm_serial } else { sgemm };
                let av = View::rm(&cp[..nb * k], nb, k);
                gemm(1.0, av, wv, beta, &mut yp[grp * cog..], co, 1);
            }
            if !epi.is_none() {
                epilogue::forward_block(epi, yp, rc.map(|r| &r[a * co..a * co + yp.len()]));
            }
        };
        // Where the GEMM splits by rows, one task per block does all of its rows' work (its own
        // `[rows, K]` block of the workspace): one hand-off to the pool per chunk, not one per
        // loop. Otherwise (few rows: the GEMM splits its columns, or runs on one thread) the chunk
        // is one piece. Each output element is the same serial kernel's either way.
        let sp = gemm_split(nr, cog, k, rayon::current_num_threads());
        if sp.rows && sp.parts > 1 {
            yc.par_chunks_mut(sp.per * co)
                .zip(cols[..nr * k].par_chunks_mut(sp.per * k))
                .enumerate()
                .for_each(|(p, (yp, cp))| rows_work(p * sp.per, yp, cp, true));
        } else {
            rows_work(0, yc, &mut cols[..nr * k], false);
        }
        r0 += nr;
    }
}

/// Elements of the per-thread `dcols` tile of [`conv2d_bwd_data`] (256 KiB of f32): the tile holds
/// `max(1, TILE / K)` rows (at most [`CONV_CHUNK_ROWS`]).
pub const BWD_DATA_TILE_ELEMS: usize = dmc_plan::op::BWD_DATA_TILE;

thread_local! {
    /// The `dcols` tile of `conv2d_bwd_data`, reused across calls: a fixed O(tile) buffer per
    /// thread, not proportional to the batch (the op's signature has no planned workspace).
    static DCOLS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// One image of the saved value of an in-place `conv2d_bwd_data` (dx written over it): the
    /// image's saved values, kept while its dx is accumulated. O(one image) per thread.
    static SAVED_IMAGE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Where the epilogue of [`conv2d_bwd_data_epi`] finds the activation's saved value.
#[derive(Clone, Copy)]
pub enum SavedIn<'a> {
    /// No activation.
    None,
    /// Its own buffer.
    Buffer(&'a [f32]),
    /// In dx itself on entry (in place: dx is written over it).
    Dx,
}

/// dx = conv^T(dy, w): the gradient w.r.t. the input (overwrites `dx`).
///
/// Per image (parallel) and per tile of its output pixels: `dcols[rows, K] = dy_rows[rows, Co]
/// w^T` (one sgemm, w read transposed by strides), then col2im scatter-adds `dcols` into dx in a
/// fixed order (deterministic).
pub fn conv2d_bwd_data(g: &ConvGeom, d: &ConvDims, dy: &[f32], w: &[f32], dx: &mut [f32]) {
    conv2d_bwd_data_epi(g, d, dy, w, (&Epilogue::NONE, None, SavedIn::None), dx)
}

/// [`conv2d_bwd_data`] with an epilogue: `dx = epi.act'(saved) * (conv^T(dy, w) + g)`, applied to
/// each image's block of dx once it is complete (`g`, `saved` given as `epi` asks; with
/// [`SavedIn::Dx`] the image's saved values are kept aside while its dx is accumulated).
pub fn conv2d_bwd_data_epi(
    g: &ConvGeom,
    d: &ConvDims,
    dy: &[f32],
    w: &[f32],
    (epi, ga, saved): (&Epilogue, Option<&[f32]>, SavedIn),
    dx: &mut [f32],
) {
    d.check(g, dx.len(), w.len(), dy.len());
    let (ci, co, k) = (d.ci, d.co, d.k(g));
    let (cig, cog) = (d.cig(g), d.cog(g));
    let img = d.h * d.w * ci;
    if img == 0 {
        return;
    }
    let per_img = d.ho * d.wo;
    let t_rows = dmc_plan::op::bwd_data_tile_rows(k, d.cog(g), d.ho * d.wo);
    let (h, wd) = (d.h as isize, d.w as isize);
    let depthwise = depthwise::is_depthwise(g, d);
    dx.par_chunks_mut(img).enumerate().for_each(|(n, dxn)| {
        // in place: this image's saved values aside (taken out of the thread-local for the
        // duration, as the tile below: a task stolen meanwhile uses a buffer of its own)
        let mut kept = match saved {
            SavedIn::Dx => {
                let mut v = SAVED_IMAGE.with(|c| c.take());
                v.clear();
                v.extend_from_slice(dxn);
                Some(v)
            }
            _ => None,
        };
        dxn.fill(0.0);
        let ga = ga.map(|t| &t[n * img..(n + 1) * img]);
        let done = |dxn: &mut [f32], kept: &Option<Vec<f32>>| {
            let sv = match saved {
                SavedIn::Buffer(t) => Some(&t[n * img..(n + 1) * img]),
                SavedIn::Dx => kept.as_deref(),
                SavedIn::None => None,
            };
            if !epi.is_none() {
                epilogue::backward_block(epi, dxn, ga, sv);
            }
        };
        if co == 0 || k == 0 || per_img == 0 {
            done(dxn, &kept);
            if let Some(v) = kept.take() {
                SAVED_IMAGE.with(|c| c.replace(v));
            }
            return;
        }
        let dyn_ = &dy[n * per_img * co..(n + 1) * per_img * co];
        if depthwise {
            depthwise::data_grad_image(g, d, dyn_, w, dxn);
            done(dxn, &kept);
            if let Some(v) = kept.take() {
                SAVED_IMAGE.with(|c| c.replace(v));
            }
            return;
        }
        // The tile is taken out of the thread-local for the duration: the sgemm below may run its
        // blocks as rayon tasks, and while it waits this thread can steal another image's task of
        // this loop, which then finds an empty slot and uses a tile of its own (never a second
        // borrow of this one).
        DCOLS.with(|cell| {
            let mut tile = cell.take();
            if tile.len() < t_rows * k {
                tile.resize(t_rows * k, 0.0);
            }
            let mut p0 = 0;
            while p0 < per_img {
                let nr = t_rows.min(per_img - p0);
                for grp in 0..g.groups {
                    let dc = &mut tile[..nr * k];
                    // this group's columns of dy times the transpose of its block of w
                    let a = View {
                        data: &dyn_[p0 * co + grp * cog..],
                        rows: nr,
                        cols: cog,
                        rs: co,
                        cs: 1,
                    };
                    let wt = View {
                        data: &w[grp * cog..],
                        rows: cog,
                        cols: k,
                        rs: 1,
                        cs: co,
                    };
                    sgemm(1.0, a, wt, 0.0, dc, k, 1);
                    let c0 = grp * cig;
                    for (i, drow) in dc.chunks_exact(k).enumerate() {
                        let p = p0 + i;
                        let (oy, ox) = (p / d.wo, p % d.wo);
                        for ky in 0..g.kh {
                            let iy = (oy * g.stride_h + ky * g.dil_h) as isize - g.pad_top as isize;
                            if iy < 0 || iy >= h {
                                continue;
                            }
                            for kx in 0..g.kw {
                                let ix =
                                    (ox * g.stride_w + kx * g.dil_w) as isize - g.pad_left as isize;
                                if ix < 0 || ix >= wd {
                                    continue;
                                }
                                let dst = (iy as usize * d.w + ix as usize) * ci + c0;
                                let src = (ky * g.kw + kx) * cig;
                                for (o, v) in
                                    dxn[dst..dst + cig].iter_mut().zip(&drow[src..src + cig])
                                {
                                    *o += *v;
                                }
                            }
                        }
                    }
                }
                p0 += nr;
            }
            // keep one tile per thread (the larger, if a stolen task left one here meanwhile)
            let other = cell.take();
            cell.replace(if other.len() > tile.len() {
                other
            } else {
                tile
            });
        });
        done(dxn, &kept);
        if let Some(v) = kept.take() {
            SAVED_IMAGE.with(|c| c.replace(v));
        }
    });
}

/// y = conv^T(x, w) + b, the transposed convolution (PyTorch's `ConvTranspose2d`; overwrites `y`):
/// x `[N,H,W,Ci]` (`x_shape`) in the place of the data gradient of the convolution `g` from y
/// `[N,Ho,Wo,Co]` (`y_shape`) to x, w that convolution's `[kh,kw,Co/groups,Ci]`, then b `[Co]`
/// added to every pixel.
pub fn conv_transpose2d(
    g: &ConvGeom,
    x_shape: &[usize],
    y_shape: &[usize],
    (x, w, b): (&[f32], &[f32], Option<&[f32]>),
    y: &mut [f32],
) {
    let d = ConvDims::from_shapes(y_shape, x_shape);
    conv2d_bwd_data(g, &d, x, w, y);
    if let Some(b) = b {
        assert_eq!(b.len(), d.ci, "conv_transpose2d: bias size");
        for px in y.chunks_exact_mut(d.ci) {
            for (o, bv) in px.iter_mut().zip(b) {
                *o += *bv;
            }
        }
    }
}

/// dw = sum over chunks of cols^T dy_chunk (overwrites `dw`), im2col chunks in `cols`.
pub fn conv2d_bwd_weight(
    g: &ConvGeom,
    d: &ConvDims,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    cols: &mut [f32],
) {
    d.check(g, x.len(), dw.len(), dy.len());
    let (k, co, rows, cr) = (d.k(g), d.co, d.rows(), d.chunk_rows());
    assert!(cols.len() >= cr * k, "conv: workspace too small");
    if depthwise::is_depthwise(g, d) {
        return depthwise::weight_grad(g, d, (x, dy), (0, co), dw);
    }
    dw.fill(0.0);
    let cog = d.cog(g);
    let mut r0 = 0;
    while r0 < rows {
        let nr = cr.min(rows - r0);
        for grp in 0..g.groups {
            im2col(g, d, x, grp, r0, nr, cols);
            let dyv = View {
                data: &dy[r0 * co + grp * cog..],
                rows: nr,
                cols: cog,
                rs: co,
                cs: 1,
            };
            sgemm(
                1.0,
                View::rm_t(&cols[..nr * k], nr, k),
                dyv,
                1.0,
                &mut dw[grp * cog..],
                co,
                1,
            );
        }
        r0 += nr;
    }
}

/// The weight gradient of [`conv2d_bwd_weight`] by blocks of `chunk` output channels (columns of
/// the `[K, Co]` weight matrix): for each block `c0..c0+nc`, `gw[K, nc]` (the first `K*nc`
/// floats of the workspace) receives that block of the gradient (im2col chunks in `cols`, as
/// [`conv2d_bwd_weight`]) and `apply(c0, nc, gw)` consumes it (the optimizer update of those
/// columns). Never holds more than one block; im2col is redone per block. With groups, a block
/// never straddles two groups (it ends at its group's last column): it is one group's GEMM
/// (K = `kh*kw*Ci/groups` rows). With `db` (the fused
/// bias gradient), each block's column sums of dy go into it (in the plan's two-level order, as
/// [`bias_grad`](super::optim::bias_grad)).
#[allow(clippy::too_many_arguments)]
pub fn conv2d_bwd_weight_chunked(
    g: &ConvGeom,
    d: &ConvDims,
    x: &[f32],
    dy: &[f32],
    chunk: usize,
    (gw, mut db): (&mut [f32], Option<&mut [f32]>),
    cols: &mut [f32],
    mut apply: impl FnMut(usize, usize, &mut [f32]),
) {
    let (k, co, rows, cr) = (d.k(g), d.co, d.rows(), d.chunk_rows());
    d.check(g, x.len(), k * co, dy.len());
    assert!(cols.len() >= cr * k, "conv: workspace too small");
    assert!(chunk >= 1, "conv: chunk 0");
    assert!(
        gw.len() >= k * chunk.min(co),
        "conv: gradient workspace too small"
    );
    if let Some(db) = db.as_deref() {
        assert!(db.len() >= co, "conv: bias workspace too small");
    }
    if depthwise::is_depthwise(g, d) {
        // blocks of `chunk` channels, each channel its own group (the direct kernel takes any run)
        let mut c0 = 0;
        while c0 < co {
            let nc = chunk.min(co - c0);
            let block = &mut gw[..k * nc];
            depthwise::weight_grad(g, d, (x, dy), (c0, nc), block);
            if let Some(db) = db.as_deref_mut() {
                bias_col_sums(dy, co, c0, &mut db[c0..c0 + nc]);
            }
            apply(c0, nc, block);
            c0 += nc;
        }
        return;
    }
    let cog = d.cog(g);
    let mut c0 = 0;
    while c0 < co {
        let grp = c0 / cog.max(1);
        let nc = chunk.min((grp + 1) * cog - c0);
        let block = &mut gw[..k * nc];
        block.fill(0.0);
        let mut r0 = 0;
        while r0 < rows {
            let nr = cr.min(rows - r0);
            im2col(g, d, x, grp, r0, nr, cols);
            let dyv = View {
                data: &dy[r0 * co + c0..],
                rows: nr,
                cols: nc,
                rs: co,
                cs: 1,
            };
            sgemm(
                1.0,
                View::rm_t(&cols[..nr * k], nr, k),
                dyv,
                1.0,
                block,
                nc,
                1,
            );
            r0 += nr;
        }
        if let Some(db) = db.as_deref_mut() {
            bias_col_sums(dy, co, c0, &mut db[c0..c0 + nc]);
        }
        apply(c0, nc, block);
        c0 += nc;
    }
}

/// Runs one step of an op of the convolution family: the step's arguments, taken by signature slot,
/// handed to the kernels above.
///
/// # Safety
/// As [`exec`](super::executor::exec): a validated step, exclusive access to the arena; each
/// mutable slice is taken only for a slot with role Out, InOut or Workspace.
pub(super) unsafe fn exec(op: &ConvOp, a: &Args, ctx: &Ctx) {
    // SAFETY: (all calls below) see this function's contract; slot indices follow the signature.
    unsafe {
        match op {
            ConvOp::Conv2d { geom, bias, epi } => {
                let yi = ConvOp::y_slot(*bias, epi);
                let d = ConvDims::from_shapes(a.shape(0), a.shape(yi));
                let b = bias.then(|| a.f32(2));
                let r = epi.add.then(|| a.f32(2 + *bias as usize));
                conv2d_fwd_epi(
                    geom,
                    &d,
                    a.f32(0),
                    a.f32(1),
                    b,
                    (epi, r),
                    a.f32_mut(yi),
                    a.f32_mut(yi + 1),
                );
            }
            ConvOp::Conv2dBwdData {
                geom,
                epi,
                in_place,
            } => {
                // in place, dx is the saved value's slot (the last input)
                let dxi = ConvOp::dx_slot(epi, *in_place);
                let d = ConvDims::from_shapes(a.shape(dxi), a.shape(0));
                let ga = epi.add.then(|| a.f32(2));
                let saved = match (epi.act, in_place) {
                    (None, _) => SavedIn::None,
                    (Some(_), true) => SavedIn::Dx,
                    (Some(_), false) => SavedIn::Buffer(a.f32(2 + epi.add as usize)),
                };
                conv2d_bwd_data_epi(
                    geom,
                    &d,
                    a.f32(0),
                    a.f32(1),
                    (epi, ga, saved),
                    a.f32_mut(dxi),
                );
            }
            ConvOp::ConvTranspose2d { geom, bias, .. } => {
                let yi = 2 + *bias as usize;
                let b = bias.then(|| a.f32(2));
                conv_transpose2d(
                    geom,
                    a.shape(0),
                    a.shape(yi),
                    (a.f32(0), a.f32(1), b),
                    a.f32_mut(yi),
                );
            }
            ConvOp::Conv2dBwdWeight { geom } => {
                let d = ConvDims::from_shapes(a.shape(0), a.shape(1));
                conv2d_bwd_weight(geom, &d, a.f32(0), a.f32(1), a.f32_mut(2), a.f32_mut(3));
            }
            ConvOp::Conv2dBwdWeightUpdate {
                geom,
                rule,
                chunk,
                bias,
                keep_old,
                shards,
                keep_rows,
                ..
            } => {
                let d = ConvDims::from_shapes(a.shape(0), a.shape(1));
                let ns = rule.state_names().len();
                let w = a.f32_mut(2);
                let mut states = state_slices(a, 3, ns);
                let co = d.co;
                // after the weight's and (when fused) the bias' InOut slots: w_old (with
                // keep_old), then the workspaces
                let old = 3 + ns + if *bias { 1 + ns } else { 0 };
                let mut w_old = keep_old.then(|| a.f32_mut(old));
                let ws = old + *keep_old as usize;
                let mut db = bias.then(|| a.f32_mut(ws + 2));
                // a sharded update's `comm` workspace, after the others
                let mut comm = (*shards > 1).then(|| a.f32_mut(ws + 2 + *bias as usize));
                conv2d_bwd_weight_chunked(
                    geom,
                    &d,
                    a.f32(0),
                    a.f32(1),
                    *chunk,
                    (a.f32_mut(ws), db.as_deref_mut()),
                    a.f32_mut(ws + 1),
                    |c0, nc, gw| {
                        if let Some(wo) = w_old.as_deref_mut() {
                            for (o, i) in wo.chunks_exact_mut(co).zip(w.chunks_exact(co)) {
                                o[c0..c0 + nc].copy_from_slice(&i[c0..c0 + nc]);
                            }
                        }
                        shard::update_columns(
                            ctx,
                            rule,
                            w,
                            co,
                            (c0, nc),
                            gw,
                            comm.as_deref_mut(),
                            &mut states[..ns],
                        )
                    },
                );
                // (sharded parameters: this rank's rows are kept, the others' not gathered)
                if comm.is_some() && !keep_rows {
                    shard::gather_rows(ctx, w, co);
                }
                // the bias, with the column sums gathered during the weight gradient
                if let Some(db) = db {
                    let mut bstates = state_slices(a, 4 + ns, ns);
                    let b = a.f32_mut(3 + ns);
                    match comm {
                        Some(tmp) => {
                            let db = &mut db[..co];
                            shard::update_bias(
                                ctx,
                                rule,
                                (b, db, tmp),
                                &mut bstates[..ns],
                                !keep_rows,
                            )
                        }
                        None => update_block(
                            &ctx.rule(rule),
                            ctx.step_counter,
                            b,
                            co,
                            0,
                            co,
                            db,
                            &mut bstates[..ns],
                        ),
                    }
                }
            }
        }
    }
}
