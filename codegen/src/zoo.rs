//! One small kernel of every op variant (and both flavours of the flags that change the generated
//! code), for tests that must cover every template arm, not only what the examples happen to use.
//! Each op family lists its own cases next to its code generation (`spec/<family>.rs`, `zoo()`);
//! this module numbers them and holds the helpers they share.

use dmc_plan::op::{ConvOp, DenseOp, Op, OptimOp, UpdateRule};
use dmc_plan::plan::Kernel;

use crate::spec;

/// One zoo case: the op and one shape per signature parameter.
pub(crate) type Case = (Op, Vec<Vec<usize>>);

fn k(id: usize, op: Op, arg_shapes: Vec<Vec<usize>>) -> Kernel {
    Kernel {
        id,
        name: format!("{}_{id}", op.kind_name()),
        signature: op.signature(),
        op,
        arg_shapes,
    }
}

/// Every kernel-bearing [`Op`] variant with small, odd shapes (tiles are partly filled).
pub fn zoo() -> Vec<Kernel> {
    [
        spec::conv::zoo(),
        spec::dense::zoo(),
        spec::pool::zoo(),
        spec::elementwise::zoo(),
        spec::loss::zoo(),
        spec::optim::zoo(),
    ]
    .concat()
    .into_iter()
    .enumerate()
    .map(|(i, (op, s))| k(i, op, s))
    .collect()
}

/// SGD with weight decay, `momentum` and `nesterov` as given.
pub(crate) fn sgd(momentum: f32, nesterov: bool) -> UpdateRule {
    UpdateRule::Sgd {
        lr: 0.01,
        momentum,
        weight_decay: 1e-4,
        nesterov,
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
    }
}

/// A weight gradient fused with its update: the signature's shapes are the inputs, then as many
/// state slots as the rule has (shaped as the updated tensor `upd`), then the workspaces per
/// [`Op::workspace_elems`].
pub(crate) fn fused(op: Op, ins: Vec<Vec<usize>>, upd: Vec<usize>) -> Case {
    let ns = match &op {
        Op::Conv(ConvOp::Conv2dBwdWeightUpdate { rule, .. })
        | Op::Dense(DenseOp::DenseBwdWeightUpdate { rule, .. })
        | Op::Optim(OptimOp::BiasGradUpdate { rule }) => rule.state_names().len(),
        _ => 0,
    };
    let mut s = ins;
    s.push(upd.clone());
    s.extend(std::iter::repeat_n(upd, ns));
    let ws = op.workspace_elems(&s);
    s.extend(ws.into_iter().map(|n| vec![n]));
    (op, s)
}
