//! Optimizer updates, in place, exactly per the `Op` docs (PyTorch semantics).

use rayon::prelude::*;

use super::par::ELEM_CHUNK;

/// SGD: g' = g + wd*w; with momentum: v = momentum*v + g',
/// step = nesterov ? g' + momentum*v : v; without: step = g'. w -= lr*step.
/// `v` must be `Some` iff `momentum != 0`.
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
    match v {
        None => w
            .par_chunks_mut(ELEM_CHUNK)
            .zip(g.par_chunks(ELEM_CHUNK))
            .for_each(|(wc, gc)| {
                for (w, &g) in wc.iter_mut().zip(gc) {
                    let g = g + weight_decay * *w;
                    *w -= lr * g;
                }
            }),
        Some(v) => {
            assert_eq!(v.len(), w.len(), "sgd: velocity size");
            w.par_chunks_mut(ELEM_CHUNK)
                .zip(g.par_chunks(ELEM_CHUNK))
                .zip(v.par_chunks_mut(ELEM_CHUNK))
                .for_each(|((wc, gc), vc)| {
                    for ((w, &g), v) in wc.iter_mut().zip(gc).zip(vc.iter_mut()) {
                        let g = g + weight_decay * *w;
                        *v = momentum * *v + g;
                        let step = if nesterov { g + momentum * *v } else { *v };
                        *w -= lr * step;
                    }
                })
        }
    }
}

/// Adam / AdamW with bias correction; `t` is the 1-based step counter (0 is treated as 1).
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
    let t = t.max(1).min(i32::MAX as u64) as i32;
    let bc1 = (1.0 - (beta1 as f64).powi(t)) as f32;
    let bc2 = (1.0 - (beta2 as f64).powi(t)) as f32;
    w.par_chunks_mut(ELEM_CHUNK)
        .zip(g.par_chunks(ELEM_CHUNK))
        .zip(
            m.par_chunks_mut(ELEM_CHUNK)
                .zip(v.par_chunks_mut(ELEM_CHUNK)),
        )
        .for_each(|((wc, gc), (mc, vc))| {
            for (((w, &g), m), v) in wc.iter_mut().zip(gc).zip(mc.iter_mut()).zip(vc.iter_mut()) {
                let mut g = g;
                if decoupled {
                    *w -= lr * weight_decay * *w;
                } else {
                    g += weight_decay * *w;
                }
                *m = beta1 * *m + (1.0 - beta1) * g;
                *v = beta2 * *v + (1.0 - beta2) * g * g;
                let mh = *m / bc1;
                let vh = *v / bc2;
                *w -= lr * mh / (vh.sqrt() + eps);
            }
        });
}
