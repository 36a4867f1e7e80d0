//! dmc runtime: executes an execution plan on one arena (CPU, CUDA or emulated CUDA backend, all
//! behind the [`Backend`] trait), and reads/writes data and weights.

pub mod alloc;
pub(crate) mod arena;
pub mod backend;
pub mod comm;
pub mod compare;
pub mod cpu;
pub mod cuda;
pub mod emu;
pub mod error;
mod hash;
pub mod host_arena;
pub mod init;
pub mod io;
pub mod mi_options;
mod open;
mod poison;
pub mod profile;
pub(crate) mod stream;
pub mod validate;

pub use backend::{Backend, BackendKind, InputData};
pub use cpu::CpuBackend;
pub use dmc_plan::plan::RunPass;
pub use error::RuntimeError;
pub use host_arena::HostArena;
pub use open::open_backend;
pub use validate::check_plan;
