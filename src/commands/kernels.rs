//! The generated CUDA C of a plan on disk: `dmc compile` writes one `.cu` per kernel, and with
//! `--arch` compiles them with NVRTC and prints each kernel's resources and launch shape.

use std::path::Path;

use dmc_codegen::{render_plan, CodegenOptions};
use dmc_compiler::plan::{Plan, Precision};
use dmc_runtime::cuda::{self, nvrtc, selftest};
use dmc_runtime::io;

use crate::report::CliError;

/// `--no-split-k`, `--no-cp-async`, `--no-skinny`, `--baseline-gemm`: how the CUDA kernels are rendered, for the commands that render or run them
/// (`compile`, `run`, `eval`, `predict`).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct CodegenArgs {
    /// Render every GEMM kernel unsplit (no split-K): the baseline of a split-K comparison.
    #[arg(long)]
    pub no_split_k: bool,
    /// Render every GEMM as the baseline kernel (one 64x64 tile, k-step 16, unpipelined,
    /// unsplit): the reference of a GEMM speed comparison.
    #[arg(long)]
    pub baseline_gemm: bool,
    /// Stage every GEMM's next tile in registers instead of cp.async copies into shared memory
    /// (sm_80+): the baseline of a cp.async comparison.
    #[arg(long)]
    pub no_cp_async: bool,
    /// Tile every GEMM, also those the skinny kernels would take (a few rows against a large
    /// weight, a short reduction): the baseline of a skinny-kernel comparison.
    #[arg(long)]
    pub no_skinny: bool,
    /// The GEMMs' arithmetic on the GPU: `fp32` FMAs, or `tf32` tensor cores (sm_80+: inputs
    /// rounded to 10 mantissa bits, fp32 accumulation). Default: the program's
    /// `train { precision }`, else fp32. The CPU backend computes in fp32 either way.
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionArg>,
}

/// `--precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    Fp32,
    Tf32,
}

impl CodegenArgs {
    /// The code generator's options these flags name, for `plan` (whose `precision` applies
    /// unless `--precision` overrides it).
    pub fn options(&self, plan: &Plan) -> CodegenOptions {
        CodegenOptions {
            split_k: !self.no_split_k && !self.baseline_gemm,
            baseline_gemm: self.baseline_gemm,
            copy_async: !self.no_cp_async,
            skinny: !self.no_skinny,
            tf32: self.precision(plan) == Precision::Tf32,
            ..CodegenOptions::default()
        }
    }

    /// The GEMMs' precision for `plan`: `--precision`, else the plan's.
    pub fn precision(&self, plan: &Plan) -> Precision {
        match self.precision {
            Some(PrecisionArg::Fp32) => Precision::Fp32,
            Some(PrecisionArg::Tf32) => Precision::Tf32,
            None => plan.precision,
        }
    }
}

/// Writes one `<kernel name>.cu` per plan kernel (rendered with `codegen`) into `dir`; with `arch`,
/// compiles them with NVRTC and prints a resource table.
pub fn write_kernels(
    plan: &Plan,
    dir: &Path,
    arch: Option<&str>,
    codegen: &CodegenOptions,
) -> Result<(), CliError> {
    let kernels = render_plan(plan, codegen).map_err(cuda::CudaError::from)?;
    for k in &kernels {
        io::write_file_atomic(&dir.join(format!("{}.cu", k.name)), k.source.as_bytes())?;
    }
    let Some(arch) = arch else {
        return Ok(());
    };
    if nvrtc::arch_number(arch).is_none() {
        return Err(CliError::Usage(format!(
            "--arch {arch}: expected a GPU architecture like sm_80 or sm_90"
        )));
    }
    let nv = nvrtc::nvrtc()?;
    let reports = selftest::compile_plan(plan, arch, codegen)?;
    println!(
        "NVRTC {}.{} ({}), {arch}, CUBIN:",
        nv.version.0,
        nv.version.1,
        nv.path.display()
    );
    println!(
        "{:<28} {:<22} {:>5} {:>10} {:>11} {:>9} {:>9} {:>8}",
        "kernel", "kind", "regs", "smem (B)", "spills (B)", "warnings", "blocks", "threads"
    );
    for (r, k) in reports.iter().zip(&kernels) {
        let s = r.resources;
        println!(
            "{:<28} {:<22} {:>5} {:>10} {:>11} {:>9} {:>9} {:>8}",
            r.kernel,
            r.kind,
            s.registers,
            s.shared_bytes,
            s.spill_stores + s.spill_loads,
            r.warnings.len(),
            k.grid.iter().map(|&g| g as u64).product::<u64>(),
            k.block.iter().product::<u32>()
        );
        for w in &r.warnings {
            println!("    {w}");
        }
    }
    Ok(())
}
