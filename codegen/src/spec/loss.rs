//! Losses (`loss.cu.tera`): the MSE, MAE, Huber, BCE-with-logits and softmax cross-entropy
//! (optionally label-smoothed) reductions (one block) and the cross-entropy gradient (one thread
//! per row); the elementwise losses' gradients are `elementwise.cu.tera`'s.

use super::common::{f32_lit, numel, per_element, reduction, Site, Spec};
use crate::error::CodegenError;
use dmc_plan::op::LossOp;

const TEMPLATE: &str = "loss.cu.tera";

/// `MseLoss`: pred, target -> loss[1].
pub(crate) fn mse(s: &Site) -> Result<Spec, CodegenError> {
    let mut sp = reduction(s, TEMPLATE);
    sp.ctx.insert("n", &numel(s.shape(0)?));
    Ok(sp)
}

/// The logits' `[rows, classes]`, checked.
fn logits(s: &Site) -> Result<(usize, usize), CodegenError> {
    let l = s.shape(0)?;
    s.rank(l, 2, "logits")?;
    Ok((l[0], l[1]))
}

/// `HuberLoss` (pred, target -> loss[1]).
fn huber(s: &Site, delta: f32) -> Result<Spec, CodegenError> {
    let mut sp = mse(s)?;
    sp.ctx.insert("delta", &f32_lit(delta));
    Ok(sp)
}

/// The per-element gradients of the elementwise losses (`elementwise.cu.tera`), with Huber's
/// `delta`.
fn elementwise_bwd(s: &Site, delta: Option<f32>) -> Result<Spec, CodegenError> {
    let mut sp = super::elementwise::binary(s)?;
    if let Some(d) = delta {
        sp.ctx.insert("delta", &f32_lit(d));
    }
    Ok(sp)
}

/// The label smoothing `e` of a cross-entropy op: `false` when 0 (the plain formulas), else its
/// literal.
fn smoothing_ctx(sp: &mut Spec, e: f32) {
    if e == 0.0 {
        sp.ctx.insert("smoothing", &false);
    } else {
        sp.ctx.insert("smoothing", &f32_lit(e));
    }
}

/// `CrossEntropyLoss`: logits, labels -> loss[1].
pub(crate) fn cross_entropy(s: &Site, e: f32) -> Result<Spec, CodegenError> {
    let (rows, classes) = logits(s)?;
    let mut sp = reduction(s, TEMPLATE);
    sp.ctx.insert("rows", &rows);
    sp.ctx.insert("classes", &classes);
    smoothing_ctx(&mut sp, e);
    Ok(sp)
}

/// `CrossEntropyLossBwd`: logits, labels -> dlogits.
pub(crate) fn cross_entropy_bwd(s: &Site, e: f32) -> Result<Spec, CodegenError> {
    let (rows, classes) = logits(s)?;
    let mut sp = per_element(s, TEMPLATE, rows)?;
    sp.ctx.insert("rows", &rows);
    sp.ctx.insert("classes", &classes);
    smoothing_ctx(&mut sp, e);
    Ok(sp)
}

/// The kernel of one op of the loss family.
pub(crate) fn spec(s: &Site, op: &LossOp) -> Result<Spec, CodegenError> {
    match op {
        LossOp::MseLoss | LossOp::MaeLoss | LossOp::BceWithLogitsLoss => mse(s),
        LossOp::HuberLoss { delta } => huber(s, *delta),
        LossOp::MseLossBwd | LossOp::MaeLossBwd | LossOp::BceWithLogitsLossBwd => {
            elementwise_bwd(s, None)
        }
        LossOp::HuberLossBwd { delta } => elementwise_bwd(s, Some(*delta)),
        LossOp::CrossEntropyLoss { label_smoothing } => cross_entropy(s, *label_smoothing),
        LossOp::CrossEntropyLossBwd { label_smoothing } => cross_entropy_bwd(s, *label_smoothing),
    }
}

/// The zoo's losses and their gradients.
pub(crate) fn zoo() -> Vec<super::cases::Case> {
    use dmc_plan::op::Op;
    let l = |op: LossOp| Op::Loss(op);
    vec![
        (l(LossOp::MseLoss), vec![vec![4, 3], vec![4, 3], vec![1]]),
        (
            l(LossOp::MseLossBwd),
            vec![vec![4, 3], vec![4, 3], vec![4, 3]],
        ),
        (
            l(LossOp::CrossEntropyLoss {
                label_smoothing: 0.0,
            }),
            vec![vec![5, 7], vec![5], vec![1]],
        ),
        (
            l(LossOp::CrossEntropyLossBwd {
                label_smoothing: 0.0,
            }),
            vec![vec![5, 7], vec![5], vec![5, 7]],
        ),
        (
            l(LossOp::CrossEntropyLoss {
                label_smoothing: 0.1,
            }),
            vec![vec![5, 7], vec![5], vec![1]],
        ),
        (
            l(LossOp::CrossEntropyLossBwd {
                label_smoothing: 0.1,
            }),
            vec![vec![5, 7], vec![5], vec![5, 7]],
        ),
        (l(LossOp::MaeLoss), vec![vec![4, 3], vec![4, 3], vec![1]]),
        (
            l(LossOp::MaeLossBwd),
            vec![vec![4, 3], vec![4, 3], vec![4, 3]],
        ),
        (
            l(LossOp::HuberLoss { delta: 0.5 }),
            vec![vec![4, 3], vec![4, 3], vec![1]],
        ),
        (
            l(LossOp::HuberLossBwd { delta: 0.5 }),
            vec![vec![4, 3], vec![4, 3], vec![4, 3]],
        ),
        (
            l(LossOp::BceWithLogitsLoss),
            vec![vec![4, 3], vec![4, 3], vec![1]],
        ),
        (
            l(LossOp::BceWithLogitsLossBwd),
            vec![vec![4, 3], vec![4, 3], vec![4, 3]],
        ),
    ]
}
