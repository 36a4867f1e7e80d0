//! The pooling family: windows over NHWC images (and nearest-neighbour upsampling, the inverse
//! of a window's reduction), and their backward.

use serde::{Deserialize, Serialize};

use super::facts::{p, DType, OpFacts, ParamKind, PoolGeom, Role, ShapeError, TensorType};
use super::shape::{err, numel, pooled, rank, same};
use crate::unary::UnaryKind;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PoolOp {
    /// x\[N,H,W,C\] -> y\[N,Ho,Wo,C\], argmax u8\[N,Ho,Wo,C\] (row-major index dy*kw+dx inside the
    /// window of the maximum; first maximum wins). Windows over the input padded per
    /// [`PoolGeom`], whose padded cells are never the maximum (a window always holds an input
    /// cell: the padding is at most half the window, a ceil-mode window starts inside the input or
    /// its top / left padding); at most [`MAX_ARGMAX_WINDOW`] positions per window.
    MaxPool { geom: PoolGeom },
    /// x\[N,H,W,C\] -> y\[N,Ho,Wo,C\], the sum over each window divided by its cells inside the
    /// padded input ([`PoolGeom::divisor`]: `kh*kw` but for ceil-mode windows that hang over;
    /// padded cells count as zeros: PyTorch's `count_include_pad=True`).
    AvgPool { geom: PoolGeom },
    /// x\[N,H,W,C\] -> y\[N,C\]
    GlobalAvgPool,
    /// x\[N,H,W,C\] -> y\[N,C\] = the maximum over the height and width, argmax i32\[N,C\] (its index
    /// `iy*W + ix`; the first maximum wins).
    GlobalMaxPool,
    /// dy\[N,C\], argmax i32\[N,C\] -> dx\[N,H,W,C\]: dy at the argmax position, 0 elsewhere.
    GlobalMaxPoolBwd,
    /// dy\[N,Ho,Wo,C\], argmax u8\[N,Ho,Wo,C\] -> dx\[N,H,W,C\] (scatter-add into the argmax position)
    MaxPoolBwd { geom: PoolGeom },
    /// dy\[N,Ho,Wo,C\] -> dx\[N,H,W,C\]
    AvgPoolBwd { geom: PoolGeom },
    /// dy\[N,C\] -> dx\[N,H,W,C\] = dy / (H*W) broadcast
    GlobalAvgPoolBwd,
    /// dy\[N,C\], saved\[N,H,W,C\] -> dx\[N,H,W,C\] = act'(saved) * dy / (H*W): the backward of an
    /// activation whose output was globally average-pooled, with the broadcast folded in (made by
    /// `fuse_epilogues`: the broadcast gradient is never materialised). `saved` is what
    /// [`UnaryKind::saved`] names.
    GlobalAvgPoolBwdAct(UnaryKind),
    /// The same, written over `saved` (InOut; made by `inplace_elementwise` where `saved` dies).
    GlobalAvgPoolBwdActInPlace(UnaryKind),
    /// dy\[N,Ho,Wo,C\], saved\[N,H,W,C\] -> dx\[N,H,W,C\] = act'(saved) * avgpool_bwd(dy): the
    /// backward of an activation whose output was average-pooled, folded into the pool's
    /// backward (made by `fuse_epilogues`: one pass instead of two over dx).
    AvgPoolBwdAct { geom: PoolGeom, act: UnaryKind },
    /// x\[N,H,W,C\] -> y\[N,H*f,W*f,C\], nearest neighbour: y\[n,i,j,c\] = x\[n,i/f,j/f,c\] (`f` = `factor`).
    Upsample { factor: usize },
    /// dy\[N,H*f,W*f,C\] -> dx\[N,H,W,C\] = the sum of dy over each f x f block (rows, then columns).
    UpsampleBwd { factor: usize },
}

/// Positions a max-pool window may have: its argmax is a `u8`.
pub const MAX_ARGMAX_WINDOW: usize = 256;

fn argmax_fits(g: &PoolGeom) -> Result<(), ShapeError> {
    if g.kh.saturating_mul(g.kw) > MAX_ARGMAX_WINDOW {
        return err(format!(
            "max-pool window {}x{} has more than {MAX_ARGMAX_WINDOW} positions",
            g.kh, g.kw
        ));
    }
    Ok(())
}

impl OpFacts for PoolOp {
    fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        match self {
            PoolOp::MaxPool { .. } => vec![p("x", In, F32), p("y", Out, F32), p("argmax", Out, U8)],
            PoolOp::AvgPool { .. } | PoolOp::GlobalAvgPool => {
                vec![p("x", In, F32), p("y", Out, F32)]
            }
            PoolOp::GlobalMaxPool => vec![p("x", In, F32), p("y", Out, F32), p("argmax", Out, I32)],
            PoolOp::GlobalMaxPoolBwd => {
                vec![p("dy", In, F32), p("argmax", In, I32), p("dx", Out, F32)]
            }
            PoolOp::MaxPoolBwd { .. } => {
                vec![p("dy", In, F32), p("argmax", In, U8), p("dx", Out, F32)]
            }
            PoolOp::AvgPoolBwd { .. } | PoolOp::GlobalAvgPoolBwd | PoolOp::UpsampleBwd { .. } => {
                vec![p("dy", In, F32), p("dx", Out, F32)]
            }
            PoolOp::Upsample { .. } => vec![p("x", In, F32), p("y", Out, F32)],
            PoolOp::GlobalAvgPoolBwdAct(_) => {
                vec![p("dy", In, F32), p("saved", In, F32), p("dx", Out, F32)]
            }
            PoolOp::GlobalAvgPoolBwdActInPlace(_) => {
                vec![p("dy", In, F32), p("saved", InOut, F32)]
            }
            PoolOp::AvgPoolBwdAct { .. } => {
                vec![p("dy", In, F32), p("saved", In, F32), p("dx", Out, F32)]
            }
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            PoolOp::MaxPool { .. } => "maxpool",
            PoolOp::AvgPool { .. } => "avgpool",
            PoolOp::GlobalAvgPool => "global_avgpool",
            PoolOp::GlobalMaxPool => "global_maxpool",
            PoolOp::GlobalMaxPoolBwd => "global_maxpool_bwd",
            PoolOp::MaxPoolBwd { .. } => "maxpool_bwd",
            PoolOp::AvgPoolBwd { .. } => "avgpool_bwd",
            PoolOp::GlobalAvgPoolBwd => "global_avgpool_bwd",
            PoolOp::Upsample { .. } => "upsample",
            PoolOp::UpsampleBwd { .. } => "upsample_bwd",
            PoolOp::GlobalAvgPoolBwdAct(_) => "global_avgpool_bwd_act",
            PoolOp::GlobalAvgPoolBwdActInPlace(_) => "global_avgpool_bwd_act_inplace",
            PoolOp::AvgPoolBwdAct { .. } => "avgpool_bwd_act",
        }
    }

    fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        match self {
            PoolOp::GlobalAvgPoolBwdActInPlace(_) => vec![(0, 1)],
            _ => vec![],
        }
    }

    fn workspace_elems(&self, _shapes: &[Vec<usize>]) -> Vec<usize> {
        vec![]
    }

    fn infer(
        &self,
        inputs: &[TensorType],
        hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError> {
        let f = TensorType::f32;
        match self {
            PoolOp::MaxPool { geom } => {
                rank(&inputs[0], 4, "x")?;
                argmax_fits(geom)?;
                let y = pooled(&inputs[0].shape, geom)?;
                Ok(vec![f(y.clone()), TensorType::new(y, DType::U8)])
            }
            PoolOp::AvgPool { geom } => {
                rank(&inputs[0], 4, "x")?;
                Ok(vec![f(pooled(&inputs[0].shape, geom)?)])
            }
            PoolOp::GlobalAvgPool => {
                let x = &inputs[0];
                rank(x, 4, "x")?;
                if x.shape[1] * x.shape[2] == 0 {
                    return err(format!("global pooling over an empty image {x}"));
                }
                Ok(vec![f(vec![x.shape[0], x.shape[3]])])
            }
            PoolOp::GlobalMaxPool => {
                let x = &inputs[0];
                rank(x, 4, "x")?;
                if x.shape[1] * x.shape[2] == 0 {
                    return err(format!("global pooling over an empty image {x}"));
                }
                if x.shape[1].saturating_mul(x.shape[2]) > i32::MAX as usize {
                    return err(format!(
                        "global max-pool over {x}: more than 2^31 positions"
                    ));
                }
                let y = vec![x.shape[0], x.shape[3]];
                Ok(vec![f(y.clone()), TensorType::new(y, DType::I32)])
            }
            PoolOp::GlobalMaxPoolBwd => {
                let dy = &inputs[0];
                rank(dy, 2, "dy")?;
                same(dy, &inputs[1], "dy, argmax")?;
                let Some(h) = hint else {
                    return err("global_maxpool_bwd needs the expected output shape");
                };
                rank(h, 4, "dx")?;
                if h.shape[0] != dy.shape[0]
                    || h.shape[3] != dy.shape[1]
                    || h.shape[1] * h.shape[2] == 0
                {
                    return err(format!("dx {h} inconsistent with dy {dy}"));
                }
                Ok(vec![f(h.shape.clone())])
            }
            PoolOp::MaxPoolBwd { geom } | PoolOp::AvgPoolBwd { geom } => {
                let dy = &inputs[0];
                rank(dy, 4, "dy")?;
                if let PoolOp::MaxPoolBwd { .. } = self {
                    argmax_fits(geom)?;
                    same(dy, &inputs[1], "dy, argmax")?;
                }
                let Some(h) = hint else {
                    return err(format!(
                        "{} needs the expected output shape",
                        self.kind_name()
                    ));
                };
                rank(h, 4, "dx")?;
                if pooled(&h.shape, geom)? != dy.shape {
                    return err(format!("dx {h} does not pool to dy {dy}"));
                }
                Ok(vec![f(h.shape.clone())])
            }
            PoolOp::Upsample { factor } => {
                let x = &inputs[0];
                rank(x, 4, "x")?;
                let k = *factor;
                match (x.shape[1].checked_mul(k), x.shape[2].checked_mul(k)) {
                    (Some(h), Some(w)) if k >= 1 => Ok(vec![f(vec![x.shape[0], h, w, x.shape[3]])]),
                    _ => err(format!("cannot upsample {x} by {k}")),
                }
            }
            PoolOp::UpsampleBwd { factor } => {
                let dy = &inputs[0];
                rank(dy, 4, "dy")?;
                let k = *factor;
                if k == 0 || !dy.shape[1].is_multiple_of(k) || !dy.shape[2].is_multiple_of(k) {
                    return err(format!("dy {dy} is not upsampled by {k}"));
                }
                Ok(vec![f(vec![
                    dy.shape[0],
                    dy.shape[1] / k,
                    dy.shape[2] / k,
                    dy.shape[3],
                ])])
            }
            PoolOp::GlobalAvgPoolBwd => {
                let dy = &inputs[0];
                rank(dy, 2, "dy")?;
                let Some(h) = hint else {
                    return err("global_avgpool_bwd needs the expected output shape");
                };
                rank(h, 4, "dx")?;
                if h.shape[0] != dy.shape[0]
                    || h.shape[3] != dy.shape[1]
                    || h.shape[1] * h.shape[2] == 0
                {
                    return err(format!("dx {h} inconsistent with dy {dy}"));
                }
                Ok(vec![f(h.shape.clone())])
            }
            PoolOp::GlobalAvgPoolBwdAct(_) | PoolOp::GlobalAvgPoolBwdActInPlace(_) => {
                let (dy, saved) = (&inputs[0], &inputs[1]);
                rank(dy, 2, "dy")?;
                rank(saved, 4, "saved")?;
                if saved.shape[0] != dy.shape[0]
                    || saved.shape[3] != dy.shape[1]
                    || saved.shape[1] * saved.shape[2] == 0
                {
                    return err(format!("saved {saved} inconsistent with dy {dy}"));
                }
                Ok(vec![f(saved.shape.clone())])
            }
            PoolOp::AvgPoolBwdAct { geom, .. } => {
                let (dy, saved) = (&inputs[0], &inputs[1]);
                rank(dy, 4, "dy")?;
                rank(saved, 4, "saved")?;
                if pooled(&saved.shape, geom)? != dy.shape {
                    return err(format!("saved {saved} does not pool to dy {dy}"));
                }
                Ok(vec![f(saved.shape.clone())])
            }
        }
    }

    fn flops(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> u64 {
        match self {
            // one comparison or addition per window element (the padded ones included)
            PoolOp::MaxPool { geom } | PoolOp::AvgPool { geom } => {
                outs.first().map(|s| numel(s)).unwrap_or(0) * (geom.kh * geom.kw) as u64
            }
            PoolOp::GlobalAvgPool | PoolOp::GlobalMaxPool => {
                ins.first().map(|s| numel(s)).unwrap_or(0)
            }
            PoolOp::MaxPoolBwd { .. }
            | PoolOp::AvgPoolBwd { .. }
            | PoolOp::GlobalAvgPoolBwd
            | PoolOp::GlobalMaxPoolBwd => outs.first().map(|s| numel(s)).unwrap_or(0),
            // a copy: no arithmetic; its backward adds f*f values per input element
            PoolOp::Upsample { .. } => 0,
            PoolOp::UpsampleBwd { .. } => ins.first().map(|s| numel(s)).unwrap_or(0),
            // the broadcast and the activation's backward: two per element
            PoolOp::GlobalAvgPoolBwdAct(_)
            | PoolOp::GlobalAvgPoolBwdActInPlace(_)
            | PoolOp::AvgPoolBwdAct { .. } => 2 * outs.first().map(|s| numel(s)).unwrap_or(0),
        }
    }

    /// Every input and output streamed once in one parallel loop (the default); a folded
    /// activation's backward formula per element ([`crate::cpu::Special`]).
    fn cpu_work(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> crate::cpu::CpuWork {
        let elems: u64 = ins.iter().chain(outs).map(|s| numel(s)).sum();
        let w = crate::cpu::CpuWork::stream(elems * 4);
        let dx = outs.first().map_or(0, |s| numel(s));
        match self {
            PoolOp::GlobalAvgPoolBwdAct(k)
            | PoolOp::GlobalAvgPoolBwdActInPlace(k)
            | PoolOp::AvgPoolBwdAct { act: k, .. } => {
                w.with_special(crate::cpu::Special::Backward(*k), dx)
            }
            _ => w,
        }
    }
}
