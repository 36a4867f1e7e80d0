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
//!   pooling, elementwise ops, losses, optimizer updates).
//! * How to render is the caller's choice ([`CodegenOptions`]); nothing is read from the
//!   environment.

mod kernel;
mod spec;
pub mod zoo;

use std::fmt::Write as _;

use tera::Tera;

use dmc_plan::plan::{Kernel, Mode, Plan};

pub use kernel::{kernel_params, ArgSource, CudaKernel, KernelParam, Launch};
pub use spec::gemm::{
    split_k, GemmTile, CHUNK_TILES, DEFAULT_TILE, SPLIT_MAX, SPLIT_MIN_TILES, SPLIT_TARGET_BLOCKS,
};
pub use spec::{f32_lit, ELEM_THREADS, REDUCE_THREADS};

/// The templates, embedded (name, text). `prelude.cuh.tera`, `gemm.cuh.tera` and
/// `update.cuh.tera` (the per-element optimizer update) are included by the others.
pub const TEMPLATES: &[(&str, &str)] = &[
    (
        "prelude.cuh.tera",
        include_str!("../templates/prelude.cuh.tera"),
    ),
    ("gemm.cuh.tera", include_str!("../templates/gemm.cuh.tera")),
    (
        "elementwise.cu.tera",
        include_str!("../templates/elementwise.cu.tera"),
    ),
    (
        "update.cuh.tera",
        include_str!("../templates/update.cuh.tera"),
    ),
    ("optim.cu.tera", include_str!("../templates/optim.cu.tera")),
    (
        "conv2d_fwd.cu.tera",
        include_str!("../templates/conv2d_fwd.cu.tera"),
    ),
    (
        "conv2d_bwd_data.cu.tera",
        include_str!("../templates/conv2d_bwd_data.cu.tera"),
    ),
    (
        "conv2d_bwd_weight.cu.tera",
        include_str!("../templates/conv2d_bwd_weight.cu.tera"),
    ),
    (
        "matmul.cu.tera",
        include_str!("../templates/matmul.cu.tera"),
    ),
    ("pool.cu.tera", include_str!("../templates/pool.cu.tera")),
    ("loss.cu.tera", include_str!("../templates/loss.cu.tera")),
    (
        "bias_grad.cu.tera",
        include_str!("../templates/bias_grad.cu.tera"),
    ),
];

/// The host header against which the CUDA emulator compiles the generated kernels unchanged with
/// a C++ compiler (CUDA's built-ins, `__shared__` per block, a block's threads as fibers).
pub const HOST_HEADER: &str = include_str!("../templates/host/cuda_host.h");

#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("template error in `{template}` for kernel `{kernel}`: {message}")]
    Template {
        template: String,
        kernel: String,
        message: String,
    },
    #[error("kernel `{kernel}`: {message}")]
    Shape { kernel: String, message: String },
    #[error("kernel `{kernel}`: launch grid too large ({message})")]
    Grid { kernel: String, message: String },
}

/// How to render a plan's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodegenOptions {
    /// Split the reduction of a GEMM with too few output tiles for the GPU ([`split_k`]).
    /// Off renders every GEMM unsplit: the baseline of a split-K speed comparison on a GPU
    /// (`dmc run --no-split-k`, timed by `scripts/gpu-check.sh`).
    pub split_k: bool,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        CodegenOptions { split_k: true }
    }
}

fn tera() -> Result<Tera, CodegenError> {
    let mut t = Tera::default();
    t.add_raw_templates(TEMPLATES.iter().copied())
        .map_err(|e| CodegenError::Template {
            template: "(all)".into(),
            kernel: String::new(),
            message: error_chain(&e),
        })?;
    Ok(t)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let _ = write!(s, ": {c}");
        src = c.source();
    }
    s
}

/// The C identifier of a kernel's entry point.
pub fn entry_name(k: &Kernel) -> String {
    let mut s = String::from("dmc_");
    s.extend(
        k.name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
    );
    s
}

/// Renders one kernel (`None` for leaves and `Reshape`, which have no kernel). `mode` is the plan's
/// (dropout is the identity in `Eval`).
pub fn render_kernel(
    k: &Kernel,
    mode: Mode,
    opts: &CodegenOptions,
) -> Result<Option<CudaKernel>, CodegenError> {
    render_with(&tera()?, k, mode, opts)
}

fn render_with(
    t: &Tera,
    k: &Kernel,
    mode: Mode,
    opts: &CodegenOptions,
) -> Result<Option<CudaKernel>, CodegenError> {
    let Some(spec::Spec {
        template,
        mut ctx,
        grid,
        block,
        split,
        outputs,
    }) = spec::spec(k, mode, opts)?
    else {
        return Ok(None);
    };
    let params = kernel_params(&k.op.signature());
    let entry = entry_name(k);
    let decls: Vec<&str> = params.iter().map(|p| p.decl.as_str()).collect();
    ctx.insert("name", &k.name);
    ctx.insert("entry", &entry);
    ctx.insert("params", &decls.join(", "));
    let source = t
        .render(template, &ctx)
        .map_err(|e| CodegenError::Template {
            template: template.into(),
            kernel: k.name.clone(),
            message: error_chain(&e),
        })?;
    let then = if split > 1 {
        Some(Launch {
            entry: format!("{entry}_reduce"),
            grid: [spec::blocks(outputs, ELEM_THREADS, &k.name)?, 1, 1],
            block: [ELEM_THREADS, 1, 1],
        })
    } else {
        None
    };
    Ok(Some(CudaKernel {
        id: k.id,
        name: k.name.clone(),
        entry,
        template,
        source,
        grid,
        block,
        params,
        then,
    }))
}

/// Renders every kernel of the plan that has one, in plan order.
pub fn render_plan(plan: &Plan, opts: &CodegenOptions) -> Result<Vec<CudaKernel>, CodegenError> {
    let t = tera()?;
    let mut out = Vec::new();
    for k in &plan.kernels {
        if let Some(c) = render_with(&t, k, plan.mode, opts)? {
            out.push(c);
        }
    }
    Ok(out)
}
