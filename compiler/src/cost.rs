//! The cost model: floating-point operations per kernel, from its op and argument shapes.
//!
//! Used by the rematerialization pass (what a recomputation costs) and by the memory report (the
//! step's FLOPs and the share added by recomputation). A multiply-add counts as 2 FLOPs;
//! elementwise ops count one FLOP per element (per input read), so they are cheap next to
//! convolutions and matrix products — which is what makes recomputing them attractive.

use crate::ir::Graph;
use crate::op::{Op, Role, UpdateRule};
use crate::plan::Plan;
use petgraph::stable_graph::NodeIndex;

fn numel(s: &[usize]) -> u64 {
    s.iter().map(|d| *d as u64).product()
}

/// FLOPs of one launch of `op`, given the full shapes of its node inputs (`ins`, in slot order)
/// and of its outputs (`outs`).
pub fn flops(op: &Op, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> u64 {
    let i = |k: usize| ins.get(k).map(|s| numel(s)).unwrap_or(0);
    let o = |k: usize| outs.get(k).map(|s| numel(s)).unwrap_or(0);
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::OptState { .. } | Op::Reshape => 0,
        // y[N,Ho,Wo,Co] = sum over kh*kw*Ci: 2 per multiply-add.
        Op::Conv2d { geom, bias } => {
            let ci = ins.first().and_then(|x| x.get(3)).copied().unwrap_or(0) as u64;
            let k = (geom.kh * geom.kw) as u64 * ci;
            2 * o(0) * k + if *bias { o(0) } else { 0 }
        }
        Op::Dense { bias } => {
            let k = ins.first().and_then(|x| x.get(1)).copied().unwrap_or(0) as u64;
            2 * o(0) * k + if *bias { o(0) } else { 0 }
        }
        // dx[N,H,W,Ci] from dy and w: as many multiply-adds as the forward.
        Op::Conv2dBwdData { geom } => {
            let ci = ins.get(1).and_then(|w| w.get(2)).copied().unwrap_or(0) as u64;
            2 * i(0) * (geom.kh * geom.kw) as u64 * ci
        }
        Op::Conv2dBwdWeight { geom } | Op::Conv2dBwdWeightUpdate { geom, .. } => {
            // dw[kh,kw,Ci,Co] = sum over N*Ho*Wo.
            let ci = ins.first().and_then(|x| x.get(3)).copied().unwrap_or(0) as u64;
            let upd = if matches!(op, Op::Conv2dBwdWeightUpdate { .. }) {
                4 * i(2)
            } else {
                0
            };
            2 * i(1) * (geom.kh * geom.kw) as u64 * ci + upd
        }
        Op::DenseBwdData => {
            let k = ins.get(1).and_then(|w| w.first()).copied().unwrap_or(0) as u64;
            2 * i(0) * k
        }
        Op::DenseBwdWeight | Op::DenseBwdWeightUpdate { .. } => {
            let k = ins.first().and_then(|x| x.get(1)).copied().unwrap_or(0) as u64;
            let upd = if matches!(op, Op::DenseBwdWeightUpdate { .. }) {
                4 * i(2)
            } else {
                0
            };
            2 * i(1) * k + upd
        }
        Op::BiasGrad => i(0),
        Op::BiasGradUpdate { .. } => i(0) + 4 * i(1),
        Op::MaxPool { .. } | Op::AvgPool { .. } | Op::GlobalAvgPool => i(0),
        Op::MaxPoolBwd { .. } | Op::AvgPoolBwd { .. } | Op::GlobalAvgPoolBwd => o(0),
        Op::Unary(_) | Op::UnaryInPlace(_) | Op::Dropout { .. } | Op::DropoutInPlace { .. } => i(0),
        Op::Add | Op::AddInPlace => i(0),
        Op::UnaryBwd(_) | Op::UnaryBwdInPlace(_) => 2 * i(0),
        Op::DropoutBwd { .. } | Op::DropoutBwdInPlace { .. } => i(0),
        Op::MseLoss | Op::MseLossBwd => 3 * i(0),
        Op::CrossEntropyLoss | Op::CrossEntropyLossBwd => 4 * i(0),
        Op::Update {
            rule: UpdateRule::Sgd { .. },
        } => 4 * i(0),
        Op::Update {
            rule: UpdateRule::Adam { .. },
        } => 10 * i(0),
    }
}

/// FLOPs of node `n` of `g` (0 for leaves and views).
pub fn node_flops(g: &Graph, n: NodeIndex) -> u64 {
    let ins: Vec<Vec<usize>> = g.inputs(n).iter().map(|v| g.ty(*v).shape.clone()).collect();
    let outs: Vec<Vec<usize>> = g.node(n).outputs.iter().map(|t| t.shape.clone()).collect();
    flops(&g.node(n).op, &ins, &outs)
}

/// FLOPs of every kernel of `g`.
pub fn graph_flops(g: &Graph) -> u64 {
    g.nodes()
        .into_iter()
        .filter(|n| g.is_kernel(*n))
        .map(|n| node_flops(g, n))
        .sum()
}

/// FLOPs of step `s` of `plan`, from its kernel's op and argument shapes.
pub fn step_flops(plan: &Plan, s: usize) -> u64 {
    let Some(step) = plan.steps.get(s) else {
        return 0;
    };
    let Some(k) = plan.kernels.get(step.kernel) else {
        return 0;
    };
    let mut ins = vec![];
    let mut outs = vec![];
    for (p, shape) in k.signature.params.iter().zip(&k.arg_shapes) {
        match p.role {
            Role::In => ins.push(shape.clone()),
            Role::InOut => {
                ins.push(shape.clone());
                outs.push(shape.clone());
            }
            Role::Out => outs.push(shape.clone()),
            Role::Workspace => {}
        }
    }
    flops(&k.op, &ins, &outs)
}

/// Whether step label / node name `name` marks a recomputed forward node.
pub fn is_recompute(name: &str) -> bool {
    name.contains(" (recompute ")
}
