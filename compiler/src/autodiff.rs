//! Reverse-mode autodiff: ONE vector-Jacobian-product table ([`vjp`]) turns the forward graph into
//! forward + backward, from the loss to every parameter.
//!
//! Only gradients that are needed are built: a node is differentiated only if it depends on a
//! parameter and the loss depends on it, and an input slot only gets a gradient if it depends on a
//! parameter (no gradients for inputs/targets/labels). Contributions to a value used more than
//! once are summed with `ElementwiseOp::Add`. The loss-bwd ops seed the backward pass (they take no `dy`):
//! with a loss of several terms, each term's (weighted) backward seeds it, and the gradients of a
//! value two terms read are summed as any other fan-out.

use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::ctx::Ctx;
use crate::error::CompileError;
use crate::fxhash::FxHashMap;
use crate::ir::TensorType;
use crate::ir::{Graph, Phase, Value};
use crate::op::{
    ConvGeom, ConvOp, DenseOp, ElementwiseOp, Epilogue, NormOp, Op, OptimOp, PoolOp, SeqOp,
};
use crate::plan::Mode;
use dmc_plan::unary::Saved;

/// What [`vjp`] keeps of the node it differentiates while it adds nodes to the graph.
struct NodeHead {
    op: Op,
    name: String,
}

/// Gradient contributions of one node for each of its input slots (`None`: not needed).
type Grads = Vec<Option<Value>>;

/// The VJP table: given node `n` (forward) and the gradient `dy` of its output 0 (`None` for the
/// loss, whose gradient is 1), adds the backward nodes and returns one gradient per input slot
/// for the slots flagged in `need`.
pub fn vjp(
    g: &mut Graph,
    n: NodeIndex,
    dy: Option<Value>,
    need: &[bool],
) -> Result<Grads, CompileError> {
    // The op and the name (not the output types: cloning them is most of a node's allocations).
    let node = {
        let nd = g.node(n);
        NodeHead {
            op: nd.op.clone(),
            name: nd.name.clone(),
        }
    };
    let x = g.inputs(n);
    let nin = x.len();
    let mut out: Grads = vec![None; nin];
    let bw = Phase::Backward;
    // Names by `concat`, not `format!` (a node or two per layer: the formatting machinery costs
    // more than the copy).
    let gname = |v: Value, g: &Graph| ["grad ", g.node(v.0).name.as_str()].concat();
    let missing = || {
        CompileError::Internal(format!(
            "vjp of `{}` ({}) needs dy",
            node.name,
            node.op.kind_name()
        ))
    };
    let want = |i: usize| need.get(i).copied().unwrap_or(false);
    match &node.op {
        // d/dx of a leaf: nothing to propagate.
        Op::Input { .. }
        | Op::Param { .. }
        | Op::OptState { .. }
        | Op::RunStat { .. }
        | Op::GradBuf { .. } => {}
        // Copies and parameter shards' gathers and keeps are plan steps (streaming, sharded
        // parameters), never IR nodes.
        Op::Transfer(_)
        | Op::Optim(OptimOp::GatherShard { .. })
        | Op::Optim(OptimOp::KeepShard { .. }) => {
            return Err(CompileError::Internal(format!(
                "`{}`: a copy step in the IR",
                node.name
            )))
        }
        // d/dx batchnorm(x, gamma, beta) with the batch statistics (outputs 1, 2) saved: one
        // backward node gives dx, dgamma and dbeta (the statistics' own outputs get no gradient:
        // only the running statistics' update reads them).
        Op::Norm(NormOp::BatchNorm { eps, ranks }) => {
            let dy = dy.ok_or_else(missing)?;
            if (0..3).any(want) {
                let name = gname(x[0], g);
                let op = Op::Norm(NormOp::BatchNormBwd {
                    eps: *eps,
                    in_place: false,
                    ranks: *ranks,
                });
                let b = g.add_node(op, &[dy, x[0], (n, 1), (n, 2), x[1]], name, bw, None)?;
                for (i, o) in out.iter_mut().enumerate().take(3) {
                    if want(i) {
                        *o = Some((b, i));
                    }
                }
            }
        }
        // d/dx layernorm(x, gamma, beta) with the rows' mean and rstd (outputs 1, 2) saved: one
        // backward node gives dx, dgamma and dbeta.
        Op::Norm(NormOp::LayerNorm { .. }) => {
            let dy = dy.ok_or_else(missing)?;
            if (0..3).any(want) {
                let name = gname(x[0], g);
                let op = Op::Norm(NormOp::LayerNormBwd);
                let b = g.add_node(op, &[dy, x[0], (n, 1), (n, 2), x[1]], name, bw, None)?;
                for (i, o) in out.iter_mut().enumerate().take(3) {
                    if want(i) {
                        *o = Some((b, i));
                    }
                }
            }
        }
        // d/dtable embedding(tokens, table): each position's dy added to its token's row (the
        // tokens, integers, get none)
        Op::Seq(SeqOp::Embedding) => {
            let dy = dy.ok_or_else(missing)?;
            if want(1) {
                let vocab = g.ty(x[1]).shape[0];
                let name = gname(x[1], g);
                let op = Op::Seq(SeqOp::EmbeddingBwd { vocab });
                out[1] = Some((g.add_node(op, &[x[0], dy], name, bw, None)?, 0));
            }
        }
        // d/dx (x + p) = dy; d/dp = the sum of dy over the batch: a bias gradient of dy seen as
        // [B, T*D], seen as p's shape
        Op::Seq(SeqOp::AddPositions) => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                out[0] = Some(dy);
            }
            if want(1) {
                let pt = g.ty(x[1]).clone();
                let rows = g.ty(dy).shape[0];
                let flat = TensorType::f32(vec![rows, pt.numel()]);
                let name = gname(x[1], g);
                let r = g.add_node(
                    Op::Reshape,
                    &[dy],
                    [name.as_str(), " (rows)"].concat(),
                    bw,
                    Some(&flat),
                )?;
                let s = g.add_node(
                    Op::Optim(OptimOp::BiasGrad),
                    &[(r, 0)],
                    [name.as_str(), " (sum)"].concat(),
                    bw,
                    None,
                )?;
                out[1] = Some((g.add_node(Op::Reshape, &[(s, 0)], name, bw, Some(&pt))?, 0));
            }
        }
        // d/dx x^T = (dy)^T
        Op::Seq(SeqOp::Transpose) => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let name = gname(x[0], g);
                out[0] = Some((
                    g.add_node(Op::Seq(SeqOp::Transpose), &[dy], name, bw, None)?,
                    0,
                ));
            }
        }
        // d/dqkv attention(qkv): the fused backward from the saved output and log-sum-exps
        // (outputs 0 and 1), recomputing the scores tile by tile
        Op::Seq(SeqOp::Attention { heads, causal }) => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let name = gname(x[0], g);
                let op = Op::Seq(SeqOp::AttentionBwd {
                    heads: *heads,
                    causal: *causal,
                });
                out[0] = Some((
                    g.add_node(op, &[x[0], (n, 0), (n, 1), dy], name, bw, None)?,
                    0,
                ));
            }
        }
        // d/dx conv(x,w)+b: dx = conv_bwd_data(dy, w); dw = conv_bwd_weight(x, dy); db = sum dy
        Op::Conv(ConvOp::Conv2d { geom, epi, .. }) if epi.is_none() => {
            let dx = Op::Conv(ConvOp::Conv2dBwdData {
                geom: *geom,
                epi: Epilogue::NONE,
                in_place: false,
            });
            let dy = dy.ok_or_else(missing)?;
            conv_grads(g, &x, dy, &want, dx, [x[0], dy], *geom, &mut out)?;
        }
        // d/dx conv^T(x, w) + b (the data gradient of the convolution `geom` from y to x):
        // dx = conv(dy, w) (that convolution's forward); dw = conv_bwd_weight(dy, x) (its weight
        // gradient, dy in the place of its input, x in the place of its output gradient);
        // db = sum dy
        Op::Conv(ConvOp::ConvTranspose2d { geom, .. }) => {
            let dx = Op::Conv(ConvOp::Conv2d {
                geom: *geom,
                bias: false,
                epi: Epilogue::NONE,
            });
            let dy = dy.ok_or_else(missing)?;
            conv_grads(g, &x, dy, &want, dx, [dy, x[0]], *geom, &mut out)?;
        }
        // d/dx xw+b: dx = dy w^T; dw = x^T dy; db = sum_n dy
        Op::Dense(DenseOp::Dense { epi, .. }) if epi.is_none() => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let name = gname(x[0], g);
                out[0] = Some((
                    g.add_node(
                        Op::Dense(DenseOp::DenseBwdData {
                            epi: Epilogue::NONE,
                        }),
                        &[dy, x[1]],
                        name,
                        bw,
                        None,
                    )?,
                    0,
                ));
            }
            if want(1) {
                let name = gname(x[1], g);
                out[1] = Some((
                    g.add_node(
                        Op::Dense(DenseOp::DenseBwdWeight),
                        &[x[0], dy],
                        name,
                        bw,
                        None,
                    )?,
                    0,
                ));
            }
            if nin > 2 && want(2) {
                let name = gname(x[2], g);
                out[2] = Some((
                    g.add_node(Op::Optim(OptimOp::BiasGrad), &[dy], name, bw, None)?,
                    0,
                ));
            }
        }
        // d/dx maxpool: dy scattered to the argmax position of each window
        Op::Pool(PoolOp::MaxPool { geom }) => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let hint = g.ty(x[0]).clone();
                let name = gname(x[0], g);
                out[0] = Some((
                    g.add_node(
                        Op::Pool(PoolOp::MaxPoolBwd { geom: *geom }),
                        &[dy, (n, 1)],
                        name,
                        bw,
                        Some(&hint),
                    )?,
                    0,
                ));
            }
        }
        // d/dx avgpool: dy / size^2 spread over each window
        Op::Pool(PoolOp::AvgPool { geom }) => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let hint = g.ty(x[0]).clone();
                let name = gname(x[0], g);
                out[0] = Some((
                    g.add_node(
                        Op::Pool(PoolOp::AvgPoolBwd { geom: *geom }),
                        &[dy],
                        name,
                        bw,
                        Some(&hint),
                    )?,
                    0,
                ));
            }
        }
        // d/dx mean_hw x: dy / (H*W) broadcast over H, W
        Op::Pool(PoolOp::GlobalAvgPool) => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let hint = g.ty(x[0]).clone();
                let name = gname(x[0], g);
                out[0] = Some((
                    g.add_node(
                        Op::Pool(PoolOp::GlobalAvgPoolBwd),
                        &[dy],
                        name,
                        bw,
                        Some(&hint),
                    )?,
                    0,
                ));
            }
        }
        // d/dx max over h, w: dy at each channel's argmax pixel
        Op::Pool(PoolOp::GlobalMaxPool) => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let hint = g.ty(x[0]).clone();
                let name = gname(x[0], g);
                out[0] = Some((
                    g.add_node(
                        Op::Pool(PoolOp::GlobalMaxPoolBwd),
                        &[dy, (n, 1)],
                        name,
                        bw,
                        Some(&hint),
                    )?,
                    0,
                ));
            }
        }
        // d/dx upsample: each input pixel's gradient is the sum of dy over its f x f block
        Op::Pool(PoolOp::Upsample { factor }) => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let name = gname(x[0], g);
                let op = Op::Pool(PoolOp::UpsampleBwd { factor: *factor });
                out[0] = Some((g.add_node(op, &[dy], name, bw, None)?, 0));
            }
        }
        // d/dx reshape(x): reshape(dy) back to x's shape
        Op::Reshape => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let hint = g.ty(x[0]).clone();
                let name = gname(x[0], g);
                out[0] = Some((g.add_node(Op::Reshape, &[dy], name, bw, Some(&hint))?, 0));
            }
        }
        // d/dx f(x): from the output y = f(x) or from the input x, as the activation says
        Op::Elementwise(ElementwiseOp::Unary(k)) => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let saved = match k.saved() {
                    Saved::Input => x[0],
                    Saved::Output => (n, 0),
                };
                let name = gname(x[0], g);
                out[0] = Some((
                    g.add_node(
                        Op::Elementwise(ElementwiseOp::UnaryBwd(*k)),
                        &[saved, dy],
                        name,
                        bw,
                        None,
                    )?,
                    0,
                ));
            }
        }
        // d/dx softmax(x): y * (dy - sum_row(dy * y)), from the output
        Op::Elementwise(ElementwiseOp::Softmax) => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let name = gname(x[0], g);
                let op = Op::Elementwise(ElementwiseOp::SoftmaxBwd);
                out[0] = Some((g.add_node(op, &[(n, 0), dy], name, bw, None)?, 0));
            }
        }
        // d/da (a+b) = dy, d/db (a+b) = dy
        Op::Elementwise(ElementwiseOp::Add) => {
            let dy = dy.ok_or_else(missing)?;
            for (i, o) in out.iter_mut().enumerate().take(2) {
                if want(i) {
                    *o = Some(dy);
                }
            }
        }
        // d/da (a*b) = dy * b, d/db (a*b) = dy * a: both inputs are read by the backward (kept
        // alive, or recomputed by remat). For `a * a` the two contributions are summed by the
        // caller: 2 a dy.
        Op::Elementwise(ElementwiseOp::Mul) => {
            let dy = dy.ok_or_else(missing)?;
            for (i, o) in out.iter_mut().enumerate().take(2) {
                if want(i) {
                    let other = x[1 - i];
                    let name = gname(x[i], g);
                    let op = Op::Elementwise(ElementwiseOp::Mul);
                    *o = Some((g.add_node(op, &[dy, other], name, bw, None)?, 0));
                }
            }
        }
        // d/da concat(a, b) = dy[.., ..ca], d/db = dy[.., ca..]: each input's slice of the last
        // axis (nothing saved but the shapes)
        Op::Elementwise(ElementwiseOp::Concat) => {
            let dy = dy.ok_or_else(missing)?;
            let last = |v: Value, g: &Graph| g.ty(v).shape.last().copied().unwrap_or(0);
            let ca = last(x[0], g);
            for (i, o) in out.iter_mut().enumerate().take(2) {
                if want(i) {
                    let (start, len) = if i == 0 { (0, ca) } else { (ca, last(x[1], g)) };
                    let name = gname(x[i], g);
                    let op = Op::Elementwise(ElementwiseOp::SliceLast { start, len });
                    *o = Some((g.add_node(op, &[dy], name, bw, None)?, 0));
                }
            }
        }
        // d/dx dropout(x): dy * mask / (1-p), the same regenerated mask
        Op::Elementwise(ElementwiseOp::Dropout { p, salt }) => {
            let dy = dy.ok_or_else(missing)?;
            if want(0) {
                let name = gname(x[0], g);
                out[0] = Some((
                    g.add_node(
                        Op::Elementwise(ElementwiseOp::DropoutBwd { p: *p, salt: *salt }),
                        &[dy],
                        name,
                        bw,
                        None,
                    )?,
                    0,
                ));
            }
        }
        // d/dpred of a loss (seeds the backward pass), times the term's weight: mse 2 (pred - target) / numel; mae
        // sign(pred - target) / numel; huber clamp(pred - target, -delta, delta) / numel;
        // bce_with_logits (sigmoid(x) - t) / numel; cross-entropy (softmax(logits) - (1-e)
        // onehot(label) - e/C) / N
        Op::Loss(l) if !l.is_backward() => {
            if want(0) {
                let bwd = l.backward().ok_or_else(|| {
                    CompileError::Internal(format!(
                        "`{}`: a loss' backward is not a loss",
                        node.name
                    ))
                })?;
                let name = gname(x[0], g);
                out[0] = Some((g.add_node(Op::Loss(bwd), &[x[0], x[1]], name, bw, None)?, 0));
            }
        }
        // d/dx of backward and update ops: second-order autodiff is not supported; fused ops
        // (`fuse_epilogues` runs after autodiff) are not differentiated either.
        Op::Conv(ConvOp::Conv2d { .. })
        | Op::Dense(DenseOp::Dense { .. })
        | Op::Pool(PoolOp::GlobalAvgPoolBwdAct(_))
        | Op::Pool(PoolOp::GlobalAvgPoolBwdActInPlace(_))
        | Op::Pool(PoolOp::AvgPoolBwdAct { .. })
        | Op::Conv(ConvOp::Conv2dBwdData { .. })
        | Op::Conv(ConvOp::Conv2dBwdWeight { .. })
        | Op::Optim(OptimOp::BiasGrad)
        | Op::Dense(DenseOp::DenseBwdData { .. })
        | Op::Dense(DenseOp::DenseBwdWeight)
        | Op::Pool(PoolOp::MaxPoolBwd { .. })
        | Op::Pool(PoolOp::AvgPoolBwd { .. })
        | Op::Pool(PoolOp::GlobalAvgPoolBwd)
        | Op::Pool(PoolOp::GlobalMaxPoolBwd)
        | Op::Pool(PoolOp::UpsampleBwd { .. })
        | Op::Elementwise(ElementwiseOp::UnaryBwd(_))
        | Op::Elementwise(ElementwiseOp::DropoutBwd { .. })
        | Op::Elementwise(ElementwiseOp::SoftmaxBwd)
        | Op::Elementwise(ElementwiseOp::SliceLast { .. })
        | Op::Loss(_)
        | Op::Optim(OptimOp::Update { .. })
        | Op::Optim(OptimOp::GradAccum { .. })
        | Op::Optim(OptimOp::GradSqNorm { .. })
        | Op::Optim(OptimOp::GradNormStore)
        | Op::Optim(OptimOp::GradAllReduce { .. })
        | Op::Elementwise(ElementwiseOp::UnaryInPlace(_))
        | Op::Elementwise(ElementwiseOp::AddInPlace)
        | Op::Elementwise(ElementwiseOp::DropoutInPlace { .. })
        | Op::Elementwise(ElementwiseOp::UnaryBwdInPlace(_))
        | Op::Elementwise(ElementwiseOp::DropoutBwdInPlace { .. })
        | Op::Conv(ConvOp::Conv2dBwdWeightUpdate { .. })
        | Op::Dense(DenseOp::DenseBwdWeightUpdate { .. })
        | Op::Optim(OptimOp::BiasGradUpdate { .. })
        | Op::Norm(NormOp::BatchNormInfer { .. })
        | Op::Norm(NormOp::BatchNormStats { .. })
        | Op::Norm(NormOp::BatchNormBwd { .. })
        | Op::Norm(NormOp::LayerNormBwd)
        | Op::Seq(SeqOp::EmbeddingBwd { .. })
        | Op::Seq(SeqOp::AttentionBwd { .. }) => {
            return Err(CompileError::Internal(format!(
                "cannot differentiate `{}` ({}): not a forward op",
                node.name,
                node.op.kind_name()
            )))
        }
    }
    Ok(out)
}

/// Pass: builds the backward graph (train mode only) and records every parameter's gradient in
/// `g.grads`.
pub fn autodiff(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if ctx.mode != Mode::Train {
        return Ok(false);
    }
    let loss = g
        .loss
        .ok_or_else(|| CompileError::Internal("autodiff: no loss".into()))?;
    let order = g
        .topo_order()
        .map_err(|n| CompileError::Internal(format!("autodiff: cycle at {n:?}")))?;

    // Nodes whose outputs depend on a parameter (forward sweep).
    // Sets of the nodes that exist now, by node index (the nodes added below are in neither).
    let bound = g.node_bound();
    let mut depends = vec![false; bound];
    for &n in &order {
        let is_param = matches!(g.node(n).op, Op::Param { .. });
        if is_param
            || g.g
                .edges_directed(n, Direction::Incoming)
                .any(|e| depends[e.source().index()])
        {
            depends[n.index()] = true;
        }
    }
    let depends = |n: NodeIndex| depends.get(n.index()).copied().unwrap_or(false);
    // Nodes the loss depends on (backward sweep).
    let mut useful = vec![false; bound];
    useful[loss.0.index()] = true;
    for &n in order.iter().rev() {
        if useful[n.index()] {
            for e in g.g.edges_directed(n, Direction::Incoming) {
                useful[e.source().index()] = true;
            }
        }
    }
    let useful = |n: NodeIndex| useful.get(n.index()).copied().unwrap_or(false);
    // A value carries a gradient if it is f32, depends on a parameter and is not an argmax.
    let carries = |g: &Graph, v: Value| -> bool {
        depends(v.0)
            && g.ty(v).dtype == crate::op::DType::F32
            && !matches!(g.node(v.0).op, Op::Pool(PoolOp::MaxPool { .. }) if v.1 == 1)
    };

    // The backward is about as many nodes as the forward (a kernel's VJP, one node per input
    // that needs a gradient) with about twice its edges; the optimizer pass then adds its nodes
    // per parameter. Both reserved at once: the graph's vectors grow (are copied and faulted in)
    // once, not once per pass.
    let (opt_nodes, opt_edges) = crate::optimizer::added(ctx, g.params.len());
    g.reserve(
        g.g.node_count() + opt_nodes,
        2 * g.g.edge_count() + opt_edges,
    );
    let mut grad: FxHashMap<Value, Value> =
        FxHashMap::with_capacity_and_hasher(order.len(), Default::default());
    for &n in order.iter().rev() {
        if !useful(n) || !depends(n) || g.node(n).op.is_leaf() {
            continue;
        }
        let dy = if matches!(&g.node(n).op, Op::Loss(l) if !l.is_backward()) {
            // A term of the loss: its backward seeds the gradient (weighted by its term).
            None
        } else if g.node(n).phase == Phase::Loss {
            // The sum of the terms' losses: each term seeds its own gradient.
            continue;
        } else {
            match grad.get(&(n, 0)) {
                Some(d) => Some(*d),
                None => continue,
            }
        };
        let ins = g.inputs(n);
        let need: Vec<bool> = ins.iter().map(|v| carries(g, *v) && useful(v.0)).collect();
        let contribs = vjp(g, n, dy, &need)?;
        for (v, c) in ins.iter().zip(contribs) {
            let Some(c) = c else { continue };
            let acc = match grad.get(v) {
                None => c,
                Some(prev) => {
                    let name = ["grad ", g.node(v.0).name.as_str(), " (sum)"].concat();
                    (
                        g.add_node(
                            Op::Elementwise(ElementwiseOp::Add),
                            &[*prev, c],
                            name,
                            Phase::Backward,
                            None,
                        )?,
                        0,
                    )
                }
            };
            grad.insert(*v, acc);
        }
    }
    let params: Vec<NodeIndex> = g.params.iter().map(|(p, _)| *p).collect();
    for p in params {
        if let Some(d) = grad.get(&(p, 0)) {
            g.grads.insert(p, *d);
        }
    }
    Ok(true)
}

/// The gradients of a convolution-like node `x = (input, weight[, bias])` with output gradient
/// `dy`: the input's by `dx_op(dy, weight)`, the weight's by the weight gradient of `geom` over
/// `w_args` (its input and its output gradient), the bias' by the column sums of `dy`; each only
/// where `want` asks.
#[allow(clippy::too_many_arguments)]
fn conv_grads(
    g: &mut Graph,
    x: &[Value],
    dy: Value,
    want: &dyn Fn(usize) -> bool,
    dx_op: Op,
    w_args: [Value; 2],
    geom: ConvGeom,
    out: &mut Grads,
) -> Result<(), CompileError> {
    let bw = Phase::Backward;
    let gname = |v: Value, g: &Graph| ["grad ", g.node(v.0).name.as_str()].concat();
    if want(0) {
        let hint = g.ty(x[0]).clone();
        let name = gname(x[0], g);
        out[0] = Some((g.add_node(dx_op, &[dy, x[1]], name, bw, Some(&hint))?, 0));
    }
    if want(1) {
        let name = gname(x[1], g);
        let op = Op::Conv(ConvOp::Conv2dBwdWeight { geom });
        out[1] = Some((g.add_node(op, &w_args, name, bw, None)?, 0));
    }
    if x.len() > 2 && want(2) {
        let name = gname(x[2], g);
        out[2] = Some((
            g.add_node(Op::Optim(OptimOp::BiasGrad), &[dy], name, bw, None)?,
            0,
        ));
    }
    Ok(())
}
