//! The elementwise family: activations ([`UnaryKind`]), sums, products, dropout, the softmax over the
//! last axis and the join (and slice) along the last axis, out of place and in
//! place (made by the `inplace_elementwise` pass: the written input dies there), and backward.

use serde::{Deserialize, Serialize};

use super::facts::{p, DType, OpFacts, ParamKind, Role, ShapeError, TensorType};
use super::shape::{err, numel, same};
use crate::unary::UnaryKind;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ElementwiseOp {
    /// y = f(x) elementwise.
    Unary(UnaryKind),
    /// (saved, dy) -> dx, `saved` being what [`UnaryKind::saved`] names: y for relu, tanh, sigmoid
    /// (from the *output*, so the input need not be kept), x for gelu.
    UnaryBwd(UnaryKind),
    /// x -> x = f(x) (x is `InOut`: one buffer).
    UnaryInPlace(UnaryKind),
    /// saved, dy -> dy = f'(saved) * dy (dy is `InOut`); `saved` as for `UnaryBwd`.
    UnaryBwdInPlace(UnaryKind),
    /// y = a + b (same shapes). Also used to accumulate gradients of values used twice.
    Add,
    /// a, b -> a = a + b (a is `InOut`). Also the in-place gradient accumulation.
    AddInPlace,
    /// y = a * b elementwise (same shapes). Also its own backward: da = dy * b, db = dy * a.
    Mul,
    /// a[.., ca], b[.., cb] -> y[.., ca + cb]: the two joined along the last axis (all other
    /// axes equal), a's channels first. `concat` of more values is a chain of these.
    Concat,
    /// dy[.., c] -> dx[.., len] = dy[.., start .. start + len]: a slice of the last axis (the
    /// gradient of one input of [`ElementwiseOp::Concat`]).
    SliceLast { start: usize, len: usize },
    /// y = x * keep / (1-p), keep = (hash(seed, step, salt, index) >= p): the mask is regenerated
    /// from a counter-based RNG in backward, never stored.
    Dropout { p: f32, salt: u64 },
    /// dy -> dx = dy * keep / (1-p), same mask as the forward.
    DropoutBwd { p: f32, salt: u64 },
    /// x -> x = x * keep / (1-p), the mask of `Dropout`.
    DropoutInPlace { p: f32, salt: u64 },
    /// dy -> dy = dy * keep / (1-p).
    DropoutBwdInPlace { p: f32, salt: u64 },
    /// x[.., C] -> y = softmax over the last axis: `e^(x - max) / sum e^(x - max)` per row (the max
    /// subtracted: stable for any finite x), the sum in f64.
    Softmax,
    /// (y, dy) -> dx = y * (dy - sum_row(dy * y)), from the forward's output (the input need not
    /// be kept), the sum in f64.
    SoftmaxBwd,
}

impl OpFacts for ElementwiseOp {
    fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        match self {
            ElementwiseOp::Unary(_) | ElementwiseOp::Dropout { .. } => {
                vec![p("x", In, F32), p("y", Out, F32)]
            }
            ElementwiseOp::UnaryBwd(k) => {
                let saved = k.saved().param_name();
                vec![p(saved, In, F32), p("dy", In, F32), p("dx", Out, F32)]
            }
            ElementwiseOp::UnaryInPlace(_) | ElementwiseOp::DropoutInPlace { .. } => {
                vec![p("x", InOut, F32)]
            }
            ElementwiseOp::UnaryBwdInPlace(k) => {
                let saved = k.saved().param_name();
                vec![p(saved, In, F32), p("dy", InOut, F32)]
            }
            ElementwiseOp::Add => vec![p("a", In, F32), p("b", In, F32), p("y", Out, F32)],
            ElementwiseOp::AddInPlace => vec![p("a", InOut, F32), p("b", In, F32)],
            ElementwiseOp::Mul | ElementwiseOp::Concat => {
                vec![p("a", In, F32), p("b", In, F32), p("y", Out, F32)]
            }
            ElementwiseOp::SliceLast { .. } => vec![p("dy", In, F32), p("dx", Out, F32)],
            ElementwiseOp::DropoutBwd { .. } => vec![p("dy", In, F32), p("dx", Out, F32)],
            ElementwiseOp::DropoutBwdInPlace { .. } => vec![p("dy", InOut, F32)],
            ElementwiseOp::Softmax => vec![p("x", In, F32), p("y", Out, F32)],
            ElementwiseOp::SoftmaxBwd => vec![p("y", In, F32), p("dy", In, F32), p("dx", Out, F32)],
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            ElementwiseOp::Unary(k) => k.op_names().forward,
            ElementwiseOp::UnaryBwd(k) => k.op_names().backward,
            ElementwiseOp::UnaryInPlace(k) => k.op_names().forward_inplace,
            ElementwiseOp::UnaryBwdInPlace(k) => k.op_names().backward_inplace,
            ElementwiseOp::Add => "add",
            ElementwiseOp::AddInPlace => "add_inplace",
            ElementwiseOp::Mul => "mul",
            ElementwiseOp::Concat => "concat",
            ElementwiseOp::SliceLast { .. } => "slice_last",
            ElementwiseOp::Dropout { .. } => "dropout",
            ElementwiseOp::DropoutBwd { .. } => "dropout_bwd",
            ElementwiseOp::DropoutInPlace { .. } => "dropout_inplace",
            ElementwiseOp::DropoutBwdInPlace { .. } => "dropout_bwd_inplace",
            ElementwiseOp::Softmax => "softmax",
            ElementwiseOp::SoftmaxBwd => "softmax_bwd",
        }
    }

    fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        match self {
            ElementwiseOp::UnaryInPlace(_)
            | ElementwiseOp::AddInPlace
            | ElementwiseOp::DropoutInPlace { .. }
            | ElementwiseOp::DropoutBwdInPlace { .. } => vec![(0, 0)],
            ElementwiseOp::UnaryBwdInPlace(_) => vec![(0, 1)],
            ElementwiseOp::Unary(_)
            | ElementwiseOp::UnaryBwd(_)
            | ElementwiseOp::Add
            | ElementwiseOp::Mul
            | ElementwiseOp::Concat
            | ElementwiseOp::SliceLast { .. }
            | ElementwiseOp::Dropout { .. }
            | ElementwiseOp::DropoutBwd { .. }
            | ElementwiseOp::Softmax
            | ElementwiseOp::SoftmaxBwd => vec![],
        }
    }

    fn workspace_elems(&self, _shapes: &[Vec<usize>]) -> Vec<usize> {
        vec![]
    }

    fn infer(
        &self,
        inputs: &[TensorType],
        _hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError> {
        match self {
            ElementwiseOp::Unary(_)
            | ElementwiseOp::Dropout { .. }
            | ElementwiseOp::DropoutBwd { .. }
            | ElementwiseOp::UnaryInPlace(_)
            | ElementwiseOp::DropoutInPlace { .. }
            | ElementwiseOp::DropoutBwdInPlace { .. } => Ok(vec![inputs[0].clone()]),
            ElementwiseOp::Add | ElementwiseOp::Mul => {
                same(&inputs[0], &inputs[1], "a, b")?;
                Ok(vec![inputs[0].clone()])
            }
            ElementwiseOp::Concat => {
                let (a, b) = (&inputs[0], &inputs[1]);
                match (a.shape.split_last(), b.shape.split_last()) {
                    (Some((ca, ra)), Some((cb, rb))) if ra == rb => {
                        let mut shape = ra.to_vec();
                        shape.push(ca + cb);
                        Ok(vec![TensorType {
                            shape,
                            dtype: a.dtype,
                        }])
                    }
                    _ => err(format!(
                        "concat needs values of equal shapes but for the last axis, got {a} and {b}"
                    )),
                }
            }
            ElementwiseOp::SliceLast { start, len } => {
                let dy = &inputs[0];
                match dy.shape.split_last() {
                    Some((c, rest)) if start + len <= *c && *len > 0 => {
                        let mut shape = rest.to_vec();
                        shape.push(*len);
                        Ok(vec![TensorType {
                            shape,
                            dtype: dy.dtype,
                        }])
                    }
                    _ => err(format!(
                        "slice {start}..{} of the last axis out of range for {dy}",
                        start + len
                    )),
                }
            }
            ElementwiseOp::UnaryBwd(_) => {
                same(&inputs[0], &inputs[1], "saved, dy")?;
                Ok(vec![inputs[0].clone()])
            }
            ElementwiseOp::Softmax => {
                if !matches!(inputs[0].shape.last(), Some(c) if *c > 0) {
                    return err(format!(
                        "softmax needs a non-empty last axis, got {}",
                        inputs[0]
                    ));
                }
                Ok(vec![inputs[0].clone()])
            }
            ElementwiseOp::SoftmaxBwd => {
                same(&inputs[0], &inputs[1], "y, dy")?;
                if !matches!(inputs[0].shape.last(), Some(c) if *c > 0) {
                    return err(format!(
                        "softmax needs a non-empty last axis, got {}",
                        inputs[0]
                    ));
                }
                Ok(vec![inputs[0].clone()])
            }
            ElementwiseOp::AddInPlace | ElementwiseOp::UnaryBwdInPlace(_) => {
                same(&inputs[0], &inputs[1], "inputs")?;
                Ok(vec![inputs[0].clone()])
            }
        }
    }

    /// Every input and output streamed once in one parallel loop (the default), and an
    /// activation's formula per element ([`crate::cpu::Special`]).
    fn cpu_work(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> crate::cpu::CpuWork {
        use crate::cpu::Special;
        let elems: u64 = ins.iter().chain(outs).map(|s| numel(s)).sum();
        let w = crate::cpu::CpuWork::stream(elems * 4);
        let n = ins.first().map_or(0, |s| numel(s));
        match self {
            ElementwiseOp::Unary(k) | ElementwiseOp::UnaryInPlace(k) => {
                w.with_special(Special::Forward(*k), n)
            }
            ElementwiseOp::UnaryBwd(k) | ElementwiseOp::UnaryBwdInPlace(k) => {
                w.with_special(Special::Backward(*k), n)
            }
            _ => w,
        }
    }

    fn flops(&self, ins: &[Vec<usize>], _outs: &[Vec<usize>]) -> u64 {
        let i0 = ins.first().map(|s| numel(s)).unwrap_or(0);
        match self {
            ElementwiseOp::Unary(_)
            | ElementwiseOp::UnaryInPlace(_)
            | ElementwiseOp::Dropout { .. }
            | ElementwiseOp::DropoutInPlace { .. }
            | ElementwiseOp::DropoutBwd { .. }
            | ElementwiseOp::DropoutBwdInPlace { .. }
            | ElementwiseOp::Add
            | ElementwiseOp::Mul
            | ElementwiseOp::AddInPlace => i0,
            // copies: no arithmetic
            ElementwiseOp::Concat | ElementwiseOp::SliceLast { .. } => 0,
            ElementwiseOp::UnaryBwd(_) | ElementwiseOp::UnaryBwdInPlace(_) => 2 * i0,
            // max, subtract, exp, sum, divide; the backward: product, sum, subtract, product
            ElementwiseOp::Softmax => 5 * i0,
            ElementwiseOp::SoftmaxBwd => 4 * i0,
        }
    }
}
