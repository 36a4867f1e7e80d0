//! The CPU kernels of layernorm: the forward against naive f64 loops written here from the
//! definition (per row over its last axis, biased variance) and a value worked by hand, the
//! backward against central finite differences of the forward (dx, dgamma, dbeta).

use crate::common;

use common::*;
use dmc_runtime::cpu::norm::{layernorm, layernorm_bwd};
use rand::Rng;

/// Per row of `[rows, c]`: (mean, biased variance), textbook two-pass in f64.
fn row_stats_ref(x: &[f32], c: usize) -> Vec<(f64, f64)> {
    x.chunks(c)
        .map(|row| {
            let m = row.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
            let v = row
                .iter()
                .map(|&v| (v as f64 - m) * (v as f64 - m))
                .sum::<f64>()
                / c as f64;
            (m, v)
        })
        .collect()
}

/// Shapes `[rows, c]`: one row, one feature, odd sizes, more features than a channel block (64).
const CASES: [(usize, usize); 6] = [(1, 3), (4, 1), (5, 3), (7, 11), (3, 130), (2, 64)];

fn run(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / gamma.len();
    let (mut y, mut mean, mut rstd) = (
        vec![f32::NAN; x.len()],
        vec![f32::NAN; rows],
        vec![f32::NAN; rows],
    );
    layernorm(x, gamma, beta, &mut y, &mut mean, &mut rstd, eps);
    (y, mean, rstd)
}

#[test]
fn layernorm_matches_the_definition() {
    let mut r = rng(50);
    for (rows, c) in CASES {
        let x: Vec<f32> = (0..rows * c)
            .map(|_| r.random_range(-3.0f32..5.0))
            .collect();
        let (gamma, beta) = (randv(&mut r, c), randv(&mut r, c));
        let eps = 1e-5;
        let (y, mean, rstd) = run(&x, &gamma, &beta, eps);
        let st = row_stats_ref(&x, c);
        let what = format!("layernorm {rows}x{c}");
        let want_mean: Vec<f64> = st.iter().map(|s| s.0).collect();
        let want_rstd: Vec<f64> = st.iter().map(|s| 1.0 / (s.1 + eps as f64).sqrt()).collect();
        assert_close(&what, &mean, &want_mean, 1e-6, 1e-6);
        assert_close(&what, &rstd, &want_rstd, 1e-5, 1e-5);
        let mut want_y = vec![0.0f64; x.len()];
        for (row, &(m, v)) in st.iter().enumerate() {
            for ch in 0..c {
                let i = row * c + ch;
                want_y[i] = (x[i] as f64 - m) / (v + eps as f64).sqrt() * gamma[ch] as f64
                    + beta[ch] as f64;
            }
        }
        assert_close(&what, &y, &want_y, 1e-5, 1e-5);
        // with weight 1 and bias 0 and several features: each row has mean 0, variance ~1
        if c >= 3 {
            let (y1, _, _) = run(&x, &vec![1.0; c], &vec![0.0; c], eps);
            for (m, v) in row_stats_ref(&y1, c) {
                assert!(m.abs() < 1e-5 && (v - 1.0).abs() < 1e-3, "{what}: {m} {v}");
            }
        }
    }
}

#[test]
fn layernorm_by_hand() {
    // rows [1, 2, 3] and [4, 4, 4]: means 2 and 4, biased variances 2/3 and 0
    let x = [1.0f32, 2.0, 3.0, 4.0, 4.0, 4.0];
    let (y, mean, rstd) = run(&x, &[2.0, 1.0, 1.0], &[0.5, 0.0, -1.0], 1e-3);
    let r0 = 1.0 / (2.0f64 / 3.0 + 1e-3).sqrt();
    let r1 = 1.0 / 1e-3f64.sqrt();
    assert_close("mean", &mean, &[2.0, 4.0], 1e-7, 1e-7);
    assert_close("rstd", &rstd, &[r0, r1], 1e-6, 1e-6);
    // a constant row is all bias
    assert_close(
        "y",
        &y,
        &[-2.0 * r0 + 0.5, 0.0, r0 - 1.0, 0.5, 0.0, -1.0],
        1e-6,
        1e-6,
    );
}

#[test]
fn layernorm_backward_matches_finite_differences() {
    let mut r = rng(51);
    for (rows, c) in [(5, 3), (2, 8), (3, 70), (6, 4)] {
        let x: Vec<f32> = (0..rows * c)
            .map(|_| r.random_range(-2.0f32..2.0))
            .collect();
        let gamma: Vec<f32> = (0..c).map(|_| r.random_range(0.5f32..1.5)).collect();
        let beta = randv(&mut r, c);
        let proj = randv(&mut r, rows * c);
        // L = sum y * proj, with each row's statistics a function of x
        let loss = |x: &[f32], gamma: &[f32], beta: &[f32]| -> f64 {
            dot(&run(x, gamma, beta, 1e-5).0, &proj)
        };
        let (_, mean, rstd) = run(&x, &gamma, &beta, 1e-5);
        let (mut dx, mut dg, mut db) = (
            vec![f32::NAN; x.len()],
            vec![f32::NAN; c],
            vec![f32::NAN; c],
        );
        layernorm_bwd(&proj, &x, &mean, &rstd, &gamma, &mut dx, &mut dg, &mut db);
        let what = format!("layernorm {rows}x{c}");
        fd_check_every(&format!("{what} dx"), &x, &dx, |xp| loss(xp, &gamma, &beta));
        fd_check_every(&format!("{what} dgamma"), &gamma, &dg, |gp| {
            loss(&x, gp, &beta)
        });
        fd_check_every(&format!("{what} dbeta"), &beta, &db, |bp| {
            loss(&x, &gamma, bp)
        });
        // each row's dx sums to 0 (the mean is subtracted)
        for row in dx.chunks(c) {
            let s: f64 = row.iter().map(|&v| v as f64).sum();
            assert!(s.abs() < 1e-4, "{what}: row of dx sums to {s}");
        }
    }
}

/// The rows are split over the threads (and the backward's channel blocks): the same bits on 1
/// thread and on 3, with more rows than a task holds and more channels than a block.
#[test]
fn layernorm_is_bit_identical_across_thread_counts() {
    let mut r = rng(53);
    let (rows, c) = (300, 200);
    let x: Vec<f32> = (0..rows * c)
        .map(|_| r.random_range(-3.0f32..5.0))
        .collect();
    let (gamma, beta, dy) = (randv(&mut r, c), randv(&mut r, c), randv(&mut r, rows * c));
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        pool.install(|| {
            let (y, mean, rstd) = run(&x, &gamma, &beta, 1e-5);
            let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; c], vec![0.0; c]);
            layernorm_bwd(&dy, &x, &mean, &rstd, &gamma, &mut dx, &mut dg, &mut db);
            [y, mean, rstd, dx, dg, db].map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>())
        })
    };
    assert!(
        run(1) == run(3),
        "layernorm differs between 1 and 3 threads"
    );
}
