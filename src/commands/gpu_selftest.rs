//! `dmc gpu-selftest [--dry-run]` (hidden; behind `scripts/gpu-check.sh`): every example's train
//! and eval kernels and the op zoo compiled with NVRTC and (on a GPU) checked against the CPU
//! backend, the NaN halt and poison mode on the device, and a few training runs, as one table.

use std::path::{Path, PathBuf};
use std::time::Instant;

use dmc_codegen::perf::{gpu_of_device, GPUS};
use dmc_codegen::CodegenOptions;
use dmc_compiler::plan::{Mode, Plan};
use dmc_runtime::cuda::{self, selftest};

use super::perf::{predict, resources_for};
use super::plan_args::{PlanArgs, StepArgs, VERIFY};
use super::program::load_model;
use crate::report::CliError;
use crate::size::human;

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
    // What shapes every plan; `--vram-cap` caps the plans of the training checks only (the kernel
    // checks run each example's uncapped plans).
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Relative error allowed against the CPU backend (max |gpu-cpu| / max |cpu| per output).
    #[arg(long, default_value_t = 1e-5)]
    pub tol: f64,
    /// Skip the per-kernel check of these examples (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub skip_kernels: Vec<String>,
}

/// The examples whose training runs on the device.
const TRAINED: &[&str] = &["seed", "deep_convnet"];

/// The example whose plan checks the NaN halt and poison mode (small, classification).
const HALTED: &str = "mlp";

/// One row of the summary table.
struct Row {
    example: String,
    check: String,
    result: String,
    ok: bool,
}

/// Every plan the self-test needs, compiled before any GPU work, so that flags no plan can meet
/// (a `--vram-cap` too small, `--remat off` under it) are refused first.
struct Plans {
    /// Per example: its uncapped train and eval plans, whose kernels are checked.
    kernels: Vec<(String, [(Mode, Plan); 2])>,
    /// Per trained example: its training plan under `--vram-cap`.
    trained: Vec<(String, Plan)>,
}

fn plan_all(a: &SelftestArgs) -> Result<Plans, CliError> {
    let uncapped = PlanArgs {
        step: StepArgs {
            vram_cap: None,
            ..a.plan.step.clone()
        },
        ..a.plan.clone()
    };
    let compile = |path: &Path, args: &PlanArgs, mode: Mode| -> Result<Plan, CliError> {
        let model = load_model(path)?;
        Ok(dmc_compiler::compile(&model, &args.options(mode, VERIFY)?)?)
    };
    let mut plans = Plans {
        kernels: Vec::new(),
        trained: Vec::new(),
    };
    for (name, path) in examples(&a.examples)? {
        let train = compile(&path, &uncapped, Mode::Train)?;
        let eval = compile(&path, &uncapped.beside_training(), Mode::Eval)?;
        if TRAINED.contains(&name.as_str()) {
            plans
                .trained
                .push((name.clone(), compile(&path, &a.plan, Mode::Train)?));
        }
        plans
            .kernels
            .push((name, [(Mode::Train, train), (Mode::Eval, eval)]));
    }
    // in the order of TRAINED
    plans
        .trained
        .sort_by_key(|(n, _)| TRAINED.iter().position(|t| t == n));
    Ok(plans)
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
pub fn run(a: &SelftestArgs) -> Result<(), CliError> {
    let t0 = Instant::now();
    let plans = plan_all(a)?;
    let dev = if a.dry_run {
        None
    } else {
        Some(cuda::open_device()?)
    };
    let arch = dev
        .as_ref()
        .map(|d| d.arch.clone())
        .unwrap_or(a.arch.clone());
    if let Some(d) = &dev {
        eprintln!("GPU: {} ({})", d.name, d.arch);
    }
    let mut rows = Vec::new();
    for (name, modes) in &plans.kernels {
        for (mode, plan) in modes {
            let dev = dev.as_ref().filter(|_| !a.skip_kernels.contains(name));
            rows.push(kernel_row(name, *mode, plan, &arch, dev, a.tol)?);
        }
    }
    rows.push(zoo_row(&arch, dev.as_ref(), a.tol)?);
    rows.push(skinny_row(&arch, dev.as_ref(), a.tol)?);
    if dmc_codegen::perf::sm_of(&arch) >= 80 {
        rows.push(tf32_row(&arch, dev.as_ref())?);
    }
    let halted = plans.kernels.iter().find(|(n, _)| n == HALTED);
    if let Some((_, [(_, plan), _])) = halted {
        rows.push(halt_row(plan, dev.as_ref())?);
    }
    for (name, plan) in &plans.trained {
        rows.push(train_row(name, plan, a, dev.as_ref())?);
    }
    print_table(&rows, a.dry_run, t0);
    let failed = rows.iter().filter(|r| !r.ok).count();
    if failed > 0 {
        return Err(CliError::Message(format!(
            "gpu-selftest: {failed} check(s) failed"
        )));
    }
    Ok(())
}

/// Spill bytes and warnings of compiled kernels.
fn spills_and_warnings(reports: &[selftest::CompileReport]) -> (u32, usize) {
    let spills = reports
        .iter()
        .map(|r| r.resources.spill_stores + r.resources.spill_loads)
        .sum();
    let warns = reports.iter().map(|r| r.warnings.len()).sum();
    (spills, warns)
}

/// One example's kernels of the `mode` step: NVRTC-compiled for `arch`, and with a device,
/// each run and compared with the CPU backend.
fn kernel_row(
    name: &str,
    mode: Mode,
    plan: &Plan,
    arch: &str,
    dev: Option<&cuda::Device>,
    tol: f64,
) -> Result<Row, CliError> {
    let reports = selftest::compile_plan(plan, arch, &CodegenOptions::default())?;
    let (spills, warns) = spills_and_warnings(&reports);
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
    if let Some(d) = dev {
        let mut worst = 0f64;
        let mut bad = Vec::new();
        for k in &plan.kernels {
            let Some(c) = selftest::check_kernel(d, k, mode, 7, tol)? else {
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
    Ok(Row {
        example: name.to_string(),
        check: format!("{mode:?} kernels"),
        result,
        ok,
    })
}

/// The worst relative error and the failures of a run of kernel checks.
#[derive(Default)]
struct Tally {
    worst: f64,
    bad: usize,
}

impl Tally {
    /// Counts `c` (a failure when `failed`, reported on stderr under `what`).
    fn add(&mut self, c: &selftest::KernelCheck, what: &str, failed: bool) {
        if failed {
            self.bad += 1;
            eprintln!(
                "FAIL {what}: {} ({}): rel err {:.2e}",
                c.kernel, c.kind, c.rel_err
            );
        }
        if c.rel_err.is_nan() || c.rel_err > self.worst {
            self.worst = c.rel_err;
        }
    }
}

/// Every GEMM of the op zoo on TF32 tensor cores (the 64x64 tile and the 16x64 one), its
/// inputs on a grid of 1/8: exact in TF32, every sum of products exact in fp32, so a GEMM whose
/// outputs are sums and adds alone ([`dmc_codegen::zoo::exact_on_a_grid`]) must give the CPU's
/// fp32 result exactly (the MMA fragments' layout on the hardware); those with activations (CUDA's
/// math library) or fused updates, within the fp32 tolerance.
fn tf32_row(arch: &str, dev: Option<&cuda::Device>) -> Result<Row, CliError> {
    let zoo = dmc_codegen::zoo::gemms();
    let mut n = 0;
    let (mut ok, mut tally) = (true, Tally::default());
    for tile in [dmc_codegen::TILES[1], dmc_codegen::TILES[3]] {
        let cg = CodegenOptions {
            tile: Some(tile),
            tf32: true,
            ..CodegenOptions::default()
        };
        let reports = selftest::compile_kernels(&zoo, Mode::Train, arch, &cg)?;
        for r in &reports {
            let spills = r.resources.spill_stores + r.resources.spill_loads;
            if spills > 0 || !r.warnings.is_empty() {
                ok = false;
                eprintln!(
                    "FAIL TF32 zoo {}x{}: {}: {spills} B spills, warnings {:?}",
                    tile.bm, tile.bn, r.kernel, r.warnings
                );
            }
        }
        n += reports.len();
        let Some(d) = dev else { continue };
        for k in &zoo {
            let Some(c) =
                selftest::check_kernel_with(d, k, Mode::Train, (13, Some(0.125)), 1e-5, &cg)?
            else {
                continue;
            };
            let exact = dmc_codegen::zoo::exact_on_a_grid(&k.op);
            tally.add(&c, "TF32 zoo", !c.ok || (exact && c.rel_err != 0.0));
        }
    }
    let Tally { worst, bad } = tally;
    ok &= bad == 0;
    let mut result = format!("{n} TF32 GEMMs compiled for {arch}");
    if dev.is_some() {
        result.push_str(&format!(
            "; on a 1/8 grid vs CPU: max rel err {worst:.2e} (plain GEMMs exact), {bad} failed"
        ));
    }
    Ok(Row {
        example: "(every GEMM)".into(),
        check: "TF32 tensor cores".into(),
        result,
        ok,
    })
}

/// Every GEMM of the op zoo that a skinny kernel can compute (a few rows, a short reduction), forced
/// onto the model's fastest skinny candidate: compiled without spills or warnings, and on a GPU
/// against the CPU backend (the examples' own skinny kernels are in their rows).
fn skinny_row(arch: &str, dev: Option<&cuda::Device>, tol: f64) -> Result<Row, CliError> {
    let cg = CodegenOptions {
        force_skinny: true,
        ..CodegenOptions::default()
    };
    let zoo: Vec<_> = dmc_codegen::zoo::gemms()
        .into_iter()
        .filter(|k| {
            dmc_codegen::render_kernel(k, Mode::Train, &cg)
                .ok()
                .flatten()
                .and_then(|c| c.gemm)
                .is_some_and(|g| g.kind != dmc_codegen::GemmKind::Tiled)
        })
        .collect();
    zoo_kernels_row(
        &zoo,
        &cg,
        ("(every GEMM)", "Skinny kernels"),
        arch,
        dev,
        tol,
    )
}

/// `kernels` of the op zoo rendered with `cg`: compiled for `arch` without spills or warnings (and
/// at least one), on a GPU each against the CPU backend within `tol`.
fn zoo_kernels_row(
    kernels: &[dmc_compiler::plan::Kernel],
    cg: &CodegenOptions,
    (example, check): (&str, &str),
    arch: &str,
    dev: Option<&cuda::Device>,
    tol: f64,
) -> Result<Row, CliError> {
    let reports = selftest::compile_kernels(kernels, Mode::Train, arch, cg)?;
    let (spills, warns) = spills_and_warnings(&reports);
    let mut ok = !reports.is_empty() && spills == 0 && warns == 0;
    let mut result = format!(
        "{} compiled for {arch}: {spills} B spills, {warns} warnings",
        reports.len()
    );
    if let Some(d) = dev {
        let mut tally = Tally::default();
        for k in kernels {
            let Some(c) = selftest::check_kernel_with(d, k, Mode::Train, (11, None), tol, cg)?
            else {
                continue;
            };
            tally.add(&c, example, !c.ok);
        }
        let Tally { worst, bad } = tally;
        ok &= bad == 0;
        result.push_str(&format!("; vs CPU: max rel err {worst:.2e}, {bad} failed"));
    }
    Ok(Row {
        example: example.into(),
        check: check.into(),
        result,
        ok,
    })
}

/// One kernel of every op variant (the examples do not use them all).
fn zoo_row(arch: &str, dev: Option<&cuda::Device>, tol: f64) -> Result<Row, CliError> {
    let zoo = dmc_codegen::zoo::zoo();
    let cg = CodegenOptions::default();
    zoo_kernels_row(&zoo, &cg, ("(every op)", "Train kernels"), arch, dev, tol)
}

/// The NaN halt and poison mode on the device.
fn halt_row(plan: &Plan, dev: Option<&cuda::Device>) -> Result<Row, CliError> {
    let (result, ok) = match dev {
        None => ("dry run: not launched".to_string(), true),
        Some(d) => match selftest::halt_and_poison_check(d.clone(), plan.clone(), 3)? {
            None => (
                "a NaN loss stops the step before any update; poison mode changes nothing"
                    .to_string(),
                true,
            ),
            Some(e) => (e, false),
        },
    };
    Ok(Row {
        example: HALTED.into(),
        check: "NaN halt, --poison".into(),
        result,
        ok,
    })
}

/// `--steps` training steps of `plan` on the device, against the CPU backend's first loss.
fn train_row(
    name: &str,
    plan: &Plan,
    a: &SelftestArgs,
    dev: Option<&cuda::Device>,
) -> Result<Row, CliError> {
    let cap = a
        .plan
        .step
        .vram_cap
        .map(human)
        .unwrap_or_else(|| "none".into());
    let check = format!("train {} steps, cap {cap}", a.steps);
    // The performance model's step on this device (its GPU in the model's table, else the H200),
    // with NVRTC's registers for the architecture compiled for.
    let g = dev.and_then(|d| gpu_of_device(&d.name)).unwrap_or(&GPUS[0]);
    let arch = dev.map_or(a.arch.as_str(), |d| d.arch.as_str());
    let cg = CodegenOptions::default();
    let (res, _) = resources_for(plan, Some(arch), g, &cg);
    let model_s = predict(plan, &cg, &res, g)?.predicted_s;
    let Some(d) = dev else {
        return Ok(Row {
            example: name.to_string(),
            check,
            result: format!(
                "planned arena {} (dry run: not launched), model {:.2} ms/step on {}",
                human(plan.arena_bytes),
                model_s * 1e3,
                g.name
            ),
            ok: true,
        });
    };
    let r = selftest::train_check(d.clone(), plan.clone(), a.steps, 1, true)?;
    let cpu = r
        .cpu_first_loss
        .map(|c| ((r.first_loss - c).abs() / c.abs().max(1e-30)) as f64)
        .unwrap_or(f64::NAN);
    let ok = r.last_loss.is_finite() && cpu <= 1e-4 && r.measured_arena >= r.planned_arena;
    Ok(Row {
        example: name.to_string(),
        check,
        result: format!(
            "arena planned {} measured {} ({:+.2}%), {:.2} ms/step (model {:.2} on {}, {:.2}x), loss {:.4} -> {:.4}, step-1 loss vs CPU rel err {cpu:.1e}",
            human(r.planned_arena),
            human(r.measured_arena),
            (r.measured_arena as f64 / r.planned_arena.max(1) as f64 - 1.0) * 100.0,
            r.ms_per_step,
            model_s * 1e3,
            g.name,
            model_s * 1e3 / r.ms_per_step.max(1e-9),
            r.first_loss,
            r.last_loss
        ),
        ok,
    })
}

fn print_table(rows: &[Row], dry_run: bool, t0: Instant) {
    let w0 = rows
        .iter()
        .map(|r| r.example.len())
        .max()
        .unwrap_or(0)
        .max(7);
    let w1 = rows.iter().map(|r| r.check.len()).max().unwrap_or(0).max(5);
    println!(
        "\ndmc gpu-selftest{} ({:.1} s)",
        if dry_run { " --dry-run" } else { "" },
        t0.elapsed().as_secs_f64()
    );
    println!("{:<w0$}  {:<w1$}  {:<4}  result", "example", "check", "");
    for r in rows {
        let verdict = if r.ok { "ok" } else { "FAIL" };
        println!(
            "{:<w0$}  {:<w1$}  {verdict:<4}  {}",
            r.example, r.check, r.result
        );
    }
}
