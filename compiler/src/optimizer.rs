//! The optimizer pass: per parameter with a gradient, its optimizer-state leaves
//! (`<param>.momentum`, `<param>.adam_m` / `<param>.adam_v`, RMSprop's `<param>.square_avg` (and
//! `<param>.momentum_buffer`), Lion's `<param>.exp_avg`) and one `Update`
//! node consuming `(param, grad, state...)`, whose outputs alias the param/state buffers. With
//! `accumulate: N`, each gradient is first added (times 1/N) into the parameter's persistent
//! gradient buffer (`GradBuf` leaf, `GradAccum` node), which the update reads and zeroes.
//! With `clip_norm`, a chain of `GradSqNorm` nodes sums the squared global norm; held gradients
//! (the gradient buffers, and every update after the chain) or the norm pass (each gradient
//! read by its link and its update, the chain's result stored into a persistent buffer that the
//! updates read, and two runs per step: see [`ClipNormMethod::NormPass`]).

use petgraph::stable_graph::NodeIndex;

use crate::ctx::Ctx;
use crate::error::CompileError;
use crate::ir::{Graph, Phase, TensorType, Value};
use crate::op::{Op, OptimOp, Optimizer};
use crate::plan::{ClipNormMethod, Mode};

/// The update op of an optimizer and the suffixes of its state slots (one per
/// [`UpdateRule::state_names`](crate::op::UpdateRule::state_names), in order).
pub fn update_op(opt: &Optimizer) -> (Op, &'static [&'static str]) {
    let states: &'static [&'static str] = match opt {
        Optimizer::Sgd { momentum, .. } if *momentum != 0.0 => &["momentum"],
        Optimizer::Sgd { .. } => &[],
        Optimizer::Adam { .. } => &["adam_m", "adam_v"],
        // PyTorch's names of the state (`state[p]["square_avg"]`, ...)
        Optimizer::RmsProp { momentum, .. } if *momentum != 0.0 => {
            &["square_avg", "momentum_buffer"]
        }
        Optimizer::RmsProp { .. } => &["square_avg"],
        Optimizer::Lion { .. } => &["exp_avg"],
    };
    (
        Op::Optim(OptimOp::Update {
            summed: false,
            shards: 1,
            keep_rows: false,
            rule: *opt,
            zero_grad: false,
        }),
        states,
    )
}

/// At most the nodes and edges [`optimizer_update`] adds for `ngrads` parameter gradients: per
/// parameter its state leaves and the update (reading the parameter, the gradient, the state),
/// with accumulation or `clip_norm` a gradient buffer, its accumulation and a norm link.
pub(crate) fn added(ctx: &Ctx, ngrads: usize) -> (usize, usize) {
    let (_, suffixes) = update_op(&ctx.optimizer);
    let held = ctx.accumulate > 1 || ctx.optimizer.clip_norm().is_some();
    let (n, e) = if held { (3, 5) } else { (0, 0) };
    (
        ngrads * (suffixes.len() + 1 + n),
        ngrads * (suffixes.len() + 3 + e),
    )
}

/// Pass: adds the optimizer state and update nodes (train mode only).
pub fn optimizer_update(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if ctx.mode != Mode::Train {
        return Ok(false);
    }
    let (mut op, suffixes) = update_op(&ctx.optimizer);
    // Gradients held in buffers: to accumulate them, or (clip_norm) to take their global norm
    // before any update.
    let clip_norm = ctx.optimizer.clip_norm().is_some();
    let norm_pass = clip_norm && ctx.clip_method == ClipNormMethod::NormPass;
    if norm_pass && ctx.ranks > 1 {
        return Err(CompileError::InvalidModel(format!(
            "clip_norm in two passes over {} data-parallel ranks is not supported (its norm would need the ranks' gradients summed in the norm pass): use the held-gradient method (`--clip-norm-method held`), which needs room for the gradients",
            ctx.ranks
        )));
    }
    if norm_pass && ctx.accumulate > 1 {
        return Err(CompileError::InvalidModel(format!(
            "clip_norm in two passes with accumulate: {} (accumulation holds the gradients anyway: use the held-gradient method)",
            ctx.accumulate
        )));
    }
    let accumulate = ctx.accumulate > 1 || (clip_norm && !norm_pass);
    if let Op::Optim(OptimOp::Update { zero_grad, .. }) = &mut op {
        *zero_grad = accumulate;
    }
    let grads: Vec<(NodeIndex, Value)> = g.grads.iter().map(|(p, d)| (*p, *d)).collect();
    // (Usually reserved already by autodiff, with its own nodes: the graph's vectors are then
    // grown once, not copied again here.)
    let (nodes, edges) = added(ctx, grads.len());
    g.reserve(nodes, edges);
    let mut changed = false;
    let mut held: Vec<(NodeIndex, Vec<Value>, String)> = Vec::with_capacity(grads.len());
    for (p, d) in grads {
        let pname = g.node(p).name.clone();
        let pty = g.ty((p, 0)).clone();
        // With accumulation, the micro-batch's gradient is added (scaled by 1/N) into the
        // parameter's persistent gradient buffer, which the update reads and zeroes.
        let d = if accumulate {
            let name = [pname.as_str(), ".grad_accum"].concat();
            let leaf = g.add_leaf(
                Op::GradBuf { name: name.clone() },
                TensorType::f32(pty.shape.clone()),
                name,
                Phase::Backward,
            );
            g.grad_bufs.push(leaf);
            let scale = (1.0f64 / ctx.accumulate as f64) as f32;
            let acc = g.add_node(
                Op::Optim(OptimOp::GradAccum { scale }),
                &[(leaf, 0), d],
                [pname.as_str(), " grad accumulate"].concat(),
                Phase::Backward,
                None,
            )?;
            (acc, 0)
        } else {
            d
        };
        // Data parallel with clip_norm: the held gradient summed over the ranks before its norm
        // (every rank the same sum, so the same norm); its update then does not sum it again.
        let d = if clip_norm && ctx.ranks > 1 {
            let r = g.add_node(
                Op::Optim(OptimOp::GradAllReduce { shards: ctx.ranks }),
                &[d],
                [pname.as_str(), " grad all-reduce"].concat(),
                Phase::Update,
                None,
            )?;
            (r, 0)
        } else {
            d
        };
        let mut ins = vec![(p, 0), d];
        for s in suffixes {
            let name = [pname.as_str(), ".", s].concat();
            let leaf = g.add_leaf(
                Op::OptState { name: name.clone() },
                TensorType::f32(pty.shape.clone()),
                name.clone(),
                Phase::Update,
            );
            g.opt_state.push((leaf, name, p));
            ins.push((leaf, 0));
        }
        if clip_norm {
            held.push((p, ins, pname));
        } else {
            add_update(g, &op, &ins, &pname)?;
        }
        changed = true;
    }
    // clip_norm: the squared global norm of the gradients, chained over the parameters. Held:
    // the first link writes it, and every update reads the chain's last link. Norm pass: the
    // links add in place to a persistent sum (so none allocates), in the order the gradients are
    // produced (the backward creates them last layer first), so that each link can run as soon
    // as its gradient is complete; the store moves the sum into the persistent
    // `clip_norm.sq_norm` (zeroing the sum), which the updates read as it was before the run.
    let mut norm: Option<Value> = None;
    let mut stored: Option<NodeIndex> = None;
    if norm_pass && !held.is_empty() {
        held.sort_by_key(|(_, ins, _)| ins[1]);
        let mut leaf = |name: &str| {
            let l = g.add_leaf(
                Op::GradBuf {
                    name: name.to_string(),
                },
                TensorType::f32(vec![1]),
                name.to_string(),
                Phase::Update,
            );
            g.grad_bufs.push(l);
            l
        };
        norm = Some((leaf("clip_norm.sq_norm_sum"), 0));
        stored = Some(leaf("clip_norm.sq_norm"));
    }
    for (_, ins, pname) in &held {
        let (op, inputs) = match norm {
            None => (OptimOp::GradSqNorm { first: true }, vec![ins[1]]),
            Some(s) => (OptimOp::GradSqNorm { first: false }, vec![ins[1], s]),
        };
        let n = g.add_node(
            Op::Optim(op),
            &inputs,
            [pname.as_str(), " grad norm"].concat(),
            Phase::Update,
            None,
        )?;
        norm = Some((n, 0));
    }
    let Some(mut s) = norm else {
        return Ok(changed);
    };
    if let Some(stored) = stored {
        g.add_node(
            Op::Optim(OptimOp::GradNormStore),
            &[s, (stored, 0)],
            "clip_norm store".to_string(),
            Phase::Update,
            None,
        )?;
        s = (stored, 0);
    }
    for (_, mut ins, pname) in held {
        ins.push(s);
        add_update(g, &op, &ins, &pname)?;
    }
    Ok(changed)
}

/// The update node of parameter `pname`, reading `ins` (parameter, gradient, state, and the
/// squared norm under clip_norm).
fn add_update(g: &mut Graph, op: &Op, ins: &[Value], pname: &str) -> Result<(), CompileError> {
    g.add_node(
        op.clone(),
        ins,
        [pname, " update"].concat(),
        Phase::Update,
        None,
    )?;
    Ok(())
}
