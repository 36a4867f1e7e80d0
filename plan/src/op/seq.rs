//! The sequence family: token embeddings, learned position embeddings and fused multi-head
//! self-attention, for transformers over `[batch, T, D]` values.
//!
//! Attention never holds the `T x T` score matrix: the forward runs an online softmax over tiles
//! of keys (FlashAttention's), keeping one log-sum-exp per query row; the backward recomputes the
//! scores tile by tile from it. So its saved activations are O(T * D) per layer: the packed
//! projections `qkv`, the output `o` and `lse`.
//!
//! Layout. `qkv` is `[B, T, 3D]`: a row holds every head's query, then every head's key, then
//! every head's value; head `h` of `H` reads columns `h*dh .. (h+1)*dh` of each third (`dh = D /
//! H`), as PyTorch's `nn.MultiheadAttention` splits its packed `in_proj`. `o` is `[B, T, D]` with
//! the heads side by side (the input of the output projection), `lse` `[B, H, T]`.

use serde::{Deserialize, Serialize};

use super::facts::{p, DType, OpFacts, ParamKind, Role, ShapeError, TensorType};
use super::shape::{err, numel, same};

/// Query rows and key columns of one tile of the attention kernels' scores (CPU and CUDA): the
/// online softmax folds the keys in tiles of this many, in order.
pub const ATTN_TILE: usize = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SeqOp {
    /// tokens i32\[..\], table\[V, D\] -> y\[.., D\] = table\[token\] (a token outside `0..V` gives a
    /// row of zeros; the runtime refuses such inputs before a step).
    Embedding,
    /// tokens i32\[..\], dy\[.., D\] -> dtable\[vocab, D\]: row v = sum of dy over the positions whose
    /// token is v, added in position order (deterministic on every backend).
    EmbeddingBwd { vocab: usize },
    /// x\[B, ..\], p\[..\] -> y = x + p for each of the B samples (learned position embeddings: p is
    /// `[T, D]` for x `[B, T, D]`). Its gradients are dy (x) and the sum of dy over the batch (p:
    /// a bias gradient of dy viewed as `[B, T*D]`).
    AddPositions,
    /// qkv\[B, T, 3D\] -> o\[B, T, D\], lse\[B, H, T\]: per head, o = softmax(q k^T / sqrt(dh)) v over
    /// the keys `j <= i` when `causal` (else all), lse = the row's log-sum-exp of the scaled scores.
    Attention { heads: usize, causal: bool },
    /// qkv, o, lse, do\[B, T, D\] -> dqkv\[B, T, 3D\], with the workspace `delta` \[B, H, T\] (per
    /// query row, sum(do * o) over its head's columns). With p = exp(s - lse) recomputed:
    /// dv = p^T do, dp = do v^T, ds = p (dp - delta), dq = ds k / sqrt(dh), dk = ds^T q / sqrt(dh).
    AttentionBwd { heads: usize, causal: bool },
    /// x\[R, C\] -> y\[C, R\] = x^T: a tied output head reads the embedding's table `[V, D]` as a
    /// dense weight `[D, V]`; its own VJP (dx = dy^T).
    Transpose,
}

/// `(B, T, D)` of a `qkv` value `[B, T, 3D]` for `heads` heads, or an error.
pub fn attention_dims(qkv: &TensorType, heads: usize) -> Result<(usize, usize, usize), ShapeError> {
    let &[b, t, c3] = qkv.shape.as_slice() else {
        return err(format!("qkv must be [batch, T, 3 * D], got {qkv}"));
    };
    if heads == 0 || c3 == 0 || c3 % 3 != 0 || (c3 / 3) % heads != 0 {
        return err(format!(
            "qkv {qkv}: its last axis must be 3 * D with D a multiple of the {heads} heads"
        ));
    }
    Ok((b, t, c3 / 3))
}

/// Query-key pairs one head scores: `T * T`, or `T (T + 1) / 2` with a causal mask.
pub fn attention_pairs(t: usize, causal: bool) -> u64 {
    let t = t as u64;
    if causal {
        t * (t + 1) / 2
    } else {
        t * t
    }
}

impl OpFacts for SeqOp {
    fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        match self {
            SeqOp::Embedding => vec![p("tokens", In, I32), p("table", In, F32), p("y", Out, F32)],
            SeqOp::EmbeddingBwd { .. } => {
                vec![
                    p("tokens", In, I32),
                    p("dy", In, F32),
                    p("dtable", Out, F32),
                ]
            }
            SeqOp::AddPositions => vec![p("x", In, F32), p("p", In, F32), p("y", Out, F32)],
            SeqOp::Transpose => vec![p("x", In, F32), p("y", Out, F32)],
            SeqOp::Attention { .. } => {
                vec![p("qkv", In, F32), p("o", Out, F32), p("lse", Out, F32)]
            }
            SeqOp::AttentionBwd { .. } => vec![
                p("qkv", In, F32),
                p("o", In, F32),
                p("lse", In, F32),
                p("do", In, F32),
                p("dqkv", Out, F32),
                p("delta", Workspace, F32),
            ],
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            SeqOp::Embedding => "embedding",
            SeqOp::EmbeddingBwd { .. } => "embedding_bwd",
            SeqOp::AddPositions => "add_positions",
            SeqOp::Transpose => "transpose",
            SeqOp::Attention { causal: true, .. } => "attention_causal",
            SeqOp::Attention { causal: false, .. } => "attention",
            SeqOp::AttentionBwd { causal: true, .. } => "attention_causal_bwd",
            SeqOp::AttentionBwd { causal: false, .. } => "attention_bwd",
        }
    }

    fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        vec![]
    }

    fn workspace_elems(&self, s: &[Vec<usize>]) -> Vec<usize> {
        match self {
            SeqOp::AttentionBwd { .. } => {
                // one per row of lse: [B, H, T]
                vec![s.get(2).map(|l| numel(l) as usize).unwrap_or(0)]
            }
            SeqOp::Embedding
            | SeqOp::EmbeddingBwd { .. }
            | SeqOp::AddPositions
            | SeqOp::Transpose
            | SeqOp::Attention { .. } => vec![],
        }
    }

    fn infer(
        &self,
        inputs: &[TensorType],
        hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError> {
        let f = TensorType::f32;
        match self {
            SeqOp::Embedding => {
                let (tok, table) = (&inputs[0], &inputs[1]);
                let &[v, d] = table.shape.as_slice() else {
                    return err(format!("table must be [vocab, dim], got {table}"));
                };
                if tok.shape.is_empty() || v == 0 || d == 0 {
                    return err(format!("tokens {tok} and table {table}: empty"));
                }
                let mut y = tok.shape.clone();
                y.push(d);
                Ok(vec![f(y)])
            }
            SeqOp::EmbeddingBwd { vocab } => {
                let (tok, dy) = (&inputs[0], &inputs[1]);
                if dy.shape.len() != tok.shape.len() + 1 || dy.shape[..tok.shape.len()] != tok.shape
                {
                    return err(format!("dy {dy} must be the tokens' shape {tok} and a dim"));
                }
                let d = dy.shape.last().copied().unwrap_or(0);
                if *vocab == 0 || d == 0 {
                    return err("embedding_bwd: empty table");
                }
                let out = f(vec![*vocab, d]);
                if let Some(h) = hint {
                    if *h != out {
                        return err(format!("dtable must be {out}, got {h}"));
                    }
                }
                Ok(vec![out])
            }
            SeqOp::AddPositions => {
                let (x, pos) = (&inputs[0], &inputs[1]);
                if x.shape.len() < 2 || x.shape[1..] != pos.shape {
                    return err(format!("p {pos} must be x's shape {x} without its batch"));
                }
                Ok(vec![x.clone()])
            }
            SeqOp::Transpose => {
                let &[r, c] = inputs[0].shape.as_slice() else {
                    return err(format!(
                        "x must be a matrix [rows, cols], got {}",
                        inputs[0]
                    ));
                };
                Ok(vec![f(vec![c, r])])
            }
            SeqOp::Attention { heads, .. } => {
                let (b, t, d) = attention_dims(&inputs[0], *heads)?;
                Ok(vec![f(vec![b, t, d]), f(vec![b, *heads, t])])
            }
            SeqOp::AttentionBwd { heads, .. } => {
                let (qkv, o, lse, dout) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
                let (b, t, d) = attention_dims(qkv, *heads)?;
                if o.shape != [b, t, d] {
                    return err(format!("o {o} must be [{b}, {t}, {d}]"));
                }
                same(o, dout, "o and do")?;
                if lse.shape != [b, *heads, t] {
                    return err(format!("lse {lse} must be [{b}, {heads}, {t}]"));
                }
                Ok(vec![qkv.clone()])
            }
        }
    }

    fn flops(&self, ins: &[Vec<usize>], _outs: &[Vec<usize>]) -> u64 {
        let i = |k: usize| ins.get(k).map(|s| numel(s)).unwrap_or(0);
        match self {
            SeqOp::Embedding | SeqOp::AddPositions => i(1).max(i(0)),
            SeqOp::EmbeddingBwd { .. } => i(1),
            SeqOp::Transpose => i(0),
            SeqOp::Attention { causal, .. } | SeqOp::AttentionBwd { causal, .. } => {
                let s = ins.first().cloned().unwrap_or_default();
                let (b, t, d) = match s.as_slice() {
                    &[b, t, c3] => (b as u64, t, c3 as u64 / 3),
                    _ => return 0,
                };
                // q k^T and p v: 2 multiply-adds per pair and head column; the backward
                // recomputes the scores and has four more products (dv, dp, dq, dk)
                let pairs = attention_pairs(t, *causal);
                let matmuls = if matches!(self, SeqOp::Attention { .. }) {
                    2
                } else {
                    5
                };
                2 * matmuls * b * pairs * d
            }
        }
    }

    /// Embeddings and positions stream their values once; attention is GEMMs of tiles (the
    /// forward 2, the backward 5 per pair of tiles), each `(b, h)` serial on one thread.
    fn cpu_work(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> crate::cpu::CpuWork {
        use crate::cpu::{CpuWork, GemmCalls};
        let el = |s: &[Vec<usize>]| s.iter().map(|s| numel(s)).sum::<u64>();
        match self {
            SeqOp::Embedding
            | SeqOp::EmbeddingBwd { .. }
            | SeqOp::AddPositions
            | SeqOp::Transpose => {
                let skip = usize::from(matches!(self, SeqOp::Embedding));
                CpuWork::stream((el(&ins[skip.min(ins.len())..]) + el(outs)) * 4)
            }
            SeqOp::Attention { heads, causal } | SeqOp::AttentionBwd { heads, causal } => {
                let Some(&[b, t, c3]) = ins.first().map(|s| s.as_slice()) else {
                    return CpuWork::default();
                };
                let dh = c3 / 3 / (*heads).max(1);
                let tiles = t.div_ceil(ATTN_TILE) as u64;
                let tile_pairs = if *causal {
                    tiles * (tiles + 1) / 2
                } else {
                    tiles * tiles
                };
                let heads_total = (b * heads) as u64;
                let m = ATTN_TILE.min(t);
                let gemm = |m, n, k| GemmCalls {
                    m,
                    n,
                    k,
                    calls: tile_pairs * heads_total,
                    outer: heads_total,
                    accumulate: true,
                    per_thread_rows: true,
                    a_t: false,
                    b_t: false,
                };
                let gemms = if matches!(self, SeqOp::Attention { .. }) {
                    vec![gemm(m, m, dh), gemm(m, dh, m)]
                } else {
                    vec![
                        gemm(m, m, dh),
                        gemm(m, m, dh),
                        gemm(m, dh, m),
                        gemm(m, dh, m),
                        gemm(m, dh, m),
                    ]
                };
                let scores = tile_pairs * heads_total * (m * m) as u64;
                CpuWork {
                    gemms,
                    // the row updates of every tile, and its exponentials
                    streamed: scores * 8,
                    loops: 1,
                    ..Default::default()
                }
                .with_special(crate::cpu::Special::AttentionExp, scores)
            }
        }
    }
}
