//! Pooling: max and average pooling and their gradients, global average pooling, nearest
//! upsampling and its gradient (`pool.cu.tera`).

use dmc_plan::op::PoolGeom;

use super::common::{numel, per_element, Site, Spec, ELEM_THREADS};
use crate::error::CodegenError;
use dmc_plan::op::PoolOp;

/// A pooling kernel over the `x` / `y` shapes of its window geometry, one thread per element of
/// `threads_over`.
fn pool(
    s: &Site,
    g: &PoolGeom,
    x: &[usize],
    y: &[usize],
    threads_over: usize,
) -> Result<Spec, CodegenError> {
    let mut sp = per_element(s, "pool.cu.tera", threads_over)?;
    sp.ctx.insert("nb", &x[0]);
    sp.ctx.insert("h", &x[1]);
    sp.ctx.insert("w", &x[2]);
    sp.ctx.insert("c", &x[3]);
    sp.ctx.insert("ho", &y[1]);
    sp.ctx.insert("wo", &y[2]);
    sp.ctx.insert("kh", &g.kh);
    sp.ctx.insert("kw", &g.kw);
    let big = [numel(x), numel(y)].iter().any(|&v| v >= (1usize << 31));
    sp.ctx.insert("idx", if big { "u64" } else { "unsigned" });
    sp.ctx.insert("stride_h", &g.stride_h);
    sp.ctx.insert("stride_w", &g.stride_w);
    sp.ctx.insert("pad_top", &g.pad_top);
    sp.ctx.insert("pad_bottom", &g.pad_bottom);
    sp.ctx.insert("pad_left", &g.pad_left);
    sp.ctx.insert("pad_right", &g.pad_right);
    sp.ctx.insert("ceil_mode", &g.ceil_mode);
    sp.ctx.insert("full_windows", &g.full_windows(x[1], x[2]));
    Ok(sp)
}

/// `MaxPool` (x, y, argmax) or `AvgPool` (x, y): one thread per output.
pub(crate) fn forward(s: &Site, geom: &PoolGeom) -> Result<Spec, CodegenError> {
    let (x, y) = (s.shape(0)?, s.shape(1)?);
    s.rank(x, 4, "x")?;
    s.rank(y, 4, "y")?;
    pool(s, geom, x, y, numel(y))
}

/// `MaxPoolBwd` (dy, argmax, dx: `dx_slot` 2) or `AvgPoolBwd` (dy, dx: 1): one thread per input.
pub(crate) fn backward(s: &Site, geom: &PoolGeom, dx_slot: usize) -> Result<Spec, CodegenError> {
    let (dy, dx) = (s.shape(0)?, s.shape(dx_slot)?);
    s.rank(dy, 4, "dy")?;
    s.rank(dx, 4, "dx")?;
    pool(s, geom, dx, dy, numel(dx))
}

/// `GlobalMaxPool`: x, y, argmax; one thread per (sample, channel).
pub(crate) fn global(s: &Site) -> Result<Spec, CodegenError> {
    let x = s.shape(0)?;
    s.rank(x, 4, "x")?;
    let g = PoolGeom::square(1, 1, 0);
    pool(s, &g, x, x, x[0] * x[3])
}

/// Channels per block of `GlobalAvgPool`, and the parts its pixels are summed in.
const GA_CH: usize = 8;
const GA_PARTS: usize = ELEM_THREADS as usize / GA_CH;

/// `GlobalAvgPool`: x, y; a block per (sample, [`GA_CH`] channels), each thread summing one of
/// [`GA_PARTS`] runs of the pixels (see `pool.cu.tera`).
fn global_avg(s: &Site) -> Result<Spec, CodegenError> {
    let x = s.shape(0)?;
    s.rank(x, 4, "x")?;
    let g = PoolGeom::square(1, 1, 0);
    let blocks = x[0] * x[3].div_ceil(GA_CH);
    let mut sp = pool(s, &g, x, x, blocks * ELEM_THREADS as usize)?;
    sp.ctx.insert("ga_ch", &GA_CH);
    sp.ctx.insert("ga_parts", &GA_PARTS);
    Ok(sp)
}

/// `GlobalMaxPoolBwd`: dy, argmax, dx; one thread per element of dx.
fn global_max_bwd(s: &Site) -> Result<Spec, CodegenError> {
    let dx = s.shape(2)?;
    s.rank(dx, 4, "dx")?;
    let g = PoolGeom::square(1, 1, 0);
    pool(s, &g, dx, dx, numel(dx))
}

/// `Upsample` (x, y) or `UpsampleBwd` (dy, dx) by `factor`: `slots` are (small image, large
/// image); one thread per output element (the backward sums its f x f block of dy).
fn upsample(s: &Site, factor: usize, slots: (usize, usize)) -> Result<Spec, CodegenError> {
    let (small, large) = (s.shape(slots.0)?, s.shape(slots.1)?);
    s.rank(small, 4, "small image")?;
    s.rank(large, 4, "large image")?;
    let g = PoolGeom::square(factor, factor, 0);
    let out = if slots.1 == 1 { large } else { small };
    pool(s, &g, small, large, numel(out))
}

/// The kernel of one op of the pooling family.
pub(crate) fn spec(s: &Site, op: &PoolOp) -> Result<Spec, CodegenError> {
    match op {
        PoolOp::MaxPool { geom } | PoolOp::AvgPool { geom } => forward(s, geom),
        PoolOp::MaxPoolBwd { geom } => backward(s, geom, 2),
        PoolOp::AvgPoolBwd { geom } => backward(s, geom, 1),
        PoolOp::GlobalAvgPool => global_avg(s),
        PoolOp::GlobalMaxPool => global(s),
        PoolOp::GlobalMaxPoolBwd => global_max_bwd(s),
        PoolOp::GlobalAvgPoolBwd => super::elementwise::global_avgpool_bwd(s),
        PoolOp::GlobalAvgPoolBwdAct(k) => super::elementwise::global_avgpool_bwd_act(s, *k, false),
        PoolOp::GlobalAvgPoolBwdActInPlace(k) => {
            super::elementwise::global_avgpool_bwd_act(s, *k, true)
        }
        PoolOp::AvgPoolBwdAct { geom, act } => {
            let mut sp = backward(s, geom, 2)?;
            super::epilogue::act_ctx(&mut sp.ctx, *act);
            Ok(sp)
        }
        PoolOp::Upsample { factor } => upsample(s, *factor, (0, 1)),
        PoolOp::UpsampleBwd { factor } => upsample(s, *factor, (1, 0)),
    }
}

/// The zoo's pooling ops: max (four geometries, one padded: ResNet's 3x3/2 with padding 1, one
/// non-square with per-side padding in ceil mode) and average pooling (also padded, also ceil mode), global average and max pooling, and their gradients.
pub(crate) fn zoo() -> Vec<super::cases::Case> {
    use dmc_plan::op::Op;
    let p2 = PoolGeom::square(2, 2, 0);
    let p3 = PoolGeom::square(3, 2, 0);
    let p3p = PoolGeom::square(3, 2, 1);
    // non-square, per-side padding, ceil mode: the last row of windows hangs over the padding
    // (7 rows: 4 windows, floor 3)
    let odd = PoolGeom {
        kh: 3,
        kw: 2,
        stride_h: 2,
        stride_w: 1,
        pad_top: 0,
        pad_bottom: 1,
        pad_left: 0,
        pad_right: 1,
        ceil_mode: true,
    };
    let p = |op: PoolOp| Op::Pool(op);
    vec![
        (
            p(PoolOp::MaxPool { geom: p3p }),
            vec![vec![2, 8, 7, 3], vec![2, 4, 4, 3], vec![2, 4, 4, 3]],
        ),
        (
            p(PoolOp::MaxPoolBwd { geom: p3p }),
            vec![vec![2, 4, 4, 3], vec![2, 4, 4, 3], vec![2, 8, 7, 3]],
        ),
        (
            p(PoolOp::AvgPool { geom: p3p }),
            vec![vec![2, 8, 7, 3], vec![2, 4, 4, 3]],
        ),
        (
            p(PoolOp::AvgPoolBwd { geom: p3p }),
            vec![vec![2, 4, 4, 3], vec![2, 8, 7, 3]],
        ),
        (
            p(PoolOp::MaxPool { geom: odd }),
            vec![vec![2, 7, 6, 3], vec![2, 4, 6, 3], vec![2, 4, 6, 3]],
        ),
        (
            p(PoolOp::MaxPoolBwd { geom: odd }),
            vec![vec![2, 4, 6, 3], vec![2, 4, 6, 3], vec![2, 7, 6, 3]],
        ),
        (
            p(PoolOp::AvgPool { geom: odd }),
            vec![vec![2, 7, 6, 3], vec![2, 4, 6, 3]],
        ),
        (
            p(PoolOp::AvgPoolBwd { geom: odd }),
            vec![vec![2, 4, 6, 3], vec![2, 7, 6, 3]],
        ),
        (
            p(PoolOp::GlobalMaxPool),
            vec![vec![2, 3, 4, 5], vec![2, 5], vec![2, 5]],
        ),
        (
            p(PoolOp::GlobalMaxPoolBwd),
            vec![vec![2, 5], vec![2, 5], vec![2, 3, 4, 5]],
        ),
        (
            p(PoolOp::MaxPool { geom: p2 }),
            vec![vec![2, 5, 5, 3], vec![2, 2, 2, 3], vec![2, 2, 2, 3]],
        ),
        (
            p(PoolOp::MaxPool { geom: p3 }),
            vec![vec![1, 7, 7, 2], vec![1, 3, 3, 2], vec![1, 3, 3, 2]],
        ),
        (
            p(PoolOp::MaxPoolBwd { geom: p3 }),
            vec![vec![1, 3, 3, 2], vec![1, 3, 3, 2], vec![1, 7, 7, 2]],
        ),
        (
            p(PoolOp::AvgPool { geom: p3 }),
            vec![vec![1, 7, 7, 2], vec![1, 3, 3, 2]],
        ),
        (
            p(PoolOp::AvgPoolBwd { geom: p3 }),
            vec![vec![1, 3, 3, 2], vec![1, 7, 7, 2]],
        ),
        (p(PoolOp::GlobalAvgPool), vec![vec![2, 3, 4, 5], vec![2, 5]]),
        (
            p(PoolOp::GlobalAvgPoolBwd),
            vec![vec![2, 5], vec![2, 3, 4, 5]],
        ),
        (
            p(PoolOp::GlobalAvgPoolBwdAct(dmc_plan::op::UnaryKind::Relu)),
            vec![vec![2, 5], vec![2, 3, 4, 5], vec![2, 3, 4, 5]],
        ),
        (
            p(PoolOp::GlobalAvgPoolBwdActInPlace(
                dmc_plan::op::UnaryKind::Gelu,
            )),
            vec![vec![2, 5], vec![2, 3, 4, 5]],
        ),
        (
            p(PoolOp::AvgPoolBwdAct {
                geom: p3,
                act: dmc_plan::op::UnaryKind::Tanh,
            }),
            vec![vec![1, 3, 3, 2], vec![1, 7, 7, 2], vec![1, 7, 7, 2]],
        ),
        (
            p(PoolOp::Upsample { factor: 2 }),
            vec![vec![2, 3, 5, 3], vec![2, 6, 10, 3]],
        ),
        (
            p(PoolOp::UpsampleBwd { factor: 3 }),
            vec![vec![1, 6, 9, 2], vec![1, 2, 3, 2]],
        ),
    ]
}
