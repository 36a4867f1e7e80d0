//! Optimizers: 3 steps against the formulas in f64 scalar loops.

use crate::common;

use common::*;
use dmc_plan::op::UpdateRule;
use dmc_runtime::cpu::optim::update;

#[test]
fn sgd_matches_formulas() {
    let mut r = rng(20);
    let n = 37;
    let w0 = randv(&mut r, n);
    let grads: Vec<Vec<f32>> = (0..3).map(|_| randv(&mut r, n)).collect();
    for &(momentum, wd, nesterov) in &[
        (0.0, 0.0, false),
        (0.0, 0.1, false),
        (0.9, 0.0, false),
        (0.9, 0.01, false),
        (0.8, 0.05, true),
    ] {
        let lr = 0.1f32;
        let mut w = w0.clone();
        let mut v = vec![0.0f32; n];
        let mut ew: Vec<f64> = w0.iter().map(|&x| x as f64).collect();
        let mut ev = vec![0.0f64; n];
        for g in &grads {
            let rule = UpdateRule::Sgd {
                lr,
                momentum,
                weight_decay: wd,
                nesterov,
                clip_value: None,
                clip_norm: None,
            };
            let mut states: Vec<&mut [f32]> = if momentum != 0.0 {
                vec![&mut v[..]]
            } else {
                vec![]
            };
            update(&rule, 1, &mut w, g, &mut states);
            for i in 0..n {
                let (lr, mo, wd) = (lr as f64, momentum as f64, wd as f64);
                let gp = g[i] as f64 + wd * ew[i];
                let step = if mo != 0.0 {
                    ev[i] = mo * ev[i] + gp;
                    if nesterov {
                        gp + mo * ev[i]
                    } else {
                        ev[i]
                    }
                } else {
                    gp
                };
                ew[i] -= lr * step;
            }
        }
        let what = format!("sgd m={momentum} wd={wd} nesterov={nesterov}");
        assert_close(&what, &w, &ew, 1e-5, 1e-6);
        if momentum != 0.0 {
            assert_close(&format!("{what} v"), &v, &ev, 1e-5, 1e-6);
        }
    }
}

#[test]
fn adam_matches_formulas() {
    let mut r = rng(21);
    let n = 41;
    let w0 = randv(&mut r, n);
    let grads: Vec<Vec<f32>> = (0..3).map(|_| randv(&mut r, n)).collect();
    // a large eps in some cases so that its placement (outside the sqrt) matters
    for &(wd, decoupled, eps, b1, b2) in &[
        (0.0, false, 1e-8f32, 0.9f32, 0.999f32),
        (0.1, false, 0.1, 0.8, 0.9),
        (0.1, true, 1e-8, 0.9, 0.999),
        (0.2, true, 0.05, 0.7, 0.95),
    ] {
        let lr = 1e-2f32;
        let mut w = w0.clone();
        let mut m = vec![0.0f32; n];
        let mut v = vec![0.0f32; n];
        let mut ew: Vec<f64> = w0.iter().map(|&x| x as f64).collect();
        let mut em = vec![0.0f64; n];
        let mut ev = vec![0.0f64; n];
        for (t, g) in grads.iter().enumerate() {
            let t = t as u64 + 1;
            let rule = UpdateRule::Adam {
                lr,
                beta1: b1,
                beta2: b2,
                eps,
                weight_decay: wd,
                decoupled,
                clip_value: None,
                clip_norm: None,
            };
            update(&rule, t, &mut w, g, &mut [&mut m[..], &mut v[..]]);
            let (lr, b1, b2, eps, wd) = (lr as f64, b1 as f64, b2 as f64, eps as f64, wd as f64);
            for i in 0..n {
                let mut gi = g[i] as f64;
                if decoupled {
                    ew[i] -= lr * wd * ew[i];
                } else {
                    gi += wd * ew[i];
                }
                em[i] = b1 * em[i] + (1.0 - b1) * gi;
                ev[i] = b2 * ev[i] + (1.0 - b2) * gi * gi;
                let mh = em[i] / (1.0 - b1.powi(t as i32));
                let vh = ev[i] / (1.0 - b2.powi(t as i32));
                ew[i] -= lr * mh / (vh.sqrt() + eps);
            }
        }
        let what = format!("adam wd={wd} decoupled={decoupled} eps={eps}");
        assert_close(&what, &w, &ew, 1e-5, 1e-6);
        assert_close(&format!("{what} m"), &m, &em, 1e-5, 1e-7);
        assert_close(&format!("{what} v"), &v, &ev, 1e-4, 1e-9);
    }
}

/// A block of columns of a `[K, ld]` weight updated by `update_block` changes exactly those
/// columns, each as the whole-tensor `update` of the same values would: for a block small
/// enough to run on the calling thread and for one large enough to run as a parallel loop
/// (`SERIAL_UPDATE_ELEMS`), with no state, one and two.
#[test]
fn column_blocks_update_as_the_whole_tensor_would_on_and_off_the_pool() {
    use dmc_runtime::cpu::optim::{update_block, SERIAL_UPDATE_ELEMS};
    let mut r = rng(21);
    let (k, ld) = (300, 96);
    let rules = [
        UpdateRule::Sgd {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            clip_value: None,
            clip_norm: None,
        },
        UpdateRule::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 0.01,
            nesterov: true,
            clip_value: None,
            clip_norm: None,
        },
        UpdateRule::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            clip_value: None,
            clip_norm: None,
        },
    ];
    for rule in &rules {
        let ns = rule.state_names().len();
        for (c0, nc) in [(5, 3), (0, ld), (17, 60)] {
            let serial = k * nc < SERIAL_UPDATE_ELEMS;
            let w0 = randv(&mut r, k * ld);
            // (non-negative: Adam's second moment)
            let s0: Vec<Vec<f32>> = (0..ns)
                .map(|_| randv(&mut r, k * ld).iter().map(|v| v.abs()).collect())
                .collect();
            let g = randv(&mut r, k * nc);
            // the reference: the block's values gathered, updated as one tensor
            let take = |v: &[f32]| -> Vec<f32> {
                (0..k)
                    .flat_map(|i| v[i * ld + c0..i * ld + c0 + nc].to_vec())
                    .collect()
            };
            let mut wr = take(&w0);
            let mut sr: Vec<Vec<f32>> = s0.iter().map(|s| take(s)).collect();
            let mut sref: Vec<&mut [f32]> = sr.iter_mut().map(|s| s.as_mut_slice()).collect();
            update(rule, 3, &mut wr, &g, &mut sref);
            let mut w = w0.clone();
            let mut s = s0.clone();
            let mut sm: Vec<&mut [f32]> = s.iter_mut().map(|s| s.as_mut_slice()).collect();
            update_block(rule, 3, &mut w, ld, c0, nc, &g, &mut sm);
            let what = format!("{rule:?}, columns {c0}..{} (serial: {serial})", c0 + nc);
            for i in 0..k {
                for j in 0..ld {
                    let (at, inside) = (i * ld + j, (c0..c0 + nc).contains(&j));
                    let want = |v: &[f32], full: &[f32]| {
                        if inside {
                            v[i * nc + j - c0]
                        } else {
                            full[at]
                        }
                    };
                    assert_eq!(w[at].to_bits(), want(&wr, &w0).to_bits(), "w: {what}");
                    for (q, st) in s.iter().enumerate() {
                        assert_eq!(
                            st[at].to_bits(),
                            want(&sr[q], &s0[q]).to_bits(),
                            "state {q}: {what}"
                        );
                    }
                }
            }
        }
    }
}
