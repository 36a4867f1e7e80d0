//! The helpers of the ops' shape rules ([`Op::infer_outputs`](super::Op::infer_outputs)): the one
//! shape rule, called by the compiler's IR (lowering, autodiff, the verifier around every pass) and
//! by every backend's plan check ([`Op::check_args`](super::Op::check_args)).

use super::facts::{PoolGeom, ShapeError, TensorType};

pub(crate) fn err<T>(msg: impl Into<String>) -> Result<T, ShapeError> {
    Err(ShapeError(msg.into()))
}

pub(crate) fn rank(t: &TensorType, r: usize, what: &str) -> Result<(), ShapeError> {
    if t.shape.len() != r {
        return err(format!("{what} must have rank {r}, got {t}"));
    }
    Ok(())
}

pub(crate) fn same(a: &TensorType, b: &TensorType, what: &str) -> Result<(), ShapeError> {
    if a.shape != b.shape {
        return err(format!("{what}: shapes differ ({a} vs {b})"));
    }
    Ok(())
}

/// The states of an update (inputs from `first` on) all have the shape of the updated tensor `w`.
pub(crate) fn states_like(
    w: &TensorType,
    inputs: &[TensorType],
    first: usize,
) -> Result<(), ShapeError> {
    for (i, t) in inputs.iter().enumerate().skip(first) {
        same(w, t, &format!("updated tensor, state {i}"))?;
    }
    Ok(())
}

/// The `count` optimizer-state inputs from `first` on of the parameter `w`, updated by `shards`
/// ranks ([`crate::shard`]): `w`'s shape with one rank, else each rank's flat shard of `w` seen as
/// `[numel / cols, cols]`.
pub(crate) fn states_sharded(
    w: &TensorType,
    inputs: &[TensorType],
    first: usize,
    count: usize,
    shards: usize,
    cols: usize,
) -> Result<(), ShapeError> {
    if shards <= 1 {
        return states_like(w, &inputs[..first + count], first);
    }
    let want = crate::shard::Layout::of(&w.shape, cols, shards).shard_elems();
    for (i, t) in inputs.iter().enumerate().skip(first).take(count) {
        if t.shape != [want] || t.dtype != w.dtype {
            return err(format!(
                "state {i} of {w} updated by {shards} ranks must be its shard f32[{want}], not {t}"
            ));
        }
    }
    Ok(())
}

pub(crate) fn need_hint<'a>(
    hint: Option<&'a TensorType>,
    kind_name: &str,
) -> Result<&'a TensorType, ShapeError> {
    hint.ok_or_else(|| ShapeError(format!("{kind_name} needs the expected output shape")))
}

/// The output shape of a pooling window over `x` [N,H,W,C] ([`PoolGeom::out_hw`]).
pub(crate) fn pooled(x: &[usize], g: &PoolGeom) -> Result<Vec<usize>, ShapeError> {
    let (ho, wo) = g.out_hw(x[1], x[2]).map_err(ShapeError)?;
    Ok(vec![x[0], ho, wo, x[3]])
}

pub(crate) fn numel(s: &[usize]) -> u64 {
    s.iter().map(|d| *d as u64).product()
}
