//! The sequence family (`seq.cu.tera`): the token embedding (one thread per output element), its
//! backward (one block per few table rows, summed in shared memory over the tokens in order: no
//! atomics), the position embedding (one thread per element), and FlashAttention's forward and
//! backward over tiles of [`ATTN_TILE`] queries and keys, with [`ATTN_THREADS`] threads a block:
//!
//! * the forward is one block per (query tile, head, sample): per key tile, in order, the scores
//!   (a 4 x 4 micro-tile per thread, the head's columns staged in chunks), the online softmax's
//!   row statistics in shared memory, and `o += p v` into registers (4 rows x `OC` columns a
//!   thread); then `o` and `lse`;
//! * the backward is three entries: `delta` (one thread per query row), then one block per key
//!   tile for dk and dv (the query tiles in order), then one block per query tile for dq (the key
//!   tiles in order), each recomputing `p` and `dp` from `lse`. Every element is summed by one
//!   thread in a fixed order, so results are deterministic.

use tera::Context;

use super::common::{blocks, numel, per_element, Pass, Site, Spec};
use crate::error::CodegenError;
use crate::kernel::c_ident;
use dmc_plan::op::{SeqOp, ATTN_TILE};

const TEMPLATE: &str = "seq.cu.tera";

/// Threads of an attention block: a 16 x 16 grid over the 64 x 64 score tile.
pub const ATTN_THREADS: u32 = 256;
// the template's thread grid: 16 x 16 threads, each 4 rows and 4 columns of a 64 x 64 tile
const _: () = assert!(ATTN_TILE == 64 && ATTN_THREADS == 256);

/// Threads of an embedding backward block, and the token chunk it scans at a time.
const EMB_THREADS: u32 = 256;
/// Floats of an embedding backward block's sums in shared memory (32 KiB): [`EMB_ROWS`] table
/// rows or fewer, of at most [`EMB_COLS`] columns.
const EMB_SUMS: usize = 8192;
/// The most table rows and columns an embedding backward block sums.
pub const EMB_ROWS: usize = 64;
pub const EMB_COLS: usize = 2048;

/// The geometry of an attention kernel: `qkv [b, t, 3d]`, `heads` heads of `dh` columns, and the
/// staging sizes of its template (in floats and rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnGeom {
    pub b: usize,
    pub t: usize,
    pub d: usize,
    pub heads: usize,
    pub dh: usize,
    pub causal: bool,
    pub bwd: bool,
}

impl AttnGeom {
    /// The geometry of `op` (an attention op) on `qkv`'s shape; `None` for other ops or shapes.
    pub fn of(op: &SeqOp, qkv: &[usize]) -> Option<AttnGeom> {
        let (heads, causal, bwd) = match *op {
            SeqOp::Attention { heads, causal } => (heads, causal, false),
            SeqOp::AttentionBwd { heads, causal } => (heads, causal, true),
            _ => return None,
        };
        let &[b, t, c3] = qkv else { return None };
        if heads == 0
            || t == 0
            || c3 == 0
            || !c3.is_multiple_of(3)
            || !(c3 / 3).is_multiple_of(heads)
        {
            return None;
        }
        let d = c3 / 3;
        Some(AttnGeom {
            b,
            t,
            d,
            heads,
            dh: d / heads,
            causal,
            bwd,
        })
    }

    /// Head columns per staged chunk of the score products: at most 32 in the forward (a query
    /// and a key chunk staged), 16 in the backward (query, key, `do` and value chunks), the
    /// chunks of a head as even as can be.
    pub fn kc(&self) -> usize {
        let most = if self.bwd { 16 } else { 32 };
        self.dh.div_ceil(self.dh.div_ceil(most))
    }

    /// Output columns a thread accumulates: its 16-column stride over the head's columns.
    pub fn oc(&self) -> usize {
        self.dh.div_ceil(16)
    }

    /// Floats of the staging buffer: the score products' chunks (each `ATTN_TILE` rows of
    /// `kc + 1`, padded against bank conflicts), at least one row of a head.
    pub fn buf(&self) -> usize {
        let chunks = if self.bwd { 4 } else { 2 };
        (chunks * ATTN_TILE * (self.kc() + 1)).max(self.dh)
    }

    /// Rows of a head (values, keys, queries or `do`) staged at a time for the `p v`-shaped
    /// products: the largest power of two up to `ATTN_TILE` that fits the staging buffer.
    pub fn rc(&self) -> usize {
        let fit = (self.buf() / self.dh).clamp(1, ATTN_TILE);
        1 << fit.ilog2()
    }

    /// Registers a thread of the busiest entry needs (the forward's, or the backward's dk and dv
    /// pass): its accumulators (4 rows of `OC` head columns; two sets, dk and dv, in the
    /// backward), the 4 x 4 scores (and dp), plus what NVRTC adds for sm_80 and sm_90 (fitted to
    /// its counts for heads of 4 to 256 columns, unconstrained).
    pub fn registers(&self) -> u32 {
        let oc = self.oc() as u32;
        if self.bwd {
            8 * oc + 88
        } else {
            4 * oc + 72
        }
    }

    /// The launch bounds' minimum blocks per SM: as many as leave each thread the registers it
    /// needs ([`AttnGeom::registers`], with an eighth to spare), so that NVRTC neither spills nor
    /// takes registers it does not need.
    pub fn min_blocks(&self) -> u32 {
        let need = self.registers() + self.registers() / 8;
        (65536 / ATTN_THREADS / need).clamp(1, 4)
    }

    /// Query (key) tiles of the sequence.
    pub fn tiles(&self) -> usize {
        self.t.div_ceil(ATTN_TILE)
    }

    /// Static shared memory of a block of the tiled entries, bytes: the score tile, the staging
    /// buffer and the per-row statistics.
    pub fn shared_bytes(&self) -> u32 {
        let tile = ATTN_TILE * (ATTN_TILE + 1);
        let stats = if self.bwd {
            2 * ATTN_TILE
        } else {
            4 * ATTN_TILE + 8 * ATTN_TILE
        };
        ((tile + self.buf() + stats) * 4) as u32
    }
}

/// A launch of `grid` blocks of `threads` from `template`.
fn blocked(s: &Site, template: &'static str, grid: [u32; 3], threads: u32) -> Spec {
    let mut ctx = Context::new();
    ctx.insert("kind", s.kind());
    ctx.insert("threads", &threads);
    Spec {
        template,
        ctx,
        grid,
        block: [threads, 1, 1],
        split: 1,
        outputs: 0,
        gemm: None,
        passes: Vec::new(),
        program: Vec::new(),
        ranked: false,
    }
}

fn shape_err(s: &Site, message: String) -> CodegenError {
    CodegenError::Shape {
        kernel: s.name().into(),
        message,
    }
}

/// A grid dimension of `n` blocks, checked against CUDA's limit `max`.
fn dim(s: &Site, n: usize, max: usize, what: &str) -> Result<u32, CodegenError> {
    if n == 0 || n > max {
        return Err(CodegenError::Grid {
            kernel: s.name().into(),
            message: format!("{n} {what}"),
        });
    }
    Ok(n as u32)
}

/// The attention forward or backward kernel of `g`.
fn attention(s: &Site, g: AttnGeom) -> Result<Spec, CodegenError> {
    // one block per (tile, head, sample), the tiles of a head adjacent
    let grid = [
        dim(s, g.tiles() * g.heads * g.b, i32::MAX as usize, "tiles")?,
        1,
        1,
    ];
    let mut sp = if g.bwd {
        // the delta pass: one thread per query row of every head
        let rows = g.b * g.heads * g.t;
        let mut sp = blocked(
            s,
            TEMPLATE,
            [blocks(rows, ATTN_THREADS, s.name())?, 1, 1],
            ATTN_THREADS,
        );
        let block = [ATTN_THREADS, 1, 1];
        sp.passes = vec![
            Pass {
                suffix: "dkv",
                grid,
                block,
            },
            Pass {
                suffix: "dq",
                grid,
                block,
            },
        ];
        sp
    } else {
        blocked(s, TEMPLATE, grid, ATTN_THREADS)
    };
    let c = &mut sp.ctx;
    c.insert("b", &g.b);
    c.insert("t", &g.t);
    c.insert("d", &g.d);
    c.insert("heads", &g.heads);
    c.insert("dh", &g.dh);
    c.insert("causal", &g.causal);
    c.insert("tile", &ATTN_TILE);
    c.insert("tiles", &g.tiles());
    c.insert("kc", &g.kc());
    c.insert("oc", &g.oc());
    c.insert("rc", &g.rc());
    c.insert("buf", &g.buf());
    c.insert("min_blocks", &g.min_blocks());
    c.insert("dout", &c_ident("do"));
    Ok(sp)
}

/// The kernel of one op of the sequence family.
pub(crate) fn spec(s: &Site, op: &SeqOp) -> Result<Spec, CodegenError> {
    match op {
        SeqOp::Embedding => {
            let n = numel(s.shape(0)?);
            let table = s.shape(1)?;
            s.rank(table, 2, "table")?;
            let (v, d) = (table[0], table[1]);
            let mut sp = per_element(s, TEMPLATE, n * d)?;
            sp.ctx.insert("tokens", &n);
            sp.ctx.insert("d", &d);
            sp.ctx.insert("vocab", &v);
            Ok(sp)
        }
        SeqOp::EmbeddingBwd { vocab } => {
            let n = numel(s.shape(0)?);
            let d = s.shape(1)?.last().copied().unwrap_or(0);
            let dt = s.shape(2)?;
            if dt != [*vocab, d] || d == 0 {
                return Err(shape_err(
                    s,
                    format!(
                        "dtable {dt:?} must be [{vocab}, {d}] (the vocabulary, dy's last axis)"
                    ),
                ));
            }
            let cols = d.min(EMB_COLS);
            let rows = (EMB_SUMS / cols).clamp(1, EMB_ROWS);
            let col_blocks = d.div_ceil(cols);
            if col_blocks > 65535 {
                return Err(CodegenError::Grid {
                    kernel: s.name().into(),
                    message: format!("{d} columns"),
                });
            }
            let grid = [blocks(*vocab, rows as u32, s.name())?, col_blocks as u32, 1];
            let mut sp = blocked(s, TEMPLATE, grid, EMB_THREADS);
            sp.ctx.insert("tokens", &n);
            sp.ctx.insert("d", &d);
            sp.ctx.insert("vocab", vocab);
            sp.ctx.insert("rows", &rows);
            sp.ctx.insert("cols", &cols);
            Ok(sp)
        }
        SeqOp::AddPositions => {
            let n = numel(s.shape(0)?);
            let p = numel(s.shape(1)?);
            if p == 0 || !n.is_multiple_of(p) {
                return Err(shape_err(s, format!("{p} positions do not divide {n}")));
            }
            let mut sp = per_element(s, TEMPLATE, n)?;
            sp.ctx.insert("p", &p);
            Ok(sp)
        }
        SeqOp::Transpose => {
            let x = s.shape(0)?;
            let &[rows, cols] = x else {
                return Err(shape_err(s, format!("x {x:?} must be a matrix")));
            };
            let mut sp = per_element(s, TEMPLATE, rows * cols)?;
            sp.ctx.insert("rows", &rows);
            sp.ctx.insert("cols", &cols);
            Ok(sp)
        }
        SeqOp::Attention { .. } | SeqOp::AttentionBwd { .. } => {
            let qkv = s.shape(0)?;
            let g = AttnGeom::of(op, qkv).ok_or_else(|| {
                shape_err(
                    s,
                    format!("qkv {qkv:?} must be [batch, T, 3 D] with D a multiple of the heads"),
                )
            })?;
            attention(s, g)
        }
    }
}

/// The zoo's sequence ops: embeddings with repeated tokens (a vocabulary of 3), with more tokens
/// than a block scans at once and more table rows than a block sums, and with more columns than a
/// block sums; positions; attention
/// forward and backward, causal and not, over 5 positions (a partial tile) and 70 (a full and a
/// partial tile), 2 heads of 4, 8 and 20 columns (a head in two chunks of the backward).
pub(crate) fn zoo() -> Vec<super::cases::Case> {
    use dmc_plan::op::Op;
    let q = |op: SeqOp| Op::Seq(op);
    let mut v = vec![
        (
            q(SeqOp::Embedding),
            vec![vec![2, 5], vec![11, 7], vec![2, 5, 7]],
        ),
        (
            q(SeqOp::EmbeddingBwd { vocab: 3 }),
            vec![vec![2, 5], vec![2, 5, 7], vec![3, 7]],
        ),
        (
            q(SeqOp::EmbeddingBwd { vocab: 70 }),
            vec![vec![3, 100], vec![3, 100, 5], vec![70, 5]],
        ),
        (
            q(SeqOp::EmbeddingBwd { vocab: 9 }),
            vec![vec![2, 5], vec![2, 5, 2050], vec![9, 2050]],
        ),
        (
            q(SeqOp::AddPositions),
            vec![vec![3, 5, 7], vec![5, 7], vec![3, 5, 7]],
        ),
        (q(SeqOp::Transpose), vec![vec![5, 7], vec![7, 5]]),
    ];
    // (batch, T, D), 2 heads
    for (causal, (b, t, d)) in [
        (false, (2, 5, 8)),
        (true, (1, 70, 16)),
        (true, (2, 5, 40)),
        (false, (1, 70, 16)),
    ] {
        let heads = 2;
        let qkv = vec![b, t, 3 * d];
        let o = vec![b, t, d];
        let lse = vec![b, heads, t];
        v.push((
            q(SeqOp::Attention { heads, causal }),
            vec![qkv.clone(), o.clone(), lse.clone()],
        ));
        v.push((
            q(SeqOp::AttentionBwd { heads, causal }),
            vec![qkv.clone(), o.clone(), lse, o, qkv],
        ));
    }
    v
}
