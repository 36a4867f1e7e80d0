//! The CPU backend: kernels for every [`Op`](dmc_compiler::op::Op) (plain slices in, slices out;
//! deterministic; multi-threaded with rayon, GEMMs through `matrixmultiply`) and the executor that
//! runs a [`Plan`](dmc_compiler::plan::Plan) on one arena.

pub mod conv;
pub mod dense;
pub mod elementwise;
pub mod executor;
pub mod gemm;
pub mod loss;
pub mod optim;
pub mod par;
pub mod pool;

pub use executor::{CpuBackend, InputData};
