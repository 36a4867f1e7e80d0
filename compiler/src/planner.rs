//! Memory placement: ONE pure function, [`place`], from buffer requirements to arena offsets.
//!
//! The strategy today is the trivial one — every buffer its own aligned range, no reuse. The next
//! issue replaces the strategy (interval packing by live range), not the interface.

use crate::error::CompileError;
use crate::plan::{BufferKind, ALIGN};

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
}

/// Rounds `x` up to a multiple of [`ALIGN`].
pub fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Places every buffer; errors with [`CompileError::CapExceeded`] (and a per-kind breakdown) when
/// the arena would exceed `cap`.
pub fn place(reqs: &[BufferReq], cap: Option<u64>) -> Result<Placement, CompileError> {
    let mut offsets = Vec::with_capacity(reqs.len());
    let mut end = 0u64;
    for r in reqs {
        offsets.push(end);
        end = align_up(end + r.bytes.max(1));
    }
    if let Some(cap) = cap {
        if end > cap {
            let kinds = [
                BufferKind::Parameter,
                BufferKind::OptimizerState,
                BufferKind::Input,
                BufferKind::Activation,
                BufferKind::Gradient,
                BufferKind::Workspace,
            ];
            let breakdown = kinds
                .iter()
                .map(|k| {
                    (
                        *k,
                        reqs.iter()
                            .filter(|r| r.kind == *k)
                            .map(|r| align_up(r.bytes.max(1)))
                            .sum(),
                    )
                })
                .filter(|(_, b)| *b > 0)
                .collect();
            return Err(CompileError::CapExceeded {
                needed: end,
                cap,
                breakdown,
            });
        }
    }
    Ok(Placement {
        offsets,
        arena_bytes: end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(bytes: u64, kind: BufferKind) -> BufferReq {
        BufferReq {
            bytes,
            live: (0, 0),
            persistent: false,
            kind,
        }
    }

    #[test]
    fn trivial_placement_is_aligned_and_disjoint() {
        let reqs = [
            req(4, BufferKind::Parameter),
            req(100, BufferKind::Activation),
            req(64, BufferKind::Gradient),
        ];
        let p = place(&reqs, None).unwrap();
        assert_eq!(p.offsets, vec![0, 64, 192]);
        assert_eq!(p.arena_bytes, 256);
        assert!(place(&reqs, Some(256)).is_ok());
    }

    #[test]
    fn cap_exceeded_is_structured() {
        let reqs = [
            req(4, BufferKind::Parameter),
            req(100, BufferKind::Activation),
        ];
        match place(&reqs, Some(100)) {
            Err(CompileError::CapExceeded {
                needed,
                cap,
                breakdown,
            }) => {
                assert_eq!((needed, cap), (192, 100));
                assert_eq!(
                    breakdown,
                    vec![(BufferKind::Parameter, 64), (BufferKind::Activation, 128)]
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
