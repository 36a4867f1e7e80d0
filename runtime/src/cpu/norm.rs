//! Normalisation kernels: batchnorm over the last axis of `[rows, c]` (channels last), its
//! inference form, the running statistics' update and the backward. Sums are f64, over the rows in
//! order for each channel (the generated CUDA's order, one thread per channel); channels are taken
//! in blocks of `CH_BLOCK` so the rows are read contiguously, with the block's accumulators on
//! the stack. Layernorm normalises each row of `[rows, c]` over its c elements (sums over the row
//! in order, the generated CUDA's order, one thread per row; rows split over the tasks); its
//! backward's dgamma and dbeta are sums over the rows in order for each channel (one thread per
//! channel there; blocks of channels split over the tasks).

use dmc_plan::op::NormOp;
use rayon::prelude::*;

use super::args::{Args, Ctx};

/// Channels per pass over the rows.
const CH_BLOCK: usize = 64;

/// Rows of a layernorm task (each row is normalised alone: the split changes no result).
const ROWS_PER_TASK: usize = 64;

/// Each block of channels `c0..c1` of `[rows, c]`.
fn blocks(c: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..c)
        .step_by(CH_BLOCK)
        .map(move |c0| (c0, (c0 + CH_BLOCK).min(c)))
}

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
    for (c0, c1) in blocks(c) {
        let mut s = col_sums(rows, c0, c1, |r, ch| x[r * c + ch] as f64);
        sums.sum(&mut s[..c1 - c0]);
        let mut m = [0.0f64; CH_BLOCK];
        for j in 0..c1 - c0 {
            m[j] = s[j] / n;
        }
        let mut q = col_sums(rows, c0, c1, |r, ch| {
            let d = x[r * c + ch] as f64 - m[ch - c0];
            d * d
        });
        sums.sum(&mut q[..c1 - c0]);
        let mut g = [0.0f64; CH_BLOCK];
        for (j, ch) in (c0..c1).enumerate() {
            let v = q[j] / n;
            mean[ch] = m[j] as f32;
            var[ch] = v as f32;
            g[j] = gamma[ch] as f64 / (v + eps as f64).sqrt();
        }
        for r in 0..rows {
            for (j, ch) in (c0..c1).enumerate() {
                let i = r * c + ch;
                y[i] = ((x[i] as f64 - m[j]) * g[j] + beta[ch] as f64) as f32;
            }
        }
    }
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
/// update sums the ranks' parameter gradients).
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
    for (c0, c1) in blocks(c) {
        let mut m = [0.0f64; CH_BLOCK];
        let mut rs = [0.0f64; CH_BLOCK];
        for (j, ch) in (c0..c1).enumerate() {
            m[j] = mean[ch] as f64;
            rs[j] = 1.0 / (var[ch] as f64 + eps as f64).sqrt();
        }
        let xh = |r: usize, ch: usize| (x[r * c + ch] as f64 - m[ch - c0]) * rs[ch - c0];
        let mut sd = col_sums(rows, c0, c1, |r, ch| dyx[r * c + ch] as f64);
        let mut sdx = col_sums(rows, c0, c1, |r, ch| dyx[r * c + ch] as f64 * xh(r, ch));
        let mut k = [0.0f64; CH_BLOCK];
        for (j, ch) in (c0..c1).enumerate() {
            dgamma[ch] = sdx[j] as f32;
            dbeta[ch] = sd[j] as f32;
            k[j] = gamma[ch] as f64 * rs[j];
        }
        sums.sum(&mut sd[..c1 - c0]);
        sums.sum(&mut sdx[..c1 - c0]);
        for r in 0..rows {
            for (j, ch) in (c0..c1).enumerate() {
                let i = r * c + ch;
                let h = (x[i] as f64 - m[j]) * rs[j];
                dyx[i] = (k[j] * (dyx[i] as f64 - sd[j] / n - h * (sdx[j] / n))) as f32;
            }
        }
    }
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
