//! Runtime errors.

use dmc_plan::op::DType;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("unknown input or target `{0}`")]
    UnknownInput(String),
    #[error("unknown parameter `{0}`")]
    UnknownParam(String),
    #[error("unknown optimizer state `{0}`")]
    UnknownOptState(String),
    #[error("size mismatch for `{name}`: expected {expected} elements, got {got}")]
    SizeMismatch {
        name: String,
        expected: usize,
        got: usize,
    },
    #[error("dtype mismatch for `{name}`: expected {expected:?}, got {got:?}")]
    DTypeMismatch {
        name: String,
        expected: DType,
        got: DType,
    },
    #[error("cannot allocate the arena of {bytes} bytes; use a smaller --batch, or --vram-cap to make the plan smaller")]
    Alloc { bytes: u64 },
    #[error("the plan's arena of {bytes} bytes is larger than this machine's memory ({memory} bytes); use a smaller --batch, or --vram-cap {memory} to plan a step that fits")]
    ArenaTooLarge { bytes: u64, memory: u64 },
    #[error("bad plan: {0}")]
    BadPlan(String),
    #[error("step {step} (`{label}`): label {label_value} of row {row} is outside 0..{classes}")]
    BadLabel {
        step: usize,
        label: String,
        row: usize,
        label_value: i32,
        classes: usize,
    },
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    #[error(transparent)]
    Emu(#[from] crate::emu::EmuError),
}
