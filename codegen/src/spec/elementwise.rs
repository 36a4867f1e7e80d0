//! Elementwise kernels (`elementwise.cu.tera`), one thread per element: the activations and their
//! gradients (their C statements are the activation's own, [`UnaryKind::cuda_forward`] /
//! [`UnaryKind::cuda_backward`]), add, multiply, concat and its slice, dropout, the softmax over the last axis (one thread per row), the MSE gradient, the global average pooling
//! gradient. In-place ops render the out-of-place formulas with the written input as the output.

use dmc_plan::op::{Op, Role};
use dmc_plan::plan::Mode;
use dmc_plan::unary::UnaryKind;

use super::common::{f32_lit, numel, per_element, Site, Spec};
use crate::error::CodegenError;
use dmc_plan::op::ElementwiseOp;

const TEMPLATE: &str = "elementwise.cu.tera";

/// An activation's C statements (`cuda_forward` / `cuda_backward`) for the arrays `inp`, `out`
/// and `saved`, indented as the template's body.
fn body(statements: &str, inp: &str, out: &str, saved: &str) -> String {
    statements
        .lines()
        .map(|l| {
            let l = l
                .replace("{in}", inp)
                .replace("{out}", out)
                .replace("{saved}", saved);
            format!("    {l}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Index and name of the first `InOut` slot of `op`'s signature (the buffer an in-place op writes).
fn inout_slot(op: &Op) -> (usize, String) {
    op.signature()
        .params
        .into_iter()
        .enumerate()
        .find(|(_, p)| p.role == Role::InOut)
        .map(|(i, p)| (i, p.name))
        .unwrap_or_default()
}

/// An out-of-place kernel reading `inp`, writing `out` (the last argument).
fn out_of_place(s: &Site, inp: &str, out: &str) -> Result<Spec, CodegenError> {
    let mut sp = per_element(s, TEMPLATE, numel(s.last_shape()?))?;
    sp.ctx.insert("inp", inp);
    sp.ctx.insert("out", out);
    Ok(sp)
}

/// An in-place kernel: the written input is both `inp` and `out`. Also returns its name.
fn in_place(s: &Site) -> Result<(Spec, String), CodegenError> {
    let (slot, io) = inout_slot(&s.k.op);
    let mut sp = per_element(s, TEMPLATE, numel(s.shape(slot)?))?;
    sp.ctx.insert("inp", &io);
    sp.ctx.insert("out", &io);
    Ok((sp, io))
}

/// `Unary`: x -> y.
pub(crate) fn unary(s: &Site, kind: UnaryKind) -> Result<Spec, CodegenError> {
    let mut sp = out_of_place(s, "x", "y")?;
    sp.ctx
        .insert("body", &body(&kind.cuda_forward(), "x", "y", ""));
    Ok(sp)
}

/// `UnaryBwd`: saved, dy -> dx.
pub(crate) fn unary_bwd(s: &Site, kind: UnaryKind) -> Result<Spec, CodegenError> {
    let mut sp = out_of_place(s, "dy", "dx")?;
    let saved = kind.saved().param_name();
    sp.ctx
        .insert("body", &body(&kind.cuda_backward(), "dy", "dx", saved));
    Ok(sp)
}

/// `UnaryInPlace`: x -> x.
pub(crate) fn unary_inplace(s: &Site, kind: UnaryKind) -> Result<Spec, CodegenError> {
    let (mut sp, io) = in_place(s)?;
    sp.ctx
        .insert("body", &body(&kind.cuda_forward(), &io, &io, ""));
    Ok(sp)
}

/// `UnaryBwdInPlace`: saved, dy -> dy.
pub(crate) fn unary_bwd_inplace(s: &Site, kind: UnaryKind) -> Result<Spec, CodegenError> {
    let (mut sp, io) = in_place(s)?;
    let saved = kind.saved().param_name();
    sp.ctx
        .insert("body", &body(&kind.cuda_backward(), &io, &io, saved));
    Ok(sp)
}

/// `Add` (a, b -> y) and `MseLossBwd` (pred, target -> dpred), whose bodies are the template's.
pub(crate) fn binary(s: &Site) -> Result<Spec, CodegenError> {
    out_of_place(s, "x", "y")
}

/// `AddInPlace`: a, b -> a.
pub(crate) fn add_inplace(s: &Site) -> Result<Spec, CodegenError> {
    in_place(s).map(|(sp, _)| sp)
}

/// The four dropout ops: `inp` -> `out` (the same array in place), the identity in `Eval`.
pub(crate) fn dropout(
    s: &Site,
    (inp, out): (&str, &str),
    p: f32,
    salt: u64,
) -> Result<Spec, CodegenError> {
    let mut sp = per_element(s, TEMPLATE, numel(s.last_shape()?))?;
    sp.ctx.insert("inp", inp);
    sp.ctx.insert("out", out);
    sp.ctx.insert("p", &f32_lit(p));
    sp.ctx.insert("salt", &salt);
    sp.ctx.insert("eval", &(s.mode == Mode::Eval));
    // data parallel: the masks are keyed by the element's place in the global batch
    sp.ranked = s.ranks > 1 && s.mode != Mode::Eval;
    sp.ctx.insert("ranked", &sp.ranked);
    Ok(sp)
}

/// `GlobalAvgPoolBwd`: dy[N,C] -> dx[N,H,W,C].
pub(crate) fn global_avgpool_bwd(s: &Site) -> Result<Spec, CodegenError> {
    let dx = s.shape(1)?;
    s.rank(dx, 4, "dx")?;
    let mut sp = per_element(s, TEMPLATE, numel(dx))?;
    sp.ctx.insert("c", &dx[3]);
    sp.ctx.insert("hw", &(dx[1] * dx[2]));
    Ok(sp)
}

/// `GlobalAvgPoolBwdAct` (dy[N,C], saved -> dx) and its in-place form (dy, saved -> saved): the
/// activation's backward of the broadcast gradient, one thread per element of saved.
pub(crate) fn global_avgpool_bwd_act(
    s: &Site,
    k: UnaryKind,
    in_place: bool,
) -> Result<Spec, CodegenError> {
    let saved = s.shape(1)?;
    s.rank(saved, 4, "saved")?;
    let mut sp = per_element(s, TEMPLATE, numel(saved))?;
    sp.ctx.insert("c", &saved[3]);
    sp.ctx.insert("hw", &(saved[1] * saved[2]));
    sp.ctx.insert("out", if in_place { "saved" } else { "dx" });
    super::epilogue::act_ctx(&mut sp.ctx, k);
    Ok(sp)
}

/// `Softmax` (x -> y) and `SoftmaxBwd` (y, dy -> dx) over the last axis: one thread per row.
pub(crate) fn softmax(s: &Site) -> Result<Spec, CodegenError> {
    let y = s.last_shape()?;
    let cols = y.last().copied().unwrap_or(1).max(1);
    let mut sp = per_element(s, TEMPLATE, numel(y) / cols)?;
    sp.ctx.insert("cols", &cols);
    Ok(sp)
}

/// `Concat`: a[.., ca], b[.., cb] -> y[.., ca + cb], one thread per element of y.
pub(crate) fn concat(s: &Site) -> Result<Spec, CodegenError> {
    let last = |i: usize| -> Result<usize, CodegenError> {
        Ok(s.shape(i)?.last().copied().unwrap_or(1).max(1))
    };
    let (ca, cb) = (last(0)?, last(1)?);
    let mut sp = per_element(s, TEMPLATE, numel(s.last_shape()?))?;
    sp.ctx.insert("ca", &ca);
    sp.ctx.insert("cb", &cb);
    Ok(sp)
}

/// `SliceLast`: dy[.., c] -> dx[.., len] from `start`, one thread per element of dx.
pub(crate) fn slice_last(s: &Site, start: usize, len: usize) -> Result<Spec, CodegenError> {
    let c = s.shape(0)?.last().copied().unwrap_or(1).max(1);
    let mut sp = per_element(s, TEMPLATE, numel(s.last_shape()?))?;
    sp.ctx.insert("c", &c);
    sp.ctx.insert("start", &start);
    sp.ctx.insert("len", &len.max(1));
    Ok(sp)
}

/// The kernel of one op of the elementwise family.
pub(crate) fn spec(s: &Site, op: &ElementwiseOp) -> Result<Spec, CodegenError> {
    match op {
        ElementwiseOp::Unary(kind) => unary(s, *kind),
        ElementwiseOp::UnaryBwd(kind) => unary_bwd(s, *kind),
        ElementwiseOp::UnaryInPlace(kind) => unary_inplace(s, *kind),
        ElementwiseOp::UnaryBwdInPlace(kind) => unary_bwd_inplace(s, *kind),
        ElementwiseOp::Add | ElementwiseOp::Mul => binary(s),
        ElementwiseOp::Concat => concat(s),
        ElementwiseOp::SliceLast { start, len } => slice_last(s, *start, *len),
        ElementwiseOp::AddInPlace => add_inplace(s),
        ElementwiseOp::Dropout { p, salt } => dropout(s, ("x", "y"), *p, *salt),
        ElementwiseOp::DropoutBwd { p, salt } => dropout(s, ("dy", "dx"), *p, *salt),
        ElementwiseOp::DropoutInPlace { p, salt } => dropout(s, ("x", "x"), *p, *salt),
        ElementwiseOp::DropoutBwdInPlace { p, salt } => dropout(s, ("dy", "dy"), *p, *salt),
        ElementwiseOp::Softmax | ElementwiseOp::SoftmaxBwd => softmax(s),
    }
}

/// The zoo's elementwise ops: every activation forward and backward, out of place and in place,
/// the sums and dropout (odd sizes: partly filled blocks).
pub(crate) fn zoo() -> Vec<super::cases::Case> {
    let e = vec![3, 17];
    let n = vec![1000];
    let w = |op: ElementwiseOp| Op::Elementwise(op);
    let mut v = vec![
        (w(ElementwiseOp::Add), vec![n.clone(), n.clone(), n.clone()]),
        (w(ElementwiseOp::Mul), vec![n.clone(), n.clone(), n.clone()]),
        // odd channel counts: rows of 3 + 5 (a 4-d image) and 7 + 1
        (
            w(ElementwiseOp::Concat),
            vec![vec![2, 3, 5, 3], vec![2, 3, 5, 5], vec![2, 3, 5, 8]],
        ),
        (
            w(ElementwiseOp::Concat),
            vec![vec![9, 7], vec![9, 1], vec![9, 8]],
        ),
        (
            w(ElementwiseOp::SliceLast { start: 3, len: 5 }),
            vec![vec![2, 3, 5, 8], vec![2, 3, 5, 5]],
        ),
        (
            w(ElementwiseOp::SliceLast { start: 0, len: 3 }),
            vec![vec![2, 3, 5, 8], vec![2, 3, 5, 3]],
        ),
        (
            w(ElementwiseOp::Dropout { p: 0.3, salt: 7 }),
            vec![n.clone(), n.clone()],
        ),
        (
            w(ElementwiseOp::DropoutBwd { p: 0.3, salt: 7 }),
            vec![n.clone(), n.clone()],
        ),
    ];
    for kind in UnaryKind::ALL {
        v.push((w(ElementwiseOp::Unary(kind)), vec![e.clone(), e.clone()]));
        v.push((
            w(ElementwiseOp::UnaryBwd(kind)),
            vec![e.clone(), e.clone(), e.clone()],
        ));
    }
    for kind in UnaryKind::ALL {
        v.push((w(ElementwiseOp::UnaryInPlace(kind)), vec![e.clone()]));
        v.push((
            w(ElementwiseOp::UnaryBwdInPlace(kind)),
            vec![e.clone(), e.clone()],
        ));
    }
    // rows of 7 (odd), and one row of 1000 on a [2, 1000] tensor
    let rows = vec![5, 3, 7];
    v.push((w(ElementwiseOp::Softmax), vec![rows.clone(), rows.clone()]));
    v.push((
        w(ElementwiseOp::SoftmaxBwd),
        vec![rows.clone(), rows.clone(), rows],
    ));
    let wide = vec![2, 1000];
    v.push((w(ElementwiseOp::Softmax), vec![wide.clone(), wide.clone()]));
    v.push((w(ElementwiseOp::AddInPlace), vec![n.clone(), n.clone()]));
    v.push((
        w(ElementwiseOp::DropoutInPlace { p: 0.3, salt: 7 }),
        vec![n.clone()],
    ));
    v.push((
        w(ElementwiseOp::DropoutBwdInPlace { p: 0.3, salt: 7 }),
        vec![n],
    ));
    v
}
