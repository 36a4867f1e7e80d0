//! Losses (`loss.cu.tera`): the MSE and softmax cross-entropy reductions (one block) and the
//! cross-entropy gradient (one thread per row).

use super::common::{numel, per_element, reduction, Site, Spec};
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

/// `CrossEntropyLoss`: logits, labels -> loss[1].
pub(crate) fn cross_entropy(s: &Site) -> Result<Spec, CodegenError> {
    let (rows, classes) = logits(s)?;
    let mut sp = reduction(s, TEMPLATE);
    sp.ctx.insert("rows", &rows);
    sp.ctx.insert("classes", &classes);
    Ok(sp)
}

/// `CrossEntropyLossBwd`: logits, labels -> dlogits.
pub(crate) fn cross_entropy_bwd(s: &Site) -> Result<Spec, CodegenError> {
    let (rows, classes) = logits(s)?;
    let mut sp = per_element(s, TEMPLATE, rows)?;
    sp.ctx.insert("rows", &rows);
    sp.ctx.insert("classes", &classes);
    Ok(sp)
}

/// The kernel of one op of the loss family.
pub(crate) fn spec(s: &Site, op: &LossOp) -> Result<Spec, CodegenError> {
    match op {
        LossOp::MseLoss => mse(s),
        LossOp::MseLossBwd => super::elementwise::binary(s),
        LossOp::CrossEntropyLoss => cross_entropy(s),
        LossOp::CrossEntropyLossBwd => cross_entropy_bwd(s),
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
            l(LossOp::CrossEntropyLoss),
            vec![vec![5, 7], vec![5], vec![1]],
        ),
        (
            l(LossOp::CrossEntropyLossBwd),
            vec![vec![5, 7], vec![5], vec![5, 7]],
        ),
    ]
}
