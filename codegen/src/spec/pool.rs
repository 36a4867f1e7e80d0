//! Pooling: max and average pooling and their gradients, global average pooling (`pool.cu.tera`).

use dmc_plan::op::PoolGeom;

use super::common::{numel, per_element, Site, Spec};
use crate::error::CodegenError;

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
    sp.ctx.insert("size", &g.size);
    let big = [numel(x), numel(y)].iter().any(|&v| v >= (1usize << 31));
    sp.ctx.insert("idx", if big { "u64" } else { "unsigned" });
    sp.ctx.insert("stride", &g.stride);
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

/// `GlobalAvgPool`: x, y; one thread per (sample, channel).
pub(crate) fn global(s: &Site) -> Result<Spec, CodegenError> {
    let x = s.shape(0)?;
    s.rank(x, 4, "x")?;
    let g = PoolGeom { size: 1, stride: 1 };
    pool(s, &g, x, x, x[0] * x[3])
}
