//! Size limits of a checked program, and the element-count check every shape goes through.

use crate::diag::{Error, Kind};
use crate::model::Span;

/// Largest number of elements of one per-sample tensor or one parameter.
pub const MAX_ELEMS: usize = 1 << 40;
/// Largest number of layers after expansion.
pub const MAX_NODES: usize = 100_000;
/// Largest number of expansion steps (stages applied, blocks entered).
pub const MAX_STEPS: usize = 1_000_000;
/// Deepest nesting of block uses.
pub const MAX_BLOCK_DEPTH: usize = 64;
/// Largest dimension of a declared shape (and largest whole-number argument).
pub const MAX_DIM: i64 = 1 << 31;

/// `[2, 3]`, as shapes are shown in diagnostics.
pub fn fmt_shape(s: &[usize]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The number of elements of `shape`, or an error at `span` when it exceeds [`MAX_ELEMS`].
pub fn elems(shape: &[usize], span: Span) -> Result<usize, Error> {
    let mut n: usize = 1;
    for d in shape {
        n = n
            .checked_mul(*d)
            .filter(|n| *n <= MAX_ELEMS)
            .ok_or_else(|| {
                Error::new(
                    Kind::Shape,
                    span,
                    format!("tensor of shape {} is too large", fmt_shape(shape)),
                )
                .label("more than 2^40 elements")
            })?;
    }
    Ok(n)
}
