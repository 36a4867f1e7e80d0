//! The optimizer family: the update of one parameter, and the bias gradient (alone, or fused with
//! its update by the `fuse_weight_update` pass). Updates are in place: their outputs alias the
//! parameter and its state.

use serde::{Deserialize, Serialize};

use super::facts::{p, DType, OpFacts, ParamKind, Role, ShapeError, TensorType};
use super::shape::{err, numel, states_like, states_sharded};
use crate::shard::Layout;
use crate::update::UpdateRule;

/// Rows of one partial sum of a bias gradient (a column sum of dy over its rows). Every backend
/// sums a column the same way: the rows of each chunk of this many in order, then the chunk sums in
/// order, starting from 0 (a two-level sum). A GPU sums the chunks in parallel and stays
/// bit-identical to the CPU, and the rounding error grows with ~(chunk + rows/chunk) terms, not rows.
pub const BIAS_CHUNK_ROWS: usize = 512;

/// The partial sums of a bias gradient over `rows` rows (chunks of [`BIAS_CHUNK_ROWS`], at least 1).
pub fn bias_chunks(rows: usize) -> usize {
    rows.div_ceil(BIAS_CHUNK_ROWS).max(1)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum OptimOp {
    /// The update `rule` of one parameter: w, g, state.. -> w', state'.. with w' aliasing w and
    /// each state' its state ([`UpdateRule::state_names`]: none, v, or m and v).
    /// SGD, PyTorch semantics: g' = g + wd*w; v = momentum*v + g'; step = nesterov ? g' + momentum*v
    /// : v; w -= lr*step. Momentum 0: w -= lr*g' (no state).
    /// Adam: t = the runtime's 1-based step counter. decoupled (AdamW): w -= lr*wd*w first; else
    /// g += wd*w. m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; mh = m/(1-b1^t); vh = v/(1-b2^t);
    /// w -= lr * mh / (sqrt(vh) + eps)
    /// RMSprop and Lion: as [`UpdateRule::RmsProp`] and [`UpdateRule::Lion`] say.
    /// `zero_grad` (gradient accumulation, `train { accumulate: N }`): `g` is the accumulated
    /// gradient buffer, which the update reads and then sets to 0 (`opt.zero_grad()`), so the next
    /// optimizer step's first micro-batch adds to zeros; `g` is then `InOut`, its output after w'.
    ///
    /// `shards` > 1 (data parallel, [`crate::shard`]): the state inputs are this rank's shards of
    /// `w` seen as `[numel, 1]`; the step sums the ranks' gradients of this rank's elements into
    /// the workspace `gs` (its first half; the second receives the peers' parts), updates them,
    /// and gathers every rank's updated elements into `w` (with `zero_grad`, then zeroes this
    /// rank's accumulated `g`, as one process does).
    Update {
        rule: UpdateRule,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        zero_grad: bool,
        #[serde(
            default = "crate::shard::one",
            skip_serializing_if = "crate::shard::is_one"
        )]
        shards: usize,
        /// Data parallel with `clip_norm`: `g` is already the ranks' sum (a held gradient summed
        /// by [`OptimOp::GradAllReduce`] before the norm), so the update does not sum it again.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        summed: bool,
        /// Sharded parameters (ZeRO-3, [`crate::shard`]): the updated tensor is a window of
        /// which only this rank's rows are kept (`KeepShard`), so the step gathers no other
        /// rank's rows into it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        keep_rows: bool,
    },
    /// Data parallel with `clip_norm` ([`crate::shard`]): a held gradient g (InOut) summed over
    /// the `shards` ranks in place, every rank getting the same values (each rank sums its rows,
    /// the peers' parts received into the workspace `tmp`, then every rank's rows are gathered),
    /// so that the global norm is the summed gradient's and the same on every rank.
    GradAllReduce { shards: usize },
    /// Gradient accumulation over micro-batches: acc (InOut, a persistent `GradAccum` buffer), g
    /// -> acc' = acc + scale * g (scale = 1/N: the mean of the N micro-batch gradients, PyTorch's
    /// `(loss / N).backward()`).
    GradAccum { scale: f32 },
    /// The squared global L2 norm of the gradients (`clip_norm`), one kernel per parameter in a
    /// chain: g, (s) -> s' = (first ? 0 : s) + sum g^2 (f32\[1\]; `first` writes it, so `s` is no
    /// argument then). The updates of a rule with `clip_norm` read the chain's last `s'`.
    GradSqNorm { first: bool },
    /// `clip_norm` in two passes ([`crate::plan::ClipNormMethod::NormPass`]): sum (InOut, the
    /// chain's last `s'`: the persistent `clip_norm.sq_norm_sum`, which the chain's links add to
    /// in place), held (InOut, the persistent `clip_norm.sq_norm`) -> sum' = 0, held' = sum.
    /// The norm pass stores the step's squared norm and zeroes the sum for the next one; the
    /// update pass's updates read `held` (its value before the run: nothing writes it in the
    /// update pass), so no update waits for the whole chain and no gradient is held.
    GradNormStore,
    /// dy\[.., C\] -> db\[C\] = sum over every leading axis (in chunks of [`BIAS_CHUNK_ROWS`] rows)
    BiasGrad,
    /// dy\[.., C\], b\[C\] (InOut), state.. (InOut) -> b', state'..; db (workspace \[C\]) = sum dy, then
    /// the update. With `shards` > 1 as [`OptimOp::Update`] (the bias seen as `[C, 1]`; the
    /// workspace `comm` receives the peers' parts of db).
    BiasGradUpdate {
        rule: UpdateRule,
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
    /// Sharded parameters (data parallel with `--shard-parameters`, ZeRO stage 3,
    /// [`crate::shard`]): shard (this rank's rows of a parameter seen as `layout`, at the start of
    /// a buffer of [`Layout::shard_elems`]) -> w (the whole parameter, flat) = every rank's rows,
    /// the same on every rank: the window a cluster of the parameter's uses reads.
    GatherShard { layout: Layout },
    /// Sharded parameters: w (a window an update wrote, flat), shard (InOut: the parameter's
    /// home) -> this rank's rows of w kept in the home before the window is released (the rest of
    /// the home, a smaller rank's padding, untouched).
    KeepShard { layout: Layout },
}

impl OpFacts for OptimOp {
    fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        match self {
            OptimOp::Update {
                rule,
                zero_grad,
                shards,
                ..
            } => {
                let g = if *zero_grad { InOut } else { In };
                let mut v = vec![p("w", InOut, F32), p("g", g, F32)];
                v.extend(rule.state_names().iter().map(|s| p(s, InOut, F32)));
                if rule.clip_norm().is_some() {
                    v.push(p("norm_sq", In, F32));
                }
                if *shards > 1 {
                    v.push(p("gs", Workspace, F32));
                }
                v
            }
            OptimOp::BiasGrad => vec![p("dy", In, F32), p("db", Out, F32)],
            OptimOp::GradAccum { .. } => vec![p("acc", InOut, F32), p("g", In, F32)],
            OptimOp::GradSqNorm { first: true } => vec![p("g", In, F32), p("s", Out, F32)],
            OptimOp::GradSqNorm { first: false } => vec![p("g", In, F32), p("s", InOut, F32)],
            OptimOp::GradNormStore => vec![p("sum", InOut, F32), p("held", InOut, F32)],
            OptimOp::GradAllReduce { .. } => vec![p("g", InOut, F32), p("tmp", Workspace, F32)],
            OptimOp::GatherShard { .. } => vec![p("shard", In, F32), p("w", Out, F32)],
            OptimOp::KeepShard { .. } => vec![p("w", In, F32), p("shard", InOut, F32)],
            OptimOp::BiasGradUpdate { rule, shards, .. } => {
                let mut v = vec![p("dy", In, F32), p("b", InOut, F32)];
                v.extend(rule.state_names().iter().map(|s| p(s, InOut, F32)));
                v.push(p("db", Workspace, F32));
                if *shards > 1 {
                    v.push(p("comm", Workspace, F32));
                }
                v
            }
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            OptimOp::Update { rule, .. } => rule.op_name(),
            OptimOp::BiasGrad => "bias_grad",
            OptimOp::GradAccum { .. } => "grad_accum",
            OptimOp::GradSqNorm { .. } => "grad_sq_norm",
            OptimOp::GradNormStore => "grad_norm_store",
            OptimOp::GradAllReduce { .. } => "grad_all_reduce",
            OptimOp::BiasGradUpdate { .. } => "bias_grad_update",
            OptimOp::GatherShard { .. } => "gather_shard",
            OptimOp::KeepShard { .. } => "keep_shard",
        }
    }

    fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        match self {
            OptimOp::Update {
                rule,
                zero_grad: false,
                ..
            } => (0..=rule.state_names().len())
                .map(|o| (o, if o == 0 { 0 } else { o + 1 }))
                .collect(),
            OptimOp::Update {
                rule,
                zero_grad: true,
                ..
            } => (0..rule.state_names().len() + 2).map(|o| (o, o)).collect(),
            OptimOp::BiasGrad | OptimOp::GatherShard { .. } | OptimOp::KeepShard { .. } => {
                vec![]
            }
            OptimOp::GradAccum { .. } => vec![(0, 0)],
            OptimOp::GradSqNorm { first: true } => vec![],
            OptimOp::GradSqNorm { first: false } => vec![(0, 1)],
            OptimOp::GradNormStore => vec![(0, 0), (1, 1)],
            OptimOp::GradAllReduce { .. } => vec![(0, 0)],
            OptimOp::BiasGradUpdate { rule, .. } => {
                (0..=rule.state_names().len()).map(|o| (o, o + 1)).collect()
            }
        }
    }

    fn workspace_elems(&self, s: &[Vec<usize>]) -> Vec<usize> {
        match self {
            OptimOp::Update { shards, .. } if *shards > 1 => {
                let w = s.first().map_or(&[][..], |w| &w[..]);
                vec![2 * crate::shard::Layout::of(w, 1, *shards).shard_elems()]
            }
            OptimOp::GradAllReduce { shards } => {
                let g = s.first().map_or(0, |g| g.iter().product());
                vec![crate::shard::max_rows(g, *shards)]
            }
            OptimOp::Update { .. }
            | OptimOp::BiasGrad
            | OptimOp::GradAccum { .. }
            | OptimOp::GradSqNorm { .. }
            | OptimOp::GradNormStore
            | OptimOp::GatherShard { .. }
            | OptimOp::KeepShard { .. } => vec![],
            OptimOp::BiasGradUpdate { shards, .. } => {
                let c = s.get(1).map(|b| b.iter().product()).unwrap_or(0);
                let mut v = vec![c];
                if *shards > 1 {
                    v.push(crate::shard::max_rows(c, *shards));
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
        match self {
            OptimOp::Update {
                rule,
                shards,
                summed,
                ..
            } => {
                if rule.clip_norm().is_some() && inputs.last() != Some(&TensorType::f32(vec![1])) {
                    return err("the squared gradient norm must be f32[1]");
                }
                if *shards > 1 && rule.clip_norm().is_some() && !summed {
                    return err("a sharded update with clip_norm reads the ranks' summed gradient (`summed`): its norm is the sum's");
                }
                states_like(&inputs[0], &inputs[..2], 1)?;
                let ns = rule.state_names().len();
                states_sharded(&inputs[0], inputs, 2, ns, *shards, 1)?;
                Ok(self
                    .aliased_outputs()
                    .iter()
                    .map(|(_, i)| inputs[*i].clone())
                    .collect())
            }
            OptimOp::GradAccum { .. } => {
                states_like(&inputs[0], inputs, 1)?;
                Ok(vec![inputs[0].clone()])
            }
            OptimOp::GradAllReduce { .. } => Ok(vec![inputs[0].clone()]),
            OptimOp::GatherShard { layout } => {
                if inputs[0] != TensorType::f32(vec![layout.shard_elems()]) {
                    return err(format!(
                        "a shard of {layout:?} must be f32[{}], not {}",
                        layout.shard_elems(),
                        inputs[0]
                    ));
                }
                Ok(vec![TensorType::f32(vec![layout.rows * layout.cols])])
            }
            OptimOp::KeepShard { layout } => {
                if inputs[0] != TensorType::f32(vec![layout.rows * layout.cols]) {
                    return err(format!(
                        "a window of {layout:?} must be f32[{}], not {}",
                        layout.rows * layout.cols,
                        inputs[0]
                    ));
                }
                Ok(vec![TensorType::f32(vec![layout.shard_elems()])])
            }
            OptimOp::GradSqNorm { first } => {
                let s = TensorType::f32(vec![1]);
                if !*first && inputs.get(1) != Some(&s) {
                    return err("the running squared norm must be f32[1]");
                }
                Ok(vec![s])
            }
            OptimOp::GradNormStore => {
                let s = TensorType::f32(vec![1]);
                if inputs[0] != s || inputs[1] != s {
                    return err("the squared norm and its stored copy must be f32[1]");
                }
                Ok(vec![s.clone(), s])
            }
            OptimOp::BiasGrad => match inputs[0].shape.last() {
                Some(c) => Ok(vec![TensorType::f32(vec![*c])]),
                None => err("dy must have rank >= 1"),
            },
            OptimOp::BiasGradUpdate { rule, shards, .. } => {
                let (dy, b) = (&inputs[0], &inputs[1]);
                if dy.shape.last().map(|c| vec![*c]) != Some(b.shape.clone()) {
                    return err(format!("dy {dy} and bias {b} inconsistent"));
                }
                states_sharded(b, inputs, 2, rule.state_names().len(), *shards, 1)?;
                Ok(inputs[1..].to_vec())
            }
        }
    }

    /// Every input and output streamed once; a bias gradient's elements each cost their column
    /// sum's f64 add ([`crate::cpu::Special::BiasGrad`], measured whole).
    fn cpu_work(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> crate::cpu::CpuWork {
        let elems: u64 = ins.iter().chain(outs).map(|s| numel(s)).sum();
        let w = crate::cpu::CpuWork::stream(elems * 4);
        match self {
            OptimOp::BiasGrad => w.with_special(
                crate::cpu::Special::BiasGrad,
                ins.first().map_or(0, |s| numel(s)),
            ),
            _ => w,
        }
    }

    fn flops(&self, ins: &[Vec<usize>], _outs: &[Vec<usize>]) -> u64 {
        let i = |k: usize| ins.get(k).map(|s| numel(s)).unwrap_or(0);
        match self {
            OptimOp::Update { rule, .. } => rule.flops_per_elem() * i(0),
            OptimOp::BiasGrad => i(0),
            OptimOp::GradAccum { .. } | OptimOp::GradSqNorm { .. } => 2 * i(0),
            OptimOp::GradNormStore => 0,
            // the sums of its rows, one add per element and peer
            OptimOp::GradAllReduce { shards } => i(0) * (*shards as u64 - 1) / *shards as u64,
            OptimOp::BiasGradUpdate { .. } => i(0) + 4 * i(1),
            OptimOp::GatherShard { .. } | OptimOp::KeepShard { .. } => 0,
        }
    }
}
