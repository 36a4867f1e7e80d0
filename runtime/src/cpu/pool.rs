//! Max / average / global-average / global-max pooling (NHWC, windows over the input padded per
//! [`PoolGeom`]: max-pooling skips padded cells, average pooling counts them as zeros),
//! nearest-neighbour upsampling, and their backward ops.

use super::args::{Args, Ctx};
use super::elementwise::per_kind;
use super::par::{for_rows, for_rows2};
use dmc_plan::op::PoolGeom;
use dmc_plan::op::{PoolOp, UnaryKind};

/// Sizes of one pooling: x `[n,h,w,c]`, y `[n,ho,wo,c]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolDims {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub ho: usize,
    pub wo: usize,
}

impl PoolDims {
    pub fn from_shapes(x: &[usize], y: &[usize]) -> Self {
        PoolDims {
            n: x[0],
            h: x[1],
            w: x[2],
            c: x[3],
            ho: y[1],
            wo: y[2],
        }
    }
    fn check(&self, g: &PoolGeom, x: usize, y: usize) {
        assert_eq!(x, self.n * self.h * self.w * self.c, "pool: x size");
        assert_eq!(y, self.n * self.ho * self.wo * self.c, "pool: y size");
        assert_eq!(
            g.out_hw(self.h, self.w),
            Ok((self.ho, self.wo)),
            "pool: geometry and shapes disagree"
        );
    }
}

/// One axis of a window: moved by `s`, `before` padding cells, `n` input cells.
#[derive(Clone, Copy)]
struct Axis {
    s: usize,
    before: usize,
    n: usize,
}

impl Axis {
    fn rows(g: &PoolGeom, d: &PoolDims) -> Axis {
        Axis {
            s: g.stride_h,
            before: g.pad_top,
            n: d.h,
        }
    }
    fn cols(g: &PoolGeom, d: &PoolDims) -> Axis {
        Axis {
            s: g.stride_w,
            before: g.pad_left,
            n: d.w,
        }
    }
    /// The input row (column) of window offset `wo` of the window starting at output `o`, or
    /// `None` in the padding (or past it, for a ceil-mode window).
    fn at(self, o: usize, wo: usize) -> Option<usize> {
        (o * self.s + wo)
            .checked_sub(self.before)
            .filter(|&i| i < self.n)
    }
    /// The window's first input row (column): its first cell that is not padding (every window
    /// has one).
    fn first_in(self, o: usize) -> usize {
        (o * self.s).saturating_sub(self.before)
    }
}

/// y = max over each window, argmax = `dy*kw+dx` of the first maximum.
pub fn maxpool_fwd(g: &PoolGeom, d: &PoolDims, x: &[f32], y: &mut [f32], argmax: &mut [u8]) {
    d.check(g, x.len(), y.len());
    assert_eq!(argmax.len(), y.len(), "maxpool: argmax size");
    assert!(
        g.kh * g.kw <= 256,
        "maxpool: window too large for u8 argmax"
    );
    let (ry, rx) = (Axis::rows(g, d), Axis::cols(g, d));
    let row = d.wo * d.c;
    if row == 0 {
        return;
    }
    for_rows2(y, argmax, row, |r, yr, ar| {
        let oy = r % d.ho;
        let n = r / d.ho;
        // per output pixel, the window's taps in order, each over the pixel's channels (one
        // contiguous run: the compare vectorises); per channel the same choice as a scan of
        // its window: the first tap, then any greater one or the first NaN
        for ox in 0..d.wo {
            let (yp, ap) = (&mut yr[ox * d.c..][..d.c], &mut ar[ox * d.c..][..d.c]);
            yp.fill(f32::NEG_INFINITY);
            ap.fill(0);
            let mut first = true;
            for wy in 0..g.kh {
                let Some(iy) = ry.at(oy, wy) else {
                    continue;
                };
                for wx in 0..g.kw {
                    let Some(ix) = rx.at(ox, wx) else {
                        continue;
                    };
                    let xs = &x[((n * d.h + iy) * d.w + ix) * d.c..][..d.c];
                    let tap = (wy * g.kw + wx) as u8;
                    if first {
                        yp.copy_from_slice(xs);
                        ap.fill(tap);
                        first = false;
                        continue;
                    }
                    for ((b, a), &v) in yp.iter_mut().zip(ap.iter_mut()).zip(xs) {
                        // a NaN wins (and stays): NaN propagates as in PyTorch. The choice is a
                        // mask on the bits, not a branch (on activations a branch mispredicted
                        // every other element: 6x slower than on regular data)
                        let take = (v > *b) | (v.is_nan() & !b.is_nan());
                        let m = 0u32.wrapping_sub(take as u32);
                        let bb = b.to_bits();
                        *b = f32::from_bits(bb ^ ((bb ^ v.to_bits()) & m));
                        *a ^= (*a ^ tap) & m as u8;
                    }
                }
            }
        }
    });
}

/// dx = scatter-add of dy into the argmax position of each window (overwrites dx).
/// An argmax outside the window or in its padding (corrupted buffer) poisons its window's first
/// input element with NaN.
pub fn maxpool_bwd(g: &PoolGeom, d: &PoolDims, dy: &[f32], argmax: &[u8], dx: &mut [f32]) {
    d.check(g, dx.len(), dy.len());
    assert_eq!(argmax.len(), dy.len(), "maxpool_bwd: argmax size");
    let (ry, rx) = (Axis::rows(g, d), Axis::cols(g, d));
    let img = d.h * d.w * d.c;
    if img == 0 {
        return;
    }
    let oimg = d.ho * d.wo * d.c;
    let taps = g.kh * g.kw;
    assert!(taps <= 256, "maxpool_bwd: an argmax is one byte");
    for_rows(dx, img, |n, dxn| {
        dxn.fill(0.0);
        // each tap's input pixel (its first element) in this window, `NONE` in the padding
        const NONE: usize = usize::MAX;
        let mut at = [NONE; 256];
        for oy in 0..d.ho {
            for ox in 0..d.wo {
                for (a, t) in at[..taps].iter_mut().enumerate() {
                    *t = match (ry.at(oy, a / g.kw), rx.at(ox, a % g.kw)) {
                        (Some(iy), Some(ix)) => (iy * d.w + ix) * d.c,
                        _ => NONE,
                    };
                }
                let first = (ry.first_in(oy) * d.w + rx.first_in(ox)) * d.c;
                let o = n * oimg + (oy * d.wo + ox) * d.c;
                let (am, dyo) = (&argmax[o..o + d.c], &dy[o..o + d.c]);
                for (ch, (&a, &v)) in am.iter().zip(dyo).enumerate() {
                    let p = if (a as usize) < taps {
                        at[a as usize]
                    } else {
                        NONE
                    };
                    if p != NONE {
                        dxn[p + ch] += v;
                    } else {
                        dxn[first + ch] += f32::NAN;
                    }
                }
            }
        }
    });
}

/// 1 / the divisor of window `(oy, ox)` ([`PoolGeom::divisor`]).
fn inv_divisor(g: &PoolGeom, d: &PoolDims, oy: usize, ox: usize) -> f32 {
    1.0 / g.divisor(oy, ox, d.h, d.w) as f32
}

/// y = the sum over each window / its divisor (padded cells count as zeros).
pub fn avgpool_fwd(g: &PoolGeom, d: &PoolDims, x: &[f32], y: &mut [f32]) {
    d.check(g, x.len(), y.len());
    let (ry, rx) = (Axis::rows(g, d), Axis::cols(g, d));
    let row = d.wo * d.c;
    if row == 0 {
        return;
    }
    for_rows(y, row, |r, yr| {
        let oy = r % d.ho;
        let n = r / d.ho;
        for ox in 0..d.wo {
            let inv = inv_divisor(g, d, oy, ox);
            let yo = &mut yr[ox * d.c..(ox + 1) * d.c];
            yo.fill(0.0);
            for wy in 0..g.kh {
                let Some(iy) = ry.at(oy, wy) else {
                    continue;
                };
                for wx in 0..g.kw {
                    let Some(ix) = rx.at(ox, wx) else {
                        continue;
                    };
                    let i = ((n * d.h + iy) * d.w + ix) * d.c;
                    for (o, v) in yo.iter_mut().zip(&x[i..i + d.c]) {
                        *o += *v;
                    }
                }
            }
            for o in yo.iter_mut() {
                *o *= inv;
            }
        }
    });
}

/// dx = dy / divisor spread over each window's input cells (overwrites dx).
pub fn avgpool_bwd(g: &PoolGeom, d: &PoolDims, dy: &[f32], dx: &mut [f32]) {
    d.check(g, dx.len(), dy.len());
    let (ry, rx) = (Axis::rows(g, d), Axis::cols(g, d));
    let img = d.h * d.w * d.c;
    if img == 0 {
        return;
    }
    let oimg = d.ho * d.wo * d.c;
    for_rows(dx, img, |n, dxn| {
        dxn.fill(0.0);
        for oy in 0..d.ho {
            for ox in 0..d.wo {
                let inv = inv_divisor(g, d, oy, ox);
                let o = n * oimg + (oy * d.wo + ox) * d.c;
                let dyo = &dy[o..o + d.c];
                for wy in 0..g.kh {
                    let Some(iy) = ry.at(oy, wy) else {
                        continue;
                    };
                    for wx in 0..g.kw {
                        let Some(ix) = rx.at(ox, wx) else {
                            continue;
                        };
                        let i = (iy * d.w + ix) * d.c;
                        for (t, v) in dxn[i..i + d.c].iter_mut().zip(dyo) {
                            *t += *v * inv;
                        }
                    }
                }
            }
        }
    });
}

/// `y[N,C]` = mean of `x[N,H,W,C]` over H and W (`hw` = H*W).
pub fn global_avgpool_fwd(n: usize, hw: usize, c: usize, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), n * hw * c, "global_avgpool: x size");
    assert_eq!(y.len(), n * c, "global_avgpool: y size");
    if c == 0 {
        return;
    }
    let inv = 1.0 / hw as f32;
    for_rows(y, c, |i, yr| {
        yr.fill(0.0);
        for px in x[i * hw * c..(i + 1) * hw * c].chunks_exact(c) {
            for (o, v) in yr.iter_mut().zip(px) {
                *o += *v;
            }
        }
        for o in yr.iter_mut() {
            *o *= inv;
        }
    });
}

/// `y[N,C]` = max of `x[N,H,W,C]` over H and W (`hw` = H*W), `argmax[N,C]` = the pixel index
/// `iy*W + ix` of the first maximum (a NaN wins and stays, as in [`maxpool_fwd`]).
pub fn global_maxpool_fwd(
    (n, hw, c): (usize, usize, usize),
    x: &[f32],
    y: &mut [f32],
    argmax: &mut [i32],
) {
    assert_eq!(x.len(), n * hw * c, "global_maxpool: x size");
    assert_eq!(y.len(), n * c, "global_maxpool: y size");
    assert_eq!(argmax.len(), n * c, "global_maxpool: argmax size");
    assert!(hw >= 1 && hw <= i32::MAX as usize, "global_maxpool: H*W");
    if c == 0 {
        return;
    }
    for_rows2(y, argmax, c, |i, yr, ar| {
        let xn = &x[i * hw * c..(i + 1) * hw * c];
        yr.copy_from_slice(&xn[..c]);
        ar.fill(0);
        for (p, px) in xn.chunks_exact(c).enumerate().skip(1) {
            for ((b, a), &v) in yr.iter_mut().zip(ar.iter_mut()).zip(px) {
                if v > *b || (v.is_nan() && !b.is_nan()) {
                    *b = v;
                    *a = p as i32;
                }
            }
        }
    });
}

/// `dx[N,H,W,C]`: dy at each channel's argmax pixel, 0 elsewhere (overwrites dx). An argmax out
/// of `0..H*W` (corrupted buffer) poisons the channel's first pixel with NaN.
pub fn global_maxpool_bwd(
    (n, hw, c): (usize, usize, usize),
    dy: &[f32],
    argmax: &[i32],
    dx: &mut [f32],
) {
    assert_eq!(dx.len(), n * hw * c, "global_maxpool_bwd: dx size");
    assert_eq!(dy.len(), n * c, "global_maxpool_bwd: dy size");
    assert_eq!(argmax.len(), n * c, "global_maxpool_bwd: argmax size");
    if c == 0 || hw == 0 {
        return;
    }
    for_rows(dx, hw * c, |i, dxn| {
        dxn.fill(0.0);
        for ch in 0..c {
            let a = argmax[i * c + ch];
            match usize::try_from(a).ok().filter(|&p| p < hw) {
                Some(p) => dxn[p * c + ch] = dy[i * c + ch],
                None => dxn[ch] = f32::NAN,
            }
        }
    });
}

/// `dx[N,H,W,C] = dy[N,C] / (H*W)`, broadcast.
pub fn global_avgpool_bwd(n: usize, hw: usize, c: usize, dy: &[f32], dx: &mut [f32]) {
    assert_eq!(dx.len(), n * hw * c, "global_avgpool_bwd: dx size");
    assert_eq!(dy.len(), n * c, "global_avgpool_bwd: dy size");
    if c == 0 || hw == 0 {
        return;
    }
    let inv = 1.0 / hw as f32;
    for_rows(dx, hw * c, |i, dxn| {
        let dyr = &dy[i * c..(i + 1) * c];
        for px in dxn.chunks_exact_mut(c) {
            for (o, v) in px.iter_mut().zip(dyr) {
                *o = *v * inv;
            }
        }
    });
}

/// `dx[N,H,W,C] = k'(saved) * dy[N,C] / (H*W)`: [`global_avgpool_bwd`] followed by the backward
/// of the activation `k` (the same two formulas in the same order), without the broadcast
/// gradient in memory. `saved` is what [`UnaryKind::saved`] names.
pub fn global_avgpool_bwd_act(
    k: UnaryKind,
    (n, hw, c): (usize, usize, usize),
    dy: &[f32],
    saved: &[f32],
    dx: &mut [f32],
) {
    assert_eq!(dx.len(), n * hw * c, "global_avgpool_bwd_act: dx size");
    assert_eq!(saved.len(), dx.len(), "global_avgpool_bwd_act: saved size");
    assert_eq!(dy.len(), n * c, "global_avgpool_bwd_act: dy size");
    if c == 0 || hw == 0 {
        return;
    }
    let inv = 1.0 / hw as f32;
    per_kind!(k, |K| for_rows(dx, hw * c, |i, dxn| {
        let dyr = &dy[i * c..(i + 1) * c];
        let sn = &saved[i * hw * c..(i + 1) * hw * c];
        for (px, sp) in dxn.chunks_exact_mut(c).zip(sn.chunks_exact(c)) {
            for ((o, v), s) in px.iter_mut().zip(dyr).zip(sp) {
                *o = K.backward(*s, *v * inv);
            }
        }
    }));
}

/// [`global_avgpool_bwd_act`] written over `saved` (each element read before it is written).
pub fn global_avgpool_bwd_act_inplace(
    k: UnaryKind,
    (n, hw, c): (usize, usize, usize),
    dy: &[f32],
    saved: &mut [f32],
) {
    assert_eq!(
        saved.len(),
        n * hw * c,
        "global_avgpool_bwd_act: saved size"
    );
    assert_eq!(dy.len(), n * c, "global_avgpool_bwd_act: dy size");
    if c == 0 || hw == 0 {
        return;
    }
    let inv = 1.0 / hw as f32;
    per_kind!(k, |K| for_rows(saved, hw * c, |i, sn| {
        let dyr = &dy[i * c..(i + 1) * c];
        for px in sn.chunks_exact_mut(c) {
            for (s, v) in px.iter_mut().zip(dyr) {
                *s = K.backward(*s, *v * inv);
            }
        }
    }));
}

/// Nearest-neighbour upsampling by `f`: `y[n, i, j, c] = x[n, i / f, j / f, c]`, with x
/// `[n, h, w, c]` (`d.h`, `d.w`) and y `[n, h*f, w*f, c]` (`d.ho`, `d.wo`).
pub fn upsample_fwd(f: usize, d: &PoolDims, x: &[f32], y: &mut [f32]) {
    assert!(
        f >= 1 && d.ho == d.h * f && d.wo == d.w * f,
        "upsample: bad sizes"
    );
    assert_eq!(x.len(), d.n * d.h * d.w * d.c, "upsample: x size");
    assert_eq!(y.len(), d.n * d.ho * d.wo * d.c, "upsample: y size");
    let row = d.wo * d.c;
    if row == 0 {
        return;
    }
    for_rows(y, row, |r, yr| {
        let (n, oy) = (r / d.ho, r % d.ho);
        let src = (n * d.h + oy / f) * d.w * d.c;
        for (ox, px) in yr.chunks_exact_mut(d.c).enumerate() {
            let s = src + (ox / f) * d.c;
            px.copy_from_slice(&x[s..s + d.c]);
        }
    });
}

/// The gradient of [`upsample_fwd`]: `dx[n, i, j, c]` = the sum of dy over its f x f block, rows
/// then columns (the order the CUDA kernel adds in).
pub fn upsample_bwd(f: usize, d: &PoolDims, dy: &[f32], dx: &mut [f32]) {
    assert!(
        f >= 1 && d.ho == d.h * f && d.wo == d.w * f,
        "upsample_bwd: bad sizes"
    );
    assert_eq!(dx.len(), d.n * d.h * d.w * d.c, "upsample_bwd: dx size");
    assert_eq!(dy.len(), d.n * d.ho * d.wo * d.c, "upsample_bwd: dy size");
    let row = d.w * d.c;
    if row == 0 {
        return;
    }
    for_rows(dx, row, |r, dxr| {
        let (n, iy) = (r / d.h, r % d.h);
        for (ix, px) in dxr.chunks_exact_mut(d.c).enumerate() {
            px.fill(0.0);
            for wy in 0..f {
                for wx in 0..f {
                    let o = ((n * d.ho + iy * f + wy) * d.wo + ix * f + wx) * d.c;
                    for (t, v) in px.iter_mut().zip(&dy[o..o + d.c]) {
                        *t += *v;
                    }
                }
            }
        }
    });
}

/// Runs one step of an op of the pooling family: the step's arguments, taken by signature slot,
/// handed to the kernels above.
///
/// # Safety
/// As [`exec`](super::executor::exec): a validated step, exclusive access to the arena; each
/// mutable slice is taken only for a slot with role Out, InOut or Workspace.
pub(super) unsafe fn exec(op: &PoolOp, a: &Args, _ctx: &Ctx) {
    // SAFETY: (all calls below) see this function's contract; slot indices follow the signature.
    unsafe {
        match op {
            PoolOp::MaxPool { geom } => {
                let d = PoolDims::from_shapes(a.shape(0), a.shape(1));
                maxpool_fwd(geom, &d, a.f32(0), a.f32_mut(1), a.u8_mut(2));
            }
            PoolOp::AvgPool { geom } => {
                let d = PoolDims::from_shapes(a.shape(0), a.shape(1));
                avgpool_fwd(geom, &d, a.f32(0), a.f32_mut(1));
            }
            PoolOp::GlobalAvgPool => {
                let x = a.shape(0);
                global_avgpool_fwd(x[0], x[1] * x[2], x[3], a.f32(0), a.f32_mut(1));
            }
            PoolOp::GlobalMaxPool => {
                let x = a.shape(0);
                let dims = (x[0], x[1] * x[2], x[3]);
                global_maxpool_fwd(dims, a.f32(0), a.f32_mut(1), a.i32_mut(2));
            }
            PoolOp::GlobalMaxPoolBwd => {
                let x = a.shape(2);
                let dims = (x[0], x[1] * x[2], x[3]);
                global_maxpool_bwd(dims, a.f32(0), a.i32(1), a.f32_mut(2));
            }
            PoolOp::MaxPoolBwd { geom } => {
                let d = PoolDims::from_shapes(a.shape(2), a.shape(0));
                maxpool_bwd(geom, &d, a.f32(0), a.u8(1), a.f32_mut(2));
            }
            PoolOp::AvgPoolBwd { geom } => {
                let d = PoolDims::from_shapes(a.shape(1), a.shape(0));
                avgpool_bwd(geom, &d, a.f32(0), a.f32_mut(1));
            }
            PoolOp::Upsample { factor } => {
                let d = PoolDims::from_shapes(a.shape(0), a.shape(1));
                upsample_fwd(*factor, &d, a.f32(0), a.f32_mut(1));
            }
            PoolOp::UpsampleBwd { factor } => {
                let d = PoolDims::from_shapes(a.shape(1), a.shape(0));
                upsample_bwd(*factor, &d, a.f32(0), a.f32_mut(1));
            }
            PoolOp::GlobalAvgPoolBwd => {
                let x = a.shape(1);
                global_avgpool_bwd(x[0], x[1] * x[2], x[3], a.f32(0), a.f32_mut(1));
            }
            PoolOp::GlobalAvgPoolBwdAct(k) => {
                let x = a.shape(1);
                let dx = a.f32_mut(2);
                global_avgpool_bwd_act(*k, (x[0], x[1] * x[2], x[3]), a.f32(0), a.f32(1), dx);
            }
            PoolOp::AvgPoolBwdAct { geom, act } => {
                let d = PoolDims::from_shapes(a.shape(1), a.shape(0));
                let dx = a.f32_mut(2);
                avgpool_bwd(geom, &d, a.f32(0), dx);
                let saved = a.f32(1);
                super::par::for_chunks(dx, |o, dc| {
                    for (g, s) in dc.iter_mut().zip(&saved[o..]) {
                        *g = act.backward(*s, *g);
                    }
                });
            }
            PoolOp::GlobalAvgPoolBwdActInPlace(k) => {
                let x = a.shape(1);
                global_avgpool_bwd_act_inplace(
                    *k,
                    (x[0], x[1] * x[2], x[3]),
                    a.f32(0),
                    a.f32_mut(1),
                );
            }
        }
    }
}
