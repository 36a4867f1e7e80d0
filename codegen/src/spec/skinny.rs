//! The skinny GEMM kernels (`gemm_skinny.cuh.tera`), for the GEMMs whose shared-memory tiles waste
//! most of a block: a batch-1 layer's few rows against a large weight, and a weight gradient's
//! short reduction over a few pixels. Both stream their large operand once, in 128-bit loads
//! several in flight per thread, with nothing staged through shared memory but the small one.
//!
//! - [`GemmKind::Rows`] (`gm` <= [`ROWS_MAX`]): a block takes A's rows of its k range into shared
//!   memory once, then each thread streams float4s of B straight into registers and multiplies
//!   them by every row (B along n: a warp reads 512 contiguous bytes of one k row, the block's 8
//!   warps interleave their k rows and add their sums in a fixed tree; B along k, a data
//!   gradient's flipped weight: 8 lanes read 32 consecutive k of one column, 4 columns a warp,
//!   the 8 lanes' sums added in lane order). A split's k ranges go to the planned workspace and
//!   the split-K reduction, as the tiled kernel's.
//! - [`GemmKind::Outer`] (`gk` <= [`OUTER_K_MAX`]): each thread holds its column of B (the short
//!   reduction) in registers and walks [`OUTER_ROWS`] rows of A from shared memory, storing (or
//!   updating) one output per row: coalesced along n, several rows' loads in flight. Its sums are
//!   the tiled kernel's, in the same k order (an unsplit short reduction), so choosing it changes
//!   no bit; the fused bias is the same column sum.
//!
//! The performance model prices both as streaming kernels (`perf::skinny`); the compiler takes one
//! where the model says it is faster than every tiled candidate (`spec::gemm::choose`).

use tera::Context;

use super::gemm::{effective_split, GemmGeom, GemmKind, GemmNeeds, GemmTile};

/// Most rows of a [`GemmKind::Rows`] GEMM (its threads hold a float4 of every row).
pub const ROWS_MAX: usize = 16;
/// Longest reduction of a [`GemmKind::Outer`] GEMM (each thread holds its column of B).
pub const OUTER_K_MAX: usize = 16;
/// Threads of a skinny block (8 warps).
pub const THREADS: u32 = 256;
/// A rows kernel's split k ranges are whole multiples of this (float4s along k stay aligned).
pub const ROWS_UNIT: u32 = 32;
/// float4 loads of B each thread of a rows kernel keeps in flight.
pub const UNROLL: u32 = 4;
/// Rows of C an outer block walks (each thread one column of them).
pub const OUTER_ROWS: u32 = 32;
/// Rows an outer thread's loop unrolls (their updates' loads in flight together).
pub const OUTER_UNROLL: u32 = 8;
/// Shared memory a skinny block declares at most (floats; 40 KiB).
pub const SMEM_FLOATS: usize = 10 * 1024;

/// Columns of C a skinny block covers (its tile's `bn`; `bm` is its rows: all `gm` of a rows
/// kernel, [`OUTER_ROWS`] of an outer one, so the tiled kernel's grid is a skinny kernel's too): a
/// rows kernel's lanes along n take a float4 each (128 or 64 columns: 8 or 16 k rows in flight per
/// block), along k a warp takes 4 columns (32); an outer block one column per thread.
pub fn block_cols(g: &GemmGeom) -> usize {
    g.tile.bn as usize
}

/// The column widths a rows kernel may take (B along n; along k it is always 32).
pub const ROWS_COLS: [u32; 2] = [128, 64];

/// `n` rounded up to a multiple of 4.
fn four(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// Shared memory of a skinny kernel, floats: a rows kernel's A rows of its k range (k-major along
/// n, row-major with 4 floats of padding along k) or the warps' partial sums after them, whichever
/// is larger; an outer kernel's A rows.
pub fn smem_floats(g: &GemmGeom) -> usize {
    let ks = four(g.ks());
    match (g.kind, g.b_k_fastest) {
        // the tree's first level: half the k groups' float4s of every row
        (GemmKind::Rows, false) => (ks * g.gm).max(2 * THREADS as usize * g.gm),
        (GemmKind::Rows, true) => (g.gm * (ks + 4)).max(g.gm * THREADS as usize),
        _ => OUTER_ROWS as usize * four(g.gk),
    }
}

/// Registers a skinny kernel takes (the model's estimate before NVRTC reports them): its
/// accumulators, its loads in flight and fragments, and a fixed overhead.
pub fn registers(g: &GemmGeom, update: bool) -> u32 {
    let (gm, gk, u) = (g.gm as u32, g.gk as u32, UNROLL);
    match (g.kind, g.b_k_fastest) {
        (GemmKind::Rows, false) => (4 * gm + 4 * u + gm + 24).min(128),
        (GemmKind::Rows, true) => gm + 4 * u + 4 + 24,
        _ => gk + 2 * OUTER_UNROLL + 24 + if update { 24 } else { 0 },
    }
}

/// The skinny candidates of a GEMM: every split of a rows kernel that the workspace allows and
/// whose A rows fit its shared memory, or the outer kernel; none where the operands do not allow
/// them (groups, TF32, a fused bias's chunked k ranges, B not loadable as float4s for rows).
pub fn candidates(base: &GemmGeom, n: &GemmNeeds, max_split: usize) -> Vec<GemmGeom> {
    let mut out = Vec::new();
    if n.groups > 1 || base.tf32 {
        return out;
    }
    let plain = GemmGeom {
        pipelined: true,
        stages: 0,
        min_blocks: 2,
        vec_a: n.vec_a,
        vec_b: n.vec_b,
        ..*base
    };
    if base.gm >= 1 && base.gm <= ROWS_MAX && n.vec_b && n.k_unit == 0 && base.gk > 0 {
        let widths: &[u32] = if n.b_k_fastest { &[32] } else { &ROWS_COLS };
        for &cols in widths {
            let tile = GemmTile {
                bm: base.gm as u32,
                bn: cols,
                bk: ROWS_UNIT,
                tm: 1,
                tn: 1,
            };
            let mut last = 0;
            for s in 1..=max_split.max(1) {
                let split = effective_split(base.gk, s, ROWS_UNIT);
                if split == last {
                    continue;
                }
                last = split;
                let g = GemmGeom {
                    kind: GemmKind::Rows,
                    split,
                    tile,
                    ..plain
                };
                if smem_floats(&g) <= SMEM_FLOATS {
                    out.push(g);
                }
            }
        }
    }
    if base.gk >= 1 && base.gk <= OUTER_K_MAX {
        out.push(GemmGeom {
            kind: GemmKind::Outer,
            split: 1,
            tile: GemmTile {
                bm: OUTER_ROWS,
                bn: THREADS,
                bk: base.gk as u32,
                tm: 1,
                tn: 1,
            },
            ..plain
        });
    }
    out
}

/// The template context of a skinny GEMM (besides the tiled kernel's common entries).
pub fn insert_ctx(ctx: &mut Context, g: &GemmGeom) {
    ctx.insert("skinny", g.kind.name());
    ctx.insert("sk_threads", &THREADS);
    ctx.insert("sk_cols", &block_cols(g));
    // a rows kernel along n: float4 column groups, and the k groups that share them
    ctx.insert("sk_cg", &(block_cols(g) / 4));
    ctx.insert(
        "sk_groups",
        &(THREADS as usize / (block_cols(g) / 4).max(1)),
    );
    ctx.insert("sk_smem", &smem_floats(g));
    ctx.insert("sk_unroll", &UNROLL);
    ctx.insert("sk_rows", &OUTER_ROWS);
    ctx.insert("sk_rows_unroll", &OUTER_UNROLL);
    ctx.insert("sk_gk4", &four(g.gk));
    // A's rows as float4s of shared memory (rows kernels along n: a k row of GM floats)
    ctx.insert("sk_m4", &g.gm.is_multiple_of(4));
    ctx.insert("sk_ks4", &four(g.ks()));
}
