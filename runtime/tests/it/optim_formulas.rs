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
