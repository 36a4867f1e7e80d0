//! One type over the backends, so the CLI drives the CPU or the CUDA backend with the same calls.

use std::borrow::Cow;

use dmc_codegen::CodegenOptions;
use dmc_plan::plan::Plan;

use crate::cpu::{CpuBackend, InputData};
use crate::cuda::CudaBackend;
use crate::emu::EmuBackend;
use crate::error::RuntimeError;
use crate::host_arena::HostArena;

/// Which backend to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Cuda,
    /// The generated CUDA kernels compiled by the host C++ compiler and run on the CPU.
    CudaEmu,
}

/// Parameters copied back from an arena, as the CPU backend's borrowed ones.
type Params<'a> = Vec<(String, Vec<usize>, Cow<'a, [f32]>)>;

fn owned<'a>(v: Vec<crate::host_arena::NamedTensor>) -> Params<'a> {
    v.into_iter()
        .map(|(n, s, d)| (n, s, Cow::Owned(d)))
        .collect()
}

/// The CPU, the CUDA or the emulated CUDA backend for one plan.
#[allow(clippy::large_enum_variant)] // one per process
pub enum Backend {
    Cpu(CpuBackend),
    Cuda(Box<CudaBackend>),
    CudaEmu(Box<EmuBackend>),
}

impl Backend {
    pub fn new(kind: BackendKind, plan: Plan) -> Result<Self, RuntimeError> {
        Self::with_codegen(kind, plan, &CodegenOptions::default())
    }

    /// [`Backend::new`], the CUDA and emulated backends rendering their kernels with `codegen`.
    pub fn with_codegen(
        kind: BackendKind,
        plan: Plan,
        codegen: &CodegenOptions,
    ) -> Result<Self, RuntimeError> {
        Ok(match kind {
            BackendKind::Cpu => Backend::Cpu(CpuBackend::new(plan)?),
            BackendKind::Cuda => Backend::Cuda(Box::new(CudaBackend::with_codegen(
                plan,
                crate::cuda::open_device()?,
                codegen,
            )?)),
            BackendKind::CudaEmu => {
                Backend::CudaEmu(Box::new(EmuBackend::with_codegen(plan, codegen)?))
            }
        })
    }

    pub fn plan(&self) -> &Plan {
        match self {
            Backend::Cpu(b) => b.plan(),
            Backend::Cuda(b) => b.plan(),
            Backend::CudaEmu(b) => b.plan(),
        }
    }

    /// Device memory taken by the arena (`cuMemGetInfo` before/after), for the CUDA backend.
    pub fn device_arena_bytes(&self) -> Option<u64> {
        match self {
            Backend::Cpu(_) | Backend::CudaEmu(_) => None,
            Backend::Cuda(b) => Some(b.measured_arena_bytes),
        }
    }

    /// Poison mode: dead buffers are filled with NaN after each step.
    pub fn set_poison(&mut self, on: bool) {
        match self {
            Backend::Cpu(b) => b.set_poison(on),
            Backend::Cuda(b) => b.set_poison(on),
            Backend::CudaEmu(b) => b.set_poison(on),
        }
    }

    /// Stop right after the loss when it is not finite: no backward or update step runs, so the
    /// weights stay the last good ones.
    pub fn set_halt_on_nonfinite_loss(&mut self, on: bool) {
        match self {
            Backend::Cpu(b) => b.set_halt_on_nonfinite_loss(on),
            Backend::Cuda(b) => b.set_halt_on_nonfinite_loss(on),
            Backend::CudaEmu(b) => b.set_halt_on_nonfinite_loss(on),
        }
    }

    pub fn init_params(&mut self, seed: u64) -> Result<(), RuntimeError> {
        match self {
            Backend::Cpu(b) => {
                b.init_params(seed);
                Ok(())
            }
            Backend::Cuda(b) => b.init_params(seed),
            Backend::CudaEmu(b) => b.init_params(seed),
        }
    }

    pub fn set_param(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        match self {
            Backend::Cpu(b) => b.set_param(name, data),
            Backend::Cuda(b) => b.set_param(name, data),
            Backend::CudaEmu(b) => b.set_param(name, data),
        }
    }

    /// Every parameter: (name, shape, values), in plan order (copied back from the GPU).
    pub fn params(&self) -> Result<Params<'_>, RuntimeError> {
        match self {
            Backend::Cpu(b) => Ok(b
                .params()
                .map(|(n, s, d)| (n.to_string(), s.to_vec(), Cow::Borrowed(d)))
                .collect()),
            Backend::Cuda(b) => Ok(owned(b.params()?)),
            Backend::CudaEmu(b) => Ok(owned(b.params()?)),
        }
    }

    pub fn set_input(&mut self, name: &str, data: InputData) -> Result<(), RuntimeError> {
        match self {
            Backend::Cpu(b) => b.set_input(name, data),
            Backend::Cuda(b) => b.set_input(name, data),
            Backend::CudaEmu(b) => b.set_input(name, data),
        }
    }

    pub fn run(&mut self, step_counter: u64, seed: u64) -> Result<f32, RuntimeError> {
        match self {
            Backend::Cpu(b) => b.run(step_counter, seed),
            Backend::Cuda(b) => b.run(step_counter, seed),
            Backend::CudaEmu(b) => b.run(step_counter, seed),
        }
    }

    /// The network output after the last `run`.
    pub fn output(&self) -> Result<Cow<'_, [f32]>, RuntimeError> {
        match self {
            Backend::Cpu(b) => Ok(Cow::Borrowed(b.output())),
            Backend::Cuda(b) => Ok(Cow::Owned(b.output()?)),
            Backend::CudaEmu(b) => Ok(Cow::Owned(b.output()?)),
        }
    }
}
