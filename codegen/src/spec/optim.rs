//! Optimizer updates: the per-element update of one parameter (`optim.cu.tera`), the bias
//! gradient alone or fused with its update (`bias_grad.cu.tera`), and the context of
//! `update.cuh.tera` (the one per-element SGD / Adam / RMSprop / Lion update) that the fused convolution and dense
//! weight gradients share.

use tera::Context;

use dmc_plan::update::UpdateRule;

use super::common::{blocks, f32_lit, numel, per_element, reduction, Site, Spec};
use crate::error::CodegenError;
use dmc_plan::op::{bias_chunks, OptimOp, BIAS_CHUNK_ROWS};

/// The context of `update.cuh.tera` for `rule`, updating the buffer `target` (`w` or `b`) and the
/// state slots named by [`UpdateRule::state_names`], and `fused_update` (a gradient kernel that
/// applies the update itself instead of storing the gradient).
pub(crate) fn rule_ctx(ctx: &mut Context, rule: &UpdateRule, target: &str, fused: bool) {
    ctx.insert("target", target);
    ctx.insert("states", rule.state_names());
    ctx.insert("fused_update", &fused);
    match rule.clip_value() {
        Some(v) => ctx.insert("clip_value", &f32_lit(v)),
        None => ctx.insert("clip_value", &false),
    }
    match *rule {
        UpdateRule::Sgd {
            lr: _,
            momentum,
            weight_decay,
            nesterov,
            ..
        } => {
            ctx.insert("rule", "sgd");
            ctx.insert("momentum", &(momentum != 0.0));
            ctx.insert("momentum_value", &f32_lit(momentum));
            ctx.insert("weight_decay", &f32_lit(weight_decay));
            ctx.insert("nesterov", &nesterov);
        }
        UpdateRule::Adam {
            lr: _,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
            ..
        } => {
            ctx.insert("rule", "adam");
            ctx.insert("beta1", &f32_lit(beta1));
            ctx.insert("beta2", &f32_lit(beta2));
            ctx.insert("eps", &f32_lit(eps));
            ctx.insert("weight_decay", &f32_lit(weight_decay));
            ctx.insert("decoupled", &decoupled);
        }
        UpdateRule::RmsProp {
            lr: _,
            alpha,
            eps,
            weight_decay,
            momentum,
            ..
        } => {
            ctx.insert("rule", "rmsprop");
            ctx.insert("alpha", &f32_lit(alpha));
            ctx.insert("eps", &f32_lit(eps));
            ctx.insert("weight_decay", &f32_lit(weight_decay));
            ctx.insert("momentum", &(momentum != 0.0));
            ctx.insert("momentum_value", &f32_lit(momentum));
            ctx.insert("nesterov", &false);
        }
        UpdateRule::Lion {
            lr: _,
            beta1,
            beta2,
            weight_decay,
            ..
        } => {
            ctx.insert("rule", "lion");
            ctx.insert("beta1", &f32_lit(beta1));
            ctx.insert("beta2", &f32_lit(beta2));
            ctx.insert("weight_decay", &f32_lit(weight_decay));
        }
    }
}

/// The bias of a weight-gradient kernel that fused the bias gradient and its update
/// (`fused_bias`): the bias state slots ([`UpdateRule::bias_state_names`]) for `BIAS_STORE`.
pub(crate) fn bias_ctx(ctx: &mut Context, rule: &UpdateRule) {
    ctx.insert("fused_bias", &true);
    ctx.insert("bias_states", rule.bias_state_names());
    // a split kernel's bias chunk sums go to the op's bias workspace
    ctx.insert("bias_ws", "db");
}

/// `Update`: w, g, state.. -> w', state'.., one thread per weight.
pub(crate) fn update(s: &Site, rule: &UpdateRule, zero_grad: bool) -> Result<Spec, CodegenError> {
    let mut sp = per_element(s, "optim.cu.tera", numel(s.shape(0)?))?;
    rule_ctx(&mut sp.ctx, rule, "w", false);
    sp.ctx.insert("zero_grad", &zero_grad);
    match rule.clip_norm() {
        Some(m) => sp.ctx.insert("clip_norm", &f32_lit(m)),
        None => sp.ctx.insert("clip_norm", &false),
    }
    Ok(sp)
}

/// `GradSqNorm`: s = (first ? 0 : s) + sum g^2, one block (sums in double, as the CPU's).
pub(crate) fn grad_sq_norm(s: &Site, first: bool) -> Result<Spec, CodegenError> {
    let mut sp = reduction(s, "optim.cu.tera");
    sp.ctx.insert("n", &numel(s.shape(0)?));
    sp.ctx.insert("sq_norm_first", &first);
    Ok(sp)
}

/// `GradNormStore`: held = sum, sum = 0, one thread.
pub(crate) fn grad_norm_store(s: &Site) -> Result<Spec, CodegenError> {
    let mut sp = per_element(s, "optim.cu.tera", 1)?;
    sp.ctx.insert("norm_store", &true);
    Ok(sp)
}

/// `GradAccum`: acc += scale * g, one thread per element.
pub(crate) fn grad_accum(s: &Site, scale: f32) -> Result<Spec, CodegenError> {
    let mut sp = per_element(s, "optim.cu.tera", numel(s.shape(0)?))?;
    sp.ctx.insert("accum_scale", &f32_lit(scale));
    Ok(sp)
}

/// `BiasGrad` (`rule` none) or `BiasGradUpdate`: dy, then db (or the updated b): the fused kernel
/// applies the update to each column sum instead of storing it (its workspace `db` stays unused).
/// A block per 32 columns, a warp per chunk of rows at a time (up to 32): the plan's two-level
/// order ([`BIAS_CHUNK_ROWS`]), the one of the fused kernels' bias sums (in the weight gradient's
/// GEMM), so an unfused plan trains bit-identically to the fused one.
pub(crate) fn bias_grad(s: &Site, rule: Option<&UpdateRule>) -> Result<Spec, CodegenError> {
    let (dy, db) = (s.shape(0)?, s.shape(1)?);
    let c = numel(db);
    let rows = numel(dy) / c.max(1);
    let chunks = bias_chunks(rows);
    let warps = chunks.clamp(1, 32) as u32;
    let mut sp = per_element(s, "bias_grad.cu.tera", c)?;
    sp.grid = [blocks(c, 32, s.name())?, 1, 1];
    sp.block = [32 * warps, 1, 1];
    sp.ctx.insert("c", &c);
    sp.ctx.insert("rows", &rows);
    sp.ctx.insert("rc", &BIAS_CHUNK_ROWS);
    sp.ctx.insert("chunks", &chunks);
    sp.ctx.insert("warps", &warps);
    if let Some(rule) = rule {
        rule_ctx(&mut sp.ctx, rule, "b", true);
    }
    Ok(sp)
}

/// The kernel of one op of the optimizer family.
pub(crate) fn spec(s: &Site, op: &OptimOp) -> Result<Spec, CodegenError> {
    match op {
        OptimOp::Update {
            rule, zero_grad, ..
        } => update(s, rule, *zero_grad),
        OptimOp::GradAccum { scale } => grad_accum(s, *scale),
        OptimOp::GradSqNorm { first } => grad_sq_norm(s, *first),
        OptimOp::GradNormStore => grad_norm_store(s),
        OptimOp::BiasGrad => bias_grad(s, None),
        OptimOp::BiasGradUpdate { rule, .. } => bias_grad(s, Some(rule)),
        // (a program of `shard`, taken before this by `spec`, as every sharded op)
        OptimOp::GradAllReduce { .. } | OptimOp::GatherShard { .. } | OptimOp::KeepShard { .. } => {
            super::shard::spec(s)
        }
    }
}

/// The zoo's optimizer ops: the bias gradient, every update rule flavour (SGD plain / momentum /
/// nesterov, Adam / AdamW, RMSprop with and without momentum, Lion) and the bias gradient fused
/// with SGD, Adam, RMSprop and Lion; gradient accumulation and an update that zeroes the
/// accumulated gradient; an update and a fused bias update that clip by value.
pub(crate) fn zoo() -> Vec<super::cases::Case> {
    use super::cases::{adam, fused, lion, rmsprop, sgd};
    use dmc_plan::op::Op;
    let o = |op: OptimOp| Op::Optim(op);
    let sgd_plain = UpdateRule::Sgd {
        lr: 0.1,
        momentum: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        clip_value: None,
        clip_norm: None,
    };
    let sgd_nesterov = UpdateRule::Sgd {
        lr: 0.01,
        momentum: 0.9,
        weight_decay: 1e-4,
        nesterov: true,
        clip_value: None,
        clip_norm: None,
    };
    let adam_l2 = UpdateRule::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 1e-4,
        decoupled: false,
        clip_value: None,
        clip_norm: None,
    };
    vec![
        (o(OptimOp::BiasGrad), vec![vec![2, 3, 4, 5], vec![5]]),
        (o(OptimOp::BiasGrad), vec![vec![3, 7, 9, 40], vec![40]]),
        // the two-level sum over many chunks: 67 of 512 rows (three rounds of 32 warps, the last
        // chunk partial), and 34 chunks of 3 columns fused with an update
        (o(OptimOp::BiasGrad), vec![vec![34, 1000, 40], vec![40]]),
        fused(
            o(OptimOp::BiasGradUpdate {
                shards: 1,
                keep_rows: false,
                rule: sgd(0.9, false),
            }),
            vec![vec![17000, 3]],
            vec![3],
        ),
        (
            o(OptimOp::Update {
                summed: false,
                shards: 1,
                keep_rows: false,
                rule: sgd_plain,
                zero_grad: false,
            }),
            vec![vec![50], vec![50]],
        ),
        (
            o(OptimOp::Update {
                summed: false,
                shards: 1,
                keep_rows: false,
                rule: sgd_nesterov,
                zero_grad: false,
            }),
            vec![vec![50], vec![50], vec![50]],
        ),
        (
            o(OptimOp::Update {
                summed: false,
                shards: 1,
                keep_rows: false,
                rule: adam(true),
                zero_grad: false,
            }),
            vec![vec![50]; 4],
        ),
        (
            o(OptimOp::Update {
                summed: false,
                shards: 1,
                keep_rows: false,
                rule: adam_l2,
                zero_grad: false,
            }),
            vec![vec![50]; 4],
        ),
        fused(
            o(OptimOp::BiasGradUpdate {
                shards: 1,
                keep_rows: false,
                rule: sgd(0.9, false),
            }),
            vec![vec![2, 3, 4, 5]],
            vec![5],
        ),
        fused(
            o(OptimOp::BiasGradUpdate {
                shards: 1,
                keep_rows: false,
                rule: adam(false),
            }),
            vec![vec![2, 3, 4, 5]],
            vec![5],
        ),
        (
            o(OptimOp::Update {
                summed: false,
                shards: 1,
                keep_rows: false,
                rule: rmsprop(0.0),
                zero_grad: false,
            }),
            vec![vec![50]; 3],
        ),
        (
            o(OptimOp::Update {
                summed: false,
                shards: 1,
                keep_rows: false,
                rule: rmsprop(0.9),
                zero_grad: false,
            }),
            vec![vec![50]; 4],
        ),
        (
            o(OptimOp::Update {
                summed: false,
                shards: 1,
                keep_rows: false,
                rule: lion(),
                zero_grad: false,
            }),
            vec![vec![50]; 3],
        ),
        fused(
            o(OptimOp::BiasGradUpdate {
                shards: 1,
                keep_rows: false,
                rule: rmsprop(0.9),
            }),
            vec![vec![2, 3, 4, 5]],
            vec![5],
        ),
        fused(
            o(OptimOp::BiasGradUpdate {
                shards: 1,
                keep_rows: false,
                rule: lion(),
            }),
            vec![vec![2, 3, 4, 5]],
            vec![5],
        ),
        // gradient accumulation: the sum of micro-batch gradients, and the update that consumes it
        (
            o(OptimOp::GradAccum { scale: 0.25 }),
            vec![vec![50], vec![50]],
        ),
        (
            o(OptimOp::Update {
                summed: false,
                shards: 1,
                keep_rows: false,
                rule: adam(false),
                zero_grad: true,
            }),
            vec![vec![50]; 4],
        ),
        // clip_norm: the squared norm's chain (first and later links), an update scaled by it
        (
            o(OptimOp::GradSqNorm { first: true }),
            vec![vec![700], vec![1]],
        ),
        (
            o(OptimOp::GradSqNorm { first: false }),
            vec![vec![50], vec![1]],
        ),
        // the norm pass's store of the squared norm
        (o(OptimOp::GradNormStore), vec![vec![1], vec![1]]),
        (
            o(OptimOp::Update {
                summed: false,
                shards: 1,
                keep_rows: false,
                rule: sgd_nesterov.with_clip_norm(Some(1.5)),
                zero_grad: true,
            }),
            vec![vec![50], vec![50], vec![50], vec![1]],
        ),
        // `clip_value`: the gradient clamped first, in the update itself and in a fused one
        (
            o(OptimOp::Update {
                summed: false,
                shards: 1,
                keep_rows: false,
                rule: sgd_nesterov.with_clip_value(Some(0.25)),
                zero_grad: false,
            }),
            vec![vec![50], vec![50], vec![50]],
        ),
        fused(
            o(OptimOp::BiasGradUpdate {
                shards: 1,
                keep_rows: false,
                rule: adam(false).with_clip_value(Some(0.5)),
            }),
            vec![vec![2, 3, 4, 5]],
            vec![5],
        ),
    ]
}
