//! The pass pipeline. A pass is a named function `fn(&mut Graph, &Ctx) -> Result<bool, _>`
//! (returns whether it changed the graph) listed, with a line on why it sits where it does, in
//! one of two named sub-pipelines: [`BUILD_STEP`] (the step's computation: mode rewrites,
//! autodiff, optimizer updates, fusion, dead code) and [`MEMORY`] (rematerialization and in
//! place, on the built step). [`PIPELINE`] is the two in order. Passes that do not apply to the
//! current mode return `Ok(false)`. When `ctx.verify` is set, [`run_pipeline`] verifies the graph
//! in checked builds ([`crate::options::CHECKED_BUILD`]: debug builds and the tests) before the
//! first pass and after every pass, naming the pass that broke it; other builds verify it once,
//! after the passes, naming lowering and the passes that changed the graph (a checked build then
//! finds the one). The verifier is linear, but on a network
//! of 100,000 layers each run of it is ~4% of a compile, and the plan checker checks the result of
//! every compile independently.

use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::alias::BufferRoots;
use crate::autodiff::autodiff;
use crate::ctx::Ctx;
use crate::data_parallel::{rank_batchnorm, shard_optimizer_state};
use crate::error::CompileError;
use crate::fuse::fuse_epilogues;
use crate::ir::Edge;
use crate::ir::{Graph, Phase, Value};
use crate::op::{ConvOp, DenseOp, ElementwiseOp, NormOp, Op, OptimOp, PoolOp, UpdateRule};
use crate::optimizer::optimizer_update;
use crate::plan::Mode;
use crate::remat::rematerialize;
use crate::schedule::view_closure;
use crate::verify::verify;

pub type Pass = fn(&mut Graph, &Ctx) -> Result<bool, CompileError>;

/// A sub-pipeline: named passes, in order.
pub type Pipeline = &'static [(&'static str, Pass)];

/// Builds the step's computation. Its result is what rematerialization analyses (the chain of
/// forward stages, see [`crate::remat::chain`]).
pub const BUILD_STEP: Pipeline = &[
    // Predict: first, so that nothing is ever built on top of the loss or the targets.
    ("drop_loss", drop_loss),
    // Eval/Predict: dropout is the identity at inference; a view costs no kernel and no buffer.
    ("dropout_to_identity", dropout_to_identity),
    // Eval/Predict: batchnorm reads its running statistics; before dead code elimination, which
    // would keep the running statistics' update (a root).
    ("batchnorm_to_inference", batchnorm_to_inference),
    // Train: needs the complete forward graph and the loss; records every parameter's gradient.
    ("autodiff", autodiff),
    // Train: consumes the gradients recorded by autodiff; its updates are the roots of the step.
    ("optimizer_update", optimizer_update),
    // Train: needs each (weight-gradient -> update) pair, so after the optimizer pass; the fused
    // op replaces both, so no whole-layer gradient survives into scheduling.
    ("fuse_weight_update", fuse_weight_update),
    // Train, data parallel: after the updates are fused (the fused ones shard their state by the
    // rows of the [K, C] weight, the others by elements); each rank keeps 1/ranks of the state.
    ("shard_optimizer_state", shard_optimizer_state),
    // Train, data parallel: after autodiff made the backward; batchnorm's statistics are the
    // whole batch's, so its ops get the workspace the GPU's collectives sum into.
    ("rank_batchnorm", rank_batchnorm),
    // Removes whatever earlier passes orphaned (unused forward values, targets in predict), so
    // that the consumer counts the in-place pass relies on are final.
    ("dead_code_elimination", dead_code_elimination),
];

/// Decides memory on the built step.
pub const MEMORY: Pipeline = &[
    // Train: on the final forward/backward structure (after fusion: fused updates read forward
    // inputs, which it may rewire to recomputed copies), before in place, so that the in-place
    // rule sees the recomputed copies' consumers; nothing after it merges nodes.
    ("rematerialize", rematerialize),
    // After rematerialization (its stage analysis sees one node per layer op, and its recomputed
    // copies are fused like the originals), before in place (fusion removes the elementwise ops
    // in-place rewriting would apply to, and changes who reads what): elementwise work into the
    // GEMM that produces its input, the bias gradient into the weight gradient's kernel.
    ("fuse_epilogues", fuse_epilogues),
    // Last: decides in place on the final graph by the rule "the input's only consumer is this
    // op" (schedule-independent); nothing after it adds a reader.
    ("inplace_elementwise", inplace_elementwise),
];

/// The whole pipeline: its sub-pipelines, in order.
pub const PIPELINE: &[Pipeline] = &[BUILD_STEP, MEMORY];

/// Runs [`PIPELINE`] on `g`, verifying as the module documentation says when `ctx.verify` is set.
pub fn run_pipeline(g: &mut Graph, ctx: &Ctx) -> Result<(), CompileError> {
    run_pipelines(g, ctx, PIPELINE)
}

/// Runs the given passes (e.g. one sub-pipeline), verifying as [`run_pipeline`] does.
pub fn run_passes(g: &mut Graph, ctx: &Ctx, passes: &[(&str, Pass)]) -> Result<(), CompileError> {
    run_pipelines(g, ctx, &[passes])
}

/// Runs the given sub-pipelines in order, verifying as [`run_pipeline`] does.
pub fn run_pipelines(
    g: &mut Graph,
    ctx: &Ctx,
    pipelines: &[&[(&str, Pass)]],
) -> Result<(), CompileError> {
    run_pipelines_then(g, ctx, pipelines, |_| Ok(()))
}

/// [`run_pipeline`], then `next` on the resulting graph (e.g. the scheduler). In unchecked builds
/// (not [`crate::options::CHECKED_BUILD`]) the one verification after the passes runs on a second
/// thread while `next` runs: both only read the graph. A verification error wins over `next`'s result, as if it had run first (and a
/// panic of `next` on a graph the verifier rejects gives the verifier's error).
pub fn run_pipeline_then<T: Send>(
    g: &mut Graph,
    ctx: &Ctx,
    next: impl FnOnce(&Graph) -> Result<T, CompileError>,
) -> Result<T, CompileError> {
    run_pipelines_then(g, ctx, PIPELINE, next)
}

fn run_pipelines_then<T: Send>(
    g: &mut Graph,
    ctx: &Ctx,
    pipelines: &[&[(&str, Pass)]],
    next: impl FnOnce(&Graph) -> Result<T, CompileError>,
) -> Result<T, CompileError> {
    let each = crate::options::CHECKED_BUILD;
    if ctx.verify && each {
        verify(g, "lower")?;
    }
    // What produced the graph since it was last verified.
    let mut unverified: Vec<&str> = vec!["lower"];
    for (name, pass) in pipelines.iter().flat_map(|p| p.iter()) {
        let changed = pass(g, ctx)?;
        // Debug and test builds verify after every pass, which also catches a pass that changed
        // the graph without saying so.
        if ctx.verify && each {
            verify(g, name)?;
        } else if changed {
            unverified.push(name);
        }
    }
    if !ctx.verify || each {
        return next(g);
    }
    let g: &Graph = g;
    let passes = unverified.join(", ");
    std::thread::scope(|s| {
        let verified = s.spawn(|| verify(g, &passes).map_err(CompileError::from));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| next(g)));
        let verified = verified
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        verified?;
        result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Pass (predict): removes the loss nodes (every term, their sum, the targets' reshapes); the
/// targets then die in dead-code elimination.
pub fn drop_loss(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if ctx.mode != Mode::Predict || g.loss.take().is_none() {
        return Ok(false);
    }
    let loss_nodes: Vec<NodeIndex> =
        g.g.node_indices()
            .filter(|n| g.node(*n).phase == Phase::Loss && !g.node(*n).op.is_leaf())
            .collect();
    for n in loss_nodes {
        g.g.remove_node(n);
    }
    Ok(true)
}

/// Pass (eval, predict): `Dropout` becomes `Reshape` to the same shape, i.e. the identity view.
pub fn dropout_to_identity(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if ctx.mode == Mode::Train {
        return Ok(false);
    }
    let mut changed = false;
    for n in g.nodes() {
        if let Some(node) = g.g.node_weight_mut(n) {
            if matches!(node.op, Op::Elementwise(ElementwiseOp::Dropout { .. })) {
                node.op = Op::Reshape;
                changed = true;
            }
        }
    }
    Ok(changed)
}

/// Pass (eval, predict): each training batchnorm (batch statistics) and the update of its running
/// statistics become one `BatchNormInfer`, which normalises with the running statistics.
pub fn batchnorm_to_inference(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if ctx.mode == Mode::Train {
        return Ok(false);
    }
    let mut changed = false;
    for u in g.nodes() {
        if !matches!(g.node(u).op, Op::Norm(NormOp::BatchNormStats { .. })) {
            continue;
        }
        let ins = g.inputs(u);
        let [rm, rv, mean, _] = ins[..] else {
            return Err(CompileError::Internal(format!(
                "`{}`: a running statistics' update with {} inputs",
                g.node(u).name,
                ins.len()
            )));
        };
        let bn = mean.0;
        let Op::Norm(NormOp::BatchNorm { eps, .. }) = g.node(bn).op else {
            return Err(CompileError::Internal(format!(
                "`{}` does not update from a batchnorm",
                g.node(u).name
            )));
        };
        g.g.remove_node(u);
        if let Some(node) = g.g.node_weight_mut(bn) {
            node.op = Op::Norm(NormOp::BatchNormInfer { eps });
            node.outputs.truncate(1);
        }
        for (slot, v) in [(3, rm), (4, rv)] {
            g.g.add_edge(
                v.0,
                bn,
                Edge {
                    src_output: v.1,
                    dst_input: slot,
                },
            );
        }
        changed = true;
    }
    Ok(changed)
}

/// Pass: removes every node nothing needed depends on. Roots: the updates, the loss and the
/// output. Parameters, optimizer state and the model inputs are kept (the runtime binds them);
/// targets are kept only while a loss reads them.
pub fn dead_code_elimination(g: &mut Graph, _ctx: &Ctx) -> Result<bool, CompileError> {
    let mut live = vec![false; g.node_bound()];
    let mut stack: Vec<NodeIndex> = vec![g.output.0];
    stack.extend(g.loss.map(|l| l.0));
    stack.extend(g.g.node_indices().filter(|n| g.node(*n).op.is_update()));
    stack.extend(g.params.iter().map(|(p, _)| *p));
    stack.extend(g.opt_state.iter().map(|(s, _, _)| *s));
    stack.extend(g.inputs.iter().copied());
    while let Some(n) = stack.pop() {
        if !std::mem::replace(&mut live[n.index()], true) {
            stack.extend(
                g.g.edges_directed(n, Direction::Incoming)
                    .map(|e| e.source()),
            );
        }
    }
    let live = |n: &NodeIndex| live.get(n.index()).copied().unwrap_or(false);
    let dead: Vec<NodeIndex> = g.g.node_indices().filter(|n| !live(n)).collect();
    for n in &dead {
        g.g.remove_node(*n);
    }
    g.targets.retain(|t| live(t));
    g.grads.retain(|_, d| live(&d.0));
    Ok(!dead.is_empty())
}

/// Pass (train, `ctx.fuse`): every optimizer update whose gradient comes from a
/// `Conv2dBwdWeight`, `DenseBwdWeight` or `BiasGrad` read by nothing else becomes one fused op
/// (`Conv2dBwdWeightUpdate`, `DenseBwdWeightUpdate`, `BiasGradUpdate`) reading the gradient's
/// inputs, the parameter and its state. The chunk starts at the whole layer; `compile` shrinks it.
pub fn fuse_weight_update(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if ctx.mode != Mode::Train || !ctx.fuse {
        return Ok(false);
    }
    let mut changed = false;
    // Which parameters each gradient value is recorded for (to drop the records of a fused
    // gradient without scanning them all).
    // (gradient, parameter), sorted: one vector, not a vector per gradient in a hash map.
    let mut grad_of: Vec<(Value, NodeIndex)> = g.grads.iter().map(|(p, d)| (*d, *p)).collect();
    grad_of.sort_unstable();
    for u in g.nodes() {
        let Some(rule) = UpdateRule::of(&g.node(u).op) else {
            continue;
        };
        let ins = g.inputs(u);
        let Some(&grad) = ins.get(1) else { continue };
        // The gradient's only consumer is the update (slot 1).
        let mut readers =
            g.g.edges_directed(grad.0, Direction::Outgoing)
                .filter(|e| e.weight().src_output == grad.1);
        let only_update = matches!(
            (readers.next(), readers.next()),
            (Some(e), None) if e.target() == u && e.weight().dst_input == 1
        );
        if !only_update || grad.1 != 0 {
            continue;
        }
        let gins = g.inputs(grad.0);
        let state: Vec<Value> = ins[2..].to_vec();
        let (op, mut new_ins) = match &g.node(grad.0).op {
            Op::Conv(ConvOp::Conv2dBwdWeight { geom }) => {
                let co = g.ty(ins[0]).shape[3];
                (
                    Op::Conv(ConvOp::Conv2dBwdWeightUpdate {
                        shards: 1,
                        keep_rows: false,
                        geom: *geom,
                        rule,
                        chunk: co,
                        bias: false,
                        keep_old: false,
                    }),
                    vec![gins[0], gins[1], ins[0]],
                )
            }
            Op::Dense(DenseOp::DenseBwdWeight) => {
                let m = g.ty(ins[0]).shape[1];
                (
                    Op::Dense(DenseOp::DenseBwdWeightUpdate {
                        shards: 1,
                        keep_rows: false,
                        rule,
                        chunk: m,
                        bias: false,
                    }),
                    vec![gins[0], gins[1], ins[0]],
                )
            }
            Op::Optim(OptimOp::BiasGrad) => (
                Op::Optim(OptimOp::BiasGradUpdate {
                    shards: 1,
                    keep_rows: false,
                    rule,
                }),
                vec![gins[0], ins[0]],
            ),
            _ => continue,
        };
        new_ins.extend(state);
        let name = g.node(u).name.clone();
        let f = g.add_node(op, &new_ins, name, Phase::Update, None)?;
        // Readers of the update's outputs (none today) read the fused op's, same order.
        let outs: Vec<(Value, Vec<(NodeIndex, usize)>)> = (0..g.node(u).outputs.len())
            .map(|o| ((u, o), g.consumers((u, o))))
            .collect();
        for ((_, o), cs) in outs {
            for (c, slot) in cs {
                g.g.add_edge(
                    f,
                    c,
                    crate::ir::Edge {
                        src_output: o,
                        dst_input: slot,
                    },
                );
            }
        }
        g.g.remove_node(u);
        g.g.remove_node(grad.0);
        let first = grad_of.partition_point(|(d, _)| *d < grad);
        for &(_, p) in grad_of[first..].iter().take_while(|(d, _)| *d == grad) {
            g.grads.remove(&p);
        }
        changed = true;
    }
    Ok(changed)
}

/// Whether node `n` may overwrite its input value `v` in place: `v`'s buffer is made by a kernel
/// (not a leaf), neither `v` nor any view of it is the loss or the output, nothing but `n` reads
/// `v` or a view of it, and no other input of `n` lives in the same buffer. `roots` are the
/// buffer roots of `g` as it is now.
///
/// With `first`, other readers are allowed too where `first` says they always run before `n`
/// (`first[c]`: `c` is an ancestor of the output and `n` a descendant of it).
fn dies_after(
    g: &Graph,
    roots: &mut BufferRoots,
    n: NodeIndex,
    v: Value,
    first: Option<&[bool]>,
) -> bool {
    let root = roots.root(v);
    if g.node(root.0).op.is_leaf() {
        return false;
    }
    let runs_before =
        |c: NodeIndex| first.is_some_and(|f| f.get(c.index()).copied().unwrap_or(false));
    for w in view_closure(g, v) {
        if w == g.output || Some(w) == g.loss {
            return false;
        }
        if g.consumers(w)
            .iter()
            .any(|(c, _)| *c != n && !matches!(g.node(*c).op, Op::Reshape) && !runs_before(*c))
        {
            return false;
        }
    }
    let same_buffer = g
        .inputs(n)
        .iter()
        .filter(|u| roots.root(**u) == root)
        .count();
    same_buffer == 1
}

/// Pass (`ctx.inplace`): elementwise ops (activations, add, dropout, their backward ops, gradient
/// accumulation) write into an input that dies there: `Unary`/`Dropout`/`DropoutBwd` into x/dy,
/// `UnaryBwd` into dy, `Add` into whichever operand dies (swapped into slot 0; a + b == b + a
/// exactly), the fused `GlobalAvgPoolBwdAct` into its saved value, batchnorm's backward into dy
/// (its dx output comes first, so the aliasing is output 0 into slot 0). The written input becomes
/// `InOut` in the kernel signature: one buffer.
pub fn inplace_elementwise(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if !ctx.inplace {
        return Ok(false);
    }
    let mut changed = false;
    // Kept up to date as ops become in place (their output then lives in the written input), so
    // later decisions see the same buffers `Graph::buffer_root` would, without walking chains.
    let mut roots = BufferRoots::new(g);
    // For the folded pool backward (which reads the value the forward pool read): the nodes that
    // always run before it, when it descends from the output (every backward node does).
    let gap = g
        .nodes()
        .into_iter()
        .any(|n| matches!(g.node(n).op, Op::Pool(PoolOp::GlobalAvgPoolBwdAct(_))));
    let (before_out, after_out) = if gap {
        let o = g.output.0;
        (
            crate::fuse::reach(g, o, Direction::Incoming),
            crate::fuse::reach(g, o, Direction::Outgoing),
        )
    } else {
        (vec![], vec![])
    };
    for n in g.nodes() {
        let op = g.node(n).op.clone();
        let (new, slots): (Op, &[usize]) = match op {
            Op::Elementwise(ElementwiseOp::Unary(k)) => {
                (Op::Elementwise(ElementwiseOp::UnaryInPlace(k)), &[0])
            }
            Op::Elementwise(ElementwiseOp::Dropout { p, salt }) => (
                Op::Elementwise(ElementwiseOp::DropoutInPlace { p, salt }),
                &[0],
            ),
            Op::Elementwise(ElementwiseOp::DropoutBwd { p, salt }) => (
                Op::Elementwise(ElementwiseOp::DropoutBwdInPlace { p, salt }),
                &[0],
            ),
            Op::Elementwise(ElementwiseOp::UnaryBwd(k)) => {
                (Op::Elementwise(ElementwiseOp::UnaryBwdInPlace(k)), &[1])
            }
            Op::Elementwise(ElementwiseOp::Add) => {
                (Op::Elementwise(ElementwiseOp::AddInPlace), &[0, 1])
            }
            Op::Pool(PoolOp::GlobalAvgPoolBwdAct(k)) => {
                (Op::Pool(PoolOp::GlobalAvgPoolBwdActInPlace(k)), &[1])
            }
            Op::Norm(NormOp::BatchNormBwd {
                eps,
                in_place: false,
                ranks,
            }) => (
                Op::Norm(NormOp::BatchNormBwd {
                    eps,
                    in_place: true,
                    ranks,
                }),
                &[0],
            ),
            _ => continue,
        };
        let first = (matches!(new, Op::Pool(_)) && after_out.get(n.index()) == Some(&true))
            .then_some(before_out.as_slice());
        let Some(&slot) = slots.iter().find(|&&i| {
            g.input(n, i)
                .is_some_and(|v| dies_after(g, &mut roots, n, v, first))
        }) else {
            continue;
        };
        if slot == 1 && matches!(op, Op::Elementwise(ElementwiseOp::Add)) {
            let edges: Vec<_> =
                g.g.edges_directed(n, Direction::Incoming)
                    .map(|e| e.id())
                    .collect();
            for e in edges {
                if let Some(w) = g.g.edge_weight_mut(e) {
                    w.dst_input = 1 - w.dst_input;
                }
            }
        }
        if let Some(node) = g.g.node_weight_mut(n) {
            node.op = new;
            changed = true;
        }
        for (o, i) in g.node(n).op.aliased_outputs() {
            if let Some(src) = g.input(n, i) {
                roots.link((n, o), src);
            }
        }
    }
    Ok(changed)
}
