//! The planned room for a GPU GEMM's split-K partial sums: how many floats a GEMM-shaped op's
//! workspace must hold so that the CUDA backend may split its reduction (`codegen::spec::gemm`).
//! One rule for every backend: the plan is backend-neutral, the CPU leaves the room unused, and the
//! arena stays exact for whichever backend runs it.

/// Most k ranges a GPU GEMM's reduction is split into.
pub const SPLIT_MAX: usize = 128;
/// Reduction elements per split at least (so a block's loop outweighs writing its partial tile).
pub const SPLIT_MIN_K: usize = 256;
/// The partial sums of one GEMM take at most this many floats (8 MiB).
pub const SPLIT_MAX_PARTIALS: usize = 1 << 21;
/// Output elements from which a GEMM's grid covers a 132-SM GPU several times over without a split
/// (256 tiles of 64 x 64).
pub const SPLIT_OUTPUTS_ENOUGH: usize = 1 << 20;

/// Floats of workspace that let a `gm x gn x gk` GEMM be split along k into up to
/// `split_max(gm, gn, gk)` ranges: `splits x gm x gn`, or 0 when no split can pay (a short
/// reduction, or a grid that is large already).
pub fn split_partials_elems(gm: usize, gn: usize, gk: usize) -> usize {
    let s = split_max(gm, gn, gk);
    if s < 2 {
        0
    } else {
        s * gm * gn
    }
}

/// Blocks a split grid needs at most: about two per SM of a 132-SM GPU (H100, H200).
pub const SPLIT_TARGET_BLOCKS: usize = 256;
/// Outputs of a skinny GPU tile (16 x 64 of `codegen::TILES`), the unit the room is counted in.
pub const SPLIT_TILE_OUTPUTS: usize = 16 * 64;

/// A reduction this long is worth a split per this many elements, however many tiles there are.
pub const SPLIT_LONG_K: usize = 2048;

/// Most splits of a `gm x gn x gk` GEMM the planned workspace allows (see
/// [`split_partials_elems`]): enough for [`SPLIT_TARGET_BLOCKS`] blocks of the smallest tile, or
/// one per [`SPLIT_LONG_K`] of a long reduction, bounded by the reduction ([`SPLIT_MIN_K`] each),
/// [`SPLIT_MAX`] and [`SPLIT_MAX_PARTIALS`].
pub fn split_max(gm: usize, gn: usize, gk: usize) -> usize {
    let outs = gm * gn;
    if outs == 0 || outs >= SPLIT_OUTPUTS_ENOUGH {
        return 1;
    }
    let tiles = outs.div_ceil(SPLIT_TILE_OUTPUTS);
    (gk / SPLIT_MIN_K)
        .min(SPLIT_TARGET_BLOCKS.div_ceil(tiles).max(gk / SPLIT_LONG_K))
        .min(SPLIT_MAX)
        .min(SPLIT_MAX_PARTIALS / outs)
        .max(1)
}
