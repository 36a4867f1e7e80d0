//! How to render: the caller's choices (nothing is read from the environment).

/// How to render a plan's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodegenOptions {
    /// Split the reduction of a GEMM with too few output tiles for the GPU ([`split_k`](crate::split_k)).
    /// Off renders every GEMM unsplit: the baseline of a split-K speed comparison on a GPU
    /// (`dmc run --no-split-k`, timed by `scripts/gpu-check.sh`).
    pub split_k: bool,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        CodegenOptions { split_k: true }
    }
}
