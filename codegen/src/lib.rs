//! Kernel IR -> CUDA C: one `.cu` translation unit per plan kernel, rendered from the `tera`
//! templates in this crate's `templates/` (embedded at build time).
//!
//! * Shapes are baked in as constants (the plan is static); buffer pointers are kernel parameters
//!   that the backend sets to `arena base + planned offset`.
//! * The parameter list of every kernel is rendered from [`kernel_params`], which is derived from
//!   the op's one `Signature` (plus the two per-step scalars `seed` and `step`); the CUDA backend
//!   builds its launch arguments by iterating the same [`kernel_params`]. Nothing is written twice.
//! * [`render_kernel`] matches every `Op` exhaustively (`spec`): a new op does not compile until it
//!   has a template and an arm there, in the module of its family (convolutions, dense layers,
//!   pooling, elementwise ops, losses, optimizer updates, normalisation, sequence ops).
//! * A kernel may be several entry points of one translation unit, launched in order with the
//!   same arguments ([`CudaKernel::launches`]): a split-K GEMM's reduction (`then`), a multi-pass
//!   kernel's later passes (`after`: the attention backward's).
//! * A data-parallel plan's sharded updates are a [`CudaKernel::program`]: launches with the
//!   collectives ([`Collective`]) between them, which the backend runs (NCCL on the GPU, the host
//!   collectives in the emulator).
//! * How to render is the caller's choice ([`CodegenOptions`]); nothing is read from the
//!   environment.

mod error;
mod kernel;
mod options;
pub mod perf;
mod render;
mod spec;
mod templates;
pub mod zoo;

pub use error::CodegenError;
pub use kernel::{
    c_ident, kernel_params, sharded_kernel_params, ArgSource, Collective, CudaKernel, KernelParam,
    Launch, Phase, Region, Scalars,
};
pub use options::CodegenOptions;
pub use render::{entry_name, render_kernel, render_plan};
pub use spec::common::{f32_lit, ELEM_THREADS, REDUCE_THREADS};
pub use spec::gemm::{
    candidate, choose, covers, effective_split, grid_blocks, GemmGeom, GemmKind, GemmNeeds,
    GemmTile, CHUNK_TILES, DEFAULT_TILE, LARGE_BYTES, TILES,
};
/// The skinny GEMM kernels' geometry (`spec::skinny`).
pub mod skinny {
    pub use crate::spec::skinny::{
        block_cols, candidates, smem_floats, OUTER_K_MAX, OUTER_ROWS, ROWS_MAX, ROWS_UNIT,
        SMEM_FLOATS, THREADS,
    };
}
pub use templates::{HOST_HEADER, TEMPLATES};
