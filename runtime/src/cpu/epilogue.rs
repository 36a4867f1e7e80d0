//! The GEMM epilogues ([`Epilogue`]) on the CPU: applied to a block of a GEMM's output right after
//! the block is computed (while it is in cache), element by element with the plan's formulas
//! ([`Epilogue::forward`], [`Epilogue::backward`]), which are the unfused elementwise kernels'
//! in the same order: a fused step is bit-identical to the unfused one.

use dmc_plan::op::{Epilogue, UnaryKind};

use super::elementwise::per_kind;
#[cfg(target_arch = "x86_64")]
use super::elementwise::{avx2_gelu, gelu_avx2};
use super::par::for_chunks;

/// `y[i] = epi.forward(y[i], r[i])`: `y` a block of the forward's output (bias already added),
/// `r` the same block of the residual (when `epi.add`).
pub fn forward_block(epi: &Epilogue, y: &mut [f32], r: Option<&[f32]>) {
    if let Some(r) = r {
        assert_eq!(r.len(), y.len(), "epilogue: residual size");
    }
    // GELU on an AVX2 CPU: the residual added, then the loop compiled for AVX2 (the same bits)
    #[cfg(target_arch = "x86_64")]
    if epi.act.is_some_and(avx2_gelu) {
        if let Some(r) = r {
            y.iter_mut().zip(r).for_each(|(v, &r)| *v += r);
        }
        // SAFETY: `avx2_gelu` checked that the CPU has AVX2.
        unsafe { gelu_avx2::fwd_inplace(y) };
        return;
    }
    // `epi.forward` with the activation a constant per arm ([`per_kind`]): the same formula
    match (epi.act, r) {
        (None, None) => {}
        (None, Some(r)) => y.iter_mut().zip(r).for_each(|(v, &r)| *v += r),
        (Some(kind), None) => per_kind!(kind, |K| y.iter_mut().for_each(|v| *v = K.forward(*v))),
        (Some(kind), Some(r)) => per_kind!(kind, |K| y
            .iter_mut()
            .zip(r)
            .for_each(|(v, &r)| *v = K.forward(*v + r))),
    }
}

/// `dx[i] = epi.backward(dx[i], g[i], saved[i])`: `dx` a block of the data gradient, `g` and
/// `saved` the same block of the epilogue's extra inputs (when present).
pub fn backward_block(epi: &Epilogue, dx: &mut [f32], g: Option<&[f32]>, saved: Option<&[f32]>) {
    for s in [g, saved].into_iter().flatten() {
        assert_eq!(s.len(), dx.len(), "epilogue: input size");
    }
    // GELU's backward on an AVX2 CPU: the accumulated gradient added, then the loop compiled for
    // AVX2 (`K.backward(s, v + g)` with the same bits)
    #[cfg(target_arch = "x86_64")]
    if let (Some(kind), Some(sv)) = (epi.act, saved) {
        if avx2_gelu(kind) {
            if let Some(g) = g {
                dx.iter_mut().zip(g).for_each(|(v, &g)| *v += g);
            }
            // SAFETY: `avx2_gelu` checked that the CPU has AVX2.
            unsafe { gelu_avx2::bwd_inplace(sv, dx) };
            return;
        }
    }
    // `epi.backward` with the activation a constant per arm ([`per_kind`]): the same formula
    match (epi.act, saved, g) {
        (Some(kind), Some(sv), None) => per_kind!(kind, |K| dx
            .iter_mut()
            .zip(sv)
            .for_each(|(v, &s)| *v = K.backward(s, *v))),
        (Some(kind), Some(sv), Some(g)) => per_kind!(kind, |K| dx
            .iter_mut()
            .zip(sv)
            .zip(g)
            .for_each(|((v, &s), &g)| *v = K.backward(s, *v + g))),
        (_, _, Some(g)) => dx.iter_mut().zip(g).for_each(|(v, &g)| *v += g),
        (_, _, None) => {}
    }
}

/// [`forward_block`] over a whole output, in parallel.
pub fn forward_all(epi: &Epilogue, y: &mut [f32], r: Option<&[f32]>) {
    if epi.is_none() {
        return;
    }
    for_chunks(y, |o, yc| {
        let n = yc.len();
        forward_block(epi, yc, r.map(|r| &r[o..o + n]));
    });
}

/// [`backward_block`] over a whole data gradient, in parallel.
pub fn backward_all(epi: &Epilogue, dx: &mut [f32], g: Option<&[f32]>, saved: Option<&[f32]>) {
    if epi.is_none() {
        return;
    }
    for_chunks(dx, |o, dc| {
        let n = dc.len();
        backward_block(
            epi,
            dc,
            g.map(|g| &g[o..o + n]),
            saved.map(|s| &s[o..o + n]),
        );
    });
}
