//! The elementwise product and the join along the last axis: the forward kernels against naive
//! loops written from the definitions, the backward (the product itself for `multiply`, the slice
//! for `concat`) against central finite differences of the forward.

use crate::common::*;
use dmc_runtime::cpu::elementwise::{concat, mul, slice_last};

#[test]
fn mul_forward_matches_reference_and_its_vjp_finite_differences() {
    let mut r = rng(41);
    let n = 10007;
    let a = randv(&mut r, n);
    let b = randv(&mut r, n);
    let mut y = vec![f32::NAN; n];
    mul(&a, &b, &mut y);
    let want: Vec<f64> = (0..n).map(|i| a[i] as f64 * b[i] as f64).collect();
    assert_close("mul", &y, &want, 1e-7, 0.0);

    // L(a, b) = sum(a * b * rr): dL/da = rr * b, dL/db = rr * a, each by the forward kernel
    let m = 301;
    let (a, b, rr) = (randv(&mut r, m), randv(&mut r, m), randv(&mut r, m));
    let mut da = vec![f32::NAN; m];
    let mut db = vec![f32::NAN; m];
    mul(&rr, &b, &mut da);
    mul(&rr, &a, &mut db);
    let l = |a: &[f32], b: &[f32]| {
        let mut y = vec![0.0; a.len()];
        mul(a, b, &mut y);
        dot(&y, &rr)
    };
    fd_check("mul da", &a, &da, m, |a| l(a, &b));
    fd_check("mul db", &b, &db, m, |b| l(&a, b));
    // a * a: the two contributions summed, 2 a dy
    let mut sq = vec![f32::NAN; m];
    mul(&rr, &a, &mut sq);
    let twice: Vec<f32> = sq.iter().map(|v| 2.0 * v).collect();
    fd_check("mul a*a", &a, &twice, m, |a| l(a, a));
}

/// y[r, j] for rows of `ca` and `cb` channels, from the definition.
fn concat_ref(rows: usize, ca: usize, cb: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
    let mut y = vec![];
    for row in 0..rows {
        for j in 0..ca {
            y.push(a[row * ca + j] as f64);
        }
        for j in 0..cb {
            y.push(b[row * cb + j] as f64);
        }
    }
    y
}

#[test]
fn concat_forward_matches_reference_and_slices_match_finite_differences() {
    let mut r = rng(42);
    // rows of odd widths, a row count spanning several parallel chunks
    for (rows, ca, cb) in [(1, 1, 1), (7, 3, 5), (2000, 7, 1), (33, 16, 32)] {
        let a = randv(&mut r, rows * ca);
        let b = randv(&mut r, rows * cb);
        let mut y = vec![f32::NAN; rows * (ca + cb)];
        concat(ca, cb, &a, &b, &mut y);
        let want = concat_ref(rows, ca, cb, &a, &b);
        assert_close(&format!("concat {rows}x({ca}+{cb})"), &y, &want, 0.0, 0.0);

        // L = sum(concat(a, b) * rr): dL/da = rr[.., ..ca], dL/db = rr[.., ca..]
        let c = ca + cb;
        let rr = randv(&mut r, rows * c);
        let mut da = vec![f32::NAN; rows * ca];
        let mut db = vec![f32::NAN; rows * cb];
        slice_last(c, 0, ca, &rr, &mut da);
        slice_last(c, ca, cb, &rr, &mut db);
        let l = |a: &[f32], b: &[f32]| {
            let mut y = vec![0.0; a.len() + b.len()];
            concat(ca, cb, a, b, &mut y);
            dot(&y, &rr)
        };
        fd_check("concat da", &a, &da, 200, |a| l(a, &b));
        fd_check("concat db", &b, &db, 200, |b| l(&a, b));
    }
}

#[test]
fn slice_last_matches_reference() {
    let mut r = rng(43);
    let (rows, c) = (9, 11);
    let dy = randv(&mut r, rows * c);
    for (start, len) in [(0, 11), (0, 1), (10, 1), (3, 5)] {
        let mut dx = vec![f32::NAN; rows * len];
        slice_last(c, start, len, &dy, &mut dx);
        let mut want = vec![];
        for row in 0..rows {
            for j in start..start + len {
                want.push(dy[row * c + j] as f64);
            }
        }
        assert_close(&format!("slice {start}+{len}"), &dx, &want, 0.0, 0.0);
    }
}
