//! dmc runtime: executes an execution plan on one arena (CPU backend), and reads/writes data and
//! weights.

pub mod alloc;
pub mod cpu;
pub mod error;
pub mod io;

pub use cpu::executor::check_plan;
pub use cpu::{CpuBackend, InputData};
pub use error::RuntimeError;
pub mod backend;
pub mod compare;
pub mod cuda;
pub mod emu;
pub mod host_arena;
pub use backend::{Backend, BackendKind};
pub use host_arena::HostArena;
