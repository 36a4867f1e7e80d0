//! Dense layers: the forward (bias fused), the data gradient and the weight gradient (alone or
//! fused with the optimizer update), all from `matmul.cu.tera`.

use tera::Context;

use dmc_plan::update::UpdateRule;

use super::common::{numel, Site, Spec};
use super::epilogue::epilogue_ctx;
use super::gemm::{gemm, GemmNeeds};
use super::optim::{bias_ctx, rule_ctx};
use crate::error::CodegenError;
use dmc_plan::op::{DenseOp, Epilogue, EpilogueSide};

/// The context every dense kernel shares, given the slots of its weight `[K, M]` and of its
/// `[rows, K]` input: (context, K, M, rows).
fn dense_ctx(
    s: &Site,
    w_slot: usize,
    x_slot: usize,
) -> Result<(Context, usize, usize, usize), CodegenError> {
    let w = s.shape(w_slot)?;
    s.rank(w, 2, "w")?;
    let (kin, mout) = (w[0], w[1]);
    let rows = numel(s.shape(x_slot)?) / kin.max(1);
    let mut ctx = Context::new();
    ctx.insert("kind", s.kind());
    ctx.insert("k_in", &kin);
    ctx.insert("m_out", &mout);
    ctx.insert("rows", &rows);
    ctx.insert("fused_epi", &false);
    Ok((ctx, kin, mout, rows))
}

/// A dense GEMM's needs: one group, no workspace in its signature (never split).
const DENSE: GemmNeeds = GemmNeeds {
    groups: 1,
    implicit: false,
    b_implicit: false,
    vec_a: false,
    vec_b: false,
    update: false,
    partial_elems: 0,
    k_unit: 0,
    wide_copies: false, // set by `gemm` from the layouts
    b_k_fastest: false,
};

/// `Dense`: x, w, (b), (r), y.
pub(crate) fn forward(s: &Site, bias: bool, epi: &Epilogue) -> Result<Spec, CodegenError> {
    let (mut ctx, kin, mout, rows) = dense_ctx(s, 1, 0)?;
    ctx.insert("bias", &bias);
    epilogue_ctx(&mut ctx, epi, EpilogueSide::Forward);
    gemm(
        s,
        "matmul.cu.tera",
        ctx,
        (rows, mout, kin),
        (true, false),
        (DENSE, ""),
    )
}

/// `DenseBwdData`: dy, w, (g), (saved), dx.
pub(crate) fn backward_data(s: &Site, epi: &Epilogue) -> Result<Spec, CodegenError> {
    let dxi = 2 + epi.num_inputs(EpilogueSide::DataGradient);
    let (mut ctx, kin, mout, rows) = dense_ctx(s, 1, dxi)?;
    epilogue_ctx(&mut ctx, epi, EpilogueSide::DataGradient);
    gemm(
        s,
        "matmul.cu.tera",
        ctx,
        (rows, kin, mout),
        (true, true),
        (DENSE, ""),
    )
}

/// `DenseBwdWeight` (`rule` none) or `DenseBwdWeightUpdate` (the workspace stays unused): x, dy,
/// then dw (or the updated w); with `bias`, the fused kernel also sums dy's columns and updates the
/// bias.
pub(crate) fn backward_weight(
    s: &Site,
    rule: Option<&UpdateRule>,
    bias: bool,
) -> Result<Spec, CodegenError> {
    let (ctx, kin, mout, rows) = dense_ctx(s, 2, 0)?;
    let mut sp = gemm(
        s,
        "matmul.cu.tera",
        ctx,
        (kin, mout, rows),
        (false, false),
        (
            GemmNeeds {
                update: rule.is_some(),
                ..DENSE
            },
            "",
        ),
    )?;
    if let Some(rule) = rule {
        rule_ctx(&mut sp.ctx, rule, "w", true);
        if bias {
            bias_ctx(&mut sp.ctx, rule);
        }
    }
    Ok(sp)
}

/// The kernel of one op of the dense family.
pub(crate) fn spec(s: &Site, op: &DenseOp) -> Result<Spec, CodegenError> {
    match op {
        DenseOp::Dense { bias, epi } => forward(s, *bias, epi),
        DenseOp::DenseBwdData { epi } => backward_data(s, epi),
        DenseOp::DenseBwdWeight => backward_weight(s, None, false),
        DenseOp::DenseBwdWeightUpdate { rule, bias, .. } => backward_weight(s, Some(rule), *bias),
    }
}

/// The zoo's dense ops: with and without bias, both gradients, the fused update with SGD, Adam
/// (one over a long reduction: the two-level summation), RMSprop and Lion.
pub(crate) fn zoo() -> Vec<super::cases::Case> {
    use super::cases::{adam, fused, fused_bias, lion, rmsprop, sgd};
    use dmc_plan::op::{Op, UnaryKind};
    let d = |op: DenseOp| Op::Dense(op);
    let epi = |add: bool, act: UnaryKind| Epilogue {
        add,
        act: Some(act),
    };
    vec![
        (
            d(DenseOp::Dense {
                bias: true,
                epi: Epilogue::NONE,
            }),
            vec![vec![4, 6], vec![6, 3], vec![3], vec![4, 3]],
        ),
        (
            d(DenseOp::Dense {
                bias: false,
                epi: Epilogue::NONE,
            }),
            vec![vec![4, 6], vec![6, 3], vec![4, 3]],
        ),
        (
            d(DenseOp::DenseBwdData {
                epi: Epilogue::NONE,
            }),
            vec![vec![4, 3], vec![6, 3], vec![4, 6]],
        ),
        (
            d(DenseOp::DenseBwdWeight),
            vec![vec![4, 6], vec![4, 3], vec![6, 3]],
        ),
        fused(
            d(DenseOp::DenseBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                rule: sgd(0.0, false),
                chunk: 2,
                bias: false,
            }),
            vec![vec![4, 6], vec![4, 3]],
            vec![6, 3],
        ),
        fused(
            d(DenseOp::DenseBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                rule: adam(true),
                chunk: 1,
                bias: false,
            }),
            vec![vec![5000, 3], vec![5000, 2]],
            vec![3, 2],
        ),
        // a reduction over 9000 rows: the GEMM's two-level sums (partial sums of 32 k-tiles), and
        // the fused bias' 18 chunks of 512 rows summed from the GEMM's tiles
        (
            d(DenseOp::DenseBwdWeight),
            vec![vec![9000, 8], vec![9000, 16], vec![8, 16]],
        ),
        fused_bias(
            d(DenseOp::DenseBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                rule: sgd(0.9, false),
                chunk: 4,
                bias: true,
            }),
            vec![vec![9000, 8], vec![9000, 16]],
            vec![8, 16],
            vec![16],
        ),
        // `clip_value` in a fused weight update
        fused(
            d(DenseOp::DenseBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                rule: sgd(0.9, false).with_clip_value(Some(0.5)),
                chunk: 2,
                bias: false,
            }),
            vec![vec![4, 6], vec![4, 3]],
            vec![6, 3],
        ),
        // fused epilogues and the fused bias gradient (`fuse_epilogues`)
        (
            d(DenseOp::Dense {
                bias: true,
                epi: epi(true, UnaryKind::Sigmoid),
            }),
            vec![vec![4, 6], vec![6, 3], vec![3], vec![4, 3], vec![4, 3]],
        ),
        (
            d(DenseOp::Dense {
                bias: false,
                epi: epi(false, UnaryKind::Silu),
            }),
            vec![vec![4, 6], vec![6, 3], vec![4, 3]],
        ),
        (
            d(DenseOp::DenseBwdData {
                epi: epi(true, UnaryKind::Relu),
            }),
            vec![vec![4, 3], vec![6, 3], vec![4, 6], vec![4, 6], vec![4, 6]],
        ),
        fused_bias(
            d(DenseOp::DenseBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                rule: sgd(0.9, false),
                chunk: 2,
                bias: true,
            }),
            vec![vec![4, 6], vec![4, 3]],
            vec![6, 3],
            vec![3],
        ),
        fused_bias(
            d(DenseOp::DenseBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                rule: adam(false),
                chunk: 1,
                bias: true,
            }),
            vec![vec![5000, 3], vec![5000, 2]],
            vec![3, 2],
            vec![2],
        ),
        // an activation with a parameter in the epilogues, RMSprop and Lion fused with the bias
        (
            d(DenseOp::Dense {
                bias: true,
                epi: epi(
                    false,
                    UnaryKind::LeakyRelu {
                        alpha: dmc_plan::unary::Coef(0.2),
                    },
                ),
            }),
            vec![vec![4, 6], vec![6, 3], vec![3], vec![4, 3]],
        ),
        (
            d(DenseOp::DenseBwdData {
                epi: epi(
                    false,
                    UnaryKind::Elu {
                        alpha: dmc_plan::unary::Coef(0.5),
                    },
                ),
            }),
            vec![vec![4, 3], vec![6, 3], vec![4, 6], vec![4, 6]],
        ),
        fused_bias(
            d(DenseOp::DenseBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                rule: rmsprop(0.9),
                chunk: 2,
                bias: true,
            }),
            vec![vec![4, 6], vec![4, 3]],
            vec![6, 3],
            vec![3],
        ),
        fused_bias(
            d(DenseOp::DenseBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                rule: lion(),
                chunk: 1,
                bias: true,
            }),
            vec![vec![4, 6], vec![4, 3]],
            vec![6, 3],
            vec![3],
        ),
    ]
}
