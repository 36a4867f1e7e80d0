//! Elementwise kernels: activations and their VJPs (each element by the activation's own
//! [`UnaryKind::forward`] / [`UnaryKind::backward`]), add, multiply, dropout, the softmax over the
//! last axis, the join of two values along the last axis and its slice.

use dmc_plan::op::UnaryKind;
use rayon::prelude::*;

use super::args::{Args, Ctx};
use super::par::for_chunks;
use crate::hash::mix64;
use dmc_plan::op::ElementwiseOp;
use dmc_plan::plan::Mode;

/// Runs `$body` with `$k` bound to `$kind`, a constant for each parameterless activation: the
/// compiler then folds [`UnaryKind::forward`]'s and [`UnaryKind::backward`]'s match out of the
/// element loop and vectorises it (with the match inside the loop, mobilenet's ReLU backward
/// epilogues were a fifth of its step).
macro_rules! per_kind {
    ($kind:expr, |$k:ident| $body:expr) => {
        match $kind {
            UnaryKind::Relu => {
                const $k: UnaryKind = UnaryKind::Relu;
                $body
            }
            UnaryKind::Tanh => {
                const $k: UnaryKind = UnaryKind::Tanh;
                $body
            }
            UnaryKind::Sigmoid => {
                const $k: UnaryKind = UnaryKind::Sigmoid;
                $body
            }
            UnaryKind::Gelu => {
                const $k: UnaryKind = UnaryKind::Gelu;
                $body
            }
            UnaryKind::Silu => {
                const $k: UnaryKind = UnaryKind::Silu;
                $body
            }
            UnaryKind::Softplus => {
                const $k: UnaryKind = UnaryKind::Softplus;
                $body
            }
            #[allow(non_snake_case)]
            $k @ (UnaryKind::LeakyRelu { .. } | UnaryKind::Elu { .. }) => $body,
        }
    };
}
pub(crate) use per_kind;

/// GELU's element loops (f64 polynomials: a third of a transformer's CPU step at baseline x86-64)
/// compiled again for AVX2, 4 f64 lanes instead of 2, and chosen at run time where the CPU has
/// it. The same operations in the same order (Rust never contracts a multiply and an add into
/// an FMA), so the same bits as the baseline loops (runtime/tests/it/kernels.rs checks it).
#[cfg(target_arch = "x86_64")]
pub mod gelu_avx2 {
    use dmc_plan::op::UnaryKind;

    /// Whether this CPU runs the AVX2 loops (detected once, cached by the standard library).
    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }

    /// y = gelu(x).
    ///
    /// # Safety
    /// The CPU must have AVX2 ([`available`]).
    #[target_feature(enable = "avx2")]
    pub unsafe fn fwd(x: &[f32], y: &mut [f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y = UnaryKind::Gelu.forward(x);
        }
    }

    /// x = gelu(x).
    ///
    /// # Safety
    /// The CPU must have AVX2 ([`available`]).
    #[target_feature(enable = "avx2")]
    pub unsafe fn fwd_inplace(x: &mut [f32]) {
        for x in x.iter_mut() {
            *x = UnaryKind::Gelu.forward(*x);
        }
    }

    /// d = gelu'(s) * g.
    ///
    /// # Safety
    /// The CPU must have AVX2 ([`available`]).
    #[target_feature(enable = "avx2")]
    pub unsafe fn bwd(s: &[f32], g: &[f32], d: &mut [f32]) {
        for ((d, &s), &g) in d.iter_mut().zip(s).zip(g) {
            *d = UnaryKind::Gelu.backward(s, g);
        }
    }

    /// d = gelu'(s) * d.
    ///
    /// # Safety
    /// The CPU must have AVX2 ([`available`]).
    #[target_feature(enable = "avx2")]
    pub unsafe fn bwd_inplace(s: &[f32], d: &mut [f32]) {
        for (d, &s) in d.iter_mut().zip(s) {
            *d = UnaryKind::Gelu.backward(s, *d);
        }
    }
}

/// Whether `kind`'s loops run [`gelu_avx2`]'s (GELU, on a CPU with AVX2; the GEMM epilogues'
/// too).
pub(super) fn avx2_gelu(kind: UnaryKind) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        kind == UnaryKind::Gelu && gelu_avx2::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = kind;
        false
    }
}

/// y = f(x).
pub fn unary_fwd(kind: UnaryKind, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "unary: size");
    #[cfg(target_arch = "x86_64")]
    if avx2_gelu(kind) {
        // SAFETY: `avx2_gelu` checked that the CPU has AVX2.
        for_chunks(y, |o, yc| unsafe {
            gelu_avx2::fwd(&x[o..o + yc.len()], yc)
        });
        return;
    }
    per_kind!(kind, |K| for_chunks(y, |o, yc| {
        for (y, &x) in yc.iter_mut().zip(&x[o..]) {
            *y = K.forward(x);
        }
    }));
}

/// x = f(x), in place (same values as [`unary_fwd`]).
pub fn unary_fwd_inplace(kind: UnaryKind, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2_gelu(kind) {
        // SAFETY: `avx2_gelu` checked that the CPU has AVX2.
        for_chunks(x, |_, xc| unsafe { gelu_avx2::fwd_inplace(xc) });
        return;
    }
    per_kind!(kind, |K| for_chunks(x, |_, xc| {
        for x in xc.iter_mut() {
            *x = K.forward(*x);
        }
    }));
}

/// dx = f'(.) * dy, where `saved` is the value [`UnaryKind::saved`] names (y for
/// relu/tanh/sigmoid, x for gelu).
pub fn unary_bwd(kind: UnaryKind, saved: &[f32], dy: &[f32], dx: &mut [f32]) {
    assert_eq!(saved.len(), dx.len(), "unary_bwd: size");
    assert_eq!(dy.len(), dx.len(), "unary_bwd: size");
    #[cfg(target_arch = "x86_64")]
    if avx2_gelu(kind) {
        // SAFETY: `avx2_gelu` checked that the CPU has AVX2.
        for_chunks(dx, |o, dxc| unsafe {
            let n = dxc.len();
            gelu_avx2::bwd(&saved[o..o + n], &dy[o..o + n], dxc)
        });
        return;
    }
    per_kind!(kind, |K| for_chunks(dx, |o, dxc| {
        let it = dxc.iter_mut().zip(saved[o..].iter().zip(&dy[o..]));
        it.for_each(|(d, (&s, &g))| *d = K.backward(s, g));
    }));
}

/// dy = f'(.) * dy, in place (same values as [`unary_bwd`]).
pub fn unary_bwd_inplace(kind: UnaryKind, saved: &[f32], dy: &mut [f32]) {
    assert_eq!(saved.len(), dy.len(), "unary_bwd: size");
    #[cfg(target_arch = "x86_64")]
    if avx2_gelu(kind) {
        // SAFETY: `avx2_gelu` checked that the CPU has AVX2.
        for_chunks(dy, |o, dc| unsafe {
            gelu_avx2::bwd_inplace(&saved[o..o + dc.len()], dc)
        });
        return;
    }
    per_kind!(kind, |K| for_chunks(dy, |o, dc| {
        for (d, &s) in dc.iter_mut().zip(&saved[o..]) {
            *d = K.backward(s, *d);
        }
    }));
}

/// y = softmax(x) over the last axis of `c` elements: `e^(x - max) / sum e^(x - max)` per row,
/// in f64 (the max subtracted: no overflow for any finite x).
pub fn softmax_fwd(c: usize, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "softmax: size");
    assert_eq!(x.len().checked_rem(c), Some(0), "softmax: rows");
    y.par_chunks_mut(c)
        .with_min_len(16)
        .zip(x.par_chunks(c))
        .for_each(|(yr, xr)| {
            let m = xr.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let s: f64 = xr.iter().map(|&v| (v as f64 - m).exp()).sum();
            for (o, &v) in yr.iter_mut().zip(xr) {
                *o = ((v as f64 - m).exp() / s) as f32;
            }
        });
}

/// dx = y * (dy - sum_row(dy * y)): the softmax's VJP from its output, the sum in f64.
pub fn softmax_bwd(c: usize, y: &[f32], dy: &[f32], dx: &mut [f32]) {
    assert_eq!(y.len(), dx.len(), "softmax_bwd: size");
    assert_eq!(dy.len(), dx.len(), "softmax_bwd: size");
    assert_eq!(y.len().checked_rem(c), Some(0), "softmax_bwd: rows");
    dx.par_chunks_mut(c)
        .with_min_len(16)
        .zip(y.par_chunks(c).zip(dy.par_chunks(c)))
        .for_each(|(dr, (yr, gr))| {
            let dot: f64 = yr.iter().zip(gr).map(|(&y, &g)| y as f64 * g as f64).sum();
            for (o, (&y, &g)) in dr.iter_mut().zip(yr.iter().zip(gr)) {
                *o = (y as f64 * (g as f64 - dot)) as f32;
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

/// y = a * b elementwise.
pub fn mul(a: &[f32], b: &[f32], y: &mut [f32]) {
    assert_eq!(a.len(), y.len(), "mul: size");
    assert_eq!(b.len(), y.len(), "mul: size");
    for_chunks(y, |o, yc| {
        for ((y, &a), &b) in yc.iter_mut().zip(&a[o..]).zip(&b[o..]) {
            *y = a * b;
        }
    });
}

/// y[r, ..] = a[r, 0..ca] then b[r, 0..cb], for each row `r` (the last axis joined): `ca`, `cb`
/// the last extents of `a` and `b`, which have the same number of rows.
pub fn concat(ca: usize, cb: usize, a: &[f32], b: &[f32], y: &mut [f32]) {
    let c = ca + cb;
    assert!(ca > 0 && cb > 0, "concat: empty last axis");
    let rows = y.len() / c;
    assert_eq!(rows * c, y.len(), "concat: size");
    assert_eq!(a.len(), rows * ca, "concat: size of a");
    assert_eq!(b.len(), rows * cb, "concat: size of b");
    for_chunks(y, |o, yc| {
        for (k, y) in yc.iter_mut().enumerate() {
            let i = o + k;
            let (r, j) = (i / c, i % c);
            *y = if j < ca {
                a[r * ca + j]
            } else {
                b[r * cb + (j - ca)]
            };
        }
    });
}

/// dx[r, j] = dy[r, start + j] for j < len, each row `r` of the `c`-wide dy.
pub fn slice_last(c: usize, start: usize, len: usize, dy: &[f32], dx: &mut [f32]) {
    assert!(len > 0 && start + len <= c, "slice_last: out of range");
    let rows = dx.len() / len;
    assert_eq!(rows * len, dx.len(), "slice_last: size");
    assert_eq!(dy.len(), rows * c, "slice_last: size of dy");
    for_chunks(dx, |o, dc| {
        for (k, d) in dc.iter_mut().enumerate() {
            let i = o + k;
            *d = dy[(i / len) * c + start + i % len];
        }
    });
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The counter-based dropout RNG: element `index` of the stream keyed by `(seed, step, salt)`.
#[derive(Debug, Clone, Copy)]
pub struct DropoutRng {
    key: u64,
    /// Added to every index: a data-parallel rank's first element of the global batch.
    base: u64,
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
        DropoutRng { key: k, base: 0 }
    }
    /// The same stream with element `index` at position `base + index`: a data-parallel rank's
    /// part of a tensor of the global batch draws the masks one process draws for it.
    pub fn from(self, base: u64) -> Self {
        DropoutRng { base, ..self }
    }
    /// Uniform in [0, 1) with 24 random bits (splitmix64 stream at position `index`).
    #[inline]
    pub fn uniform(&self, index: u64) -> f32 {
        let z = mix64(
            self.key.wrapping_add(
                index
                    .wrapping_add(self.base)
                    .wrapping_add(1)
                    .wrapping_mul(GOLDEN),
            ),
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

/// Runs one step of an op of the elementwise family: the step's arguments, taken by signature slot,
/// handed to the kernels above.
///
/// # Safety
/// As [`exec`](super::executor::exec): a validated step, exclusive access to the arena; each
/// mutable slice is taken only for a slot with role Out, InOut or Workspace.
pub(super) unsafe fn exec(op: &ElementwiseOp, a: &Args, ctx: &Ctx) {
    // SAFETY: (all calls below) see this function's contract; slot indices follow the signature.
    unsafe {
        match op {
            ElementwiseOp::Unary(kind) => unary_fwd(*kind, a.f32(0), a.f32_mut(1)),
            ElementwiseOp::Add => add(a.f32(0), a.f32(1), a.f32_mut(2)),
            ElementwiseOp::Mul => mul(a.f32(0), a.f32(1), a.f32_mut(2)),
            ElementwiseOp::Concat => {
                let last = |i: usize| a.shape(i).last().copied().unwrap_or(0);
                concat(last(0), last(1), a.f32(0), a.f32(1), a.f32_mut(2))
            }
            ElementwiseOp::SliceLast { start, len } => {
                let c = a.shape(0).last().copied().unwrap_or(0);
                slice_last(c, *start, *len, a.f32(0), a.f32_mut(1))
            }
            ElementwiseOp::Dropout { p, salt } => {
                if ctx.mode == Mode::Eval {
                    a.f32_mut(1).copy_from_slice(a.f32(0));
                } else {
                    let rng = DropoutRng::new(ctx.seed, ctx.step_counter, *salt)
                        .from(ctx.batch_offset(a.f32(0).len()));
                    dropout(*p, rng, a.f32(0), a.f32_mut(1));
                }
            }
            ElementwiseOp::UnaryBwd(kind) => unary_bwd(*kind, a.f32(0), a.f32(1), a.f32_mut(2)),
            ElementwiseOp::DropoutBwd { p, salt } => {
                if ctx.mode == Mode::Eval {
                    a.f32_mut(1).copy_from_slice(a.f32(0));
                } else {
                    let rng = DropoutRng::new(ctx.seed, ctx.step_counter, *salt)
                        .from(ctx.batch_offset(a.f32(0).len()));
                    dropout(*p, rng, a.f32(0), a.f32_mut(1));
                }
            }
            ElementwiseOp::UnaryInPlace(kind) => unary_fwd_inplace(*kind, a.f32_mut(0)),
            ElementwiseOp::AddInPlace => add_inplace(a.f32_mut(0), a.f32(1)),
            ElementwiseOp::DropoutInPlace { p, salt }
            | ElementwiseOp::DropoutBwdInPlace { p, salt } => {
                if ctx.mode != Mode::Eval {
                    let x = a.f32_mut(0);
                    let rng = DropoutRng::new(ctx.seed, ctx.step_counter, *salt)
                        .from(ctx.batch_offset(x.len()));
                    dropout_inplace(*p, rng, x);
                }
            }
            ElementwiseOp::UnaryBwdInPlace(kind) => {
                unary_bwd_inplace(*kind, a.f32(0), a.f32_mut(1))
            }
            ElementwiseOp::Softmax => {
                let c = a.shape(0).last().copied().unwrap_or(1);
                softmax_fwd(c, a.f32(0), a.f32_mut(1))
            }
            ElementwiseOp::SoftmaxBwd => {
                let c = a.shape(0).last().copied().unwrap_or(1);
                softmax_bwd(c, a.f32(0), a.f32(1), a.f32_mut(2))
            }
        }
    }
}
