//! Data parallel (ZeRO stage 1, [`dmc_plan::shard`]): `ranks` processes run the same step, each on
//! its part of every global batch. The pass [`shard_optimizer_state`] makes every optimizer update
//! a sharded one (`shards` = ranks): each optimizer-state leaf becomes this rank's shard of the
//! parameter seen as `[K, C]` when the update is the fused weight-gradient + update (its gradient
//! comes by column blocks of all K rows, so every block splits the same way) and `[numel, 1]`
//! otherwise (with `clip_norm` the optimizer pass sums each held gradient over the ranks first,
//! `GradAllReduce`, and such an update only gathers). [`rank_model`] weights each rank's loss by
//! 1/ranks before lowering, so that the ranks' gradients and losses sum to the global batch's
//! mean, and refuses a batch that does not split evenly.

use std::borrow::Cow;

use dmc_grammar::model::Model;
use dmc_plan::shard::Layout;
use petgraph::stable_graph::NodeIndex;

use crate::ctx::Ctx;
use crate::error::CompileError;
use crate::ir::{infer_outputs, Graph, TensorType};
use crate::op::{ConvOp, DenseOp, NormOp, Op, OptimOp, UpdateRule};
use crate::options::CompileOptions;
use crate::plan::Mode;

/// An update op's rule, the slot of the updated tensor, the first state slot and the columns of
/// the `[K, C]` view of its parameter; `None` for other ops.
fn update_slots(op: &Op, g: &Graph, n: NodeIndex) -> Option<(UpdateRule, usize, usize, usize)> {
    let cols = |slot: usize| {
        let v = *g.inputs(n).get(slot)?;
        g.ty(v).shape.last().copied()
    };
    match op {
        Op::Optim(OptimOp::Update { rule, .. }) => Some((*rule, 0, 2, 1)),
        Op::Optim(OptimOp::BiasGradUpdate { rule, .. }) => Some((*rule, 1, 2, 1)),
        Op::Dense(DenseOp::DenseBwdWeightUpdate { rule, .. })
        | Op::Conv(ConvOp::Conv2dBwdWeightUpdate { rule, .. }) => Some((*rule, 2, 3, cols(2)?)),
        _ => None,
    }
}

/// Pass: with `ranks` > 1, every update keeps only this rank's shard of its optimizer state
/// (after `fuse_weight_update`, which decides each parameter's `[K, C]` view; before
/// `fuse_epilogues`, which folds a sharded bias update only into a weight update sharded alike).
pub fn shard_optimizer_state(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if ctx.mode != Mode::Train || ctx.ranks <= 1 {
        return Ok(false);
    }
    let mut changed = false;
    for n in g.nodes() {
        let op = g.node(n).op.clone();
        let Some((rule, w_slot, first, cols)) = update_slots(&op, g, n) else {
            continue;
        };
        let ins = g.inputs(n);
        let w = g.ty(ins[w_slot]).shape.clone();
        let layout = Layout::of(&w, cols, ctx.ranks);
        let ns = rule.state_names().len();
        for s in &ins[first..first + ns] {
            if !matches!(g.node(s.0).op, Op::OptState { .. }) {
                return Err(CompileError::InvalidModel(format!(
                    "data parallel: the state of `{}` is not an optimizer-state leaf",
                    g.node(n).name
                )));
            }
            g.g[s.0].outputs[0] = TensorType::f32(vec![layout.shard_elems()]);
            g.state_layouts.insert(s.0, layout);
        }
        // (clip_norm: a gradient the ranks summed before its norm is not summed again)
        let summed = matches!(
            g.node(ins[1].0).op,
            Op::Optim(OptimOp::GradAllReduce { .. })
        );
        let mut op = op;
        if let Op::Optim(OptimOp::Update { summed: s, .. }) = &mut op {
            *s = summed;
        }
        match &mut op {
            Op::Optim(OptimOp::Update { shards, .. } | OptimOp::BiasGradUpdate { shards, .. })
            | Op::Dense(DenseOp::DenseBwdWeightUpdate { shards, .. })
            | Op::Conv(ConvOp::Conv2dBwdWeightUpdate { shards, .. }) => *shards = ctx.ranks,
            _ => continue,
        }
        let types: Vec<TensorType> = g.inputs(n).iter().map(|v| g.ty(*v).clone()).collect();
        let outs = infer_outputs(&op, &types, None).map_err(|e| {
            CompileError::InvalidModel(format!(
                "data parallel: `{}` cannot be sharded: {e}",
                g.node(n).name
            ))
        })?;
        let node = &mut g.g[n];
        node.op = op;
        node.outputs = outs;
        changed = true;
    }
    Ok(changed)
}

/// The model one rank of `opts.ranks` compiles (training only): what data parallel does not do
/// yet refused with what to do instead, and each loss term weighted by 1/ranks (the ranks' losses
/// and gradients then sum to the mean over the global batch). The global batch must split evenly.
pub fn rank_model<'m>(
    model: &'m Model,
    opts: &CompileOptions,
) -> Result<Cow<'m, Model>, CompileError> {
    let ranks = opts.ranks.max(1);
    if ranks == 1 || opts.mode != Mode::Train {
        return Ok(Cow::Borrowed(model));
    }
    let refuse = |what: String| {
        Err(CompileError::InvalidModel(format!(
            "data parallel over {ranks} ranks: {what}"
        )))
    };
    let batch = opts.batch.unwrap_or(model.train.batch);
    #[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; MSRV is 1.80
    if batch % ranks != 0 {
        return refuse(format!(
            "the batch of {batch} does not split evenly: use a batch that is a multiple of {ranks} (`--batch`), or another number of ranks"
        ));
    }
    let mut m = model.clone();
    for t in &mut m.loss.terms {
        t.weight = (t.weight as f64 / ranks as f64) as f32;
    }
    Ok(Cow::Owned(m))
}

/// Data parallel: every batchnorm op of the step (the forward and its backward) normalises over
/// the ranks' whole batch (`ranks` set: the CPU sums over its collective at run time, the GPU's
/// program sums into the op's workspace), and the running statistics' update takes the unbiased
/// variance of the whole batch's rows (its `count` times the ranks).
pub fn rank_batchnorm(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if ctx.mode != Mode::Train || ctx.ranks <= 1 {
        return Ok(false);
    }
    let unranked = |g: &Graph, n: NodeIndex| {
        matches!(g.node(n).op, Op::Norm(NormOp::BatchNorm { ranks: 1, .. }))
    };
    let mut changed = false;
    // the statistics' updates first: each reads an unranked batchnorm's mean once
    for n in g.nodes() {
        let stats_of = match g.node(n).op {
            Op::Norm(NormOp::BatchNormStats { .. }) => g.inputs(n).get(2).map(|v| v.0),
            _ => None,
        };
        if !stats_of.is_some_and(|bn| unranked(g, bn)) {
            continue;
        }
        if let Some(node) = g.g.node_weight_mut(n) {
            if let Op::Norm(NormOp::BatchNormStats { count, .. }) = &mut node.op {
                *count *= ctx.ranks;
                changed = true;
            }
        }
    }
    for n in g.nodes() {
        if let Some(node) = g.g.node_weight_mut(n) {
            if let Op::Norm(NormOp::BatchNorm { ranks, .. } | NormOp::BatchNormBwd { ranks, .. }) =
                &mut node.op
            {
                if *ranks != ctx.ranks {
                    *ranks = ctx.ranks;
                    changed = true;
                }
            }
        }
    }
    Ok(changed)
}
