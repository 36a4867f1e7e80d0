//! Normalisation kernels: batchnorm over the last axis of `[rows, c]` (channels last), its
//! inference form, the running statistics' update and the backward. Sums are f64, over the rows in
//! order for each channel (the generated CUDA's order, one thread per channel); blocks of
//! channels (one cache line of each row) are summed in parallel tasks, and the normalised values
//! written over blocks of rows in parallel. Layernorm normalises each row of `[rows, c]` over its c elements (sums over the row
//! in order, the generated CUDA's order, one thread per row; rows split over the tasks); its
//! backward's dgamma and dbeta are sums over the rows in order for each channel (one thread per
//! channel there; blocks of channels split over the tasks).

use dmc_plan::op::NormOp;
use rayon::prelude::*;

use super::args::{Args, Ctx};
use super::par::{const_width, for_rows, ELEM_CHUNK};

/// Channels per pass over the rows (layernorm's backward).
const CH_BLOCK: usize = 64;

/// Rows of a layernorm task (each row is normalised alone: the split changes no result).
const ROWS_PER_TASK: usize = 64;

/// Per-channel sums over the rows of `[rows, c]` of `f(row, channel)`, for the channels `c0..c1`.
fn col_sums(
    rows: usize,
    c0: usize,
    c1: usize,
    mut f: impl FnMut(usize, usize) -> f64,
) -> [f64; CH_BLOCK] {
    let mut s = [0.0f64; CH_BLOCK];
    for r in 0..rows {
        for (j, ch) in (c0..c1).enumerate() {
            s[j] += f(r, ch);
        }
    }
    s
}

/// Channels per task of [`channel_sums`]: one 64-byte line of f32 of each row.
const SUM_BLOCK: usize = dmc_plan::op::BN_SUM_BLOCK;

/// Per channel of `[rows, c]`, two sums over the rows in order: `f(r, c0, a, b)` adds row `r`'s
/// terms of the channels `c0..c0 + a.len()` to `a` and `b`. Blocks of [`SUM_BLOCK`] channels run
/// in parallel tasks of at least [`ELEM_CHUNK`] elements, each block's sums on the stack (each
/// channel's sums in row order, as one thread per channel adds: the split changes no result).
fn channel_sums(
    rows: usize,
    c: usize,
    f: impl Fn(usize, usize, &mut [f64], &mut [f64]) + Sync,
) -> (Vec<f64>, Vec<f64>) {
    let (mut a, mut b) = (vec![0.0f64; c], vec![0.0f64; c]);
    let per = (ELEM_CHUNK / (rows * SUM_BLOCK).max(1)).max(1) * SUM_BLOCK;
    a.par_chunks_mut(per)
        .zip(b.par_chunks_mut(per))
        .enumerate()
        .for_each(|(t, (a, b))| {
            // (the tasks' outputs share cache lines: each block's sums on the stack, written once)
            for (k, (a, b)) in a
                .chunks_mut(SUM_BLOCK)
                .zip(b.chunks_mut(SUM_BLOCK))
                .enumerate()
            {
                let (c0, w) = (t * per + k * SUM_BLOCK, a.len());
                let (mut sa, mut sb) = ([0.0f64; SUM_BLOCK], [0.0f64; SUM_BLOCK]);
                // (a block of a constant width: its sums in registers across the rows, its
                // loop unrolled; a narrow one, e.g. 8 channels, ran 4x slower)
                macro_rules! rows_of {
                    ($w:expr) => {
                        for r in 0..rows {
                            f(r, c0, &mut sa[..$w], &mut sb[..$w]);
                        }
                    };
                }
                match w {
                    SUM_BLOCK => rows_of!(SUM_BLOCK),
                    8 => rows_of!(8),
                    4 => rows_of!(4),
                    _ => rows_of!(w),
                }
                a.copy_from_slice(&sa[..w]);
                b.copy_from_slice(&sb[..w]);
            }
        });
    (a, b)
}

/// The batch's per-channel sums: this process's rows alone, or (data parallel) summed over the
/// ranks, whose parts of the batch make `ranks` times the rows ([`super::shard::BatchSums`]).
pub trait Sums {
    /// Rows of the whole batch per row of this process.
    fn ranks(&self) -> usize;
    /// `s` (per-channel sums of this process's rows) becomes the whole batch's.
    fn sum(&mut self, s: &mut [f64]);
}

/// This process's batch is the batch.
pub struct Alone;

impl Sums for Alone {
    fn ranks(&self) -> usize {
        1
    }
    fn sum(&mut self, _: &mut [f64]) {}
}

/// `x[rows, c], gamma[c], beta[c] -> y, mean[c], biased var[c]`; y = (x - mean) / sqrt(var + eps)
/// gamma + beta.
pub fn batchnorm(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    y: &mut [f32],
    mean: &mut [f32],
    var: &mut [f32],
    eps: f32,
) {
    batchnorm_over(x, (gamma, beta), y, (mean, var), eps, &mut Alone)
}

/// [`batchnorm`] with the statistics of the batch `sums` makes of this process's rows (data
/// parallel: the ranks' sums, so every rank normalises by the global batch's mean and variance).
/// The sums run over blocks of channels in parallel, y over blocks of rows.
pub fn batchnorm_over(
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    y: &mut [f32],
    (mean, var): (&mut [f32], &mut [f32]),
    eps: f32,
    sums: &mut dyn Sums,
) {
    let c = gamma.len();
    assert!(c > 0 && x.len() / c * c == x.len() && y.len() == x.len());
    assert!(beta.len() == c && mean.len() == c && var.len() == c);
    let rows = x.len() / c;
    let n = (rows * sums.ranks()) as f64;
    let mut s = channel_sums(rows, c, |r, c0, s, _| {
        let w = s.len();
        for (a, &v) in s.iter_mut().zip(&x[r * c + c0..][..w]) {
            *a += v as f64;
        }
    })
    .0;
    sums.sum(&mut s);
    let m: Vec<f64> = s.iter().map(|v| v / n).collect();
    let mut q = channel_sums(rows, c, |r, c0, q, _| {
        let w = q.len();
        for ((a, &v), &mc) in q.iter_mut().zip(&x[r * c + c0..][..w]).zip(&m[c0..][..w]) {
            let d = v as f64 - mc;
            *a += d * d;
        }
    })
    .0;
    sums.sum(&mut q);
    let mut g = vec![0.0f64; c];
    for ch in 0..c {
        let v = q[ch] / n;
        mean[ch] = m[ch] as f32;
        var[ch] = v as f32;
        g[ch] = gamma[ch] as f64 / (v + eps as f64).sqrt();
    }
    let b: Vec<f64> = beta.iter().map(|&v| v as f64).collect();
    let (m, g, b) = (&m[..c], &g[..c], &b[..c]);
    const_width!(c, [8, 16, 32, 64], |W| for_rows(y, W, |r, yr| {
        let (yr, xr) = (&mut yr[..W], &x[r * W..][..W]);
        let (m, g, b) = (&m[..W], &g[..W], &b[..W]);
        for ch in 0..W {
            yr[ch] = ((xr[ch] as f64 - m[ch]) * g[ch] + b[ch]) as f32;
        }
    }));
}

/// x, gamma, beta, running_mean, running_var -> y with the running statistics.
pub fn batchnorm_infer(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    running_mean: &[f32],
    running_var: &[f32],
    y: &mut [f32],
    eps: f32,
) {
    let c = gamma.len();
    assert!(c > 0 && x.len() / c * c == x.len() && y.len() == x.len());
    assert!(beta.len() == c && running_mean.len() == c && running_var.len() == c);
    for (xr, yr) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)) {
        for ch in 0..c {
            let rs = 1.0 / (running_var[ch] as f64 + eps as f64).sqrt();
            yr[ch] = ((xr[ch] as f64 - running_mean[ch] as f64) * (gamma[ch] as f64 * rs)
                + beta[ch] as f64) as f32;
        }
    }
}

/// The factor of the unbiased variance of `count` rows (1 for a single row).
pub fn unbias(count: usize) -> f64 {
    if count > 1 {
        count as f64 / (count - 1) as f64
    } else {
        1.0
    }
}

/// PyTorch's running statistics' update: r = (1 - momentum) r + momentum b, with the unbiased
/// batch variance of `count` rows.
pub fn batchnorm_stats(
    running_mean: &mut [f32],
    running_var: &mut [f32],
    mean: &[f32],
    var: &[f32],
    momentum: f32,
    count: usize,
) {
    let c = mean.len();
    assert!(running_mean.len() == c && running_var.len() == c && var.len() == c);
    let (mo, k) = (momentum as f64, unbias(count));
    for ch in 0..c {
        running_mean[ch] = ((1.0 - mo) * running_mean[ch] as f64 + mo * mean[ch] as f64) as f32;
        running_var[ch] = ((1.0 - mo) * running_var[ch] as f64 + mo * (var[ch] as f64 * k)) as f32;
    }
}

/// The backward in place: `dyx` holds dy and receives dx; dgamma = sum dy xh, dbeta = sum dy,
/// dx = gamma rstd (dy - dbeta / M - xh dgamma / M), xh = (x - mean) rstd.
#[allow(clippy::too_many_arguments)]
pub fn batchnorm_bwd_in_place(
    dyx: &mut [f32],
    x: &[f32],
    mean: &[f32],
    var: &[f32],
    gamma: &[f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
    eps: f32,
) {
    batchnorm_bwd_over(dyx, x, (mean, var), gamma, (dgamma, dbeta), eps, &mut Alone)
}

/// [`batchnorm_bwd_in_place`] over the batch `sums` makes of this process's rows: dx takes the
/// whole batch's sums of dy and dy xh; dgamma and dbeta stay this process's (data parallel: the
/// update sums the ranks' parameter gradients). The sums run over blocks of channels in
/// parallel, dx over blocks of rows.
pub fn batchnorm_bwd_over(
    dyx: &mut [f32],
    x: &[f32],
    (mean, var): (&[f32], &[f32]),
    gamma: &[f32],
    (dgamma, dbeta): (&mut [f32], &mut [f32]),
    eps: f32,
    sums: &mut dyn Sums,
) {
    let c = gamma.len();
    assert!(c > 0 && x.len() / c * c == x.len() && dyx.len() == x.len());
    assert!(mean.len() == c && var.len() == c && dgamma.len() == c && dbeta.len() == c);
    let rows = x.len() / c;
    let n = (rows * sums.ranks()) as f64;
    let m: Vec<f64> = mean.iter().map(|&v| v as f64).collect();
    let rs: Vec<f64> = var
        .iter()
        .map(|&v| 1.0 / (v as f64 + eps as f64).sqrt())
        .collect();
    let (mut sd, mut sdx) = {
        let dy: &[f32] = dyx;
        channel_sums(rows, c, |r, c0, sd, sdx| {
            let w = sd.len();
            let (dyr, xr) = (&dy[r * c + c0..][..w], &x[r * c + c0..][..w]);
            let mr = m[c0..][..w].iter().zip(&rs[c0..][..w]);
            for (((a, b), (&d, &v)), (&mc, &rc)) in sd
                .iter_mut()
                .zip(sdx.iter_mut())
                .zip(dyr.iter().zip(xr))
                .zip(mr)
            {
                let d = d as f64;
                *a += d;
                *b += d * ((v as f64 - mc) * rc);
            }
        })
    };
    let mut k = vec![0.0f64; c];
    for ch in 0..c {
        dgamma[ch] = sdx[ch] as f32;
        dbeta[ch] = sd[ch] as f32;
        k[ch] = gamma[ch] as f64 * rs[ch];
    }
    sums.sum(&mut sd);
    sums.sum(&mut sdx);
    let a: Vec<f64> = sd.iter().map(|v| v / n).collect();
    let b: Vec<f64> = sdx.iter().map(|v| v / n).collect();
    let (m, rs, k, a, b) = (&m[..c], &rs[..c], &k[..c], &a[..c], &b[..c]);
    const_width!(c, [8, 16, 32, 64], |W| for_rows(dyx, W, |r, dr| {
        let (dr, xr) = (&mut dr[..W], &x[r * W..][..W]);
        let (m, rs, k, a, b) = (&m[..W], &rs[..W], &k[..W], &a[..W], &b[..W]);
        for ch in 0..W {
            let h = (xr[ch] as f64 - m[ch]) * rs[ch];
            dr[ch] = (k[ch] * (dr[ch] as f64 - a[ch] - h * b[ch])) as f32;
        }
    }));
}

/// The backward out of place: dy, x, mean, var, gamma -> dx, dgamma, dbeta (as
/// [`batchnorm_bwd_in_place`] on a copy of dy).
#[allow(clippy::too_many_arguments)]
pub fn batchnorm_bwd(
    dy: &[f32],
    x: &[f32],
    mean: &[f32],
    var: &[f32],
    gamma: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
    eps: f32,
) {
    dx.copy_from_slice(dy);
    batchnorm_bwd_in_place(dx, x, mean, var, gamma, dgamma, dbeta, eps);
}

/// `x[rows, c], gamma[c], beta[c] -> y, mean[rows], rstd[rows]`: per row, mean and rstd = 1 /
/// sqrt(biased var + eps); y = (x - mean) rstd gamma + beta.
pub fn layernorm(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    eps: f32,
) {
    let c = gamma.len();
    assert!(c > 0 && x.len() / c * c == x.len() && y.len() == x.len() && beta.len() == c);
    let rows = x.len() / c;
    assert!(mean.len() == rows && rstd.len() == rows);
    let per = ROWS_PER_TASK;
    let tasks = y
        .par_chunks_mut(per * c)
        .zip(mean.par_chunks_mut(per).zip(rstd.par_chunks_mut(per)))
        .zip(x.par_chunks(per * c));
    tasks.for_each(|((y, (mean, rstd)), x)| layernorm_rows(x, gamma, beta, y, mean, rstd, eps));
}

/// [`layernorm`] of the rows of one task (each row alone, its sums in order).
fn layernorm_rows(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    eps: f32,
) {
    let c = gamma.len();
    let n = c as f64;
    for (r, (xr, yr)) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)).enumerate() {
        let m = xr.iter().map(|&v| v as f64).sum::<f64>() / n;
        let q = xr
            .iter()
            .map(|&v| {
                let d = v as f64 - m;
                d * d
            })
            .sum::<f64>();
        let rs = 1.0 / (q / n + eps as f64).sqrt();
        mean[r] = m as f32;
        rstd[r] = rs as f32;
        for ((o, &v), (&g, &b)) in yr.iter_mut().zip(xr).zip(gamma.iter().zip(beta)) {
            *o = ((v as f64 - m) * rs * g as f64 + b as f64) as f32;
        }
    }
}

/// The backward: `dy, x, mean[rows], rstd[rows], gamma -> dx, dgamma, dbeta`. With xh = (x - mean)
/// rstd and g = dy gamma, per row dx = rstd (g - sum g / c - xh sum (g xh) / c); per channel
/// dgamma = sum over the rows of dy xh, dbeta = sum over the rows of dy.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_bwd(
    dy: &[f32],
    x: &[f32],
    mean: &[f32],
    rstd: &[f32],
    gamma: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    let c = gamma.len();
    assert!(c > 0 && x.len() / c * c == x.len() && dy.len() == x.len() && dx.len() == x.len());
    let rows = x.len() / c;
    assert!(mean.len() == rows && rstd.len() == rows && dgamma.len() == c && dbeta.len() == c);
    let n = c as f64;
    let xh = |r: usize, ch: usize| (x[r * c + ch] as f64 - mean[r] as f64) * rstd[r] as f64;
    // dx: each row alone (its sums in order), rows split over the tasks
    dx.par_chunks_mut(ROWS_PER_TASK * c)
        .enumerate()
        .for_each(|(t, dxt)| {
            let r0 = t * ROWS_PER_TASK;
            for (k, dxr) in dxt.chunks_exact_mut(c).enumerate() {
                let r = r0 + k;
                let (mut sg, mut sgx) = (0.0f64, 0.0f64);
                for (ch, &gm) in gamma.iter().enumerate() {
                    let g = dy[r * c + ch] as f64 * gm as f64;
                    sg += g;
                    sgx += g * xh(r, ch);
                }
                let (a, b, rs) = (sg / n, sgx / n, rstd[r] as f64);
                for (ch, (o, &gm)) in dxr.iter_mut().zip(gamma).enumerate() {
                    let g = dy[r * c + ch] as f64 * gm as f64;
                    *o = (rs * (g - a - xh(r, ch) * b)) as f32;
                }
            }
        });
    // dgamma, dbeta: each block of channels summed over the rows in order, blocks over the tasks
    dgamma
        .par_chunks_mut(CH_BLOCK)
        .zip(dbeta.par_chunks_mut(CH_BLOCK))
        .enumerate()
        .for_each(|(k, (dg, db))| {
            let (c0, c1) = (k * CH_BLOCK, k * CH_BLOCK + dg.len());
            let sd = col_sums(rows, c0, c1, |r, ch| dy[r * c + ch] as f64);
            let sdx = col_sums(rows, c0, c1, |r, ch| dy[r * c + ch] as f64 * xh(r, ch));
            for j in 0..c1 - c0 {
                dg[j] = sdx[j] as f32;
                db[j] = sd[j] as f32;
            }
        });
}

/// Runs one normalisation op on its arguments (signature slots).
///
/// # Safety
/// As [`super::executor`]'s `exec`: the step was validated; only Out/InOut slots are taken
/// mutably, and those overlap no other argument.
pub(super) unsafe fn exec(op: &NormOp, a: &Args, ctx: &Ctx) {
    // data parallel: batchnorm's statistics are the global batch's (the ranks' sums)
    let mut sums = super::shard::BatchSums::of(ctx);
    // SAFETY: (all calls below) see this function's contract; slot indices follow the signature.
    unsafe {
        match op {
            NormOp::BatchNorm { eps, .. } => batchnorm_over(
                a.f32(0),
                (a.f32(1), a.f32(2)),
                a.f32_mut(3),
                (a.f32_mut(4), a.f32_mut(5)),
                eps.0,
                &mut sums,
            ),
            NormOp::BatchNormInfer { eps } => batchnorm_infer(
                a.f32(0),
                a.f32(1),
                a.f32(2),
                a.f32(3),
                a.f32(4),
                a.f32_mut(5),
                eps.0,
            ),
            NormOp::BatchNormStats { momentum, count } => batchnorm_stats(
                a.f32_mut(0),
                a.f32_mut(1),
                a.f32(2),
                a.f32(3),
                momentum.0,
                // (the unbiased variance of the whole batch's rows: a data-parallel plan's
                // count is the ranks' rows, `rank_batchnorm`)
                *count,
            ),
            NormOp::BatchNormBwd {
                eps,
                in_place: false,
                ..
            } => {
                let dx = a.f32_mut(5);
                dx.copy_from_slice(a.f32(0));
                batchnorm_bwd_over(
                    dx,
                    a.f32(1),
                    (a.f32(2), a.f32(3)),
                    a.f32(4),
                    (a.f32_mut(6), a.f32_mut(7)),
                    eps.0,
                    &mut sums,
                )
            }
            NormOp::BatchNormBwd {
                eps,
                in_place: true,
                ..
            } => batchnorm_bwd_over(
                a.f32_mut(0),
                a.f32(1),
                (a.f32(2), a.f32(3)),
                a.f32(4),
                (a.f32_mut(5), a.f32_mut(6)),
                eps.0,
                &mut sums,
            ),
            NormOp::LayerNorm { eps } => layernorm(
                a.f32(0),
                a.f32(1),
                a.f32(2),
                a.f32_mut(3),
                a.f32_mut(4),
                a.f32_mut(5),
                eps.0,
            ),
            NormOp::LayerNormBwd => layernorm_bwd(
                a.f32(0),
                a.f32(1),
                a.f32(2),
                a.f32(3),
                a.f32(4),
                a.f32_mut(5),
                a.f32_mut(6),
                a.f32_mut(7),
            ),
        }
    }
}
