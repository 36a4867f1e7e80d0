//! Helpers shared by the kernel tests: seeded random data, a tolerance check, and the
//! convolution cases with their naive reference.

#![allow(dead_code)] // each test file uses a part

use dmc_plan::op::{ConvGeom, CONV_CHUNK_ROWS};
use dmc_runtime::cpu::conv::{conv2d_fwd, ConvDims};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

pub fn randv(r: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
}

/// |a - b| <= rel * max(|a|, |b|) + abs, elementwise, with a helpful message.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], rel: f64, abs: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        let tol = rel * g.abs().max(w.abs()) + abs;
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w} (tol {tol})"
        );
    }
}

#[derive(Clone, Copy, Debug)]
pub struct ConvCase {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub ci: usize,
    pub co: usize,
    pub k: usize,
    pub s: usize,
    pub pt: usize,
    pub pl: usize,
    pub ho: usize,
    pub wo: usize,
}

impl ConvCase {
    /// TF 'same': out = ceil(in/s), total pad = max((out-1)*s + k - in, 0), top = total/2
    /// (the odd pixel goes to the bottom/right: asymmetric).
    pub fn same(n: usize, h: usize, w: usize, ci: usize, co: usize, k: usize, s: usize) -> Self {
        let ho = h.div_ceil(s);
        let wo = w.div_ceil(s);
        let pth = ((ho - 1) * s + k).saturating_sub(h);
        let ptw = ((wo - 1) * s + k).saturating_sub(w);
        ConvCase {
            n,
            h,
            w,
            ci,
            co,
            k,
            s,
            pt: pth / 2,
            pl: ptw / 2,
            ho,
            wo,
        }
    }
    pub fn valid(n: usize, h: usize, w: usize, ci: usize, co: usize, k: usize, s: usize) -> Self {
        ConvCase {
            n,
            h,
            w,
            ci,
            co,
            k,
            s,
            pt: 0,
            pl: 0,
            ho: (h - k) / s + 1,
            wo: (w - k) / s + 1,
        }
    }
    /// The bottom (right) padding is what the output extent implies: the rows the last window
    /// reaches past the input.
    pub fn geom(&self) -> ConvGeom {
        ConvGeom {
            pad_bottom: ((self.ho - 1) * self.s + self.k).saturating_sub(self.h + self.pt),
            pad_right: ((self.wo - 1) * self.s + self.k).saturating_sub(self.w + self.pl),
            pad_top: self.pt,
            pad_left: self.pl,
            ..ConvGeom::square(self.k, self.s, 0)
        }
    }
    pub fn dims(&self) -> ConvDims {
        ConvDims {
            n: self.n,
            h: self.h,
            w: self.w,
            ci: self.ci,
            ho: self.ho,
            wo: self.wo,
            co: self.co,
        }
    }
    pub fn xlen(&self) -> usize {
        self.n * self.h * self.w * self.ci
    }
    pub fn wlen(&self) -> usize {
        self.k * self.k * self.ci * self.co
    }
    pub fn ylen(&self) -> usize {
        self.n * self.ho * self.wo * self.co
    }
    pub fn ws(&self) -> usize {
        (self.n * self.ho * self.wo).min(CONV_CHUNK_ROWS) * self.k * self.k * self.ci
    }
}

pub fn conv_ref(c: &ConvCase, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f64> {
    let mut y = vec![0f64; c.ylen()];
    for n in 0..c.n {
        for oy in 0..c.ho {
            for ox in 0..c.wo {
                for co in 0..c.co {
                    let mut acc = b.map_or(0.0, |b| b[co] as f64);
                    for ky in 0..c.k {
                        for kx in 0..c.k {
                            let iy = (oy * c.s + ky) as i64 - c.pt as i64;
                            let ix = (ox * c.s + kx) as i64 - c.pl as i64;
                            if iy < 0 || ix < 0 || iy >= c.h as i64 || ix >= c.w as i64 {
                                continue;
                            }
                            for ci in 0..c.ci {
                                let xv =
                                    x[((n * c.h + iy as usize) * c.w + ix as usize) * c.ci + ci];
                                let wv = w[((ky * c.k + kx) * c.ci + ci) * c.co + co];
                                acc += xv as f64 * wv as f64;
                            }
                        }
                    }
                    y[((n * c.ho + oy) * c.wo + ox) * c.co + co] = acc;
                }
            }
        }
    }
    y
}

pub fn conv_run(c: &ConvCase, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f32> {
    let mut y = vec![f32::NAN; c.ylen()];
    let mut cols = vec![f32::NAN; c.ws()];
    conv2d_fwd(&c.geom(), &c.dims(), x, w, b, &mut y, &mut cols);
    y
}

pub const H: f32 = 1e-2;
pub const REL: f64 = 1e-2;
pub const ABS: f64 = 2e-3;

pub fn dot(a: &[f32], r: &[f32]) -> f64 {
    a.iter().zip(r).map(|(&a, &r)| a as f64 * r as f64).sum()
}

/// Checks `grad` (analytic dL/dx) against FD of `l(x)` at up to `samples` coordinates.
pub fn fd_check(what: &str, x: &[f32], grad: &[f32], samples: usize, l: impl Fn(&[f32]) -> f64) {
    assert_eq!(x.len(), grad.len());
    let mut r = rng(99);
    let idx: Vec<usize> = if x.len() <= samples {
        (0..x.len()).collect()
    } else {
        (0..samples).map(|_| r.random_range(0..x.len())).collect()
    };
    let mut xp = x.to_vec();
    for i in idx {
        let orig = xp[i];
        xp[i] = orig + H;
        let lp = l(&xp);
        xp[i] = orig - H;
        let lm = l(&xp);
        xp[i] = orig;
        // the actual perturbation, as represented in f32
        let step = ((orig + H) as f64) - ((orig - H) as f64);
        let fd = (lp - lm) / step;
        let g = grad[i] as f64;
        let tol = REL * fd.abs().max(g.abs()) + ABS;
        assert!(
            (fd - g).abs() <= tol,
            "{what}: d/dx[{i}] analytic {g}, fd {fd} (tol {tol})"
        );
    }
}

/// Checks `grad` against central differences of `l` (step 1e-2) at every coordinate of `x`, and
/// that at least half of the gradient is significant (so the check is not vacuous).
pub fn fd_check_every(what: &str, x: &[f32], grad: &[f32], l: impl Fn(&[f32]) -> f64) {
    const STEP: f32 = 1e-2;
    let mut xp = x.to_vec();
    let mut significant = 0;
    for i in 0..x.len() {
        let orig = xp[i];
        xp[i] = orig + STEP;
        let lp = l(&xp);
        xp[i] = orig - STEP;
        let lm = l(&xp);
        xp[i] = orig;
        let fd = (lp - lm) / (((orig + STEP) as f64) - ((orig - STEP) as f64));
        let g = grad[i] as f64;
        let tol = 1e-2 * fd.abs().max(g.abs()) + 2e-4;
        assert!(
            (fd - g).abs() <= tol,
            "{what}[{i}]: analytic {g}, fd {fd} (tol {tol})"
        );
        significant += usize::from(g.abs() > 1e-3);
    }
    assert!(significant * 2 >= x.len(), "{what}: gradients mostly ~0");
}
