//! Optimizer updates, in place, exactly per the `Op` docs (PyTorch semantics). The formulas live
//! once, per element ([`Sgd`], [`Adam`]); [`sgd_update`] / [`adam_update`] apply them to whole
//! tensors and [`update_block`] to a block of columns of a `[K, ld]` weight (the fused
//! weight-gradient + update kernels).

use dmc_compiler::op::UpdateRule;
use rayon::prelude::*;

use super::par::ELEM_CHUNK;

/// SGD hyper-parameters: g' = g + wd*w; with momentum: v = momentum*v + g',
/// step = nesterov ? g' + momentum*v : v; without: step = g'. w -= lr*step.
#[derive(Debug, Clone, Copy)]
pub struct Sgd {
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
    pub nesterov: bool,
}

impl Sgd {
    /// Without state (momentum 0).
    #[inline]
    pub fn plain(&self, w: &mut f32, g: f32) {
        let g = g + self.weight_decay * *w;
        *w -= self.lr * g;
    }
    /// With the velocity `v`.
    #[inline]
    pub fn with_velocity(&self, w: &mut f32, g: f32, v: &mut f32) {
        let g = g + self.weight_decay * *w;
        *v = self.momentum * *v + g;
        let step = if self.nesterov {
            g + self.momentum * *v
        } else {
            *v
        };
        *w -= self.lr * step;
    }
}

/// Adam / AdamW with bias correction for step `t`.
#[derive(Debug, Clone, Copy)]
pub struct Adam {
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    decoupled: bool,
    bc1: f32,
    bc2: f32,
}

impl Adam {
    /// `t` is the 1-based step counter (0 is treated as 1).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        decoupled: bool,
        t: u64,
    ) -> Self {
        let t = t.max(1).min(i32::MAX as u64) as i32;
        Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
            bc1: (1.0 - (beta1 as f64).powi(t)) as f32,
            bc2: (1.0 - (beta2 as f64).powi(t)) as f32,
        }
    }
    #[inline]
    pub fn step(&self, w: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
        let mut g = g;
        if self.decoupled {
            *w -= self.lr * self.weight_decay * *w;
        } else {
            g += self.weight_decay * *w;
        }
        *m = self.beta1 * *m + (1.0 - self.beta1) * g;
        *v = self.beta2 * *v + (1.0 - self.beta2) * g * g;
        let mh = *m / self.bc1;
        let vh = *v / self.bc2;
        *w -= self.lr * mh / (vh.sqrt() + self.eps);
    }
}

/// SGD on a whole tensor. `v` must be `Some` iff `momentum != 0`.
pub fn sgd_update(
    lr: f32,
    momentum: f32,
    weight_decay: f32,
    nesterov: bool,
    w: &mut [f32],
    g: &[f32],
    v: Option<&mut [f32]>,
) {
    assert_eq!(w.len(), g.len(), "sgd: size");
    let sgd = Sgd {
        lr,
        momentum,
        weight_decay,
        nesterov,
    };
    match v {
        None => w
            .par_chunks_mut(ELEM_CHUNK)
            .zip(g.par_chunks(ELEM_CHUNK))
            .for_each(|(wc, gc)| {
                for (w, &g) in wc.iter_mut().zip(gc) {
                    sgd.plain(w, g);
                }
            }),
        Some(v) => {
            assert_eq!(v.len(), w.len(), "sgd: velocity size");
            w.par_chunks_mut(ELEM_CHUNK)
                .zip(g.par_chunks(ELEM_CHUNK))
                .zip(v.par_chunks_mut(ELEM_CHUNK))
                .for_each(|((wc, gc), vc)| {
                    for ((w, &g), v) in wc.iter_mut().zip(gc).zip(vc.iter_mut()) {
                        sgd.with_velocity(w, g, v);
                    }
                })
        }
    }
}

/// Adam / AdamW on a whole tensor; `t` is the 1-based step counter (0 is treated as 1).
#[allow(clippy::too_many_arguments)]
pub fn adam_update(
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    decoupled: bool,
    t: u64,
    w: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
) {
    assert_eq!(w.len(), g.len(), "adam: size");
    assert_eq!(w.len(), m.len(), "adam: m size");
    assert_eq!(w.len(), v.len(), "adam: v size");
    let adam = Adam::new(lr, beta1, beta2, eps, weight_decay, decoupled, t);
    w.par_chunks_mut(ELEM_CHUNK)
        .zip(g.par_chunks(ELEM_CHUNK))
        .zip(
            m.par_chunks_mut(ELEM_CHUNK)
                .zip(v.par_chunks_mut(ELEM_CHUNK)),
        )
        .for_each(|((wc, gc), (mc, vc))| {
            for (((w, &g), m), v) in wc.iter_mut().zip(gc).zip(mc.iter_mut()).zip(vc.iter_mut()) {
                adam.step(w, g, m, v);
            }
        });
}

/// Rows per parallel task of [`update_block`].
const ROWS_PER_TASK: usize = 64;

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
    assert_eq!(
        states.len(),
        rule.state_names().len(),
        "update_block: state count"
    );
    for s in states.iter() {
        assert_eq!(s.len(), w.len(), "update_block: state size");
    }
    let g = &g[..k * nc];
    let cols = c0..c0 + nc;
    match (rule, states) {
        (
            UpdateRule::Sgd {
                lr,
                momentum,
                weight_decay,
                nesterov,
            },
            [],
        ) => {
            let sgd = Sgd {
                lr: *lr,
                momentum: *momentum,
                weight_decay: *weight_decay,
                nesterov: *nesterov,
            };
            w.par_chunks_mut(ld)
                .zip(g.par_chunks(nc))
                .with_min_len(ROWS_PER_TASK)
                .for_each(|(wr, gr)| {
                    for (w, &g) in wr[cols.clone()].iter_mut().zip(gr) {
                        sgd.plain(w, g);
                    }
                });
        }
        (
            UpdateRule::Sgd {
                lr,
                momentum,
                weight_decay,
                nesterov,
            },
            [v],
        ) => {
            let sgd = Sgd {
                lr: *lr,
                momentum: *momentum,
                weight_decay: *weight_decay,
                nesterov: *nesterov,
            };
            w.par_chunks_mut(ld)
                .zip(g.par_chunks(nc))
                .zip(v.par_chunks_mut(ld))
                .with_min_len(ROWS_PER_TASK)
                .for_each(|((wr, gr), vr)| {
                    let vr = &mut vr[cols.clone()];
                    for ((w, &g), v) in wr[cols.clone()].iter_mut().zip(gr).zip(vr) {
                        sgd.with_velocity(w, g, v);
                    }
                });
        }
        (
            UpdateRule::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                decoupled,
            },
            [m, v],
        ) => {
            let adam = Adam::new(*lr, *beta1, *beta2, *eps, *weight_decay, *decoupled, t);
            w.par_chunks_mut(ld)
                .zip(g.par_chunks(nc))
                .zip(m.par_chunks_mut(ld).zip(v.par_chunks_mut(ld)))
                .with_min_len(ROWS_PER_TASK)
                .for_each(|((wr, gr), (mr, vr))| {
                    let (mr, vr) = (&mut mr[cols.clone()], &mut vr[cols.clone()]);
                    for (((w, &g), m), v) in wr[cols.clone()].iter_mut().zip(gr).zip(mr).zip(vr) {
                        adam.step(w, g, m, v);
                    }
                });
        }
        _ => unreachable!("state count checked above"),
    }
}
