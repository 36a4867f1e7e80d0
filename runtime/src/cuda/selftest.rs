//! The GPU self-test behind `dmc gpu-selftest`: every kernel against the CPU backend on fresh
//! random inputs, and short training runs with measured device memory. `dry_run` does everything
//! that needs no GPU (render, NVRTC-compile, plan).

use std::time::Instant;

use dmc_codegen::{render_kernel, CodegenOptions, CudaKernel};
use dmc_plan::op::Role;
use dmc_plan::plan::{Kernel, Mode, Plan, ALIGN};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::nvrtc::{self, parse_resources, warnings, Output, Resources};
use super::{drv, launch, load_kernels, mem_info, CudaBackend, CudaError, Device};
use crate::compare::{random_args_on, rel_err, Batch};
use crate::cpu::executor::run_single_kernel;
use crate::cpu::CpuBackend;
use crate::error::RuntimeError;
use crate::host_arena::HostArena;

/// NVRTC's verdict on one kernel.
#[derive(Debug, Clone)]
pub struct CompileReport {
    pub kernel: String,
    pub kind: &'static str,
    pub resources: Resources,
    pub warnings: Vec<String>,
    pub from_cache: bool,
}

/// Renders (with `codegen`) and compiles (to CUBIN for `arch`) every kernel of `plan`.
pub fn compile_plan(
    plan: &Plan,
    arch: &str,
    codegen: &CodegenOptions,
) -> Result<Vec<CompileReport>, CudaError> {
    compile_kernels(&plan.kernels, plan.mode, arch, codegen)
}

/// Renders (with `codegen`) and compiles (to CUBIN for `arch`) every kernel that has one.
pub fn compile_kernels(
    kernels: &[Kernel],
    mode: Mode,
    arch: &str,
    codegen: &CodegenOptions,
) -> Result<Vec<CompileReport>, CudaError> {
    let nv = nvrtc::nvrtc()?;
    let mut out = Vec::new();
    for k in kernels {
        let Some(c) = render_kernel(k, mode, codegen)? else {
            continue;
        };
        let r = nv.compile(&c.name, &c.source, arch, Output::Cubin)?;
        out.push(CompileReport {
            kernel: c.name.clone(),
            kind: k.op.kind_name(),
            resources: parse_resources(&r.log),
            warnings: warnings(&r.log),
            from_cache: r.from_cache,
        });
    }
    Ok(out)
}

/// One kernel compared with the CPU backend.
#[derive(Debug, Clone)]
pub struct KernelCheck {
    pub kernel: String,
    pub kind: &'static str,
    /// max |gpu - cpu| / max |cpu| over every written argument (NaN where either is NaN at a
    /// position where the other is not, e.g. an element the GPU never wrote).
    pub rel_err: f64,
    pub ok: bool,
}

/// Runs `k` on the GPU and on the CPU on the same random inputs (outputs poisoned with NaN on the
/// GPU first) and compares every written argument.
pub fn check_kernel(
    dev: &Device,
    k: &Kernel,
    mode: Mode,
    seed: u64,
    tol: f64,
) -> Result<Option<KernelCheck>, RuntimeError> {
    check_kernel_with(dev, k, mode, (seed, None), tol, &CodegenOptions::default())
}

/// [`check_kernel`] with `k` rendered as `codegen` says, the inputs on a grid of `grid` when
/// given (`dmc_runtime::emu::check::CheckRun::grid`: a TF32 GEMM is then exact).
pub fn check_kernel_with(
    dev: &Device,
    k: &Kernel,
    mode: Mode,
    (seed, grid): (u64, Option<f32>),
    tol: f64,
    codegen: &CodegenOptions,
) -> Result<Option<KernelCheck>, RuntimeError> {
    let Some(ck): Option<CudaKernel> = render_kernel(k, mode, codegen).map_err(CudaError::from)?
    else {
        return Ok(None);
    };
    let f = load_kernels(dev, std::slice::from_ref(&ck))?
        .pop()
        .ok_or_else(|| RuntimeError::BadPlan("no function".into()))?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (k.id as u64).wrapping_mul(0x9e37));
    let args = random_args_on(k, &mut rng, grid);
    let sig = k.op.signature();
    let (step, run_seed) = (3u64, seed);

    let mut cpu = args.clone();
    let scalars = crate::emu::check::test_scalars(k, run_seed, step);
    run_single_kernel(k, mode, &scalars, &mut cpu)?;

    // GPU: one scratch allocation holding every argument at an aligned offset.
    let mut offs = Vec::new();
    let mut total = 0usize;
    for a in &args {
        offs.push(total);
        total += a.len().div_ceil(ALIGN as usize) * ALIGN as usize;
    }
    let buf = super::DeviceBuffer::new(dev, total.max(1))?;
    let mut host = vec![0u8; total.max(1)];
    for (i, (a, p)) in args.iter().zip(&sig.params).enumerate() {
        let dst = &mut host[offs[i]..offs[i] + a.len()];
        if p.role == Role::Out || p.role == Role::Workspace {
            dst.fill(0xFF); // NaN poison: an element the kernel does not write stays NaN
        } else {
            dst.copy_from_slice(a);
        }
    }
    buf.upload(0, &host)?;
    let base = buf.ptr;
    let ptrs: Vec<u64> = offs.iter().map(|&o| base + o as u64).collect();
    // SAFETY: every argument has its own disjoint, aligned slot of the size its shape needs.
    unsafe { launch(dev, &f, &ck, &ptrs, &scalars) }?;
    dev.stream.synchronize().map_err(drv("synchronize"))?;
    buf.download(0, &mut host)?;
    let mut worst = 0f64;
    for (i, p) in sig.params.iter().enumerate() {
        if matches!(p.role, Role::Out | Role::InOut) {
            let g = &host[offs[i]..offs[i] + cpu[i].len()];
            let e = rel_err(g, &cpu[i], p.dtype);
            if e.is_nan() || e > worst {
                worst = e;
                if e.is_nan() {
                    break;
                }
            }
        }
    }
    Ok(Some(KernelCheck {
        kernel: k.name.clone(),
        kind: k.op.kind_name(),
        rel_err: worst,
        ok: worst <= tol,
    }))
}

/// A short training run on the GPU.
#[derive(Debug, Clone)]
pub struct TrainCheck {
    pub planned_arena: u64,
    pub measured_arena: u64,
    pub first_loss: f32,
    pub cpu_first_loss: Option<f32>,
    pub last_loss: f32,
    pub ms_per_step: f64,
    pub steps: usize,
}

/// Trains `plan` for `steps` steps on random batches; the first step's loss is compared with the
/// CPU backend's when `with_cpu`.
pub fn train_check(
    dev: Device,
    plan: Plan,
    steps: usize,
    seed: u64,
    with_cpu: bool,
) -> Result<TrainCheck, RuntimeError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let batches: Vec<_> = (0..steps.min(4))
        .map(|_| Batch::random(&plan, &mut rng))
        .collect();
    let cpu_first_loss = if with_cpu {
        let mut cpu = CpuBackend::new(plan.clone())?;
        cpu.init_params(seed);
        batches[0].feed(|n, d| cpu.set_input(n, d))?;
        Some(cpu.run(1, seed)?)
    } else {
        None
    };
    let planned_arena = plan.arena_bytes;
    let mut be = CudaBackend::with_device(plan, dev)?;
    be.init_params(seed)?;
    let (mut first, mut last) = (f32::NAN, f32::NAN);
    let mut t_after_first = Instant::now();
    for s in 0..steps {
        batches[s % batches.len()].feed(|n, d| be.set_input(n, d))?;
        let l = be.run(s as u64 + 1, seed)?;
        if s == 0 {
            first = l;
            t_after_first = Instant::now();
        }
        last = l;
    }
    let ms = t_after_first.elapsed().as_secs_f64() * 1e3 / (steps.saturating_sub(1).max(1)) as f64;
    let _ = mem_info(be.device());
    Ok(TrainCheck {
        planned_arena,
        measured_arena: be.measured_arena_bytes,
        first_loss: first,
        cpu_first_loss,
        last_loss: last,
        ms_per_step: ms,
        steps,
    })
}

/// On the GPU: a NaN loss stops the step before any update (the weights stay as they were), and
/// poison mode gives the same losses and weights as a normal run. `Ok(None)` when both hold,
/// else what went wrong.
pub fn halt_and_poison_check(
    dev: Device,
    plan: Plan,
    seed: u64,
) -> Result<Option<String>, RuntimeError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let batches: Vec<_> = (0..2).map(|_| Batch::random(&plan, &mut rng)).collect();
    let mut runs = Vec::new();
    for poison in [false, true] {
        let mut be = CudaBackend::with_device(plan.clone(), dev.clone())?;
        be.set_poison(poison);
        be.set_halt_on_nonfinite_loss(true);
        be.init_params(seed)?;
        let mut losses = Vec::new();
        for (s, b) in batches.iter().enumerate() {
            b.feed(|n, d| be.set_input(n, d))?;
            losses.push(be.run(s as u64 + 1, seed)?);
        }
        runs.push((losses, be.params()?));
        if poison {
            let before = be.params()?;
            let mut bad = Batch(batches[0].0.clone());
            if let Some(v) = bad.0.iter_mut().find_map(|t| t.1.first_mut()) {
                *v = f32::NAN;
            }
            bad.feed(|n, d| be.set_input(n, d))?;
            let l = be.run(3, seed)?;
            if l.is_finite() {
                return Ok(Some(format!("a NaN input gave the finite loss {l}")));
            }
            if be.params()? != before {
                return Ok(Some("the weights changed after a NaN loss".into()));
            }
        }
    }
    if runs[0].0.iter().any(|l| !l.is_finite()) {
        return Ok(Some(format!("non-finite losses {:?}", runs[0].0)));
    }
    if runs[0] != runs[1] {
        return Ok(Some(format!(
            "poison mode changed the results: losses {:?} vs {:?}",
            runs[0].0, runs[1].0
        )));
    }
    Ok(None)
}
