//! Losses (`loss.cu.tera`): the MSE and softmax cross-entropy reductions (one block) and the
//! cross-entropy gradient (one thread per row).

use super::common::{numel, per_element, reduction, Site, Spec};
use crate::error::CodegenError;

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
