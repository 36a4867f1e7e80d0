//! The runtime's own check of a plan, run by every backend (CPU, CUDA, emulated CUDA) before it
//! allocates anything: buffers inside the arena and aligned, no two live buffers sharing bytes,
//! every step's arguments of their signature slot's dtype and size, no written argument overlapping
//! another, every kernel's argument shapes consistent with its op (`Op::check_args`: the op's one shape
//! rule, shared with the compiler), the
//! optimizer's settings usable. The backends' `unsafe` memory accesses rely on it.

use dmc_plan::op::TransferOp;
use dmc_plan::op::{DType, Op, Role};
use dmc_plan::plan::{Buffer, BufferId, BufferKind, Plan, Store, ALIGN};

use crate::error::RuntimeError;
use crate::poison::view_buffers;

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn bad(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::BadPlan(msg.into())
}

/// The runtime's own check of a plan, as every backend runs it before allocating anything:
/// buffers inside the arena and aligned, no two live buffers sharing bytes (by [`Plan::held`]),
/// every step's arguments of the right size, the optimizer's settings usable. Public so that tools
/// (the fuzzer) can hold the compiler's plans to it without allocating an arena.
pub fn check_plan(plan: &Plan) -> Result<(), RuntimeError> {
    validate(plan)
}

pub(crate) fn validate(plan: &Plan) -> Result<(), RuntimeError> {
    let arena = plan.arena_bytes;
    if plan.mode == dmc_plan::plan::Mode::Train {
        dmc_plan::plan::LearningRate::new(plan.optimizer.lr() as f64)
            .map_err(|reason| bad(format!("optimizer: {reason}")))?;
    }
    for (i, b) in plan.buffers.iter().enumerate() {
        if b.id != i {
            return Err(bad(format!("buffer #{i} has id {}", b.id)));
        }
        if b.offset % ALIGN != 0 {
            return Err(bad(format!(
                "buffer `{}` offset {} is not {ALIGN}-aligned",
                b.name, b.offset
            )));
        }
        let (room, store) = match b.store {
            Store::Arena => (arena, "the arena"),
            Store::Host => (plan.host_bytes, "the host store"),
        };
        if !matches!(b.offset.checked_add(b.bytes), Some(e) if e <= room) {
            return Err(bad(format!(
                "buffer `{}` [{}, +{}) exceeds {store} of {room} bytes",
                b.name, b.offset, b.bytes
            )));
        }
        if b.store == Store::Host && !b.persistent && b.kind != BufferKind::Activation {
            return Err(bad(format!(
                "buffer `{}` is in the host store but neither persistent nor an offloaded activation",
                b.name
            )));
        }
    }
    check_memory(plan, Store::Arena)?;
    check_memory(plan, Store::Host)?;
    // Accumulating micro-batches skip the optimizer updates: an update that also computes its
    // gradient (a fused weight-gradient + update) would lose the gradient of those runs.
    if plan.accumulate == 0 {
        return Err(bad("accumulate is 0 (1 means no accumulation)"));
    }
    // The norm pass skips the updates: one that computes its own gradient (fused) would leave
    // that gradient out of the norm.
    if let Some(dmc_plan::plan::ClipNormPlan {
        method: dmc_plan::plan::ClipNormMethod::NormPass,
        ..
    }) = &plan.clip_norm
    {
        if plan.accumulate > 1 {
            return Err(bad("a two-pass clip_norm plan that accumulates gradients"));
        }
        for (si, s) in plan.steps.iter().enumerate() {
            let op = plan.kernels.get(s.kernel).map(|k| &k.op);
            let plain = matches!(op, Some(Op::Optim(dmc_plan::op::OptimOp::Update { .. })));
            if plan.is_optimizer_update(si)
                && !plain
                && !matches!(
                    op,
                    Some(Op::Optim(
                        dmc_plan::op::OptimOp::GradSqNorm { .. }
                            | dmc_plan::op::OptimOp::GradNormStore
                    ))
                )
            {
                return Err(bad(format!(
                    "step {si} `{}`: a fused gradient + update in a two-pass clip_norm plan (its gradient would miss the norm)",
                    s.label
                )));
            }
        }
    }
    if plan.accumulate > 1 {
        for (si, s) in plan.steps.iter().enumerate() {
            let op = plan.kernels.get(s.kernel).map(|k| &k.op);
            let consumes_acc = matches!(
                op,
                Some(Op::Optim(
                    dmc_plan::op::OptimOp::Update {
                        zero_grad: true,
                        ..
                    } | dmc_plan::op::OptimOp::GradSqNorm { .. }
                        // (data parallel: the accumulated gradient summed over the ranks)
                        | dmc_plan::op::OptimOp::GradAllReduce { .. }
                ))
            );
            if plan.is_optimizer_update(si) && !consumes_acc {
                return Err(bad(format!(
                    "step {si} `{}`: an update that does not read an accumulated gradient in a plan accumulating {} micro-batches",
                    s.label, plan.accumulate
                )));
            }
        }
    }
    let buf = |id: BufferId, what: &str| {
        plan.buffers
            .get(id)
            .ok_or_else(|| bad(format!("{what}: no buffer #{id}")))
    };
    let fits =
        |id: BufferId, shape: &[usize], dtype: DType, what: &str| -> Result<(), RuntimeError> {
            let b = buf(id, what)?;
            if b.dtype != dtype {
                return Err(bad(format!(
                    "{what}: buffer `{}` is {:?}, expected {dtype:?}",
                    b.name, b.dtype
                )));
            }
            let need = numel(shape) as u64 * dtype.size() as u64;
            if b.bytes < need {
                return Err(bad(format!(
                    "{what}: buffer `{}` has {} bytes, needs {need}",
                    b.name, b.bytes
                )));
            }
            Ok(())
        };
    for p in plan.params.iter().chain(&plan.opt_state) {
        fits(
            p.buffer,
            &p.buffer_shape(),
            DType::F32,
            &format!("parameter `{}`", p.name),
        )?;
    }
    for io in plan.inputs.iter().chain(&plan.targets) {
        if !matches!(io.dtype, DType::F32 | DType::I32) {
            return Err(bad(format!("input `{}` has dtype {:?}", io.name, io.dtype)));
        }
        fits(
            io.buffer,
            &io.shape,
            io.dtype,
            &format!("input `{}`", io.name),
        )?;
    }
    fits(plan.output.buffer, &plan.output.shape, DType::F32, "output")?;
    fits(plan.loss, &[1], DType::F32, "loss")?;

    // Leaves and `Reshape` have no kernel: if a plan lists them anyway they are no-ops, whatever
    // their shapes and arguments.
    let no_kernel = |op: &Op| op.is_leaf() || matches!(op, Op::Reshape);
    for k in plan.kernels.iter().filter(|k| !no_kernel(&k.op)) {
        let sig = k.op.signature();
        if k.signature != sig {
            return Err(bad(format!(
                "kernel `{}`: signature differs from its op's",
                k.name
            )));
        }
        if k.arg_shapes.len() != sig.params.len() {
            return Err(bad(format!(
                "kernel `{}`: {} arg shapes for {} signature params",
                k.name,
                k.arg_shapes.len(),
                sig.params.len()
            )));
        }
        k.op.check_args(&k.arg_shapes)
            .map_err(|e| bad(format!("kernel `{}`: {e}", k.name)))?;
    }
    for (si, s) in plan.steps.iter().enumerate() {
        let what = format!("step {si} (`{}`)", s.label);
        let k = plan
            .kernels
            .get(s.kernel)
            .ok_or_else(|| bad(format!("{what}: no kernel #{}", s.kernel)))?;
        if no_kernel(&k.op) {
            continue;
        }
        let sig = &k.signature;
        if s.args.len() != sig.params.len() {
            return Err(bad(format!(
                "{what}: {} args for the {} params of `{}`",
                s.args.len(),
                sig.params.len(),
                k.name
            )));
        }
        check_stores(plan, si, &what, &k.op)?;
        let mut ranges = Vec::with_capacity(s.args.len());
        for (i, (&id, p)) in s.args.iter().zip(&sig.params).enumerate() {
            fits(
                id,
                &k.arg_shapes[i],
                p.dtype,
                &format!("{what}, arg `{}`", p.name),
            )?;
            let b = &plan.buffers[id];
            let len = numel(&k.arg_shapes[i]) as u64 * p.dtype.size() as u64;
            ranges.push((b.offset, b.offset + len, p.role != Role::In, id));
        }
        for i in 0..ranges.len() {
            for j in 0..ranges.len() {
                let (s0, e0, w0, id0) = ranges[i];
                let (s1, e1, _, id1) = ranges[j];
                let same_memory = plan.buffers[id0].store == plan.buffers[id1].store;
                if i != j && w0 && same_memory && s0 < e1 && s1 < e0 {
                    return Err(bad(format!(
                        "{what}: written arg `{}` (buffer `{}`) overlaps arg `{}` (buffer `{}`)",
                        sig.params[i].name,
                        plan.buffers[id0].name,
                        sig.params[j].name,
                        plan.buffers[id1].name
                    )));
                }
            }
        }
    }
    Ok(())
}

/// The plan's own memory claim, checked statically: two buffers whose byte ranges overlap must
/// never be live at the same time (by [`Plan::held`], the rule the compiler's plan checker uses
/// too: declared `live` ranges, persistent buffers always, inputs from step 0, the output and the
/// loss of train/eval plans to the end). Buffers with
/// exactly the same range are views of one value (e.g. `Reshape`) and are exempt. A wrong
/// *declared* live range is not caught here: that is what poison mode is for.
fn check_memory(plan: &Plan, store: Store) -> Result<(), RuntimeError> {
    let span = |b: &Buffer| plan.held(b);
    let views = view_buffers(plan);
    let mut order: Vec<&Buffer> = plan
        .buffers
        .iter()
        .filter(|b| b.bytes > 0 && b.store == store)
        .collect();
    order.sort_by_key(|b| (b.offset, b.id));
    for (i, a) in order.iter().enumerate() {
        let a_end = a.offset + a.bytes;
        for b in &order[i + 1..] {
            if b.offset >= a_end {
                break;
            }
            if a.offset == b.offset && a.bytes == b.bytes && (views[a.id] || views[b.id]) {
                continue;
            }
            let ((s0, e0), (s1, e1)) = (span(a), span(b));
            if s0 <= e1 && s1 <= e0 {
                return Err(bad(format!(
                    "buffers `{}` [{}, +{}) live {:?} and `{}` [{}, +{}) live {:?} share memory while both live",
                    a.name, a.offset, a.bytes, a.live, b.name, b.offset, b.bytes, b.live
                )));
            }
        }
    }
    Ok(())
}

/// Which memory each argument of step `si` may be in: a kernel reads and writes the arena only; a
/// host-to-device copy reads the host store and writes the arena, a write-back the reverse, of
/// one tensor's bytes; a copy says when it must have landed (`ready`, after it, at most the end
/// of the run). (Whether the copies are in the right places is the compiler's plan checker's
/// business; this is what the backends' memory accesses rely on.)
fn check_stores(plan: &Plan, si: usize, what: &str, op: &Op) -> Result<(), RuntimeError> {
    let s = &plan.steps[si];
    let store = |i: usize| {
        s.args
            .get(i)
            .and_then(|&id| plan.buffers.get(id))
            .map(|b| b.store)
    };
    let want: Vec<Store> = match op {
        Op::Transfer(TransferOp::HostToDevice) => vec![Store::Host, Store::Arena],
        Op::Transfer(TransferOp::DeviceToHost) => vec![Store::Arena, Store::Host],
        _ => vec![Store::Arena; s.args.len()],
    };
    for (i, w) in want.iter().enumerate() {
        if store(i) != Some(*w) {
            return Err(bad(format!(
                "{what}: argument {i} must be in {}",
                match w {
                    Store::Arena => "the arena",
                    Store::Host => "the host store",
                }
            )));
        }
    }
    match (op, s.ready) {
        (Op::Transfer(_), Some(r)) if r > si && r <= plan.steps.len() => {
            let (a, b) = (&plan.buffers[s.args[0]], &plan.buffers[s.args[1]]);
            if a.bytes != b.bytes {
                return Err(bad(format!(
                    "{what}: copies `{}` ({} bytes) into `{}` ({} bytes)",
                    a.name, a.bytes, b.name, b.bytes
                )));
            }
            Ok(())
        }
        (Op::Transfer(_), r) => Err(bad(format!(
            "{what}: a copy must land after its step and by the end of the run (ready {r:?})"
        ))),
        (_, None) => Ok(()),
        (_, Some(_)) => Err(bad(format!("{what}: a kernel step with a copy's `ready`"))),
    }
}
