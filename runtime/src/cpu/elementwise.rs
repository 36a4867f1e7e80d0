//! Elementwise kernels: activations and their VJPs, add, dropout.
//!
//! GELU is the exact (erf) form, as PyTorch's and Keras' defaults:
//! `gelu(x) = x * Phi(x)`, `Phi(x) = 0.5 * erfc(-x / sqrt(2))`, and its derivative
//! `gelu'(x) = Phi(x) + x * phi(x)`, `phi(x) = exp(-x^2/2) / sqrt(2 pi)`, both evaluated in f64
//! with an erfc of relative error < 1.2e-7 over the whole real line (so the tails, where gelu(x)
//! is tiny, stay relatively accurate).

use dmc_compiler::op::UnaryKind;

use super::par::for_chunks;
use crate::hash::mix64;

/// Complementary error function, fractional error < 1.2e-7 everywhere (Chebyshev fit,
/// Numerical Recipes' `erfcc`), computed in f64.
pub fn erfc(x: f64) -> f64 {
    // The polynomial's coefficients, highest power first, evaluated by Horner's rule in the same
    // order as the nested form `c1 + t*(c2 + t*(... + t*c9))` (a loop, not nine nested parentheses:
    // rustfmt takes ~20 s on those).
    const C: [f64; 9] = [
        0.170_872_77,
        -0.822_152_23,
        1.488_515_87,
        -1.135_203_98,
        0.278_868_07,
        -0.186_288_06,
        0.096_784_18,
        0.374_091_96,
        1.000_023_68,
    ];
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = C[1..].iter().fold(C[0], |acc, &c| c + t * acc);
    let r = t * (-z * z - 1.265_512_23 + t * p).exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// Standard normal CDF.
fn phi_cdf(x: f64) -> f64 {
    0.5 * erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// f(x) for one element (NaN propagates through relu, as in PyTorch, so poisoned values stay
/// visible).
#[inline]
fn unary_elem(kind: UnaryKind, x: f32) -> f32 {
    match kind {
        UnaryKind::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        UnaryKind::Tanh => x.tanh(),
        UnaryKind::Sigmoid => sigmoid(x),
        UnaryKind::Gelu => {
            let xd = x as f64;
            (xd * phi_cdf(xd)) as f32
        }
    }
}

/// f'(.) * g for one element, `s` being y for relu/tanh/sigmoid and x for gelu.
#[inline]
fn unary_bwd_elem(kind: UnaryKind, s: f32, g: f32) -> f32 {
    match kind {
        // 0 * g rather than 0: a NaN gradient stays NaN
        UnaryKind::Relu => {
            if s > 0.0 {
                g
            } else {
                0.0 * g
            }
        }
        UnaryKind::Tanh => g * (1.0 - s * s),
        UnaryKind::Sigmoid => g * (s * (1.0 - s)),
        UnaryKind::Gelu => {
            let xd = s as f64;
            let der = phi_cdf(xd) + xd * FRAC_1_SQRT_2PI * (-0.5 * xd * xd).exp();
            (g as f64 * der) as f32
        }
    }
}

/// y = f(x).
pub fn unary_fwd(kind: UnaryKind, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "unary: size");
    for_chunks(y, |o, yc| {
        for (y, &x) in yc.iter_mut().zip(&x[o..]) {
            *y = unary_elem(kind, x);
        }
    });
}

/// x = f(x), in place (same values as [`unary_fwd`]).
pub fn unary_fwd_inplace(kind: UnaryKind, x: &mut [f32]) {
    for_chunks(x, |_, xc| {
        for x in xc.iter_mut() {
            *x = unary_elem(kind, *x);
        }
    });
}

/// dx = f'(.) * dy, where `saved` is y for relu/tanh/sigmoid and x for gelu.
pub fn unary_bwd(kind: UnaryKind, saved: &[f32], dy: &[f32], dx: &mut [f32]) {
    assert_eq!(saved.len(), dx.len(), "unary_bwd: size");
    assert_eq!(dy.len(), dx.len(), "unary_bwd: size");
    for_chunks(dx, |o, dxc| {
        let it = dxc.iter_mut().zip(saved[o..].iter().zip(&dy[o..]));
        it.for_each(|(d, (&s, &g))| *d = unary_bwd_elem(kind, s, g));
    });
}

/// dy = f'(.) * dy, in place (same values as [`unary_bwd`]).
pub fn unary_bwd_inplace(kind: UnaryKind, saved: &[f32], dy: &mut [f32]) {
    assert_eq!(saved.len(), dy.len(), "unary_bwd: size");
    for_chunks(dy, |o, dc| {
        for (d, &s) in dc.iter_mut().zip(&saved[o..]) {
            *d = unary_bwd_elem(kind, s, *d);
        }
    });
}

/// y = a + b.
pub fn add(a: &[f32], b: &[f32], y: &mut [f32]) {
    assert_eq!(a.len(), y.len(), "add: size");
    assert_eq!(b.len(), y.len(), "add: size");
    for_chunks(y, |o, yc| {
        for ((y, &a), &b) in yc.iter_mut().zip(&a[o..]).zip(&b[o..]) {
            *y = a + b;
        }
    });
}

/// a = a + b, in place (same values as [`add`]).
pub fn add_inplace(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "add: size");
    for_chunks(a, |o, ac| {
        for (a, &b) in ac.iter_mut().zip(&b[o..]) {
            *a += b;
        }
    });
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The counter-based dropout RNG: element `index` of the stream keyed by `(seed, step, salt)`.
#[derive(Debug, Clone, Copy)]
pub struct DropoutRng {
    key: u64,
}

impl DropoutRng {
    pub fn new(seed: u64, step: u64, salt: u64) -> Self {
        let k = mix64(seed.wrapping_add(GOLDEN));
        let k = mix64(
            k ^ step
                .wrapping_mul(0xd1b5_4a32_d192_ed03)
                .wrapping_add(GOLDEN),
        );
        let k = mix64(
            k ^ salt
                .wrapping_mul(0xabc9_8388_fb8f_ac03)
                .wrapping_add(GOLDEN),
        );
        DropoutRng { key: k }
    }
    /// Uniform in [0, 1) with 24 random bits (splitmix64 stream at position `index`).
    #[inline]
    pub fn uniform(&self, index: u64) -> f32 {
        let z = mix64(
            self.key
                .wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN)),
        );
        (z >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
    /// keep = uniform(index) >= p.
    #[inline]
    pub fn keep(&self, index: u64, p: f32) -> bool {
        self.uniform(index) >= p
    }
}

/// The dropout multiplier of element `index`: `1/(1-p)` if kept, else 0 (p >= 1 drops
/// everything).
#[inline]
fn dropout_scale(p: f32, rng: &DropoutRng, index: u64) -> f32 {
    if p < 1.0 && rng.keep(index, p) {
        1.0 / (1.0 - p)
    } else {
        0.0
    }
}

/// `y = x * keep / (1-p)` (forward) or `dx = dy * keep / (1-p)` (backward: same call, same mask).
/// p >= 1 drops everything (y = 0); p <= 0 is the identity.
pub fn dropout(p: f32, rng: DropoutRng, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "dropout: size");
    for_chunks(y, |o, yc| {
        for (i, (y, &x)) in yc.iter_mut().zip(&x[o..]).enumerate() {
            // x * 0 rather than 0 for dropped elements: NaN stays NaN (poison mode)
            *y = x * dropout_scale(p, &rng, (o + i) as u64);
        }
    });
}

/// [`dropout`] in place: `x = x * keep / (1-p)` (same values).
pub fn dropout_inplace(p: f32, rng: DropoutRng, x: &mut [f32]) {
    for_chunks(x, |o, xc| {
        for (i, x) in xc.iter_mut().enumerate() {
            *x *= dropout_scale(p, &rng, (o + i) as u64);
        }
    });
}
