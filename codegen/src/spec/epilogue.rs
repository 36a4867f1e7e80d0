//! The context of `epilogue.cuh.tera`: a GEMM's fused epilogue ([`Epilogue`]) as the `EPI(v, i)`
//! macro its `STORE` applies, and the activation (or its backward) as a device function rendered
//! from the activation's own C statements ([`UnaryKind::cuda_forward`] /
//! [`UnaryKind::cuda_backward`]), so the fused kernels compute the unfused kernels' formulas in the
//! same order.

use tera::Context;

use dmc_plan::op::{Epilogue, EpilogueSide};
use dmc_plan::unary::UnaryKind;

/// The statements of an activation over the one-element local arrays `in_`, `out_` (and `saved_`
/// for a backward), as the body of a device function.
fn scalar_body(statements: &str) -> String {
    statements
        .lines()
        .map(|l| {
            let l = l
                .replace("{in}", "in_")
                .replace("{out}", "out_")
                .replace("{saved}", "saved_");
            format!("    {l}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Inserts the activation device functions `dmc_act(x)` (forward) and `dmc_act_bwd(saved, g)`
/// (backward) for `k` (either may be unused by a kernel).
pub(crate) fn act_ctx(ctx: &mut Context, k: UnaryKind) {
    ctx.insert("act_name", k.name());
    ctx.insert("act_fwd_body", &scalar_body(&k.cuda_forward()));
    ctx.insert("act_bwd_body", &scalar_body(&k.cuda_backward()));
}

/// Inserts the epilogue of a GEMM kernel: `fused_epi` (whether there is one: the templates of
/// unfused kernels are unchanged), `epi_side` (`forward` / `data_gradient`), `epi_add`,
/// `epi_act`, `epi_desc` and, with an activation, its device functions.
pub(crate) fn epilogue_ctx(ctx: &mut Context, epi: &Epilogue, side: EpilogueSide) {
    ctx.insert("fused_epi", &!epi.is_none());
    ctx.insert(
        "epi_side",
        match side {
            EpilogueSide::Forward => "forward",
            EpilogueSide::DataGradient => "data_gradient",
        },
    );
    ctx.insert("epi_add", &epi.add);
    ctx.insert("epi_act", &epi.act.is_some());
    ctx.insert("epi_desc", &epi.describe(side));
    if let Some(k) = epi.act {
        act_ctx(ctx, k);
    }
}
