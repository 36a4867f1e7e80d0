//! Builds the backend a [`BackendKind`] names, as a [`Backend`] trait object: the one place that
//! knows every backend type.

use dmc_codegen::CodegenOptions;
use dmc_plan::plan::Plan;

use crate::backend::{Backend, BackendKind};
use crate::cpu::CpuBackend;
use crate::cuda::CudaBackend;
use crate::emu::EmuBackend;
use crate::error::RuntimeError;

/// Validates `plan`, allocates its arena and prepares its kernels on the backend `kind` (the CUDA
/// and emulated backends render them with `codegen`).
pub fn open_backend(
    kind: BackendKind,
    plan: Plan,
    codegen: &CodegenOptions,
) -> Result<Box<dyn Backend>, RuntimeError> {
    Ok(match kind {
        BackendKind::Cpu => Box::new(CpuBackend::new(plan)?),
        BackendKind::Cuda => Box::new(CudaBackend::with_codegen(
            plan,
            crate::cuda::open_device()?,
            codegen,
        )?),
        BackendKind::CudaEmu => Box::new(EmuBackend::with_codegen(plan, codegen)?),
    })
}
