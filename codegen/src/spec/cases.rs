//! What the op families' zoo cases (`zoo()` in each `spec/<family>.rs`, numbered by
//! [`crate::zoo::zoo`]) share: the case type and the update rules and fused-update shapes.

use dmc_plan::op::{ConvOp, DenseOp, Op, OptimOp, UpdateRule};

/// One zoo case: the op and one shape per signature parameter.
pub(crate) type Case = (Op, Vec<Vec<usize>>);

/// SGD with weight decay, `momentum` and `nesterov` as given.
pub(crate) fn sgd(momentum: f32, nesterov: bool) -> UpdateRule {
    UpdateRule::Sgd {
        lr: 0.01,
        momentum,
        weight_decay: 1e-4,
        nesterov,
        clip_value: None,
        clip_norm: None,
    }
}

/// Adam with weight decay, `decoupled` (AdamW) as given.
pub(crate) fn adam(decoupled: bool) -> UpdateRule {
    UpdateRule::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        decoupled,
        clip_value: None,
        clip_norm: None,
    }
}

/// RMSprop with weight decay and `momentum` as given (PyTorch's alpha and eps).
pub(crate) fn rmsprop(momentum: f32) -> UpdateRule {
    UpdateRule::RmsProp {
        lr: 1e-2,
        alpha: 0.99,
        eps: 1e-8,
        weight_decay: 1e-4,
        momentum,
        clip_value: None,
        clip_norm: None,
    }
}

/// Lion with weight decay (lion-pytorch's betas).
pub(crate) fn lion() -> UpdateRule {
    UpdateRule::Lion {
        lr: 1e-4,
        beta1: 0.9,
        beta2: 0.99,
        weight_decay: 0.1,
        clip_value: None,
        clip_norm: None,
    }
}

/// A weight gradient fused with its update: the signature's shapes are the inputs, then as many
/// state slots as the rule has (shaped as the updated tensor `upd`), then the workspaces per
/// [`Op::workspace_elems`].
pub(crate) fn fused(op: Op, ins: Vec<Vec<usize>>, upd: Vec<usize>) -> Case {
    let ns = match &op {
        Op::Conv(ConvOp::Conv2dBwdWeightUpdate { rule, .. })
        | Op::Dense(DenseOp::DenseBwdWeightUpdate { rule, .. })
        | Op::Optim(OptimOp::BiasGradUpdate { rule, .. }) => rule.state_names().len(),
        _ => 0,
    };
    let mut s = ins;
    s.push(upd.clone());
    s.extend(std::iter::repeat_n(upd, ns));
    let ws = op.workspace_elems(&s);
    s.extend(ws.into_iter().map(|n| vec![n]));
    (op, s)
}

/// A weight gradient fused with its update and the bias gradient (`bias`): as [`fused`], with the
/// bias `b` (and as many state slots as the rule has, shaped as `b`) after the weight's state,
/// then the old weights' output (`keep_old`).
pub(crate) fn fused_bias(op: Op, ins: Vec<Vec<usize>>, upd: Vec<usize>, b: Vec<usize>) -> Case {
    let (ns, keep_old) = match &op {
        Op::Conv(ConvOp::Conv2dBwdWeightUpdate { rule, keep_old, .. }) => {
            (rule.state_names().len(), *keep_old)
        }
        Op::Dense(DenseOp::DenseBwdWeightUpdate { rule, .. }) => (rule.state_names().len(), false),
        _ => (0, false),
    };
    let mut s = ins;
    s.extend(std::iter::repeat_n(upd.clone(), ns + 1));
    s.extend(std::iter::repeat_n(b, ns + 1));
    if keep_old {
        s.push(upd);
    }
    let ws = op.workspace_elems(&s);
    s.extend(ws.into_iter().map(|n| vec![n]));
    (op, s)
}
