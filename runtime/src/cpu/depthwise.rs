//! Depthwise convolution (one input and one output channel per group, `groups` = channels: a
//! MobileNet block's 3x3) computed directly, without im2col and GEMM.
//!
//! Through the general path every group is its own GEMM of one output column over `kh*kw` inner
//! terms, with its own im2col and parallel loop: thousands of tiny calls per layer (mobilenet's
//! step was 39.6 ms that way, 8.95 ms with this file and the per-kind activation loops;
//! BENCHMARKS.md). Here each output pixel's channels
//! are one contiguous run, multiplied tap by tap: the forward is one parallel loop over pixels, the
//! data gradient one over images (scatter-adds in a fixed pixel-then-tap order, as the general
//! path's col2im), the weight gradient one over blocks of
//! [`WGRAD_COLS`] channels, each summing over every pixel in order. No reduction depends on the
//! schedule: results are bit-identical across thread counts and across the fused update's chunk
//! sizes.

use dmc_plan::op::{ConvGeom, Epilogue};
use rayon::prelude::*;

use super::conv::ConvDims;
use super::epilogue;

/// Output pixels per task of the forward.
const FWD_ROWS: usize = 32;
/// Channels per task of the weight gradient (one task sums them over every pixel).
pub const WGRAD_COLS: usize = 16;

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
                let (oy, ox) = (p / d.wo, p % d.wo);
                yr.fill(0.0);
                for ky in 0..g.kh {
                    for kx in 0..g.kw {
                        let Some(s) = tap_src(g, d, oy, ox, ky, kx) else {
                            continue;
                        };
                        let xs = &x[(n * d.h * d.w + s) * c..][..c];
                        let ws = &w[(ky * g.kw + kx) * c..][..c];
                        for ((o, &xv), &wv) in yr.iter_mut().zip(xs).zip(ws) {
                            *o += xv * wv;
                        }
                    }
                }
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

/// One image's `dx = conv^T(dy, w)` for a depthwise `g` (`dxn` zeroed by the caller): every
/// output pixel's `dy` times each tap's weights, scatter-added pixel by pixel, tap by tap.
pub fn data_grad_image(g: &ConvGeom, d: &ConvDims, dyn_: &[f32], w: &[f32], dxn: &mut [f32]) {
    let c = d.co;
    if c == 0 {
        return;
    }
    for (p, dyr) in dyn_.chunks_exact(c).enumerate() {
        let (oy, ox) = (p / d.wo, p % d.wo);
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                let Some(s) = tap_src(g, d, oy, ox, ky, kx) else {
                    continue;
                };
                let ws = &w[(ky * g.kw + kx) * c..][..c];
                for ((o, &dv), &wv) in dxn[s * c..][..c].iter_mut().zip(dyr).zip(ws) {
                    *o += dv * wv;
                }
            }
        }
    }
}

/// The weight gradient of channels `c0..c0+nc` of a depthwise `g` into `out` (`[kh*kw, nc]`
/// row-major, overwritten): for each tap and channel, the sum over every output pixel in order.
pub fn weight_grad(
    g: &ConvGeom,
    d: &ConvDims,
    (x, dy): (&[f32], &[f32]),
    (c0, nc): (usize, usize),
    out: &mut [f32],
) {
    let (c, taps) = (d.co, g.kh * g.kw);
    assert!(c0 + nc <= c && out.len() >= taps * nc, "depthwise: block");
    let per_img = d.ho * d.wo;
    let blocks: Vec<(usize, Vec<f32>)> = (0..nc.div_ceil(WGRAD_COLS))
        .into_par_iter()
        .map(|bi| {
            let j0 = bi * WGRAD_COLS;
            let nb = WGRAD_COLS.min(nc - j0);
            let (a0, mut acc) = (c0 + j0, vec![0f32; taps * nb]);
            for row in 0..d.rows() {
                let (n, p) = (row / per_img, row % per_img);
                let (oy, ox) = (p / d.wo, p % d.wo);
                let dyr = &dy[row * c + a0..][..nb];
                for ky in 0..g.kh {
                    for kx in 0..g.kw {
                        let Some(s) = tap_src(g, d, oy, ox, ky, kx) else {
                            continue;
                        };
                        let xs = &x[(n * d.h * d.w + s) * c + a0..][..nb];
                        let tap = ky * g.kw + kx;
                        for ((o, &xv), &dv) in acc[tap * nb..][..nb].iter_mut().zip(xs).zip(dyr) {
                            *o += xv * dv;
                        }
                    }
                }
            }
            (j0, acc)
        })
        .collect();
    for (j0, acc) in blocks {
        let nb = acc.len() / taps.max(1);
        for (tap, a) in acc.chunks_exact(nb.max(1)).enumerate() {
            out[tap * nc + j0..][..nb].copy_from_slice(a);
        }
    }
}
