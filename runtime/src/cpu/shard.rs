//! The data-parallel halves of the update kernels (ZeRO stage 1, [`dmc_plan::shard`]): with
//! `shards` ranks, each rank sums the ranks' gradients of its own rows of a parameter, updates those
//! rows with its shard of the optimizer state, and every rank's updated rows are gathered into the
//! parameter on every rank. The collectives run inside the update steps, in a fixed order (so a
//! run is reproducible at a given world size), through the backend's
//! [`Collective`](crate::comm::Collective).

use dmc_plan::shard;
use dmc_plan::update::UpdateRule;

use super::args::Ctx;
use super::optim::update_block;
use crate::comm::{self, Collective};
use crate::error::RuntimeError;

/// The collective a sharded step runs with. A plan of `shards` ranks only runs on a backend whose
/// group has that many ([`super::CpuBackend::run`] checks it first).
pub(super) fn group(ctx: &Ctx) -> &dyn Collective {
    ctx.comm.as_deref().unwrap_or(&comm::Solo)
}

/// A collective failed mid-step: the other ranks wait on this one, so the whole job ends (MPI
/// aborts every rank) rather than leaving some ranks with updated weights and others without.
pub(super) fn fatal(c: &dyn Collective, e: RuntimeError) -> ! {
    eprintln!(
        "error: rank {} of {}: a data-parallel collective failed: {e}",
        c.rank(),
        c.world()
    );
    c.abort(3)
}

/// The first `n` elements of each state buffer (a rank's shard of a smaller part than the
/// largest rank's, for which every buffer is sized).
fn trimmed<'a>(states: &'a mut [&mut [f32]], n: usize) -> Vec<&'a mut [f32]> {
    states.iter_mut().map(|s| &mut s[..n]).collect()
}

/// One block of a fused weight-gradient + update on this rank: `gw` (`[k, nc]`, this rank's
/// gradient of columns `c0..c0+nc` of the `[k, ld]` weight) is summed over the ranks on this
/// rank's rows (the peers' parts received into `tmp`), and those rows of `w` and of the state
/// shards (`[rows, ld]` each) are updated. `w`'s other rows are gathered by [`gather_rows`] once
/// every block is done.
#[allow(clippy::too_many_arguments)]
pub(super) fn update_rows_block(
    ctx: &Ctx,
    rule: &UpdateRule,
    w: &mut [f32],
    ld: usize,
    (c0, nc): (usize, usize),
    gw: &mut [f32],
    tmp: &mut [f32],
    states: &mut [&mut [f32]],
) {
    let c = group(ctx);
    let k = w.len() / ld.max(1);
    let gw = &mut gw[..k * nc];
    if let Err(e) = comm::reduce_scatter_rows(c, gw, nc, k, tmp) {
        fatal(c, e);
    }
    let rows = shard::rows(k, c.world(), c.rank());
    let n = rows.len() * ld;
    let mut states = trimmed(states, n);
    update_block(
        &ctx.rule(rule),
        ctx.step_counter,
        &mut w[rows.start * ld..rows.end * ld],
        ld,
        c0,
        nc,
        &gw[rows.start * nc..rows.end * nc],
        &mut states,
    );
}

/// A block of a fused weight-gradient + update: on this rank's rows ([`update_rows_block`], `comm`
/// the workspace receiving the peers' parts) in a data-parallel plan, else on every row.
#[allow(clippy::too_many_arguments)]
pub(super) fn update_columns(
    ctx: &Ctx,
    rule: &UpdateRule,
    w: &mut [f32],
    ld: usize,
    (c0, nc): (usize, usize),
    gw: &mut [f32],
    comm: Option<&mut [f32]>,
    states: &mut [&mut [f32]],
) {
    match comm {
        Some(tmp) => update_rows_block(ctx, rule, w, ld, (c0, nc), gw, tmp, states),
        None => update_block(&ctx.rule(rule), ctx.step_counter, w, ld, c0, nc, gw, states),
    }
}

/// Every rank's updated rows of the `[len / ld, ld]` tensor `w`, gathered on every rank.
pub(super) fn gather_rows(ctx: &Ctx, w: &mut [f32], ld: usize) {
    let c = group(ctx);
    let k = w.len() / ld.max(1);
    if let Err(e) = comm::all_gather_rows(c, w, ld, k) {
        fatal(c, e);
    }
}

/// A whole-tensor update on this rank (a bias, or a parameter whose gradient is not fused with
/// its update): the ranks' gradients `g` summed on this rank's elements (into `acc`, the peers'
/// parts into `tmp`; `g` itself is only read), those elements of `w` updated with the state
/// shards, and every rank's elements gathered into `w`.
/// With `summed`, `g` is already the ranks' sum ([`all_reduce`]): its elements of this rank are
/// used as they are, and only the gather runs; `gscale` is `clip_norm`'s factor. Without
/// `gather` (sharded parameters: only this rank's elements are kept) the others' are not gathered.
#[allow(clippy::too_many_arguments)]
pub(super) fn update_elems(
    ctx: &Ctx,
    rule: &UpdateRule,
    (w, g): (&mut [f32], &[f32]),
    (summed, gscale): (bool, f32),
    (acc, tmp): (&mut [f32], &mut [f32]),
    states: &mut [&mut [f32]],
    gather: bool,
) {
    let c = group(ctx);
    let n = w.len();
    let mine = shard::rows(n, c.world(), c.rank());
    let acc = &mut acc[..mine.len()];
    if summed {
        acc.copy_from_slice(&g[mine.clone()]);
    } else if let Err(e) = comm::reduce_rows_into(c, g, (1, n), acc, tmp) {
        fatal(c, e);
    }
    let mut states = trimmed(states, mine.len());
    super::optim::update_scaled(
        &ctx.rule(rule),
        ctx.step_counter,
        gscale,
        &mut w[mine.clone()],
        acc,
        &mut states,
    );
    if gather {
        gather_rows(ctx, w, 1);
    }
}

/// A held gradient summed over the ranks in place, every rank the same values (this rank's
/// elements summed, the peers' parts into `tmp`, then every rank's gathered).
pub(super) fn all_reduce(ctx: &Ctx, g: &mut [f32], tmp: &mut [f32]) {
    let c = group(ctx);
    let n = g.len();
    let r =
        comm::reduce_scatter_rows(c, g, 1, n, tmp).and_then(|()| comm::all_gather_rows(c, g, 1, n));
    if let Err(e) = r {
        fatal(c, e);
    }
}

/// A bias on this rank: its gradient `db` (`[C]`, this rank's column sums) summed over the ranks
/// on this rank's elements, those updated, and (with `gather`) every rank's elements gathered
/// into `b`.
pub(super) fn update_bias(
    ctx: &Ctx,
    rule: &UpdateRule,
    (b, db, tmp): (&mut [f32], &mut [f32], &mut [f32]),
    states: &mut [&mut [f32]],
    gather: bool,
) {
    update_rows_block(ctx, rule, b, 1, (0, 1), db, tmp, states);
    if gather {
        gather_rows(ctx, b, 1);
    }
}

/// Sharded parameters (ZeRO stage 3): the window `w` of a parameter seen as `layout`, filled with
/// this rank's rows from its home `shard` and every other rank's gathered, the same on every rank.
pub(super) fn gather_shard(ctx: &Ctx, layout: &shard::Layout, home: &[f32], w: &mut [f32]) {
    let c = group(ctx);
    let mine = layout.elems_of(c.rank());
    w[mine.clone()].copy_from_slice(&home[..mine.len()]);
    gather_rows(ctx, w, layout.cols);
}

/// Sharded parameters: this rank's rows of the updated window `w` kept in its home `shard`.
pub(super) fn keep_shard(ctx: &Ctx, layout: &shard::Layout, w: &[f32], home: &mut [f32]) {
    let mine = layout.elems_of(group(ctx).rank());
    home[..mine.len()].copy_from_slice(&w[mine]);
}

/// Batchnorm's per-channel sums over the ranks' parts of the batch ([`super::norm::Sums`]): each
/// rank's sums summed in rank order, the same on every rank. One process alone sums nothing.
pub(super) struct BatchSums<'a> {
    comm: Option<&'a dyn Collective>,
}

impl<'a> BatchSums<'a> {
    pub(super) fn of(ctx: &'a Ctx) -> Self {
        BatchSums {
            comm: ctx.comm.as_deref().filter(|c| c.world() > 1),
        }
    }
}

impl super::norm::Sums for BatchSums<'_> {
    fn ranks(&self) -> usize {
        self.comm.map_or(1, |c| c.world())
    }
    fn sum(&mut self, s: &mut [f64]) {
        if let Some(c) = self.comm {
            if let Err(e) = comm::all_reduce_sum_f64(c, s) {
                fatal(c, e);
            }
        }
    }
}
