//! dmc runtime: executes an execution plan on one arena (CPU backend).

pub mod alloc;
pub mod cpu;
pub mod error;

pub use cpu::{CpuBackend, InputData};
pub use error::RuntimeError;
