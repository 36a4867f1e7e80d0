//! The runtime's errors: [`RuntimeError`], and the errors of the CUDA backend ([`CudaError`]) and
//! of the CUDA emulator ([`EmuError`]) that it wraps. (The data and weight files have theirs,
//! [`IoError`](crate::io::IoError).)

use dmc_codegen::CodegenError;
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
    /// A run in a pass the plan does not run in (see `Plan::check_run_pass`).
    #[error("{0}")]
    RunPass(String),
    #[error("step {step} (`{label}`): index {label_value} of row {row} is outside 0..{classes} (a class label, or a token of an embedding of {classes} rows)")]
    BadLabel {
        step: usize,
        label: String,
        row: usize,
        label_value: i32,
        classes: usize,
    },
    /// Poison mode's check of streaming: a window's memory was released (its live range ended,
    /// or the run did) while it held a value no write-back had copied to the host store.
    #[error("step {step} (`{label}`) wrote window `{window}`, but no write-back copied it to the host store before its memory was released: the update would be lost (a plan without its device-to-host copy)")]
    LostWriteBack {
        window: String,
        step: usize,
        label: String,
    },
    /// An option this backend does not have (`--profile` on the CPU, say).
    #[error("{0}")]
    Unsupported(String),
    /// Collective communication between the ranks of a data-parallel run ([`crate::comm`]):
    /// MPI missing or failing, mismatched calls.
    #[error("{0}")]
    Comm(String),
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error(transparent)]
    Emu(#[from] EmuError),
}

/// Errors of the CUDA backend ([`crate::cuda`]): NVRTC, the driver, the device.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("{0}")]
    NvrtcMissing(String),
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    #[error("NVRTC could not compile kernel `{kernel}`:\n{log}")]
    Compile { kernel: String, log: String },
    #[error("the CUDA driver (libcuda.so.1) was not found (install the NVIDIA driver)")]
    NoDriver,
    #[error("no usable CUDA GPU: {0}")]
    NoDevice(String),
    #[error("CUDA driver call failed ({what}): {message}")]
    Driver { what: String, message: String },
    #[error(transparent)]
    Codegen(#[from] CodegenError),
}

/// Errors of the CUDA emulator ([`crate::emu`]): the host C++ compiler, its cache, a kernel's run.
#[derive(Debug, thiserror::Error)]
pub enum EmuError {
    #[error(
        "cannot run the C++ compiler `{cxx}`: {reason} (the CUDA emulator compiles kernels with g++: \
         install it, e.g. `apt install g++`, or set DMC_CXX to a g++-compatible compiler)"
    )]
    NoCompiler { cxx: String, reason: String },
    #[error("{cxx} could not compile kernel `{kernel}` for the emulator (source: {source_path}):\n{log}")]
    Compile {
        cxx: String,
        kernel: String,
        source_path: String,
        log: String,
    },
    #[error("cannot load the emulated kernel `{kernel}` from {path}: {message}")]
    Load {
        kernel: String,
        path: String,
        message: String,
    },
    #[error("kernel `{kernel}` failed in the CUDA emulator: {message}")]
    Kernel { kernel: String, message: String },
    #[error("emulator cache {path}: {message} (set DMC_CACHE_DIR to a writable directory)")]
    Cache { path: String, message: String },
    #[error(transparent)]
    Codegen(#[from] CodegenError),
}
