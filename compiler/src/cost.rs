//! The cost model: floating-point operations per kernel, from its op and argument shapes.
//!
//! Used by the rematerialization pass (what a recomputation costs) and by the memory report (the
//! step's FLOPs and the share added by recomputation). A multiply-add counts as 2 FLOPs;
//! elementwise ops count one FLOP per element (per input read), so they are cheap next to
//! convolutions and matrix products — which is what makes recomputing them attractive.

use crate::ir::Graph;
use crate::op::Op;
use crate::plan::Plan;
use petgraph::stable_graph::NodeIndex;

/// FLOPs of one launch of `op`, given the full shapes of its node inputs (`ins`, in slot order)
/// and of its outputs (`outs`): the op's own fact ([`Op::flops`], by family in dmc-plan).
pub fn flops(op: &Op, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> u64 {
    op.flops(ins, outs)
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
    plan.kernels.get(step.kernel).map(kernel_flops).unwrap_or(0)
}

/// FLOPs of one launch of kernel `k` (every step of the kernel costs this: [`step_flops`]).
pub fn kernel_flops(k: &crate::plan::Kernel) -> u64 {
    k.flops()
}

/// Whether step label / node name `name` marks a recomputed forward node.
pub fn is_recompute(name: &str) -> bool {
    name.contains(" (recompute ")
}
