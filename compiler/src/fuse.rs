//! The `fuse_epilogues` pass: elementwise work folded into the kernel that produces its input, so
//! a step is fewer, fuller kernels and the intermediate values are never stored.
//!
//! Four rewrites, each legal by the graph alone (never by op names of a pattern):
//! - **forward epilogues**: a residual `Add` and then an activation (`Unary`) into the forward
//!   GEMM (`Conv2d`, `Dense`) whose output they read: `y = act(acc + b + r)`;
//! - **data-gradient epilogues**: a gradient accumulation (`Add`) and then an activation's backward
//!   (`UnaryBwd`) into the data-gradient GEMM (`Conv2dBwdData`, `DenseBwdData`) producing the
//!   gradient they read: `dx = act'(saved) * (acc + g)`;
//! - **broadcast backward**: `GlobalAvgPoolBwd` followed by an activation's backward becomes one
//!   `GlobalAvgPoolBwdAct` reading the `[N, C]` gradient: the activation-sized broadcast is never
//!   materialised (and `inplace_elementwise` may then write the result over the saved value);
//!   `AvgPoolBwd` and an activation's backward become one `AvgPoolBwdAct` (one pass over dx);
//! - **bias gradient**: a `BiasGradUpdate` reading the same output gradient as a fused weight
//!   update (`Conv2dBwdWeightUpdate` / `DenseBwdWeightUpdate`, same rule, matching channels)
//!   joins it: one kernel reads dy once for both.
//! - **update first**: a convolution's data gradient whose epilogue reads the activation value
//!   that its weight update also reads (the layer's input `x`) normally runs first (it must read
//!   the weights before the update overwrites them), so that value, the incoming gradient and the
//!   outgoing one are all alive at once. Where the weights are smaller than that value, the
//!   update runs first and keeps the old weights (`keep_old`, a weight-sized transient output),
//!   and the data gradient reads those and writes its result over the value (`in_place`): one
//!   activation-sized buffer less at the start of the backward pass. Legal only when every other
//!   reader of the value is guaranteed to run before (an ancestor of the network's output, which
//!   every backward node descends from, or the update itself, which the data gradient is gated on).
//!
//! Legality: the value that disappears (the GEMM's output, or the gradient) has exactly one
//! consumer, the op folded in, and is neither the network's output nor the loss (so no other
//! reader, view or in-place alias of it exists). The fused node inherits the scheduling gates of
//! both nodes it replaces (`Graph::not_before`, set by rematerialization for recomputed copies,
//! which are fused like the originals), and every gate on either node moves to it. Every
//! formula is the unfused kernels' in the same order, so a fused step is bit-identical to the
//! unfused one on the CPU.

use petgraph::stable_graph::NodeIndex;

use crate::ctx::Ctx;
use crate::error::CompileError;
use crate::gate_order::GateOrder;
use crate::ir::{Edge, Graph, Inputs, Value};
use crate::op::{ConvOp, DenseOp, ElementwiseOp, Epilogue, Op, OptimOp, PoolOp, UpdateRule};

/// Pass (`ctx.fuse`, every mode; the gradient rewrites only exist in training): see the module
/// documentation. Returns whether anything was fused.
pub fn fuse_epilogues(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if !ctx.fuse {
        return Ok(false);
    }
    let mut changed = false;
    // Adds first, so that an activation after a residual add finds the add already folded.
    changed |= fuse_each(g, fold_add)?;
    changed |= fuse_each(g, fold_activation)?;
    changed |= fuse_each(g, fold_bias_grad)?;
    if ctx.inplace {
        changed |= update_first(g)?;
    }
    Ok(changed)
}

/// One fusion found for a consumer node: the node `absorb` folded into `into` as `op` with
/// `inputs`; the fused node's outputs are `into`'s then `absorb`'s where `absorb`'s are not the
/// same value (see [`OutputMap`]).
struct Fusion {
    into: NodeIndex,
    absorb: NodeIndex,
    op: Op,
    inputs: Inputs,
    outputs: OutputMap,
}

/// Where the outputs of the two replaced nodes go in the fused node.
enum OutputMap {
    /// `absorb` consumed `into`'s only output: the fused node's outputs are `absorb`'s.
    Chain,
    /// Both nodes' outputs survive: `into`'s first, then `absorb`'s.
    Concat,
}

type Rule = fn(&Graph, NodeIndex) -> Option<Fusion>;

/// Applies `rule` to every node (in index order, so deterministic), rewriting each fusion found
/// that keeps the graph acyclic with its scheduling gates ([`GateOrder::waits_for`]).
fn fuse_each(g: &mut Graph, rule: Rule) -> Result<bool, CompileError> {
    let mut changed = false;
    let mut order = GateOrder::new();
    for n in g.nodes() {
        if !g.g.contains_node(n) {
            continue;
        }
        if let Some(f) = rule(g, n) {
            let producers: Vec<NodeIndex> = f.inputs.iter().map(|v| v.0).collect();
            if order.waits_for(g, &producers, &[f.into, f.absorb]) {
                continue;
            }
            let olds = [f.into, f.absorb];
            let gates = gates_of(g, &olds);
            let fused = apply(g, f)?;
            order.replaced(g, &olds, &gates, fused);
            changed = true;
        }
    }
    Ok(changed)
}

/// The union of the scheduling gates of `nodes`.
fn gates_of(g: &Graph, nodes: &[NodeIndex]) -> Vec<NodeIndex> {
    let mut out: Vec<NodeIndex> = nodes
        .iter()
        .filter_map(|n| g.not_before.get(n))
        .flatten()
        .copied()
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The only consumer of `v`, if it has exactly one and is neither the output nor the loss.
fn sole_consumer(g: &Graph, v: Value) -> Option<(NodeIndex, usize)> {
    if v == g.output || Some(v) == g.loss {
        return None;
    }
    match g.consumers(v).as_slice() {
        [c] => Some(*c),
        _ => None,
    }
}

/// A GEMM whose output `v` may take more epilogue, with the epilogue it has.
fn gemm_epilogue(g: &Graph, v: Value) -> Option<Epilogue> {
    if v.1 != 0 {
        return None;
    }
    match &g.node(v.0).op {
        Op::Conv(ConvOp::Conv2d { epi, .. })
        | Op::Conv(ConvOp::Conv2dBwdData { epi, .. })
        | Op::Dense(DenseOp::Dense { epi, .. })
        | Op::Dense(DenseOp::DenseBwdData { epi }) => Some(*epi),
        _ => None,
    }
}

/// `op` (a GEMM of [`gemm_epilogue`]) with its epilogue replaced.
fn with_epilogue(op: &Op, new: Epilogue) -> Op {
    let mut op = op.clone();
    match &mut op {
        Op::Conv(ConvOp::Conv2d { epi, .. })
        | Op::Conv(ConvOp::Conv2dBwdData { epi, .. })
        | Op::Dense(DenseOp::Dense { epi, .. })
        | Op::Dense(DenseOp::DenseBwdData { epi }) => *epi = new,
        _ => {}
    }
    op
}

/// `a + b` (forward residual or gradient accumulation) into the GEMM producing one operand.
fn fold_add(g: &Graph, n: NodeIndex) -> Option<Fusion> {
    if !matches!(g.node(n).op, Op::Elementwise(ElementwiseOp::Add)) {
        return None;
    }
    let ins = g.inputs(n);
    let (a, b) = (*ins.first()?, *ins.get(1)?);
    for (v, other) in [(a, b), (b, a)] {
        let Some(epi) = gemm_epilogue(g, v) else {
            continue;
        };
        if !epi.is_none() || sole_consumer(g, v).map(|c| c.0) != Some(n) {
            continue;
        }
        let mut inputs = g.inputs(v.0);
        inputs.push(other);
        let op = with_epilogue(
            &g.node(v.0).op,
            Epilogue {
                add: true,
                act: None,
            },
        );
        return Some(Fusion {
            into: v.0,
            absorb: n,
            op,
            inputs,
            outputs: OutputMap::Chain,
        });
    }
    None
}

/// An activation into the forward GEMM producing its input; an activation's backward into the
/// data-gradient GEMM, or the global average pool's backward, producing its incoming gradient.
fn fold_activation(g: &Graph, n: NodeIndex) -> Option<Fusion> {
    let ins = g.inputs(n);
    match g.node(n).op {
        Op::Elementwise(ElementwiseOp::Unary(k)) => {
            let v = *ins.first()?;
            let epi = gemm_epilogue(g, v)?;
            let forward = matches!(
                g.node(v.0).op,
                Op::Conv(ConvOp::Conv2d { .. }) | Op::Dense(DenseOp::Dense { .. })
            );
            if !forward || epi.act.is_some() || sole_consumer(g, v) != Some((n, 0)) {
                return None;
            }
            let op = with_epilogue(
                &g.node(v.0).op,
                Epilogue {
                    act: Some(k),
                    ..epi
                },
            );
            Some(Fusion {
                into: v.0,
                absorb: n,
                op,
                inputs: g.inputs(v.0),
                outputs: OutputMap::Chain,
            })
        }
        Op::Elementwise(ElementwiseOp::UnaryBwd(k)) => {
            let (saved, d) = (*ins.first()?, *ins.get(1)?);
            if sole_consumer(g, d) != Some((n, 1)) {
                return None;
            }
            let mut inputs = g.inputs(d.0);
            let op = match &g.node(d.0).op {
                Op::Pool(PoolOp::GlobalAvgPoolBwd) => Op::Pool(PoolOp::GlobalAvgPoolBwdAct(k)),
                Op::Pool(PoolOp::AvgPoolBwd { geom }) => Op::Pool(PoolOp::AvgPoolBwdAct {
                    geom: *geom,
                    act: k,
                }),
                Op::Conv(ConvOp::Conv2dBwdData { epi, .. })
                | Op::Dense(DenseOp::DenseBwdData { epi })
                    if epi.act.is_none() && d.1 == 0 =>
                {
                    with_epilogue(
                        &g.node(d.0).op,
                        Epilogue {
                            act: Some(k),
                            ..*epi
                        },
                    )
                }
                _ => return None,
            };
            inputs.push(saved);
            Some(Fusion {
                into: d.0,
                absorb: n,
                op,
                inputs,
                outputs: OutputMap::Chain,
            })
        }
        _ => None,
    }
}

/// A bias gradient + update reading the same output gradient as a fused weight update of the
/// same rule and channel count: the weight update takes the bias (and its state) too.
fn fold_bias_grad(g: &Graph, n: NodeIndex) -> Option<Fusion> {
    let Op::Optim(OptimOp::BiasGradUpdate { rule, shards, .. }) = g.node(n).op else {
        return None;
    };
    let ins = g.inputs(n);
    let dy = *ins.first()?;
    let channels = g.ty(*ins.get(1)?).shape.clone();
    let same_rule = |r: &UpdateRule| *r == rule;
    let (w, _) = g.consumers(dy).into_iter().find(|(c, slot)| {
        *slot == 1
            && match &g.node(*c).op {
                Op::Conv(ConvOp::Conv2dBwdWeightUpdate { rule, bias, .. })
                | Op::Dense(DenseOp::DenseBwdWeightUpdate { rule, bias, .. }) => {
                    !bias
                        && same_rule(rule)
                        && g.node(*c).op.shards() == shards
                        && g.ty(dy).shape.last() == channels.first()
                }
                _ => false,
            }
    })?;
    let mut op = g.node(w).op.clone();
    match &mut op {
        Op::Conv(ConvOp::Conv2dBwdWeightUpdate { bias, .. })
        | Op::Dense(DenseOp::DenseBwdWeightUpdate { bias, .. }) => *bias = true,
        _ => return None,
    }
    let mut inputs = g.inputs(w);
    inputs.extend_from_slice(&ins[1..]);
    Some(Fusion {
        into: w,
        absorb: n,
        op,
        inputs,
        outputs: OutputMap::Concat,
    })
}

/// Replaces `f.into` and `f.absorb` by one node: consumers, the output/loss/gradient records and
/// the scheduling gates of both move to it.
fn apply(g: &mut Graph, f: Fusion) -> Result<NodeIndex, CompileError> {
    let into = g.node(f.into);
    let (name, phase) = (into.name.clone(), into.phase);
    // The output type of the fused node's output 0 (needed by the ops whose output shape is not a
    // function of their inputs): the surviving value's.
    let hint = match f.outputs {
        OutputMap::Chain => g.ty((f.absorb, 0)).clone(),
        OutputMap::Concat => g.ty((f.into, 0)).clone(),
    };
    let fused = g.add_node(f.op, &f.inputs, name, phase, Some(&hint))?;
    // old value -> new value
    let mut moves: Vec<(Value, Value)> = vec![];
    match f.outputs {
        OutputMap::Chain => {
            for o in 0..g.node(f.absorb).outputs.len() {
                moves.push(((f.absorb, o), (fused, o)));
            }
        }
        OutputMap::Concat => {
            let k = g.node(f.into).outputs.len();
            for o in 0..k {
                moves.push(((f.into, o), (fused, o)));
            }
            for o in 0..g.node(f.absorb).outputs.len() {
                moves.push(((f.absorb, o), (fused, k + o)));
            }
        }
    }
    for (old, new) in &moves {
        for (c, slot) in g.consumers(*old) {
            if c == f.absorb {
                continue;
            }
            g.g.add_edge(
                new.0,
                c,
                Edge {
                    src_output: new.1,
                    dst_input: slot,
                },
            );
        }
        if g.output == *old {
            g.output = *new;
        }
        if g.loss == Some(*old) {
            g.loss = Some(*new);
        }
        for d in g.grads.values_mut() {
            if d == old {
                *d = *new;
            }
        }
    }
    // Scheduling gates: the fused node waits for what either waited for; what waited for either
    // waits for it.
    let mut gate: std::collections::BTreeSet<NodeIndex> = [f.into, f.absorb]
        .iter()
        .filter_map(|n| g.not_before.remove(n))
        .flatten()
        .filter(|n| *n != f.into && *n != f.absorb)
        .collect();
    gate.remove(&fused);
    if !gate.is_empty() {
        g.not_before.insert(fused, gate);
    }
    for after in g.not_before.values_mut() {
        let had = after.remove(&f.into) | after.remove(&f.absorb);
        if had {
            after.insert(fused);
        }
    }
    g.g.remove_node(f.absorb);
    g.g.remove_node(f.into);
    Ok(fused)
}

/// Nodes reachable from `start` along edges in direction `dir`, as a bitmap by node index.
pub(crate) fn reach(g: &Graph, start: NodeIndex, dir: petgraph::Direction) -> Vec<bool> {
    let mut seen = vec![false; g.node_bound()];
    let mut stack = vec![start];
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut seen[n.index()], true) {
            continue;
        }
        stack.extend(g.g.neighbors_directed(n, dir));
    }
    seen
}

/// The "update first" rewrite of the module documentation, for every convolution data gradient
/// where it is legal and saves memory.
fn update_first(g: &mut Graph) -> Result<bool, CompileError> {
    let candidates: Vec<NodeIndex> = g
        .nodes()
        .into_iter()
        .filter(|n| {
            matches!(
                g.node(*n).op,
                Op::Conv(ConvOp::Conv2dBwdData {
                    epi: Epilogue { act: Some(_), .. },
                    in_place: false,
                    ..
                })
            )
        })
        .collect();
    if candidates.is_empty() {
        return Ok(false);
    }
    let out = g.output.0;
    let before_all = reach(g, out, petgraph::Direction::Incoming);
    let after_out = reach(g, out, petgraph::Direction::Outgoing);
    let mut changed = false;
    let mut order = GateOrder::new();
    for d in candidates {
        let Some((u, saved)) = update_first_pair(g, d, &before_all, &after_out, &mut order) else {
            continue;
        };
        // the update, keeping the old weights (its last output)
        let mut uop = g.node(u).op.clone();
        if let Op::Conv(ConvOp::Conv2dBwdWeightUpdate { keep_old, .. }) = &mut uop {
            *keep_old = true;
        }
        let uins = g.inputs(u);
        let gates = gates_of(g, &[u]);
        let nu = replace(g, u, uop, &uins)?;
        order.replaced(g, &[u], &gates, nu);
        let w_old = (nu, g.node(nu).outputs.len() - 1);
        // the data gradient, reading them and writing over the saved value, after the update
        let mut dop = g.node(d).op.clone();
        if let Op::Conv(ConvOp::Conv2dBwdData { in_place, .. }) = &mut dop {
            *in_place = true;
        }
        let mut dins = g.inputs(d);
        dins[1] = w_old;
        debug_assert_eq!(dins.last(), Some(&saved));
        let gates = gates_of(g, &[d]);
        let nd = replace(g, d, dop, &dins)?;
        order.replaced(g, &[d], &gates, nd);
        g.not_before.entry(nd).or_default().insert(nu);
        order.gated(g, nd, nu);
        changed = true;
    }
    Ok(changed)
}

/// For a data gradient `d` (epilogue with an activation): its layer's fused weight update and the
/// saved value, when the rewrite is legal and the weights are smaller than the value.
fn update_first_pair(
    g: &Graph,
    d: NodeIndex,
    before_all: &[bool],
    after_out: &[bool],
    order: &mut GateOrder,
) -> Option<(NodeIndex, Value)> {
    let ins = g.inputs(d);
    let (dy, w, saved) = (*ins.first()?, *ins.get(1)?, *ins.last()?);
    if !after_out.get(d.index()).copied().unwrap_or(false) {
        return None;
    }
    if !matches!(g.node(w.0).op, Op::Param { .. }) || g.ty(w).bytes() >= g.ty(saved).bytes() {
        return None;
    }
    // the layer's update: reads w (slot 2), the saved value as its x and the same dy
    let (u, _) = g.consumers(w).into_iter().find(|(c, slot)| {
        *slot == 2
            && matches!(
                g.node(*c).op,
                Op::Conv(ConvOp::Conv2dBwdWeightUpdate {
                    keep_old: false,
                    ..
                })
            )
            && g.input(*c, 0) == Some(saved)
            && g.input(*c, 1) == Some(dy)
    })?;
    // the saved value: a kernel's own buffer (no view, no alias, not a leaf, output or loss),
    // read otherwise only by ancestors of the output and the update
    let p = g.node(saved.0);
    if !g.is_kernel(saved.0)
        || p.op.aliased_outputs().iter().any(|(o, _)| *o == saved.1)
        || saved == g.output
        || Some(saved) == g.loss
    {
        return None;
    }
    // the update must not read anything that waits for the data gradient (rematerialization's
    // gates), since the data gradient will wait for the update
    let producers: Vec<NodeIndex> = g.inputs(u).iter().map(|v| v.0).collect();
    if order.waits_for(g, &producers, &[d]) {
        return None;
    }
    let others_first = g.consumers(saved).iter().all(|(c, _)| {
        *c == d
            || *c == u
            || (before_all.get(c.index()).copied().unwrap_or(false)
                && !matches!(g.node(*c).op, Op::Reshape))
    });
    let distinct = ins[..ins.len() - 1]
        .iter()
        .all(|v| g.buffer_root(*v) != g.buffer_root(saved));
    (others_first && distinct).then_some((u, saved))
}

/// Replaces `old` by a node running `op` on `inputs` (same name and phase): its consumers, the
/// output/loss/gradient records and its scheduling gates move to the new node.
fn replace(
    g: &mut Graph,
    old: NodeIndex,
    op: Op,
    inputs: &[Value],
) -> Result<NodeIndex, CompileError> {
    let (name, phase) = (g.node(old).name.clone(), g.node(old).phase);
    let hint = g.ty((old, 0)).clone();
    let new = g.add_node(op, inputs, name, phase, Some(&hint))?;
    for o in 0..g.node(old).outputs.len() {
        let v = (old, o);
        for (c, slot) in g.consumers(v) {
            g.g.add_edge(
                new,
                c,
                Edge {
                    src_output: o,
                    dst_input: slot,
                },
            );
        }
        if g.output == v {
            g.output = (new, o);
        }
        if g.loss == Some(v) {
            g.loss = Some((new, o));
        }
        for d in g.grads.values_mut() {
            if *d == v {
                *d = (new, o);
            }
        }
    }
    if let Some(gate) = g.not_before.remove(&old) {
        g.not_before.insert(new, gate);
    }
    for after in g.not_before.values_mut() {
        if after.remove(&old) {
            after.insert(new);
        }
    }
    g.g.remove_node(old);
    Ok(new)
}
