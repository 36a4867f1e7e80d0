//! Kernel tests: forward kernels against naive references written from the math (plain loops,
//! f64) and VJP kernels against central finite differences of the forward kernels. Optimizers:
//! `optim_formulas.rs`; determinism and timing aids: `determinism.rs`.

use crate::common;

use common::*;
use dmc_plan::op::{PoolGeom, UnaryKind, CONV_CHUNK_ROWS};
use dmc_plan::unary::Saved;
use dmc_runtime::cpu::conv::{conv2d_bwd_data, conv2d_bwd_weight};
use dmc_runtime::cpu::dense::{dense_bwd_data, dense_bwd_weight, dense_fwd};
use dmc_runtime::cpu::elementwise::{add, dropout, unary_bwd, unary_fwd, DropoutRng};
use dmc_runtime::cpu::loss::{cross_entropy_loss, cross_entropy_loss_bwd, mse_loss, mse_loss_bwd};
use dmc_runtime::cpu::optim::bias_grad;
use dmc_runtime::cpu::pool::{
    avgpool_bwd, avgpool_fwd, global_avgpool_bwd, global_avgpool_bwd_act,
    global_avgpool_bwd_act_inplace, global_avgpool_fwd, maxpool_bwd, maxpool_fwd, upsample_bwd,
    upsample_fwd, PoolDims,
};
use rand::Rng;

// ------------------------------------------------------------------------------------------
// Naive references (independent of the kernels: nested loops from the definitions, f64).
// ------------------------------------------------------------------------------------------

fn conv_cases() -> Vec<ConvCase> {
    vec![
        // several chunks with a partial last one: 3*11*11 = 363 rows > 256
        ConvCase::same(3, 11, 11, 3, 5, 3, 1),
        // stride 2, 'same' with asymmetric padding (even input): 2*5*5... plus odd sizes
        ConvCase::same(2, 10, 9, 2, 3, 3, 2),
        ConvCase::valid(2, 9, 7, 3, 4, 3, 2),
        ConvCase::valid(3, 7, 5, 4, 3, 1, 1),
        ConvCase::same(1, 5, 6, 1, 2, 1, 2),
        // many rows with k=1: 5*8*8 = 320 rows
        ConvCase::valid(5, 8, 8, 3, 7, 1, 1),
        // explicit asymmetric pad where top > bottom
        ConvCase {
            n: 2,
            h: 6,
            w: 7,
            ci: 2,
            co: 3,
            k: 3,
            s: 2,
            pt: 2,
            pl: 1,
            ho: 3,
            wo: 4,
        },
    ]
}

#[test]
fn conv2d_forward_matches_reference() {
    let mut r = rng(1);
    for (i, c) in conv_cases().into_iter().enumerate() {
        let x = randv(&mut r, c.xlen());
        let w = randv(&mut r, c.wlen());
        let b = randv(&mut r, c.co);
        for bias in [false, true] {
            let bb = if bias { Some(&b[..]) } else { None };
            let got = conv_run(&c, &x, &w, bb);
            let want = conv_ref(&c, &x, &w, bb);
            assert_close(
                &format!("conv case {i} {c:?} bias {bias}"),
                &got,
                &want,
                1e-5,
                1e-5,
            );
        }
    }
}

#[test]
fn workspace_size_agrees_with_the_planner() {
    for c in conv_cases() {
        let x = [c.n, c.h, c.w, c.ci];
        let y = [c.n, c.ho, c.wo, c.co];
        let want = dmc_plan::op::conv_workspace_elems(&c.geom(), &x, &y);
        assert_eq!(c.dims().workspace_elems(&c.geom()), want);
        assert_eq!(c.ws(), want);
    }
}

#[test]
fn conv_chunks_really_split() {
    // the first case must exercise several chunks and a partial one
    let c = conv_cases()[0];
    let rows = c.n * c.ho * c.wo;
    assert!(rows > CONV_CHUNK_ROWS && rows / CONV_CHUNK_ROWS * CONV_CHUNK_ROWS != rows);
}

fn dense_ref(n: usize, k: usize, m: usize, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f64> {
    let mut y = vec![0f64; n * m];
    for i in 0..n {
        for j in 0..m {
            let mut acc = b.map_or(0.0, |b| b[j] as f64);
            for l in 0..k {
                acc += x[i * k + l] as f64 * w[l * m + j] as f64;
            }
            y[i * m + j] = acc;
        }
    }
    y
}

#[test]
fn dense_forward_matches_reference() {
    let mut r = rng(2);
    for &(n, k, m) in &[(1, 1, 1), (4, 3, 2), (7, 13, 5), (33, 70, 17), (2, 129, 3)] {
        let x = randv(&mut r, n * k);
        let w = randv(&mut r, k * m);
        let b = randv(&mut r, m);
        for bias in [false, true] {
            let bb = if bias { Some(&b[..]) } else { None };
            let mut y = vec![f32::NAN; n * m];
            dense_fwd(n, k, m, &x, &w, bb, &mut y);
            assert_close("dense", &y, &dense_ref(n, k, m, &x, &w, bb), 1e-5, 1e-5);
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct PoolCase {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    size: usize,
    s: usize,
}

impl PoolCase {
    fn ho(&self) -> usize {
        (self.h - self.size) / self.s + 1
    }
    fn wo(&self) -> usize {
        (self.w - self.size) / self.s + 1
    }
    fn geom(&self) -> PoolGeom {
        PoolGeom::square(self.size, self.s, 0)
    }
    fn dims(&self) -> PoolDims {
        PoolDims {
            n: self.n,
            h: self.h,
            w: self.w,
            c: self.c,
            ho: self.ho(),
            wo: self.wo(),
        }
    }
    fn xlen(&self) -> usize {
        self.n * self.h * self.w * self.c
    }
    fn ylen(&self) -> usize {
        self.n * self.ho() * self.wo() * self.c
    }
}

fn pool_cases() -> Vec<PoolCase> {
    vec![
        PoolCase {
            n: 2,
            h: 8,
            w: 8,
            c: 3,
            size: 2,
            s: 2,
        },
        PoolCase {
            n: 3,
            h: 7,
            w: 9,
            c: 2,
            size: 2,
            s: 2,
        }, // odd: floor drops the last row/col
        PoolCase {
            n: 2,
            h: 7,
            w: 6,
            c: 4,
            size: 3,
            s: 2,
        }, // overlapping windows
        PoolCase {
            n: 1,
            h: 5,
            w: 5,
            c: 1,
            size: 3,
            s: 1,
        },
    ]
}

/// (y, argmax) by the definition: first maximum in row-major window order.
fn maxpool_ref(p: &PoolCase, x: &[f32]) -> (Vec<f64>, Vec<u8>) {
    let (ho, wo) = (p.ho(), p.wo());
    let mut y = vec![0f64; p.ylen()];
    let mut a = vec![0u8; p.ylen()];
    for n in 0..p.n {
        for oy in 0..ho {
            for ox in 0..wo {
                for c in 0..p.c {
                    let mut best = None::<(f32, usize)>;
                    for dy in 0..p.size {
                        for dx in 0..p.size {
                            let v = x[((n * p.h + oy * p.s + dy) * p.w + ox * p.s + dx) * p.c + c];
                            if !matches!(best, Some((b, _)) if v <= b) {
                                best = Some((v, dy * p.size + dx));
                            }
                        }
                    }
                    let o = ((n * ho + oy) * wo + ox) * p.c + c;
                    y[o] = best.unwrap().0 as f64;
                    a[o] = best.unwrap().1 as u8;
                }
            }
        }
    }
    (y, a)
}

fn avgpool_ref(p: &PoolCase, x: &[f32]) -> Vec<f64> {
    let (ho, wo) = (p.ho(), p.wo());
    let mut y = vec![0f64; p.ylen()];
    for n in 0..p.n {
        for oy in 0..ho {
            for ox in 0..wo {
                for c in 0..p.c {
                    let mut s = 0.0;
                    for dy in 0..p.size {
                        for dx in 0..p.size {
                            s += x[((n * p.h + oy * p.s + dy) * p.w + ox * p.s + dx) * p.c + c]
                                as f64;
                        }
                    }
                    y[((n * ho + oy) * wo + ox) * p.c + c] = s / (p.size * p.size) as f64;
                }
            }
        }
    }
    y
}

#[test]
fn pools_forward_match_reference() {
    let mut r = rng(3);
    for p in pool_cases() {
        let mut x = randv(&mut r, p.xlen());
        // ties: first maximum must win
        x[0] = 0.75;
        x[p.c] = 0.75;
        let (wy, wa) = maxpool_ref(&p, &x);
        let mut y = vec![f32::NAN; p.ylen()];
        let mut a = vec![255u8; p.ylen()];
        maxpool_fwd(&p.geom(), &p.dims(), &x, &mut y, &mut a);
        assert_close(&format!("maxpool {p:?}"), &y, &wy, 0.0, 0.0);
        assert_eq!(a, wa, "argmax {p:?}");
        let mut y = vec![f32::NAN; p.ylen()];
        avgpool_fwd(&p.geom(), &p.dims(), &x, &mut y);
        assert_close(
            &format!("avgpool {p:?}"),
            &y,
            &avgpool_ref(&p, &x),
            1e-6,
            1e-6,
        );
    }
}

#[test]
fn global_avgpool_forward_matches_reference() {
    let mut r = rng(4);
    let (n, h, w, c) = (3, 5, 7, 6);
    let x = randv(&mut r, n * h * w * c);
    let mut want = vec![0f64; n * c];
    for i in 0..n {
        for p in 0..h * w {
            for ch in 0..c {
                want[i * c + ch] += x[(i * h * w + p) * c + ch] as f64 / (h * w) as f64;
            }
        }
    }
    let mut y = vec![f32::NAN; n * c];
    global_avgpool_fwd(n, h * w, c, &x, &mut y);
    assert_close("gap", &y, &want, 1e-5, 1e-6);
}

#[test]
fn global_avgpool_backward_fused_with_an_activation_is_the_two_kernels_in_turn() {
    let mut r = rng(14);
    let (n, h, w, c) = (3, 4, 5, 6);
    let dy = randv(&mut r, n * c);
    let x = randv(&mut r, n * h * w * c);
    for k in UnaryKind::ALL {
        let mut saved = vec![0f32; x.len()];
        match k.saved() {
            Saved::Output => unary_fwd(k, &x, &mut saved),
            Saved::Input => saved.copy_from_slice(&x),
        }
        // the reference: the broadcast gradient in memory, then the activation's backward
        let mut g = vec![f32::NAN; x.len()];
        global_avgpool_bwd(n, h * w, c, &dy, &mut g);
        let mut want = vec![f32::NAN; x.len()];
        unary_bwd(k, &saved, &g, &mut want);
        let mut dx = vec![f32::NAN; x.len()];
        global_avgpool_bwd_act(k, (n, h * w, c), &dy, &saved, &mut dx);
        let mut inplace = saved.clone();
        global_avgpool_bwd_act_inplace(k, (n, h * w, c), &dy, &mut inplace);
        // (within rounding: 1/(H*W) multiplied, not divided; GELU's vector formula apart)
        let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
        assert_close(&format!("{k:?}"), &dx, &want, 1e-5, 1e-7);
        for (i, (a, b)) in dx.iter().zip(&inplace).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{k:?} in place, element {i}");
        }
    }
}

#[test]
fn upsample_forward_matches_reference_and_backward_matches_finite_differences() {
    let mut r = rng(5);
    for (n, h, w, c, f) in [
        (2, 3, 5, 3, 2),
        (1, 2, 3, 2, 3),
        (1, 1, 1, 4, 1),
        (3, 4, 2, 1, 4),
    ] {
        let d = PoolDims {
            n,
            h,
            w,
            c,
            ho: h * f,
            wo: w * f,
        };
        let x = randv(&mut r, n * h * w * c);
        // y[n, i, j, c] = x[n, floor(i / f), floor(j / f), c], from the definition
        let mut want = vec![0f64; n * h * f * w * f * c];
        for b in 0..n {
            for i in 0..h * f {
                for j in 0..w * f {
                    for ch in 0..c {
                        want[((b * h * f + i) * w * f + j) * c + ch] =
                            x[((b * h + i / f) * w + j / f) * c + ch] as f64;
                    }
                }
            }
        }
        let mut y = vec![f32::NAN; want.len()];
        upsample_fwd(f, &d, &x, &mut y);
        assert_close(&format!("upsample {d:?}"), &y, &want, 0.0, 0.0);
        let rr = randv(&mut r, y.len());
        let mut dx = vec![f32::NAN; x.len()];
        upsample_bwd(f, &d, &rr, &mut dx);
        fd_check(&format!("upsample bwd {d:?}"), &x, &dx, 200, |x| {
            let mut y = vec![0.0; rr.len()];
            upsample_fwd(f, &d, x, &mut y);
            dot(&y, &rr)
        });
    }
}

/// erf by its Maclaurin series (|x| < 3) or the asymptotic continued fraction of erfc: an
/// implementation independent of the kernel's Chebyshev fit.
fn erf_ref(x: f64) -> f64 {
    if x.abs() < 3.0 {
        let mut sum = 0.0;
        let mut term = x;
        let mut k = 0.0;
        while term.abs() > 1e-17 || k < 5.0 {
            sum += term / (2.0 * k + 1.0);
            k += 1.0;
            term *= -x * x / k;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(z) = exp(-z^2)/sqrt(pi) * 1/(z + 1/2/(z + 1/(z + 3/2/(z + ...))))
        let z = x.abs();
        let mut f = z;
        for k in (1..60).rev() {
            f = z + (k as f64 / 2.0) / f;
        }
        let erfc = (-z * z).exp() / std::f64::consts::PI.sqrt() / f;
        x.signum() * (1.0 - erfc)
    }
}

fn unary_ref(kind: UnaryKind, x: f64) -> f64 {
    match kind {
        UnaryKind::Relu => x.max(0.0),
        UnaryKind::Tanh => x.tanh(),
        UnaryKind::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryKind::Gelu => 0.5 * x * (1.0 + erf_ref(x / 2f64.sqrt())),
        UnaryKind::Silu => x / (1.0 + (-x).exp()),
        UnaryKind::LeakyRelu { alpha } => {
            if x > 0.0 {
                x
            } else {
                alpha.0 as f64 * x
            }
        }
        UnaryKind::Elu { alpha } => {
            if x > 0.0 {
                x
            } else {
                alpha.0 as f64 * (x.exp() - 1.0)
            }
        }
        // ln(1 + e^x) = x + ln(1 + e^-x) for large x, in f64
        UnaryKind::Softplus => {
            if x > 30.0 {
                x + (-x).exp()
            } else {
                (1.0 + x.exp()).ln()
            }
        }
    }
}

const KINDS: [UnaryKind; UnaryKind::ALL.len()] = UnaryKind::ALL;

#[test]
fn unary_forward_matches_reference() {
    let mut r = rng(5);
    let mut x: Vec<f32> = (0..20001).map(|_| r.random_range(-8.0f32..8.0)).collect();
    x.extend([0.0, -0.0, 30.0, -30.0, 1e-3, -1e-3, -5.0, -7.5]);
    for kind in KINDS {
        let mut y = vec![f32::NAN; x.len()];
        unary_fwd(kind, &x, &mut y);
        let want: Vec<f64> = x.iter().map(|&v| unary_ref(kind, v as f64)).collect();
        // f32 results: a few ulp relative, tiny absolute floor (gelu tails are relative-accurate)
        assert_close(&format!("{kind:?}"), &y, &want, 1e-6, 1e-12);
    }
}

#[test]
fn add_and_losses_match_reference() {
    let mut r = rng(6);
    let a = randv(&mut r, 10007);
    let b = randv(&mut r, 10007);
    let mut y = vec![f32::NAN; a.len()];
    add(&a, &b, &mut y);
    let want: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(&a, &b)| a as f64 + b as f64)
        .collect();
    assert_close("add", &y, &want, 1e-7, 0.0);

    let want = a
        .iter()
        .zip(&b)
        .map(|(&p, &t)| (p as f64 - t as f64).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    assert_close("mse", &[mse_loss(&a, &b)], &[want], 1e-6, 0.0);

    let (n, c) = (37, 11);
    let logits: Vec<f32> = (0..n * c).map(|_| r.random_range(-20.0f32..20.0)).collect();
    let labels: Vec<i32> = (0..n).map(|_| r.random_range(0..c as i32)).collect();
    let mut want = 0.0;
    for i in 0..n {
        let row = &logits[i * c..(i + 1) * c];
        let s: f64 = row.iter().map(|&v| (v as f64).exp()).sum();
        want += s.ln() - row[labels[i] as usize] as f64;
    }
    want /= n as f64;
    let got = cross_entropy_loss(&logits, &labels, c).unwrap();
    assert_close("ce", &[got], &[want], 1e-6, 1e-7);
    // stable for huge logits
    let big = vec![1000.0f32, 0.0, -1000.0];
    let got = cross_entropy_loss(&big, &[1], 3).unwrap();
    assert!((got - 1000.0).abs() < 1e-3, "{got}");
    assert!(cross_entropy_loss(&big, &[3], 3).is_err());
    assert!(cross_entropy_loss(&big, &[-1], 3).is_err());
}

#[test]
fn bias_grad_matches_reference() {
    let mut r = rng(7);
    for &(rows, c) in &[(1, 1), (5, 3), (300, 17), (64, 40)] {
        let dy = randv(&mut r, rows * c);
        let mut want = vec![0f64; c];
        for i in 0..rows {
            for j in 0..c {
                want[j] += dy[i * c + j] as f64;
            }
        }
        let mut db = vec![f32::NAN; c];
        bias_grad(&dy, &mut db);
        assert_close("bias_grad", &db, &want, 1e-5, 1e-5);
    }
}

#[test]
fn dropout_mask_properties() {
    let mut r = rng(8);
    let x: Vec<f32> = (0..100_000).map(|_| r.random_range(0.5f32..1.5)).collect();
    let p = 0.3;
    let rng_a = DropoutRng::new(1, 7, 3);
    let mut y = vec![f32::NAN; x.len()];
    dropout(p, rng_a, &x, &mut y);
    let kept = y.iter().filter(|&&v| v != 0.0).count();
    let frac = kept as f64 / x.len() as f64;
    // binomial sd = sqrt(0.21/1e5) ~ 1.5e-3: 5 sd
    assert!((frac - 0.7).abs() < 0.0075, "kept fraction {frac}");
    for (&xv, &yv) in x.iter().zip(&y) {
        assert!(yv == 0.0 || yv == xv * (1.0 / (1.0 - p)), "{xv} -> {yv}");
    }
    // backward regenerates the same mask
    let dy = vec![1.0f32; x.len()];
    let mut dx = vec![f32::NAN; x.len()];
    dropout(p, rng_a, &dy, &mut dx);
    for (&yv, &dv) in y.iter().zip(&dx) {
        assert_eq!(yv != 0.0, dv != 0.0);
    }
    // a different step, salt or seed gives a different mask
    for other in [
        DropoutRng::new(1, 8, 3),
        DropoutRng::new(1, 7, 4),
        DropoutRng::new(2, 7, 3),
    ] {
        let mut y2 = vec![0.0; x.len()];
        dropout(p, other, &x, &mut y2);
        let same = y
            .iter()
            .zip(&y2)
            .filter(|(a, b)| (**a != 0.0) == (**b != 0.0))
            .count();
        // independent masks agree on 0.7^2 + 0.3^2 = 58% of positions
        assert!((same as f64 / x.len() as f64) < 0.62, "masks too similar");
    }
    // p = 0: identity
    dropout(0.0, rng_a, &x, &mut y);
    assert_eq!(x, y);
}

// ------------------------------------------------------------------------------------------
// VJPs against central finite differences.
//
// For a forward f and a random cotangent r, L(x) = sum(f(x) * r) (accumulated in f64 over the
// f32 outputs of the *kernel*); the VJP kernel applied to dy = r must give dL/dx. We compare it to
// (L(x + h e_i) - L(x - h e_i)) / 2h on a sample of coordinates i.
// Step h = 1e-2: the linear ops (conv, dense, pools, dropout) have no truncation error at all; for
// the smooth ones (tanh, sigmoid, gelu, losses) the truncation error is h^2/6 |f'''| ~ 2e-5 per
// unit of derivative. Rounding: L carries ~1e-7 relative error from the f32 outputs, i.e. an
// absolute error ~1e-7 * sum|f r| <= 1e-5 for our sizes, divided by 2h = 2e-2 -> <= 5e-4.
// Hence rel tol 1e-2 with an absolute floor of 2e-3 (gradients here are O(0.1..10)). ReLU inputs
// and max-pool values are kept more than h away from kinks/ties so the FD does not cross them.
// ------------------------------------------------------------------------------------------

#[test]
fn conv2d_vjps_match_finite_differences() {
    let mut r = rng(10);
    let mut cases = conv_cases();
    cases.push(ConvCase::valid(2, 12, 13, 2, 3, 3, 1)); // 2*10*11 = 220 rows
    cases.push(ConvCase::same(2, 12, 12, 2, 2, 3, 1)); // 288 rows: two chunks
                                                       // 17*18 = 306 output pixels in one image: the data gradient's per-image tile (at most
                                                       // CONV_CHUNK_ROWS rows) is split in two inside an image
    cases.push(ConvCase::same(1, 17, 18, 2, 3, 3, 1));
    for (ci, c) in cases.into_iter().enumerate() {
        let (g, d) = (c.geom(), c.dims());
        let x = randv(&mut r, c.xlen());
        let w = randv(&mut r, c.wlen());
        let rr = randv(&mut r, c.ylen());
        let mut dx = vec![f32::NAN; c.xlen()];
        conv2d_bwd_data(&g, &d, &rr, &w, &mut dx);
        fd_check(&format!("conv dx case {ci}"), &x, &dx, 60, |x| {
            dot(&conv_run(&c, x, &w, None), &rr)
        });
        let mut dw = vec![f32::NAN; c.wlen()];
        let mut cols = vec![f32::NAN; c.ws()];
        conv2d_bwd_weight(&g, &d, &x, &rr, &mut dw, &mut cols);
        fd_check(&format!("conv dw case {ci}"), &w, &dw, 60, |w| {
            dot(&conv_run(&c, &x, w, None), &rr)
        });
        // bias gradient of the fused bias add
        let b = randv(&mut r, c.co);
        let mut db = vec![f32::NAN; c.co];
        bias_grad(&rr, &mut db);
        fd_check(&format!("conv db case {ci}"), &b, &db, 60, |b| {
            dot(&conv_run(&c, &x, &w, Some(b)), &rr)
        });
    }
}

#[test]
fn dense_vjps_match_finite_differences() {
    let mut r = rng(11);
    for &(n, k, m) in &[(4, 3, 2), (7, 13, 5), (33, 70, 17)] {
        let x = randv(&mut r, n * k);
        let w = randv(&mut r, k * m);
        let b = randv(&mut r, m);
        let rr = randv(&mut r, n * m);
        let run = |x: &[f32], w: &[f32], b: &[f32]| {
            let mut y = vec![0.0; n * m];
            dense_fwd(n, k, m, x, w, Some(b), &mut y);
            dot(&y, &rr)
        };
        let mut dx = vec![f32::NAN; n * k];
        dense_bwd_data(n, k, m, &rr, &w, &mut dx);
        fd_check("dense dx", &x, &dx, 80, |x| run(x, &w, &b));
        let mut dw = vec![f32::NAN; k * m];
        dense_bwd_weight(n, k, m, &x, &rr, &mut dw);
        fd_check("dense dw", &w, &dw, 80, |w| run(&x, w, &b));
        let mut db = vec![f32::NAN; m];
        bias_grad(&rr, &mut db);
        fd_check("dense db", &b, &db, 80, |b| run(&x, &w, b));
    }
}

#[test]
fn pool_vjps_match_finite_differences() {
    let mut r = rng(12);
    for p in pool_cases() {
        let (g, d) = (p.geom(), p.dims());
        // distinct values 0.05 apart (> 2h): no tie can be crossed by the FD step
        let mut x: Vec<f32> = (0..p.xlen()).map(|i| i as f32 * 0.05 - 1.0).collect();
        for i in (1..x.len()).rev() {
            let j = r.random_range(0..=i);
            x.swap(i, j);
        }
        let rr = randv(&mut r, p.ylen());
        let mut y = vec![0.0; p.ylen()];
        let mut a = vec![0u8; p.ylen()];
        maxpool_fwd(&g, &d, &x, &mut y, &mut a);
        let mut dx = vec![f32::NAN; p.xlen()];
        maxpool_bwd(&g, &d, &rr, &a, &mut dx);
        fd_check(&format!("maxpool {p:?}"), &x, &dx, 200, |x| {
            let mut y = vec![0.0; p.ylen()];
            let mut a = vec![0u8; p.ylen()];
            maxpool_fwd(&g, &d, x, &mut y, &mut a);
            dot(&y, &rr)
        });
        let mut dx = vec![f32::NAN; p.xlen()];
        avgpool_bwd(&g, &d, &rr, &mut dx);
        fd_check(&format!("avgpool {p:?}"), &x, &dx, 200, |x| {
            let mut y = vec![0.0; p.ylen()];
            avgpool_fwd(&g, &d, x, &mut y);
            dot(&y, &rr)
        });
    }
    let (n, h, w, c) = (2, 3, 5, 4);
    let x = randv(&mut r, n * h * w * c);
    let rr = randv(&mut r, n * c);
    let mut dx = vec![f32::NAN; x.len()];
    global_avgpool_bwd(n, h * w, c, &rr, &mut dx);
    fd_check("gap", &x, &dx, 200, |x| {
        let mut y = vec![0.0; n * c];
        global_avgpool_fwd(n, h * w, c, x, &mut y);
        dot(&y, &rr)
    });
}

#[test]
fn unary_vjps_match_finite_differences() {
    let mut r = rng(13);
    // stay 3h away from relu's kink at 0
    let x: Vec<f32> = (0..501)
        .map(|_| {
            let v: f32 = r.random_range(-4.0f32..4.0);
            if v.abs() < 3.0 * H {
                v + 0.1
            } else {
                v
            }
        })
        .collect();
    let rr = randv(&mut r, x.len());
    for kind in KINDS {
        let mut y = vec![0.0; x.len()];
        unary_fwd(kind, &x, &mut y);
        let saved = match kind.saved() {
            Saved::Input => &x,
            Saved::Output => &y,
        };
        let mut dx = vec![f32::NAN; x.len()];
        unary_bwd(kind, saved, &rr, &mut dx);
        fd_check(&format!("{kind:?}"), &x, &dx, 501, |x| {
            let mut y = vec![0.0; x.len()];
            unary_fwd(kind, x, &mut y);
            dot(&y, &rr)
        });
    }
}

#[test]
fn add_and_dropout_vjps_match_finite_differences() {
    let mut r = rng(14);
    let a = randv(&mut r, 301);
    let b = randv(&mut r, 301);
    let rr = randv(&mut r, 301);
    // d(sum((a+b) r))/da = r: the executor passes dy unchanged to both inputs (no kernel);
    // check the forward is linear with that gradient.
    fd_check("add", &a, &rr, 301, |a| {
        let mut y = vec![0.0; a.len()];
        add(a, &b, &mut y);
        dot(&y, &rr)
    });
    let drng = DropoutRng::new(5, 2, 9);
    let mut dx = vec![f32::NAN; a.len()];
    dropout(0.4, drng, &rr, &mut dx);
    fd_check("dropout", &a, &dx, 301, |x| {
        let mut y = vec![0.0; x.len()];
        dropout(0.4, drng, x, &mut y);
        dot(&y, &rr)
    });
}

#[test]
fn loss_vjps_match_finite_differences() {
    let mut r = rng(15);
    let pred = randv(&mut r, 3 * 7);
    let target = randv(&mut r, 3 * 7);
    let mut dp = vec![f32::NAN; pred.len()];
    mse_loss_bwd(&pred, &target, &mut dp);
    fd_check("mse", &pred, &dp, 100, |p| mse_loss(p, &target) as f64);

    let (n, c) = (5, 7);
    let logits: Vec<f32> = (0..n * c).map(|_| r.random_range(-3.0f32..3.0)).collect();
    let labels: Vec<i32> = (0..n).map(|_| r.random_range(0..c as i32)).collect();
    let mut dl = vec![f32::NAN; n * c];
    cross_entropy_loss_bwd(&logits, &labels, c, &mut dl).unwrap();
    fd_check("ce", &logits, &dl, 100, |l| {
        cross_entropy_loss(l, &labels, c).unwrap() as f64
    });
}

/// NaN must not be swallowed by relu, max-pool or dropout (poison mode relies on it).
#[test]
fn nan_propagates() {
    let nan = f32::NAN;
    let mut y = [0.0; 3];
    unary_fwd(UnaryKind::Relu, &[nan, -1.0, 2.0], &mut y);
    assert!(y[0].is_nan() && y[1] == 0.0 && y[2] == 2.0);
    let mut dx = [0.0; 2];
    unary_bwd(UnaryKind::Relu, &[-1.0, 1.0], &[nan, nan], &mut dx);
    assert!(dx[0].is_nan() && dx[1].is_nan());
    let p = PoolCase {
        n: 1,
        h: 2,
        w: 2,
        c: 1,
        size: 2,
        s: 2,
    };
    for pos in 0..4 {
        let mut x = [1.0, 2.0, 3.0, 4.0];
        x[pos] = nan;
        let (mut y, mut a) = ([0.0], [0u8]);
        maxpool_fwd(&p.geom(), &p.dims(), &x, &mut y, &mut a);
        assert!(y[0].is_nan() && a[0] as usize == pos, "{pos}");
    }
    let x = vec![nan; 64];
    let mut y = vec![0.0; 64];
    dropout(0.5, DropoutRng::new(0, 1, 2), &x, &mut y);
    assert!(y.iter().all(|v| v.is_nan()));
}

/// Random geometries: sizes 1..=13 (odd and even), kernel 1/2/3, stride 1..=3, independent
/// top/bottom/left/right padding (asymmetric both ways, including none), forward vs the
/// reference and both VJPs vs finite differences.
#[test]
fn conv2d_random_geometries() {
    let mut r = rng(50);
    let mut done = 0;
    while done < 40 {
        let k = [1usize, 2, 3][r.random_range(0..3)];
        let s = r.random_range(1..=3usize);
        let (h, w) = (r.random_range(1..=13usize), r.random_range(1..=13usize));
        let (pt, pb, pl, pr) = (
            r.random_range(0..k),
            r.random_range(0..k),
            r.random_range(0..k),
            r.random_range(0..k),
        );
        if h + pt + pb < k || w + pl + pr < k {
            continue;
        }
        let ho = (h + pt + pb - k) / s + 1;
        let wo = (w + pl + pr - k) / s + 1;
        let c = ConvCase {
            n: r.random_range(1..=3),
            h,
            w,
            ci: r.random_range(1..=4),
            co: r.random_range(1..=5),
            k,
            s,
            pt,
            pl,
            ho,
            wo,
        };
        let x = randv(&mut r, c.xlen());
        let wt = randv(&mut r, c.wlen());
        let b = randv(&mut r, c.co);
        let what = format!("{c:?}");
        assert_close(
            &what,
            &conv_run(&c, &x, &wt, Some(&b)),
            &conv_ref(&c, &x, &wt, Some(&b)),
            1e-5,
            1e-5,
        );
        let rr = randv(&mut r, c.ylen());
        let mut dx = vec![f32::NAN; c.xlen()];
        conv2d_bwd_data(&c.geom(), &c.dims(), &rr, &wt, &mut dx);
        fd_check(&format!("dx {what}"), &x, &dx, 30, |x| {
            dot(&conv_run(&c, x, &wt, None), &rr)
        });
        let mut dw = vec![f32::NAN; c.wlen()];
        let mut cols = vec![f32::NAN; c.ws()];
        conv2d_bwd_weight(&c.geom(), &c.dims(), &x, &rr, &mut dw, &mut cols);
        fd_check(&format!("dw {what}"), &wt, &dw, 30, |w| {
            dot(&conv_run(&c, &x, w, None), &rr)
        });
        done += 1;
    }
}

/// Random pooling geometries (odd sizes, overlapping and gapped windows), forward vs the
/// references and VJPs vs finite differences.
#[test]
fn pools_random_geometries() {
    let mut r = rng(51);
    for _ in 0..30 {
        let size = r.random_range(1..=3usize);
        let p = PoolCase {
            n: r.random_range(1..=2),
            h: r.random_range(size..=9),
            w: r.random_range(size..=9),
            c: r.random_range(1..=3),
            size,
            s: r.random_range(1..=3),
        };
        let (g, d) = (p.geom(), p.dims());
        let mut x: Vec<f32> = (0..p.xlen()).map(|i| i as f32 * 0.05 - 1.0).collect();
        for i in (1..x.len()).rev() {
            let j = r.random_range(0..=i);
            x.swap(i, j);
        }
        let (wy, wa) = maxpool_ref(&p, &x);
        let mut y = vec![f32::NAN; p.ylen()];
        let mut a = vec![255u8; p.ylen()];
        maxpool_fwd(&g, &d, &x, &mut y, &mut a);
        assert_close(&format!("maxpool {p:?}"), &y, &wy, 0.0, 0.0);
        assert_eq!(a, wa);
        let rr = randv(&mut r, p.ylen());
        let mut dx = vec![f32::NAN; p.xlen()];
        maxpool_bwd(&g, &d, &rr, &a, &mut dx);
        fd_check(&format!("maxpool bwd {p:?}"), &x, &dx, 100, |x| {
            let (mut y, mut a) = (vec![0.0; p.ylen()], vec![0u8; p.ylen()]);
            maxpool_fwd(&g, &d, x, &mut y, &mut a);
            dot(&y, &rr)
        });
        let mut y = vec![f32::NAN; p.ylen()];
        avgpool_fwd(&g, &d, &x, &mut y);
        assert_close(
            &format!("avgpool {p:?}"),
            &y,
            &avgpool_ref(&p, &x),
            1e-5,
            1e-6,
        );
        avgpool_bwd(&g, &d, &rr, &mut dx);
        fd_check(&format!("avgpool bwd {p:?}"), &x, &dx, 100, |x| {
            let mut y = vec![0.0; p.ylen()];
            avgpool_fwd(&g, &d, x, &mut y);
            dot(&y, &rr)
        });
    }
}

/// GELU's loops, which run compiled for AVX2 where the CPU has it, give the baseline loop's bits
/// (the same operations in the same order: no FMA contraction), forward and backward, out of place
/// and in place, over the whole range GELU sees (tails, zero, subnormals, infinities, NaN).
#[test]
fn gelu_loops_give_the_baseline_bits_on_every_cpu() {
    use dmc_runtime::cpu::elementwise::{
        unary_bwd, unary_bwd_inplace, unary_fwd, unary_fwd_inplace,
    };
    let g = UnaryKind::Gelu;
    let mut x: Vec<f32> = (0..100_003)
        .map(|i| (i as f32 - 50_000.0) * 2.5e-4)
        .collect();
    x.extend([
        -40.0,
        -9.5,
        9.5,
        40.0,
        0.0,
        -0.0,
        1e-40,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    let dy: Vec<f32> = (0..x.len())
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let want_y: Vec<f32> = x.iter().map(|&v| g.forward(v)).collect();
    let want_dx: Vec<f32> = x.iter().zip(&dy).map(|(&s, &d)| g.backward(s, d)).collect();
    let mut y = vec![0.0; x.len()];
    unary_fwd(g, &x, &mut y);
    assert_eq!(bits(&y), bits(&want_y), "forward");
    let mut y = x.clone();
    unary_fwd_inplace(g, &mut y);
    assert_eq!(bits(&y), bits(&want_y), "forward in place");
    let mut dx = vec![0.0; x.len()];
    unary_bwd(g, &x, &dy, &mut dx);
    assert_eq!(bits(&dx), bits(&want_dx), "backward");
    let mut d = dy.clone();
    unary_bwd_inplace(g, &x, &mut d);
    assert_eq!(bits(&d), bits(&want_dx), "backward in place");
}
