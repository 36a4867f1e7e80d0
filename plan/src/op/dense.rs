//! The dense (matrix product) family: the forward, both gradients, and the weight gradient fused
//! with its update. Weights are `[K, M]` (inputs x outputs).

use serde::{Deserialize, Serialize};

use super::epilogue::{Epilogue, EpilogueSide};
use super::facts::{p, DType, OpFacts, ParamKind, Role, ShapeError, TensorType};
use super::shape::{err, numel, rank, states_sharded};
use crate::update::UpdateRule;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DenseOp {
    /// x\[N,K\], w\[K,M\], (b\[M\] if bias), (r\[N,M\] if `epi.add`) -> y\[N,M\] = epi.act(x w + b + r)
    /// ([`Epilogue`], forward side).
    Dense {
        bias: bool,
        #[serde(default, skip_serializing_if = "Epilogue::is_none")]
        epi: Epilogue,
    },
    /// dy\[N,M\], w\[K,M\], (g\[N,K\] if `epi.add`), (saved\[N,K\] if `epi.act`) -> dx\[N,K\] =
    /// epi.act'(saved) * (dy w^T + g)
    DenseBwdData {
        #[serde(default, skip_serializing_if = "Epilogue::is_none")]
        epi: Epilogue,
    },
    /// x\[N,K\], dy\[N,M\] -> dw\[K,M\] = x^T dy
    DenseBwdWeight,
    /// x\[N,K\], dy\[N,M\], w\[K,M\] (InOut), state.. (InOut) -> w', state'..; gradient in blocks of
    /// `chunk` columns into the workspace `gw` [K x chunk], each block updated at once.
    /// With `bias` (fused in by `fuse_epilogues`): b\[M\] (InOut) and its state (InOut,
    /// [`UpdateRule::bias_state_names`]) follow the weight's state, and a second workspace `db`
    /// \[M\] receives db = sum of dy over the batch before b's update.
    /// With `shards` > 1 (data parallel, [`crate::shard`]): the weight's state inputs are this
    /// rank's rows of w `[K, M]`, the bias' its elements of b; each block's gradient is summed
    /// over the ranks on this rank's rows (the peers' parts received into the last workspace,
    /// `comm`), those rows updated, and every rank's updated rows gathered into w at the end (db
    /// and b alike).
    DenseBwdWeightUpdate {
        rule: UpdateRule,
        chunk: usize,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        bias: bool,
        #[serde(
            default = "crate::shard::one",
            skip_serializing_if = "crate::shard::is_one"
        )]
        shards: usize,
        /// Sharded parameters (ZeRO-3, [`crate::shard`]): the updated tensor is a window of
        /// which only this rank's rows are kept (`KeepShard`), so the step gathers no other
        /// rank's rows into it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        keep_rows: bool,
    },
}

/// Elements of a sharded fused update's `comm` workspace (a weight-gradient + update of `shards`
/// ranks, [`crate::shard`]): the peers' parts of this rank's rows of a `[k, chunk]` gradient block
/// and, with a bias of `m` columns, of its elements of db.
pub fn comm_elems(k: usize, chunk: usize, bias: bool, m: usize, shards: usize) -> usize {
    let w = crate::shard::max_rows(k, shards) * chunk;
    if bias {
        w.max(crate::shard::max_rows(m, shards))
    } else {
        w
    }
}

impl DenseOp {
    /// Signature slot of the forward's output `y` (after x, w, b, r).
    pub fn y_slot(bias: bool, epi: &Epilogue) -> usize {
        2 + bias as usize + epi.num_inputs(EpilogueSide::Forward)
    }
}

impl OpFacts for DenseOp {
    fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        match self {
            DenseOp::Dense { bias, epi } => {
                let mut v = vec![p("x", In, F32), p("w", In, F32)];
                if *bias {
                    v.push(p("b", In, F32));
                }
                v.extend(epi.params(EpilogueSide::Forward));
                v.push(p("y", Out, F32));
                v
            }
            DenseOp::DenseBwdData { epi } => {
                let mut v = vec![p("dy", In, F32), p("w", In, F32)];
                v.extend(epi.params(EpilogueSide::DataGradient));
                v.push(p("dx", Out, F32));
                v
            }
            DenseOp::DenseBwdWeight => vec![p("x", In, F32), p("dy", In, F32), p("dw", Out, F32)],
            DenseOp::DenseBwdWeightUpdate {
                rule, bias, shards, ..
            } => {
                let mut v = vec![p("x", In, F32), p("dy", In, F32), p("w", InOut, F32)];
                v.extend(rule.state_names().iter().map(|s| p(s, InOut, F32)));
                if *bias {
                    v.push(p("b", InOut, F32));
                    v.extend(rule.bias_state_names().iter().map(|s| p(s, InOut, F32)));
                }
                v.push(p("gw", Workspace, F32));
                if *bias {
                    v.push(p("db", Workspace, F32));
                }
                if *shards > 1 {
                    v.push(p("comm", Workspace, F32));
                }
                v
            }
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            DenseOp::Dense { .. } => "dense",
            DenseOp::DenseBwdData { .. } => "dense_bwd_data",
            DenseOp::DenseBwdWeight => "dense_bwd_weight",
            DenseOp::DenseBwdWeightUpdate { .. } => "dense_bwd_weight_update",
        }
    }

    fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        match self {
            DenseOp::Dense { .. } | DenseOp::DenseBwdData { .. } | DenseOp::DenseBwdWeight => {
                vec![]
            }
            DenseOp::DenseBwdWeightUpdate { rule, bias, .. } => {
                let n = (1 + rule.state_names().len()) * (1 + *bias as usize);
                (0..n).map(|o| (o, o + 2)).collect()
            }
        }
    }

    fn workspace_elems(&self, s: &[Vec<usize>]) -> Vec<usize> {
        match self {
            DenseOp::Dense { .. } | DenseOp::DenseBwdData { .. } | DenseOp::DenseBwdWeight => {
                vec![]
            }
            DenseOp::DenseBwdWeightUpdate {
                chunk,
                bias,
                shards,
                ..
            } => {
                let k = s.get(2).and_then(|w| w.first()).copied().unwrap_or(0);
                let m = s.get(1).and_then(|dy| dy.get(1)).copied().unwrap_or(0);
                let mut v = vec![k * chunk];
                if *bias {
                    v.push(m);
                }
                if *shards > 1 {
                    v.push(comm_elems(k, *chunk, *bias, m, *shards));
                }
                v
            }
        }
    }

    fn infer(
        &self,
        inputs: &[TensorType],
        _hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError> {
        let f = TensorType::f32;
        match self {
            DenseOp::Dense { bias, epi } => {
                let (x, w) = (&inputs[0], &inputs[1]);
                rank(x, 2, "x")?;
                rank(w, 2, "w")?;
                if x.shape[1] != w.shape[0] {
                    return err(format!("x {x} and w {w}: inner dimensions differ"));
                }
                if *bias && inputs[2].shape != [w.shape[1]] {
                    return err(format!("bias {} must be [{}]", inputs[2], w.shape[1]));
                }
                let y = f(vec![x.shape[0], w.shape[1]]);
                epi.check(&y, &inputs[2 + *bias as usize..])?;
                Ok(vec![y])
            }
            DenseOp::DenseBwdData { epi } => {
                let (dy, w) = (&inputs[0], &inputs[1]);
                rank(dy, 2, "dy")?;
                rank(w, 2, "w")?;
                if dy.shape[1] != w.shape[1] {
                    return err(format!("dy {dy} and w {w}: output dimensions differ"));
                }
                let dx = f(vec![dy.shape[0], w.shape[0]]);
                epi.check(&dx, &inputs[2..])?;
                Ok(vec![dx])
            }
            DenseOp::DenseBwdWeight => {
                let (x, dy) = (&inputs[0], &inputs[1]);
                rank(x, 2, "x")?;
                rank(dy, 2, "dy")?;
                if x.shape[0] != dy.shape[0] {
                    return err(format!("x {x} and dy {dy}: batch differs"));
                }
                Ok(vec![f(vec![x.shape[1], dy.shape[1]])])
            }
            DenseOp::DenseBwdWeightUpdate {
                chunk,
                bias,
                rule,
                shards,
                ..
            } => {
                let (x, dy, w) = (&inputs[0], &inputs[1], &inputs[2]);
                rank(x, 2, "x")?;
                rank(dy, 2, "dy")?;
                if x.shape[0] != dy.shape[0] || w.shape != [x.shape[1], dy.shape[1]] {
                    return err(format!("x {x}, dy {dy}, w {w} inconsistent"));
                }
                if *chunk == 0 || *chunk > dy.shape[1] {
                    return err(format!("chunk {chunk} outside 1..={}", dy.shape[1]));
                }
                let ns = rule.state_names().len();
                states_sharded(w, inputs, 3, ns, *shards, dy.shape[1])?;
                if *bias {
                    let b = &inputs[3 + ns];
                    if b.shape != [dy.shape[1]] {
                        return err(format!("bias {b} must be [{}]", dy.shape[1]));
                    }
                    states_sharded(b, inputs, 4 + ns, ns, *shards, 1)?;
                }
                Ok(inputs[2..].to_vec())
            }
        }
    }

    fn flops(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> u64 {
        let i = |k: usize| ins.get(k).map(|s| numel(s)).unwrap_or(0);
        let o = |k: usize| outs.get(k).map(|s| numel(s)).unwrap_or(0);
        match self {
            DenseOp::Dense { bias, epi } => {
                let k = ins.first().and_then(|x| x.get(1)).copied().unwrap_or(0) as u64;
                2 * o(0) * k + if *bias { o(0) } else { 0 } + epi.flops(o(0))
            }
            DenseOp::DenseBwdData { epi } => {
                let k = ins.get(1).and_then(|w| w.first()).copied().unwrap_or(0) as u64;
                2 * i(0) * k + epi.flops(o(0))
            }
            DenseOp::DenseBwdWeight | DenseOp::DenseBwdWeightUpdate { .. } => {
                let k = ins.first().and_then(|x| x.get(1)).copied().unwrap_or(0) as u64;
                let upd = match self {
                    DenseOp::DenseBwdWeightUpdate { bias, rule, .. } => {
                        let b = i(3 + rule.state_names().len());
                        4 * i(2) + if *bias { i(1) + 4 * b } else { 0 }
                    }
                    _ => 0,
                };
                2 * i(1) * k + upd
            }
        }
    }

    /// One CPU GEMM (the fused update: one per block of `chunk` columns, each block then
    /// updated), the bias and epilogue streamed.
    fn cpu_work(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> crate::cpu::CpuWork {
        use crate::cpu::{update_block_work, CpuWork, GemmCalls};
        let el = |s: Option<&Vec<usize>>| s.map(|s| numel(s)).unwrap_or(0) as usize;
        let last = |s: Option<&Vec<usize>>| s.and_then(|s| s.last()).copied().unwrap_or(0);
        let gemm = |m, n, k, calls, accumulate| GemmCalls {
            m,
            n,
            k,
            calls,
            outer: 1,
            accumulate,
            per_thread_rows: false,
            a_t: false,
            b_t: false,
        };
        let mut w = CpuWork::default();
        match self {
            DenseOp::Dense { bias, epi } => {
                let (x, y) = (ins.first(), outs.first());
                let (k, m) = (last(x), last(y));
                let n = el(y) / m.max(1);
                w.gemms.push(gemm(n, m, k, 1, *bias));
                let out = el(y) as u64 * 4;
                w.streamed = if *bias { out } else { 0 }
                    + if epi.is_none() {
                        0
                    } else {
                        out * (2 + epi.add as u64)
                    };
                w.loops = 1 + *bias as u64 + !epi.is_none() as u64;
                w.special
                    .extend(epi.special(EpilogueSide::Forward, el(y) as u64));
            }
            DenseOp::DenseBwdData { epi } => {
                let (dy, dx) = (ins.first(), outs.first());
                let (m, k) = (last(dy), last(dx));
                let n = el(dx) / k.max(1);
                // dx = dy w^T
                w.gemms.push(GemmCalls {
                    b_t: true,
                    ..gemm(n, k, m, 1, false)
                });
                let out = el(dx) as u64 * 4;
                w.streamed = if epi.is_none() {
                    0
                } else {
                    out * (1 + epi.add as u64 + epi.act.is_some() as u64)
                };
                w.loops = 1 + !epi.is_none() as u64;
                w.special
                    .extend(epi.special(EpilogueSide::DataGradient, el(dx) as u64));
            }
            DenseOp::DenseBwdWeight => {
                let (x, dy) = (ins.first(), ins.get(1));
                let (k, m) = (last(x), last(dy));
                let n = el(x) / k.max(1);
                // dw = x^T dy
                w.gemms.push(GemmCalls {
                    a_t: true,
                    ..gemm(k, m, n, 1, false)
                });
                w.loops = 1;
            }
            DenseOp::DenseBwdWeightUpdate {
                rule, chunk, bias, ..
            } => {
                let (x, dy) = (ins.first(), ins.get(1));
                let (k, m) = (last(x), last(dy));
                let n = el(x) / k.max(1);
                let c = (*chunk).clamp(1, m.max(1));
                let states = 1 + rule.state_names().len();
                for (nc, count) in [(c, (m / c) as u64), (m % c, (m % c > 0) as u64)] {
                    if count == 0 || nc == 0 {
                        continue;
                    }
                    w.gemms.push(GemmCalls {
                        a_t: true,
                        ..gemm(k, nc, n, count, false)
                    });
                    let (streamed, loops) = update_block_work(k, nc, m, states);
                    w.streamed += count * streamed;
                    w.loops += count * loops;
                }
                if *bias {
                    w.streamed += el(dy) as u64 * 4 + 2 * states as u64 * m as u64 * 4;
                }
            }
        }
        w
    }
}
