//! The CPU time model's rates measured in place: small built-in training programs (none of them
//! an example) run on the CPU backend with every kernel timed, and the model's weights
//! ([`CpuRates::coefs`]) fitted to those times by non-negative least squares, each kernel's
//! error relative to its program's step ([`fit_nonneg_scaled`]), each kernel's
//! [`CpuRates::terms`] the regressors. The runtime's
//! micro-benchmark ([`calibrate::measure`]) gives the machine's thread count and micro-tile and
//! the starting rates; a program that fails to build or run is skipped, and with no sample at
//! all the micro-benchmark's rates stand. Cached per machine like them.
//!
//! The fit is held near the micro-benchmark's rates ([`PRIOR_WEIGHT`]): the data moves a weight
//! only where the kernels disagree with it, and terms that move together do not trade places.
//!
//! Why in place: the micro-benchmark times isolated calls with hot threads and caches; a
//! training step's kernels run between others, on operands that come from memory, with the
//! pool's threads woken per loop. Fitted on real kernels of every family (convolutions dense,
//! depthwise and with weights too large for a cache, dense layers, batchnorm, pooling, ReLU,
//! losses), the model predicts the examples' steps (BENCHMARKS.md, "CPU time model").

use std::time::Instant;

use dmc_compiler::sweep::sweep;
use dmc_compiler::{compile, CompileOptions};
use dmc_plan::cpu::{CpuRates, TERMS};
use dmc_runtime::compare::Batch;
use dmc_runtime::cpu::calibrate::{self, fit_nonneg_scaled};
use dmc_runtime::CpuBackend;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The calibration programs: each family of kernel at sizes in and out of the caches.
const PROGRAMS: [&str; 7] = [
    // 3x3 convolutions at 32 and 64 channels, batchnorm, max pooling
    "input x: [32, 32, 16]\ntarget y: int\n\
     out = x |> conv2d(32, 3, activation: relu) |> conv2d(32, 3) |> batchnorm |> relu\n\
       |> maxpool(2) |> conv2d(64, 3, activation: relu) |> global_avgpool |> dense(10)\n\
     loss cross_entropy(out, y)\ntrain { batch: 8, optimizer: sgd(lr: 0.01, momentum: 0.9) }\n",
    // weights larger than the caches (9.4 MB each), one image
    "input x: [4, 4, 64]\ntarget y: [1]\n\
     out = x |> conv2d(512, 3) |> conv2d(512, 3) |> conv2d(64, 3) |> flatten |> dense(1)\n\
     loss mse(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n",
    // dense layers on flat inputs
    "input x: [512]\ntarget y: int\n\
     out = x |> dense(384, activation: relu) |> dense(192, activation: relu) |> dense(10)\n\
     loss cross_entropy(out, y)\ntrain { batch: 32, optimizer: adam(lr: 0.001) }\n",
    // depthwise and pointwise convolutions with batchnorm
    "input x: [16, 16, 24]\ntarget y: int\n\
     out = x |> conv2d(24, 3, padding: 1, groups: 24, bias: false) |> batchnorm |> relu\n\
       |> conv2d(48, 1, padding: 0, bias: false) |> batchnorm |> relu\n\
       |> conv2d(48, 3, stride: 2, padding: 1, groups: 48, bias: false) |> batchnorm |> relu\n\
       |> global_avgpool |> dense(10)\n\
     loss cross_entropy(out, y)\ntrain { batch: 16, optimizer: adam(lr: 0.001) }\n",
    // dense layers over a batch the threads split by rows, each block packing the whole weight
    // (fitted on the others alone, whose dense batches split by columns, mlp.dm's dense GEMMs
    // were predicted ~1.35x slow)
    "input x: [640]\ntarget y: int\n\
     out = x |> dense(320, activation: relu) |> dense(160, activation: relu) |> dense(10)\n\
     loss cross_entropy(out, y)\ntrain { batch: 96, optimizer: sgd(lr: 0.01, momentum: 0.9) }\n",
    // a transformer's MLP: wide dense layers over many rows (positions x batch), GELU between
    // (fitted on the others alone, gpt.dm's dense GEMMs were predicted 1.45-1.57x fast)
    "input x: [64, 256]\ntarget y: [64, 256]\n\
     out = x |> dense(1024, activation: gelu) |> dense(256)\n\
     loss mse(out, y)\ntrain { batch: 8, optimizer: adam(lr: 0.001) }\n",
    // small kernels: a tiny step dominated by per-kernel costs
    "input x: [8, 8, 3]\ntarget y: int\n\
     out = x |> conv2d(8, 3, activation: relu) |> maxpool(2) |> flatten |> dense(16, activation: relu)\n\
       |> dense(10)\n\
     loss cross_entropy(out, y)\ntrain { batch: 4, optimizer: sgd(lr: 0.01, momentum: 0.9) }\n",
];

/// The programs ([`PROGRAMS`] indices) also run at their smallest feasible cap: a capped plan's
/// kernels (fused updates in narrow chunks, copies to and from the host store) are what the cap
/// fitter weighs, so the weights are fitted on them too (fitted on uncapped plans only, the
/// model predicted mlp's floor step 1.5x slow).
const AT_FLOOR: [usize; 2] = [1, 2];

/// How much the fit holds each weight to the micro-benchmark's: a weight twice the
/// micro-benchmark's costs as much as one kernel predicted off by `sqrt(PRIOR_WEIGHT)` (~30%)
/// of its program's step. Without it the terms that move together (a GEMM's FLOPs, its packing,
/// its weight's packing, loops) traded places from one calibration to the next: fitted GEMM
/// rates of 114, 218 and 272 GFLOP/s in three runs on one machine, and predicted steps that
/// moved by 2x; with it, within a few percent (BENCHMARKS.md).
const PRIOR_WEIGHT: f64 = 0.1;

/// How much more the fit holds the GEMM's FLOP rate (term 0) to the micro-benchmark's: a peak
/// rate of the hardware, measured well by large isolated GEMMs, where the calibration programs'
/// GEMMs are small and their overheads (packing, calls, loops) move with their FLOPs. Held at
/// [`PRIOR_WEIGHT`] alone, the fit set it at 150-200 GFLOP/s a thread against the
/// micro-benchmark's ~250 and predicted deep_convnet's 9.7 GFLOP convolutions 1.3-1.4x slow.
const FLOP_PRIOR_WEIGHT: f64 = 100.0 * PRIOR_WEIGHT;

/// Timed training steps per program (after one warm-up step).
const STEPS: u64 = 10;

/// Per kernel of one program's step (at its smallest feasible cap when `at_floor`): its terms at
/// `rates` times its launches, and its measured seconds per step (the median of the steps).
fn samples(src: &str, rates: &CpuRates, at_floor: bool) -> Option<Vec<([f64; TERMS], f64)>> {
    let model = dmc_grammar::compile_source(src, "calibration.dm").ok()?;
    let mut opts = CompileOptions {
        verify: false,
        ..Default::default()
    };
    if at_floor {
        opts.cap = Some(sweep(&model, &opts, 2).ok()?.points.first()?.cap);
    }
    let plan = compile(&model, &opts).ok()?;
    let mut b = CpuBackend::new(plan.clone()).ok()?;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    b.init_params(7);
    let batch = Batch::random(&plan, &mut rng);
    for step in 1..=STEPS + 1 {
        batch.feed(|n, d| b.set_input(n, d)).ok()?;
        if step == 2 {
            b.set_profile(true);
        }
        b.run(step, 7).ok()?;
    }
    let prof = b.profile()?;
    let steps = prof.steps.max(1) as f64;
    Some(
        prof.kernels
            .iter()
            .filter(|k| k.launches > 0 && k.median_ms > 0.0)
            .filter_map(|k| {
                let kernel = plan.kernels.get(k.kernel)?;
                let per_step = k.launches as f64 / steps;
                let work = kernel.cpu_work();
                let terms = rates
                    .terms_in(&work, rates.kernel_cached(kernel))
                    .map(|t| t * per_step);
                // (transcendental work is measured on its own, not fitted: left out of the time)
                let special = rates.special_work_s(&work) * per_step;
                Some((terms, (k.median_ms * 1e-3 - special).max(0.0)))
            })
            .collect(),
    )
}

/// This machine's rates, fitted in place (see the module documentation).
pub fn measure() -> CpuRates {
    let t0 = Instant::now();
    let base = calibrate::measure();
    // each kernel's error on the scale of its program's step: the step's time is what the model
    // must predict, and a kernel matters by its share of it (with relative errors per kernel the
    // fit favoured the many tiny ones, and predictions came out low)
    let mut all: Vec<([f64; TERMS], f64, f64)> = vec![];
    let runs = PROGRAMS.iter().map(|&src| (src, false)).chain(
        AT_FLOOR
            .iter()
            .filter_map(|&i| Some((*PROGRAMS.get(i)?, true))),
    );
    for (src, at_floor) in runs {
        let Some(ks) = samples(src, &base, at_floor) else {
            continue;
        };
        let step: f64 = ks.iter().map(|k| k.1).sum();
        all.extend(ks.into_iter().map(|(terms, t)| (terms, t, step)));
    }
    if all.is_empty() {
        return base;
    }
    let mut rows: Vec<[f64; TERMS]> = all.iter().map(|s| s.0).collect();
    let mut times: Vec<f64> = all.iter().map(|s| s.1).collect();
    let mut scales: Vec<f64> = all.iter().map(|s| s.2).collect();
    // the prior: each weight's distance from the micro-benchmark's, relative, at PRIOR_WEIGHT
    for (j, &c0) in base.coefs().iter().enumerate() {
        if c0 > 0.0 && c0.is_finite() {
            let mut r = [0.0; TERMS];
            r[j] = 1.0;
            rows.push(r);
            times.push(c0);
            let w = if j == 0 {
                FLOP_PRIOR_WEIGHT
            } else {
                PRIOR_WEIGHT
            };
            scales.push(c0 / w.sqrt());
        }
    }
    let coefs = fit_nonneg_scaled(&rows, &times, &scales);
    let mut r = base.with_coefs(&coefs);
    calibrate::remeasure_whole_kernels(&base, &mut r.special_s);
    // the programs ran on every thread: a core taken during them shows in a probe after them
    r.parallel_share = base.parallel_share.min(calibrate::parallel_share());
    if std::env::var_os("DMC_CALIBRATION_TRACE").is_some() {
        trace(&all, &coefs);
        eprintln!("micro-benchmark weights {:?}", base.coefs());
        eprintln!("specials (s per element) {:?}", r.special_s);
    }
    r.source = format!(
        "measured on this machine ({} thread{}, {} kernels of {} calibration programs fitted, {} of them also at their floor, {:.2} s{})",
        r.threads,
        if r.threads == 1 { "" } else { "s" },
        all.len(),
        PROGRAMS.len(),
        AT_FLOOR.len(),
        t0.elapsed().as_secs_f64(),
        calibrate::busy_note(&r)
    );
    r
}

/// With `DMC_CALIBRATION_TRACE` set: every fitted kernel's measured and predicted µs, their
/// ratio, its program's step and its terms, then the fitted weights, on stderr (to see which
/// kernels a fit leaves out).
fn trace(all: &[([f64; TERMS], f64, f64)], coefs: &[f64; TERMS]) {
    eprintln!("measured_us predicted_us ratio step_us | terms ({TERMS})");
    for (t, m, step) in all {
        let p: f64 = t.iter().zip(coefs).map(|(a, b)| a * b).sum();
        let terms: Vec<String> = t.iter().map(|v| format!("{v:.3e}")).collect();
        eprintln!(
            "{:9.1} {:9.1} {:5.2} {:8.1} | {}",
            m * 1e6,
            p * 1e6,
            m / p,
            step * 1e6,
            terms.join(" ")
        );
    }
    eprintln!("weights {coefs:?}");
}

/// The rates the CLI plans with ([`calibrate::for_this_machine_with`] this [`measure`]).
pub fn rates() -> Result<CpuRates, String> {
    calibrate::for_this_machine_with(measure)
}
