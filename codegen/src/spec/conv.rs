//! Convolutions: the forward, the data gradient and the weight gradient (alone or fused with the
//! optimizer update), each an implicit GEMM (no im2col buffer on the GPU).

use tera::Context;

use dmc_plan::op::{ConvGeom, Role};
use dmc_plan::update::UpdateRule;

use super::common::{numel, Site, Spec};
use super::gemm::{gemm, split_k};
use super::update::rule_ctx;
use crate::error::CodegenError;

fn conv_ctx(kind: &str, g: &ConvGeom, x: &[usize], y: &[usize], bias: bool) -> Context {
    let mut ctx = Context::new();
    ctx.insert("kind", kind);
    ctx.insert("nb", &x[0]);
    ctx.insert("h", &x[1]);
    ctx.insert("w", &x[2]);
    ctx.insert("ci", &x[3]);
    ctx.insert("ho", &y[1]);
    ctx.insert("wo", &y[2]);
    ctx.insert("co", &y[3]);
    ctx.insert("kh", &g.kh);
    ctx.insert("kw", &g.kw);
    ctx.insert("stride", &g.stride);
    ctx.insert("pad_top", &g.pad_top);
    ctx.insert("pad_left", &g.pad_left);
    ctx.insert("bias", &bias);
    ctx
}

/// `Conv2d`: x, w, (b), y, cols.
pub(crate) fn forward(s: &Site, geom: &ConvGeom, bias: bool) -> Result<Spec, CodegenError> {
    let (x, y) = (s.shape(0)?, s.shape(if bias { 3 } else { 2 })?);
    s.rank(x, 4, "x")?;
    s.rank(y, 4, "y")?;
    let ctx = conv_ctx(s.kind(), geom, x, y, bias);
    let gk = geom.kh * geom.kw * x[3];
    let gm = y[0] * y[1] * y[2];
    // the im2col workspace (the CPU's) holds the partial sums of a split-K
    let ws = numel(s.shape(if bias { 4 } else { 3 })?);
    gemm(
        s,
        "conv2d_fwd.cu.tera",
        ctx,
        (gm, y[3], gk),
        (true, false),
        (split_k(gm, y[3], gk, ws), "cols"),
    )
}

/// `Conv2dBwdData`: dy, w, dx.
pub(crate) fn backward_data(s: &Site, geom: &ConvGeom) -> Result<Spec, CodegenError> {
    let (dy, dx) = (s.shape(0)?, s.shape(2)?);
    s.rank(dy, 4, "dy")?;
    s.rank(dx, 4, "dx")?;
    let ctx = conv_ctx(s.kind(), geom, dx, dy, false);
    let gk = geom.kh * geom.kw * dy[3];
    gemm(
        s,
        "conv2d_bwd_data.cu.tera",
        ctx,
        (dx[0] * dx[1] * dx[2], dx[3], gk),
        (true, true),
        (1, ""), // no workspace in its signature
    )
}

/// `Conv2dBwdWeight` (`rule` none) or `Conv2dBwdWeightUpdate`: x, dy, then dw (or the updated w):
/// the same GEMM; the fused kernel applies the update where the unfused one stores the gradient
/// (its workspaces stay unused).
pub(crate) fn backward_weight(
    s: &Site,
    geom: &ConvGeom,
    rule: Option<&UpdateRule>,
) -> Result<Spec, CodegenError> {
    let (x, dy) = (s.shape(0)?, s.shape(1)?);
    s.rank(x, 4, "x")?;
    s.rank(dy, 4, "dy")?;
    let ctx = conv_ctx(s.kind(), geom, x, dy, false);
    let gm = geom.kh * geom.kw * x[3];
    let gk = dy[0] * dy[1] * dy[2];
    // the largest workspace (the CPU's im2col `cols`, or the fused op's gradient chunk `gw`)
    // holds the partial sums of a split-K
    let (ws_slot, ws) =
        s.k.op
            .signature()
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| p.role == Role::Workspace)
            .map(|(i, p)| {
                (
                    p.name.clone(),
                    s.k.arg_shapes.get(i).map_or(0, |s| numel(s)),
                )
            })
            .max_by_key(|(_, n)| *n)
            .unwrap_or_default();
    let mut sp = gemm(
        s,
        "conv2d_bwd_weight.cu.tera",
        ctx,
        (gm, dy[3], gk),
        (false, false),
        (split_k(gm, dy[3], gk, ws), &ws_slot),
    )?;
    if let Some(rule) = rule {
        rule_ctx(&mut sp.ctx, rule, "w", true);
    }
    Ok(sp)
}
