//! Normalisation (`norm.cu.tera`): batchnorm's forward, its running statistics' update and its
//! backward (one thread per channel, the rows in order), and its inference form (one thread per
//! element); layernorm's forward (one thread per row) and backward (one thread per row for dx,
//! one per channel for dgamma and dbeta, in one launch of max(rows, channels) threads).

use super::common::{blocks, f32_lit, numel, per_element, Site, Spec, ELEM_THREADS};
use crate::error::CodegenError;
use crate::kernel::{Collective, Launch, Phase, Region};
use dmc_plan::op::NormOp;

const TEMPLATE: &str = "norm.cu.tera";

/// `[rows, c]` of the value `[.., c]` in argument `i`, checked.
fn rows_c(s: &Site, i: usize) -> Result<(usize, usize), CodegenError> {
    let x = s.shape(i)?;
    let c = x.last().copied().unwrap_or(0);
    if x.len() < 2 || c == 0 {
        return Err(CodegenError::Shape {
            kernel: s.name().into(),
            message: format!("argument {i} has shape {x:?}, expected [.., channels]"),
        });
    }
    Ok((numel(x) / c, c))
}

/// The kernel of one op of the normalisation family.
pub(crate) fn spec(s: &Site, op: &NormOp) -> Result<Spec, CodegenError> {
    let mut sp = match op {
        NormOp::BatchNormInfer { .. } => {
            let (rows, c) = rows_c(s, 0)?;
            let mut sp = per_element(s, TEMPLATE, rows * c)?;
            sp.ctx.insert("rows", &rows);
            sp.ctx.insert("c", &c);
            sp
        }
        NormOp::BatchNormStats { count, .. } => {
            let c = numel(s.shape(0)?);
            let mut sp = per_element(s, TEMPLATE, c)?;
            sp.ctx.insert("rows", count);
            sp.ctx.insert("c", &c);
            sp
        }
        NormOp::BatchNorm { ranks, .. } | NormOp::BatchNormBwd { ranks, .. } => {
            let (rows, c) = rows_c(s, 0)?;
            let mut sp = per_element(s, TEMPLATE, c)?;
            sp.ctx.insert("rows", &rows);
            sp.ctx.insert("c", &c);
            sp.ctx.insert("dp", &(*ranks > 1));
            if *ranks > 1 {
                sp.ctx.insert("rows_all", &(rows * ranks));
                sp.program = ranked_program(s, op, c)?;
            }
            sp
        }
        NormOp::LayerNorm { .. } => {
            let (rows, c) = rows_c(s, 0)?;
            let mut sp = per_element(s, TEMPLATE, rows)?;
            sp.ctx.insert("rows", &rows);
            sp.ctx.insert("c", &c);
            sp
        }
        NormOp::LayerNormBwd => {
            let (rows, c) = rows_c(s, 0)?;
            let mut sp = per_element(s, TEMPLATE, rows.max(c))?;
            sp.ctx.insert("rows", &rows);
            sp.ctx.insert("c", &c);
            sp
        }
    };
    match op {
        NormOp::BatchNorm { eps, .. }
        | NormOp::BatchNormInfer { eps }
        | NormOp::LayerNorm { eps } => {
            sp.ctx.insert("eps", &f32_lit(eps.0));
        }
        NormOp::BatchNormBwd { eps, in_place, .. } => {
            sp.ctx.insert("eps", &f32_lit(eps.0));
            sp.ctx.insert("dx", if *in_place { "dy" } else { "dx" });
        }
        NormOp::BatchNormStats { momentum, count } => {
            sp.ctx.insert("momentum", &f32_lit(momentum.0));
            sp.ctx.insert("count", count);
            // the unbiased variance's factor, exactly as the CPU backend computes it
            let unbias = if *count > 1 {
                *count as f64 / (*count - 1) as f64
            } else {
                1.0
            };
            sp.ctx.insert("unbias", &format!("{unbias:?}"));
        }
        NormOp::LayerNormBwd => {}
    }
    Ok(sp)
}

/// A data-parallel batchnorm's program (`ranks` > 1): its per-channel sums (f64, into the
/// workspace `sums`, the op's last slot) summed over the ranks between the launches, as the CPU
/// backend sums them (`runtime/src/cpu/norm.rs`): the forward's sum of x, then its squared
/// deviations from the whole batch's mean, then y; the backward's sums of dy and dy xh, then dx
/// (dgamma and dbeta stay this rank's: the update sums them).
fn ranked_program(s: &Site, op: &NormOp, c: usize) -> Result<Vec<Phase>, CodegenError> {
    let ws = s.k.op.signature().params.len() - 1;
    let at = |doubles: usize| Region {
        slot: ws,
        at: 2 * doubles,
    };
    let launch = |suffix: &str| -> Result<Phase, CodegenError> {
        Ok(Phase::Launch(Launch {
            entry: suffix.into(),
            grid: [blocks(c, ELEM_THREADS, s.name())?, 1, 1],
            block: [ELEM_THREADS, 1, 1],
            col0: 0,
        }))
    };
    let sum =
        |from: usize, n: usize| Phase::Collective(Collective::AllReduceF64 { buf: at(from), n });
    Ok(match op {
        NormOp::BatchNorm { .. } => vec![
            launch("sum")?,
            sum(0, c),
            launch("sq")?,
            sum(c, c),
            launch("apply")?,
        ],
        _ => vec![launch("sums")?, sum(0, 2 * c), launch("dx")?],
    })
}

/// The zoo's normalisation ops: batchnorm over an image and over flat features, its inference
/// form, the running statistics' update, the backward out of place and in place; layernorm over
/// an image's channels and over flat features (more features than rows, and more rows than
/// features, for the backward's two thread roles).
pub(crate) fn zoo() -> Vec<super::cases::Case> {
    use dmc_plan::op::Op;
    use dmc_plan::unary::Coef;
    let n = |op: NormOp| Op::Norm(op);
    let eps = Coef(1e-5);
    let (img, c) = (vec![3, 5, 4, 7], vec![7]);
    vec![
        (
            n(NormOp::BatchNorm { eps, ranks: 1 }),
            vec![
                img.clone(),
                c.clone(),
                c.clone(),
                img.clone(),
                c.clone(),
                c.clone(),
            ],
        ),
        (
            n(NormOp::BatchNorm {
                eps: Coef(1e-3),
                ranks: 1,
            }),
            vec![
                vec![6, 11],
                vec![11],
                vec![11],
                vec![6, 11],
                vec![11],
                vec![11],
            ],
        ),
        (
            n(NormOp::BatchNormInfer { eps }),
            vec![
                img.clone(),
                c.clone(),
                c.clone(),
                c.clone(),
                c.clone(),
                img.clone(),
            ],
        ),
        (
            n(NormOp::BatchNormStats {
                momentum: Coef(0.1),
                count: 60,
            }),
            vec![c.clone(); 4],
        ),
        (
            n(NormOp::BatchNormBwd {
                eps,
                in_place: false,
                ranks: 1,
            }),
            vec![
                img.clone(),
                img.clone(),
                c.clone(),
                c.clone(),
                c.clone(),
                img.clone(),
                c.clone(),
                c.clone(),
            ],
        ),
        (
            n(NormOp::LayerNorm { eps }),
            vec![
                img.clone(),
                c.clone(),
                c.clone(),
                img.clone(),
                vec![3, 5, 4],
                vec![3, 5, 4],
            ],
        ),
        (
            n(NormOp::LayerNorm { eps: Coef(1e-3) }),
            vec![
                vec![3, 37],
                vec![37],
                vec![37],
                vec![3, 37],
                vec![3],
                vec![3],
            ],
        ),
        (
            n(NormOp::LayerNormBwd),
            vec![
                img.clone(),
                img.clone(),
                vec![3, 5, 4],
                vec![3, 5, 4],
                c.clone(),
                img.clone(),
                c.clone(),
                c.clone(),
            ],
        ),
        (
            n(NormOp::LayerNormBwd),
            vec![
                vec![2, 37],
                vec![2, 37],
                vec![2],
                vec![2],
                vec![37],
                vec![2, 37],
                vec![37],
                vec![37],
            ],
        ),
        (
            n(NormOp::BatchNormBwd {
                eps,
                in_place: true,
                ranks: 1,
            }),
            vec![
                img.clone(),
                img,
                c.clone(),
                c.clone(),
                c.clone(),
                c.clone(),
                c,
            ],
        ),
    ]
}
