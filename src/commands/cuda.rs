//! The CUDA side of the CLI: `dmc compile` writing the generated kernels (and `--arch` compiling
//! them with NVRTC), and the hidden `dmc gpu-selftest` behind `scripts/gpu-check.sh`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use dmc_codegen::{render_plan, CodegenOptions};
use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::CompileOptions;
use dmc_runtime::cuda::{self, nvrtc, selftest};

use super::compile::write_atomic;
use crate::report::CliError;
use crate::size::{human, parse_size};

fn cuda_err(e: cuda::CudaError) -> CliError {
    CliError::Runtime(Box::new(e.into()))
}

/// Writes one `<kernel name>.cu` per plan kernel (rendered with `codegen`) into `dir`; with `arch`,
/// compiles them with NVRTC and prints a resource table.
pub fn write_kernels(
    plan: &Plan,
    dir: &Path,
    arch: Option<&str>,
    codegen: &CodegenOptions,
) -> Result<(), CliError> {
    let kernels = render_plan(plan, codegen).map_err(|e| cuda_err(e.into()))?;
    for k in &kernels {
        write_atomic(&dir.join(format!("{}.cu", k.name)), k.source.as_bytes())?;
    }
    let Some(arch) = arch else {
        return Ok(());
    };
    if nvrtc::arch_number(arch).is_none() {
        return Err(CliError::Usage(format!(
            "--arch {arch}: expected a GPU architecture like sm_80 or sm_90"
        )));
    }
    let nv = nvrtc::nvrtc().map_err(cuda_err)?;
    let reports = selftest::compile_plan(plan, arch, codegen).map_err(cuda_err)?;
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

#[derive(Debug, clap::Args)]
pub struct SelftestArgs {
    /// Render, NVRTC-compile and plan everything, but launch nothing (no GPU needed).
    #[arg(long)]
    pub dry_run: bool,
    /// Directory of the example programs.
    #[arg(long, default_value = "examples")]
    pub examples: PathBuf,
    /// Architecture for the dry run (a real run uses the GPU's).
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
    /// Training steps per training check.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Memory cap for the training plans.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub vram_cap: Option<u64>,
    /// Relative error allowed against the CPU backend (max |gpu-cpu| / max |cpu| per output).
    #[arg(long, default_value_t = 1e-5)]
    pub tol: f64,
    /// Skip the per-kernel check of these examples (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub skip_kernels: Vec<String>,
}

const TRAINED: &[&str] = &["seed", "deep_convnet"];

fn plan_for(path: &Path, mode: Mode, cap: Option<u64>) -> Result<Plan, CliError> {
    let model = super::load_model(path)?;
    let opts = CompileOptions {
        mode,
        cap,
        verify: true,
        ..CompileOptions::default()
    };
    Ok(dmc_compiler::compile(&model, &opts)?)
}

fn examples(dir: &Path) -> Result<Vec<(String, PathBuf)>, CliError> {
    let rd = std::fs::read_dir(dir).map_err(|e| {
        CliError::Message(format!(
            "cannot read the examples in `{}`: {e}",
            dir.display()
        ))
    })?;
    let mut v: Vec<(String, PathBuf)> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "dm"))
        .filter_map(|p| Some((p.file_stem()?.to_str()?.to_string(), p)))
        .collect();
    v.sort();
    Ok(v)
}

/// `dmc gpu-selftest [--dry-run]`: prints one summary table; fails if any check fails.
pub fn selftest(a: &SelftestArgs) -> Result<(), CliError> {
    let t0 = Instant::now();
    let exs = examples(&a.examples)?;
    let mut rows: Vec<[String; 4]> = Vec::new();
    let mut failed = 0usize;
    let dev = if a.dry_run {
        None
    } else {
        Some(cuda::open_device().map_err(cuda_err)?)
    };
    let arch = dev
        .as_ref()
        .map(|d| d.arch.clone())
        .unwrap_or(a.arch.clone());
    if let Some(d) = &dev {
        eprintln!("GPU: {} ({})", d.name, d.arch);
    }
    for (name, path) in &exs {
        for mode in [Mode::Train, Mode::Eval] {
            let plan = plan_for(path, mode, None)?;
            let what = format!("{mode:?} kernels");
            let reports = selftest::compile_plan(&plan, &arch, &CodegenOptions::default())
                .map_err(cuda_err)?;
            let spills: u32 = reports
                .iter()
                .map(|r| r.resources.spill_stores + r.resources.spill_loads)
                .sum();
            let warns: usize = reports.iter().map(|r| r.warnings.len()).sum();
            let max_regs = reports
                .iter()
                .map(|r| r.resources.registers)
                .max()
                .unwrap_or(0);
            let mut result = format!(
                "{} compiled for {arch}: max {max_regs} regs, {spills} B spills, {warns} warnings",
                reports.len()
            );
            let mut ok = spills == 0 && warns == 0;
            if let (Some(d), false) = (&dev, a.skip_kernels.contains(name)) {
                let mut worst = 0f64;
                let mut bad = Vec::new();
                for k in &plan.kernels {
                    let Some(c) = selftest::check_kernel(d, k, mode, 7, a.tol)? else {
                        continue;
                    };
                    if !c.ok {
                        bad.push(format!(
                            "{} ({}): rel err {:.2e}",
                            c.kernel, c.kind, c.rel_err
                        ));
                    }
                    if c.rel_err.is_nan() || c.rel_err > worst {
                        worst = c.rel_err;
                    }
                }
                for b in &bad {
                    eprintln!("FAIL {name} {mode:?}: {b}");
                }
                ok &= bad.is_empty();
                result.push_str(&format!(
                    "; vs CPU: max rel err {worst:.2e}, {} failed",
                    bad.len()
                ));
            }
            failed += usize::from(!ok);
            rows.push([
                name.clone(),
                what,
                result,
                if ok { "ok" } else { "FAIL" }.into(),
            ]);
        }
    }
    // one kernel of every op variant (the examples do not use them all)
    {
        let zoo = dmc_codegen::zoo::zoo();
        let reports =
            selftest::compile_kernels(&zoo, Mode::Train, &arch, &CodegenOptions::default())
                .map_err(cuda_err)?;
        let spills: u32 = reports
            .iter()
            .map(|r| r.resources.spill_stores + r.resources.spill_loads)
            .sum();
        let warns: usize = reports.iter().map(|r| r.warnings.len()).sum();
        let mut ok = spills == 0 && warns == 0;
        let mut result = format!(
            "{} compiled for {arch}: {spills} B spills, {warns} warnings",
            reports.len()
        );
        if let Some(d) = &dev {
            let mut worst = 0f64;
            let mut bad = 0;
            for k in &zoo {
                let Some(c) = selftest::check_kernel(d, k, Mode::Train, 11, a.tol)? else {
                    continue;
                };
                if !c.ok {
                    bad += 1;
                    eprintln!(
                        "FAIL zoo: {} ({}): rel err {:.2e}",
                        c.kernel, c.kind, c.rel_err
                    );
                }
                if c.rel_err.is_nan() || c.rel_err > worst {
                    worst = c.rel_err;
                }
            }
            ok &= bad == 0;
            result.push_str(&format!("; vs CPU: max rel err {worst:.2e}, {bad} failed"));
        }
        failed += usize::from(!ok);
        rows.push([
            "(every op)".into(),
            "Train kernels".into(),
            result,
            if ok { "ok" } else { "FAIL" }.into(),
        ]);
    }
    // the NaN halt and poison mode on the device (mlp: small, classification)
    if let Some((_, path)) = exs.iter().find(|(n, _)| n == "mlp") {
        let what = "NaN halt, --poison".to_string();
        let (result, ok) = match &dev {
            None => ("dry run: not launched".to_string(), true),
            Some(d) => {
                let plan = plan_for(path, Mode::Train, None)?;
                match selftest::halt_and_poison_check(d.clone(), plan, 3)? {
                    None => (
                        "a NaN loss stops the step before any update; poison mode changes nothing"
                            .to_string(),
                        true,
                    ),
                    Some(e) => (e, false),
                }
            }
        };
        failed += usize::from(!ok);
        rows.push([
            "mlp".into(),
            what,
            result,
            if ok { "ok" } else { "FAIL" }.into(),
        ]);
    }
    for name in TRAINED {
        let Some((_, path)) = exs.iter().find(|(n, _)| n == name) else {
            continue;
        };
        let plan = plan_for(path, Mode::Train, a.vram_cap)?;
        let cap = a.vram_cap.map(human).unwrap_or_else(|| "none".into());
        let what = format!("train {} steps, cap {cap}", a.steps);
        let Some(d) = &dev else {
            rows.push([
                name.to_string(),
                what,
                format!(
                    "planned arena {} (dry run: not launched)",
                    human(plan.arena_bytes)
                ),
                "ok".into(),
            ]);
            continue;
        };
        let r = selftest::train_check(d.clone(), plan, a.steps, 1, true)?;
        let cpu = r
            .cpu_first_loss
            .map(|c| ((r.first_loss - c).abs() / c.abs().max(1e-30)) as f64)
            .unwrap_or(f64::NAN);
        let ok = r.last_loss.is_finite() && cpu <= 1e-4 && r.measured_arena >= r.planned_arena;
        failed += usize::from(!ok);
        rows.push([
            name.to_string(),
            what,
            format!(
                "arena planned {} measured {} ({:+.2}%), {:.2} ms/step, loss {:.4} -> {:.4}, step-1 loss vs CPU rel err {cpu:.1e}",
                human(r.planned_arena),
                human(r.measured_arena),
                (r.measured_arena as f64 / r.planned_arena.max(1) as f64 - 1.0) * 100.0,
                r.ms_per_step,
                r.first_loss,
                r.last_loss
            ),
            if ok { "ok" } else { "FAIL" }.into(),
        ]);
    }
    let w0 = rows.iter().map(|r| r[0].len()).max().unwrap_or(0).max(7);
    let w1 = rows.iter().map(|r| r[1].len()).max().unwrap_or(0).max(5);
    println!(
        "\ndmc gpu-selftest{} ({:.1} s)",
        if a.dry_run { " --dry-run" } else { "" },
        t0.elapsed().as_secs_f64()
    );
    println!("{:<w0$}  {:<w1$}  {:<4}  result", "example", "check", "");
    for r in &rows {
        println!("{:<w0$}  {:<w1$}  {:<4}  {}", r[0], r[1], r[3], r[2]);
    }
    if failed > 0 {
        return Err(CliError::Message(format!(
            "gpu-selftest: {failed} check(s) failed"
        )));
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct EmuCheckArgs {
    /// The program (.dm file).
    pub file: PathBuf,
    /// Which step's kernels.
    #[arg(long, value_enum, default_value_t = super::compile::ModeArg::Train)]
    pub mode: super::compile::ModeArg,
    /// Batch size (overrides the program's).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Memory cap for the plan (the kernels run at the offsets of the plan that fits it).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub vram_cap: Option<u64>,
    /// Relative error allowed against the CPU backend (max |emulated - cpu| / max |cpu| per output).
    #[arg(long, default_value_t = 1e-5)]
    pub tol: f64,
    /// OS threads for a kernel's blocks (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

/// `dmc emu-check net.dm`: every kernel of the plan through the CUDA emulator, one line each.
pub fn emu_check(a: &EmuCheckArgs) -> Result<(), CliError> {
    use dmc_runtime::emu::{self, check};
    let model = super::load_model(&a.file)?;
    let mode = Mode::from(a.mode);
    let opts = CompileOptions {
        mode,
        batch: a.batch,
        cap: a.vram_cap,
        verify: true,
        ..CompileOptions::default()
    };
    let plan = dmc_compiler::compile(&model, &opts)?;
    let threads = a.threads.unwrap_or_else(emu::default_threads).max(1);
    let t0 = Instant::now();
    let checks = check::check_plan(
        &plan,
        check::CheckRun {
            seed: a.seed,
            threads,
        },
    )?;
    let width = |f: fn(&check::EmuCheck) -> usize, min: usize| {
        checks.iter().map(f).max().unwrap_or(min).max(min)
    };
    let (w, wk) = (width(|c| c.kernel.len(), 6), width(|c| c.kind.len(), 4));
    println!(
        "{:<w$}  {:<wk$}  {:>9}  result",
        "kernel", "kind", "emu (ms)"
    );
    let mut failed = 0;
    for c in &checks {
        let ok = c.ok(a.tol);
        failed += usize::from(!ok);
        println!(
            "{:<w$}  {:<wk$}  {:>9.1}  {}{}",
            c.kernel,
            c.kind,
            c.seconds * 1e3,
            if ok { "" } else { "FAIL: " },
            c.verdict(a.tol)
        );
    }
    let worst = checks.iter().map(|c| c.rel_err).fold(0f64, |m, e| {
        if e.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(e)
        }
    });
    let launches: f64 = checks.iter().map(|c| c.seconds).sum();
    println!(
        "{}: {} kernels of the {mode:?} step emulated in both thread orders on {threads} threads \
         (launches {launches:.2} s, all {:.1} s), max rel err vs CPU {worst:.2e}, {failed} failed",
        a.file.display(),
        checks.len(),
        t0.elapsed().as_secs_f64()
    );
    if failed > 0 {
        return Err(CliError::Message(format!(
            "emu-check: {failed} kernel(s) failed; `dmc compile {} -o DIR` writes their CUDA C",
            a.file.display()
        )));
    }
    Ok(())
}
