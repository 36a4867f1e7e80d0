//! The CPU kernels of the softmax layer, the MAE / Huber / BCE-with-logits losses, the
//! label-smoothed cross-entropy and the RMSprop / Lion updates: forwards against naive f64 loops
//! written here from the math, backwards against central finite differences of the forwards, and
//! the updates against f64 re-implementations over three steps.

use crate::common;

use common::*;
use dmc_plan::op::UpdateRule;
use dmc_runtime::cpu::elementwise::{softmax_bwd, softmax_fwd};
use dmc_runtime::cpu::loss::{
    bce_with_logits_loss, bce_with_logits_loss_bwd, cross_entropy_loss, cross_entropy_loss_bwd,
    cross_entropy_loss_smoothed, cross_entropy_loss_smoothed_bwd, huber_loss, huber_loss_bwd,
    mae_loss, mae_loss_bwd,
};
use dmc_runtime::cpu::optim::update;
use rand::Rng;

const H: f32 = 1e-2;

fn dot(a: &[f32], r: &[f32]) -> f64 {
    a.iter().zip(r).map(|(&a, &r)| a as f64 * r as f64).sum()
}

/// Checks `grad` (analytic dL/dx) against central differences of `l(x)` at every coordinate.
fn fd_check(what: &str, x: &[f32], grad: &[f32], l: impl Fn(&[f32]) -> f64) {
    assert_eq!(x.len(), grad.len());
    let mut xp = x.to_vec();
    let mut significant = 0;
    for i in 0..x.len() {
        let orig = xp[i];
        xp[i] = orig + H;
        let lp = l(&xp);
        xp[i] = orig - H;
        let lm = l(&xp);
        xp[i] = orig;
        let step = ((orig + H) as f64) - ((orig - H) as f64);
        let fd = (lp - lm) / step;
        let g = grad[i] as f64;
        let tol = 1e-2 * fd.abs().max(g.abs()) + 1e-4;
        assert!(
            (fd - g).abs() <= tol,
            "{what}: d/dx[{i}] analytic {g}, fd {fd} (tol {tol})"
        );
        significant += usize::from(g.abs() > 1e-3);
    }
    assert!(significant * 2 >= x.len(), "{what}: gradients mostly ~0");
}

/// softmax of one row in f64, the textbook formula (no max subtracted: the test's rows are small).
fn softmax_ref(row: &[f32]) -> Vec<f64> {
    let e: Vec<f64> = row.iter().map(|&v| (v as f64).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

#[test]
fn softmax_matches_the_formula_and_is_stable() {
    let mut r = rng(30);
    for (rows, c) in [(1, 1), (3, 7), (40, 10), (2, 1000)] {
        let x: Vec<f32> = (0..rows * c)
            .map(|_| r.random_range(-6.0f32..6.0))
            .collect();
        let mut y = vec![f32::NAN; x.len()];
        softmax_fwd(c, &x, &mut y);
        let want: Vec<f64> = x.chunks(c).flat_map(softmax_ref).collect();
        assert_close(&format!("softmax {rows}x{c}"), &y, &want, 1e-6, 1e-9);
    }
    // Large logits: e^1000 overflows, the max-subtracted form does not.
    let x = [1000.0f32, 999.0, 998.0, -1000.0];
    let mut y = [0.0f32; 4];
    softmax_fwd(4, &x, &mut y);
    let want = softmax_ref(&[0.0, -1.0, -2.0, -2000.0]);
    assert_close("softmax of large logits", &y, &want, 1e-6, 1e-12);
    assert!(y.iter().all(|v| v.is_finite()));
}

#[test]
fn softmax_vjp_matches_finite_differences() {
    let mut r = rng(31);
    let (rows, c) = (4, 6);
    let x: Vec<f32> = (0..rows * c)
        .map(|_| r.random_range(-2.0f32..2.0))
        .collect();
    let rr = randv(&mut r, x.len());
    let mut y = vec![0.0; x.len()];
    softmax_fwd(c, &x, &mut y);
    let mut dx = vec![f32::NAN; x.len()];
    softmax_bwd(c, &y, &rr, &mut dx);
    fd_check("softmax", &x, &dx, |x| {
        let mut y = vec![0.0; x.len()];
        softmax_fwd(c, x, &mut y);
        dot(&y, &rr)
    });
}

/// Predictions and targets whose differences stay 2h away from the losses' kinks (0 for MAE,
/// +-delta for Huber).
fn pred_target(seed: u64, n: usize, kinks: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut r = rng(seed);
    let t = randv(&mut r, n);
    let p = t
        .iter()
        .map(|&t| loop {
            let d: f32 = r.random_range(-2.0f32..2.0);
            if kinks.iter().all(|k| (d - k).abs() > 2.0 * H) {
                return t + d;
            }
        })
        .collect();
    (p, t)
}

#[test]
fn mae_and_huber_match_the_formulas_and_their_gradients() {
    let n = 3 * 7;
    let (p, t) = pred_target(32, n, &[0.0]);
    let want: f64 = p
        .iter()
        .zip(&t)
        .map(|(&p, &t)| (p as f64 - t as f64).abs())
        .sum::<f64>()
        / n as f64;
    assert!((mae_loss(&p, &t) as f64 - want).abs() <= 1e-6 * want);
    let mut dp = vec![f32::NAN; n];
    mae_loss_bwd(&p, &t, &mut dp);
    fd_check("mae", &p, &dp, |p| mae_loss(p, &t) as f64);
    // equal values: PyTorch's sign(0) = 0
    let mut d0 = [f32::NAN];
    mae_loss_bwd(&[0.5], &[0.5], &mut d0);
    assert_eq!(d0[0], 0.0);

    for delta in [0.5f32, 1.0, 3.0] {
        let (p, t) = pred_target(33, n, &[delta, -delta]);
        let dl = delta as f64;
        let want: f64 = p
            .iter()
            .zip(&t)
            .map(|(&p, &t)| {
                let a = (p as f64 - t as f64).abs();
                if a < dl {
                    0.5 * a * a
                } else {
                    dl * a - 0.5 * dl * dl
                }
            })
            .sum::<f64>()
            / n as f64;
        let got = huber_loss(delta, &p, &t) as f64;
        assert!(
            (got - want).abs() <= 1e-6 * want,
            "huber {delta}: {got} vs {want}"
        );
        let mut dp = vec![f32::NAN; n];
        huber_loss_bwd(delta, &p, &t, &mut dp);
        fd_check(&format!("huber {delta}"), &p, &dp, |p| {
            huber_loss(delta, p, &t) as f64
        });
    }
}

#[test]
fn bce_with_logits_matches_the_formula_and_its_gradient() {
    let mut r = rng(34);
    let n = 5 * 4;
    let x: Vec<f32> = (0..n).map(|_| r.random_range(-4.0f32..4.0)).collect();
    // multi-label 0/1 targets and soft targets
    for soft in [false, true] {
        let t: Vec<f32> = (0..n)
            .map(|_| {
                if soft {
                    r.random_range(0.0f32..1.0)
                } else {
                    f32::from(r.random_bool(0.5))
                }
            })
            .collect();
        // -[t ln s(x) + (1-t) ln(1 - s(x))], the definition
        let want: f64 = x
            .iter()
            .zip(&t)
            .map(|(&x, &t)| {
                let s = 1.0 / (1.0 + (-(x as f64)).exp());
                -(t as f64 * s.ln() + (1.0 - t as f64) * (1.0 - s).ln())
            })
            .sum::<f64>()
            / n as f64;
        let got = bce_with_logits_loss(&x, &t) as f64;
        assert!((got - want).abs() <= 1e-6 * want, "bce: {got} vs {want}");
        let mut dx = vec![f32::NAN; n];
        bce_with_logits_loss_bwd(&x, &t, &mut dx);
        fd_check("bce", &x, &dx, |x| bce_with_logits_loss(x, &t) as f64);
    }
    // stable for large logits: the definition in f64 overflows to inf, the kernel does not
    let l = bce_with_logits_loss(&[100.0, -100.0], &[0.0, 1.0]);
    assert!((l as f64 - 100.0).abs() < 1e-4, "{l}");
}

#[test]
fn label_smoothing_matches_the_smoothed_target_and_its_gradient() {
    let mut r = rng(35);
    let (n, c) = (5, 7);
    let logits: Vec<f32> = (0..n * c).map(|_| r.random_range(-3.0f32..3.0)).collect();
    let labels: Vec<i32> = (0..n).map(|_| r.random_range(0..c as i32)).collect();
    // 0 is the plain cross-entropy, exactly
    assert_eq!(
        cross_entropy_loss_smoothed(&logits, &labels, c, 0.0),
        cross_entropy_loss(&logits, &labels, c)
    );
    let mut d0 = vec![0.0; n * c];
    let mut d1 = vec![1.0; n * c];
    cross_entropy_loss_bwd(&logits, &labels, c, &mut d0).unwrap();
    cross_entropy_loss_smoothed_bwd(&logits, &labels, c, 0.0, &mut d1).unwrap();
    assert_eq!(d0, d1);
    for e in [0.1f32, 0.5] {
        // -sum_j q_j ln softmax_j with q = (1-e) onehot + e/C, the definition
        let want: f64 = (0..n)
            .map(|i| {
                let sm = softmax_ref(&logits[i * c..(i + 1) * c]);
                (0..c)
                    .map(|j| {
                        let q = if j == labels[i] as usize {
                            1.0 - e as f64
                        } else {
                            0.0
                        } + e as f64 / c as f64;
                        -q * sm[j].ln()
                    })
                    .sum::<f64>()
            })
            .sum::<f64>()
            / n as f64;
        let got = cross_entropy_loss_smoothed(&logits, &labels, c, e).unwrap() as f64;
        assert!(
            (got - want).abs() <= 1e-6 * want,
            "smoothing {e}: {got} vs {want}"
        );
        let mut dl = vec![f32::NAN; n * c];
        cross_entropy_loss_smoothed_bwd(&logits, &labels, c, e, &mut dl).unwrap();
        fd_check(&format!("ce smoothing {e}"), &logits, &dl, |l| {
            cross_entropy_loss_smoothed(l, &labels, c, e).unwrap() as f64
        });
    }
}

#[test]
fn rmsprop_matches_pytorchs_formulas() {
    let mut r = rng(36);
    let n = 37;
    let w0 = randv(&mut r, n);
    let grads: Vec<Vec<f32>> = (0..3).map(|_| randv(&mut r, n)).collect();
    for &(momentum, wd, eps, alpha) in &[
        (0.0f32, 0.0f32, 1e-8f32, 0.99f32),
        (0.0, 0.1, 0.1, 0.9),
        (0.9, 0.0, 1e-8, 0.99),
        (0.8, 0.05, 0.05, 0.95),
    ] {
        let lr = 1e-2f32;
        let rule = UpdateRule::RmsProp {
            lr,
            alpha,
            eps,
            weight_decay: wd,
            momentum,
            clip_value: None,
            clip_norm: None,
        };
        let (mut w, mut v, mut buf) = (w0.clone(), vec![0.0f32; n], vec![0.0f32; n]);
        let mut ew: Vec<f64> = w0.iter().map(|&x| x as f64).collect();
        let (mut ev, mut eb) = (vec![0.0f64; n], vec![0.0f64; n]);
        for g in &grads {
            let mut states: Vec<&mut [f32]> = if momentum != 0.0 {
                vec![&mut v[..], &mut buf[..]]
            } else {
                vec![&mut v[..]]
            };
            update(&rule, 1, &mut w, g, &mut states);
            let (lr, a, eps, mo, wd) = (
                lr as f64,
                alpha as f64,
                eps as f64,
                momentum as f64,
                wd as f64,
            );
            for i in 0..n {
                let gp = g[i] as f64 + wd * ew[i];
                ev[i] = a * ev[i] + (1.0 - a) * gp * gp;
                let avg = ev[i].sqrt() + eps;
                if mo != 0.0 {
                    eb[i] = mo * eb[i] + gp / avg;
                    ew[i] -= lr * eb[i];
                } else {
                    ew[i] -= lr * gp / avg;
                }
            }
        }
        let what = format!("rmsprop m={momentum} wd={wd} eps={eps} alpha={alpha}");
        assert_close(&what, &w, &ew, 1e-5, 1e-6);
        assert_close(&format!("{what} v"), &v, &ev, 1e-5, 1e-7);
        if momentum != 0.0 {
            assert_close(&format!("{what} buf"), &buf, &eb, 1e-4, 1e-5);
        }
    }
}

#[test]
fn lion_matches_its_formulas() {
    let mut r = rng(37);
    let n = 41;
    let w0 = randv(&mut r, n);
    let grads: Vec<Vec<f32>> = (0..3).map(|_| randv(&mut r, n)).collect();
    for &(wd, b1, b2) in &[(0.0f32, 0.9f32, 0.99f32), (0.1, 0.8, 0.95)] {
        let lr = 1e-3f32;
        let rule = UpdateRule::Lion {
            lr,
            beta1: b1,
            beta2: b2,
            weight_decay: wd,
            clip_value: None,
            clip_norm: None,
        };
        let (mut w, mut m) = (w0.clone(), vec![0.0f32; n]);
        let mut ew: Vec<f64> = w0.iter().map(|&x| x as f64).collect();
        let mut em = vec![0.0f64; n];
        for g in &grads {
            update(&rule, 1, &mut w, g, &mut [&mut m[..]]);
            let (lr, b1, b2, wd) = (lr as f64, b1 as f64, b2 as f64, wd as f64);
            for i in 0..n {
                let g = g[i] as f64;
                let c = b1 * em[i] + (1.0 - b1) * g;
                ew[i] = ew[i] * (1.0 - lr * wd) - lr * c.signum() * f64::from(u8::from(c != 0.0));
                em[i] = b2 * em[i] + (1.0 - b2) * g;
            }
        }
        let what = format!("lion wd={wd} b1={b1} b2={b2}");
        assert_close(&what, &w, &ew, 1e-5, 1e-6);
        assert_close(&format!("{what} m"), &m, &em, 1e-5, 1e-6);
    }
    // sign(0) = 0: a zero gradient on a zero moment leaves the weight (without decay) alone
    let rule = UpdateRule::Lion {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.99,
        weight_decay: 0.0,
        clip_value: None,
        clip_norm: None,
    };
    let (mut w, mut m) = ([0.5f32], [0.0f32]);
    update(&rule, 1, &mut w, &[0.0], &mut [&mut m[..]]);
    assert_eq!(w, [0.5]);
}
