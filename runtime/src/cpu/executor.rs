//! Executes plan steps on the CPU: `exec` runs one step, the `match` over every
//! [`Op`] that calls its CPU kernel on the step's argument slices; the
//! [`CpuBackend`](super::CpuBackend) runs a plan's steps through it, and [`run_single_kernel`]
//! runs one kernel outside any plan (the reference other backends are checked against).

use dmc_codegen::Scalars;
use dmc_plan::op::Op;
use dmc_plan::plan::{Buffer, BufferKind, Kernel, Mode, Step, ALIGN};

use super::args::{Args, Ctx};
use super::loss::BadLabel;
use crate::arena::Arena;
use crate::error::RuntimeError;

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn bad(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::BadPlan(msg.into())
}

/// Runs one step.
///
/// # Safety
/// The step must have passed [`validate`](crate::validate) and the caller must hold exclusive
/// access to the arena.
/// Each `f32_mut`/`u8_mut` below is taken only for a signature slot with role Out, InOut or
/// Workspace, which `validate` guarantees overlaps no other argument of the step, so the mutable
/// slices are disjoint from each other and from the shared ones.
pub(super) unsafe fn exec(a: &Args, ctx: &Ctx) -> Result<(), BadLabel> {
    // SAFETY: (all calls below) see this function's contract; slot indices follow `Op::signature`.
    unsafe {
        match &a.kernel.op {
            Op::Input { .. }
            | Op::Param { .. }
            | Op::OptState { .. }
            | Op::RunStat { .. }
            | Op::GradBuf { .. }
            | Op::Reshape => {}
            Op::Conv(op) => super::conv::exec(op, a, ctx),
            Op::Dense(op) => super::dense::exec(op, a, ctx),
            Op::Pool(op) => super::pool::exec(op, a, ctx),
            Op::Elementwise(op) => super::elementwise::exec(op, a, ctx),
            Op::Loss(op) => super::loss::exec(op, a, ctx)?,
            Op::Optim(op) => super::optim::exec(op, a, ctx),
            Op::Norm(op) => super::norm::exec(op, a, ctx),
            Op::Seq(op) => super::seq::exec(op, a)?,
            // a copy between the host store and a window of the arena
            Op::Transfer(_) => a.f32_mut(1).copy_from_slice(a.f32(0)),
        }
    }
    Ok(())
}

/// Runs one kernel on its own argument buffers (`args[i]` = the bytes of signature slot `i`, sized
/// per `kernel.arg_shapes`), outside any plan: the reference for testing other backends kernel by
/// kernel. `mode` as the plan's (dropout is the identity in `Eval`); `scalars` as a launch's (the
/// updates use its learning rate).
pub fn run_single_kernel(
    kernel: &Kernel,
    mode: Mode,
    scalars: &Scalars,
    args: &mut [Vec<u8>],
) -> Result<(), RuntimeError> {
    let sig = kernel.op.signature();
    if args.len() != sig.params.len() || kernel.arg_shapes.len() != sig.params.len() {
        return Err(bad(format!(
            "kernel `{}`: wrong number of arguments",
            kernel.name
        )));
    }
    kernel
        .op
        .check_args(&kernel.arg_shapes)
        .map_err(|e| bad(format!("kernel `{}`: {e}", kernel.name)))?;
    let mut buffers = Vec::new();
    let mut off = 0u64;
    for (i, (p, a)) in sig.params.iter().zip(args.iter()).enumerate() {
        let need = numel(&kernel.arg_shapes[i]) * p.dtype.size();
        if a.len() != need {
            return Err(bad(format!(
                "kernel `{}`: argument {i} has {} bytes, needs {need}",
                kernel.name,
                a.len()
            )));
        }
        buffers.push(Buffer {
            id: i,
            name: p.name.clone(),
            bytes: need as u64,
            dtype: p.dtype,
            kind: BufferKind::Activation,
            offset: off,
            live: (0, 0),
            persistent: false,
            layer: String::new(),
            store: Default::default(),
        });
        off += (need as u64).div_ceil(ALIGN) * ALIGN;
    }
    let arena = Arena::new(off)?;
    let base = arena.ptr.as_ptr();
    for (b, a) in buffers.iter().zip(args.iter()) {
        // SAFETY: each buffer lies inside the fresh arena, disjoint from the others.
        unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), base.add(b.offset as usize), a.len()) };
    }
    let step = Step {
        kernel: 0,
        args: (0..buffers.len()).collect(),
        label: kernel.name.clone(),
        phase: Default::default(),
        ready: None,
    };
    let a = Args {
        base,
        host: std::ptr::null_mut(),
        buffers: &buffers,
        kernel,
        step: &step,
    };
    let ctx = Ctx {
        step_counter: scalars.step,
        seed: scalars.seed,
        lr: scalars.lr,
        mode,
        comm: None,
    };
    // SAFETY: shapes checked above; every argument has its own disjoint, aligned, large-enough
    // buffer in an arena only this function accesses.
    unsafe { exec(&a, &ctx) }.map_err(|e| RuntimeError::BadLabel {
        step: 0,
        label: kernel.name.clone(),
        row: e.row,
        label_value: e.label,
        classes: e.classes,
    })?;
    for (b, a) in buffers.iter().zip(args.iter_mut()) {
        // SAFETY: as above; the kernel has finished.
        unsafe {
            std::ptr::copy_nonoverlapping(base.add(b.offset as usize), a.as_mut_ptr(), a.len())
        };
    }
    Ok(())
}
