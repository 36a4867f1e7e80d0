//! Executes a [`Plan`] on the CPU: one arena of `plan.arena_bytes`, every buffer a slice of it at
//! its planned offset, the steps in order. Nothing proportional to the model is allocated during a
//! step (GEMM packing and rayon bookkeeping are O(threads x tile)).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::HashMap;
use std::ptr::NonNull;

use dmc_plan::op::{DType, Op, Role};
use dmc_plan::plan::{Buffer, BufferId, BufferKind, Init, Kernel, Mode, Plan, Step, ALIGN};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::conv::{
    conv2d_bwd_data, conv2d_bwd_weight, conv2d_bwd_weight_chunked, conv2d_fwd, ConvDims,
};
use super::dense::{
    bias_grad, dense_bwd_data, dense_bwd_weight, dense_bwd_weight_chunked, dense_fwd,
};
use super::elementwise::{
    add, add_inplace, dropout, dropout_inplace, mix64, unary_bwd, unary_bwd_inplace, unary_fwd,
    unary_fwd_inplace, DropoutRng,
};
use super::loss::{cross_entropy_loss, cross_entropy_loss_bwd, mse_loss, mse_loss_bwd, BadLabel};
use super::optim::{update, update_block};
use super::pool::{
    avgpool_bwd, avgpool_fwd, global_avgpool_bwd, global_avgpool_fwd, maxpool_bwd, maxpool_fwd,
    PoolDims,
};
use crate::error::RuntimeError;

/// Data for [`CpuBackend::set_input`].
#[derive(Debug, Clone, Copy)]
pub enum InputData<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
}

/// The arena: one 64-byte aligned, zero-initialised allocation.
pub(crate) struct Arena {
    pub(crate) ptr: NonNull<u8>,
    layout: Layout,
}

impl Arena {
    /// Allocates `bytes` zeroed bytes. An arena larger than the machine's physical memory is
    /// refused up front (the allocation could succeed lazily and the process be killed later).
    pub(crate) fn new(bytes: u64) -> Result<Self, RuntimeError> {
        let memory = crate::alloc::physical_memory();
        if let Some(mem) = memory.filter(|&m| bytes > m) {
            return Err(RuntimeError::ArenaTooLarge { bytes, memory: mem });
        }
        let size = usize::try_from(bytes)
            .map_err(|_| RuntimeError::Alloc { bytes })?
            .max(1);
        let layout = Layout::from_size_align(size, ALIGN as usize)
            .map_err(|_| RuntimeError::Alloc { bytes })?;
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or(RuntimeError::Alloc { bytes })?;
        Ok(Arena { ptr, layout })
    }
}

impl Arena {
    /// The whole allocation.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` addresses `layout.size()` initialised (zeroed) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The whole allocation, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `Arena::new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: the arena is uniquely owned memory (like a `Box<[u8]>`); access goes through `&self` /
// `&mut self` of the backend.
unsafe impl Send for Arena {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for Arena {}

/// The CPU backend for one plan.
pub struct CpuBackend {
    plan: Plan,
    arena: Arena,
    poison: bool,
    halt_on_nonfinite_loss: bool,
    /// Per step: the buffers to fill with NaN after it in poison mode.
    poison_after: Vec<Vec<BufferId>>,
    params: HashMap<String, usize>,
    opt_state: HashMap<String, usize>,
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn bad(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::BadPlan(msg.into())
}

impl CpuBackend {
    /// Validates the plan and allocates its arena (zeroed). Fails on an inconsistent plan or if
    /// the arena cannot be allocated.
    pub fn new(plan: Plan) -> Result<Self, RuntimeError> {
        validate(&plan)?;
        let arena = Arena::new(plan.arena_bytes)?;
        let poison_after = poison_lists(&plan);
        let params = plan
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        let opt_state = plan
            .opt_state
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        Ok(CpuBackend {
            plan,
            arena,
            poison: false,
            halt_on_nonfinite_loss: false,
            poison_after,
            params,
            opt_state,
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Size of the one arena, in bytes.
    pub fn arena_bytes(&self) -> u64 {
        self.plan.arena_bytes
    }

    /// Poison mode: after each step, every non-persistent buffer whose live range ends at that
    /// step is filled with NaN (all bytes 0xFF: f32 NaN, i32 -1, u8 255), so that a plan that
    /// reuses memory too early produces NaN instead of silently wrong numbers. The loss and output
    /// buffers are never poisoned (they are read after the run), nor a buffer that shares its exact
    /// byte range with a view of it (a buffer no step writes, e.g. a `Reshape` output) that is
    /// still needed later, or vice versa.
    /// Inputs are poisoned after their last use too: feed them before every `run`.
    pub fn set_poison(&mut self, on: bool) {
        self.poison = on;
    }

    fn buf(&self, id: BufferId) -> &Buffer {
        &self.plan.buffers[id]
    }

    fn f32_slice(&self, id: BufferId, len: usize) -> &[f32] {
        let b = self.buf(id);
        debug_assert!(len * 4 <= b.bytes as usize);
        // SAFETY: validated in `new`: the buffer lies inside the arena, its offset is 64-byte
        // aligned and it holds at least `len` f32 (any bit pattern is a valid f32); `&self` keeps
        // the arena from being written while the slice lives.
        unsafe {
            std::slice::from_raw_parts(
                self.arena.ptr.as_ptr().add(b.offset as usize) as *const f32,
                len,
            )
        }
    }

    fn bytes_mut(&mut self, id: BufferId, len: usize) -> &mut [u8] {
        let b = &self.plan.buffers[id];
        assert!(len <= b.bytes as usize);
        // SAFETY: the buffer lies inside the arena (validated in `new`); `&mut self` makes this
        // the only live reference into the arena.
        unsafe {
            std::slice::from_raw_parts_mut(self.arena.ptr.as_ptr().add(b.offset as usize), len)
        }
    }

    /// Initialises every parameter per its `Init`, from an RNG seeded by `(seed, name)` (so the
    /// values don't depend on the parameter order), and zeroes the optimizer state.
    pub fn init_params(&mut self, seed: u64) {
        for i in 0..self.plan.params.len() {
            let (buffer, n, init, key) = {
                let p = &self.plan.params[i];
                (p.buffer, numel(&p.shape), p.init, name_seed(seed, &p.name))
            };
            let bytes = self.bytes_mut(buffer, n * 4);
            for (c, v) in bytes.chunks_exact_mut(4).zip(init_values(init, key)) {
                c.copy_from_slice(&v.to_ne_bytes());
            }
        }
        for i in 0..self.plan.opt_state.len() {
            let (buffer, n) = (
                self.plan.opt_state[i].buffer,
                numel(&self.plan.opt_state[i].shape),
            );
            self.bytes_mut(buffer, n * 4).fill(0);
        }
    }

    /// A parameter's values.
    pub fn param(&self, name: &str) -> Option<&[f32]> {
        let p = &self.plan.params[*self.params.get(name)?];
        Some(self.f32_slice(p.buffer, numel(&p.shape)))
    }

    /// Every parameter: (name, shape, values), in plan order.
    pub fn params(&self) -> impl Iterator<Item = (&str, &[usize], &[f32])> + '_ {
        self.plan.params.iter().map(move |p| {
            (
                p.name.as_str(),
                p.shape.as_slice(),
                self.f32_slice(p.buffer, numel(&p.shape)),
            )
        })
    }

    /// Overwrites a parameter.
    pub fn set_param(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        let i = *self
            .params
            .get(name)
            .ok_or_else(|| RuntimeError::UnknownParam(name.into()))?;
        let (buffer, n) = (
            self.plan.params[i].buffer,
            numel(&self.plan.params[i].shape),
        );
        self.write_f32(name, buffer, n, data)
    }

    /// An optimizer state tensor's values (e.g. `conv3.weight.momentum`).
    pub fn opt_state(&self, name: &str) -> Option<&[f32]> {
        let p = &self.plan.opt_state[*self.opt_state.get(name)?];
        Some(self.f32_slice(p.buffer, numel(&p.shape)))
    }

    /// Every optimizer state tensor: (name, shape, values), in plan order.
    pub fn opt_states(&self) -> impl Iterator<Item = (&str, &[usize], &[f32])> + '_ {
        self.plan.opt_state.iter().map(move |p| {
            (
                p.name.as_str(),
                p.shape.as_slice(),
                self.f32_slice(p.buffer, numel(&p.shape)),
            )
        })
    }

    /// Overwrites an optimizer state tensor (e.g. when resuming from a checkpoint).
    pub fn set_opt_state(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        let i = *self
            .opt_state
            .get(name)
            .ok_or_else(|| RuntimeError::UnknownOptState(name.into()))?;
        let (buffer, n) = (
            self.plan.opt_state[i].buffer,
            numel(&self.plan.opt_state[i].shape),
        );
        self.write_f32(name, buffer, n, data)
    }

    fn write_f32(
        &mut self,
        name: &str,
        buffer: BufferId,
        n: usize,
        data: &[f32],
    ) -> Result<(), RuntimeError> {
        if data.len() != n {
            return Err(RuntimeError::SizeMismatch {
                name: name.into(),
                expected: n,
                got: data.len(),
            });
        }
        for (c, v) in self.bytes_mut(buffer, n * 4).chunks_exact_mut(4).zip(data) {
            c.copy_from_slice(&v.to_ne_bytes());
        }
        Ok(())
    }

    /// Feeds a batch input or target (searched by name in `plan.inputs`, then `plan.targets`).
    pub fn set_input(&mut self, name: &str, data: InputData) -> Result<(), RuntimeError> {
        let b = self
            .plan
            .inputs
            .iter()
            .chain(&self.plan.targets)
            .find(|b| b.name == name)
            .ok_or_else(|| RuntimeError::UnknownInput(name.into()))?;
        let (buffer, n, dtype) = (b.buffer, numel(&b.shape), b.dtype);
        let (got_dtype, len) = match data {
            InputData::F32(d) => (DType::F32, d.len()),
            InputData::I32(d) => (DType::I32, d.len()),
        };
        if got_dtype != dtype {
            return Err(RuntimeError::DTypeMismatch {
                name: name.into(),
                expected: dtype,
                got: got_dtype,
            });
        }
        if len != n {
            return Err(RuntimeError::SizeMismatch {
                name: name.into(),
                expected: n,
                got: len,
            });
        }
        let dst = self.bytes_mut(buffer, n * 4);
        match data {
            InputData::F32(d) => {
                for (c, v) in dst.chunks_exact_mut(4).zip(d) {
                    c.copy_from_slice(&v.to_ne_bytes());
                }
            }
            InputData::I32(d) => {
                for (c, v) in dst.chunks_exact_mut(4).zip(d) {
                    c.copy_from_slice(&v.to_ne_bytes());
                }
            }
        }
        Ok(())
    }

    /// The network output (the `plan.output` binding) after the last `run`.
    pub fn output(&self) -> &[f32] {
        self.f32_slice(self.plan.output.buffer, numel(&self.plan.output.shape))
    }

    /// The loss buffer's value after the last `run`.
    pub fn loss(&self) -> f32 {
        self.f32_slice(self.plan.loss, 1)[0]
    }

    /// When on, `run` stops right after the loss kernel if the loss is NaN or infinite, before any
    /// backward or update step, so the parameters keep their last good values.
    pub fn set_halt_on_nonfinite_loss(&mut self, on: bool) {
        self.halt_on_nonfinite_loss = on;
    }

    /// Executes every step of the plan in order and returns the loss (NaN/Inf is returned as is).
    /// `step_counter` is the 1-based training step: Adam's `t` and part of the dropout key, with
    /// `seed`.
    pub fn run(&mut self, step_counter: u64, seed: u64) -> Result<f32, RuntimeError> {
        // The whole step runs on a rayon worker: the kernels' parallel loops then start from inside
        // the pool (no hand-off from a foreign thread per kernel, small loops run inline).
        rayon::scope(|_| self.run_steps(step_counter, seed))
    }

    fn run_steps(&mut self, step_counter: u64, seed: u64) -> Result<f32, RuntimeError> {
        let base = self.arena.ptr.as_ptr();
        let ctx = Ctx {
            step_counter,
            seed,
            mode: self.plan.mode,
        };
        for (si, step) in self.plan.steps.iter().enumerate() {
            let kernel = &self.plan.kernels[step.kernel];
            let args = Args {
                base,
                buffers: &self.plan.buffers,
                kernel,
                step,
            };
            // SAFETY: `new` validated this step (see `validate`): every argument lies inside the
            // arena with the dtype and size of its signature slot, and no written argument
            // overlaps another argument; `&mut self` gives us exclusive access to the arena.
            unsafe { exec(&args, &ctx) }.map_err(|e| RuntimeError::BadLabel {
                step: si,
                label: step.label.clone(),
                row: e.row,
                label_value: e.label,
                classes: e.classes,
            })?;
            // The loss is computed before any backward or update step: stop there when it is not
            // finite, so the weights stay the last good ones.
            if self.halt_on_nonfinite_loss
                && step.args.contains(&self.plan.loss)
                && !self.loss().is_finite()
            {
                return Ok(self.loss());
            }
            if self.poison {
                for &id in &self.poison_after[si] {
                    let b = &self.plan.buffers[id];
                    // SAFETY: the buffer lies inside the arena (validated); no slice is live.
                    unsafe {
                        std::ptr::write_bytes(base.add(b.offset as usize), 0xFF, b.bytes as usize)
                    };
                }
            }
        }
        Ok(self.loss())
    }
}

/// The initial values of a parameter (an endless stream; take `numel`): `key` is
/// [`name_seed`]`(seed, name)`. Shared with the CUDA backend, which initialises on the host.
pub fn init_values(init: Init, key: u64) -> impl Iterator<Item = f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(key);
    let bound = match init {
        Init::HeUniform { fan_in } => (6.0 / fan_in.max(1) as f64).sqrt(),
        Init::GlorotUniform { fan_in, fan_out } => (6.0 / (fan_in + fan_out).max(1) as f64).sqrt(),
        Init::Zeros => 0.0,
    } as f32;
    std::iter::repeat_with(move || {
        if bound > 0.0 {
            rng.random_range(-bound..bound)
        } else {
            0.0
        }
    })
}

/// The per-parameter RNG key: `(seed, name)`, so values don't depend on the parameter order.
pub fn name_seed(seed: u64, name: &str) -> u64 {
    // FNV-1a of the name, mixed with the seed.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix64(mix64(seed) ^ h)
}

struct Ctx {
    step_counter: u64,
    seed: u64,
    mode: Mode,
}

struct Args<'p> {
    base: *mut u8,
    buffers: &'p [Buffer],
    kernel: &'p Kernel,
    step: &'p Step,
}

impl<'p> Args<'p> {
    fn shape(&self, i: usize) -> &'p [usize] {
        &self.kernel.arg_shapes[i]
    }
    fn ptr(&self, i: usize) -> *mut u8 {
        let b = &self.buffers[self.step.args[i]];
        // SAFETY (of the offset): validated to lie inside the arena.
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
/// The step must have passed [`validate`] and the caller must hold exclusive access to the arena.
/// Each `f32_mut`/`u8_mut` below is taken only for a signature slot with role Out, InOut or
/// Workspace, which `validate` guarantees overlaps no other argument of the step, so the mutable
/// slices are disjoint from each other and from the shared ones.
unsafe fn exec(a: &Args, ctx: &Ctx) -> Result<(), BadLabel> {
    // SAFETY (all calls below): see this function's contract; slot indices follow `Op::signature`.
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

/// Buffers that are views of another buffer's value (a `Reshape` output given its own buffer
/// entry): never written by a step and not filled by the runtime.
fn view_buffers(plan: &Plan) -> Vec<bool> {
    let mut written = vec![false; plan.buffers.len()];
    for s in &plan.steps {
        let Some(k) = plan.kernels.get(s.kernel) else {
            continue;
        };
        for (&id, p) in s.args.iter().zip(&k.signature.params) {
            if p.role != Role::In && id < written.len() {
                written[id] = true;
            }
        }
    }
    plan.buffers
        .iter()
        .enumerate()
        .map(|(i, b)| {
            !written[i]
                && !matches!(
                    b.kind,
                    BufferKind::Input | BufferKind::Parameter | BufferKind::OptimizerState
                )
        })
        .collect()
}

/// Per step, the buffers to poison after it (see [`CpuBackend::set_poison`]).
pub(crate) fn poison_lists(plan: &Plan) -> Vec<Vec<BufferId>> {
    let mut out = vec![Vec::new(); plan.steps.len()];
    let views = view_buffers(plan);
    for b in &plan.buffers {
        if b.persistent || plan.read_after_steps(b.id) || b.bytes == 0 {
            continue;
        }
        let end = b.live.1;
        if end >= plan.steps.len() {
            continue;
        }
        let view_still_live = plan.buffers.iter().any(|o| {
            o.id != b.id
                && o.offset == b.offset
                && o.bytes == b.bytes
                && (views[o.id] || views[b.id])
                && (o.persistent || o.live.1 > end)
        });
        if !view_still_live {
            out[end].push(b.id);
        }
    }
    out
}

/// Checks everything the executor's `unsafe` relies on, and the shapes every kernel assumes.
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
fn check_shapes(op: &Op, s: &[Vec<usize>]) -> Result<(), String> {
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
    let pool = |g: &dmc_plan::op::PoolGeom, x: &[usize], y: &[usize]| {
        rank(x, 4, "x")?;
        if g.size == 0 || g.stride == 0 || g.size * g.size > 256 {
            return Err(format!("bad pool geometry {g:?}"));
        }
        let want = [
            x[0],
            PoolDims::out_size(x[1], g),
            PoolDims::out_size(x[2], g),
            x[3],
        ];
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
