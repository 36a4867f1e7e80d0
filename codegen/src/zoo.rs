//! One small kernel of every op variant (and both flavours of the flags that change the generated
//! code), for tests that must cover every template arm, not only what the examples happen to use.
//! Each op family lists its own cases next to its code generation (`spec/<family>.rs`, `zoo()`,
//! with the helpers of `spec/cases.rs`); this module numbers them.

use dmc_plan::op::{Op, Role};
use dmc_plan::plan::Kernel;

use crate::spec;

fn k(id: usize, op: Op, mut arg_shapes: Vec<Vec<usize>>) -> Kernel {
    // the workspaces as the planner sizes them (`Op::workspace_elems`: a GPU split-K's partial
    // sums included), a case's trailing ones filled in
    let sizes = op.workspace_elems(&arg_shapes);
    let slots = op.signature().params.into_iter().enumerate();
    let ws = slots
        .filter(|(_, p)| p.role == Role::Workspace)
        .map(|(i, _)| i);
    for (i, n) in ws.zip(sizes) {
        match arg_shapes.get_mut(i) {
            Some(s) => *s = vec![n],
            None => arg_shapes.push(vec![n]),
        }
    }
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
        spec::norm::zoo(),
        spec::seq::zoo(),
    ]
    .concat()
    .into_iter()
    .enumerate()
    .map(|(i, (op, s))| k(i, op, s))
    .collect()
}

/// Whether a GEMM op's outputs are its sums plus bias and residual adds alone (no activation, no
/// update): on inputs that TF32 holds exactly and whose sums fp32 holds exactly (a grid of 1/8), a
/// TF32 kernel of it must give the CPU backend's fp32 bits in any order, on any device.
pub fn exact_on_a_grid(op: &Op) -> bool {
    use dmc_plan::op::{ConvOp, DenseOp};
    match op {
        Op::Conv(ConvOp::Conv2d { epi, .. } | ConvOp::Conv2dBwdData { epi, .. })
        | Op::Dense(DenseOp::Dense { epi, .. } | DenseOp::DenseBwdData { epi }) => {
            epi.act.is_none()
        }
        Op::Conv(ConvOp::Conv2dBwdWeight { .. }) | Op::Dense(DenseOp::DenseBwdWeight) => true,
        _ => false,
    }
}

/// The zoo's GEMM kernels (convolutions and dense layers: every GEMM template arm), for tests that
/// force each tile on them.
pub fn gemms() -> Vec<Kernel> {
    let opts = crate::CodegenOptions::default();
    zoo()
        .into_iter()
        .filter(|k| {
            crate::render_kernel(k, dmc_plan::plan::Mode::Train, &opts)
                .ok()
                .flatten()
                .is_some_and(|c| c.gemm.is_some())
        })
        .collect()
}
