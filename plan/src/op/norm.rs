//! The normalisation family: batch normalisation over the last axis (the channels of NHWC
//! images, the features of flat values), as PyTorch's `BatchNorm1d`/`BatchNorm2d` compute it.
//!
//! Training is two ops, so that rematerialisation never updates the running statistics twice:
//! [`NormOp::BatchNorm`] (a pure function of its inputs, which remat may recompute) writes the
//! batch statistics, and [`NormOp::BatchNormStats`] (an update of persistent state, in the update
//! phase, never recomputed) folds them into the running statistics. Eval and predict plans use
//! [`NormOp::BatchNormInfer`], which reads the running statistics.
//!
//! Layer normalisation (PyTorch's `LayerNorm(last_dim)`, Keras' `LayerNormalization(axis=-1)`)
//! normalises each row of `[.., C]` over its C elements instead: [`NormOp::LayerNorm`] saves each
//! row's mean and reciprocal standard deviation for [`NormOp::LayerNormBwd`]; it has no running
//! statistics, so train, eval and predict compute the same.

use serde::{Deserialize, Serialize};

use super::facts::{p, DType, OpFacts, ParamKind, Role, ShapeError, TensorType};
use super::shape::{err, numel, same};
use crate::unary::Coef;

/// Channels per task of the CPU batchnorms' per-channel sums (one 64-byte line of f32 of each
/// row): a value of at most this many channels is summed on one thread.
pub const BN_SUM_BLOCK: usize = 16;
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum NormOp {
    /// x\[.., C\], gamma\[C\], beta\[C\] -> y\[.., C\], mean\[C\], var\[C\]: per channel over every leading
    /// axis (M = numel / C rows), mean and biased variance; y = (x - mean) / sqrt(var + eps) *
    /// gamma + beta. `ranks` > 1 (data parallel): the statistics are the ranks' whole batch's (the
    /// per-channel sums summed over the ranks), and the op has a workspace `sums` of 2 C f64 for
    /// the GPU's collectives.
    BatchNorm {
        eps: Coef,
        #[serde(
            default = "crate::shard::one",
            skip_serializing_if = "crate::shard::is_one"
        )]
        ranks: usize,
    },
    /// x, gamma, beta, running_mean\[C\], running_var\[C\] -> y = (x - running_mean) /
    /// sqrt(running_var + eps) * gamma + beta (eval and predict).
    BatchNormInfer { eps: Coef },
    /// running_mean (InOut), running_var (InOut), mean, var -> running_mean', running_var':
    /// PyTorch's momentum: r' = (1 - momentum) r + momentum b, with the unbiased batch variance
    /// var * count / (count - 1) (`count` = rows per channel, M, of the whole batch: a data-parallel
    /// plan's counts every rank's rows; var itself when M = 1).
    BatchNormStats { momentum: Coef, count: usize },
    /// dy, x, mean, var, gamma -> dx, dgamma\[C\], dbeta\[C\]: with xh = (x - mean) rstd,
    /// dbeta = sum dy, dgamma = sum dy xh, dx = gamma rstd (dy - dbeta / M - xh dgamma / M).
    /// `in_place`: dx is written over dy (slot 0 `InOut`; the in-place pass sets it when dy dies
    /// there). `ranks` > 1: dx takes the ranks' whole batch's sums of dy and dy xh (dgamma and
    /// dbeta stay this rank's: the update sums them), with a workspace `sums` as the forward's.
    BatchNormBwd {
        eps: Coef,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        in_place: bool,
        #[serde(
            default = "crate::shard::one",
            skip_serializing_if = "crate::shard::is_one"
        )]
        ranks: usize,
    },
    /// x\[.., C\], gamma\[C\], beta\[C\] -> y\[.., C\], mean\[..\], rstd\[..\]: per row (every position of
    /// the leading axes; M = numel / C rows) over its C elements, mean and rstd = 1 / sqrt(biased
    /// variance + eps); y = (x - mean) rstd gamma + beta.
    LayerNorm { eps: Coef },
    /// dy, x, mean, rstd, gamma -> dx, dgamma\[C\], dbeta\[C\]: with xh = (x - mean) rstd and
    /// g = dy gamma, per row dx = rstd (g - mean_C g - xh mean_C (g xh)); dgamma = sum over the
    /// rows of dy xh, dbeta = sum over the rows of dy.
    LayerNormBwd,
}

/// C of a value `[.., C]`, or an error naming `what`.
fn channels(t: &TensorType, what: &str) -> Result<usize, ShapeError> {
    match t.shape.last() {
        Some(&c) if t.shape.len() >= 2 && c > 0 => Ok(c),
        _ => err(format!("{what} must be [batch, .., channels], got {t}")),
    }
}

/// The per-row statistics' type of `x` `[.., C]`: its leading axes.
fn row_stat(x: &TensorType) -> TensorType {
    TensorType::f32(x.shape[..x.shape.len().saturating_sub(1)].to_vec())
}

/// Every input from `first` on is `[c]`.
fn per_channel(inputs: &[TensorType], first: usize, c: usize) -> Result<(), ShapeError> {
    for (i, t) in inputs.iter().enumerate().skip(first) {
        if t.shape != [c] {
            return err(format!(
                "input {i} must be f32[{c}] (one per channel), got {t}"
            ));
        }
    }
    Ok(())
}

impl OpFacts for NormOp {
    fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        match self {
            NormOp::BatchNorm { ranks, .. } => {
                let mut v = vec![
                    p("x", In, F32),
                    p("gamma", In, F32),
                    p("beta", In, F32),
                    p("y", Out, F32),
                    p("mean", Out, F32),
                    p("var", Out, F32),
                ];
                if *ranks > 1 {
                    v.push(p("sums", Workspace, F32));
                }
                v
            }
            NormOp::BatchNormInfer { .. } => vec![
                p("x", In, F32),
                p("gamma", In, F32),
                p("beta", In, F32),
                p("running_mean", In, F32),
                p("running_var", In, F32),
                p("y", Out, F32),
            ],
            NormOp::BatchNormStats { .. } => vec![
                p("running_mean", InOut, F32),
                p("running_var", InOut, F32),
                p("mean", In, F32),
                p("var", In, F32),
            ],
            NormOp::BatchNormBwd {
                in_place, ranks, ..
            } => {
                let mut v = vec![p("dy", if *in_place { InOut } else { In }, F32)];
                v.extend([
                    p("x", In, F32),
                    p("mean", In, F32),
                    p("var", In, F32),
                    p("gamma", In, F32),
                ]);
                if !in_place {
                    v.push(p("dx", Out, F32));
                }
                v.extend([p("dgamma", Out, F32), p("dbeta", Out, F32)]);
                if *ranks > 1 {
                    v.push(p("sums", Workspace, F32));
                }
                v
            }
            NormOp::LayerNorm { .. } => vec![
                p("x", In, F32),
                p("gamma", In, F32),
                p("beta", In, F32),
                p("y", Out, F32),
                p("mean", Out, F32),
                p("rstd", Out, F32),
            ],
            NormOp::LayerNormBwd => vec![
                p("dy", In, F32),
                p("x", In, F32),
                p("mean", In, F32),
                p("rstd", In, F32),
                p("gamma", In, F32),
                p("dx", Out, F32),
                p("dgamma", Out, F32),
                p("dbeta", Out, F32),
            ],
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            NormOp::BatchNorm { .. } => "batchnorm",
            NormOp::BatchNormInfer { .. } => "batchnorm_infer",
            NormOp::BatchNormStats { .. } => "batchnorm_stats",
            NormOp::BatchNormBwd {
                in_place: false, ..
            } => "batchnorm_bwd",
            NormOp::BatchNormBwd { in_place: true, .. } => "batchnorm_bwd_inplace",
            NormOp::LayerNorm { .. } => "layernorm",
            NormOp::LayerNormBwd => "layernorm_bwd",
        }
    }

    fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        match self {
            NormOp::BatchNormStats { .. } => vec![(0, 0), (1, 1)],
            NormOp::BatchNormBwd { in_place: true, .. } => vec![(0, 0)],
            NormOp::BatchNorm { .. }
            | NormOp::BatchNormInfer { .. }
            | NormOp::BatchNormBwd {
                in_place: false, ..
            }
            | NormOp::LayerNorm { .. }
            | NormOp::LayerNormBwd => vec![],
        }
    }

    fn workspace_elems(&self, s: &[Vec<usize>]) -> Vec<usize> {
        // data parallel: 2 C f64 sums (4 C f32), C the channels of x (slot 0 of the forward, 1 of
        // the backward)
        let sums = |x: usize| vec![4 * s.get(x).and_then(|x| x.last()).copied().unwrap_or(0)];
        match self {
            NormOp::BatchNorm { ranks, .. } if *ranks > 1 => sums(0),
            NormOp::BatchNormBwd { ranks, .. } if *ranks > 1 => sums(1),
            _ => vec![],
        }
    }

    fn infer(
        &self,
        inputs: &[TensorType],
        _hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError> {
        match self {
            NormOp::BatchNorm { .. } => {
                let c = channels(&inputs[0], "x")?;
                per_channel(inputs, 1, c)?;
                let stat = TensorType::f32(vec![c]);
                Ok(vec![inputs[0].clone(), stat.clone(), stat])
            }
            NormOp::BatchNormInfer { .. } => {
                let c = channels(&inputs[0], "x")?;
                per_channel(inputs, 1, c)?;
                Ok(vec![inputs[0].clone()])
            }
            NormOp::BatchNormStats { count, .. } => {
                if *count == 0 {
                    return err("batchnorm_stats needs count >= 1");
                }
                let c = match inputs[0].shape.as_slice() {
                    [c] => *c,
                    _ => return err(format!("running_mean must be [C], got {}", inputs[0])),
                };
                per_channel(inputs, 1, c)?;
                Ok(inputs[..2].to_vec())
            }
            NormOp::BatchNormBwd { .. } => {
                same(&inputs[0], &inputs[1], "dy and x")?;
                let c = channels(&inputs[1], "x")?;
                per_channel(inputs, 2, c)?;
                let stat = TensorType::f32(vec![c]);
                Ok(vec![inputs[0].clone(), stat.clone(), stat])
            }
            NormOp::LayerNorm { .. } => {
                let c = channels(&inputs[0], "x")?;
                per_channel(inputs, 1, c)?;
                let stat = row_stat(&inputs[0]);
                Ok(vec![inputs[0].clone(), stat.clone(), stat])
            }
            NormOp::LayerNormBwd => {
                same(&inputs[0], &inputs[1], "dy and x")?;
                let c = channels(&inputs[1], "x")?;
                let stat = row_stat(&inputs[1]);
                for (i, t) in inputs.iter().enumerate().take(4).skip(2) {
                    if *t != stat {
                        return err(format!(
                            "input {i} must be {stat} (one per row of x {}), got {t}",
                            inputs[1]
                        ));
                    }
                }
                per_channel(inputs, 4, c)?;
                let par = TensorType::f32(vec![c]);
                Ok(vec![inputs[0].clone(), par.clone(), par])
            }
        }
    }

    fn flops(&self, ins: &[Vec<usize>], _outs: &[Vec<usize>]) -> u64 {
        let i = |k: usize| ins.get(k).map(|s| numel(s)).unwrap_or(0);
        match self {
            // mean, variance, normalise + affine
            NormOp::BatchNorm { .. } => 7 * i(0),
            NormOp::BatchNormInfer { .. } => 4 * i(0),
            NormOp::BatchNormStats { .. } => 6 * i(0),
            // the two sums, then dx
            NormOp::BatchNormBwd { .. } => 10 * i(0),
            // per row: mean, variance, normalise + affine
            NormOp::LayerNorm { .. } => 7 * i(0),
            // the row sums, the column sums, then dx
            NormOp::LayerNormBwd => 12 * i(0),
        }
    }

    /// The CPU kernels compute in f64, summing over the rows in order: per pass over x (or dy)
    /// the bytes of one `[.., C]` value. Batchnorm sums blocks of [`BN_SUM_BLOCK`] channels in
    /// parallel (a value of at most that many channels on one thread): the sum and the
    /// squared-deviation passes, then y (read x, write y) over blocks of rows; its backward: the
    /// sums of dy and dy xh (one pass over both), then dx (read x and dy, write dx; a copy of dy
    /// on the calling thread first when not in place). Layernorm splits its rows over the
    /// threads (each row alone): 4 passes in one parallel loop. Its backward (row sums and dx
    /// split by rows, then the column sums of dgamma and dbeta split by blocks of 64 channels, a
    /// few blocks only) is weighed as 10 passes on one thread: as measured on gpt.dm's (~2.3 ms
    /// for a `[2048, 256]` value on 2 threads).
    fn cpu_work(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> crate::cpu::CpuWork {
        let x = ins.first().map(|s| numel(s)).unwrap_or(0) * 4;
        let c = ins.first().and_then(|s| s.last()).copied().unwrap_or(1);
        let parallel = |passes: u64, loops: u64| crate::cpu::CpuWork {
            streamed: passes * x,
            loops,
            ..Default::default()
        };
        // (sums: passes over x, parallel unless one block; the rest: passes, serial passes)
        let (sums, rest, serial) = match self {
            NormOp::LayerNorm { .. } => {
                return parallel(4, 1).with_special(crate::cpu::Special::LayerNorm, x / 4)
            }
            NormOp::BatchNorm { .. } => (2, 2, 0),
            NormOp::BatchNormInfer { .. } => (0, 0, 2),
            NormOp::BatchNormBwd { in_place, .. } => (2, 3, 2 * !*in_place as u64),
            NormOp::LayerNormBwd => (0, 0, 10),
            NormOp::BatchNormStats { .. } => {
                let all: u64 = ins.iter().chain(outs).map(|s| numel(s)).sum();
                return crate::cpu::CpuWork::stream(all * 4);
            }
        };
        let one_block = c <= BN_SUM_BLOCK;
        let sum_loops = match self {
            NormOp::BatchNorm { .. } => 2,
            _ => 1,
        };
        let w = crate::cpu::CpuWork {
            streamed: rest * x + if one_block { 0 } else { sums * x },
            serial: serial * x + if one_block { sums * x } else { 0 },
            loops: if rest > 0 {
                1 + if one_block { 0 } else { sum_loops }
            } else {
                0
            },
            ..Default::default()
        };
        let elems = x / 4;
        match self {
            NormOp::BatchNorm { .. } => w.with_special(crate::cpu::Special::BatchNorm, elems),
            NormOp::BatchNormBwd { .. } => w.with_special(crate::cpu::Special::BatchNormBwd, elems),
            NormOp::LayerNormBwd => w.with_special(crate::cpu::Special::LayerNormBwd, elems),
            _ => w,
        }
    }
}
