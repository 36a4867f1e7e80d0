//! What every cross-backend kernel check shares: random arguments in each slot's valid domain, and
//! the comparison of a written argument with the CPU backend's, random batches for whole steps.

use dmc_plan::op::{ConvOp, DType, DenseOp, Op, OptimOp, PoolOp, SeqOp};
use dmc_plan::plan::{Kernel, Plan};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::backend::InputData;
use crate::error::RuntimeError;

/// Random bytes for every signature slot of `k` (sized per its shapes): f32 in [-1, 1) (Adam's
/// and RMSprop's second moments in [0, 1)), labels in 0..classes, tokens in 0..vocab, argmax
/// indices inside the pool window; the attention backward's `lse` is the true log-sum-exp of its
/// random `qkv` (so `p = exp(s - lse)` are the softmax's probabilities, as in training).
pub fn random_args(k: &Kernel, rng: &mut ChaCha8Rng) -> Vec<Vec<u8>> {
    random_args_on(k, rng, None)
}

/// [`random_args`], the f32 values rounded to multiples of `grid` when given.
pub fn random_args_on(k: &Kernel, rng: &mut ChaCha8Rng, grid: Option<f32>) -> Vec<Vec<u8>> {
    let sig = k.op.signature();
    let rule = match &k.op {
        Op::Optim(OptimOp::Update { rule, .. })
        | Op::Conv(ConvOp::Conv2dBwdWeightUpdate { rule, .. })
        | Op::Dense(DenseOp::DenseBwdWeightUpdate { rule, .. })
        | Op::Optim(OptimOp::BiasGradUpdate { rule, .. }) => Some(rule),
        _ => None,
    };
    let nonneg_states = match &k.op {
        // batchnorm's variances (batch and running) and layernorm's rstd are >= 0
        Op::Norm(_) => &["var", "running_var", "rstd"] as &[&str],
        _ => rule.map_or(&[] as &[&str], |r| r.nonnegative_states()),
    };
    let mut args: Vec<Vec<u8>> = sig
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let n: usize = k.arg_shapes[i].iter().product();
            match p.dtype {
                DType::F32 => {
                    // a second moment (Adam's, RMSprop's state slot `v`) must be >= 0
                    let nonneg = nonneg_states.contains(&p.name.as_str());
                    (0..n)
                        .flat_map(|_| {
                            let v: f32 = if nonneg {
                                rng.random_range(0.0..1.0)
                            } else {
                                rng.random_range(-1.0..1.0)
                            };
                            let v = grid.map_or(v, |q| (v / q).round() * q);
                            v.to_ne_bytes()
                        })
                        .collect()
                }
                DType::I32 => {
                    // class labels (the logits' second axis), a global max-pool's argmax (a
                    // pixel of dx [N,H,W,C]), or tokens (rows of the embedding's table)
                    let classes = match k.op {
                        Op::Pool(PoolOp::GlobalMaxPoolBwd) => k.arg_shapes.get(2).map_or(1, |s| {
                            s.get(1).copied().unwrap_or(1) * s.get(2).copied().unwrap_or(1)
                        }),
                        Op::Seq(SeqOp::Embedding) => k
                            .arg_shapes
                            .get(1)
                            .and_then(|s| s.first())
                            .copied()
                            .unwrap_or(1),
                        Op::Seq(SeqOp::EmbeddingBwd { vocab }) => vocab,
                        _ => k.arg_shapes[0].get(1).copied().unwrap_or(1),
                    };
                    let classes = classes.clamp(1, i32::MAX as usize) as i32;
                    (0..n)
                        .flat_map(|_| rng.random_range(0..classes).to_ne_bytes())
                        .collect()
                }
                DType::U8 => match k.op {
                    // with padding, a position of the window's inner cells (without the padding's
                    // rows and columns), which every floor window holds inside the image (one in
                    // the padding, or past the image in a ceil-mode window, is a corrupt argmax)
                    Op::Pool(PoolOp::MaxPoolBwd { geom })
                        if geom.kh > geom.pad_top + geom.pad_bottom
                            && geom.kw > geom.pad_left + geom.pad_right =>
                    {
                        let rows = geom.kh - geom.pad_top - geom.pad_bottom;
                        let cols = geom.kw - geom.pad_left - geom.pad_right;
                        (0..n)
                            .map(|_| {
                                let (a, b) = (rng.random_range(0..rows), rng.random_range(0..cols));
                                ((geom.pad_top + a) * geom.kw + geom.pad_left + b).min(255) as u8
                            })
                            .collect()
                    }
                    _ => (0..n).map(|_| rng.random_range(0..=255u8)).collect(),
                },
            }
        })
        .collect();
    if let Op::Seq(SeqOp::AttentionBwd { heads, causal }) = k.op {
        if let (Some(qkv), Some(&[b, t, c3])) = (args.first(), k.arg_shapes.first().map(|s| &s[..]))
        {
            let lse = attention_lse(&f32s(qkv), (b, t, c3 / 3), heads, causal);
            args[2] = lse.iter().flat_map(|v| v.to_ne_bytes()).collect();
        }
    }
    args
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The log-sum-exp `[b, heads, t]` of attention's scaled scores on `qkv [b, t, 3d]` (the
/// forward's `lse`), in f64: `scale = 1 / sqrt(dh)` as the kernels take it, the keys `j <= i` when
/// `causal`.
pub fn attention_lse(
    qkv: &[f32],
    (b, t, d): (usize, usize, usize),
    heads: usize,
    causal: bool,
) -> Vec<f32> {
    let dh = d / heads.max(1);
    let scale = f64::from(1.0 / (dh as f32).sqrt());
    let at = |bi: usize, i: usize, part: usize, h: usize| (bi * t + i) * 3 * d + part * d + h * dh;
    let mut out = Vec::with_capacity(b * heads * t);
    for bi in 0..b {
        for h in 0..heads {
            for i in 0..t {
                let q = &qkv[at(bi, i, 0, h)..at(bi, i, 0, h) + dh];
                let keys = if causal { i + 1 } else { t };
                let s: Vec<f64> = (0..keys)
                    .map(|j| {
                        let k = &qkv[at(bi, j, 1, h)..at(bi, j, 1, h) + dh];
                        scale
                            * q.iter()
                                .zip(k)
                                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                                .sum::<f64>()
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = s.iter().map(|v| (v - m).exp()).sum();
                out.push((m + sum.ln()) as f32);
            }
        }
    }
    out
}

/// max |got - want| / max |want| over an argument (0 when equal; for integer types, exact or
/// infinity); NaN when NaN-ness differs anywhere (e.g. an element that was never written) or an
/// infinity differs.
pub fn rel_err(gpu: &[u8], cpu: &[u8], dtype: DType) -> f64 {
    match dtype {
        DType::U8 | DType::I32 => {
            if gpu == cpu {
                0.0
            } else {
                f64::INFINITY
            }
        }
        DType::F32 => {
            let f = |b: &[u8]| -> Vec<f32> {
                b.chunks_exact(4)
                    .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                    .collect()
            };
            let (g, c) = (f(gpu), f(cpu));
            let scale = c
                .iter()
                .filter(|v| v.is_finite())
                .fold(0f64, |a, &v| a.max(v.abs() as f64))
                .max(1e-30);
            let mut worst = 0f64;
            for (&a, &b) in g.iter().zip(&c) {
                if a.is_nan() != b.is_nan() {
                    return f64::NAN;
                }
                if a.is_finite() && b.is_finite() {
                    worst = worst.max((a as f64 - b as f64).abs() / scale);
                } else if a != b && !(a.is_nan() && b.is_nan()) {
                    return f64::NAN;
                }
            }
            worst
        }
    }
}

/// One random batch for every input and target of a plan: f32 in [-1, 1), labels in 0..classes
/// (the output's last dimension).
pub struct Batch(pub Vec<(String, Vec<f32>, Vec<i32>)>);

impl Batch {
    pub fn random(plan: &Plan, rng: &mut ChaCha8Rng) -> Self {
        let classes = plan.output.shape.last().copied().unwrap_or(1).max(1) as i32;
        Batch(
            plan.inputs
                .iter()
                .chain(&plan.targets)
                .map(|b| {
                    let n: usize = b.shape.iter().product();
                    match b.dtype {
                        DType::I32 => (
                            b.name.clone(),
                            vec![],
                            (0..n).map(|_| rng.random_range(0..classes)).collect(),
                        ),
                        _ => (
                            b.name.clone(),
                            (0..n).map(|_| rng.random_range(-1.0..1.0)).collect(),
                            vec![],
                        ),
                    }
                })
                .collect(),
        )
    }

    /// Hands every tensor to `set` (a backend's `set_input`).
    pub fn feed(
        &self,
        mut set: impl FnMut(&str, InputData) -> Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError> {
        for (name, f, i) in &self.0 {
            let d = if i.is_empty() {
                InputData::F32(f)
            } else {
                InputData::I32(i)
            };
            set(name, d)?;
        }
        Ok(())
    }
}
