//! Executes plan steps on the CPU: [`exec`] runs one step, the `match` over every
//! [`Op`](dmc_plan::op::Op) that calls its CPU kernel on the step's argument slices; the
//! [`CpuBackend`](super::CpuBackend) runs a plan's steps through it, and [`run_single_kernel`]
//! runs one kernel outside any plan (the reference other backends are checked against).

use dmc_plan::op::Op;
use dmc_plan::plan::{Buffer, BufferKind, Kernel, Mode, Step, ALIGN};

use super::conv::{
    conv2d_bwd_data, conv2d_bwd_weight, conv2d_bwd_weight_chunked, conv2d_fwd, ConvDims,
};
use super::dense::{
    bias_grad, dense_bwd_data, dense_bwd_weight, dense_bwd_weight_chunked, dense_fwd,
};
use super::elementwise::{
    add, add_inplace, dropout, dropout_inplace, unary_bwd, unary_bwd_inplace, unary_fwd,
    unary_fwd_inplace, DropoutRng,
};
use super::loss::{cross_entropy_loss, cross_entropy_loss_bwd, mse_loss, mse_loss_bwd, BadLabel};
use super::optim::{update, update_block};
use super::pool::{
    avgpool_bwd, avgpool_fwd, global_avgpool_bwd, global_avgpool_fwd, maxpool_bwd, maxpool_fwd,
    PoolDims,
};
use crate::arena::Arena;
use crate::error::RuntimeError;
use crate::validate::check_shapes;

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn bad(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::BadPlan(msg.into())
}

/// What a step reads besides its arguments: the 1-based training step and the seed (Adam's `t`,
/// the dropout key) and the plan's mode (dropout is the identity in `Eval`).
pub(super) struct Ctx {
    pub(super) step_counter: u64,
    pub(super) seed: u64,
    pub(super) mode: Mode,
}

/// One step's arguments: the arena base, the plan's buffers, the step and its kernel.
pub(super) struct Args<'p> {
    pub(super) base: *mut u8,
    pub(super) buffers: &'p [Buffer],
    pub(super) kernel: &'p Kernel,
    pub(super) step: &'p Step,
}

impl<'p> Args<'p> {
    fn shape(&self, i: usize) -> &'p [usize] {
        &self.kernel.arg_shapes[i]
    }
    fn ptr(&self, i: usize) -> *mut u8 {
        let b = &self.buffers[self.step.args[i]];
        // SAFETY: the offset was validated to lie inside the arena.
        unsafe { self.base.add(b.offset as usize) }
    }
    /// # Safety
    /// Argument `i` must be a validated f32 argument not written through another slice meanwhile.
    unsafe fn f32<'a>(&self, i: usize) -> &'a [f32] {
        // SAFETY: per the caller's contract and `validate` (aligned, in bounds, large enough).
        unsafe { std::slice::from_raw_parts(self.ptr(i) as *const f32, numel(self.shape(i))) }
    }
    /// # Safety
    /// Argument `i` must be a validated written f32 argument that overlaps no other argument.
    #[allow(clippy::mut_from_ref)]
    unsafe fn f32_mut<'a>(&self, i: usize) -> &'a mut [f32] {
        // SAFETY: per the caller's contract and `validate`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(i) as *mut f32, numel(self.shape(i))) }
    }
    /// # Safety
    /// As `f32`, for an i32 argument.
    unsafe fn i32<'a>(&self, i: usize) -> &'a [i32] {
        // SAFETY: per the caller's contract and `validate`.
        unsafe { std::slice::from_raw_parts(self.ptr(i) as *const i32, numel(self.shape(i))) }
    }
    /// # Safety
    /// As `f32`, for a u8 argument.
    unsafe fn u8<'a>(&self, i: usize) -> &'a [u8] {
        // SAFETY: per the caller's contract and `validate`.
        unsafe { std::slice::from_raw_parts(self.ptr(i) as *const u8, numel(self.shape(i))) }
    }
    /// # Safety
    /// As `f32_mut`, for a u8 argument.
    #[allow(clippy::mut_from_ref)]
    unsafe fn u8_mut<'a>(&self, i: usize) -> &'a mut [u8] {
        // SAFETY: per the caller's contract and `validate`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(i), numel(self.shape(i))) }
    }
}

/// The optimizer-state arguments `first..first+n` (n <= 2) as mutable slices, without allocating
/// (the unused entries are empty).
///
/// # Safety
/// As [`Args::f32_mut`] for each of those arguments (validated `InOut` slots, pairwise disjoint).
unsafe fn state_slices<'a>(a: &Args, first: usize, n: usize) -> [&'a mut [f32]; 2] {
    let mut out: [&'a mut [f32]; 2] = [&mut [], &mut []];
    for (i, o) in out.iter_mut().enumerate().take(n) {
        // SAFETY: per this function's contract.
        *o = unsafe { a.f32_mut(first + i) };
    }
    out
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
            Op::Input { .. } | Op::Param { .. } | Op::OptState { .. } | Op::Reshape => {}
            Op::Conv2d { geom, bias } => {
                let d = ConvDims::from_shapes(a.shape(0), a.shape(if *bias { 3 } else { 2 }));
                let (b, yi) = if *bias {
                    (Some(a.f32(2)), 3)
                } else {
                    (None, 2)
                };
                conv2d_fwd(
                    geom,
                    &d,
                    a.f32(0),
                    a.f32(1),
                    b,
                    a.f32_mut(yi),
                    a.f32_mut(yi + 1),
                );
            }
            Op::Dense { bias } => {
                let w = a.shape(1);
                let (k, m) = (w[0], w[1]);
                let n = numel(a.shape(0)) / k.max(1);
                let (b, yi) = if *bias {
                    (Some(a.f32(2)), 3)
                } else {
                    (None, 2)
                };
                dense_fwd(n, k, m, a.f32(0), a.f32(1), b, a.f32_mut(yi));
            }
            Op::MaxPool { geom } => {
                let d = PoolDims::from_shapes(a.shape(0), a.shape(1));
                maxpool_fwd(geom, &d, a.f32(0), a.f32_mut(1), a.u8_mut(2));
            }
            Op::AvgPool { geom } => {
                let d = PoolDims::from_shapes(a.shape(0), a.shape(1));
                avgpool_fwd(geom, &d, a.f32(0), a.f32_mut(1));
            }
            Op::GlobalAvgPool => {
                let x = a.shape(0);
                global_avgpool_fwd(x[0], x[1] * x[2], x[3], a.f32(0), a.f32_mut(1));
            }
            Op::Unary(kind) => unary_fwd(*kind, a.f32(0), a.f32_mut(1)),
            Op::Add => add(a.f32(0), a.f32(1), a.f32_mut(2)),
            Op::Dropout { p, salt } => {
                if ctx.mode == Mode::Eval {
                    a.f32_mut(1).copy_from_slice(a.f32(0));
                } else {
                    let rng = DropoutRng::new(ctx.seed, ctx.step_counter, *salt);
                    dropout(*p, rng, a.f32(0), a.f32_mut(1));
                }
            }
            Op::MseLoss => a.f32_mut(2)[0] = mse_loss(a.f32(0), a.f32(1)),
            Op::CrossEntropyLoss => {
                let c = a.shape(0)[1];
                a.f32_mut(2)[0] = cross_entropy_loss(a.f32(0), a.i32(1), c)?;
            }
            Op::Conv2dBwdData { geom } => {
                let d = ConvDims::from_shapes(a.shape(2), a.shape(0));
                conv2d_bwd_data(geom, &d, a.f32(0), a.f32(1), a.f32_mut(2));
            }
            Op::Conv2dBwdWeight { geom } => {
                let d = ConvDims::from_shapes(a.shape(0), a.shape(1));
                conv2d_bwd_weight(geom, &d, a.f32(0), a.f32(1), a.f32_mut(2), a.f32_mut(3));
            }
            Op::BiasGrad => bias_grad(a.f32(0), a.f32_mut(1)),
            Op::DenseBwdData => {
                let w = a.shape(1);
                let (k, m) = (w[0], w[1]);
                let n = numel(a.shape(0)) / m.max(1);
                dense_bwd_data(n, k, m, a.f32(0), a.f32(1), a.f32_mut(2));
            }
            Op::DenseBwdWeight => {
                let dw = a.shape(2);
                let (k, m) = (dw[0], dw[1]);
                let n = numel(a.shape(0)) / k.max(1);
                dense_bwd_weight(n, k, m, a.f32(0), a.f32(1), a.f32_mut(2));
            }
            Op::MaxPoolBwd { geom } => {
                let d = PoolDims::from_shapes(a.shape(2), a.shape(0));
                maxpool_bwd(geom, &d, a.f32(0), a.u8(1), a.f32_mut(2));
            }
            Op::AvgPoolBwd { geom } => {
                let d = PoolDims::from_shapes(a.shape(1), a.shape(0));
                avgpool_bwd(geom, &d, a.f32(0), a.f32_mut(1));
            }
            Op::GlobalAvgPoolBwd => {
                let x = a.shape(1);
                global_avgpool_bwd(x[0], x[1] * x[2], x[3], a.f32(0), a.f32_mut(1));
            }
            Op::UnaryBwd(kind) => unary_bwd(*kind, a.f32(0), a.f32(1), a.f32_mut(2)),
            Op::DropoutBwd { p, salt } => {
                if ctx.mode == Mode::Eval {
                    a.f32_mut(1).copy_from_slice(a.f32(0));
                } else {
                    let rng = DropoutRng::new(ctx.seed, ctx.step_counter, *salt);
                    dropout(*p, rng, a.f32(0), a.f32_mut(1));
                }
            }
            Op::MseLossBwd => mse_loss_bwd(a.f32(0), a.f32(1), a.f32_mut(2)),
            Op::CrossEntropyLossBwd => {
                let c = a.shape(0)[1];
                cross_entropy_loss_bwd(a.f32(0), a.i32(1), c, a.f32_mut(2))?;
            }
            Op::Update { rule } => {
                let ns = rule.state_names().len();
                let w = a.f32_mut(0);
                let mut states = state_slices(a, 2, ns);
                update(rule, ctx.step_counter, w, a.f32(1), &mut states[..ns]);
            }
            Op::UnaryInPlace(kind) => unary_fwd_inplace(*kind, a.f32_mut(0)),
            Op::AddInPlace => add_inplace(a.f32_mut(0), a.f32(1)),
            Op::DropoutInPlace { p, salt } | Op::DropoutBwdInPlace { p, salt } => {
                if ctx.mode != Mode::Eval {
                    let rng = DropoutRng::new(ctx.seed, ctx.step_counter, *salt);
                    dropout_inplace(*p, rng, a.f32_mut(0));
                }
            }
            Op::UnaryBwdInPlace(kind) => unary_bwd_inplace(*kind, a.f32(0), a.f32_mut(1)),
            Op::Conv2dBwdWeightUpdate { geom, rule, chunk } => {
                let d = ConvDims::from_shapes(a.shape(0), a.shape(1));
                let ns = rule.state_names().len();
                let w = a.f32_mut(2);
                let mut states = state_slices(a, 3, ns);
                let co = d.co;
                conv2d_bwd_weight_chunked(
                    geom,
                    &d,
                    a.f32(0),
                    a.f32(1),
                    *chunk,
                    a.f32_mut(3 + ns),
                    a.f32_mut(4 + ns),
                    |c0, nc, gw| {
                        update_block(rule, ctx.step_counter, w, co, c0, nc, gw, &mut states[..ns])
                    },
                );
            }
            Op::DenseBwdWeightUpdate { rule, chunk } => {
                let ws = a.shape(2);
                let (k, m) = (ws[0], ws[1]);
                let n = numel(a.shape(0)) / k.max(1);
                let ns = rule.state_names().len();
                let w = a.f32_mut(2);
                let mut states = state_slices(a, 3, ns);
                dense_bwd_weight_chunked(
                    n,
                    k,
                    m,
                    a.f32(0),
                    a.f32(1),
                    *chunk,
                    a.f32_mut(3 + ns),
                    |c0, nc, gw| {
                        update_block(rule, ctx.step_counter, w, m, c0, nc, gw, &mut states[..ns])
                    },
                );
            }
            Op::BiasGradUpdate { rule } => {
                let ns = rule.state_names().len();
                let db = a.f32_mut(2 + ns);
                bias_grad(a.f32(0), db);
                let b = a.f32_mut(1);
                let c = b.len();
                let mut states = state_slices(a, 2, ns);
                update_block(rule, ctx.step_counter, b, c, 0, c, db, &mut states[..ns]);
            }
        }
    }
    Ok(())
}

/// Runs one kernel on its own argument buffers (`args[i]` = the bytes of signature slot `i`, sized
/// per `kernel.arg_shapes`), outside any plan: the reference for testing other backends kernel by
/// kernel. `mode` as the plan's (dropout is the identity in `Eval`).
pub fn run_single_kernel(
    kernel: &Kernel,
    mode: Mode,
    step_counter: u64,
    seed: u64,
    args: &mut [Vec<u8>],
) -> Result<(), RuntimeError> {
    let sig = kernel.op.signature();
    if args.len() != sig.params.len() || kernel.arg_shapes.len() != sig.params.len() {
        return Err(bad(format!(
            "kernel `{}`: wrong number of arguments",
            kernel.name
        )));
    }
    check_shapes(&kernel.op, &kernel.arg_shapes)
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
    };
    let a = Args {
        base,
        buffers: &buffers,
        kernel,
        step: &step,
    };
    let ctx = Ctx {
        step_counter,
        seed,
        mode,
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
