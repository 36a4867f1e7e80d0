//! The loss family: the scalar loss of a batch and its gradient.

use serde::{Deserialize, Serialize};

use super::facts::{p, DType, OpFacts, ParamKind, Role, ShapeError, TensorType};
use super::shape::{err, numel, rank, same};

/// Every op carries the `weight` of its term of the loss (`loss 0.5 * mse(..) + ..`): the forward
/// computes `weight * loss`, the backward `weight * dloss/dpred`; 1 (absent in the JSON) when the
/// term has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LossOp {
    /// pred\[N,..\], target\[N,..\] -> loss\[1\] = mean((pred - target)^2)
    MseLoss {
        #[serde(default = "unit", skip_serializing_if = "is_unit")]
        weight: f32,
    },
    /// pred, target -> dpred = 2 (pred - target) / numel
    MseLossBwd {
        #[serde(default = "unit", skip_serializing_if = "is_unit")]
        weight: f32,
    },
    /// logits\[N,C\], labels i32\[N\] -> loss\[1\] = mean_n(logsumexp(logits_n) - (1-e) logits_n\[label_n\]
    /// minus e/C sum_j logits_n\[j\]), `e` = `label_smoothing` (PyTorch's: the target is
    /// (1-e) onehot + e/C), 0 for the plain cross-entropy.
    CrossEntropyLoss {
        label_smoothing: f32,
        #[serde(default = "unit", skip_serializing_if = "is_unit")]
        weight: f32,
    },
    /// logits\[N,C\], labels i32\[N\] -> dlogits = (softmax(logits) - (1-e) onehot(label) - e/C) / N
    CrossEntropyLossBwd {
        label_smoothing: f32,
        #[serde(default = "unit", skip_serializing_if = "is_unit")]
        weight: f32,
    },
    /// pred\[N,..\], target\[N,..\] -> loss\[1\] = mean|pred - target| (PyTorch's `L1Loss`)
    MaeLoss {
        #[serde(default = "unit", skip_serializing_if = "is_unit")]
        weight: f32,
    },
    /// pred, target -> dpred = sign(pred - target) / numel (0 where they are equal)
    MaeLossBwd {
        #[serde(default = "unit", skip_serializing_if = "is_unit")]
        weight: f32,
    },
    /// pred, target -> loss\[1\] = mean(|d| <= delta ? d^2/2 : delta (|d| - delta/2)), d = pred -
    /// target (PyTorch's `HuberLoss(delta)`)
    HuberLoss {
        delta: f32,
        #[serde(default = "unit", skip_serializing_if = "is_unit")]
        weight: f32,
    },
    /// pred, target -> dpred = clamp(d, -delta, delta) / numel
    HuberLossBwd {
        delta: f32,
        #[serde(default = "unit", skip_serializing_if = "is_unit")]
        weight: f32,
    },
    /// logits\[N,..\], target\[N,..\] (probabilities in \[0, 1\], same shape) -> loss\[1\] =
    /// mean(max(x, 0) - x t + ln(1 + e^-|x|)) (PyTorch's `BCEWithLogitsLoss`, stable)
    BceWithLogitsLoss {
        #[serde(default = "unit", skip_serializing_if = "is_unit")]
        weight: f32,
    },
    /// logits, target -> dlogits = (sigmoid(x) - t) / numel
    BceWithLogitsLossBwd {
        #[serde(default = "unit", skip_serializing_if = "is_unit")]
        weight: f32,
    },
}

impl LossOp {
    /// The weight of the op's loss term (1 for a loss without weights).
    pub fn weight(&self) -> f32 {
        match self {
            LossOp::MseLoss { weight }
            | LossOp::MseLossBwd { weight }
            | LossOp::CrossEntropyLoss { weight, .. }
            | LossOp::CrossEntropyLossBwd { weight, .. }
            | LossOp::MaeLoss { weight }
            | LossOp::MaeLossBwd { weight }
            | LossOp::HuberLoss { weight, .. }
            | LossOp::HuberLossBwd { weight, .. }
            | LossOp::BceWithLogitsLoss { weight }
            | LossOp::BceWithLogitsLossBwd { weight } => *weight,
        }
    }

    /// The backward of a loss (its gradient with respect to the prediction, with the same
    /// weight and options); `None` for a backward.
    pub fn backward(&self) -> Option<LossOp> {
        Some(match *self {
            LossOp::MseLoss { weight } => LossOp::MseLossBwd { weight },
            LossOp::MaeLoss { weight } => LossOp::MaeLossBwd { weight },
            LossOp::HuberLoss { delta, weight } => LossOp::HuberLossBwd { delta, weight },
            LossOp::BceWithLogitsLoss { weight } => LossOp::BceWithLogitsLossBwd { weight },
            LossOp::CrossEntropyLoss {
                label_smoothing,
                weight,
            } => LossOp::CrossEntropyLossBwd {
                label_smoothing,
                weight,
            },
            LossOp::MseLossBwd { .. }
            | LossOp::MaeLossBwd { .. }
            | LossOp::HuberLossBwd { .. }
            | LossOp::BceWithLogitsLossBwd { .. }
            | LossOp::CrossEntropyLossBwd { .. } => return None,
        })
    }

    /// Whether the op compares a prediction with a float target of its shape (mse, mae, huber,
    /// bce_with_logits; cross-entropy takes class labels).
    pub fn elementwise_target(&self) -> bool {
        !matches!(
            self,
            LossOp::CrossEntropyLoss { .. } | LossOp::CrossEntropyLossBwd { .. }
        )
    }

    /// Whether the op is a backward (the gradient of the prediction) rather than the loss.
    pub fn is_backward(&self) -> bool {
        match self {
            LossOp::MseLoss { .. }
            | LossOp::CrossEntropyLoss { .. }
            | LossOp::MaeLoss { .. }
            | LossOp::HuberLoss { .. }
            | LossOp::BceWithLogitsLoss { .. } => false,
            LossOp::MseLossBwd { .. }
            | LossOp::CrossEntropyLossBwd { .. }
            | LossOp::MaeLossBwd { .. }
            | LossOp::HuberLossBwd { .. }
            | LossOp::BceWithLogitsLossBwd { .. } => true,
        }
    }
}

impl OpFacts for LossOp {
    fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        match self {
            LossOp::MseLoss { .. } | LossOp::MaeLoss { .. } | LossOp::HuberLoss { .. } => vec![
                p("pred", In, F32),
                p("target", In, F32),
                p("loss", Out, F32),
            ],
            LossOp::MseLossBwd { .. } | LossOp::MaeLossBwd { .. } | LossOp::HuberLossBwd { .. } => {
                vec![
                    p("pred", In, F32),
                    p("target", In, F32),
                    p("dpred", Out, F32),
                ]
            }
            LossOp::CrossEntropyLoss { .. } => vec![
                p("logits", In, F32),
                p("labels", In, I32),
                p("loss", Out, F32),
            ],
            LossOp::CrossEntropyLossBwd { .. } => vec![
                p("logits", In, F32),
                p("labels", In, I32),
                p("dlogits", Out, F32),
            ],
            LossOp::BceWithLogitsLoss { .. } => vec![
                p("logits", In, F32),
                p("target", In, F32),
                p("loss", Out, F32),
            ],
            LossOp::BceWithLogitsLossBwd { .. } => vec![
                p("logits", In, F32),
                p("target", In, F32),
                p("dlogits", Out, F32),
            ],
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            LossOp::MseLoss { .. } => "mse_loss",
            LossOp::MseLossBwd { .. } => "mse_loss_bwd",
            LossOp::CrossEntropyLoss { .. } => "cross_entropy_loss",
            LossOp::CrossEntropyLossBwd { .. } => "cross_entropy_loss_bwd",
            LossOp::MaeLoss { .. } => "mae_loss",
            LossOp::MaeLossBwd { .. } => "mae_loss_bwd",
            LossOp::HuberLoss { .. } => "huber_loss",
            LossOp::HuberLossBwd { .. } => "huber_loss_bwd",
            LossOp::BceWithLogitsLoss { .. } => "bce_with_logits_loss",
            LossOp::BceWithLogitsLossBwd { .. } => "bce_with_logits_loss_bwd",
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
            LossOp::MseLoss { .. }
            | LossOp::MseLossBwd { .. }
            | LossOp::MaeLoss { .. }
            | LossOp::MaeLossBwd { .. }
            | LossOp::HuberLoss { .. }
            | LossOp::HuberLossBwd { .. }
            | LossOp::BceWithLogitsLoss { .. }
            | LossOp::BceWithLogitsLossBwd { .. } => {
                same(&inputs[0], &inputs[1], "pred, target")?;
                if inputs[0].numel() == 0 {
                    return err(format!("empty prediction {}", inputs[0]));
                }
                Ok(vec![if self.is_backward() {
                    inputs[0].clone()
                } else {
                    f(vec![1])
                }])
            }
            LossOp::CrossEntropyLoss { .. } | LossOp::CrossEntropyLossBwd { .. } => {
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
                Ok(vec![if self.is_backward() {
                    l.clone()
                } else {
                    f(vec![1])
                }])
            }
        }
    }

    /// Every input and output streamed once; a cross-entropy's logits each cost their softmax
    /// ([`crate::cpu::Special::CrossEntropy`], measured whole).
    fn cpu_work(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> crate::cpu::CpuWork {
        let elems: u64 = ins.iter().chain(outs).map(|s| numel(s)).sum();
        let logits = ins.first().map_or(0, |s| numel(s));
        let w = crate::cpu::CpuWork::stream(elems * 4);
        match self {
            LossOp::CrossEntropyLoss { .. } => {
                w.with_special(crate::cpu::Special::CrossEntropy, logits)
            }
            LossOp::CrossEntropyLossBwd { .. } => {
                w.with_special(crate::cpu::Special::CrossEntropyBwd, logits)
            }
            _ => w,
        }
    }

    fn flops(&self, ins: &[Vec<usize>], _outs: &[Vec<usize>]) -> u64 {
        let i0 = ins.first().map(|s| numel(s)).unwrap_or(0);
        match self {
            LossOp::MseLoss { .. }
            | LossOp::MseLossBwd { .. }
            | LossOp::MaeLoss { .. }
            | LossOp::MaeLossBwd { .. } => 3 * i0,
            LossOp::HuberLoss { .. } | LossOp::HuberLossBwd { .. } => 4 * i0,
            LossOp::CrossEntropyLoss { .. } | LossOp::CrossEntropyLossBwd { .. } => 4 * i0,
            // max, product, exp, log1p (or sigmoid), sums
            LossOp::BceWithLogitsLoss { .. } | LossOp::BceWithLogitsLossBwd { .. } => 6 * i0,
        }
    }
}

fn unit() -> f32 {
    1.0
}

fn is_unit(w: &f32) -> bool {
    *w == 1.0
}
