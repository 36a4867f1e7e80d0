//! Depthwise convolution (one input and one output channel per group, `groups` = channels: a
//! MobileNet block's 3x3) computed directly, without im2col and GEMM.
//!
//! Through the general path every group is its own GEMM of one output column over `kh*kw` inner
//! terms, with its own im2col and parallel loop: thousands of tiny calls per layer (mobilenet's
//! step was 39.6 ms that way, 8.95 ms with this file and the per-kind activation loops;
//! BENCHMARKS.md). Here each output pixel's channels
//! are one contiguous run, multiplied tap by tap: the forward is one parallel loop over pixels, the
//! data gradient one over images (scatter-adds in a fixed pixel-then-tap order, as the general
//! path's col2im), the weight gradient one over blocks of output lines (fixed by the geometry:
//! [`lines_per_block`]) times blocks of [`WGRAD_COLS`] channels, each summing its pixels in
//! order, the blocks' sums added in line order. Channels go in blocks of a width known to the
//! compiler ([`block_width`]: 32, 16 or 8 when it divides the channels), their sums held in
//! registers across the taps (the forward) or a line's pixels (the weight gradient): at
//! mobilenet's 16 channels the per-tap slicing had cost as much as the multiply-adds. No
//! reduction depends on the schedule: results are bit-identical across thread counts and across
//! the fused update's chunk sizes.

use dmc_plan::op::{ConvGeom, Epilogue};
use rayon::prelude::*;

use super::conv::ConvDims;
use super::epilogue;
use super::par::const_width;

/// Output pixels per task of the forward.
const FWD_ROWS: usize = 32;
/// Channels per task of the weight gradient (one task sums them over its block of lines).
pub const WGRAD_COLS: usize = 16;
/// The widest block of channels summed in registers.
const MAX_BLOCK: usize = 32;
/// Multiply-adds a task of the weight gradient does at least (its lines' pixels x taps x
/// [`WGRAD_COLS`]), when there are lines enough.
const WGRAD_TASK_MADDS: usize = 1 << 16;

/// The width of the blocks of `c` channels the kernels sum in registers: the widest of 32, 16
/// and 8 that divides `c`, else 0 (blocks of up to [`MAX_BLOCK`], the last narrower, of widths
/// known only at run time).
fn block_width(c: usize) -> usize {
    [32, 16, 8]
        .into_iter()
        .find(|w| c.is_multiple_of(*w))
        .unwrap_or(0)
}

/// The channel blocks `(j0, width)` of `c` channels at const width `W` (0: [`MAX_BLOCK`]s and a
/// narrower last).
fn blocks<const W: usize>(c: usize) -> impl Iterator<Item = (usize, usize)> {
    let step = if W > 0 { W } else { MAX_BLOCK };
    (0..c)
        .step_by(step)
        .map(move |j0| (j0, if W > 0 { W } else { (c - j0).min(MAX_BLOCK) }))
}

/// Output lines (of `wo` pixels) per task of the weight gradient: fixed by the geometry alone,
/// so the sums' grouping, and their bits, do not depend on the threads or the channels' chunks.
pub fn lines_per_block(g: &ConvGeom, d: &ConvDims) -> usize {
    let per_line = (d.wo * g.kh * g.kw * WGRAD_COLS).max(1);
    WGRAD_TASK_MADDS.div_ceil(per_line).max(1)
}

/// The output pixels `ox` of a line whose tap `kx` reads inside the input (`ix = ox * stride +
/// kx * dil - pad` in `0..w`), and the `ix` of the first.
fn tap_columns(g: &ConvGeom, d: &ConvDims, kx: usize) -> (std::ops::Range<usize>, isize) {
    let (sw, off) = (
        g.stride_w as isize,
        (kx * g.dil_w) as isize - g.pad_left as isize,
    );
    // the first ox with ix >= 0, and one past the last with ix < w
    let lo = if off >= 0 { 0 } else { (-off + sw - 1) / sw };
    let hi = if d.w as isize - off <= 0 {
        0
    } else {
        (d.w as isize - off + sw - 1) / sw
    };
    let (lo, hi) = (lo.max(0) as usize, (hi.max(0) as usize).min(d.wo));
    (lo..hi.max(lo), lo as isize * sw + off)
}

/// Whether the CPU backend runs this convolution here: one input and one output channel per group.
pub fn is_depthwise(g: &ConvGeom, d: &ConvDims) -> bool {
    d.ci == g.groups && d.co == g.groups
}

/// The input pixel tap `(ky, kx)` of output pixel `(oy, ox)` reads, `None` in the padding.
fn tap_src(
    g: &ConvGeom,
    d: &ConvDims,
    oy: usize,
    ox: usize,
    ky: usize,
    kx: usize,
) -> Option<usize> {
    let iy = (oy * g.stride_h + ky * g.dil_h) as isize - g.pad_top as isize;
    let ix = (ox * g.stride_w + kx * g.dil_w) as isize - g.pad_left as isize;
    (iy >= 0 && iy < d.h as isize && ix >= 0 && ix < d.w as isize)
        .then(|| iy as usize * d.w + ix as usize)
}

/// `y = epi.act(conv(x, w) + b + r)` for a depthwise `g` (`w` `[kh,kw,1,C]`, overwrites `y`).
pub fn forward(
    g: &ConvGeom,
    d: &ConvDims,
    (x, w, b): (&[f32], &[f32], Option<&[f32]>),
    (epi, r): (&Epilogue, Option<&[f32]>),
    y: &mut [f32],
) {
    let c = d.co;
    if c == 0 {
        return;
    }
    let per_img = d.ho * d.wo;
    y.par_chunks_mut(FWD_ROWS * c)
        .enumerate()
        .for_each(|(t, blk)| {
            let r0 = t * FWD_ROWS;
            for (i, yr) in blk.chunks_exact_mut(c).enumerate() {
                let row = r0 + i;
                let (n, p) = (row / per_img, row % per_img);
                let xn = &x[n * d.h * d.w * c..][..d.h * d.w * c];
                const_width!(block_width(c), [32, 16, 8], |W| fwd_pixel::<W>(
                    g,
                    d,
                    (xn, w),
                    (p / d.wo, p % d.wo),
                    yr
                ), else const 0);
                if let Some(b) = b {
                    for (o, &bv) in yr.iter_mut().zip(b) {
                        *o += bv;
                    }
                }
            }
            if !epi.is_none() {
                let off = r0 * c;
                epilogue::forward_block(epi, blk, r.map(|r| &r[off..off + blk.len()]));
            }
        });
}

/// One output pixel `(oy, ox)`'s channels of image `xn`: each block's sums from 0 over the taps
/// in order, in registers.
#[inline(always)]
fn fwd_pixel<const W: usize>(
    g: &ConvGeom,
    d: &ConvDims,
    (xn, w): (&[f32], &[f32]),
    (oy, ox): (usize, usize),
    yr: &mut [f32],
) {
    let c = yr.len();
    for (j0, bw) in blocks::<W>(c) {
        let mut acc = [0f32; MAX_BLOCK];
        let acc = &mut acc[..bw];
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                let Some(s) = tap_src(g, d, oy, ox, ky, kx) else {
                    continue;
                };
                let xs = &xn[s * c + j0..][..bw];
                let ws = &w[(ky * g.kw + kx) * c + j0..][..bw];
                for ((o, &xv), &wv) in acc.iter_mut().zip(xs).zip(ws) {
                    *o += xv * wv;
                }
            }
        }
        yr[j0..j0 + bw].copy_from_slice(acc);
    }
}

/// One image's `dx = conv^T(dy, w)` for a depthwise `g` (`dxn` zeroed by the caller): every
/// output pixel's `dy` times each tap's weights, scatter-added pixel by pixel, tap by tap.
pub fn data_grad_image(g: &ConvGeom, d: &ConvDims, dyn_: &[f32], w: &[f32], dxn: &mut [f32]) {
    let c = d.co;
    if c == 0 {
        return;
    }
    const_width!(block_width(c), [32, 16, 8], |W| data_grad_blocks::<W>(g, d, dyn_, w, dxn), else const 0);
}

/// [`data_grad_image`] a block of channels at a time (each element's adds in the same order).
#[inline(always)]
fn data_grad_blocks<const W: usize>(
    g: &ConvGeom,
    d: &ConvDims,
    dyn_: &[f32],
    w: &[f32],
    dxn: &mut [f32],
) {
    let c = d.co;
    for (j0, bw) in blocks::<W>(c) {
        for (p, dyr) in dyn_.chunks_exact(c).enumerate() {
            let (oy, ox) = (p / d.wo, p % d.wo);
            let dyr = &dyr[j0..][..bw];
            for ky in 0..g.kh {
                for kx in 0..g.kw {
                    let Some(s) = tap_src(g, d, oy, ox, ky, kx) else {
                        continue;
                    };
                    let ws = &w[(ky * g.kw + kx) * c + j0..][..bw];
                    for ((o, &dv), &wv) in dxn[s * c + j0..][..bw].iter_mut().zip(dyr).zip(ws) {
                        *o += dv * wv;
                    }
                }
            }
        }
    }
}

/// The weight gradient of channels `c0..c0+nc` of a depthwise `g` into `out` (`[kh*kw, nc]`
/// row-major, overwritten): for each tap and channel, the sum over every output pixel in order
/// within each block of [`lines_per_block`] lines, the blocks' sums added in order.
pub fn weight_grad(
    g: &ConvGeom,
    d: &ConvDims,
    (x, dy): (&[f32], &[f32]),
    (c0, nc): (usize, usize),
    out: &mut [f32],
) {
    let (c, taps) = (d.co, g.kh * g.kw);
    assert!(c0 + nc <= c && out.len() >= taps * nc, "depthwise: block");
    let (lines, per_block) = (d.n * d.ho, lines_per_block(g, d));
    let (lblocks, cblocks) = (lines.div_ceil(per_block), nc.div_ceil(WGRAD_COLS));
    if lblocks == 0 {
        // no output pixels: every sum is empty
        out[..taps * nc].fill(0.0);
        return;
    }
    let parts: Vec<Vec<f32>> = (0..lblocks * cblocks)
        .into_par_iter()
        .map(|t| {
            let (lb, cb) = (t / cblocks, t % cblocks);
            let j0 = cb * WGRAD_COLS;
            let nb = WGRAD_COLS.min(nc - j0);
            let mut acc = vec![0f32; taps * nb];
            for line in lb * per_block..((lb + 1) * per_block).min(lines) {
                const_width!(block_width(nb), [32, 16, 8], |W| wgrad_line::<W>(
                    g,
                    d,
                    (x, dy),
                    (line / d.ho, line % d.ho),
                    c0 + j0,
                    &mut acc
                ), else const 0);
            }
            acc
        })
        .collect();
    for cb in 0..cblocks {
        let j0 = cb * WGRAD_COLS;
        let nb = WGRAD_COLS.min(nc - j0);
        for tap in 0..taps {
            let o = &mut out[tap * nc + j0..][..nb];
            o.copy_from_slice(&parts[cb][tap * nb..][..nb]);
            for lb in 1..lblocks {
                for (v, &p) in o
                    .iter_mut()
                    .zip(&parts[lb * cblocks + cb][tap * nb..][..nb])
                {
                    *v += p;
                }
            }
        }
    }
}

/// Adds line `oy` of image `n`'s pixels to `acc` (`[kh*kw, nb]`, the channels from `a0`): tap by
/// tap, each block of channels' sums in registers across the line's pixels, in order.
#[inline(always)]
fn wgrad_line<const W: usize>(
    g: &ConvGeom,
    d: &ConvDims,
    (x, dy): (&[f32], &[f32]),
    (n, oy): (usize, usize),
    a0: usize,
    acc: &mut [f32],
) {
    let (c, nb) = (d.co, acc.len() / (g.kh * g.kw).max(1));
    let dy_line = &dy[(n * d.ho + oy) * d.wo * c..][..d.wo * c];
    for ky in 0..g.kh {
        let iy = (oy * g.stride_h + ky * g.dil_h) as isize - g.pad_top as isize;
        if iy < 0 || iy >= d.h as isize {
            continue;
        }
        let x_line = &x[(n * d.h + iy as usize) * d.w * c..][..d.w * c];
        for kx in 0..g.kw {
            let (cols, ix0) = tap_columns(g, d, kx);
            let tap = ky * g.kw + kx;
            for (j0, bw) in blocks::<W>(nb) {
                let mut sum = [0f32; MAX_BLOCK];
                let sum = &mut sum[..bw];
                let a = &mut acc[tap * nb + j0..][..bw];
                sum.copy_from_slice(a);
                for (i, ox) in cols.clone().enumerate() {
                    let ix = ix0 as usize + i * g.stride_w;
                    let xs = &x_line[ix * c + a0 + j0..][..bw];
                    let ds = &dy_line[ox * c + a0 + j0..][..bw];
                    for ((o, &xv), &dv) in sum.iter_mut().zip(xs).zip(ds) {
                        *o += xv * dv;
                    }
                }
                a.copy_from_slice(sum);
            }
        }
    }
}
