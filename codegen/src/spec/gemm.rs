//! The shared-memory tiled GEMM (`gemm.cuh.tera`) behind every convolution and dense kernel: the
//! tiles it may use, the choice of a tile and a split-K factor per GEMM by the performance model
//! ([`choose`]), and its context. A GEMM with too few output tiles for the GPU splits its reduction
//! into the planned workspace (`dmc_plan::op::split`); a second entry adds the partial sums in a
//! fixed order.

use serde::Serialize;
use tera::Context;

use super::common::{blocks, Site, Spec, ELEM_THREADS};
use crate::error::CodegenError;
use crate::options::CodegenOptions;
use crate::perf;
use dmc_plan::op::{bias_chunks, BIAS_CHUNK_ROWS};

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

impl GemmTile {
    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }
    /// Shared memory of its two tiles, bytes: A padded by one column, or by four when a
    /// pipelined kernel reads its fragments as `float4` (16-byte rows).
    pub const fn shared_bytes(&self, pipelined: bool) -> u32 {
        let pad = if pipelined && self.frag_width().0 == 4 {
            4
        } else {
            1
        };
        (self.bk * (self.bm + pad) + self.bk * self.bn) * 4
    }
    /// Floats per shared-memory load of a thread's A and B fragments in a pipelined kernel
    /// (`float4` for 4 or 8 rows or columns, `float2` for 2, else 1).
    pub const fn frag_width(&self) -> (u32, u32) {
        const fn w(t: u32) -> u32 {
            if t.is_multiple_of(4) {
                4
            } else if t.is_multiple_of(2) {
                2
            } else {
                1
            }
        }
        (w(self.tm), w(self.tn))
    }
    /// Elements of A and of B each thread stages in registers per k-tile (pipelined kernels), or
    /// copies into shared memory (cp.async kernels).
    pub const fn staged(&self) -> (u32, u32) {
        let t = self.threads();
        (self.bk * self.bm / t, self.bk * self.bn / t)
    }
    /// Bytes of one stage of a cp.async kernel's tiles (A padded by 4 floats: 16-byte rows).
    pub const fn stage_bytes(&self) -> u32 {
        (self.bk * (self.bm + 4) + self.bk * self.bn) * 4
    }
    /// The cp.async stages this tile takes: as many as fit in the 48 KiB of static shared memory
    /// a block may declare, at most [`MAX_STAGES`]; 0 when fewer than 2 fit (the tile is then
    /// pipelined through registers).
    pub const fn async_stages(&self) -> u32 {
        let s = STATIC_SHARED_BYTES / self.stage_bytes();
        let s = if s > MAX_STAGES { MAX_STAGES } else { s };
        if s >= 2 {
            s
        } else {
            0
        }
    }
    /// The m16n8 tensor-core tiles of a TF32 block, per warp (8 warps of 256 threads), or `None`
    /// when the tile does not split into whole m16n8k8 MMAs evenly over its warps, or gives a warp
    /// more than 4 (the 128x64 tile's 8 spill registers under NVRTC with a long reduction's
    /// two-level sums).
    pub const fn mma_per_warp(&self) -> Option<u32> {
        let tiles = (self.bm / 16) * (self.bn / 8);
        if self.threads() == 256
            && self.bm.is_multiple_of(16)
            && self.bn.is_multiple_of(8)
            && self.bk.is_multiple_of(8)
            && tiles >= 8
            && tiles <= 32
            && tiles.is_multiple_of(8)
        {
            Some(tiles / 8)
        } else {
            None
        }
    }
}

/// Static shared memory a block may declare (bytes).
pub const STATIC_SHARED_BYTES: u32 = 48 * 1024;
/// Most cp.async stages of a GEMM's tiles (tiles in flight + the one computed).
pub const MAX_STAGES: u32 = 4;

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
    /// Whether A's loads decompose an implicit-GEMM (im2col) index (a convolution's image), and
    /// B's (the data gradient's flipped weight, its dy); else a row-major index.
    pub implicit: bool,
    pub b_implicit: bool,
    /// A's and B's staged loads are 128-bit (4 elements along the operand's fastest axis, one
    /// index computation each): the operand allows it and the tile stages a multiple of 4.
    pub vec_a: bool,
    pub vec_b: bool,
    /// The next k-tile's loads are in flight (staged in registers) while the current one is
    /// computed; off, a tile's loads and its arithmetic alternate (the baseline kernel).
    pub pipelined: bool,
    /// The blocks per SM the kernel is compiled for (`__launch_bounds__`): 2 caps a 256-thread
    /// block at 128 registers; 1 (an unsplit fused update, the largest tile, the baseline) leaves
    /// them to NVRTC.
    pub min_blocks: u32,
    /// A split's k ranges are whole multiples of this many (and of `bk`): a weight gradient's
    /// [`BIAS_CHUNK_ROWS`], so that each range sums whole chunks of the fused bias gradient.
    /// 0: whole `bk` tiles only.
    pub k_unit: u32,
    /// cp.async stages of the tiles in shared memory (sm_80+: the next `stages - 1` k-tiles' copies
    /// fly during the arithmetic); 0: pipelined through registers (or not at all, `pipelined`).
    pub stages: u32,
    /// The target GPU has cp.async, the options allow it and both operands copy in 16-byte pieces
    /// ([`GemmNeeds::wide_copies`]): a candidate tile that stages both as float4s takes its
    /// [`GemmTile::async_stages`]. (Measured on an H200: with 4-byte copies of a k-fastest
    /// operand, seed's data gradients ran 1.7x slower than staged through registers; with 16-byte
    /// copies, deep_convnet's weight gradients 6% faster.)
    pub copy_async: bool,
    /// TF32 tensor cores (mma.sync m16n8k8, `precision: tf32` on an sm_80+ GPU), where the tile
    /// splits into whole MMAs ([`GemmTile::mma_per_warp`]); else fp32 FMAs.
    pub tf32: bool,
    /// The kernel's structure: the shared-memory tiles above, or one of the skinny streaming
    /// kernels (`spec::skinny`) for a GEMM with a few rows or a short reduction (then `tile`,
    /// `pipelined`, `stages` do not apply).
    pub kind: GemmKind,
    /// B's consecutive elements run along k ([`GemmNeeds::b_k_fastest`]).
    pub b_k_fastest: bool,
}

/// Which GEMM kernel computes a [`GemmGeom`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum GemmKind {
    /// The shared-memory tiled GEMM (`gemm.cuh.tera`'s main entry).
    Tiled,
    /// A few rows (`gm` <= [`super::skinny::ROWS_MAX`]): A's rows of a k range in shared memory,
    /// B streamed from global memory straight into registers, 128-bit loads several in flight,
    /// each B element read once by one thread (`gemm_skinny.cuh.tera`).
    Rows,
    /// A short reduction (`gk` <= [`super::skinny::OUTER_K_MAX`]): each thread holds its column of
    /// B in registers and streams its outputs row by row (`gemm_skinny.cuh.tera`).
    Outer,
}

impl GemmKind {
    pub fn name(self) -> &'static str {
        match self {
            GemmKind::Tiled => "tiled",
            GemmKind::Rows => "rows",
            GemmKind::Outer => "outer",
        }
    }
}

impl GemmGeom {
    /// The granule of a split's k ranges: `k_unit` where set (a multiple of every tile's `bk`),
    /// else the tile's `bk`.
    pub fn split_unit(&self) -> u32 {
        match self.kind {
            GemmKind::Rows => self.k_unit.max(super::skinny::ROWS_UNIT),
            _ => self.k_unit.max(self.tile.bk),
        }
    }
    /// Threads per block: the tile's, or a skinny kernel's [`super::skinny::THREADS`].
    pub fn threads(&self) -> u32 {
        match self.kind {
            GemmKind::Tiled => self.tile.threads(),
            _ => super::skinny::THREADS,
        }
    }
    /// The reduction length of each k range (the template's `KS`).
    pub fn ks(&self) -> usize {
        split_len(self.gk, self.split, self.split_unit())
    }
    /// Shared memory of the kernel's tiles (bytes): every stage of a cp.async kernel, else one
    /// tile of A and B ([`GemmTile::shared_bytes`]).
    pub fn shared_bytes(&self) -> u32 {
        if self.kind != GemmKind::Tiled {
            return super::skinny::smem_floats(self) as u32 * 4;
        }
        if self.stages > 1 {
            self.stages * self.tile.stage_bytes()
        } else {
            self.tile.shared_bytes(self.pipelined)
        }
    }
}

/// k-tiles per partial sum of a long GEMM reduction (see `gemm.cuh.tera`).
pub const CHUNK_TILES: usize = 32;

/// The baseline tile (256 threads, 4x4 outputs each, k-step 16), rendered unpipelined and unsplit
/// by [`CodegenOptions::baseline_gemm`]: the kernel the logged H200 times measured.
pub const DEFAULT_TILE: GemmTile = GemmTile {
    bm: 64,
    bn: 64,
    bk: 16,
    tm: 4,
    tn: 4,
};

/// The tiles the compiler chooses among (each 256 threads, every load loop a whole number of
/// rounds): large square ones for compute-bound GEMMs, skinny ones for a few rows or columns
/// (a batch-1 layer, a narrow weight gradient), all with a 32-deep k-step. (64-deep ones, tried,
/// take more than 128 registers without spilling: one block per SM, no faster in the model.)
pub const TILES: [GemmTile; 6] = [
    GemmTile {
        bm: 128,
        bn: 64,
        bk: 32,
        tm: 8,
        tn: 4,
    },
    GemmTile {
        bm: 64,
        bn: 64,
        bk: 32,
        tm: 4,
        tn: 4,
    },
    GemmTile {
        bm: 32,
        bn: 64,
        bk: 32,
        tm: 2,
        tn: 4,
    },
    GemmTile {
        bm: 16,
        bn: 64,
        bk: 32,
        tm: 1,
        tn: 4,
    },
    GemmTile {
        bm: 64,
        bn: 32,
        bk: 32,
        tm: 4,
        tn: 2,
    },
    GemmTile {
        bm: 16,
        bn: 32,
        bk: 32,
        tm: 1,
        tn: 2,
    },
];

/// The split actually launched for a requested `s`: k ranges of whole `unit`s (a tile's `bk`, or
/// [`GemmGeom::split_unit`]), equal but the last (which may be shorter, none empty).
pub fn effective_split(gk: usize, s: usize, unit: u32) -> usize {
    if s < 2 || gk == 0 {
        return 1;
    }
    gk.div_ceil(split_len(gk, s, unit))
}

/// The reduction length of each of `split` k ranges of whole `unit`s (`gk` unsplit): the
/// template's `KS`.
pub fn split_len(gk: usize, split: usize, unit: u32) -> usize {
    if split < 2 {
        return gk;
    }
    gk.div_ceil(split).div_ceil(unit as usize) * unit as usize
}

/// What [`choose`] needs to know of a GEMM besides its extents.
#[derive(Debug, Clone, Copy)]
pub struct GemmNeeds {
    pub groups: usize,
    /// A's and B's loads decompose an implicit-GEMM index (see [`GemmGeom::implicit`]).
    pub implicit: bool,
    pub b_implicit: bool,
    /// 4 consecutive elements of A (of B) along its fastest axis are contiguous and 16-byte
    /// aligned, and its extent along that axis is a multiple of 4 (so they load as one float4).
    pub vec_a: bool,
    pub vec_b: bool,
    /// The kernel applies an optimizer update in its epilogue (more registers when unsplit).
    pub update: bool,
    /// The partial sums the planned workspace holds (floats); 0 for none.
    pub partial_elems: usize,
    /// A split's k ranges are multiples of this (see [`GemmGeom::k_unit`]); 0 for whole tiles.
    pub k_unit: u32,
    /// Neither operand's tile is k-fastest (its 4 consecutive elements lie along m or n), so with
    /// `vec_a` and `vec_b` every cp.async copy is 16 bytes ([`gemm`] sets it from the layouts).
    pub wide_copies: bool,
    /// B's consecutive elements run along k (a data gradient's flipped weight): a skinny rows
    /// kernel then loads its float4s along k ([`gemm`] sets it from the layouts).
    pub b_k_fastest: bool,
}

/// The tile and split of a `gm x gn x gk` GEMM: the candidate ([`TILES`] x every split within the
/// workspace, or the options' forced tile) with the smallest predicted time on the options' GPU
/// (`perf::gemm_launch_s`, registers and shared memory estimated from the tile); on ties (within
/// 1%), the one padding fewer outputs, then the fewer splits. A GEMM of [`LARGE_BYTES`] or more
/// takes a candidate whose grid gives every SM a block whenever one does ([`covers`]): the model's
/// wave counting may favour a grid just short of the SMs, which a real GPU does not reward. An
/// optimizer update in the epilogue does not enter the ranking: a fused weight-gradient + update
/// kernel takes the tile and split of the unfused gradient's, so fusing never changes the order of
/// a sum (only the launch bounds). A skinny kernel (`spec::skinny`: a few rows, a short reduction)
/// replaces the tiles where the model ranks one more than 1% faster, by the same covering rule
/// (`--no-skinny` turns them off). The baseline options give [`DEFAULT_TILE`], unsplit and
/// unpipelined.
pub fn choose(gm: usize, gn: usize, gk: usize, n: &GemmNeeds, opts: &CodegenOptions) -> GemmGeom {
    let base = GemmGeom {
        gm,
        gn,
        gk,
        groups: n.groups.max(1),
        split: 1,
        tile: DEFAULT_TILE,
        implicit: n.implicit,
        b_implicit: n.b_implicit,
        vec_a: false,
        vec_b: false,
        pipelined: false,
        min_blocks: 1,
        k_unit: n.k_unit,
        stages: 0,
        copy_async: false,
        tf32: false,
        kind: GemmKind::Tiled,
        b_k_fastest: n.b_k_fastest,
    };
    if opts.baseline_gemm {
        return base;
    }
    // what the operands allow; each candidate keeps it where its tile can
    let gpu = perf::gpu(opts.gpu).unwrap_or(&perf::GPUS[0]);
    // cp.async where the GPU has it (sm_80+) and the options allow it
    let base = GemmGeom {
        vec_a: n.vec_a,
        vec_b: n.vec_b,
        copy_async: opts.copy_async && gpu.sm() >= 80 && n.wide_copies,
        tf32: opts.tf32 && gpu.sm() >= 80,
        ..base
    };
    let forced = opts.tile.map(|t| [t]);
    let tiles: &[GemmTile] = match &forced {
        Some(t) => t,
        None => &TILES,
    };
    let max_split = if opts.split_k && n.groups <= 1 && gm * gn > 0 {
        n.partial_elems / (gm * gn)
    } else {
        1
    };
    let mut best: Option<(f64, GemmGeom)> = None;
    for &tile in tiles {
        if gn.div_ceil(tile.bn as usize) > 65535 {
            continue;
        }
        let mut last = 0;
        // every factor the workspace allows (a grid that just fills a wave matters: the next
        // block starts a wave of its own)
        for s in 1..=max_split.clamp(1, MOST_SPLITS) {
            let split = effective_split(gk, s, n.k_unit.max(tile.bk));
            if split == last {
                continue;
            }
            last = split;
            // ranked as the plain GEMM: a fused update's kernel gets the tile and split of its
            // unfused gradient, so fusing never changes a sum's order (only its launch bounds)
            let g = candidate(&base, tile, split, false);
            let t = perf::gemm_launch_s(&g, false, gpu, &perf::CALIBRATION);
            // within 1% (a tie: a tiny GEMM is its launch), the tile wasting fewer outputs on
            // padding, then the fewer splits
            let better = match &best {
                None => true,
                Some((_, bg)) if covers(&g, gpu.sms) != covers(bg, gpu.sms) => covers(&g, gpu.sms),
                Some((bt, bg)) => {
                    t < bt * 0.99
                        || (t <= bt * 1.01 && (padded(&g), g.split) < (padded(bg), bg.split))
                }
            };
            if better {
                best = Some((t, g));
            }
        }
    }
    // the skinny kernels where the operands allow one and the model says it is faster than every
    // tiled candidate (not on a tie: the tiled kernel is the measured one)
    if opts.force_skinny {
        best = None;
    }
    if (opts.skinny && forced.is_none()) || opts.force_skinny {
        for g in super::skinny::candidates(&base, n, max_split.clamp(1, MOST_SPLITS)) {
            if gn.div_ceil(g.tile.bn as usize) > 65535 {
                continue;
            }
            let t = perf::gemm_launch_s(&g, false, gpu, &perf::CALIBRATION);
            let better = match &best {
                None => true,
                Some((_, bg)) if covers(&g, gpu.sms) != covers(bg, gpu.sms) => covers(&g, gpu.sms),
                Some((bt, _)) => t < bt * 0.99,
            };
            if better {
                best = Some((t, g));
            }
        }
        // forced, but no skinny kernel computes it: the tiles after all
        if best.is_none() {
            return choose(
                gm,
                gn,
                gk,
                n,
                &CodegenOptions {
                    force_skinny: false,
                    ..*opts
                },
            );
        }
    }
    let g = best.map_or(candidate(&base, tiles[0], 1, false), |(_, g)| g);
    if g.kind != GemmKind::Tiled {
        return g;
    }
    candidate(&base, g.tile, g.split, n.update)
}

/// The launch bounds' blocks per SM of a pipelined kernel: 2 (at most 128 registers for 256
/// threads), but 1 for a fused update's epilogue or 16 accumulators per thread or more (NVRTC
/// spills those under 128 registers for sm_80).
fn min_blocks(t: &GemmTile, unsplit_update: bool) -> u32 {
    if unsplit_update || t.tm * t.tn >= 16 {
        1
    } else {
        2
    }
}

/// The pipelined candidate of `base`'s GEMM with `tile` and (effective) `split`.
/// The pipelined candidate of `base`'s GEMM with `tile` and (effective) `split`; its loads are
/// 128-bit where `base` allows them (its `vec_a` / `vec_b`: the operand's layout) and the tile
/// stages a multiple of 4 elements per thread.
pub fn candidate(base: &GemmGeom, tile: GemmTile, split: usize, update: bool) -> GemmGeom {
    let (sa, sb) = tile.staged();
    let tf32 = base.tf32 && tile.mma_per_warp().is_some();
    GemmGeom {
        split,
        tile,
        pipelined: true,
        tf32,
        stages: if base.copy_async && base.vec_a && base.vec_b && sa % 4 == 0 && sb % 4 == 0 {
            tile.async_stages()
        } else {
            0
        },
        vec_a: base.vec_a && sa % 4 == 0,
        vec_b: base.vec_b && sb % 4 == 0,
        // a TF32 kernel's registers are left to NVRTC (under 128 the 32x64 tile spills with a long
        // reduction's two-level sums)
        min_blocks: if tf32 {
            1
        } else {
            min_blocks(&tile, update && split <= 1)
        },
        ..*base
    }
}

/// Operand bytes from which a GEMM must cover the GPU (the 4 MB rule, see [`choose`]).
pub const LARGE_BYTES: usize = 4_000_000;

/// Whether `g`'s grid has a block for each of `sms` SMs, or `g` is smaller than [`LARGE_BYTES`].
pub fn covers(g: &GemmGeom, sms: u32) -> bool {
    let gr = g.groups.max(1);
    let bytes = (g.gm * g.gk + g.gk * g.gn + g.gm * g.gn) * 4 * gr;
    bytes < LARGE_BYTES || grid_blocks(g) >= sms as usize
}

/// Blocks of `g`'s main launch.
pub fn grid_blocks(g: &GemmGeom) -> usize {
    let (bm, bn) = (g.tile.bm as usize, g.tile.bn as usize);
    g.gm.div_ceil(bm).max(1) * g.gn.div_ceil(bn).max(1) * g.split.max(1) * g.groups.max(1)
}

/// The most splits tried (`dmc_plan::op::split::SPLIT_MAX`).
const MOST_SPLITS: usize = dmc_plan::op::split::SPLIT_MAX;

/// Outputs a GEMM's tiles cover, padding included.
fn padded(g: &GemmGeom) -> usize {
    let (bm, bn) = (g.tile.bm as usize, g.tile.bn as usize);
    g.gm.div_ceil(bm) * bm * g.gn.div_ceil(bn) * bn
}

/// A `gm x gn x gk` GEMM kernel from `template`, tiled and split as [`choose`] says for `needs`;
/// a split-K GEMM's partial sums go to the workspace parameter `partial`.
pub(crate) fn gemm(
    s: &Site,
    template: &'static str,
    mut ctx: Context,
    (gm, gn, gk): (usize, usize, usize),
    (a_k_fastest, b_k_fastest): (bool, bool),
    (needs, partial): (GemmNeeds, &str),
) -> Result<Spec, CodegenError> {
    // cp.async only where every copy is 16 bytes: no operand's tile is k-fastest
    let needs = GemmNeeds {
        wide_copies: !a_k_fastest && !b_k_fastest,
        b_k_fastest,
        ..needs
    };
    let g = choose(gm, gn, gk, &needs, s.opts);
    let (t, split) = (g.tile, g.split);
    let ks = g.ks();
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
    ctx.insert("pipelined", &g.pipelined);
    ctx.insert("stages", &g.stages);
    ctx.insert("tf32", &g.tf32);
    ctx.insert("mpw", &t.mma_per_warp().unwrap_or(0));
    ctx.insert("min_blocks", &g.min_blocks);
    let (sa, sb) = t.staged();
    ctx.insert("stage_a", &sa);
    ctx.insert("stage_b", &sb);
    // pipelined: a thread's fragments read as float4 / float2 from shared memory
    let (va, vb) = if g.pipelined { t.frag_width() } else { (1, 1) };
    ctx.insert("vec_a", &va);
    ctx.insert("vec_b", &vb);
    // A's rows padded (bank conflicts); by 4 floats for float4 fragments or 16-byte copies
    ctx.insert("a_pad", &if va == 4 || g.stages > 1 { 4 } else { 1 });
    ctx.insert("vec_ga", &g.vec_a);
    ctx.insert("vec_gb", &g.vec_b);
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
    // the fused bias gradient's two-level order: chunks of BIAS_CHUNK_ROWS rows of the reduction
    ctx.insert("bias_rc", &BIAS_CHUNK_ROWS);
    ctx.insert("bias_chunks", &bias_chunks(gk));
    ctx.insert("skinny", "");
    if g.kind != GemmKind::Tiled {
        // a skinny kernel: its loads' widths as the operands allow (its tile is its block's outputs)
        super::skinny::insert_ctx(&mut ctx, &g);
        ctx.insert("vec_ga", &g.vec_a);
        ctx.insert("vec_gb", &g.vec_b);
    }
    let gy = gn.div_ceil(t.bn as usize).max(1);
    if gy > 65535 {
        return Err(CodegenError::Grid {
            kernel: s.name().into(),
            message: format!("{gn} GEMM columns"),
        });
    }
    let grid = [blocks(gm, t.bm, s.name())?, gy as u32, split as u32];
    Ok(Spec {
        template,
        ctx,
        grid,
        block: [g.threads(), 1, 1],
        split,
        outputs: gm * gn,
        gemm: Some(g),
        passes: Vec::new(),
        program: Vec::new(),
        ranked: false,
    })
}
