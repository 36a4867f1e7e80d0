//! Dense layers: the forward (bias fused), the data gradient and the weight gradient (alone or
//! fused with the optimizer update), all from `matmul.cu.tera`.

use tera::Context;

use dmc_plan::update::UpdateRule;

use super::common::{numel, Site, Spec};
use super::gemm::gemm;
use super::update::rule_ctx;
use crate::error::CodegenError;

/// The context every dense kernel shares, given the slots of its weight `[K, M]` and of its
/// `[rows, K]` input: (context, K, M, rows).
fn dense_ctx(
    s: &Site,
    w_slot: usize,
    x_slot: usize,
) -> Result<(Context, usize, usize, usize), CodegenError> {
    let w = s.shape(w_slot)?;
    s.rank(w, 2, "w")?;
    let (kin, mout) = (w[0], w[1]);
    let rows = numel(s.shape(x_slot)?) / kin.max(1);
    let mut ctx = Context::new();
    ctx.insert("kind", s.kind());
    ctx.insert("k_in", &kin);
    ctx.insert("m_out", &mout);
    ctx.insert("rows", &rows);
    Ok((ctx, kin, mout, rows))
}

/// `Dense`: x, w, (b), y.
pub(crate) fn forward(s: &Site, bias: bool) -> Result<Spec, CodegenError> {
    let (mut ctx, kin, mout, rows) = dense_ctx(s, 1, 0)?;
    ctx.insert("bias", &bias);
    gemm(
        s,
        "matmul.cu.tera",
        ctx,
        (rows, mout, kin),
        (true, false),
        (1, ""),
    )
}

/// `DenseBwdData`: dy, w, dx.
pub(crate) fn backward_data(s: &Site) -> Result<Spec, CodegenError> {
    let (ctx, kin, mout, rows) = dense_ctx(s, 1, 2)?;
    gemm(
        s,
        "matmul.cu.tera",
        ctx,
        (rows, kin, mout),
        (true, true),
        (1, ""),
    )
}

/// `DenseBwdWeight` (`rule` none) or `DenseBwdWeightUpdate` (the workspace stays unused): x, dy,
/// then dw (or the updated w).
pub(crate) fn backward_weight(s: &Site, rule: Option<&UpdateRule>) -> Result<Spec, CodegenError> {
    let (ctx, kin, mout, rows) = dense_ctx(s, 2, 0)?;
    let mut sp = gemm(
        s,
        "matmul.cu.tera",
        ctx,
        (kin, mout, rows),
        (false, false),
        (1, ""),
    )?;
    if let Some(rule) = rule {
        rule_ctx(&mut sp.ctx, rule, "w", true);
    }
    Ok(sp)
}
