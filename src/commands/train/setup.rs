//! What `run`, `eval` and `predict` do before their first step: resolve `--device`, compile the
//! plan from the shared plan flags, and initialise the weights (seeded, or from `--init`).

use std::path::Path;

use dmc_compiler::plan::{Mode, Plan};
use dmc_grammar::model::Model;
use dmc_runtime::io;
use dmc_runtime::{Backend, BackendKind};

use super::args::{CommonArgs, Device};
use crate::commands::plan_args::PlanArgs;
use crate::report::CliError;

/// Resolves `--device`: `auto` takes CUDA when a driver and a GPU are present, else the CPU (saying
/// why); `cuda` without a GPU is an error.
pub fn resolve_device(d: Device, quiet: bool) -> Result<BackendKind, CliError> {
    match d {
        Device::Cpu => Ok(BackendKind::Cpu),
        Device::CudaEmu => Ok(BackendKind::CudaEmu),
        Device::Cuda => match dmc_runtime::cuda::probe() {
            Ok(_) => Ok(BackendKind::Cuda),
            Err(e) => Err(CliError::Usage(format!(
                "--device cuda: {e}; run on the CPU with --device cpu (or --device auto)"
            ))),
        },
        Device::Auto => {
            let (kind, what) = match dmc_runtime::cuda::probe() {
                Ok(gpu) => (BackendKind::Cuda, format!("cuda ({gpu})")),
                Err(e) => (BackendKind::Cpu, format!("cpu ({e})")),
            };
            if !quiet {
                eprintln!("device: {what}");
            }
            Ok(kind)
        }
    }
}

/// Compiles the `mode` step of `model` under `plan` (the command's plan flags, or a variant of
/// them), verifying with `--verify` and always in a checked build ([`dmc_compiler::CHECKED_BUILD`]).
pub fn compile(
    model: &Model,
    common: &CommonArgs,
    plan: &PlanArgs,
    mode: Mode,
) -> Result<Plan, CliError> {
    let opts = plan.options(mode, common.verify || dmc_compiler::CHECKED_BUILD)?;
    Ok(dmc_compiler::compile(model, &opts)?)
}

/// Initialises the parameters: seeded He/Glorot, then (with `--init`) the saved weights of
/// `program` (named in the errors that suggest `dmc weights import`).
pub fn init_params(
    be: &mut dyn Backend,
    init: Option<&Path>,
    seed: u64,
    program: &Path,
) -> Result<(), CliError> {
    be.init_params(seed)?;
    if let Some(p) = init {
        let expected: Vec<(String, Vec<usize>)> = be
            .plan()
            .params
            .iter()
            .map(|p| (p.name.clone(), p.shape.clone()))
            .collect();
        let weights = io::load_weights(p, &expected).map_err(|e| e.for_program(program))?;
        for (name, data) in weights {
            be.set_param(&name, &data)?;
        }
    }
    Ok(())
}
