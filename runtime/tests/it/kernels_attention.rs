//! The CPU kernels of the sequence family: fused attention against a naive attention written here
//! from the definition in f64 (the whole `T x T` score matrix, softmax, weighted values), its
//! backward against central finite differences of a scalar of the forward, the embedding against
//! a lookup and its backward against the sum it defines, bit for bit across thread counts.

use crate::common;

use common::*;
use dmc_runtime::cpu::seq::{attention, attention_bwd, embedding, embedding_bwd, AttnDims};

/// `(o, lse)` of multi-head attention, naive, in f64.
fn naive(qkv: &[f32], d: AttnDims) -> (Vec<f64>, Vec<f64>) {
    let (b, t, dm, h) = (d.b, d.t, d.d, d.heads);
    let dh = dm / h;
    let scale = 1.0 / (dh as f64).sqrt();
    let at = |bi: usize, i: usize, part: usize, hh: usize, c: usize| {
        qkv[(bi * t + i) * 3 * dm + part * dm + hh * dh + c] as f64
    };
    let mut o = vec![0.0; b * t * dm];
    let mut lse = vec![0.0; b * h * t];
    for bi in 0..b {
        for hh in 0..h {
            for i in 0..t {
                let keys = if d.causal { i + 1 } else { t };
                let s: Vec<f64> = (0..keys)
                    .map(|j| {
                        (0..dh)
                            .map(|c| at(bi, i, 0, hh, c) * at(bi, j, 1, hh, c))
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                lse[(bi * h + hh) * t + i] = m + z.ln();
                for c in 0..dh {
                    o[(bi * t + i) * dm + hh * dh + c] = (0..keys)
                        .map(|j| (s[j] - m).exp() / z * at(bi, j, 2, hh, c))
                        .sum();
                }
            }
        }
    }
    (o, lse)
}

fn dims(b: usize, t: usize, d: usize, heads: usize, causal: bool) -> AttnDims {
    AttnDims {
        b,
        t,
        d,
        heads,
        causal,
    }
}

/// Sequences shorter than a tile, longer than one (a partial last tile), several heads.
const CASES: [(usize, usize, usize, usize); 4] =
    [(1, 1, 4, 1), (2, 5, 6, 2), (1, 70, 8, 2), (2, 130, 4, 1)];

fn fwd(qkv: &[f32], d: AttnDims) -> (Vec<f32>, Vec<f32>) {
    let mut o = vec![f32::NAN; d.b * d.t * d.d];
    let mut lse = vec![f32::NAN; d.b * d.heads * d.t];
    attention(qkv, d, &mut o, &mut lse);
    (o, lse)
}

#[test]
fn fused_attention_matches_naive_attention() {
    let mut r = rng(16);
    for (b, t, dm, h) in CASES {
        for causal in [true, false] {
            let d = dims(b, t, dm, h, causal);
            let qkv: Vec<f32> = randv(&mut r, b * t * 3 * dm)
                .iter()
                .map(|v| v * 3.0)
                .collect();
            let (o, lse) = fwd(&qkv, d);
            let (want_o, want_lse) = naive(&qkv, d);
            let what = format!("attention b{b} t{t} d{dm} h{h} causal {causal}");
            assert_close(&format!("{what} o"), &o, &want_o, 1e-5, 1e-5);
            assert_close(&format!("{what} lse"), &lse, &want_lse, 1e-5, 1e-5);
        }
    }
}

#[test]
fn attention_gradient_matches_finite_differences() {
    let mut r = rng(17);
    for (b, t, dm, h) in [(1, 3, 4, 2), (2, 67, 4, 1)] {
        for causal in [true, false] {
            let d = dims(b, t, dm, h, causal);
            let qkv = randv(&mut r, b * t * 3 * dm);
            // the scalar L = sum(g * o) for a fixed random g: dL/do = g
            let g = randv(&mut r, b * t * dm);
            let (o, lse) = fwd(&qkv, d);
            let mut dqkv = vec![f32::NAN; qkv.len()];
            let mut delta = vec![f32::NAN; lse.len()];
            attention_bwd(&qkv, &o, &lse, &g, d, &mut dqkv, &mut delta);
            let loss = |x: &[f64]| -> f64 {
                let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                let (o, _) = naive(&xf, d);
                o.iter().zip(&g).map(|(a, b)| a * *b as f64).sum()
            };
            let base: Vec<f64> = qkv.iter().map(|&v| v as f64).collect();
            let eps = 1e-3;
            // every element of a small case, a sample of a long one
            let step = if qkv.len() > 200 { 37 } else { 1 };
            let (mut got, mut want) = (vec![], vec![]);
            for i in (0..qkv.len()).step_by(step) {
                let (mut p, mut m) = (base.clone(), base.clone());
                p[i] += eps;
                m[i] -= eps;
                want.push((loss(&p) - loss(&m)) / (2.0 * eps));
                got.push(dqkv[i]);
            }
            let what = format!("attention grad b{b} t{t} d{dm} h{h} causal {causal}");
            assert_close(&what, &got, &want, 2e-2, 2e-3);
        }
    }
}

#[test]
fn causal_attention_never_reads_later_positions() {
    let mut r = rng(18);
    let d = dims(1, 70, 4, 1, true);
    let mut qkv = randv(&mut r, 70 * 12);
    let (o1, _) = fwd(&qkv, d);
    // change every key and value after position 40: outputs up to 40 must not move
    for i in 41..70 {
        for c in 4..12 {
            qkv[i * 12 + c] += 1.0;
        }
    }
    let (o2, _) = fwd(&qkv, d);
    assert_eq!(o1[..41 * 4], o2[..41 * 4]);
    assert_ne!(o1[41 * 4..], o2[41 * 4..]);
}

#[test]
fn attention_is_bit_identical_across_thread_counts() {
    let mut r = rng(19);
    let d = dims(2, 130, 8, 2, true);
    let qkv = randv(&mut r, 2 * 130 * 24);
    let g = randv(&mut r, 2 * 130 * 8);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let (o, lse) = fwd(&qkv, d);
            let mut dqkv = vec![0.0; qkv.len()];
            let mut delta = vec![0.0; lse.len()];
            attention_bwd(&qkv, &o, &lse, &g, d, &mut dqkv, &mut delta);
            (o, lse, dqkv)
        })
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn embedding_looks_up_rows_and_its_gradient_sums_them_in_order() {
    let mut r = rng(20);
    let (vocab, d) = (7, 5);
    let table = randv(&mut r, vocab * d);
    let tokens: Vec<i32> = vec![3, 0, 6, 3, 3, 1];
    let mut y = vec![f32::NAN; tokens.len() * d];
    embedding(&tokens, &table, d, &mut y);
    for (n, &t) in tokens.iter().enumerate() {
        assert_eq!(
            y[n * d..(n + 1) * d],
            table[t as usize * d..(t as usize + 1) * d]
        );
    }
    let dy = randv(&mut r, tokens.len() * d);
    let mut dt = vec![f32::NAN; vocab * d];
    embedding_bwd(&tokens, &dy, d, &mut dt);
    for v in 0..vocab {
        for c in 0..d {
            let mut want = 0f32;
            for (n, &t) in tokens.iter().enumerate() {
                if t as usize == v {
                    want += dy[n * d + c];
                }
            }
            assert_eq!(dt[v * d + c].to_bits(), want.to_bits(), "row {v} col {c}");
        }
    }
}
