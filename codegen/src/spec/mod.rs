//! The template and context of one kernel ([`spec`]): one exhaustive match over `Op` that hands
//! each op to the module of its family (`conv`, `dense`, `pool`, `elementwise`, `loss`, `optim`,
//! `norm`, `seq`), whose own `spec` matches the family's ops exhaustively (the pieces they share
//! are [`common`]).

pub(crate) mod cases;
pub(crate) mod common;
pub(crate) mod conv;
pub(crate) mod dense;
pub(crate) mod elementwise;
pub(crate) mod epilogue;
pub(crate) mod gemm;
pub(crate) mod loss;
pub(crate) mod norm;
pub(crate) mod optim;
pub(crate) mod pool;
pub(crate) mod seq;
pub(crate) mod shard;
pub(crate) mod skinny;

use dmc_plan::op::Op;
use dmc_plan::plan::{Kernel, Mode};

use crate::error::CodegenError;
use crate::options::CodegenOptions;
use common::{Site, Spec};

/// The template and context of one kernel. Exhaustive over [`Op`]: `None` for ops without a kernel.
pub(crate) fn spec(
    k: &Kernel,
    mode: Mode,
    ranks: usize,
    opts: &CodegenOptions,
) -> Result<Option<Spec>, CodegenError> {
    let s = &Site {
        k,
        mode,
        ranks,
        opts,
    };
    // a data-parallel step: launches and collectives (`shard`)
    if k.op.shards() > 1 || matches!(k.op, Op::Optim(dmc_plan::op::OptimOp::GradAllReduce { .. })) {
        return shard::spec(s).map(Some);
    }
    let spec = match &k.op {
        Op::Input { .. }
        | Op::Param { .. }
        | Op::OptState { .. }
        | Op::RunStat { .. }
        | Op::GradBuf { .. }
        | Op::Reshape
        // a copy between the host store and the arena: the backend's asynchronous copy
        | Op::Transfer(_) => return Ok(None),
        Op::Conv(op) => conv::spec(s, op)?,
        Op::Dense(op) => dense::spec(s, op)?,
        Op::Pool(op) => pool::spec(s, op)?,
        Op::Elementwise(op) => elementwise::spec(s, op)?,
        Op::Loss(op) => loss::spec(s, op)?,
        Op::Optim(op) => optim::spec(s, op)?,
        Op::Norm(op) => norm::spec(s, op)?,
        Op::Seq(op) => seq::spec(s, op)?,
    };
    Ok(Some(spec))
}
