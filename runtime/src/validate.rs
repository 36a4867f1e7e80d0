//! The runtime's own check of a plan, run by every backend (CPU, CUDA, emulated CUDA) before it
//! allocates anything: buffers inside the arena and aligned, no two live buffers sharing bytes,
//! every step's arguments of their signature slot's dtype and size, no written argument overlapping
//! another, every kernel's argument shapes consistent with its op ([`check_shapes`]), the
//! optimizer's settings usable. The backends' `unsafe` memory accesses rely on it.

use dmc_plan::op::{DType, Op, PoolGeom, Role};
use dmc_plan::plan::{Buffer, BufferId, Plan, ALIGN};

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
        if !matches!(b.offset.checked_add(b.bytes), Some(e) if e <= arena) {
            return Err(bad(format!(
                "buffer `{}` [{}, +{}) exceeds the arena of {arena} bytes",
                b.name, b.offset, b.bytes
            )));
        }
    }
    check_memory(plan)?;
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
            &p.shape,
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
        check_shapes(&k.op, &k.arg_shapes).map_err(|e| bad(format!("kernel `{}`: {e}", k.name)))?;
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
                if i != j && w0 && s0 < e1 && s1 < e0 {
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
fn check_memory(plan: &Plan) -> Result<(), RuntimeError> {
    let span = |b: &Buffer| plan.held(b);
    let views = view_buffers(plan);
    let mut order: Vec<&Buffer> = plan.buffers.iter().filter(|b| b.bytes > 0).collect();
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

fn rank(s: &[usize], r: usize, what: &str) -> Result<(), String> {
    if s.len() != r {
        return Err(format!("{what} has shape {s:?}, expected rank {r}"));
    }
    Ok(())
}

fn same_numel(shapes: &[Vec<usize>], idx: &[usize]) -> Result<(), String> {
    let n = numel(&shapes[idx[0]]);
    for &i in idx {
        if numel(&shapes[i]) != n {
            return Err(format!("argument shapes {:?} differ in size", shapes));
        }
    }
    Ok(())
}

/// Shape consistency of one kernel (the kernels also assert sizes; this turns a planner bug into a
/// `BadPlan` error instead of a panic).
pub(crate) fn check_shapes(op: &Op, s: &[Vec<usize>]) -> Result<(), String> {
    let conv = |g: &dmc_plan::op::ConvGeom, x: &[usize], w: &[usize], y: &[usize]| {
        rank(x, 4, "x")?;
        rank(y, 4, "y")?;
        if g.stride == 0 {
            return Err("stride 0".to_string());
        }
        if w != [g.kh, g.kw, x[3], y[3]] || x[0] != y[0] {
            return Err(format!(
                "conv shapes x {x:?}, w {w:?}, y {y:?} are inconsistent"
            ));
        }
        Ok(())
    };
    let pool = |g: &PoolGeom, x: &[usize], y: &[usize]| {
        rank(x, 4, "x")?;
        if g.size == 0 || g.stride == 0 || g.size * g.size > 256 {
            return Err(format!("bad pool geometry {g:?}"));
        }
        let want = [x[0], pool_out_size(x[1], g), pool_out_size(x[2], g), x[3]];
        if y != want {
            return Err(format!("pool output {y:?}, expected {want:?}"));
        }
        Ok(())
    };
    let dense = |x: &[usize], w: &[usize], y: &[usize]| {
        rank(w, 2, "w")?;
        let (k, m) = (w[0], w[1]);
        if k == 0 || m == 0 || numel(x) / k * k != numel(x) || numel(y) != numel(x) / k * m {
            return Err(format!(
                "dense shapes x {x:?}, w {w:?}, y {y:?} are inconsistent"
            ));
        }
        Ok(())
    };
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::OptState { .. } | Op::Reshape => Ok(()),
        Op::Conv2d { geom, bias } => {
            let yi = if *bias { 3 } else { 2 };
            conv(geom, &s[0], &s[1], &s[yi])?;
            if *bias && s[2] != [s[1][3]] {
                return Err(format!("bias {:?}", s[2]));
            }
            workspaces(op, s, yi + 1)
        }
        Op::Conv2dBwdData { geom } => conv(geom, &s[2], &s[1], &s[0]),
        Op::Conv2dBwdWeight { geom } => {
            conv(geom, &s[0], &s[2], &s[1])?;
            workspaces(op, s, 3)
        }
        Op::Dense { bias } => {
            let yi = if *bias { 3 } else { 2 };
            dense(&s[0], &s[1], &s[yi])?;
            if *bias && s[2] != [s[1][1]] {
                return Err(format!("bias {:?}", s[2]));
            }
            Ok(())
        }
        Op::DenseBwdData => dense(&s[2], &s[1], &s[0]),
        Op::DenseBwdWeight => dense(&s[0], &s[2], &s[1]),
        Op::MaxPool { geom } => {
            pool(geom, &s[0], &s[1])?;
            if s[2] != s[1] {
                return Err("argmax shape differs from y".into());
            }
            Ok(())
        }
        Op::AvgPool { geom } => pool(geom, &s[0], &s[1]),
        Op::MaxPoolBwd { geom } => {
            pool(geom, &s[2], &s[0])?;
            if s[1] != s[0] {
                return Err("argmax shape differs from dy".into());
            }
            Ok(())
        }
        Op::AvgPoolBwd { geom } => pool(geom, &s[1], &s[0]),
        Op::GlobalAvgPool | Op::GlobalAvgPoolBwd => {
            let (x, y) = if matches!(op, Op::GlobalAvgPool) {
                (&s[0], &s[1])
            } else {
                (&s[1], &s[0])
            };
            rank(x, 4, "x")?;
            if y != &[x[0], x[3]] || x[1] * x[2] == 0 {
                return Err(format!("global pool x {x:?}, y {y:?}"));
            }
            Ok(())
        }
        Op::Unary(_) | Op::Dropout { .. } | Op::DropoutBwd { .. } => same_numel(s, &[0, 1]),
        Op::Add | Op::UnaryBwd(_) => same_numel(s, &[0, 1, 2]),
        Op::MseLoss => {
            same_numel(s, &[0, 1])?;
            if numel(&s[2]) != 1 || numel(&s[0]) == 0 {
                return Err("mse loss shapes".into());
            }
            Ok(())
        }
        Op::MseLossBwd => same_numel(s, &[0, 1, 2]),
        Op::CrossEntropyLoss | Op::CrossEntropyLossBwd => {
            rank(&s[0], 2, "logits")?;
            if s[1] != [s[0][0]] || s[0][0] == 0 || s[0][1] == 0 {
                return Err(format!("logits {:?}, labels {:?}", s[0], s[1]));
            }
            if matches!(op, Op::CrossEntropyLoss) && numel(&s[2]) != 1 {
                return Err("loss must have one element".into());
            }
            if matches!(op, Op::CrossEntropyLossBwd) && s[2] != s[0] {
                return Err("dlogits shape differs from logits".into());
            }
            Ok(())
        }
        Op::BiasGrad => {
            rank(&s[1], 1, "db")?;
            if s[0].last() != Some(&s[1][0]) {
                return Err(format!("dy {:?}, db {:?}", s[0], s[1]));
            }
            Ok(())
        }
        Op::Update { .. } => {
            let idx: Vec<usize> = (0..s.len()).collect();
            same_numel(s, &idx)
        }
        Op::UnaryInPlace(_) | Op::DropoutInPlace { .. } | Op::DropoutBwdInPlace { .. } => Ok(()),
        Op::AddInPlace | Op::UnaryBwdInPlace(_) => same_numel(s, &[0, 1]),
        Op::Conv2dBwdWeightUpdate { geom, rule, chunk } => {
            let ns = rule.state_names().len();
            conv(geom, &s[0], &s[2], &s[1])?;
            if *chunk == 0 || *chunk > s[1][3] {
                return Err(format!("chunk {chunk}"));
            }
            for i in 0..ns {
                if s[3 + i] != s[2] {
                    return Err(format!("state {:?} differs from w {:?}", s[3 + i], s[2]));
                }
            }
            workspaces(op, s, 3 + ns)
        }
        Op::DenseBwdWeightUpdate { rule, chunk } => {
            let ns = rule.state_names().len();
            dense(&s[0], &s[2], &s[1])?;
            if *chunk == 0 || *chunk > s[2][1] {
                return Err(format!("chunk {chunk}"));
            }
            for i in 0..ns {
                if s[3 + i] != s[2] {
                    return Err(format!("state {:?} differs from w {:?}", s[3 + i], s[2]));
                }
            }
            workspaces(op, s, 3 + ns)
        }
        Op::BiasGradUpdate { rule } => {
            let ns = rule.state_names().len();
            rank(&s[1], 1, "b")?;
            if s[0].last() != Some(&s[1][0]) {
                return Err(format!("dy {:?}, b {:?}", s[0], s[1]));
            }
            for i in 0..ns {
                if s[2 + i] != s[1] {
                    return Err(format!("state {:?} differs from b {:?}", s[2 + i], s[1]));
                }
            }
            workspaces(op, s, 2 + ns)
        }
    }
}

/// The workspace arguments (from index `first` on) hold at least what the op needs
/// ([`Op::workspace_elems`] of the arguments before them).
fn workspaces(op: &Op, s: &[Vec<usize>], first: usize) -> Result<(), String> {
    let need = op.workspace_elems(&s[..first]);
    if s.len() != first + need.len() {
        return Err(format!(
            "{} workspaces, expected {}",
            s.len() - first,
            need.len()
        ));
    }
    for (i, n) in need.iter().enumerate() {
        if numel(&s[first + i]) < *n {
            return Err(format!("workspace {:?} < {n} elements", s[first + i]));
        }
    }
    Ok(())
}

/// Output size of a 'valid' (floor) pooling window: `(h - size) / stride + 1` (0 when h < size).
fn pool_out_size(h: usize, g: &PoolGeom) -> usize {
    if h < g.size || g.stride == 0 {
        0
    } else {
        (h - g.size) / g.stride + 1
    }
}
