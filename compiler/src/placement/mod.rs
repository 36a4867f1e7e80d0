//! Memory placement: every buffer of a step gets a fixed offset in ONE arena, from its size and
//! live range alone ([`place`]), with a selectable strategy ([`PlannerKind`]):
//!
//! * `BestFit` (the default): [`best_fit_place`], best-fit interval packing by live range under
//!   several orderings, persistent buffers contiguous at the bottom (see [`best_fit`]);
//! * `Trivial`: every buffer its own aligned range, no reuse. Kept so that tests can show the
//!   planner changes memory, never results.
//!
//! Both report the liveness [`lower_bound`]. The cap is enforced by `compile` ([`crate::fit`]),
//! which needs the smallest achievable arena for its error message. [`check_placement`] is an
//! independent, deliberately naive validator of a placement.

pub mod best_fit;

pub use best_fit::{
    best_fit_place, lower_bound, ordering_arena, FULL_SEARCH_MAX_ITEMS, STRATEGIES, VARIANTS,
};

use crate::plan::ALIGN;

/// One buffer to place: its size and its inclusive live range in step indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Interval {
    /// Size in bytes (rounded up to the alignment for packing).
    pub bytes: u64,
    /// First step at which the buffer is live.
    pub start: usize,
    /// Last step at which the buffer is live (inclusive).
    pub end: usize,
    /// Live for the whole step and across steps (parameters, optimizer state); `start`/`end` are
    /// then ignored.
    pub persistent: bool,
}

/// The result of [`place`] and [`best_fit_place`]: an offset per interval, in the order of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Byte offset of each interval in the arena (0 for zero-byte intervals).
    pub offsets: Vec<u64>,
    /// Arena size: the maximum over intervals of `offset + aligned size`.
    pub arena_bytes: u64,
    /// The liveness lower bound (see [`lower_bound`]); no placement can use less.
    pub lower_bound: u64,
    /// How this placement was found: `"trivial"` ([`PlannerKind::Trivial`], or no transient
    /// interval to pack), else one of [`VARIANTS`] (an ordering of [`STRATEGIES`], maybe
    /// improved by bumping and/or compaction).
    pub strategy: &'static str,
}

/// Which placement strategy to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlannerKind {
    /// Best-fit packing by live range (several orderings, the best kept).
    #[default]
    BestFit,
    /// One range per buffer, no reuse.
    Trivial,
}

/// Rounds `x` up to a multiple of [`ALIGN`] (saturating at `u64::MAX`).
pub fn align_up(x: u64) -> u64 {
    best_fit::align_up(x, ALIGN)
}

/// Places every buffer with the given strategy, at offsets aligned to [`ALIGN`].
pub fn place(reqs: &[Interval], kind: PlannerKind) -> Placement {
    match kind {
        PlannerKind::BestFit => best_fit_place(reqs, ALIGN),
        PlannerKind::Trivial => {
            let mut offsets = Vec::with_capacity(reqs.len());
            let mut end = 0u64;
            for r in reqs {
                offsets.push(end);
                end = align_up(end.saturating_add(r.bytes.max(1)));
            }
            Placement {
                offsets,
                arena_bytes: end,
                lower_bound: lower_bound(reqs, ALIGN),
                strategy: "trivial",
            }
        }
    }
}

/// Independently checks a placement: one offset per interval, every offset a multiple of
/// `align`, zero-byte intervals at offset 0, every interval inside the arena, no two intervals
/// that are live at a common step (persistent ones are live at every step) sharing a byte, and
/// `lower_bound <= arena_bytes`. Uses plain pairwise comparisons in `u128`, sharing no code
/// with [`best_fit_place`].
pub fn check_placement(reqs: &[Interval], p: &Placement, align: u64) -> Result<(), String> {
    if p.offsets.len() != reqs.len() {
        return Err(format!(
            "{} offsets for {} intervals",
            p.offsets.len(),
            reqs.len()
        ));
    }
    let align = u128::from(align.max(1));
    let arena = u128::from(p.arena_bytes);
    if u128::from(p.lower_bound) > arena {
        return Err(format!(
            "lower bound {} above the arena size {}",
            p.lower_bound, p.arena_bytes
        ));
    }
    // (offset, aligned size, first step, last step, persistent)
    let mut boxes: Vec<(usize, u128, u128, usize, usize, bool)> = Vec::new();
    for (i, (iv, &off)) in reqs.iter().zip(&p.offsets).enumerate() {
        let off = u128::from(off);
        let size = u128::from(iv.bytes).div_ceil(align) * align;
        if size == 0 {
            if off != 0 {
                return Err(format!("zero-byte interval {i} at offset {off}, not 0"));
            }
            continue;
        }
        if off % align != 0 {
            return Err(format!(
                "interval {i} at offset {off} not aligned to {align}"
            ));
        }
        if off + size > arena {
            return Err(format!(
                "interval {i} spans [{off}, {}) beyond the arena of {arena} bytes",
                off + size
            ));
        }
        let (a, b) = (iv.start.min(iv.end), iv.start.max(iv.end));
        boxes.push((i, off, size, a, b, iv.persistent));
    }
    for (x, &(i, oi, si, ai, bi, pi)) in boxes.iter().enumerate() {
        for &(j, oj, sj, aj, bj, pj) in &boxes[x + 1..] {
            let in_time = pi || pj || (ai <= bj && aj <= bi);
            let in_bytes = oi < oj + sj && oj < oi + si;
            if in_time && in_bytes {
                return Err(format!(
                    "intervals {i} (bytes [{oi}, {}), steps {ai}..={bi}{}) and {j} (bytes \
                     [{oj}, {}), steps {aj}..={bj}{}) are live together and overlap",
                    oi + si,
                    if pi { ", persistent" } else { "" },
                    oj + sj,
                    if pj { ", persistent" } else { "" },
                ));
            }
        }
    }
    Ok(())
}
