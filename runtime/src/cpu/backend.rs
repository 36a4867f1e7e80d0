//! The CPU backend: one arena of `plan.arena_bytes` in host memory, every buffer a slice of it at
//! its planned offset; parameters, optimizer state and inputs are written into it directly, and
//! `run` executes the steps in order ([`executor`](super::executor)). Nothing proportional to the
//! model is allocated during a step.

use std::borrow::Cow;
use std::collections::HashMap;

use dmc_plan::op::DType;
use dmc_plan::plan::{Buffer, BufferId, BufferKind, Plan, RunPass, Store};

use super::args::{Args, Ctx};
use super::executor::exec;
use crate::arena::Arena;
use crate::backend::{Backend, InputData, Params};
use crate::comm::Collective;
use crate::error::RuntimeError;
use crate::poison::poison_lists;
use crate::profile::{KernelProfile, ProfileAccumulator};
use crate::stream::WindowCheck;
use crate::validate::validate;
use std::sync::Arc;

/// The CPU backend for one plan.
pub struct CpuBackend {
    plan: Plan,
    arena: Arena,
    /// The host store of the streamed parameters and optimizer state (`plan.host_bytes`; empty
    /// without streaming): a second allocation, outside the arena and its cap.
    host: Arena,
    /// Poison mode's checks of the copy steps (streaming).
    windows: WindowCheck,
    poison: bool,
    halt_on_nonfinite_loss: bool,
    /// The learning rate of the updates (`set_learning_rate`; the plan optimizer's until set).
    lr: f32,
    /// Which steps runs execute (`set_run_pass`).
    pass: RunPass,
    /// Per step: the buffers to fill with NaN after it in poison mode.
    poison_after: Vec<Vec<BufferId>>,
    params: HashMap<String, usize>,
    opt_state: HashMap<String, usize>,
    /// Wall time of every step's kernel when runs are profiled (`set_profile`).
    profiler: Option<ProfileAccumulator>,
    /// The ranks a data-parallel plan runs with (`set_collective`; `None`: this process alone).
    comm: Option<Arc<dyn Collective>>,
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl CpuBackend {
    /// Validates the plan and allocates its arena (zeroed). Fails on an inconsistent plan or if
    /// the arena cannot be allocated.
    pub fn new(plan: Plan) -> Result<Self, RuntimeError> {
        validate(&plan)?;
        let arena = Arena::new(plan.arena_bytes)?;
        let host = Arena::new(plan.host_bytes)?;
        let windows = WindowCheck::new(&plan);
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
        let lr = plan.optimizer.lr();
        Ok(CpuBackend {
            plan,
            arena,
            host,
            windows,
            poison: false,
            halt_on_nonfinite_loss: false,
            lr,
            pass: RunPass::Whole,
            poison_after,
            params,
            opt_state,
            profiler: None,
            comm: None,
        })
    }

    /// Times every step of the following runs (wall time around each kernel, on the thread that
    /// runs the step; its parallel loops join before it returns), accumulated per plan kernel
    /// ([`CpuBackend::profile`]). Turning it off drops them.
    pub fn set_profile(&mut self, on: bool) {
        self.profiler = on.then(|| {
            ProfileAccumulator::new(
                self.plan.kernels.iter().map(|k| k.name.clone()).collect(),
                "wall clock around each step",
            )
        });
    }

    /// The per-kernel times of the profiled runs so far (`None` unless profiling).
    pub fn profile(&self) -> Option<KernelProfile> {
        self.profiler.as_ref().map(ProfileAccumulator::profile)
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

    /// The base of the memory buffer `b` lives in: the arena, or the host store.
    fn base_of(&self, b: &Buffer) -> *mut u8 {
        match b.store {
            Store::Arena => self.arena.ptr.as_ptr(),
            Store::Host => self.host.ptr.as_ptr(),
        }
    }

    /// Bytes of the host store (the streamed tensors' homes; 0 without streaming).
    pub fn host_store_bytes(&self) -> u64 {
        self.plan.host_bytes
    }

    fn f32_slice(&self, id: BufferId, len: usize) -> &[f32] {
        let b = self.buf(id);
        debug_assert!(len * 4 <= b.bytes as usize);
        // SAFETY: validated in `new`: the buffer lies inside the arena (or the host store), its
        // offset is 64-byte aligned and it holds at least `len` f32 (any bit pattern is a valid
        // f32); `&self` keeps the memory from being written while the slice lives.
        unsafe {
            std::slice::from_raw_parts(self.base_of(b).add(b.offset as usize) as *const f32, len)
        }
    }

    fn bytes_mut(&mut self, id: BufferId, len: usize) -> &mut [u8] {
        let b = &self.plan.buffers[id];
        assert!(len <= b.bytes as usize);
        let base = self.base_of(b);
        // SAFETY: the buffer lies inside the arena or the host store (validated in `new`);
        // `&mut self` makes this the only live reference into either.
        unsafe { std::slice::from_raw_parts_mut(base.add(b.offset as usize), len) }
    }

    /// Initialises every parameter per its `Init`, from an RNG seeded by `(seed, name)` (so the
    /// values don't depend on the parameter order), and zeroes the optimizer state.
    pub fn init_params(&mut self, seed: u64) {
        // (a sharded parameter: this rank's rows)
        let rank = self.comm.as_ref().map_or(0, |c| c.rank());
        for i in 0..self.plan.params.len() {
            let p = &self.plan.params[i];
            let (buffer, vals) = (p.buffer, crate::host_arena::param_values(p, seed, rank));
            let bytes = self.bytes_mut(buffer, vals.len() * 4);
            for (c, v) in bytes.chunks_exact_mut(4).zip(vals) {
                c.copy_from_slice(&v.to_ne_bytes());
            }
        }
        for i in 0..self.plan.opt_state.len() {
            let (buffer, n) = (
                self.plan.opt_state[i].buffer,
                numel(&self.plan.opt_state[i].buffer_shape()),
            );
            self.bytes_mut(buffer, n * 4).fill(0);
        }
        // the accumulated gradients (`accumulate: N`) start at zero
        for i in 0..self.plan.buffers.len() {
            let b = &self.plan.buffers[i];
            if b.kind == BufferKind::GradAccum {
                let (id, n) = (b.id, b.bytes as usize);
                self.bytes_mut(id, n).fill(0);
            }
        }
    }

    /// A parameter's values (a sharded one's buffer: this rank's rows,
    /// [`ParamBinding::buffer_shape`](dmc_plan::plan::ParamBinding::buffer_shape)).
    pub fn param(&self, name: &str) -> Option<&[f32]> {
        let p = &self.plan.params[*self.params.get(name)?];
        Some(self.f32_slice(p.buffer, numel(&p.buffer_shape())))
    }

    /// Every parameter: (name, the shape of its buffer, values), in plan order (a sharded
    /// parameter's buffer is this rank's rows, flat).
    pub fn params(&self) -> impl Iterator<Item = (&str, Vec<usize>, &[f32])> + '_ {
        self.plan.params.iter().map(move |p| {
            let shape = p.buffer_shape();
            let n = numel(&shape);
            (p.name.as_str(), shape, self.f32_slice(p.buffer, n))
        })
    }

    /// Overwrites a parameter (a sharded one's buffer: this rank's rows).
    pub fn set_param(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        let i = *self
            .params
            .get(name)
            .ok_or_else(|| RuntimeError::UnknownParam(name.into()))?;
        let (buffer, n) = (
            self.plan.params[i].buffer,
            numel(&self.plan.params[i].buffer_shape()),
        );
        self.write_f32(name, buffer, n, data)
    }

    /// An optimizer state tensor's values (e.g. `conv3.weight.momentum`; a sharded one's buffer,
    /// [`ParamBinding::buffer_shape`](dmc_plan::plan::ParamBinding::buffer_shape)).
    pub fn opt_state(&self, name: &str) -> Option<&[f32]> {
        let p = &self.plan.opt_state[*self.opt_state.get(name)?];
        Some(self.f32_slice(p.buffer, numel(&p.buffer_shape())))
    }

    /// Every optimizer state tensor: (name, the shape of its buffer, values), in plan order (a
    /// sharded state's buffer is this rank's shard, flat).
    pub fn opt_states(&self) -> impl Iterator<Item = (&str, Vec<usize>, &[f32])> + '_ {
        self.plan.opt_state.iter().map(move |p| {
            let shape = p.buffer_shape();
            let n = numel(&shape);
            (p.name.as_str(), shape, self.f32_slice(p.buffer, n))
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
            numel(&self.plan.opt_state[i].buffer_shape()),
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

    /// Overwrites the loss (data parallel: with the ranks' sum).
    fn set_loss(&mut self, v: f32) {
        let loss = self.plan.loss;
        self.bytes_mut(loss, 4).copy_from_slice(&v.to_ne_bytes());
    }

    /// When on, `run` stops right after the loss kernel if the loss is NaN or infinite, before any
    /// backward or update step, so the parameters keep their last good values.
    pub fn set_halt_on_nonfinite_loss(&mut self, on: bool) {
        self.halt_on_nonfinite_loss = on;
    }

    /// The learning rate of the next `run`s (the plan's optimizer's until set): the updates use it
    /// in place of their rule's `lr`.
    pub fn set_learning_rate(&mut self, lr: f32) {
        self.lr = lr;
    }

    /// Which steps the next `run`s execute (default all; see `Backend::set_run_pass`).
    pub fn set_run_pass(&mut self, pass: RunPass) {
        self.pass = pass;
    }

    /// Executes every step of the plan in order and returns the loss (NaN/Inf is returned as is).
    /// `step_counter` is the 1-based training step: Adam's `t` and part of the dropout key, with
    /// `seed`.
    pub fn run(&mut self, step_counter: u64, seed: u64) -> Result<f32, RuntimeError> {
        // The whole step runs on a rayon worker: the kernels' parallel loops then start from inside
        // the pool (no hand-off from a foreign thread per kernel, small loops run inline).
        rayon::scope(|_| self.run_steps(step_counter, seed))
    }

    /// The group of processes a data-parallel plan ([`Plan::ranks`]) runs with: this process is
    /// `c.rank()` of `c.world()`, which must be the plan's ranks (checked by [`CpuBackend::run`]).
    pub fn set_collective(&mut self, c: Arc<dyn Collective>) {
        self.comm = Some(c);
    }

    fn run_steps(&mut self, step_counter: u64, seed: u64) -> Result<f32, RuntimeError> {
        let world = self.comm.as_ref().map_or(1, |c| c.world());
        crate::host_arena::check_ranks(&self.plan, world)?;
        let base = self.arena.ptr.as_ptr();
        let host = self.host.ptr.as_ptr();
        let ctx = Ctx {
            step_counter,
            seed,
            lr: self.lr,
            mode: self.plan.mode,
            comm: self.comm.clone(),
        };
        let mut loss_summed = false;
        self.plan
            .check_run_pass(self.pass)
            .map_err(RuntimeError::RunPass)?;
        // Poison mode lands each copy as late as its `ready` allows (see `crate::stream`).
        let deferred = self.poison && self.windows.any();
        self.windows.reset();
        if self.poison {
            // an offloaded activation's home holds NaN until its write-back lands
            for b in self
                .plan
                .buffers
                .iter()
                .filter(|b| b.store == Store::Host && !b.persistent)
            {
                // SAFETY: the home lies inside the host store (validated); no slice is live.
                unsafe {
                    std::ptr::write_bytes(host.add(b.offset as usize), 0xFF, b.bytes as usize)
                };
            }
        }
        for si in 0..self.plan.steps.len() {
            let copy = self.plan.transfer_op(si);
            if self.plan.runs_step(si, self.pass) {
                if deferred && copy.is_some() {
                    if copy == Some(dmc_plan::op::TransferOp::HostToDevice) {
                        // the window holds NaN until its copy lands
                        let w = &self.plan.buffers[self.plan.steps[si].args[1]];
                        // SAFETY: the window lies inside the arena (validated); no slice is live.
                        unsafe {
                            std::ptr::write_bytes(
                                base.add(w.offset as usize),
                                0xFF,
                                w.bytes as usize,
                            )
                        };
                    }
                } else {
                    self.exec_step(si, base, host, &ctx)?;
                }
                let loss_step = self.plan.steps[si].args.contains(&self.plan.loss);
                // Data parallel: the ranks' losses (each weighted by 1/ranks) summed on every
                // rank right where the loss is written, so all see the global loss (and halt
                // alike).
                if loss_step && !loss_summed {
                    loss_summed = true;
                    if let Some(c) = self.comm.as_deref().filter(|c| c.world() > 1) {
                        let mut l = [self.loss()];
                        crate::comm::all_reduce_sum(c, &mut l)?;
                        self.set_loss(l[0]);
                    }
                }
                // The loss is computed before any backward or update step: stop there when it is
                // not finite, so the weights stay the last good ones.
                if self.halt_on_nonfinite_loss && loss_step && !self.loss().is_finite() {
                    return Ok(self.loss());
                }
            }
            if self.poison {
                if deferred {
                    for i in 0..self.windows.land_after(si).len() {
                        let c = self.windows.land_after(si)[i];
                        self.exec_step(c, base, host, &ctx)?;
                    }
                }
                for &id in &self.poison_after[si] {
                    self.windows.check_released(&self.plan, Some(id))?;
                    let b = &self.plan.buffers[id];
                    // SAFETY: the buffer lies inside the arena (validated); no slice is live.
                    unsafe {
                        std::ptr::write_bytes(base.add(b.offset as usize), 0xFF, b.bytes as usize)
                    };
                }
            }
        }
        if self.poison {
            self.windows.check_released(&self.plan, None)?;
        }
        Ok(self.loss())
    }

    /// Runs step `si` (a kernel or a copy), timing it when profiling; in poison mode, notes the
    /// windows it writes or writes back.
    fn exec_step(
        &mut self,
        si: usize,
        base: *mut u8,
        host: *mut u8,
        ctx: &Ctx,
    ) -> Result<(), RuntimeError> {
        let step = &self.plan.steps[si];
        let kernel = &self.plan.kernels[step.kernel];
        let args = Args {
            base,
            host,
            buffers: &self.plan.buffers,
            kernel,
            step,
        };
        let t0 = self.profiler.is_some().then(std::time::Instant::now);
        // SAFETY: `new` validated this step (see `validate`): every argument lies inside the
        // arena (a copy's host side inside the host store) with the dtype and size of its
        // signature slot, and no written argument overlaps another argument; `&mut self` gives us
        // exclusive access to both.
        let r = unsafe { exec(&args, ctx) };
        if let (Some(p), Some(t0)) = (self.profiler.as_mut(), t0) {
            p.record(
                ctx.step_counter,
                step.kernel,
                t0.elapsed().as_secs_f64() * 1e3,
            );
        }
        r.map_err(|e| RuntimeError::BadLabel {
            step: si,
            label: step.label.clone(),
            row: e.row,
            label_value: e.label,
            classes: e.classes,
        })?;
        if self.poison {
            self.windows.ran(&self.plan, si);
        }
        Ok(())
    }
}

/// The trait's methods are the inherent ones above (which take precedence in calls on a
/// `CpuBackend`, so `CpuBackend::x(self)` below is never a recursion).
impl Backend for CpuBackend {
    fn plan(&self) -> &Plan {
        CpuBackend::plan(self)
    }

    fn measured_arena_bytes(&self) -> Option<u64> {
        self.arena.measured_bytes()
    }

    fn set_poison(&mut self, on: bool) {
        CpuBackend::set_poison(self, on);
    }

    fn set_halt_on_nonfinite_loss(&mut self, on: bool) {
        CpuBackend::set_halt_on_nonfinite_loss(self, on);
    }

    fn init_params(&mut self, seed: u64) -> Result<(), RuntimeError> {
        CpuBackend::init_params(self, seed);
        Ok(())
    }

    fn set_collective(&mut self, c: Arc<dyn Collective>) -> Result<(), RuntimeError> {
        CpuBackend::set_collective(self, c);
        Ok(())
    }

    fn collective(&self) -> Option<&dyn Collective> {
        self.comm.as_deref()
    }

    fn set_param(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        CpuBackend::set_param(self, name, data)
    }

    fn params(&self) -> Result<Params<'_>, RuntimeError> {
        Ok(CpuBackend::params(self)
            .map(|(n, s, d)| (n.to_string(), s, Cow::Borrowed(d)))
            .collect())
    }

    fn opt_states(&self) -> Result<Params<'_>, RuntimeError> {
        Ok(CpuBackend::opt_states(self)
            .map(|(n, s, d)| (n.to_string(), s, Cow::Borrowed(d)))
            .collect())
    }

    fn set_opt_state(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        CpuBackend::set_opt_state(self, name, data)
    }

    fn set_input(&mut self, name: &str, data: InputData) -> Result<(), RuntimeError> {
        CpuBackend::set_input(self, name, data)
    }

    fn run(&mut self, step_counter: u64, seed: u64) -> Result<f32, RuntimeError> {
        CpuBackend::run(self, step_counter, seed)
    }

    fn set_learning_rate(&mut self, lr: f32) {
        CpuBackend::set_learning_rate(self, lr);
    }

    fn set_run_pass(&mut self, pass: RunPass) {
        CpuBackend::set_run_pass(self, pass);
    }

    fn output(&self) -> Result<Cow<'_, [f32]>, RuntimeError> {
        Ok(Cow::Borrowed(CpuBackend::output(self)))
    }

    fn set_profile(&mut self, on: bool) -> Result<(), RuntimeError> {
        CpuBackend::set_profile(self, on);
        Ok(())
    }

    fn profile(&self) -> Option<KernelProfile> {
        CpuBackend::profile(self)
    }
}
