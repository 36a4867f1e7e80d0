//! Losses and their gradients. Reductions are deterministic (fixed parts, f64 partials).
//!
//! Each kernel takes the weight `w` of its term of the loss (`loss 0.5 * mse(..) + ..`): the
//! loss is `w * mean(..)` (the product in f64), the gradient `w * dmean/dpred` (`w` folded into
//! the constant factor); `w = 1` gives bit for bit the unweighted values, which the functions
//! without `w` compute.

use rayon::prelude::*;

use super::args::{Args, Ctx};
use super::par::{det_sum, for_chunks};
use dmc_plan::op::LossOp;

/// mean((pred - target)^2).
pub fn mse_loss(pred: &[f32], target: &[f32]) -> f32 {
    mse_loss_w(1.0, pred, target)
}

/// w mean((pred - target)^2).
pub fn mse_loss_w(w: f32, pred: &[f32], target: &[f32]) -> f32 {
    assert_eq!(pred.len(), target.len(), "mse: size");
    let n = pred.len();
    let s = det_sum(n, |r| {
        pred[r.clone()]
            .iter()
            .zip(&target[r])
            .map(|(&p, &t)| {
                let d = p as f64 - t as f64;
                d * d
            })
            .sum()
    });
    (w as f64 * (s / n as f64)) as f32
}

/// dpred = 2 (pred - target) / numel.
pub fn mse_loss_bwd(pred: &[f32], target: &[f32], dpred: &mut [f32]) {
    mse_loss_bwd_w(1.0, pred, target, dpred)
}

/// dpred = 2 w (pred - target) / numel.
pub fn mse_loss_bwd_w(w: f32, pred: &[f32], target: &[f32], dpred: &mut [f32]) {
    assert_eq!(pred.len(), target.len(), "mse_bwd: size");
    assert_eq!(pred.len(), dpred.len(), "mse_bwd: size");
    let k = 2.0 * w / pred.len() as f32;
    for_chunks(dpred, |o, dc| {
        for ((d, &p), &t) in dc.iter_mut().zip(&pred[o..]).zip(&target[o..]) {
            *d = k * (p - t);
        }
    });
}

/// mean|pred - target| (PyTorch's `L1Loss`), in f64.
pub fn mae_loss(pred: &[f32], target: &[f32]) -> f32 {
    mae_loss_w(1.0, pred, target)
}

/// w mean|pred - target|.
pub fn mae_loss_w(w: f32, pred: &[f32], target: &[f32]) -> f32 {
    elementwise_mean(w, pred, target, |p, t| (p - t).abs())
}

/// dpred = sign(pred - target) / numel (0 where they are equal, as PyTorch).
pub fn mae_loss_bwd(pred: &[f32], target: &[f32], dpred: &mut [f32]) {
    mae_loss_bwd_w(1.0, pred, target, dpred)
}

/// dpred = w sign(pred - target) / numel.
pub fn mae_loss_bwd_w(w: f32, pred: &[f32], target: &[f32], dpred: &mut [f32]) {
    let k = w / pred.len() as f32;
    elementwise_grad(pred, target, dpred, |p, t| {
        let d = p - t;
        // NaN stays NaN
        let s = if d > 0.0 {
            1.0
        } else if d < 0.0 {
            -1.0
        } else {
            d * 0.0
        };
        k * s
    });
}

/// mean(|d| <= delta ? d^2/2 : delta (|d| - delta/2)), d = pred - target (PyTorch's
/// `HuberLoss(delta)`), in f64.
pub fn huber_loss(delta: f32, pred: &[f32], target: &[f32]) -> f32 {
    huber_loss_w(1.0, delta, pred, target)
}

/// w times [`huber_loss`].
pub fn huber_loss_w(w: f32, delta: f32, pred: &[f32], target: &[f32]) -> f32 {
    let dl = delta as f64;
    elementwise_mean(w, pred, target, |p, t| {
        let a = (p - t).abs();
        if a <= dl {
            0.5 * a * a
        } else {
            dl * (a - 0.5 * dl)
        }
    })
}

/// dpred = clamp(pred - target, -delta, delta) / numel.
pub fn huber_loss_bwd(delta: f32, pred: &[f32], target: &[f32], dpred: &mut [f32]) {
    huber_loss_bwd_w(1.0, delta, pred, target, dpred)
}

/// dpred = w clamp(pred - target, -delta, delta) / numel.
pub fn huber_loss_bwd_w(w: f32, delta: f32, pred: &[f32], target: &[f32], dpred: &mut [f32]) {
    let k = w / pred.len() as f32;
    elementwise_grad(pred, target, dpred, |p, t| {
        let d = p - t;
        let c = if d > delta {
            delta
        } else if d < -delta {
            -delta
        } else {
            d
        };
        k * c
    });
}

/// mean(max(x, 0) - x t + ln(1 + e^-|x|)) over logits x and targets t of the same shape
/// (PyTorch's `BCEWithLogitsLoss`), in f64.
pub fn bce_with_logits_loss(logits: &[f32], target: &[f32]) -> f32 {
    bce_with_logits_loss_w(1.0, logits, target)
}

/// w times [`bce_with_logits_loss`].
pub fn bce_with_logits_loss_w(w: f32, logits: &[f32], target: &[f32]) -> f32 {
    elementwise_mean(w, logits, target, |x, t| {
        x.max(0.0) - x * t + (-x.abs()).exp().ln_1p()
    })
}

/// dlogits = (sigmoid(x) - t) / numel.
pub fn bce_with_logits_loss_bwd(logits: &[f32], target: &[f32], dlogits: &mut [f32]) {
    bce_with_logits_loss_bwd_w(1.0, logits, target, dlogits)
}

/// dlogits = w (sigmoid(x) - t) / numel.
pub fn bce_with_logits_loss_bwd_w(w: f32, logits: &[f32], target: &[f32], dlogits: &mut [f32]) {
    let k = w / logits.len() as f32;
    elementwise_grad(logits, target, dlogits, |x, t| {
        let s = if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            let e = x.exp();
            e / (1.0 + e)
        };
        k * (s - t)
    });
}

/// w mean_i f(a_i, b_i), each term in f64, summed deterministically.
fn elementwise_mean(w: f32, a: &[f32], b: &[f32], f: impl Fn(f64, f64) -> f64 + Sync) -> f32 {
    assert_eq!(a.len(), b.len(), "loss: size");
    let n = a.len();
    let s = det_sum(n, |r| {
        a[r.clone()]
            .iter()
            .zip(&b[r])
            .map(|(&x, &y)| f(x as f64, y as f64))
            .sum()
    });
    (w as f64 * (s / n as f64)) as f32
}

/// out_i = f(a_i, b_i) in f32.
fn elementwise_grad(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32 + Sync) {
    assert_eq!(a.len(), b.len(), "loss_bwd: size");
    assert_eq!(a.len(), out.len(), "loss_bwd: size");
    for_chunks(out, |o, oc| {
        for ((d, &x), &y) in oc.iter_mut().zip(&a[o..]).zip(&b[o..]) {
            *d = f(x, y);
        }
    });
}

/// A label outside `0..classes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadLabel {
    pub row: usize,
    pub label: i32,
    pub classes: usize,
}

fn check_labels(labels: &[i32], c: usize) -> Result<(), BadLabel> {
    match labels.iter().position(|&l| l < 0 || l as usize >= c) {
        Some(row) => Err(BadLabel {
            row,
            label: labels[row],
            classes: c,
        }),
        None => Ok(()),
    }
}

/// (max, log-sum-exp) of one row, in f64.
fn lse(row: &[f32]) -> (f64, f64) {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
    (m, m + s.ln())
}

/// `mean_n(logsumexp(logits_n) - logits_n[label_n])` for logits `[N, C]`.
pub fn cross_entropy_loss(logits: &[f32], labels: &[i32], c: usize) -> Result<f32, BadLabel> {
    cross_entropy_loss_smoothed(logits, labels, c, 0.0)
}

/// The cross-entropy against the smoothed target `(1-e) onehot + e/C` (PyTorch's
/// `label_smoothing`): `mean_n(lse_n - (1-e) logits_n[label_n] - e/C sum_j logits_n[j])`; `e = 0`
/// is [`cross_entropy_loss`].
pub fn cross_entropy_loss_smoothed(
    logits: &[f32],
    labels: &[i32],
    c: usize,
    smoothing: f32,
) -> Result<f32, BadLabel> {
    cross_entropy_loss_w(1.0, logits, labels, c, smoothing)
}

/// w times [`cross_entropy_loss_smoothed`].
pub fn cross_entropy_loss_w(
    w: f32,
    logits: &[f32],
    labels: &[i32],
    c: usize,
    smoothing: f32,
) -> Result<f32, BadLabel> {
    let n = labels.len();
    assert_eq!(logits.len(), n * c, "cross_entropy: size");
    check_labels(labels, c)?;
    let e = smoothing as f64;
    let s = det_sum(n, |r| {
        r.map(|i| {
            let row = &logits[i * c..(i + 1) * c];
            let nll = lse(row).1 - row[labels[i] as usize] as f64;
            if e == 0.0 {
                return nll;
            }
            let mean: f64 = row.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
            (1.0 - e) * nll + e * (lse(row).1 - mean)
        })
        .sum()
    });
    Ok((w as f64 * (s / n as f64)) as f32)
}

/// dlogits = (softmax(logits) - onehot(label)) / N.
pub fn cross_entropy_loss_bwd(
    logits: &[f32],
    labels: &[i32],
    c: usize,
    dlogits: &mut [f32],
) -> Result<(), BadLabel> {
    cross_entropy_loss_smoothed_bwd(logits, labels, c, 0.0, dlogits)
}

/// dlogits = (softmax(logits) - (1-e) onehot(label) - e/C) / N, the gradient of
/// [`cross_entropy_loss_smoothed`].
pub fn cross_entropy_loss_smoothed_bwd(
    logits: &[f32],
    labels: &[i32],
    c: usize,
    smoothing: f32,
    dlogits: &mut [f32],
) -> Result<(), BadLabel> {
    cross_entropy_loss_bwd_w(1.0, logits, labels, c, smoothing, dlogits)
}

/// dlogits = w (softmax(logits) - (1-e) onehot(label) - e/C) / N.
pub fn cross_entropy_loss_bwd_w(
    w: f32,
    logits: &[f32],
    labels: &[i32],
    c: usize,
    smoothing: f32,
    dlogits: &mut [f32],
) -> Result<(), BadLabel> {
    let e = smoothing as f64;
    let n = labels.len();
    assert_eq!(logits.len(), n * c, "cross_entropy_bwd: size");
    assert_eq!(dlogits.len(), n * c, "cross_entropy_bwd: size");
    check_labels(labels, c)?;
    if c == 0 {
        return Ok(());
    }
    let inv_n = w as f64 / n as f64;
    dlogits
        .par_chunks_mut(c)
        .with_min_len(16)
        .enumerate()
        .for_each(|(i, d)| {
            let row = &logits[i * c..(i + 1) * c];
            let (_, l) = lse(row);
            for (j, (o, &v)) in d.iter_mut().zip(row).enumerate() {
                let sm = (v as f64 - l).exp();
                let oh = if j == labels[i] as usize { 1.0 } else { 0.0 };
                let t = if e == 0.0 {
                    oh
                } else {
                    (1.0 - e) * oh + e / c as f64
                };
                *o = ((sm - t) * inv_n) as f32;
            }
        });
    Ok(())
}

/// Runs one step of an op of the loss family: the step's arguments, taken by signature slot,
/// handed to the kernels above.
///
/// # Safety
/// As [`exec`](super::executor::exec): a validated step, exclusive access to the arena; each
/// mutable slice is taken only for a slot with role Out, InOut or Workspace.
pub(super) unsafe fn exec(op: &LossOp, a: &Args, _ctx: &Ctx) -> Result<(), BadLabel> {
    let w = op.weight();
    // SAFETY: (all calls below) see this function's contract; slot indices follow the signature.
    unsafe {
        match op {
            LossOp::MseLoss { .. } => a.f32_mut(2)[0] = mse_loss_w(w, a.f32(0), a.f32(1)),
            LossOp::CrossEntropyLoss {
                label_smoothing, ..
            } => {
                let c = a.shape(0)[1];
                a.f32_mut(2)[0] = cross_entropy_loss_w(w, a.f32(0), a.i32(1), c, *label_smoothing)?;
            }
            LossOp::MseLossBwd { .. } => mse_loss_bwd_w(w, a.f32(0), a.f32(1), a.f32_mut(2)),
            LossOp::CrossEntropyLossBwd {
                label_smoothing, ..
            } => {
                let c = a.shape(0)[1];
                let (l, y) = (a.f32(0), a.i32(1));
                cross_entropy_loss_bwd_w(w, l, y, c, *label_smoothing, a.f32_mut(2))?;
            }
            LossOp::MaeLoss { .. } => a.f32_mut(2)[0] = mae_loss_w(w, a.f32(0), a.f32(1)),
            LossOp::MaeLossBwd { .. } => mae_loss_bwd_w(w, a.f32(0), a.f32(1), a.f32_mut(2)),
            LossOp::HuberLoss { delta, .. } => {
                a.f32_mut(2)[0] = huber_loss_w(w, *delta, a.f32(0), a.f32(1))
            }
            LossOp::HuberLossBwd { delta, .. } => {
                huber_loss_bwd_w(w, *delta, a.f32(0), a.f32(1), a.f32_mut(2))
            }
            LossOp::BceWithLogitsLoss { .. } => {
                a.f32_mut(2)[0] = bce_with_logits_loss_w(w, a.f32(0), a.f32(1))
            }
            LossOp::BceWithLogitsLossBwd { .. } => {
                bce_with_logits_loss_bwd_w(w, a.f32(0), a.f32(1), a.f32_mut(2))
            }
        }
    }
    Ok(())
}
