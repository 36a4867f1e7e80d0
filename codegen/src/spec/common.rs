//! What the op families' kernels share: the [`Spec`] each one returns, the [`Site`] it reads (the
//! kernel, its shapes, the plan's mode, the options), the launch of a one-thread-per-element kernel
//! or of a one-block reduction, shape checks and C literals.

use tera::Context;

use dmc_plan::plan::{Kernel, Mode};

use crate::error::CodegenError;
use crate::options::CodegenOptions;
use crate::spec::gemm::GemmGeom;

/// Threads per block of the one-thread-per-element kernels.
pub const ELEM_THREADS: u32 = 256;
/// Threads of the single-block reductions (losses).
pub const REDUCE_THREADS: u32 = 256;

/// The kernel's template and its context, without the common entries.
pub(crate) struct Spec {
    pub template: &'static str,
    pub ctx: Context,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Split-K: the number of k ranges (grid z) when > 1; a `_reduce` entry follows, one thread
    /// per GEMM output.
    pub split: usize,
    pub outputs: usize,
    /// The GEMM a GEMM-shaped kernel computes (the performance model's input); `None` otherwise.
    pub gemm: Option<GemmGeom>,
    /// Further entries launched in order after the first (`CudaKernel::after`): a multi-pass
    /// kernel's later passes.
    pub passes: Vec<Pass>,
    /// A sharded kernel's step ([`crate::CudaKernel::program`]), its launches' entries named by
    /// their suffix (`<entry>_<suffix>`); empty for every other kernel.
    pub program: Vec<crate::kernel::Phase>,
    /// The kernel takes this process' rank (and a launch's first column): its parameters are
    /// [`crate::kernel::sharded_kernel_params`]'s.
    pub ranked: bool,
}

/// A later entry of a multi-pass kernel: the entry point `<entry>_<suffix>` and its launch.
pub(crate) struct Pass {
    pub suffix: &'static str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

/// One kernel being rendered, as the family modules read it.
pub(crate) struct Site<'a> {
    pub k: &'a Kernel,
    pub mode: Mode,
    /// The plan's data-parallel ranks (1 alone).
    pub ranks: usize,
    pub opts: &'a CodegenOptions,
}

impl Site<'_> {
    pub fn name(&self) -> &str {
        &self.k.name
    }

    /// The op's kernel name (`Op::kind_name`), which the templates switch on.
    pub fn kind(&self) -> &'static str {
        self.k.op.kind_name()
    }

    /// The shape of signature argument `i`.
    pub fn shape(&self, i: usize) -> Result<&[usize], CodegenError> {
        self.k
            .arg_shapes
            .get(i)
            .map(|v| v.as_slice())
            .ok_or_else(|| CodegenError::Shape {
                kernel: self.name().into(),
                message: format!("missing the shape of argument {i}"),
            })
    }

    /// The shape of the last signature argument.
    pub fn last_shape(&self) -> Result<&[usize], CodegenError> {
        self.shape(self.k.arg_shapes.len().saturating_sub(1))
    }

    /// Fails unless `s` (the shape of `what`) has rank `r`.
    pub fn rank(&self, s: &[usize], r: usize, what: &str) -> Result<(), CodegenError> {
        if s.len() != r {
            return Err(CodegenError::Shape {
                kernel: self.name().into(),
                message: format!("{what} has shape {s:?}, expected rank {r}"),
            });
        }
        Ok(())
    }
}

pub(crate) fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// A C float literal that reads back as exactly `v`.
pub fn f32_lit(v: f32) -> String {
    if v.is_nan() {
        "__int_as_float(0x7fc00000)".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "__int_as_float(0x7f800000)"
        } else {
            "(-__int_as_float(0x7f800000))"
        }
        .into()
    } else {
        let s = format!("{v:?}");
        if s.contains(['.', 'e', 'E']) {
            format!("{s}f")
        } else {
            format!("{s}.0f")
        }
    }
}

/// Blocks of `per` threads covering `n` elements (at least one), as a grid dimension.
pub(crate) fn blocks(n: usize, per: u32, kernel: &str) -> Result<u32, CodegenError> {
    let b = n.div_ceil(per as usize).max(1);
    u32::try_from(b)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| CodegenError::Grid {
            kernel: kernel.into(),
            message: format!("{n} elements"),
        })
}

/// A one-thread-per-element kernel over `n` elements from `template`.
pub(crate) fn per_element(
    s: &Site,
    template: &'static str,
    n: usize,
) -> Result<Spec, CodegenError> {
    let mut ctx = Context::new();
    ctx.insert("kind", s.kind());
    ctx.insert("n", &n);
    ctx.insert("threads", &ELEM_THREADS);
    ctx.insert("fused_update", &false);
    Ok(Spec {
        template,
        ctx,
        grid: [blocks(n, ELEM_THREADS, s.name())?, 1, 1],
        block: [ELEM_THREADS, 1, 1],
        split: 1,
        outputs: 0,
        gemm: None,
        passes: Vec::new(),
        program: Vec::new(),
        ranked: false,
    })
}

/// A single-block reduction from `template`.
pub(crate) fn reduction(s: &Site, template: &'static str) -> Spec {
    let mut ctx = Context::new();
    ctx.insert("kind", s.kind());
    ctx.insert("threads", &REDUCE_THREADS);
    Spec {
        template,
        ctx,
        grid: [1, 1, 1],
        block: [REDUCE_THREADS, 1, 1],
        split: 1,
        outputs: 0,
        gemm: None,
        passes: Vec::new(),
        program: Vec::new(),
        ranked: false,
    }
}
