//! The template and context of one kernel ([`spec`]): one exhaustive match over `Op` that hands
//! each op to the module of its family, and the pieces those share (the launch of a
//! one-thread-per-element kernel, shape checks, C literals).

pub(crate) mod conv;
pub(crate) mod dense;
pub(crate) mod elementwise;
pub(crate) mod gemm;
pub(crate) mod loss;
pub(crate) mod pool;
pub(crate) mod update;

use tera::Context;

use dmc_plan::op::Op;
use dmc_plan::plan::{Kernel, Mode};

use crate::{CodegenError, CodegenOptions};

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
}

/// One kernel being rendered, as the family modules read it.
pub(crate) struct Site<'a> {
    pub k: &'a Kernel,
    pub mode: Mode,
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

/// The template and context of one kernel. Exhaustive over [`Op`]: `None` for ops without a kernel.
pub(crate) fn spec(
    k: &Kernel,
    mode: Mode,
    opts: &CodegenOptions,
) -> Result<Option<Spec>, CodegenError> {
    let s = &Site { k, mode, opts };
    let spec = match &k.op {
        Op::Input { .. } | Op::Param { .. } | Op::OptState { .. } | Op::Reshape => return Ok(None),
        Op::Conv2d { geom, bias } => conv::forward(s, geom, *bias)?,
        Op::Conv2dBwdData { geom } => conv::backward_data(s, geom)?,
        Op::Conv2dBwdWeight { geom } => conv::backward_weight(s, geom, None)?,
        Op::Conv2dBwdWeightUpdate { geom, rule, .. } => conv::backward_weight(s, geom, Some(rule))?,
        Op::Dense { bias } => dense::forward(s, *bias)?,
        Op::DenseBwdData => dense::backward_data(s)?,
        Op::DenseBwdWeight => dense::backward_weight(s, None)?,
        Op::DenseBwdWeightUpdate { rule, .. } => dense::backward_weight(s, Some(rule))?,
        Op::MaxPool { geom } | Op::AvgPool { geom } => pool::forward(s, geom)?,
        Op::MaxPoolBwd { geom } => pool::backward(s, geom, 2)?,
        Op::AvgPoolBwd { geom } => pool::backward(s, geom, 1)?,
        Op::GlobalAvgPool => pool::global(s)?,
        Op::GlobalAvgPoolBwd => elementwise::global_avgpool_bwd(s)?,
        Op::Unary(kind) => elementwise::unary(s, *kind)?,
        Op::UnaryBwd(kind) => elementwise::unary_bwd(s, *kind)?,
        Op::UnaryInPlace(kind) => elementwise::unary_inplace(s, *kind)?,
        Op::UnaryBwdInPlace(kind) => elementwise::unary_bwd_inplace(s, *kind)?,
        Op::Add | Op::MseLossBwd => elementwise::binary(s)?,
        Op::AddInPlace => elementwise::add_inplace(s)?,
        Op::Dropout { p, salt } => elementwise::dropout(s, ("x", "y"), *p, *salt)?,
        Op::DropoutBwd { p, salt } => elementwise::dropout(s, ("dy", "dx"), *p, *salt)?,
        Op::DropoutInPlace { p, salt } => elementwise::dropout(s, ("x", "x"), *p, *salt)?,
        Op::DropoutBwdInPlace { p, salt } => elementwise::dropout(s, ("dy", "dy"), *p, *salt)?,
        Op::MseLoss => loss::mse(s)?,
        Op::CrossEntropyLoss => loss::cross_entropy(s)?,
        Op::CrossEntropyLossBwd => loss::cross_entropy_bwd(s)?,
        Op::BiasGrad => update::bias_grad(s, None)?,
        Op::BiasGradUpdate { rule } => update::bias_grad(s, Some(rule))?,
        Op::Update { rule } => update::update(s, rule)?,
    };
    Ok(Some(spec))
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
    }
}
