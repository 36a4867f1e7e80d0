//! The [`Backend`] trait: the operations the CLI drives a plan with, the same on the CPU, the CUDA
//! and the emulated CUDA backend ([`CpuBackend`](crate::CpuBackend),
//! [`CudaBackend`](crate::cuda::CudaBackend), [`EmuBackend`](crate::emu::EmuBackend)), and the
//! types they exchange. [`open_backend`](crate::open_backend) builds the one a [`BackendKind`]
//! names.

use std::borrow::Cow;

use dmc_plan::plan::{Plan, RunPass};

use crate::error::RuntimeError;
use crate::profile::KernelProfile;

/// Which backend to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Cuda,
    /// The generated CUDA kernels compiled by the host C++ compiler and run on the CPU.
    CudaEmu,
}

/// Data for [`Backend::set_input`].
#[derive(Debug, Clone, Copy)]
pub enum InputData<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
}

/// Every parameter as (name, shape, values): borrowed from the CPU backend's arena, copied back
/// from the others.
pub type Params<'a> = Vec<(String, Vec<usize>, Cow<'a, [f32]>)>;

/// One plan on one backend: its arena allocated, its kernels ready. Every method behaves the same
/// on every backend (the CPU backend is the reference the others are tested against).
pub trait Backend {
    /// The plan this backend runs.
    fn plan(&self) -> &Plan;

    /// The arena's memory as measured: device memory taken by it (`cuMemGetInfo` before/after)
    /// for the CUDA backend; for a host arena (CPU, emulator) the bytes the counting allocator
    /// counted for its one allocation, or `None` when the counting allocator is not installed.
    /// The backend's own state (its copy of the plan, name tables, compiled kernels) is not in it.
    fn measured_arena_bytes(&self) -> Option<u64>;

    /// Poison mode: after each step, the buffers whose live range ends there are filled with NaN
    /// (see [`CpuBackend::set_poison`](crate::CpuBackend::set_poison)).
    fn set_poison(&mut self, on: bool);

    /// Stop right after the loss when it is not finite: no backward or update step runs, so the
    /// weights stay the last good ones.
    fn set_halt_on_nonfinite_loss(&mut self, on: bool);

    /// Initialises every parameter from `(seed, name)` ([`crate::init`]) and zeroes the optimizer
    /// state.
    fn init_params(&mut self, seed: u64) -> Result<(), RuntimeError>;

    /// Overwrites a parameter.
    fn set_param(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError>;

    /// Every parameter: (name, shape, values), in plan order.
    fn params(&self) -> Result<Params<'_>, RuntimeError>;

    /// Every optimizer state tensor (`conv3.weight.momentum`, Adam's moments): (name, shape,
    /// values), in plan order. With the parameters and the step counter this is everything a
    /// training step carries to the next one, so a checkpoint of both resumes exactly.
    fn opt_states(&self) -> Result<Params<'_>, RuntimeError>;

    /// Overwrites an optimizer state tensor (when resuming from a checkpoint).
    fn set_opt_state(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError>;

    /// Feeds a batch input or target (by name).
    fn set_input(&mut self, name: &str, data: InputData) -> Result<(), RuntimeError>;

    /// Executes every step of the plan in order and returns the loss. `step_counter` is the
    /// 1-based training step (Adam's `t`, part of the dropout key with `seed`).
    fn run(&mut self, step_counter: u64, seed: u64) -> Result<f32, RuntimeError>;

    /// The learning rate of the following `run`s: what the optimizer updates use instead of the
    /// plan optimizer's `lr` (which holds until this is called). The training loop sets each
    /// step's rate from the plan's schedule ([`Plan::schedule`]).
    fn set_learning_rate(&mut self, lr: f32);

    /// Which steps the following `run`s execute ([`Plan::runs_step`]; default
    /// [`RunPass::Whole`]): with gradient accumulation ([`Plan::accumulate`]) the training loop
    /// runs every micro-batch but the last of a step as [`RunPass::Accumulate`] (they only
    /// accumulate the gradients); a plan clipping the norm in two passes
    /// ([`ClipNormMethod::NormPass`](dmc_plan::plan::ClipNormMethod::NormPass)) runs each step as
    /// [`RunPass::Norm`] then [`RunPass::Update`] on the same batch. A `run` in a pass the plan
    /// does not run in ([`Plan::check_run_pass`]) is an error.
    fn set_run_pass(&mut self, pass: RunPass);

    /// The network output after the last `run`.
    fn output(&self) -> Result<Cow<'_, [f32]>, RuntimeError>;

    /// Times every kernel launch of the following `run`s (`dmc run --profile`), read back with
    /// [`Backend::profile`]. The CUDA backend measures with CUDA events, the CPU backend with the
    /// wall clock around each step; the others refuse.
    fn set_profile(&mut self, on: bool) -> Result<(), RuntimeError> {
        let _ = on;
        Err(RuntimeError::Unsupported(
            "profiling times kernels on the CPU backend (wall clock) and the CUDA backend (CUDA events) only".into(),
        ))
    }

    /// The per-kernel times of the profiled runs so far (`None` when not profiling).
    fn profile(&self) -> Option<KernelProfile> {
        None
    }

    /// The group of processes a data-parallel plan runs with ([`Plan::ranks`]): this process is
    /// `c.rank()` of `c.world()`. The CPU backend and the emulator run the sharded steps' collectives
    /// with `c` itself, the CUDA backend with NCCL bootstrapped over it; a backend without
    /// sharded steps refuses.
    fn set_collective(
        &mut self,
        c: std::sync::Arc<dyn crate::comm::Collective>,
    ) -> Result<(), RuntimeError> {
        let _ = c;
        Err(RuntimeError::Unsupported(
            "data-parallel training runs on the CPU backend (MPI), the CUDA backend (NCCL) and its emulator".into(),
        ))
    }

    /// The group set by [`Backend::set_collective`] (`None`: this process alone).
    fn collective(&self) -> Option<&dyn crate::comm::Collective> {
        None
    }

    /// What carries the sharded steps' collectives when it is not [`Backend::collective`]
    /// itself (the CUDA backend's NCCL, e.g. "NCCL 2.21.5 (libnccl.so.2)"); `None` otherwise.
    fn device_collective(&self) -> Option<String> {
        None
    }

    /// Replay each run's launches as CUDA graphs captured once (`dmc run --cuda-graph`): the
    /// same kernels in the same order, so the same results, with one graph launch instead of a
    /// launch per kernel. Only the CUDA backend has it; the others refuse.
    fn set_cuda_graph(&mut self, on: bool) -> Result<(), RuntimeError> {
        let _ = on;
        Err(RuntimeError::Unsupported(
            "CUDA graphs are a CUDA backend option".into(),
        ))
    }
}

/// A boxed backend (as [`open_backend`](crate::open_backend) returns it) is a backend, so
/// `&mut Box<dyn Backend>` can be passed where `&mut dyn Backend` is expected.
impl<B: Backend + ?Sized> Backend for Box<B> {
    fn plan(&self) -> &Plan {
        (**self).plan()
    }

    fn measured_arena_bytes(&self) -> Option<u64> {
        (**self).measured_arena_bytes()
    }

    fn set_poison(&mut self, on: bool) {
        (**self).set_poison(on);
    }

    fn set_halt_on_nonfinite_loss(&mut self, on: bool) {
        (**self).set_halt_on_nonfinite_loss(on);
    }

    fn init_params(&mut self, seed: u64) -> Result<(), RuntimeError> {
        (**self).init_params(seed)
    }

    fn set_param(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        (**self).set_param(name, data)
    }

    fn params(&self) -> Result<Params<'_>, RuntimeError> {
        (**self).params()
    }

    fn opt_states(&self) -> Result<Params<'_>, RuntimeError> {
        (**self).opt_states()
    }

    fn set_opt_state(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        (**self).set_opt_state(name, data)
    }

    fn set_input(&mut self, name: &str, data: InputData) -> Result<(), RuntimeError> {
        (**self).set_input(name, data)
    }

    fn run(&mut self, step_counter: u64, seed: u64) -> Result<f32, RuntimeError> {
        (**self).run(step_counter, seed)
    }

    fn set_learning_rate(&mut self, lr: f32) {
        (**self).set_learning_rate(lr);
    }

    fn set_run_pass(&mut self, pass: RunPass) {
        (**self).set_run_pass(pass);
    }

    fn output(&self) -> Result<Cow<'_, [f32]>, RuntimeError> {
        (**self).output()
    }

    fn set_profile(&mut self, on: bool) -> Result<(), RuntimeError> {
        (**self).set_profile(on)
    }

    fn profile(&self) -> Option<KernelProfile> {
        (**self).profile()
    }

    fn set_cuda_graph(&mut self, on: bool) -> Result<(), RuntimeError> {
        (**self).set_cuda_graph(on)
    }

    fn set_collective(
        &mut self,
        c: std::sync::Arc<dyn crate::comm::Collective>,
    ) -> Result<(), RuntimeError> {
        (**self).set_collective(c)
    }

    fn collective(&self) -> Option<&dyn crate::comm::Collective> {
        (**self).collective()
    }

    fn device_collective(&self) -> Option<String> {
        (**self).device_collective()
    }
}
