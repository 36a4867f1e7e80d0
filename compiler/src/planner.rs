//! Memory placement: ONE pure function, [`place`], from buffer requirements to arena offsets,
//! with a selectable strategy ([`PlannerKind`]):
//!
//! * `BestFit` (the default): [`crate::placement::place`], best-fit interval packing by live
//!   range under several orderings (persistent buffers contiguous at the bottom);
//! * `Trivial`: every buffer its own aligned range, no reuse. Kept so that tests can show the
//!   planner changes memory, never results.
//!
//! Both report the liveness lower bound. The cap is enforced by `compile`, which needs the
//! smallest achievable arena for its error message.

use crate::placement::{self, Interval};
use crate::plan::{BufferKind, ALIGN};

/// Which placement strategy to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlannerKind {
    /// Best-fit packing by live range (several orderings, the best kept).
    #[default]
    BestFit,
    /// One range per buffer, no reuse.
    Trivial,
}

/// What the placer needs to know about one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferReq {
    pub bytes: u64,
    /// Inclusive step range during which the buffer holds a needed value.
    pub live: (usize, usize),
    /// Live across steps (parameters, optimizer state): never shares bytes with anything.
    pub persistent: bool,
    /// Only used to explain a cap overflow.
    pub kind: BufferKind,
}

/// Where each buffer goes (offsets in `reqs` order) and the arena size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub offsets: Vec<u64>,
    pub arena_bytes: u64,
    /// Max over steps of the aligned bytes live at that step.
    pub lower_bound: u64,
    /// `trivial`, or the winning best-fit variant.
    pub strategy: &'static str,
}

/// Rounds `x` up to a multiple of [`ALIGN`].
pub fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

fn intervals(reqs: &[BufferReq]) -> Vec<Interval> {
    reqs.iter()
        .map(|r| Interval {
            bytes: r.bytes,
            start: r.live.0,
            end: r.live.1,
            persistent: r.persistent,
        })
        .collect()
}

/// Places every buffer with the given strategy.
pub fn place(reqs: &[BufferReq], kind: PlannerKind) -> Placement {
    let ivs = intervals(reqs);
    match kind {
        PlannerKind::BestFit => match placement::place(&ivs, ALIGN, None) {
            Ok(p) => Placement {
                offsets: p.offsets,
                arena_bytes: p.arena_bytes,
                lower_bound: p.lower_bound,
                strategy: p.strategy,
            },
            // Without a cap `placement::place` cannot fail; fall back to the trivial layout.
            Err(_) => place(reqs, PlannerKind::Trivial),
        },
        PlannerKind::Trivial => {
            let mut offsets = Vec::with_capacity(reqs.len());
            let mut end = 0u64;
            for r in reqs {
                offsets.push(end);
                end = align_up(end + r.bytes.max(1));
            }
            Placement {
                offsets,
                arena_bytes: end,
                lower_bound: placement::lower_bound(&ivs, ALIGN),
                strategy: "trivial",
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(bytes: u64, live: (usize, usize), kind: BufferKind) -> BufferReq {
        BufferReq {
            bytes,
            live,
            persistent: kind == BufferKind::Parameter,
            kind,
        }
    }

    #[test]
    fn trivial_placement_is_aligned_and_disjoint() {
        let reqs = [
            req(4, (0, 0), BufferKind::Parameter),
            req(100, (0, 0), BufferKind::Activation),
            req(64, (1, 1), BufferKind::Gradient),
        ];
        let p = place(&reqs, PlannerKind::Trivial);
        assert_eq!(p.offsets, vec![0, 64, 192]);
        assert_eq!(p.arena_bytes, 256);
        assert_eq!(p.lower_bound, 64 + 128);
    }

    #[test]
    fn best_fit_reuses_dead_buffers() {
        let reqs = [
            req(4, (0, 0), BufferKind::Parameter),
            req(100, (0, 0), BufferKind::Activation),
            req(64, (1, 1), BufferKind::Gradient),
        ];
        let p = place(&reqs, PlannerKind::BestFit);
        assert_eq!(p.arena_bytes, 64 + 128);
        assert_eq!(p.arena_bytes, p.lower_bound);
        assert_ne!(p.strategy, "trivial");
    }
}
