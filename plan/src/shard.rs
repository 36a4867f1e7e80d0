//! Data-parallel sharding (ZeRO stage 1): with `world` ranks, every parameter's optimizer state is
//! split by rows among them, each rank keeping and updating only its rows. A parameter is seen as a
//! row-major `[rows, cols]` matrix ([`Layout`]): a weight whose gradient the fused weight-gradient +
//! update kernel produces by column chunks is `[K, C]` (its rows are the GEMM's reduction rows, so
//! every chunk splits the same way), anything else `[numel, 1]` (an even split of its elements).
//! Rank `r` holds rows [`rows`]`(rows, world, r)`: a contiguous range of the full tensor, so a
//! checkpoint's state is the ranks' shards concatenated, and a resume at another world size takes
//! other ranges of the same tensor.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::op::{ConvOp, DenseOp, Op, OptimOp};
use crate::plan::Plan;

/// How a parameter's optimizer state is split among `world` ranks: by rows of a row-major
/// `[rows, cols]` view of the parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    pub rows: usize,
    pub cols: usize,
    pub world: usize,
}

impl Layout {
    /// The layout of a parameter of shape `shape` seen as `[numel / cols, cols]` (`cols` 1: an
    /// even split of its elements), among `world` ranks.
    pub fn of(shape: &[usize], cols: usize, world: usize) -> Layout {
        let cols = cols.max(1);
        Layout {
            rows: shape.iter().product::<usize>() / cols,
            cols,
            world: world.max(1),
        }
    }

    /// The rows of rank `rank`.
    pub fn rows_of(&self, rank: usize) -> Range<usize> {
        rows(self.rows, self.world, rank)
    }

    /// The elements of the full tensor that rank `rank` holds (contiguous).
    pub fn elems_of(&self, rank: usize) -> Range<usize> {
        let r = self.rows_of(rank);
        r.start * self.cols..r.end * self.cols
    }

    /// Elements of the shard buffer every rank allocates: the largest rank's rows (the same plan
    /// runs on every rank, so its buffers are sized for the largest shard).
    pub fn shard_elems(&self) -> usize {
        max_rows(self.rows, self.world) * self.cols
    }
}

/// The tensors a sharded step of `op` (arguments shaped `shapes`) sums or updates, as layouts
/// among its `shards` ranks: the weight (and a fused bias) of a fused weight-gradient + update,
/// the tensor of a whole-tensor update or bias update, the gradient of a `GradAllReduce`. Empty
/// for any other step.
pub fn updated(op: &Op, shapes: &[Vec<usize>]) -> Vec<Layout> {
    updated_args(op, shapes)
        .into_iter()
        .map(|(_, l)| l)
        .collect()
}

/// [`updated`] with the signature slot of each tensor.
pub fn updated_args(op: &Op, shapes: &[Vec<usize>]) -> Vec<(usize, Layout)> {
    let world = op.shards();
    if world <= 1 {
        return vec![];
    }
    let at = |i: usize| shapes.get(i).map_or(&[][..], |s| &s[..]);
    let cols = |i: usize| at(i).last().copied().unwrap_or(1);
    match op {
        Op::Optim(OptimOp::Update { .. }) => vec![(0, Layout::of(at(0), 1, world))],
        Op::Optim(OptimOp::GradAllReduce { .. }) => vec![(0, Layout::of(at(0), 1, world))],
        Op::Optim(OptimOp::BiasGradUpdate { .. }) => vec![(1, Layout::of(at(1), 1, world))],
        Op::Dense(DenseOp::DenseBwdWeightUpdate { rule, bias, .. })
        | Op::Conv(ConvOp::Conv2dBwdWeightUpdate { rule, bias, .. }) => {
            let mut v = vec![(2, Layout::of(at(2), cols(2), world))];
            if *bias {
                let b = 3 + rule.state_names().len();
                v.push((b, Layout::of(at(b), 1, world)));
            }
            v
        }
        _ => vec![],
    }
}

/// The bytes rank `rank` sends in one step of `plan` (data parallel): per sharded parameter, the
/// other ranks' rows of its gradient (the reduction) and its own updated rows to every other rank
/// (the gather); with sharded parameters its own rows to every other rank at each gather of a
/// window; and the 4-byte loss to every other rank.
pub fn sent_bytes(plan: &Plan, rank: usize) -> u64 {
    if plan.ranks <= 1 {
        return 0;
    }
    let n = plan.ranks as u64;
    let mut elems = n - 1; // the loss
    for s in &plan.steps {
        let k = &plan.kernels[s.kernel];
        // an update of a gradient already summed (clip_norm's) only gathers
        let summed = matches!(k.op, Op::Optim(OptimOp::Update { summed: true, .. }));
        if let Op::Optim(OptimOp::GatherShard { layout }) = &k.op {
            elems += (n - 1) * (layout.rows_of(rank).len() * layout.cols) as u64;
        }
        // sharded parameters: the update keeps this rank's rows and gathers none
        let gathers = !k.op.keeps_rows();
        for l in updated(&k.op, &k.arg_shapes) {
            let mine = l.rows_of(rank).len() as u64 * l.cols as u64;
            let all = (l.rows * l.cols) as u64;
            elems += if summed { 0 } else { all - mine } + if gathers { (n - 1) * mine } else { 0 };
        }
    }
    elems * 4
}

/// The optimizer-state bytes each rank holds (the largest rank's shards) and that one process
/// would hold, of `plan`.
pub fn state_bytes(plan: &Plan) -> (u64, u64) {
    plan.opt_state.iter().fold((0, 0), |(r, all), b| {
        let full = b.shape.iter().product::<usize>() as u64 * 4;
        let mine = b.buffer_shape().iter().product::<usize>() as u64 * 4;
        (r + mine, all + full)
    })
}

/// The parameter bytes each rank holds at home (the largest rank's rows of a sharded parameter,
/// all of any other) and that one process would hold, of `plan` (sharded parameters: ZeRO-3).
pub fn param_bytes(plan: &Plan) -> (u64, u64) {
    plan.params.iter().fold((0, 0), |(r, all), b| {
        let full = b.shape.iter().product::<usize>() as u64 * 4;
        let mine = b.buffer_shape().iter().product::<usize>() as u64 * 4;
        (r + mine, all + full)
    })
}

/// Serde's default of an op's `shards` (one rank: nothing sharded).
pub fn one() -> usize {
    1
}

/// Whether `shards` is the default (left out of the plan's JSON).
pub fn is_one(shards: &usize) -> bool {
    *shards == 1
}

/// Rank `rank`'s rows of `n` split among `world` ranks: `rank*n/world .. (rank+1)*n/world` (the
/// first ranks get the smaller parts; a rank may get none when `n < world`).
pub fn rows(n: usize, world: usize, rank: usize) -> Range<usize> {
    let world = world.max(1);
    let at = |r: usize| ((r as u128 * n as u128) / world as u128) as usize;
    at(rank.min(world))..at((rank + 1).min(world))
}

/// The most rows any rank gets of `n` split among `world` ranks.
pub fn max_rows(n: usize, world: usize) -> usize {
    n.div_ceil(world.max(1))
}
