//! Sharded parameters (data parallel with `--shard-parameters`: ZeRO stage 3, run by emission
//! before placement when [`Ctx::shard_params`](crate::ctx::Ctx) asks for it): every parameter a
//! sharded update updates keeps only this rank's rows in its *home*, a persistent arena buffer of
//! [`Layout::shard_elems`] (the rows its optimizer state keeps, [`dmc_plan::shard`]). Each
//! cluster of its uses (as streaming's windows, [`crate::stream`]: a forward, or a data gradient
//! with its fused update) reads a *window*, a transient arena buffer of the whole parameter that
//! a `GatherShard` step fills before the cluster (this rank's rows from its home, every other
//! rank's gathered); when the cluster updates it, a `KeepShard` step copies this rank's rows back
//! to the home after it. The placer packs windows like any other buffer: a rank holds 1/N of the
//! parameters and of the optimizer state, and the windows in flight.

use std::collections::BTreeMap;

use dmc_plan::op::{Op, OptimOp};
use dmc_plan::plan::{BufferId, BufferKind, Kernel, Step, Store};
use dmc_plan::shard::{updated_args, Layout};

use crate::emit::Buf;
use crate::stream::{splice, uses, windows_in, windows_of};

/// The parameters of `steps` that a sharded update updates, with their layouts.
fn sharded_params(bufs: &[Buf], steps: &[Step], kernels: &[Kernel]) -> BTreeMap<BufferId, Layout> {
    let mut out = BTreeMap::new();
    for s in steps {
        let k = &kernels[s.kernel];
        for (slot, l) in updated_args(&k.op, &k.arg_shapes) {
            let Some(&id) = s.args.get(slot) else {
                continue;
            };
            let b = &bufs[id];
            if b.kind == BufferKind::Parameter && b.persistent && b.store == Store::Arena {
                out.insert(id, l);
            }
        }
    }
    out
}

/// Shards every parameter a sharded update updates: its home shrinks to this rank's rows, its
/// uses read windows, and the gather and keep steps are inserted. `bufs`' `first_write` /
/// `last_read` of every buffer are renumbered to the new steps. Returns the sharded parameters
/// (their home buffers) with their layouts, for the bindings.
pub(crate) fn shard_parameters(
    bufs: &mut Vec<Buf>,
    steps: &mut Vec<Step>,
    kernels: &mut Vec<Kernel>,
) -> Vec<(BufferId, Layout)> {
    let layouts = sharded_params(bufs, steps, kernels);
    if layouts.is_empty() {
        return vec![];
    }
    // their updates keep this rank's rows of the window and gather no other rank's
    for s in steps.iter() {
        let k = &mut kernels[s.kernel];
        let updates_sharded = updated_args(&k.op, &k.arg_shapes)
            .iter()
            .any(|(slot, _)| s.args.get(*slot).is_some_and(|a| layouts.contains_key(a)));
        if updates_sharded {
            keep_rows(&mut k.op);
        }
    }
    let u = uses(bufs, steps, kernels);
    let mut wins: Vec<_> = layouts
        .keys()
        .flat_map(|&id| windows_of(id, &bufs[id], &u[id]))
        .collect();
    wins.sort_by_key(|w| (w.first, w.host));
    let n = steps.len();
    // before original step `i`: the keeps of the windows whose cluster ended at `i - 1`, then the
    // gathers of the windows whose cluster starts at `i`
    let mut before: Vec<Vec<(usize, bool)>> = vec![Vec::new(); n + 1];
    for (i, w) in wins.iter().enumerate() {
        if w.written {
            before[w.last + 1].push((i, false));
        }
    }
    for (i, w) in wins.iter().enumerate() {
        before[w.first].push((i, true));
    }
    let (mut seq, new_of, inserted) = splice(std::mem::take(steps), &before);
    // the windows, numbered per parameter; each cluster's uses read its window
    let mut ordinal: BTreeMap<BufferId, usize> = BTreeMap::new();
    let names: Vec<String> = wins
        .iter()
        .map(|w| {
            let k = ordinal.entry(w.host).or_default();
            *k += 1;
            format!("{} (window {k})", bufs[w.host].name)
        })
        .collect();
    let window_buf = windows_in(bufs, &mut seq, &new_of, &wins, names, |_, _| {});
    for &(at, (w, gather)) in &inserted {
        let win = &wins[w];
        let (home, window) = (win.host, window_buf[w]);
        let layout = layouts[&home];
        let (op, args, of, verb) = match gather {
            true => (
                OptimOp::GatherShard { layout },
                vec![home, window],
                win.first,
                "gather",
            ),
            false => (
                OptimOp::KeepShard { layout },
                vec![window, home],
                win.last,
                "keep",
            ),
        };
        let kernel = shard_kernel(kernels, op, &layout);
        let phase = seq[new_of[of]].phase;
        seq[at] = Step {
            kernel,
            args,
            label: format!("{} {verb}", bufs[window].name),
            phase,
            ready: None,
        };
        let b = &mut bufs[window];
        if gather {
            b.first_write = Some(at);
        }
        let end = if gather { new_of[win.last] } else { at };
        b.last_read = Some(b.last_read.map_or(end, |e| e.max(end)));
    }
    *steps = seq;
    // the homes: this rank's rows
    for (&id, l) in &layouts {
        bufs[id].bytes = (l.shard_elems() * dmc_plan::op::DType::F32.size()) as u64;
    }
    layouts.into_iter().collect()
}

/// A sharded update made to keep only this rank's rows ([`Op::keeps_rows`]).
fn keep_rows(op: &mut Op) {
    use dmc_plan::op::{ConvOp, DenseOp};
    match op {
        Op::Optim(
            OptimOp::Update { keep_rows, .. } | OptimOp::BiasGradUpdate { keep_rows, .. },
        )
        | Op::Dense(DenseOp::DenseBwdWeightUpdate { keep_rows, .. })
        | Op::Conv(ConvOp::Conv2dBwdWeightUpdate { keep_rows, .. }) => *keep_rows = true,
        _ => {}
    }
}

/// The kernel of a gather or a keep of `layout` (one per op and layout).
fn shard_kernel(kernels: &mut Vec<Kernel>, op: OptimOp, layout: &Layout) -> usize {
    let op = Op::Optim(op);
    if let Some(k) = kernels.iter().position(|k| k.op == op) {
        return k;
    }
    let (whole, shard) = (vec![layout.rows * layout.cols], vec![layout.shard_elems()]);
    let arg_shapes = match op {
        Op::Optim(OptimOp::GatherShard { .. }) => vec![shard, whole],
        _ => vec![whole, shard],
    };
    let same_kind = kernels
        .iter()
        .filter(|k| k.op.kind_name() == op.kind_name())
        .count();
    kernels.push(Kernel {
        id: kernels.len(),
        name: format!("{}_{same_kind}", op.kind_name()),
        arg_shapes,
        signature: op.signature(),
        op,
    });
    kernels.len() - 1
}
