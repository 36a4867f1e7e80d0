//! Losses and their gradients. Reductions are deterministic (fixed parts, f64 partials).

use rayon::prelude::*;

use super::args::{Args, Ctx};
use super::par::{det_sum, for_chunks};
use dmc_plan::op::LossOp;

/// mean((pred - target)^2).
pub fn mse_loss(pred: &[f32], target: &[f32]) -> f32 {
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
    (s / n as f64) as f32
}

/// dpred = 2 (pred - target) / numel.
pub fn mse_loss_bwd(pred: &[f32], target: &[f32], dpred: &mut [f32]) {
    assert_eq!(pred.len(), target.len(), "mse_bwd: size");
    assert_eq!(pred.len(), dpred.len(), "mse_bwd: size");
    let k = 2.0 / pred.len() as f32;
    for_chunks(dpred, |o, dc| {
        for ((d, &p), &t) in dc.iter_mut().zip(&pred[o..]).zip(&target[o..]) {
            *d = k * (p - t);
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
    let n = labels.len();
    assert_eq!(logits.len(), n * c, "cross_entropy: size");
    check_labels(labels, c)?;
    let s = det_sum(n, |r| {
        r.map(|i| {
            let row = &logits[i * c..(i + 1) * c];
            lse(row).1 - row[labels[i] as usize] as f64
        })
        .sum()
    });
    Ok((s / n as f64) as f32)
}

/// dlogits = (softmax(logits) - onehot(label)) / N.
pub fn cross_entropy_loss_bwd(
    logits: &[f32],
    labels: &[i32],
    c: usize,
    dlogits: &mut [f32],
) -> Result<(), BadLabel> {
    let n = labels.len();
    assert_eq!(logits.len(), n * c, "cross_entropy_bwd: size");
    assert_eq!(dlogits.len(), n * c, "cross_entropy_bwd: size");
    check_labels(labels, c)?;
    if c == 0 {
        return Ok(());
    }
    let inv_n = 1.0 / n as f64;
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
                *o = ((sm - oh) * inv_n) as f32;
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
    // SAFETY: (all calls below) see this function's contract; slot indices follow the signature.
    unsafe {
        match op {
            LossOp::MseLoss => a.f32_mut(2)[0] = mse_loss(a.f32(0), a.f32(1)),
            LossOp::CrossEntropyLoss => {
                let c = a.shape(0)[1];
                a.f32_mut(2)[0] = cross_entropy_loss(a.f32(0), a.i32(1), c)?;
            }
            LossOp::MseLossBwd => mse_loss_bwd(a.f32(0), a.f32(1), a.f32_mut(2)),
            LossOp::CrossEntropyLossBwd => {
                let c = a.shape(0)[1];
                cross_entropy_loss_bwd(a.f32(0), a.i32(1), c, a.f32_mut(2))?;
            }
        }
    }
    Ok(())
}
