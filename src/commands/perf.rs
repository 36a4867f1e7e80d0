//! The performance model on the command line: `dmc compile --perf` (a table per kernel, registers
//! from NVRTC where it loads) and the predicted step line of `dmc plan` (`--gpu NAME` for both).

use std::collections::HashMap;
use std::fmt::Write as _;

use dmc_codegen::perf::{self, gpu, gpu_names, Gpu, KernelResources, StepPerf, CALIBRATION};
use dmc_codegen::{render_plan, CodegenOptions};
use dmc_compiler::plan::Plan;
use dmc_runtime::cuda::{self, nvrtc, selftest};

use crate::report::CliError;

/// `--gpu NAME`: the GPU the performance model predicts for.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GpuArg {
    /// The GPU the performance model predicts the step's time on, and chooses the GEMM tiles and
    /// splits for: H200 (the default), H100,
    /// A100, RTX4090 or GTX960 (the question's 2 GB card).
    #[arg(long, value_name = "NAME")]
    pub gpu: Option<String>,
}

impl GpuArg {
    /// The GPU named, or the table's first (H200).
    pub fn gpu(&self) -> Result<&'static Gpu, CliError> {
        match &self.gpu {
            None => Ok(&perf::GPUS[0]),
            Some(n) => gpu(n).ok_or_else(|| {
                CliError::Usage(format!(
                    "--gpu {n}: not a GPU the performance model knows; use one of {}",
                    gpu_names()
                ))
            }),
        }
    }
}

/// Where a prediction's registers and shared memory came from.
pub enum ResourceSource {
    Nvrtc(String),
    Estimated(String),
}

impl ResourceSource {
    fn describe(&self) -> String {
        match self {
            ResourceSource::Nvrtc(arch) => format!("registers from NVRTC ({arch})"),
            ResourceSource::Estimated(why) => format!("registers estimated ({why})"),
        }
    }
}

/// Each kernel's NVRTC resources for `arch` by name, when NVRTC loads (else why not).
pub fn nvrtc_resources(
    plan: &Plan,
    arch: &str,
    codegen: &CodegenOptions,
) -> Result<HashMap<String, KernelResources>, String> {
    let reports = selftest::compile_plan(plan, arch, codegen).map_err(|e| e.to_string())?;
    Ok(reports
        .into_iter()
        .map(|r| {
            (
                r.kernel,
                KernelResources {
                    registers: r.resources.registers,
                    shared_bytes: r.resources.shared_bytes,
                },
            )
        })
        .collect())
}

/// The model's prediction for `plan` on `gpu`, with `resources` by kernel name (missing: estimated).
pub fn predict(
    plan: &Plan,
    codegen: &CodegenOptions,
    resources: &HashMap<String, KernelResources>,
    gpu: &'static Gpu,
) -> Result<StepPerf, CliError> {
    let kernels = render_plan(plan, codegen).map_err(cuda::CudaError::from)?;
    Ok(perf::step_perf(
        plan,
        &kernels,
        &|n| resources.get(n).copied(),
        gpu,
        &CALIBRATION,
    ))
}

/// The GPU's line of numbers the model uses.
fn gpu_line(g: &Gpu) -> String {
    format!(
        "{} ({}, {} SMs, {:.2} TB/s, {:.1} TFLOP/s fp32, {} MiB L2)",
        g.name,
        g.arch,
        g.sms,
        g.dram_bw / 1e12,
        g.fp32_flops() / 1e12,
        g.l2_bytes >> 20
    )
}

fn ms(s: f64) -> String {
    format!("{:.3} ms", s * 1e3)
}

/// The one-line step prediction (`dmc plan`, and the last line of the `--perf` table).
pub fn step_line(p: &StepPerf, src: &ResourceSource) -> String {
    format!(
        "predicted step on {}{}: {} ({} launches; roofline floor {}, {:.1}x it; {})",
        p.gpu,
        if p.tf32 { " (TF32 tensor cores)" } else { "" },
        ms(p.predicted_s),
        p.launches,
        ms(p.floor_s),
        p.ratio(),
        src.describe()
    )
}

/// The per-kernel table of `dmc compile --perf`.
pub fn table(p: &StepPerf, g: &Gpu, src: &ResourceSource) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "performance model: {}, {}", gpu_line(g), src.describe());
    let _ = writeln!(
        s,
        "{:<28} {:>4} {:>8} {:>9} {:>9} {:>9} {:>7} {:>4} {:>4} {:>5} {:>6} {:>10} {:>10} {:>7}  bound",
        "kernel",
        "runs",
        "GFLOP",
        "min MB",
        "moved MB",
        "DRAM MB",
        "blocks",
        "regs",
        "/SM",
        "occ",
        "waves",
        "floor us",
        "model us",
        "x floor"
    );
    for k in &p.kernels {
        let _ = writeln!(
            s,
            "{:<28} {:>4} {:>8.3} {:>9.2} {:>9.2} {:>9.2} {:>7} {:>4} {:>4} {:>4.0}% {:>6.2} {:>10.1} {:>10.1} {:>7.1}  {}",
            k.kernel,
            k.launches,
            k.flops / 1e9,
            k.min_bytes / 1e6,
            k.moved_bytes / 1e6,
            k.dram_bytes / 1e6,
            k.blocks,
            format!("{}{}", k.registers, if k.estimated { "~" } else { "" }),
            k.resident,
            k.occupancy * 100.0,
            k.waves,
            k.floor_s * 1e6,
            k.predicted_s * 1e6,
            if k.floor_s > 0.0 {
                k.predicted_s / k.floor_s
            } else {
                1.0
            },
            k.bound.name()
        );
    }
    let _ = writeln!(
        s,
        "step: {:.2} GFLOP, {:.1} MB moved at least; {}",
        p.flops / 1e9,
        p.min_bytes / 1e6,
        step_line(p, src)
    );
    s
}

/// The resources for a prediction on `g`: NVRTC's for `arch` (or the GPU's) when NVRTC loads,
/// else estimated.
pub fn resources_for(
    plan: &Plan,
    arch: Option<&str>,
    g: &Gpu,
    codegen: &CodegenOptions,
) -> (HashMap<String, KernelResources>, ResourceSource) {
    let arch = arch.unwrap_or(g.arch);
    match nvrtc::nvrtc() {
        Err(e) => (
            HashMap::new(),
            ResourceSource::Estimated(format!("NVRTC not loaded: {e}")),
        ),
        Ok(_) => match nvrtc_resources(plan, arch, codegen) {
            Ok(m) => (m, ResourceSource::Nvrtc(arch.to_string())),
            Err(e) => (
                HashMap::new(),
                ResourceSource::Estimated(format!("NVRTC failed: {e}")),
            ),
        },
    }
}

/// The model's time of one launch of each kernel of `plan` (by name) on the GPU this process
/// runs on (its entry of the model's table, else the H200), with NVRTC's registers for the
/// device's architecture, and a line saying so: the predicted column of `dmc run --profile`.
/// `None` when no device opens.
pub fn device_predictions(
    plan: &Plan,
    codegen: &CodegenOptions,
) -> Option<(HashMap<String, f64>, String)> {
    let d = cuda::open_device().ok()?;
    let g = perf::gpu_of_device(&d.name).unwrap_or(&perf::GPUS[0]);
    let (res, src) = resources_for(plan, Some(&d.arch), g, codegen);
    let p = predict(plan, codegen, &res, g).ok()?;
    let by_name = p
        .kernels
        .iter()
        .map(|k| (k.kernel.clone(), k.predicted_s))
        .collect();
    let line = format!(
        "predicted: the performance model on {} (for {}), {}; whole step {} predicted",
        g.name,
        d.name,
        src.describe(),
        ms(p.predicted_s)
    );
    Some((by_name, line))
}
