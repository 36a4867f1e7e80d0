//! The subcommands. To add one: create `src/commands/<name>.rs` with an `Args` struct
//! (clap derive) and a `run(args) -> Result<(), CliError>`, then add a variant to [`Command`].
//! A command that compiles a plan flattens [`plan_args::PlanArgs`] into its `Args` and builds its
//! `CompileOptions` with `PlanArgs::options`; one that takes a program reads it with
//! [`program::load_model`]. The modules here use each other in one direction only: this file
//! uses the commands, the commands use the shared modules (`plan_args`, `program`, `kernels`,
//! `train::*`), and nothing uses this file's items.

mod calibrate;
mod check;
mod checkpoint;
mod compile;
mod data;
mod emu_check;
mod gpu_selftest;
mod kernels;
mod perf;
mod plan;
mod plan_args;
mod program;
mod summary;
mod train;
mod weights;

use crate::report::CliError;
use clap::{Parser, Subcommand};

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
    Run(train::args::RunArgs),
    /// Evaluate saved weights on a data set: loss and (for classification) accuracy.
    Eval(train::args::EvalArgs),
    /// Write the network's outputs for the given inputs to a .safetensors or .npy file.
    Predict(train::args::PredictArgs),
    /// Generate text from a byte-level sequence model (input int[T], logits [T, 256]) and its
    /// trained weights, one byte at a time from a prompt.
    Sample(train::sample::SampleArgs),
    /// Write the seeded synthetic data set `run` uses without --data to a .safetensors (or .npy)
    /// file, tensors named after the program's inputs and targets.
    Data(data::Args),
    /// Weights from and to PyTorch and Keras: `import` converts their .safetensors files into
    /// the program's weights, `export` writes the program's weights in their layouts.
    #[command(subcommand)]
    Weights(weights::Command),
    /// Check the generated CUDA kernels without a GPU: compile them with g++ against a host CUDA
    /// header, run them on the CPU and compare with the CPU backend.
    EmuCheck(emu_check::EmuCheckArgs),
    /// Check the CUDA backend against the CPU backend on a GPU (see scripts/gpu-check.sh).
    /// `--vram-cap` caps the plans of the training checks; the kernel checks use uncapped plans.
    #[command(hide = true)]
    GpuSelftest(gpu_selftest::SelftestArgs),
}

pub fn run(cli: Cli) -> Result<(), CliError> {
    if matches!(
        cli.command,
        Command::Check(_) | Command::Summary(_) | Command::Compile(_) | Command::Plan(_)
    ) {
        // Short compiling processes: keep freed memory, small pages (see the function). An
        // option this mimalloc lacks only leaves its default.
        let _ = dmc_runtime::mi_options::tune_for_compiling();
        // They report no host memory: no counting of their millions of small allocations.
        dmc_runtime::alloc::stop_counting();
    }
    match cli.command {
        Command::Check(a) => check::run(a),
        Command::Summary(a) => summary::run(a),
        Command::Compile(a) => compile::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Run(a) => train::run::run(&a),
        Command::Eval(a) => train::eval::run(&a),
        Command::Predict(a) => train::predict::run(&a),
        Command::Sample(a) => train::sample::run(&a),
        Command::Data(a) => data::run(&a),
        Command::Weights(c) => weights::run(c),
        Command::GpuSelftest(a) => gpu_selftest::run(&a),
        Command::EmuCheck(a) => emu_check::run(&a),
    }
}
