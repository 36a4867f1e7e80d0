//! `dmc emu-check FILE`: every kernel of a plan compiled by g++ against a host CUDA header, run on
//! the CPU in both thread orders and compared with the CPU backend, one line per kernel.

use std::path::PathBuf;
use std::time::Instant;

use dmc_compiler::plan::Mode;

use super::plan_args::{ModeArgs, PlanArgs, VERIFY};
use super::program::load_model;
use crate::report::CliError;

#[derive(Debug, clap::Args)]
pub struct EmuCheckArgs {
    /// The program (.dm file).
    pub file: PathBuf,
    #[command(flatten)]
    pub mode: ModeArgs,
    // What shapes the plan (under `--vram-cap` the kernels run at the offsets of the plan that
    // fits it).
    #[command(flatten)]
    pub plan: PlanArgs,
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
pub fn run(a: &EmuCheckArgs) -> Result<(), CliError> {
    use dmc_runtime::emu::{self, check};
    let model = load_model(&a.file)?;
    let mode = Mode::from(a.mode.mode);
    let opts = a.plan.options(mode, VERIFY)?;
    let plan = dmc_compiler::compile(&model, &opts)?;
    let threads = a.threads.unwrap_or_else(emu::default_threads).max(1);
    let t0 = Instant::now();
    let checks = check::check_plan(
        &plan,
        check::CheckRun {
            seed: a.seed,
            threads,
            grid: None,
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
