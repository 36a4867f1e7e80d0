//! Losses (`loss.cu.tera`): the MSE, MAE, Huber, BCE-with-logits and softmax cross-entropy
//! (optionally label-smoothed) reductions (one block) and the cross-entropy gradient (one thread
//! per row); the elementwise losses' gradients are `elementwise.cu.tera`'s.

use super::common::{f32_lit, numel, per_element, reduction, Site, Spec};
use crate::error::CodegenError;
use dmc_plan::op::LossOp;

const TEMPLATE: &str = "loss.cu.tera";

/// The term's weight `w` in the template context: `false` when 1 (the unweighted formulas,
/// unchanged), else its literal.
fn weight_ctx(sp: &mut Spec, w: f32) {
    if w == 1.0 {
        sp.ctx.insert("weight", &false);
    } else {
        sp.ctx.insert("weight", &f32_lit(w));
    }
}

/// `MseLoss` (also `MaeLoss`, `BceWithLogitsLoss`): pred, target -> loss[1].
pub(crate) fn mse(s: &Site, w: f32) -> Result<Spec, CodegenError> {
    let mut sp = reduction(s, TEMPLATE);
    sp.ctx.insert("n", &numel(s.shape(0)?));
    weight_ctx(&mut sp, w);
    Ok(sp)
}

/// The logits' `[rows, classes]`, checked.
fn logits(s: &Site) -> Result<(usize, usize), CodegenError> {
    let l = s.shape(0)?;
    s.rank(l, 2, "logits")?;
    Ok((l[0], l[1]))
}

/// `HuberLoss` (pred, target -> loss[1]).
fn huber(s: &Site, delta: f32, w: f32) -> Result<Spec, CodegenError> {
    let mut sp = mse(s, w)?;
    sp.ctx.insert("delta", &f32_lit(delta));
    Ok(sp)
}

/// The per-element gradients of the elementwise losses (`elementwise.cu.tera`), with Huber's
/// `delta`.
fn elementwise_bwd(s: &Site, delta: Option<f32>, w: f32) -> Result<Spec, CodegenError> {
    let mut sp = super::elementwise::binary(s)?;
    if let Some(d) = delta {
        sp.ctx.insert("delta", &f32_lit(d));
    }
    weight_ctx(&mut sp, w);
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
pub(crate) fn cross_entropy(s: &Site, e: f32, w: f32) -> Result<Spec, CodegenError> {
    let (rows, classes) = logits(s)?;
    let mut sp = reduction(s, TEMPLATE);
    sp.ctx.insert("rows", &rows);
    sp.ctx.insert("classes", &classes);
    smoothing_ctx(&mut sp, e);
    weight_ctx(&mut sp, w);
    Ok(sp)
}

/// `CrossEntropyLossBwd`: logits, labels -> dlogits.
pub(crate) fn cross_entropy_bwd(s: &Site, e: f32, w: f32) -> Result<Spec, CodegenError> {
    let (rows, classes) = logits(s)?;
    let mut sp = per_element(s, TEMPLATE, rows)?;
    sp.ctx.insert("rows", &rows);
    sp.ctx.insert("classes", &classes);
    smoothing_ctx(&mut sp, e);
    weight_ctx(&mut sp, w);
    Ok(sp)
}

/// The kernel of one op of the loss family.
pub(crate) fn spec(s: &Site, op: &LossOp) -> Result<Spec, CodegenError> {
    let w = op.weight();
    match op {
        LossOp::MseLoss { .. } | LossOp::MaeLoss { .. } | LossOp::BceWithLogitsLoss { .. } => {
            mse(s, w)
        }
        LossOp::HuberLoss { delta, .. } => huber(s, *delta, w),
        LossOp::MseLossBwd { .. }
        | LossOp::MaeLossBwd { .. }
        | LossOp::BceWithLogitsLossBwd { .. } => elementwise_bwd(s, None, w),
        LossOp::HuberLossBwd { delta, .. } => elementwise_bwd(s, Some(*delta), w),
        LossOp::CrossEntropyLoss {
            label_smoothing, ..
        } => cross_entropy(s, *label_smoothing, w),
        LossOp::CrossEntropyLossBwd {
            label_smoothing, ..
        } => cross_entropy_bwd(s, *label_smoothing, w),
    }
}

/// The zoo's losses and their gradients: each unweighted, and each with a weight (a term of a
/// weighted sum, `loss 0.25 * mse(..) + ..`).
pub(crate) fn zoo() -> Vec<super::cases::Case> {
    use dmc_plan::op::Op;
    let ew = [vec![4, 3], vec![4, 3], vec![1]];
    let ewb = [vec![4, 3], vec![4, 3], vec![4, 3]];
    let ce = [vec![5, 7], vec![5], vec![1]];
    let ceb = [vec![5, 7], vec![5], vec![5, 7]];
    let mut out = vec![];
    for weight in [1.0, 0.25] {
        let cases: Vec<(LossOp, &[Vec<usize>; 3])> = vec![
            (LossOp::MseLoss { weight }, &ew),
            (LossOp::MseLossBwd { weight }, &ewb),
            (
                LossOp::CrossEntropyLoss {
                    label_smoothing: 0.0,
                    weight,
                },
                &ce,
            ),
            (
                LossOp::CrossEntropyLossBwd {
                    label_smoothing: 0.0,
                    weight,
                },
                &ceb,
            ),
            (
                LossOp::CrossEntropyLoss {
                    label_smoothing: 0.1,
                    weight,
                },
                &ce,
            ),
            (
                LossOp::CrossEntropyLossBwd {
                    label_smoothing: 0.1,
                    weight,
                },
                &ceb,
            ),
            (LossOp::MaeLoss { weight }, &ew),
            (LossOp::MaeLossBwd { weight }, &ewb),
            (LossOp::HuberLoss { delta: 0.5, weight }, &ew),
            (LossOp::HuberLossBwd { delta: 0.5, weight }, &ewb),
            (LossOp::BceWithLogitsLoss { weight }, &ew),
            (LossOp::BceWithLogitsLossBwd { weight }, &ewb),
        ];
        out.extend(
            cases
                .into_iter()
                .map(|(op, shapes)| (Op::Loss(op), shapes.to_vec())),
        );
    }
    out
}
