//! The `tera` templates of the generated kernels and the emulator's host header, embedded at build
//! time from this crate's `templates/` directory.

/// The templates, embedded (name, text). `prelude.cuh.tera`, `gemm.cuh.tera` (with
/// `gemm_skinny.cuh.tera`), `epilogue.cuh.tera`
/// (a GEMM's fused epilogue) and `update.cuh.tera` (the per-element optimizer update) are included
/// by the others.
pub const TEMPLATES: &[(&str, &str)] = &[
    (
        "prelude.cuh.tera",
        include_str!("../templates/prelude.cuh.tera"),
    ),
    ("gemm.cuh.tera", include_str!("../templates/gemm.cuh.tera")),
    (
        "gemm_skinny.cuh.tera",
        include_str!("../templates/gemm_skinny.cuh.tera"),
    ),
    (
        "activation.cuh.tera",
        include_str!("../templates/activation.cuh.tera"),
    ),
    (
        "epilogue.cuh.tera",
        include_str!("../templates/epilogue.cuh.tera"),
    ),
    (
        "elementwise.cu.tera",
        include_str!("../templates/elementwise.cu.tera"),
    ),
    (
        "update.cuh.tera",
        include_str!("../templates/update.cuh.tera"),
    ),
    ("optim.cu.tera", include_str!("../templates/optim.cu.tera")),
    ("shard.cu.tera", include_str!("../templates/shard.cu.tera")),
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
    ("norm.cu.tera", include_str!("../templates/norm.cu.tera")),
    ("seq.cu.tera", include_str!("../templates/seq.cu.tera")),
    (
        "bias_grad.cu.tera",
        include_str!("../templates/bias_grad.cu.tera"),
    ),
];

/// The host header against which the CUDA emulator compiles the generated kernels unchanged with
/// a C++ compiler (CUDA's built-ins, `__shared__` per block, a block's threads as fibers).
pub const HOST_HEADER: &str = include_str!("../templates/host/cuda_host.h");
