//! Emission: graph + schedule -> [`Plan`].
//!
//! One buffer per value, except `Reshape` outputs and aliased (in-place) outputs, which live in
//! their input's buffer ([`Graph::buffer_root`]). Buffer kinds come from the producing op/phase,
//! live ranges from the schedule (first write .. last read; persistent for parameters and
//! optimizer state; inputs from step 0; the loss and the output until the last step), plus one
//! workspace buffer per `Workspace` parameter of a step's signature (sized by
//! [`Op::workspace_elems`]). Offsets come from [`place`] with the chosen planner; the cap is
//! enforced by the caller (`compile`). Identical kernels
//! (same op, same argument shapes) are deduplicated.

use std::hash::{Hash, Hasher};

use petgraph::stable_graph::NodeIndex;

use crate::alias::{BufferRoots, ValueMap};
use crate::ctx::Ctx;
use crate::error::CompileError;
use crate::fxhash::{FxHashMap, FxHasher};
use crate::ir::{Graph, Phase, Value};
use crate::op::{DType, Op, PoolOp, Role};
use crate::placement::{place, Interval, PlannerKind};
use crate::plan::{
    Buffer, BufferId, BufferKind, ClipNormMethod, Init, IoBinding, Kernel, Mode, ParamBinding,
    Plan, RunPass, Step, Store, FORMAT_VERSION,
};

/// Plans with more buffers than this are placed on a second thread while their buffers are built.
const PARALLEL_BUFFERS: usize = 4096;

/// A buffer being emitted (see [`Buffer`]): its step range is its first write and last read.
pub(crate) struct Buf {
    pub(crate) name: String,
    pub(crate) bytes: u64,
    pub(crate) dtype: DType,
    pub(crate) kind: BufferKind,
    pub(crate) persistent: bool,
    pub(crate) first_write: Option<usize>,
    pub(crate) last_read: Option<usize>,
    pub(crate) pinned: bool,
    /// The host store for a streamed tensor's home ([`crate::stream`]), at `host_offset`.
    pub(crate) store: Store,
    pub(crate) host_offset: u64,
}

impl Buf {
    /// An arena buffer not yet written or read (its range is set as steps use it).
    pub(crate) fn new(
        name: String,
        bytes: u64,
        dtype: DType,
        kind: BufferKind,
        persistent: bool,
    ) -> Self {
        Buf {
            name,
            bytes,
            dtype,
            kind,
            persistent,
            first_write: None,
            last_read: None,
            pinned: false,
            store: Store::Arena,
            host_offset: 0,
        }
    }
}

fn value_name(g: &Graph, v: Value) -> String {
    let n = g.node(v.0);
    match (&n.op, v.1) {
        (_, 0) => n.name.clone(),
        (Op::Pool(PoolOp::MaxPool { .. }), 1) => [n.name.as_str(), ".argmax"].concat(),
        (_, o) => format!("{}.{o}", n.name),
    }
}

fn kind_of(g: &Graph, root: Value) -> BufferKind {
    let n = g.node(root.0);
    match (&n.op, n.phase) {
        (Op::Param { .. }, _) => BufferKind::Parameter,
        (Op::OptState { .. }, _) => BufferKind::OptimizerState,
        (Op::RunStat { .. }, _) => BufferKind::RunningStat,
        (Op::GradBuf { .. }, _) => BufferKind::GradAccum,
        (Op::Input { .. }, _) => BufferKind::Input,
        (_, Phase::Forward | Phase::Loss) => BufferKind::Activation,
        (_, Phase::Backward | Phase::Update) => BufferKind::Gradient,
    }
}

/// A hash of a kernel's argument shapes (kernels are told apart by comparing them in full).
fn shape_hash(shapes: &[Vec<usize>]) -> u64 {
    let mut h = FxHasher::default();
    shapes.hash(&mut h);
    h.finish()
}

/// Builds the plan for `g` executed in `order` (kernel nodes only, see [`crate::schedule`]).
pub fn emit(
    g: &Graph,
    order: &[NodeIndex],
    ctx: &Ctx,
    planner: PlannerKind,
) -> Result<Plan, CompileError> {
    // About two buffers a step (an output, a workspace): reserved, not grown by doubling.
    let mut bufs: Vec<Buf> = Vec::with_capacity(2 * order.len() + g.params.len() + 8);
    let mut of: ValueMap<BufferId> = ValueMap::new(g);
    let new_buf = |bufs: &mut Vec<Buf>, g: &Graph, v: Value| -> BufferId {
        let t = g.ty(v);
        let kind = kind_of(g, v);
        let persistent = matches!(
            kind,
            BufferKind::Parameter
                | BufferKind::OptimizerState
                | BufferKind::RunningStat
                | BufferKind::GradAccum
        );
        bufs.push(Buf::new(
            value_name(g, v),
            t.bytes(),
            t.dtype,
            kind,
            persistent,
        ));
        bufs.len() - 1
    };
    // Leaves first, in binding order: parameters, optimizer state, inputs, targets.
    let leaves: Vec<NodeIndex> = g
        .params
        .iter()
        .map(|(p, _)| *p)
        .chain(g.opt_state.iter().map(|(s, _, _)| *s))
        .chain(g.grad_bufs.iter().copied())
        .chain(g.inputs.iter().copied())
        .chain(g.targets.iter().copied())
        .filter(|n| g.g.contains_node(*n))
        .collect();
    for n in leaves {
        let id = new_buf(&mut bufs, g, (n, 0));
        of.insert((n, 0), id);
    }

    let mut roots = BufferRoots::new(g);
    let mut kernels: Vec<Kernel> = vec![];
    // Kernel ids by (op kind, hash of the argument shapes), in id order, and the count of kernels
    // per kind: deduplication and naming without scanning every kernel at every step.
    let mut same_shapes: FxHashMap<(&'static str, u64), Vec<usize>> = FxHashMap::default();
    let mut kinds: FxHashMap<&'static str, usize> = FxHashMap::default();
    let mut steps: Vec<Step> = Vec::with_capacity(order.len());
    // The argument shapes of the current step; reused (most steps reuse a kernel, so the shapes
    // are only compared), cloned into a new kernel.
    let mut shapes: Vec<Vec<usize>> = vec![];
    let set_shape = |shapes: &mut Vec<Vec<usize>>, k: usize, s: &[usize]| match shapes.get_mut(k) {
        Some(v) => {
            v.clear();
            v.extend_from_slice(s);
        }
        None => shapes.push(s.to_vec()),
    };
    for (s, &n) in order.iter().enumerate() {
        let node = g.node(n);
        let op = &node.op;
        let ins = g.inputs(n);
        let mut args = vec![];
        let aliased = op.aliased_outputs();
        for v in &ins {
            let root = roots.root(*v);
            let id = *of.get(root).ok_or_else(|| {
                CompileError::Internal(format!(
                    "step {s} `{}` reads `{}` before it is produced",
                    node.name,
                    value_name(g, root)
                ))
            })?;
            bufs[id].last_read = Some(s);
            set_shape(&mut shapes, args.len(), &g.ty(*v).shape);
            args.push(id);
        }
        for (o, t) in node.outputs.iter().enumerate() {
            if let Some((_, i)) = aliased.iter().find(|(oo, _)| *oo == o) {
                // In place: the output lives in input i's buffer.
                let id = args[*i];
                bufs[id].first_write.get_or_insert(s);
                of.insert((n, o), id);
                continue;
            }
            let id = new_buf(&mut bufs, g, (n, o));
            bufs[id].first_write = Some(s);
            of.insert((n, o), id);
            set_shape(&mut shapes, args.len(), &t.shape);
            args.push(id);
        }
        shapes.truncate(args.len());
        let params = op.params();
        let ws_names = params
            .iter()
            .filter(|(_, role, _)| *role == Role::Workspace)
            .map(|(name, _, _)| *name);
        let sizes = if ctx.split_room {
            op.workspace_elems(&shapes)
        } else {
            op.workspace_elems_unsplit(&shapes)
        };
        for (elems, pname) in sizes.into_iter().zip(ws_names) {
            bufs.push(Buf {
                first_write: Some(s),
                last_read: Some(s),
                ..Buf::new(
                    [node.name.as_str(), " workspace ", pname].concat(),
                    (elems * DType::F32.size()) as u64,
                    DType::F32,
                    BufferKind::Workspace,
                    false,
                )
            });
            set_shape(&mut shapes, args.len(), &[elems]);
            args.push(bufs.len() - 1);
        }
        if params.len() != args.len() {
            return Err(CompileError::Internal(format!(
                "step `{}`: {} args for a {}-parameter signature",
                node.name,
                args.len(),
                params.len()
            )));
        }
        let bucket = same_shapes
            .entry((op.kind_name(), shape_hash(&shapes)))
            .or_default();
        let same = |k: &Kernel| k.op == *op && k.arg_shapes == shapes;
        let kernel = match bucket.iter().copied().find(|&k| same(&kernels[k])) {
            Some(k) => k,
            None => {
                let same_kind = kinds.entry(op.kind_name()).or_default();
                let name = format!("{}_{same_kind}", op.kind_name());
                *same_kind += 1;
                bucket.push(kernels.len());
                kernels.push(Kernel {
                    id: kernels.len(),
                    name,
                    op: op.clone(),
                    arg_shapes: shapes.clone(),
                    signature: op.signature(),
                });
                kernels.len() - 1
            }
        };
        let label = match node.phase {
            // (`concat`, not `format!`: a label per step.)
            Phase::Forward => [node.name.as_str(), " forward"].concat(),
            _ => node.name.clone(),
        };
        steps.push(Step {
            kernel,
            args,
            label,
            phase: node.phase.into(),
            ready: None,
        });
    }

    // The loss and the output are read by the runtime after the last step.
    let mut lookup = |of: &ValueMap<BufferId>, v: Value| -> Result<BufferId, CompileError> {
        of.get(roots.root(v))
            .copied()
            .ok_or_else(|| CompileError::Internal(format!("`{}` has no buffer", value_name(g, v))))
    };
    let output_buf = lookup(&of, g.output)?;
    bufs[output_buf].pinned = true;
    let loss_buf = match g.loss {
        Some(l) => lookup(&of, l)?,
        None => {
            bufs.push(Buf::new(
                "loss (unused in predict)".into(),
                4,
                DType::F32,
                BufferKind::Activation,
                false,
            ));
            bufs.len() - 1
        }
    };
    bufs[loss_buf].pinned = g.loss.is_some();
    // Sharded parameters: each rank's rows at home, every use reading a gathered window.
    let sharded = if ctx.shard_params {
        crate::shard_params::shard_parameters(&mut bufs, &mut steps, &mut kernels)
    } else {
        vec![]
    };
    // Streaming: the chosen tensors' homes to the host store, their uses to windows.
    let host_bytes = if ctx.stream > 0 {
        crate::stream::stream(
            &mut bufs,
            &mut steps,
            &mut kernels,
            ctx.stream,
            ctx.offload,
            ctx.prefetch,
        )
    } else {
        0
    };

    let last = steps.len().saturating_sub(1);
    let reqs: Vec<Interval> = bufs
        .iter()
        .map(|b| {
            if b.store == Store::Host {
                // not in the arena
                return Interval {
                    bytes: 0,
                    start: 0,
                    end: 0,
                    persistent: false,
                };
            }
            let live = if b.persistent {
                (0, last)
            } else {
                let start = if b.kind == BufferKind::Input {
                    0
                } else {
                    b.first_write.unwrap_or(0)
                };
                let mut end = b
                    .last_read
                    .unwrap_or(start)
                    .max(b.first_write.unwrap_or(start))
                    .max(start);
                if b.pinned {
                    end = last.max(start);
                }
                (start, end)
            };
            Interval {
                bytes: b.bytes,
                start: live.0,
                end: live.1,
                persistent: b.persistent,
            }
        })
        .collect();
    // The plan's buffers, their offsets filled in once placed.
    let build = |bufs: Vec<Buf>| -> Vec<Buffer> {
        bufs.into_iter()
            .zip(&reqs)
            .enumerate()
            .map(|(id, (b, r))| Buffer {
                id,
                layer: crate::plan::layer_of(&b.name).to_string(),
                name: b.name,
                bytes: b.bytes,
                dtype: b.dtype,
                kind: b.kind,
                offset: b.host_offset,
                live: if b.store == Store::Host {
                    (0, last)
                } else {
                    (r.start, r.end)
                },
                persistent: b.persistent,
                store: b.store,
            })
            .collect()
    };
    // Many buffers: placed on a second thread while they are built (both only read `reqs`).
    let (placement, mut buffers) = if reqs.len() > PARALLEL_BUFFERS {
        std::thread::scope(|s| {
            let placed = s.spawn(|| place(&reqs, planner));
            let buffers = build(bufs);
            let placement = placed
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (placement, buffers)
        })
    } else {
        (place(&reqs, planner), build(bufs))
    };
    for (b, &offset) in buffers.iter_mut().zip(&placement.offsets) {
        if b.store == Store::Arena {
            b.offset = offset;
        }
    }

    let mut io = |n: NodeIndex| -> Result<IoBinding, CompileError> {
        Ok(IoBinding {
            name: g.node(n).name.clone(),
            buffer: lookup(&of, (n, 0))?,
            shape: g.ty((n, 0)).shape.clone(),
            dtype: g.ty((n, 0)).dtype,
        })
    };
    let inputs = g
        .inputs
        .iter()
        .map(|n| io(*n))
        .collect::<Result<Vec<_>, _>>()?;
    let targets = g
        .targets
        .iter()
        .map(|n| io(*n))
        .collect::<Result<Vec<_>, _>>()?;
    let params = g
        .params
        .iter()
        .map(|(p, m)| {
            let buffer = lookup(&of, (*p, 0))?;
            Ok(ParamBinding {
                name: m.name.clone(),
                buffer,
                shape: m.shape.clone(),
                init: m.init,
                // (sharded parameters: the buffer holds this rank's rows)
                shard: sharded.iter().find(|(b, _)| *b == buffer).map(|(_, l)| *l),
            })
        })
        .collect::<Result<Vec<_>, CompileError>>()?;
    let opt_state = g
        .opt_state
        .iter()
        .map(|(s, name, _p)| {
            let shard = g.state_layouts.get(s).copied();
            Ok(ParamBinding {
                name: name.clone(),
                buffer: lookup(&of, (*s, 0))?,
                // a sharded state's binding names the parameter's full shape, its buffer holds
                // this rank's part
                shape: match shard {
                    Some(_) => g.ty((*_p, 0)).shape.clone(),
                    None => g.ty((*s, 0)).shape.clone(),
                },
                init: Init::Zeros,
                shard,
            })
        })
        .collect::<Result<Vec<_>, CompileError>>()?;
    let output = IoBinding {
        name: g.node(g.output.0).name.clone(),
        buffer: output_buf,
        shape: g.ty(g.output).shape.clone(),
        dtype: g.ty(g.output).dtype,
    };
    let mode = ctx.mode;
    debug_assert!(mode != Mode::Train || g.loss.is_some());
    let mut plan = Plan {
        format_version: FORMAT_VERSION,
        mode,
        batch: g.batch,
        arena_bytes: placement.arena_bytes,
        host_bytes,
        buffers,
        kernels,
        steps,
        inputs,
        targets,
        params,
        opt_state,
        loss: loss_buf,
        output,
        optimizer: ctx.optimizer,
        schedule: ctx.schedule,
        lower_bound_bytes: placement.lower_bound,
        placement_strategy: placement.strategy.to_string(),
        accumulate: if mode == Mode::Train {
            ctx.accumulate
        } else {
            1
        },
        ranks: if mode == Mode::Train { ctx.ranks } else { 1 },
        clip_norm: None,
        precision: ctx.precision,
    };
    if mode == Mode::Train {
        plan.clip_norm = clip_norm_plan(&plan, ctx.clip_method);
    }
    Ok(plan)
}

/// What `clip_norm` costs in `plan`. Held gradients: the gradient buffers (unless accumulation
/// holds them anyway) and the squared norm's buffers; 2 FLOPs per gradient element for the norm
/// and 1 for the scaling. The norm pass: the norm's buffers and the most bytes of the (unfused)
/// gradients live at once, an upper bound of what not fusing them costs; the same FLOPs plus
/// every step the second run repeats, and one extra forward/backward pass.
fn clip_norm_plan(plan: &Plan, method: ClipNormMethod) -> Option<crate::plan::ClipNormPlan> {
    use crate::op::OptimOp;
    let max_norm = plan.optimizer.clip_norm()?;
    let mut norm_bufs = std::collections::BTreeSet::new();
    let mut grads = std::collections::BTreeSet::new();
    let mut elems = 0u64;
    for s in &plan.steps {
        match plan.kernels[s.kernel].op {
            Op::Optim(OptimOp::GradSqNorm { .. }) => {
                norm_bufs.extend(s.args.get(1).copied());
                grads.extend(s.args.first().copied());
                elems += plan.kernels[s.kernel]
                    .arg_shapes
                    .first()
                    .map_or(0, |sh| sh.iter().product::<usize>() as u64);
            }
            Op::Optim(OptimOp::GradNormStore) => norm_bufs.extend(s.args.get(1).copied()),
            _ => {}
        }
    }
    let norm: u64 = norm_bufs.iter().map(|&b| plan.buffers[b].bytes).sum();
    let (extra_bytes, extra_flops, extra_passes) = match method {
        ClipNormMethod::HeldGradients => {
            let held: u64 = if plan.accumulate > 1 {
                0
            } else {
                plan.buffers
                    .iter()
                    .filter(|b| b.kind == BufferKind::GradAccum)
                    .map(|b| b.bytes)
                    .sum()
            };
            (held + norm, 3 * elems, 0)
        }
        ClipNormMethod::NormPass => {
            // the most gradient bytes live at any step
            let live_grads = (0..plan.steps.len())
                .map(|t| {
                    grads
                        .iter()
                        .map(|&b| &plan.buffers[b])
                        .filter(|b| !b.persistent && b.live.0 <= t && t <= b.live.1)
                        .map(|b| b.bytes)
                        .sum::<u64>()
                })
                .max()
                .unwrap_or(0);
            let again: u64 = (0..plan.steps.len())
                .filter(|&si| {
                    plan.runs_step(si, RunPass::Norm) && plan.runs_step(si, RunPass::Update)
                })
                .map(|si| crate::cost::step_flops(plan, si))
                .sum();
            (live_grads + norm, 3 * elems + again, 1)
        }
    };
    Some(crate::plan::ClipNormPlan {
        max_norm,
        method,
        extra_bytes,
        extra_flops,
        extra_passes,
    })
}
