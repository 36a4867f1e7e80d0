//! How to render: the caller's choices (nothing is read from the environment).

use crate::spec::gemm::GemmTile;

/// How to render a plan's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodegenOptions {
    /// Split the reduction of a GEMM with too few output tiles for the GPU (into the planned
    /// workspace, `dmc_plan::op::split`). Off renders every GEMM unsplit (`dmc run --no-split-k`).
    pub split_k: bool,
    /// Render every GEMM as the baseline kernel the logged H200 times measured: the
    /// [`DEFAULT_TILE`](crate::DEFAULT_TILE), unsplit, unpipelined (`--baseline-gemm`, the
    /// reference of a GEMM speed comparison and of the model's calibration).
    pub baseline_gemm: bool,
    /// Every GEMM with this tile instead of the one the model chooses (tests cover each tile).
    pub tile: Option<GemmTile>,
    /// The GPU (a name of `perf::GPUS`) the model chooses tiles and splits for.
    pub gpu: &'static str,
    /// Stage GEMM tiles through shared memory with cp.async where the GPU has it (sm_80+) and the
    /// tile's stages fit; off, every GEMM stages its next tile in registers (`--no-cp-async`).
    pub copy_async: bool,
    /// GEMMs on TF32 tensor cores (sm_80+; `precision: tf32`, `--precision tf32`): inputs rounded
    /// to 10 mantissa bits, fp32 accumulation. Off (the default): fp32 FMAs, PyTorch's fp32 parity.
    pub tf32: bool,
    /// The skinny GEMM kernels (`spec::skinny`: a few rows, or a short reduction) where the model
    /// ranks one first; off, every GEMM is tiled (`--no-skinny`, the comparison's baseline).
    pub skinny: bool,
    /// Every GEMM a skinny kernel can compute takes the model's fastest skinny candidate, faster
    /// than the tiles or not (tests cover the skinny kernels on every GEMM that allows one).
    pub force_skinny: bool,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        CodegenOptions {
            split_k: true,
            baseline_gemm: false,
            tile: None,
            gpu: "H200",
            copy_async: true,
            tf32: false,
            skinny: true,
            force_skinny: false,
        }
    }
}
