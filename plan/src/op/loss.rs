//! The loss family: the scalar loss of a batch and its gradient.

use serde::{Deserialize, Serialize};

use super::facts::{p, DType, OpFacts, ParamKind, Role, ShapeError, TensorType};
use super::shape::{err, numel, rank, same};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LossOp {
    /// pred[N,..], target[N,..] -> loss[1] = mean((pred - target)^2)
    MseLoss,
    /// pred, target -> dpred = 2 (pred - target) / numel
    MseLossBwd,
    /// logits[N,C], labels i32[N] -> loss[1] = mean_n(logsumexp(logits_n) - logits_n[label_n])
    CrossEntropyLoss,
    /// logits[N,C], labels i32[N] -> dlogits = (softmax(logits) - onehot(label)) / N
    CrossEntropyLossBwd,
}

impl OpFacts for LossOp {
    fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        match self {
            LossOp::MseLoss => vec![
                p("pred", In, F32),
                p("target", In, F32),
                p("loss", Out, F32),
            ],
            LossOp::MseLossBwd => vec![
                p("pred", In, F32),
                p("target", In, F32),
                p("dpred", Out, F32),
            ],
            LossOp::CrossEntropyLoss => vec![
                p("logits", In, F32),
                p("labels", In, I32),
                p("loss", Out, F32),
            ],
            LossOp::CrossEntropyLossBwd => vec![
                p("logits", In, F32),
                p("labels", In, I32),
                p("dlogits", Out, F32),
            ],
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            LossOp::MseLoss => "mse_loss",
            LossOp::MseLossBwd => "mse_loss_bwd",
            LossOp::CrossEntropyLoss => "cross_entropy_loss",
            LossOp::CrossEntropyLossBwd => "cross_entropy_loss_bwd",
        }
    }

    fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        vec![]
    }

    fn workspace_elems(&self, _shapes: &[Vec<usize>]) -> Vec<usize> {
        vec![]
    }

    fn infer(
        &self,
        inputs: &[TensorType],
        _hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError> {
        let f = TensorType::f32;
        match self {
            LossOp::MseLoss | LossOp::MseLossBwd => {
                same(&inputs[0], &inputs[1], "pred, target")?;
                if inputs[0].numel() == 0 {
                    return err(format!("empty prediction {}", inputs[0]));
                }
                Ok(vec![if matches!(self, LossOp::MseLoss) {
                    f(vec![1])
                } else {
                    inputs[0].clone()
                }])
            }
            LossOp::CrossEntropyLoss | LossOp::CrossEntropyLossBwd => {
                let (l, y) = (&inputs[0], &inputs[1]);
                rank(l, 2, "logits")?;
                if y.shape != [l.shape[0]] {
                    return err(format!(
                        "labels {y} must be [{}] for logits {l}",
                        l.shape[0]
                    ));
                }
                if l.numel() == 0 {
                    return err(format!("empty logits {l}"));
                }
                Ok(vec![if matches!(self, LossOp::CrossEntropyLoss) {
                    f(vec![1])
                } else {
                    l.clone()
                }])
            }
        }
    }

    fn flops(&self, ins: &[Vec<usize>], _outs: &[Vec<usize>]) -> u64 {
        let i0 = ins.first().map(|s| numel(s)).unwrap_or(0);
        match self {
            LossOp::MseLoss | LossOp::MseLossBwd => 3 * i0,
            LossOp::CrossEntropyLoss | LossOp::CrossEntropyLossBwd => 4 * i0,
        }
    }
}
