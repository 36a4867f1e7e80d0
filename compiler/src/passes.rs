//! The pass pipeline. A pass is a named function `fn(&mut Graph, &Ctx) -> Result<bool, _>`
//! (returns whether it changed the graph) listed in [`PIPELINE`]; passes that do not apply to the
//! current mode return `Ok(false)`. [`run_pipeline`] verifies the graph before the first pass and
//! after every pass when `ctx.verify` is set, and reports which pass broke it.

use std::collections::BTreeSet;

use petgraph::stable_graph::NodeIndex;

use crate::autodiff::autodiff;
use crate::error::CompileError;
use crate::ir::Graph;
use crate::op::{Op, Optimizer};
use crate::optimizer::optimizer_update;
use crate::plan::Mode;
use crate::verify::verify;

/// What the passes may depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct Ctx {
    pub mode: Mode,
    pub optimizer: Optimizer,
    pub batch: usize,
    /// Run the IR verifier before and after every pass.
    pub verify: bool,
}

pub type Pass = fn(&mut Graph, &Ctx) -> Result<bool, CompileError>;

/// The pipeline, in order. Add passes here (in-place rewriting, fused weight-grad + update and
/// rematerialisation go between `optimizer_update` and `dead_code_elimination`).
pub const PIPELINE: &[(&str, Pass)] = &[
    // Predict: first, so that nothing is ever built on top of the loss or the targets.
    ("drop_loss", drop_loss),
    // Eval/Predict: dropout is the identity at inference; a view costs no kernel and no buffer.
    ("dropout_to_identity", dropout_to_identity),
    // Train: needs the complete forward graph and the loss; records every parameter's gradient.
    ("autodiff", autodiff),
    // Train: consumes the gradients recorded by autodiff; its updates are the roots of the step.
    ("optimizer_update", optimizer_update),
    // Last: removes whatever earlier passes orphaned (unused forward values, targets in predict).
    ("dead_code_elimination", dead_code_elimination),
];

/// Runs [`PIPELINE`] on `g`, verifying before and after each pass when `ctx.verify` is set.
pub fn run_pipeline(g: &mut Graph, ctx: &Ctx) -> Result<(), CompileError> {
    run_passes(g, ctx, PIPELINE)
}

/// Runs the given passes (a pipeline or a prefix of it), verifying as [`run_pipeline`] does.
pub fn run_passes(g: &mut Graph, ctx: &Ctx, passes: &[(&str, Pass)]) -> Result<(), CompileError> {
    if ctx.verify {
        verify(g, "lower")?;
    }
    for (name, pass) in passes {
        pass(g, ctx)?;
        if ctx.verify {
            verify(g, name)?;
        }
    }
    Ok(())
}

/// Pass (predict): removes the loss node; the targets then die in dead-code elimination.
pub fn drop_loss(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if ctx.mode != Mode::Predict {
        return Ok(false);
    }
    match g.loss.take() {
        Some((l, _)) => {
            g.g.remove_node(l);
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Pass (eval, predict): `Dropout` becomes `Reshape` to the same shape, i.e. the identity view.
pub fn dropout_to_identity(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if ctx.mode == Mode::Train {
        return Ok(false);
    }
    let mut changed = false;
    for n in g.nodes() {
        if let Some(node) = g.g.node_weight_mut(n) {
            if matches!(node.op, Op::Dropout { .. }) {
                node.op = Op::Reshape;
                changed = true;
            }
        }
    }
    Ok(changed)
}

/// Pass: removes every node nothing needed depends on. Roots: the updates, the loss and the
/// output. Parameters, optimizer state and the model inputs are kept (the runtime binds them);
/// targets are kept only while a loss reads them.
pub fn dead_code_elimination(g: &mut Graph, _ctx: &Ctx) -> Result<bool, CompileError> {
    let mut live: BTreeSet<NodeIndex> = BTreeSet::new();
    let mut stack: Vec<NodeIndex> = vec![g.output.0];
    stack.extend(g.loss.map(|l| l.0));
    stack.extend(
        g.g.node_indices()
            .filter(|n| matches!(g.node(*n).op, Op::SgdUpdate { .. } | Op::AdamUpdate { .. })),
    );
    stack.extend(g.params.iter().map(|(p, _)| *p));
    stack.extend(g.opt_state.iter().map(|(s, _, _)| *s));
    stack.extend(g.inputs.iter().copied());
    while let Some(n) = stack.pop() {
        if live.insert(n) {
            stack.extend(g.predecessors(n));
        }
    }
    let dead: Vec<NodeIndex> = g.g.node_indices().filter(|n| !live.contains(n)).collect();
    for n in &dead {
        g.g.remove_node(*n);
    }
    g.targets.retain(|t| live.contains(t));
    g.grads.retain(|_, d| live.contains(&d.0));
    Ok(!dead.is_empty())
}
