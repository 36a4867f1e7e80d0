//! Optimizer updates, in place, exactly per the `Op` docs (PyTorch semantics). The formulas live
//! once, per element ([`Elem`], which reads the plan's own [`UpdateRule`]); [`update`] applies
//! them to whole tensors and [`update_block`] to a block of columns of a `[K, ld]` weight (the
//! fused weight-gradient + update kernels).

use dmc_plan::op::{UpdateRule, BIAS_CHUNK_ROWS};
use rayon::prelude::*;

use super::args::{state_slices, Args, Ctx};
use super::par::ELEM_CHUNK;
use super::shard;
use dmc_plan::op::OptimOp;

/// An update rule at one step, per element. SGD: g' = g + wd*w; with momentum:
/// v = momentum*v + g', step = nesterov ? g' + momentum*v : v; without: step = g'; w -= lr*step.
/// Adam / AdamW with bias correction for the step (computed once, here). RMSprop and Lion as
/// [`UpdateRule`] says.
#[derive(Debug, Clone, Copy)]
pub struct Elem {
    rule: UpdateRule,
    bc1: f32,
    bc2: f32,
    /// `clip_norm`'s factor for every gradient (1 without it).
    gscale: f32,
    /// `clip_value`'s bounds (infinite without it: the clamp then changes nothing, NaN included),
    /// so the element loops have no branch for it.
    lo: f32,
    hi: f32,
}

impl Elem {
    /// `rule` at the 1-based step counter `t` (0 is treated as 1).
    pub fn new(rule: &UpdateRule, t: u64) -> Self {
        let t = t.max(1).min(i32::MAX as u64) as i32;
        let (bc1, bc2) = match *rule {
            UpdateRule::Adam { beta1, beta2, .. } => (
                (1.0 - (beta1 as f64).powi(t)) as f32,
                (1.0 - (beta2 as f64).powi(t)) as f32,
            ),
            UpdateRule::Sgd { .. } | UpdateRule::RmsProp { .. } | UpdateRule::Lion { .. } => {
                (1.0, 1.0)
            }
        };
        // (a bound the checker would refuse, negative or NaN, counts as its magnitude / none
        // rather than panicking in `clamp`)
        let (lo, hi) = match rule.clip_value().map(f32::abs) {
            Some(v) if !v.is_nan() => (-v, v),
            _ => (f32::NEG_INFINITY, f32::INFINITY),
        };
        Elem {
            rule: *rule,
            bc1,
            bc2,
            gscale: 1.0,
            lo,
            hi,
        }
    }

    /// The same, every gradient first multiplied by `gscale` (`clip_norm`'s factor).
    pub fn scaled(self, gscale: f32) -> Self {
        Elem { gscale, ..self }
    }

    /// Updates the weight `w` with its gradient `g` and its state values `s`, one per
    /// [`UpdateRule::state_names`] (none or the velocity for SGD, m and v for Adam, v (and buf) for
    /// RMSprop, m for Lion). A state count
    /// that does not match the rule leaves everything as it is (the callers check it first).
    #[inline(always)]
    pub fn apply<const N: usize>(&self, w: &mut f32, g: f32, mut s: [&mut f32; N]) {
        // `clip_value`: the gradient clamped before anything else (weight decay included)
        let g = (g * self.gscale).clamp(self.lo, self.hi);
        match (self.rule, &mut s[..]) {
            (
                UpdateRule::Sgd {
                    lr, weight_decay, ..
                },
                [],
            ) => {
                let g = g + weight_decay * *w;
                *w -= lr * g;
            }
            (
                UpdateRule::Sgd {
                    lr,
                    momentum,
                    weight_decay,
                    nesterov,
                    ..
                },
                [v],
            ) => {
                let g = g + weight_decay * *w;
                **v = momentum * **v + g;
                let step = if nesterov { g + momentum * **v } else { **v };
                *w -= lr * step;
            }
            (
                UpdateRule::Adam {
                    lr,
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                    decoupled,
                    ..
                },
                [m, v],
            ) => {
                let mut g = g;
                if decoupled {
                    *w -= lr * weight_decay * *w;
                } else {
                    g += weight_decay * *w;
                }
                **m = beta1 * **m + (1.0 - beta1) * g;
                **v = beta2 * **v + (1.0 - beta2) * g * g;
                let mh = **m / self.bc1;
                let vh = **v / self.bc2;
                *w -= lr * mh / (vh.sqrt() + eps);
            }
            (
                UpdateRule::RmsProp {
                    lr,
                    alpha,
                    eps,
                    weight_decay,
                    ..
                },
                [v],
            ) => {
                let g = g + weight_decay * *w;
                **v = alpha * **v + (1.0 - alpha) * g * g;
                *w -= lr * (g / (v.sqrt() + eps));
            }
            (
                UpdateRule::RmsProp {
                    lr,
                    alpha,
                    eps,
                    weight_decay,
                    momentum,
                    ..
                },
                [v, buf],
            ) => {
                let g = g + weight_decay * *w;
                **v = alpha * **v + (1.0 - alpha) * g * g;
                **buf = momentum * **buf + g / (v.sqrt() + eps);
                *w -= lr * **buf;
            }
            (
                UpdateRule::Lion {
                    lr,
                    beta1,
                    beta2,
                    weight_decay,
                    ..
                },
                [m],
            ) => {
                *w *= 1.0 - lr * weight_decay;
                let c = beta1 * **m + (1.0 - beta1) * g;
                // sign(0) = 0, NaN stays NaN
                let s = if c > 0.0 {
                    1.0
                } else if c < 0.0 {
                    -1.0
                } else {
                    c * 0.0
                };
                *w -= lr * s;
                **m = beta2 * **m + (1.0 - beta2) * g;
            }
            _ => {}
        }
    }
}

/// Runs `$body` once per variant of `$e.rule` (the same code in each arm): inside an arm the
/// variant is known, so [`Elem::apply`]'s match folds away and the element loops in `$body`
/// vectorize (as `per_kind!` does for activations).
macro_rules! per_rule {
    ($e:expr, $body:expr) => {
        match $e.rule {
            UpdateRule::Sgd { .. } => $body,
            UpdateRule::Adam { .. } => $body,
            UpdateRule::RmsProp { .. } => $body,
            UpdateRule::Lion { .. } => $body,
        }
    };
}

/// Asserts what [`update`] and [`update_block`] index by: as many state tensors as the rule has,
/// each as long as the weight.
fn check_states(rule: &UpdateRule, w: &[f32], states: &[&mut [f32]], what: &str) {
    assert_eq!(
        states.len(),
        rule.state_names().len(),
        "{what}: state count"
    );
    for s in states.iter() {
        assert_eq!(s.len(), w.len(), "{what}: state size");
    }
}

/// The update `rule` at the 1-based step `t` on a whole tensor: the weight `w`, its gradient `g`
/// and its state tensors (one per [`UpdateRule::state_names`], in order).
pub fn update(rule: &UpdateRule, t: u64, w: &mut [f32], g: &[f32], states: &mut [&mut [f32]]) {
    update_scaled(rule, t, 1.0, w, g, states);
}

/// [`update`] with every gradient element first multiplied by `gscale` (`clip_norm`).
pub fn update_scaled(
    rule: &UpdateRule,
    t: u64,
    gscale: f32,
    w: &mut [f32],
    g: &[f32],
    states: &mut [&mut [f32]],
) {
    assert_eq!(w.len(), g.len(), "update: size");
    check_states(rule, w, states, "update");
    let e = Elem::new(rule, t).scaled(gscale);
    let (wc, gc) = (w.par_chunks_mut(ELEM_CHUNK), g.par_chunks(ELEM_CHUNK));
    match states {
        [] => wc.zip(gc).for_each(|(wc, gc)| {
            per_rule!(e, {
                for (w, &g) in wc.iter_mut().zip(gc) {
                    e.apply(w, g, []);
                }
            })
        }),
        [v] => wc
            .zip(gc)
            .zip(v.par_chunks_mut(ELEM_CHUNK))
            .for_each(|((wc, gc), vc)| {
                per_rule!(e, {
                    for ((w, &g), v) in wc.iter_mut().zip(gc).zip(vc.iter_mut()) {
                        e.apply(w, g, [v]);
                    }
                })
            }),
        [m, v] => wc
            .zip(gc)
            .zip(
                m.par_chunks_mut(ELEM_CHUNK)
                    .zip(v.par_chunks_mut(ELEM_CHUNK)),
            )
            .for_each(|((wc, gc), (mc, vc))| {
                per_rule!(e, {
                    for (((w, &g), m), v) in
                        wc.iter_mut().zip(gc).zip(mc.iter_mut()).zip(vc.iter_mut())
                    {
                        e.apply(w, g, [m, v]);
                    }
                })
            }),
        _ => unreachable!("state count checked above"),
    }
}

/// Rows per parallel task of [`update_block`].
const ROWS_PER_TASK: usize = 64;
/// Elements below which [`update_block`] runs on the calling thread (the CPU time model's
/// `dmc_plan::cpu::SERIAL_UPDATE_ELEMS`).
pub use dmc_plan::cpu::SERIAL_UPDATE_ELEMS;

/// The update `rule` applied to columns `c0..c0+nc` of the row-major `[K, ld]` weight `w` and of
/// its state tensors (same layout; as many as `rule.state_names()`), with the gradient of that
/// block in `g` (`[K, nc]`, row-major). `t` is Adam's 1-based step counter.
#[allow(clippy::too_many_arguments)]
pub fn update_block(
    rule: &UpdateRule,
    t: u64,
    w: &mut [f32],
    ld: usize,
    c0: usize,
    nc: usize,
    g: &[f32],
    states: &mut [&mut [f32]],
) {
    if ld == 0 || nc == 0 {
        return;
    }
    let k = w.len() / ld;
    assert_eq!(w.len(), k * ld, "update_block: w size");
    assert!(c0 + nc <= ld, "update_block: columns out of range");
    assert!(g.len() >= k * nc, "update_block: gradient block size");
    check_states(rule, w, states, "update_block");
    let g = &g[..k * nc];
    let cols = c0..c0 + nc;
    let e = Elem::new(rule, t);
    // a small block runs on this thread: a parallel loop's hand-off to the pool costs more
    let serial = k * nc < SERIAL_UPDATE_ELEMS;
    match states {
        [] => {
            let f = |(wr, gr): (&mut [f32], &[f32])| {
                per_rule!(e, {
                    for (w, &g) in wr[cols.clone()].iter_mut().zip(gr) {
                        e.apply(w, g, []);
                    }
                })
            };
            if serial {
                w.chunks_mut(ld).zip(g.chunks(nc)).for_each(f)
            } else {
                w.par_chunks_mut(ld)
                    .zip(g.par_chunks(nc))
                    .with_min_len(ROWS_PER_TASK)
                    .for_each(f)
            }
        }
        [v] => {
            let f = |((wr, gr), vr): ((&mut [f32], &[f32]), &mut [f32])| {
                let vr = &mut vr[cols.clone()];
                per_rule!(e, {
                    for ((w, &g), v) in wr[cols.clone()].iter_mut().zip(gr).zip(vr.iter_mut()) {
                        e.apply(w, g, [v]);
                    }
                })
            };
            if serial {
                w.chunks_mut(ld)
                    .zip(g.chunks(nc))
                    .zip(v.chunks_mut(ld))
                    .for_each(f)
            } else {
                w.par_chunks_mut(ld)
                    .zip(g.par_chunks(nc))
                    .zip(v.par_chunks_mut(ld))
                    .with_min_len(ROWS_PER_TASK)
                    .for_each(f)
            }
        }
        [m, v] => {
            type Row<'a> = ((&'a mut [f32], &'a [f32]), (&'a mut [f32], &'a mut [f32]));
            let f = |((wr, gr), (mr, vr)): Row| {
                let (mr, vr) = (&mut mr[cols.clone()], &mut vr[cols.clone()]);
                per_rule!(e, {
                    let ws = wr[cols.clone()].iter_mut();
                    for (((w, &g), m), v) in ws.zip(gr).zip(mr.iter_mut()).zip(vr.iter_mut()) {
                        e.apply(w, g, [m, v]);
                    }
                })
            };
            if serial {
                w.chunks_mut(ld)
                    .zip(g.chunks(nc))
                    .zip(m.chunks_mut(ld).zip(v.chunks_mut(ld)))
                    .for_each(f)
            } else {
                w.par_chunks_mut(ld)
                    .zip(g.par_chunks(nc))
                    .zip(m.par_chunks_mut(ld).zip(v.par_chunks_mut(ld)))
                    .with_min_len(ROWS_PER_TASK)
                    .for_each(f)
            }
        }
        _ => unreachable!("state count checked above"),
    }
}

/// `db[C]` = sum of `dy[R, C]` over its rows, as [`bias_col_sums`] (the two-level order every
/// backend uses). Parallel over column blocks (deterministic, no scratch).
pub fn bias_grad(dy: &[f32], db: &mut [f32]) {
    let c = db.len();
    if c == 0 {
        return;
    }
    assert_eq!(dy.len() % c, 0, "bias_grad: dy size");
    db.par_chunks_mut(BIAS_COLS)
        .enumerate()
        .for_each(|(bi, dbc)| bias_col_sums(dy, c, bi * BIAS_COLS, dbc));
}

/// Columns a [`bias_col_sums`] pass keeps in registers.
const BIAS_COLS: usize = 16;

/// `out[j]` = the sum of column `c0 + j` of `dy[R, c]` in the plan's order
/// ([`dmc_plan::op::BIAS_CHUNK_ROWS`]): per chunk of rows, the rows in order from 0; then the
/// chunk sums in order from 0. A GPU kernel sums the chunks in parallel and gets the same bits.
pub fn bias_col_sums(dy: &[f32], c: usize, c0: usize, out: &mut [f32]) {
    if c == 0 {
        return;
    }
    for (k, oc) in out.chunks_mut(BIAS_COLS).enumerate() {
        let (b0, nc) = (c0 + k * BIAS_COLS, oc.len());
        let mut tot = [0.0f32; BIAS_COLS];
        for chunk in dy.chunks(BIAS_CHUNK_ROWS * c) {
            let mut part = [0.0f32; BIAS_COLS];
            for row in chunk.chunks_exact(c) {
                for (p, v) in part[..nc].iter_mut().zip(&row[b0..b0 + nc]) {
                    *p += *v;
                }
            }
            for (t, p) in tot[..nc].iter_mut().zip(&part[..nc]) {
                *t += *p;
            }
        }
        oc.copy_from_slice(&tot[..nc]);
    }
}

/// The running squared norm `s` plus the sum of `g`'s squares (summed in f64, in order).
pub fn grad_sq_norm(s: f32, g: &[f32]) -> f32 {
    let sum: f64 = g.iter().map(|&x| (x as f64) * (x as f64)).sum();
    (s as f64 + sum) as f32
}

/// Gradient accumulation: `acc += scale * g`, per element.
pub fn grad_accum(scale: f32, acc: &mut [f32], g: &[f32]) {
    assert_eq!(acc.len(), g.len(), "grad_accum: size");
    acc.par_chunks_mut(ELEM_CHUNK)
        .zip(g.par_chunks(ELEM_CHUNK))
        .for_each(|(ac, gc)| {
            for (a, &g) in ac.iter_mut().zip(gc) {
                *a += scale * g;
            }
        });
}

/// The bias gradient `db = sum dy` (into the workspace `db`) and the update of `b` and its
/// `states` with it: `BiasGradUpdate`, and the bias part of a weight-gradient op that fused it.
pub fn bias_grad_update(
    rule: &UpdateRule,
    t: u64,
    dy: &[f32],
    b: &mut [f32],
    db: &mut [f32],
    states: &mut [&mut [f32]],
) {
    let c = b.len();
    let db = &mut db[..c];
    bias_grad(dy, db);
    update_block(rule, t, b, c, 0, c, db, states);
}

/// Runs one step of an op of the optimizer family: the step's arguments, taken by signature slot,
/// handed to the kernels above.
///
/// # Safety
/// As [`exec`](super::executor::exec): a validated step, exclusive access to the arena; each
/// mutable slice is taken only for a slot with role Out, InOut or Workspace.
pub(super) unsafe fn exec(op: &OptimOp, a: &Args, ctx: &Ctx) {
    // SAFETY: (all calls below) see this function's contract; slot indices follow the signature.
    unsafe {
        match op {
            OptimOp::BiasGrad => bias_grad(a.f32(0), a.f32_mut(1)),
            OptimOp::Update {
                rule,
                shards,
                zero_grad,
                summed,
                keep_rows,
            } if *shards > 1 => {
                let ns = rule.state_names().len();
                let mut states = state_slices(a, 2, ns);
                // clip_norm: the factor from the squared global norm (the argument after the
                // state), then the workspace
                let clip = rule.clip_norm().is_some();
                let gscale = match clip {
                    true => rule.norm_scale(a.f32(2 + ns)[0]),
                    false => 1.0,
                };
                let ws = a.f32_mut(2 + ns + clip as usize);
                let (acc, tmp) = ws.split_at_mut(ws.len() / 2);
                shard::update_elems(
                    ctx,
                    rule,
                    (a.f32_mut(0), a.f32(1)),
                    (*summed, gscale),
                    (acc, tmp),
                    &mut states[..ns],
                    !keep_rows,
                );
                if *zero_grad {
                    // this rank's accumulated gradient, consumed (g is InOut here)
                    a.f32_mut(1).fill(0.0);
                }
            }
            OptimOp::Update {
                rule, zero_grad, ..
            } => {
                let ns = rule.state_names().len();
                let w = a.f32_mut(0);
                let mut states = state_slices(a, 2, ns);
                // clip_norm: the factor from the squared global norm (the argument after the state)
                let gscale = match rule.clip_norm() {
                    Some(_) => rule.norm_scale(a.f32(2 + ns)[0]),
                    None => 1.0,
                };
                update_scaled(
                    &ctx.rule(rule),
                    ctx.step_counter,
                    gscale,
                    w,
                    a.f32(1),
                    &mut states[..ns],
                );
                if *zero_grad {
                    // the accumulated gradient, consumed (g is InOut here)
                    a.f32_mut(1).fill(0.0);
                }
            }
            OptimOp::GradAccum { scale } => grad_accum(*scale, a.f32_mut(0), a.f32(1)),
            OptimOp::GradAllReduce { .. } => shard::all_reduce(ctx, a.f32_mut(0), a.f32_mut(1)),
            OptimOp::GatherShard { layout } => {
                shard::gather_shard(ctx, layout, a.f32(0), a.f32_mut(1))
            }
            OptimOp::KeepShard { layout } => shard::keep_shard(ctx, layout, a.f32(0), a.f32_mut(1)),
            OptimOp::GradSqNorm { first } => {
                let s = a.f32_mut(1);
                s[0] = grad_sq_norm(if *first { 0.0 } else { s[0] }, a.f32(0));
            }
            // the norm pass's squared norm, kept for the update pass; the sum restarts at 0
            OptimOp::GradNormStore => {
                let sum = a.f32_mut(0);
                a.f32_mut(1)[0] = sum[0];
                sum[0] = 0.0;
            }
            OptimOp::BiasGradUpdate {
                rule,
                shards,
                keep_rows,
            } if *shards > 1 => {
                let ns = rule.state_names().len();
                let (b, db) = (a.f32_mut(1), a.f32_mut(2 + ns));
                let mut states = state_slices(a, 2, ns);
                bias_grad(a.f32(0), &mut db[..b.len()]);
                let c = b.len();
                let tmp = a.f32_mut(3 + ns);
                shard::update_bias(
                    ctx,
                    rule,
                    (b, &mut db[..c], tmp),
                    &mut states[..ns],
                    !keep_rows,
                );
            }
            OptimOp::BiasGradUpdate { rule, .. } => {
                let ns = rule.state_names().len();
                let db = a.f32_mut(2 + ns);
                let b = a.f32_mut(1);
                let mut states = state_slices(a, 2, ns);
                bias_grad_update(
                    &ctx.rule(rule),
                    ctx.step_counter,
                    a.f32(0),
                    b,
                    db,
                    &mut states[..ns],
                );
            }
        }
    }
}
