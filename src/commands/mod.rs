//! The subcommands. To add one: create `src/commands/<name>.rs` with an `Args` struct
//! (clap derive) and a `run(args) -> Result<(), CliError>`, then add a variant to [`Command`].

mod check;
mod checkpoint;
mod compile;
mod cuda;
mod data;
mod plan;
mod summary;
mod train;

use crate::report::CliError;
use clap::{Parser, Subcommand};
use std::path::Path;

#[derive(Debug, Parser)]
#[command(
    name = "dmc",
    version,
    about = "A compiler for neural-network training"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Parse and check a .dm program.
    Check(check::Args),
    /// Print a table of the model's layers, shapes, parameters and bytes.
    Summary(summary::Args),
    /// Compile the training step to an execution plan (plan.json) in a directory.
    Compile(compile::Args),
    /// Explain the planned memory of the training step (peak, categories, per layer, timeline).
    Plan(plan::Args),
    /// Train: compile the step, plan its memory, run it on the data (or a synthetic set).
    Run(train::RunArgs),
    /// Evaluate saved weights on a data set: loss and (for classification) accuracy.
    Eval(train::EvalArgs),
    /// Write the network's outputs for the given inputs to a .safetensors or .npy file.
    Predict(train::PredictArgs),
    /// Write the seeded synthetic data set `run` uses without --data to a .safetensors (or .npy)
    /// file, tensors named after the program's inputs and targets.
    Data(data::Args),
    /// Check the generated CUDA kernels without a GPU: compile them with g++ against a host CUDA
    /// header, run them on the CPU and compare with the CPU backend.
    EmuCheck(cuda::EmuCheckArgs),
    /// Check the CUDA backend against the CPU backend on a GPU (see scripts/gpu-check.sh).
    #[command(hide = true)]
    GpuSelftest(cuda::SelftestArgs),
}

pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Check(a) => check::run(a),
        Command::Summary(a) => summary::run(a),
        Command::Compile(a) => compile::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Run(a) => train::run(&a),
        Command::Eval(a) => train::eval(&a),
        Command::Predict(a) => train::predict(&a),
        Command::Data(a) => data::run(&a),
        Command::GpuSelftest(a) => cuda::selftest(&a),
        Command::EmuCheck(a) => cuda::emu_check(&a),
    }
}

/// Reads and checks a `.dm` file (shared by all commands that take a program). Reading is bounded
/// (`dmc_grammar::MAX_SOURCE_BYTES`); unreadable, oversized and non-UTF-8 files are diagnostics.
pub fn load_model(path: &Path) -> Result<dmc_grammar::Model, CliError> {
    Ok(dmc_grammar::compile_file(path)?)
}
