//! The CPU kernels of batchnorm: the forward and its inference form against naive f64 loops
//! written here from the definition (per channel over every other axis, biased variance), the
//! running statistics' update against PyTorch's momentum formula over several steps, the backward
//! against central finite differences of the forward, in place bit-identical to out of place.

use crate::common;

use common::*;
use dmc_runtime::cpu::norm::{
    batchnorm, batchnorm_bwd, batchnorm_bwd_in_place, batchnorm_infer, batchnorm_stats,
};
use rand::Rng;

/// Per channel of `[rows, c]`: (mean, biased variance), textbook two-pass in f64.
fn stats_ref(x: &[f32], c: usize) -> Vec<(f64, f64)> {
    let rows = x.len() / c;
    (0..c)
        .map(|ch| {
            let col: Vec<f64> = (0..rows).map(|r| x[r * c + ch] as f64).collect();
            let m = col.iter().sum::<f64>() / rows as f64;
            let v = col.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / rows as f64;
            (m, v)
        })
        .collect()
}

fn normalise_ref(x: &[f32], st: &[(f64, f64)], gamma: &[f32], beta: &[f32], eps: f64) -> Vec<f64> {
    let c = gamma.len();
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            let (m, var) = st[i % c];
            (v as f64 - m) / (var + eps).sqrt() * gamma[i % c] as f64 + beta[i % c] as f64
        })
        .collect()
}

/// Shapes `[rows, c]`: one row, odd sizes, more channels than one block of the kernel (64).
// (8, 16, 32 and 64 channels take the unrolled loops; 1,152 rows of 8: more than one task's)
const CASES: [(usize, usize); 9] = [
    (1, 3),
    (5, 3),
    (60, 7),
    (9, 130),
    (2, 64),
    (1152, 8),
    (40, 16),
    (33, 32),
    (300, 64),
];

#[test]
fn batchnorm_matches_the_definition() {
    let mut r = rng(40);
    for (rows, c) in CASES {
        let x: Vec<f32> = (0..rows * c)
            .map(|_| r.random_range(-3.0f32..5.0))
            .collect();
        let gamma = randv(&mut r, c);
        let beta = randv(&mut r, c);
        let (mut y, mut mean, mut var) = (
            vec![f32::NAN; x.len()],
            vec![f32::NAN; c],
            vec![f32::NAN; c],
        );
        batchnorm(&x, &gamma, &beta, &mut y, &mut mean, &mut var, 1e-5);
        let st = stats_ref(&x, c);
        let what = format!("batchnorm {rows}x{c}");
        assert_close(
            &what,
            &mean,
            &st.iter().map(|s| s.0).collect::<Vec<_>>(),
            1e-6,
            1e-6,
        );
        assert_close(
            &what,
            &var,
            &st.iter().map(|s| s.1).collect::<Vec<_>>(),
            1e-6,
            1e-6,
        );
        assert_close(
            &what,
            &y,
            &normalise_ref(&x, &st, &gamma, &beta, 1e-5),
            1e-5,
            1e-5,
        );
        // with gamma 1, beta 0 and several rows: each channel has mean 0, variance ~1
        if rows >= 5 {
            let ones = vec![1.0f32; c];
            let zeros = vec![0.0f32; c];
            batchnorm(&x, &ones, &zeros, &mut y, &mut mean, &mut var, 1e-5);
            for (m, v) in stats_ref(&y, c) {
                assert!(m.abs() < 1e-5 && (v - 1.0).abs() < 1e-3, "{what}: {m} {v}");
            }
        }
    }
}

#[test]
fn batchnorm_infer_uses_the_given_statistics() {
    let mut r = rng(41);
    let (rows, c) = (6, 5);
    let x = randv(&mut r, rows * c);
    let (gamma, beta) = (randv(&mut r, c), randv(&mut r, c));
    let rm = randv(&mut r, c);
    let rv: Vec<f32> = (0..c).map(|_| r.random_range(0.1f32..3.0)).collect();
    let mut y = vec![f32::NAN; x.len()];
    batchnorm_infer(&x, &gamma, &beta, &rm, &rv, &mut y, 1e-3);
    let st: Vec<(f64, f64)> = rm
        .iter()
        .zip(&rv)
        .map(|(&m, &v)| (m as f64, v as f64))
        .collect();
    assert_close(
        "batchnorm_infer",
        &y,
        &normalise_ref(&x, &st, &gamma, &beta, 1e-3),
        1e-6,
        1e-6,
    );
}

#[test]
fn running_statistics_follow_pytorchs_momentum() {
    let mut r = rng(42);
    let (rows, c, momentum) = (12, 4, 0.1f64);
    let (mut rm, mut rv) = (vec![0.0f32; c], vec![1.0f32; c]);
    let (mut wm, mut wv) = (vec![0.0f64; c], vec![1.0f64; c]);
    for _ in 0..5 {
        let x: Vec<f32> = (0..rows * c)
            .map(|_| r.random_range(-1.0f32..4.0))
            .collect();
        let (mut y, mut mean, mut var) = (vec![0.0; x.len()], vec![0.0; c], vec![0.0; c]);
        batchnorm(
            &x,
            &vec![1.0; c],
            &vec![0.0; c],
            &mut y,
            &mut mean,
            &mut var,
            1e-5,
        );
        batchnorm_stats(&mut rm, &mut rv, &mean, &var, momentum as f32, rows);
        for (ch, (m, v)) in stats_ref(&x, c).into_iter().enumerate() {
            // torch: running = (1 - momentum) running + momentum batch, unbiased variance
            wm[ch] = (1.0 - momentum) * wm[ch] + momentum * m;
            wv[ch] = (1.0 - momentum) * wv[ch] + momentum * v * rows as f64 / (rows - 1) as f64;
        }
    }
    assert_close("running_mean", &rm, &wm, 1e-6, 1e-6);
    assert_close("running_var", &rv, &wv, 1e-6, 1e-6);
}

#[test]
fn batchnorm_backward_matches_finite_differences() {
    let mut r = rng(43);
    for (rows, c) in [(5, 3), (8, 2), (3, 70), (6, 8), (4, 16)] {
        let x: Vec<f32> = (0..rows * c)
            .map(|_| r.random_range(-2.0f32..2.0))
            .collect();
        let gamma: Vec<f32> = (0..c).map(|_| r.random_range(0.5f32..1.5)).collect();
        let beta = randv(&mut r, c);
        let proj = randv(&mut r, rows * c);
        // L = sum y * proj, with the batch statistics a function of x
        let loss = |x: &[f32], gamma: &[f32], beta: &[f32]| -> f64 {
            let (mut y, mut m, mut v) = (vec![0.0; x.len()], vec![0.0; c], vec![0.0; c]);
            batchnorm(x, gamma, beta, &mut y, &mut m, &mut v, 1e-5);
            y.iter()
                .zip(&proj)
                .map(|(&a, &p)| a as f64 * p as f64)
                .sum()
        };
        let (mut y, mut mean, mut var) = (vec![0.0; x.len()], vec![0.0; c], vec![0.0; c]);
        batchnorm(&x, &gamma, &beta, &mut y, &mut mean, &mut var, 1e-5);
        let (mut dx, mut dg, mut db) = (
            vec![f32::NAN; x.len()],
            vec![f32::NAN; c],
            vec![f32::NAN; c],
        );
        batchnorm_bwd(
            &proj, &x, &mean, &var, &gamma, &mut dx, &mut dg, &mut db, 1e-5,
        );
        let what = format!("batchnorm {rows}x{c}");
        fd_check_every(&format!("{what} dx"), &x, &dx, |xp| loss(xp, &gamma, &beta));
        fd_check_every(&format!("{what} dgamma"), &gamma, &dg, |gp| {
            loss(&x, gp, &beta)
        });
        fd_check_every(&format!("{what} dbeta"), &beta, &db, |bp| {
            loss(&x, &gamma, bp)
        });
        // in place: the same bits
        let (mut dyx, mut dg2, mut db2) = (proj.clone(), vec![0.0; c], vec![0.0; c]);
        batchnorm_bwd_in_place(&mut dyx, &x, &mean, &var, &gamma, &mut dg2, &mut db2, 1e-5);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&dyx), bits(&dx), "{what}: in place");
        assert_eq!(
            (bits(&dg2), bits(&db2)),
            (bits(&dg), bits(&db)),
            "{what}: in place"
        );
    }
}
