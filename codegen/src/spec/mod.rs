//! The template and context of one kernel ([`spec`]): one exhaustive match over `Op` that hands
//! each op to the module of its family (the pieces those share are [`common`]).

pub(crate) mod common;
pub(crate) mod conv;
pub(crate) mod dense;
pub(crate) mod elementwise;
pub(crate) mod gemm;
pub(crate) mod loss;
pub(crate) mod pool;
pub(crate) mod update;

use dmc_plan::op::Op;
use dmc_plan::plan::{Kernel, Mode};

use crate::error::CodegenError;
use crate::options::CodegenOptions;
use common::{Site, Spec};

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
