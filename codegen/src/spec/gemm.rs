//! The shared-memory tiled GEMM (`gemm.cuh.tera`) behind every convolution and dense kernel: its
//! tile, its context, and split-K (a GEMM with too few output tiles for the GPU splits its
//! reduction; a second entry adds the partial sums in a fixed order).

use serde::Serialize;
use tera::Context;

use super::common::{blocks, Site, Spec, ELEM_THREADS};
use crate::error::CodegenError;

/// Tile sizes of the shared-memory GEMM (`gemm.cuh.tera`): a block computes `bm x bn` outputs
/// with `(bm/tm) * (bn/tn)` threads, stepping `bk` along the reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GemmTile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
}

/// The GEMM a kernel computes, as launched: `groups` independent `gm x gn x gk` GEMMs (a grouped
/// convolution's), each tiled by `tile` and, when `split` > 1, split into that many k ranges whose
/// partial sums a second launch adds. The performance model's view of a GEMM kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GemmGeom {
    pub gm: usize,
    pub gn: usize,
    pub gk: usize,
    pub groups: usize,
    pub split: usize,
    pub tile: GemmTile,
    /// Whether an operand's loads decompose an implicit-GEMM (im2col) index, i.e. a convolution.
    pub implicit: bool,
}

/// k-tiles per partial sum of a long GEMM reduction (see `gemm.cuh.tera`).
pub const CHUNK_TILES: usize = 32;

/// The tile every GEMM-shaped kernel uses (256 threads, 4x4 outputs each).
pub const DEFAULT_TILE: GemmTile = GemmTile {
    bm: 64,
    bn: 64,
    bk: 16,
    tm: 4,
    tn: 4,
};

/// Blocks a GEMM launch should have at least before split-K is worth it (an H100/H200 has 132 SMs).
pub const SPLIT_TARGET_BLOCKS: usize = 256;
/// k-tiles per split at least, so a block's loop outweighs writing its partial tile.
pub const SPLIT_MIN_TILES: usize = 32;
/// Most splits.
pub const SPLIT_MAX: usize = 64;

/// The split-K factor of a `gm x gn x gk` GEMM whose partial sums (`split x gm x gn` floats) must
/// fit a workspace of `ws_elems` floats: 1 (no split) when the grid already has enough blocks or
/// the reduction is short, else as many splits as bring the grid to [`SPLIT_TARGET_BLOCKS`].
pub fn split_k(gm: usize, gn: usize, gk: usize, ws_elems: usize) -> usize {
    let t = DEFAULT_TILE;
    let blocks = gm.div_ceil(t.bm as usize).max(1) * gn.div_ceil(t.bn as usize).max(1);
    if blocks * 2 >= SPLIT_TARGET_BLOCKS || gm * gn == 0 {
        return 1;
    }
    let by_k = gk / (t.bk as usize * SPLIT_MIN_TILES);
    let by_ws = ws_elems / (gm * gn);
    let s = SPLIT_TARGET_BLOCKS
        .div_ceil(blocks)
        .min(by_k)
        .min(by_ws)
        .min(SPLIT_MAX);
    if s < 2 {
        return 1;
    }
    // equal k ranges of whole tiles; the last range may be shorter, none empty
    let ks = gk.div_ceil(s).div_ceil(t.bk as usize) * t.bk as usize;
    gk.div_ceil(ks)
}

/// A `gm x gn x gk` GEMM kernel from `template`. `split` > 1 (and split-K on in the options): a
/// split-K GEMM whose partial sums go to the workspace parameter `partial`.
pub(crate) fn gemm(
    s: &Site,
    template: &'static str,
    mut ctx: Context,
    (gm, gn, gk): (usize, usize, usize),
    (a_k_fastest, b_k_fastest): (bool, bool),
    (split, partial): (usize, &str),
) -> Result<Spec, CodegenError> {
    let t = DEFAULT_TILE;
    let split = if s.opts.split_k { split } else { 1 };
    let ks = if split > 1 {
        gk.div_ceil(split).div_ceil(t.bk as usize) * t.bk as usize
    } else {
        gk
    };
    ctx.insert("split", &split);
    ctx.insert("ks", &ks);
    ctx.insert("partial", partial);
    ctx.insert("reduce_threads", &ELEM_THREADS);
    ctx.insert("gm", &gm);
    ctx.insert("gn", &gn);
    ctx.insert("gk", &gk);
    ctx.insert("bm", &t.bm);
    ctx.insert("bn", &t.bn);
    ctx.insert("bk", &t.bk);
    ctx.insert("tm", &t.tm);
    ctx.insert("tn", &t.tn);
    ctx.insert("a_k_fastest", &a_k_fastest);
    // long reductions: two-level fp32 summation (chunks of CHUNK_TILES k-tiles)
    let chunk = if ks > CHUNK_TILES * t.bk as usize * 8 {
        CHUNK_TILES
    } else {
        0
    };
    ctx.insert("chunk_tiles", &chunk);
    // 32-bit index decomposition when every GEMM index fits (cheaper div/mod, no spills)
    let small = [gm, gn, gk].iter().all(|&v| v < (1usize << 31));
    ctx.insert("idx", if small { "unsigned" } else { "u64" });
    ctx.insert("sidx", if small { "int" } else { "i64" });
    ctx.insert("b_k_fastest", &b_k_fastest);
    // a fused weight-gradient + update kernel sets this (and the `update.cuh.tera` entries)
    ctx.insert("fused_update", &false);
    // a fused weight-gradient + update kernel that also took the bias gradient sets this
    ctx.insert("fused_bias", &false);
    let gy = gn.div_ceil(t.bn as usize).max(1);
    if gy > 65535 {
        return Err(CodegenError::Grid {
            kernel: s.name().into(),
            message: format!("{gn} GEMM columns"),
        });
    }
    Ok(Spec {
        template,
        ctx,
        grid: [blocks(gm, t.bm, s.name())?, gy as u32, split as u32],
        block: [(t.bm / t.tm) * (t.bn / t.tn), 1, 1],
        split,
        outputs: gm * gn,
        gemm: Some(GemmGeom {
            gm,
            gn,
            gk,
            groups: 1,
            split,
            tile: t,
            implicit: template.starts_with("conv"),
        }),
    })
}
