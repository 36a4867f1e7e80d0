//! The dense (matrix product) family: the forward, both gradients, and the weight gradient fused
//! with its update. Weights are `[K, M]` (inputs x outputs).

use serde::{Deserialize, Serialize};

use super::facts::{p, DType, OpFacts, ParamKind, Role, ShapeError, TensorType};
use super::shape::{err, numel, rank, states_like};
use crate::update::UpdateRule;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DenseOp {
    /// x[N,K], w[K,M], (b[M] if bias) -> y[N,M].
    Dense { bias: bool },
    /// dy[N,M], w[K,M] -> dx[N,K] = dy w^T
    DenseBwdData,
    /// x[N,K], dy[N,M] -> dw[K,M] = x^T dy
    DenseBwdWeight,
    /// x[N,K], dy[N,M], w[K,M] (InOut), state.. (InOut) -> w', state'..; gradient in blocks of
    /// `chunk` columns into the workspace `gw` [K x chunk], each block updated at once.
    DenseBwdWeightUpdate { rule: UpdateRule, chunk: usize },
}

impl OpFacts for DenseOp {
    fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        match self {
            DenseOp::Dense { bias } => {
                let mut v = vec![p("x", In, F32), p("w", In, F32)];
                if *bias {
                    v.push(p("b", In, F32));
                }
                v.push(p("y", Out, F32));
                v
            }
            DenseOp::DenseBwdData => vec![p("dy", In, F32), p("w", In, F32), p("dx", Out, F32)],
            DenseOp::DenseBwdWeight => vec![p("x", In, F32), p("dy", In, F32), p("dw", Out, F32)],
            DenseOp::DenseBwdWeightUpdate { rule, .. } => {
                let mut v = vec![p("x", In, F32), p("dy", In, F32), p("w", InOut, F32)];
                v.extend(rule.state_names().iter().map(|s| p(s, InOut, F32)));
                v.push(p("gw", Workspace, F32));
                v
            }
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            DenseOp::Dense { .. } => "dense",
            DenseOp::DenseBwdData => "dense_bwd_data",
            DenseOp::DenseBwdWeight => "dense_bwd_weight",
            DenseOp::DenseBwdWeightUpdate { .. } => "dense_bwd_weight_update",
        }
    }

    fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        match self {
            DenseOp::Dense { .. } | DenseOp::DenseBwdData | DenseOp::DenseBwdWeight => vec![],
            DenseOp::DenseBwdWeightUpdate { rule, .. } => {
                (0..=rule.state_names().len()).map(|o| (o, o + 2)).collect()
            }
        }
    }

    fn workspace_elems(&self, s: &[Vec<usize>]) -> Vec<usize> {
        match self {
            DenseOp::Dense { .. } | DenseOp::DenseBwdData | DenseOp::DenseBwdWeight => vec![],
            DenseOp::DenseBwdWeightUpdate { chunk, .. } => {
                vec![s.get(2).and_then(|w| w.first()).copied().unwrap_or(0) * chunk]
            }
        }
    }

    fn infer(
        &self,
        inputs: &[TensorType],
        _hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError> {
        let f = TensorType::f32;
        match self {
            DenseOp::Dense { bias } => {
                let (x, w) = (&inputs[0], &inputs[1]);
                rank(x, 2, "x")?;
                rank(w, 2, "w")?;
                if x.shape[1] != w.shape[0] {
                    return err(format!("x {x} and w {w}: inner dimensions differ"));
                }
                if *bias && inputs[2].shape != [w.shape[1]] {
                    return err(format!("bias {} must be [{}]", inputs[2], w.shape[1]));
                }
                Ok(vec![f(vec![x.shape[0], w.shape[1]])])
            }
            DenseOp::DenseBwdData => {
                let (dy, w) = (&inputs[0], &inputs[1]);
                rank(dy, 2, "dy")?;
                rank(w, 2, "w")?;
                if dy.shape[1] != w.shape[1] {
                    return err(format!("dy {dy} and w {w}: output dimensions differ"));
                }
                Ok(vec![f(vec![dy.shape[0], w.shape[0]])])
            }
            DenseOp::DenseBwdWeight => {
                let (x, dy) = (&inputs[0], &inputs[1]);
                rank(x, 2, "x")?;
                rank(dy, 2, "dy")?;
                if x.shape[0] != dy.shape[0] {
                    return err(format!("x {x} and dy {dy}: batch differs"));
                }
                Ok(vec![f(vec![x.shape[1], dy.shape[1]])])
            }
            DenseOp::DenseBwdWeightUpdate { chunk, .. } => {
                let (x, dy, w) = (&inputs[0], &inputs[1], &inputs[2]);
                rank(x, 2, "x")?;
                rank(dy, 2, "dy")?;
                if x.shape[0] != dy.shape[0] || w.shape != [x.shape[1], dy.shape[1]] {
                    return err(format!("x {x}, dy {dy}, w {w} inconsistent"));
                }
                if *chunk == 0 || *chunk > dy.shape[1] {
                    return err(format!("chunk {chunk} outside 1..={}", dy.shape[1]));
                }
                states_like(w, inputs, 3)?;
                Ok(inputs[2..].to_vec())
            }
        }
    }

    fn flops(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> u64 {
        let i = |k: usize| ins.get(k).map(|s| numel(s)).unwrap_or(0);
        let o = |k: usize| outs.get(k).map(|s| numel(s)).unwrap_or(0);
        match self {
            DenseOp::Dense { bias } => {
                let k = ins.first().and_then(|x| x.get(1)).copied().unwrap_or(0) as u64;
                2 * o(0) * k + if *bias { o(0) } else { 0 }
            }
            DenseOp::DenseBwdData => {
                let k = ins.get(1).and_then(|w| w.first()).copied().unwrap_or(0) as u64;
                2 * i(0) * k
            }
            DenseOp::DenseBwdWeight | DenseOp::DenseBwdWeightUpdate { .. } => {
                let k = ins.first().and_then(|x| x.get(1)).copied().unwrap_or(0) as u64;
                let upd = if matches!(self, DenseOp::DenseBwdWeightUpdate { .. }) {
                    4 * i(2)
                } else {
                    0
                };
                2 * i(1) * k + upd
            }
        }
    }
}
