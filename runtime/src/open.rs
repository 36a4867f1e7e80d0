//! Builds the backend a [`BackendKind`] names, as a [`Backend`] trait object: the one place that
//! knows every backend type.

use dmc_compiler::plan::Plan;

use crate::backend::{Backend, BackendKind};
use crate::cpu::CpuBackend;
use crate::cuda::CudaBackend;
use crate::emu::EmuBackend;
use crate::error::RuntimeError;

/// Validates `plan`, allocates its arena and prepares its kernels on the backend `kind`.
pub fn open_backend(kind: BackendKind, plan: Plan) -> Result<Box<dyn Backend>, RuntimeError> {
    Ok(match kind {
        BackendKind::Cpu => Box::new(CpuBackend::new(plan)?),
        BackendKind::Cuda => Box::new(CudaBackend::new(plan)?),
        BackendKind::CudaEmu => Box::new(EmuBackend::new(plan)?),
    })
}
