//! The CPU time model's rates ([`CpuRates`]) measured on this machine by a short micro-benchmark
//! of the backend's own kernels ([`measure`], about half a second), and cached per machine and
//! thread count ([`cached`]).
//!
//! * GEMM: single-threaded calls of ten shapes (square, the blocks of a convolution's forward and
//!   weight gradient, narrow ones as a small fused-update chunk makes, tiny ones, few rows against
//!   a wide B), each timed as the best of a few repetitions; the per-call time is fitted to
//!   `a * FLOPs + b * bytes of A and C + c + d * bytes of B` (relative least squares, every
//!   coefficient non-negative): `1/a` the FLOP rate on whole micro-tiles, `1/b` and `1/d` the
//!   packing rates, `c` the call overhead.
//! * Streaming: a ReLU's backward over 32 MiB arrays, all threads; and over arrays that stay in
//!   the caches (a quarter of half the last-level cache each: [`CpuRates::cache_bytes`]).
//! * Gathers: a 3x3 convolution of 8 images of 64x64x64, its forward, weight and data gradients
//!   timed, all threads; what the model's GEMM, streaming and loop terms leave of each time is its
//!   im2col's (or col2im's).
//! * Direct multiply-adds: a depthwise 3x3 convolution of the same images, timed; what the
//!   streaming and loop terms leave of its time is its multiply-adds'.
//! * Parallel loops: an empty loop over the threads, dispatched and joined.
//! * Transcendental work: every activation's forward and backward, and attention's `exp`, over
//!   4 Mi elements each; what the streaming term leaves of each time is its own cost per element
//!   (not fitted: [`CpuRates::special_s`]).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use std::collections::BTreeMap;

use dmc_plan::cpu::{CpuRates, CpuWork, Special};
use dmc_plan::op::{ConvGeom, ConvOp, Epilogue, LossOp, NormOp, Op, OpFacts, OptimOp};
use dmc_plan::unary::UnaryKind;
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::conv::{conv2d_bwd_data, conv2d_bwd_weight, conv2d_fwd, ConvDims};
use super::elementwise::{unary_bwd, unary_fwd};
use super::gemm::{sgemm, View};
use super::{loss, norm};
use crate::io::files::{replace_file, Durability};

/// The shapes `(m, n, k)` the GEMM fit is measured on (the last two: few rows against a wide
/// B, as a dense layer's batch split by rows makes, whose time is mostly B's packing).
const GEMM_SHAPES: [(usize, usize, usize); 10] = [
    (256, 256, 256),
    (128, 64, 576),
    (576, 64, 256),
    (576, 1, 256),
    (576, 8, 256),
    (1024, 16, 64),
    (64, 64, 64),
    (8, 8, 8),
    (16, 256, 768),
    (32, 512, 512),
];

/// Bumped when what is measured or how changes: older cache entries are then ignored.
const CACHE_VERSION: &str = "cpu-rates-14";

/// Seconds of the best of `reps` runs of `f`, each repeated until it took `min_s`.
fn best_of(reps: usize, min_s: f64, mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t0 = Instant::now();
        let mut n = 0u32;
        loop {
            f();
            n += 1;
            let e = t0.elapsed().as_secs_f64();
            if e >= min_s || n >= 1 << 16 {
                best = best.min(e / f64::from(n));
                break;
            }
        }
    }
    best
}

/// A register-bound loop of `n` dependent multiply-adds (no memory traffic: a thread's time on
/// it is its core's, whatever the others do).
fn spin(n: u32) -> f64 {
    let mut x = black_box(1.0f64);
    for _ in 0..n {
        x = x * 1.000_000_1 + 1e-9;
    }
    black_box(x)
}

/// How much of the pool's threads' work runs in parallel now ([`CpuRates::parallel_share`]): one
/// thread's time on a [`spin`] over the time as many threads as the pool's take to spin at once
/// ([`spin_together`]: threads spawned for it, as a pool's sleeping threads may take a while to
/// wake, which is not the machine's doing), the best of five of each, at most 1 (about 15 ms in
/// all on two threads; 1 when no thread could be started).
pub fn parallel_share() -> f64 {
    const N: u32 = 1 << 20;
    const REPS: usize = 5;
    let threads = rayon::current_num_threads().max(1);
    if threads == 1 {
        return 1.0;
    }
    let one = (0..REPS)
        .map(|_| {
            let t0 = Instant::now();
            spin(black_box(N));
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    let mut all = f64::INFINITY;
    for _ in 0..REPS {
        match spin_together(threads, N) {
            Some(t) => all = all.min(t),
            // no threads to probe with: nothing is known of the machine
            None => return 1.0,
        }
    }
    (one / all).min(1.0)
}

/// Seconds `threads` threads of their own take to [`spin`] `n` times each, released together:
/// from the first one's start to the last one's end (a thread that waited for a core after the
/// release shows in it). `None` when a thread could not be started.
fn spin_together(threads: usize, n: u32) -> Option<f64> {
    use std::sync::{Condvar, Mutex};
    // the release: `Some(true)` go, `Some(false)` give up (a thread failed to start)
    let gate = (Mutex::new(None::<bool>), Condvar::new());
    let wait = || {
        let (m, cv) = &gate;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        while g.is_none() {
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        *g == Some(true)
    };
    std::thread::scope(|s| {
        let spinners: Vec<_> = (0..threads)
            .map(|_| {
                std::thread::Builder::new().spawn_scoped(s, || {
                    wait().then(|| {
                        let t0 = Instant::now();
                        spin(black_box(n));
                        (t0, Instant::now())
                    })
                })
            })
            .collect();
        let go = spinners.iter().all(Result::is_ok);
        let (m, cv) = &gate;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = Some(go);
        cv.notify_all();
        let spans: Vec<(Instant, Instant)> = spinners
            .into_iter()
            .filter_map(|h| h.ok()?.join().ok().flatten())
            .collect();
        if !go || spans.len() != threads {
            return None;
        }
        let first = spans.iter().map(|s| s.0).min()?;
        let last = spans.iter().map(|s| s.1).max()?;
        Some((last - first).as_secs_f64())
    })
}

/// Solves the square system `a x = b` (Gaussian elimination with partial pivoting); `None` when
/// singular.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        if a[p][c].abs() < 1e-300 {
            return None;
        }
        a.swap(c, p);
        b.swap(c, p);
        let pivot = a[c].clone();
        for r in c + 1..n {
            let f = a[r][c] / pivot[c];
            for (x, p) in a[r][c..].iter_mut().zip(&pivot[c..]) {
                *x -= f * p;
            }
            b[r] -= f * b[c];
        }
    }
    let mut x = vec![0.0; n];
    for r in (0..n).rev() {
        let s: f64 = (r + 1..n).map(|k| a[r][k] * x[k]).sum();
        x[r] = (b[r] - s) / a[r][r];
    }
    Some(x)
}

/// Non-negative `x` minimising `sum(((rows_i . x) - t_i) / t_i)^2` over `N` coefficients
/// ([`fit_nonneg_scaled`] with each sample its own scale).
pub fn fit_nonneg_n<const N: usize>(rows: &[[f64; N]], t: &[f64]) -> [f64; N] {
    fit_nonneg_scaled(rows, t, t)
}

/// Non-negative `x` minimising `sum(((rows_i . x) - t_i) / s_i)^2` over `N` coefficients: the
/// least-squares solution on every subset of them (the others 0), the best that is
/// non-negative. (Exhaustive: `2^N` small solves, for the handful of terms of the time model.)
pub fn fit_nonneg_scaled<const N: usize>(rows: &[[f64; N]], t: &[f64], s: &[f64]) -> [f64; N] {
    assert_eq!(t.len(), s.len(), "fit: one scale per sample");
    let mut best = ([0.0; N], f64::INFINITY);
    for mask in 1u32..(1 << N) {
        let on: Vec<usize> = (0..N).filter(|i| mask & (1 << i) != 0).collect();
        let mut a = vec![vec![0.0; on.len()]; on.len()];
        let mut b = vec![0.0; on.len()];
        for ((r, &ti), &si) in rows.iter().zip(t).zip(s) {
            let w = 1.0 / (si * si);
            for (ii, &i) in on.iter().enumerate() {
                for (jj, &j) in on.iter().enumerate() {
                    a[ii][jj] += w * r[i] * r[j];
                }
                b[ii] += w * r[i] * ti;
            }
        }
        let Some(sol) = solve(a, b) else { continue };
        if sol.iter().any(|v| *v < 0.0 || !v.is_finite()) {
            continue;
        }
        let mut x = [0.0; N];
        for (&i, v) in on.iter().zip(sol) {
            x[i] = v;
        }
        let err: f64 = rows
            .iter()
            .zip(t)
            .zip(s)
            .map(|((r, &ti), &si)| {
                ((r.iter().zip(&x).map(|(a, b)| a * b).sum::<f64>() - ti) / si).powi(2)
            })
            .sum();
        if err < best.1 {
            best = (x, err);
        }
    }
    best.0
}

/// [`fit_nonneg_n`] of four coefficients (the GEMM fit: FLOPs, bytes of A and C, calls, bytes
/// of B).
pub fn fit_nonneg(rows: &[[f64; 4]], t: &[f64]) -> [f64; 4] {
    fit_nonneg_n(rows, t)
}

/// Seconds of one single-threaded call of each of [`GEMM_SHAPES`] (as each block of a split GEMM
/// runs), the best of a few repetitions.
pub fn gemm_samples() -> Vec<((usize, usize, usize), f64)> {
    let serial = rayon::ThreadPoolBuilder::new().num_threads(1).build();
    GEMM_SHAPES
        .iter()
        .map(|&(m, n, k)| {
            let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.25).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
            let mut c = vec![0f32; m * n];
            let mut run = || {
                sgemm(
                    1.0,
                    View::rm(&a, m, k),
                    View::rm(&b, k, n),
                    0.0,
                    &mut c,
                    n,
                    1,
                );
                black_box(&mut c);
            };
            let t = match &serial {
                Ok(pool) => pool.install(|| best_of(3, 0.008, &mut run)),
                Err(_) => best_of(3, 0.008, &mut run),
            };
            ((m, n, k), t)
        })
        .collect()
}

/// matrixmultiply's f32 micro-tile on this CPU: 16 with AVX-512, else 8.
fn micro_tile() -> usize {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        return 16;
    }
    8
}

/// Bytes per second, all threads, of a ReLU's backward over arrays of `len` elements (saved and
/// dy read, dx written), the best of three runs of at least `min_s` each.
fn relu_bwd_bytes_per_s(len: usize, min_s: f64) -> f64 {
    let saved: Vec<f32> = (0..len).map(|i| (i % 3) as f32 - 1.0).collect();
    let dy = vec![1f32; len];
    let mut dx = vec![0f32; len];
    let t = rayon::scope(|_| {
        best_of(3, min_s, || {
            unary_bwd(UnaryKind::Relu, &saved, &dy, &mut dx);
            black_box(&mut dx);
        })
    });
    12.0 * len as f64 / t
}

/// Half of this machine's last-level cache (`/sys/devices/system/cpu/cpu0/cache`, the largest
/// level listed), the arena a step may have and stream in the caches
/// ([`CpuRates::cache_bytes`]); the nominal 8 MiB where the sizes cannot be read.
fn cache_share() -> u64 {
    let dir = Path::new("/sys/devices/system/cpu/cpu0/cache");
    let size = |p: PathBuf| -> Option<(u32, u64)> {
        let level = std::fs::read_to_string(p.join("level")).ok()?;
        let size = std::fs::read_to_string(p.join("size")).ok()?;
        let size = size.trim();
        let (num, mul) = match size.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match size.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (size, 1),
            },
        };
        Some((level.trim().parse().ok()?, num.parse::<u64>().ok()? * mul))
    };
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| size(e.ok()?.path()))
        .max()
        .map_or(CpuRates::nominal().cache_bytes, |(_, b)| b / 2)
}

/// Measures the rates on this machine, in the global thread pool (the one the CPU backend's
/// kernels run on).
pub fn measure() -> CpuRates {
    let t0 = Instant::now();
    let threads = rayon::current_num_threads().max(1);
    let share = parallel_share();
    let mut r = CpuRates {
        threads,
        micro_tile: micro_tile(),
        launch_s: 1e-6,
        ..CpuRates::nominal()
    };
    let samples = gemm_samples();
    let rows: Vec<[f64; 4]> = samples
        .iter()
        .map(|&((m, n, k), _)| r.gemm_terms(m, n, k, false))
        .collect();
    let times: Vec<f64> = samples.iter().map(|s| s.1).collect();
    let [a, b, c, d] = fit_nonneg(&rows, &times);
    let inv = |v: f64, d: f64| if v > 0.0 { 1.0 / v } else { d };
    r.gemm_flops = inv(a, r.gemm_flops);
    r.pack_bytes = inv(b, r.pack_bytes);
    r.gemm_call_s = c;
    r.pack_run_bytes = inv(d, r.pack_run_bytes);

    // parallel loops: dispatch and join of one empty task per thread
    r.loop_s = rayon::scope(|_| {
        best_of(3, 0.005, || {
            (0..threads).into_par_iter().for_each(|i| {
                black_box(i);
            })
        })
    });

    // streaming: a ReLU's backward over 8 Mi elements (saved and dy read, dx written); the same
    // over arrays a quarter of the cache share (three of them stay in the caches)
    r.stream_bytes = relu_bwd_bytes_per_s(8 << 20, 0.02);
    r.cache_bytes = cache_share();
    r.cached_stream_bytes =
        relu_bwd_bytes_per_s(((r.cache_bytes / 16) as usize).max(1 << 16), 0.01);
    r.special_s = special_s(&r);

    // gathers: a 3x3 convolution of 8 images of 64x64x64 (rows of 256 pixels: 128 chunks), each
    // of its three kernels timed; what the model's other terms leave of its time is the gather's
    let geom = ConvGeom::square(3, 1, 1);
    let d = ConvDims {
        n: 8,
        h: 64,
        w: 64,
        ci: 64,
        ho: 64,
        wo: 64,
        co: 64,
    };
    let x: Vec<f32> = (0..d.n * d.h * d.w * d.ci)
        .map(|i| (i % 11) as f32 * 0.1)
        .collect();
    let wt: Vec<f32> = (0..d.k(&geom) * d.co)
        .map(|i| (i % 5) as f32 * 0.01)
        .collect();
    let mut y = vec![0f32; d.rows() * d.co];
    let mut dxs = vec![0f32; x.len()];
    let mut dw = vec![0f32; wt.len()];
    let mut cols = vec![0f32; d.workspace_elems(&geom)];
    let xs = vec![d.n, d.h, d.w, d.ci];
    let ys = vec![d.n, d.ho, d.wo, d.co];
    let ws = vec![3, 3, d.ci, d.co];
    let work = |op: ConvOp, ins: &[&Vec<usize>], outs: &[&Vec<usize>]| -> CpuWork {
        let ins: Vec<Vec<usize>> = ins.iter().map(|s| (*s).clone()).collect();
        let outs: Vec<Vec<usize>> = outs.iter().map(|s| (*s).clone()).collect();
        op.cpu_work(&ins, &outs)
    };
    let rest = |w: &CpuWork, r: &CpuRates| {
        let mut w = w.clone();
        (w.im2col, w.im2col_fwd, w.col2im) = (0, 0, 0);
        r.work_s(&w)
    };
    let rate = |elems: u64, t: f64, other: f64| elems as f64 / (t - other).max(t * 0.1);
    let fwd = work(
        ConvOp::Conv2d {
            geom,
            bias: false,
            epi: Epilogue::NONE,
        },
        &[&xs, &ws],
        &[&ys],
    );
    let t = rayon::scope(|_| {
        best_of(2, 0.02, || {
            conv2d_fwd(&geom, &d, &x, &wt, None, &mut y, &mut cols);
            black_box(&mut y);
        })
    });
    r.im2col_fwd_elems = rate(fwd.im2col_fwd, t, rest(&fwd, &r));
    let bwd_w = work(ConvOp::Conv2dBwdWeight { geom }, &[&xs, &ys], &[&ws]);
    let t = rayon::scope(|_| {
        best_of(2, 0.02, || {
            conv2d_bwd_weight(&geom, &d, &x, &y, &mut dw, &mut cols);
            black_box(&mut dw);
        })
    });
    r.im2col_elems = rate(bwd_w.im2col, t, rest(&bwd_w, &r));
    let bwd_d = work(
        ConvOp::Conv2dBwdData {
            geom,
            epi: Epilogue::NONE,
            in_place: false,
        },
        &[&ys, &ws],
        &[&xs],
    );
    let t = rayon::scope(|_| {
        best_of(2, 0.02, || {
            conv2d_bwd_data(&geom, &d, &y, &wt, &mut dxs);
            black_box(&mut dxs);
        })
    });
    r.col2im_elems = rate(bwd_d.col2im, t, rest(&bwd_d, &r));
    // direct multiply-adds: the same input through a depthwise 3x3 (groups = channels)
    let dgeom = ConvGeom {
        groups: d.ci,
        ..geom
    };
    let dws = vec![3, 3, 1, d.co];
    let dw_fwd = work(
        ConvOp::Conv2d {
            geom: dgeom,
            bias: false,
            epi: Epilogue::NONE,
        },
        &[&xs, &dws],
        &[&ys],
    );
    let t = rayon::scope(|_| {
        best_of(2, 0.02, || {
            conv2d_fwd(&dgeom, &d, &x, &wt[..9 * d.co], None, &mut y, &mut cols);
            black_box(&mut y);
        })
    });
    let mut other = dw_fwd.clone();
    other.direct = 0;
    r.direct_madds = rate(dw_fwd.direct, t, r.work_s(&other));
    r.parallel_share = share.min(parallel_share());
    r.source = format!(
        "measured on this machine ({threads} thread{}, micro-benchmark {:.2} s{})",
        if threads == 1 { "" } else { "s" },
        t0.elapsed().as_secs_f64(),
        busy_note(&r)
    );
    r
}

/// For a rates' source: nothing, or that the machine held back threads while they were
/// measured ([`CpuRates::measured_busy`]) and they are not cached.
pub fn busy_note(r: &CpuRates) -> String {
    if r.measured_busy() {
        format!(
            "; the machine was busy: {:.0}% of the threads' work ran in parallel, so these rates are used once, not cached, and measured again next time",
            r.parallel_share * 100.0
        )
    } else {
        String::new()
    }
}

/// Seconds per element, all threads, of each [`Special`] kind beyond its streaming: every
/// activation's forward and backward over 4 Mi elements in [-4, 4] (as the backend runs them),
/// and attention's `exp` over as many, each the best of three, less what the streaming and loop
/// terms at `r` say of the same arrays.
fn special_s(r: &CpuRates) -> BTreeMap<String, f64> {
    let n = 4 << 20;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i % 2001) as f32 - 1000.0) / 250.0)
        .collect();
    let dy = vec![1f32; n];
    let mut y = vec![0f32; n];
    let mut out = BTreeMap::new();
    for what in Special::all() {
        if let Some(s) = whole_kernel_s(r, what) {
            out.insert(what.key(), s);
            continue;
        }
        let (t, arrays) = rayon::scope(|_| match what {
            Special::Forward(k) => (best_of(3, 0.01, || unary_fwd(k, &x, black_box(&mut y))), 2),
            Special::Backward(k) => (
                best_of(3, 0.01, || unary_bwd(k, &x, &dy, black_box(&mut y))),
                3,
            ),
            _ => (
                best_of(3, 0.01, || {
                    y.par_chunks_mut(8192)
                        .zip(x.par_chunks(8192))
                        .for_each(|(o, i)| o.iter_mut().zip(i).for_each(|(o, i)| *o = i.exp()));
                    black_box(&mut y);
                }),
                2,
            ),
        });
        let streaming = r.work_s(&CpuWork::stream(arrays * 4 * n as u64));
        out.insert(what.key(), ((t - streaming) / n as f64).max(0.0));
    }
    out
}

/// The kernels measured whole ([`whole_kernel_s`]) measured again at `r` (the rates the first
/// measurement was made at), each kept at the lesser of the two in `special`: this machine slows
/// one kernel or another for seconds at a time (batchnorm's backward measured 210 µs in most
/// calibrations, 355 µs in a few seconds of them), and a second measurement seconds after the
/// first (the calibration programs run between them) is the better of two chances.
pub fn remeasure_whole_kernels(r: &CpuRates, special: &mut BTreeMap<String, f64>) {
    for what in Special::all() {
        if let Some(s) = whole_kernel_s(r, what) {
            let v = special.entry(what.key()).or_insert(s);
            *v = v.min(s);
        }
    }
}

/// Seconds per element of a kernel measured whole ([`Special::BatchNorm`] and its backward,
/// [`Special::LayerNorm`] and its backward, [`Special::CrossEntropy`] and its backward,
/// [`Special::BiasGrad`]) beyond its streaming: the kernel over 256 Ki elements (1 MiB, in the
/// caches: a batchnorm's `[4096, 64]`, a layernorm's and a loss's `[1024, 256]`), the best of
/// three, less what the model's other terms at `r` say of the same launch in the caches. `None`
/// for the other kinds.
fn whole_kernel_s(r: &CpuRates, what: Special) -> Option<f64> {
    let n = 1 << 18;
    let c = match what {
        Special::BatchNorm | Special::BatchNormBwd | Special::BiasGrad => 64,
        Special::LayerNorm
        | Special::LayerNormBwd
        | Special::CrossEntropy
        | Special::CrossEntropyBwd => 256,
        _ => return None,
    };
    let rows = n / c;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i % 1999) as f32 - 999.0) / 250.0)
        .collect();
    let (gamma, beta) = (vec![1.25f32; c], vec![0.5f32; c]);
    let (mut s1, mut s2) = (vec![0f32; c.max(rows)], vec![0f32; c.max(rows)]);
    let (mut y, mut dx) = (vec![0f32; n], vec![0f32; n]);
    let (mut dg, mut db) = (vec![0f32; c], vec![0f32; c]);
    let labels: Vec<i32> = (0..rows).map(|i| (i % c) as i32).collect();
    let eps = dmc_plan::unary::Coef(1e-5);
    let (v, cc, rr) = (vec![rows, c], vec![c], vec![rows]);
    let timed = |f: &mut (dyn FnMut() + Send)| rayon::scope(|_| best_of(3, 0.01, f));
    let (t, op, ins, outs): (f64, Op, Vec<Vec<usize>>, Vec<Vec<usize>>) = match what {
        Special::BatchNorm => {
            let (m, va) = (&mut s1[..c], &mut s2[..c]);
            let t =
                timed(&mut || norm::batchnorm(&x, &gamma, &beta, black_box(&mut y), m, va, 1e-5));
            let op = Op::Norm(NormOp::BatchNorm { eps, ranks: 1 });
            (
                t,
                op,
                vec![v.clone(), cc.clone(), cc.clone()],
                vec![v, cc.clone(), cc],
            )
        }
        Special::BatchNormBwd => {
            let (m, va) = (&mut s1[..c], &mut s2[..c]);
            norm::batchnorm(&x, &gamma, &beta, &mut y, m, va, 1e-5);
            let (m, va) = (&s1[..c], &s2[..c]);
            let t = timed(&mut || {
                norm::batchnorm_bwd(
                    &y,
                    &x,
                    m,
                    va,
                    &gamma,
                    black_box(&mut dx),
                    &mut dg,
                    &mut db,
                    1e-5,
                )
            });
            let op = Op::Norm(NormOp::BatchNormBwd {
                eps,
                in_place: false,
                ranks: 1,
            });
            let ins = vec![v.clone(), v.clone(), cc.clone(), cc.clone(), cc.clone()];
            (t, op, ins, vec![v, cc.clone(), cc])
        }
        Special::LayerNorm => {
            let (m, rs) = (&mut s1[..rows], &mut s2[..rows]);
            let t =
                timed(&mut || norm::layernorm(&x, &gamma, &beta, black_box(&mut y), m, rs, 1e-5));
            let op = Op::Norm(NormOp::LayerNorm { eps });
            (
                t,
                op,
                vec![v.clone(), cc.clone(), cc],
                vec![v, rr.clone(), rr],
            )
        }
        Special::LayerNormBwd => {
            let (m, rs) = (&mut s1[..rows], &mut s2[..rows]);
            norm::layernorm(&x, &gamma, &beta, &mut y, m, rs, 1e-5);
            let (m, rs) = (&s1[..rows], &s2[..rows]);
            let t = timed(&mut || {
                norm::layernorm_bwd(&y, &x, m, rs, &gamma, black_box(&mut dx), &mut dg, &mut db)
            });
            let ins = vec![v.clone(), v.clone(), rr.clone(), rr, cc.clone()];
            (
                t,
                Op::Norm(NormOp::LayerNormBwd),
                ins,
                vec![v, cc.clone(), cc],
            )
        }
        Special::CrossEntropy => {
            let t = timed(&mut || {
                black_box(loss::cross_entropy_loss(&x, &labels, c).ok());
            });
            let op = Op::Loss(LossOp::CrossEntropyLoss {
                label_smoothing: 0.0,
                weight: 1.0,
            });
            (t, op, vec![v, rr], vec![vec![1]])
        }
        Special::CrossEntropyBwd => {
            let t = timed(&mut || {
                black_box(loss::cross_entropy_loss_bwd(&x, &labels, c, &mut dx).ok());
            });
            let op = Op::Loss(LossOp::CrossEntropyLossBwd {
                label_smoothing: 0.0,
                weight: 1.0,
            });
            (t, op, vec![v.clone(), rr], vec![v])
        }
        Special::BiasGrad => {
            let t = timed(&mut || super::optim::bias_grad(&x, black_box(&mut db)));
            (t, Op::Optim(OptimOp::BiasGrad), vec![v], vec![cc])
        }
        _ => return None,
    };
    let mut work = op.facts()?.cpu_work(&ins, &outs);
    work.special.clear();
    Some(((t - r.work_s_in(&work, true)) / n as f64).max(0.0))
}

/// What the rates depend on: the CPU, the thread count, this build.
fn cache_key(threads: usize) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(str::to_string)
        })
        .unwrap_or_default();
    let mut h = Sha256::new();
    h.update(CACHE_VERSION.as_bytes());
    h.update(b"\0");
    h.update(cpu.as_bytes());
    h.update(b"\0");
    h.update(threads.to_le_bytes());
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    let d = h.finalize();
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The cache file of this machine's rates in `dir`.
pub fn cache_path(dir: &Path) -> PathBuf {
    let threads = rayon::current_num_threads().max(1);
    dir.join(format!("{CACHE_VERSION}-{}.json", cache_key(threads)))
}

/// This machine's rates: read from `dir`'s cache entry, else measured ([`measure`]) and written
/// there (atomically; a cache that cannot be written only costs the next run the measurement),
/// unless measured while the machine held back threads ([`CpuRates::measured_busy`]: rates
/// that would predict every later plan slow).
pub fn cached(dir: Option<&Path>) -> CpuRates {
    cached_with(dir, measure)
}

/// [`cached`], measuring with `measure` on a miss.
pub fn cached_with(dir: Option<&Path>, measure: impl FnOnce() -> CpuRates) -> CpuRates {
    let path = dir.map(cache_path);
    if let Some(p) = &path {
        if let Some(r) = std::fs::read(p)
            .ok()
            .and_then(|b| serde_json::from_slice::<CpuRates>(&b).ok())
        {
            return r;
        }
    }
    let r = measure();
    if let Some(p) = path.as_ref().filter(|_| !r.measured_busy()) {
        let _ = std::fs::create_dir_all(p.parent().unwrap_or(Path::new(".")));
        let _ = replace_file(p, Durability::Cache, |w| {
            serde_json::to_writer_pretty(&mut *w, &r).map_err(std::io::Error::other)
        });
    }
    r
}

/// The rates the CLI plans with: `$DMC_CPU_RATES` = `nominal` ([`CpuRates::nominal`], e.g. for
/// reproducible output) or a JSON file of rates; else this machine's, cached in the dmc cache
/// directory (`$DMC_CACHE_DIR`, else `~/.cache/dmc`).
pub fn for_this_machine() -> Result<CpuRates, String> {
    for_this_machine_with(measure)
}

/// [`for_this_machine`], measuring with `measure` when nothing is cached.
pub fn for_this_machine_with(measure: impl FnOnce() -> CpuRates) -> Result<CpuRates, String> {
    match std::env::var("DMC_CPU_RATES") {
        Ok(v) if v == "nominal" => Ok(CpuRates::nominal()),
        Ok(v) if !v.is_empty() => {
            let b = std::fs::read(&v).map_err(|e| {
                format!("DMC_CPU_RATES={v}: cannot read the rates file: {e} (set it to `nominal` or a JSON file of CPU rates, or unset it to measure this machine)")
            })?;
            serde_json::from_slice(&b).map_err(|e| {
                format!("DMC_CPU_RATES={v}: not a JSON file of CPU rates: {e} (unset it to measure this machine)")
            })
        }
        _ => Ok(cached_with(
            crate::cuda::nvrtc::cache_dir().as_deref(),
            measure,
        )),
    }
}
