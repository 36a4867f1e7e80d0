//! dmc runtime: executes an execution plan on one arena (CPU backend), and reads/writes data and
//! weights.

pub mod alloc;
pub mod cpu;
pub mod error;
pub mod io;

pub use cpu::{CpuBackend, InputData};
pub use error::RuntimeError;
pub mod backend;
pub mod cuda;
pub use backend::{Backend, BackendKind};
