//! The flags of `dmc run`, `dmc eval` and `dmc predict`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::commands::kernels::CodegenArgs;
use crate::commands::plan_args::{PlanArgs, StepArgs, TrainStepArgs};

/// Samples in the synthetic data set `dmc run` trains on without `--data` (and `dmc data` writes).
pub const SYNTHETIC_SAMPLES: usize = 1024;

fn parse_scale_arg(arg: &str) -> Result<(String, f32), String> {
    dmc_runtime::io::parse_scale(arg).map_err(|e| e.to_string())
}

/// Where to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// CUDA when a driver and a GPU are present, else the CPU (saying why).
    Auto,
    Cpu,
    Cuda,
    /// The generated CUDA kernels compiled by g++ and run on the CPU (slow: for checking the
    /// CUDA code path on a machine without a GPU).
    CudaEmu,
}

/// Options shared by `run`, `eval` and `predict`.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// The program (.dm file).
    pub file: PathBuf,
    #[command(flatten)]
    pub step: StepArgs,
    #[command(flatten)]
    pub codegen: CodegenArgs,
    /// Device to run on.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// Weights to start from (.safetensors; names as `conv3.weight`).
    #[arg(long, value_name = "FILE")]
    pub init: Option<PathBuf>,
    /// Data: a .safetensors file, a .npz archive, a directory of `<name>.npy`, or `x=a.npy,y=b.npy`;
    /// tensors named after the program's inputs and targets, first dimension = samples. The file
    /// is memory-mapped (read in place where its layout allows): do not modify it during the run.
    #[arg(long, value_name = "FILE")]
    pub data: Option<String>,
    /// Multiply input NAME by FACTOR as it is read, e.g. `--scale image=1/255` for uint8 pixels
    /// (integer inputs need one); repeatable, one per input.
    #[arg(long, value_name = "NAME=FACTOR", value_parser = parse_scale_arg)]
    pub scale: Vec<(String, f32)>,
    /// Seed for initialisation, synthetic data, shuffling and dropout (`eval` and `predict`: of the
    /// fresh weights without --init and the synthetic data without --data, so not with both).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Fill dead buffers with NaN after each kernel, so that a planning bug shows up as NaN.
    #[arg(long)]
    pub poison: bool,
    /// Verify the IR after every pass and check the plan (always on in debug builds).
    #[arg(long)]
    pub verify: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub train: TrainStepArgs,
    /// Number of training steps (default: one epoch, or the program's `epochs`).
    #[arg(long, conflicts_with = "epochs")]
    pub steps: Option<usize>,
    /// Number of epochs over the data.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Also report top-K accuracy beside the accuracy (a classifier's: `cross_entropy`): the
    /// fraction of samples whose label is among the K largest outputs (ties go to the lower class
    /// index, so `--top-k 1` is the accuracy); K from 1 to the number of classes.
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Validation data (same format as --data); reports loss (and accuracy) after each epoch.
    #[arg(long, value_name = "FILE", conflicts_with = "val_split")]
    pub val: Option<String>,
    /// Hold out this fraction of the data for validation.
    #[arg(long, value_name = "FRACTION")]
    pub val_split: Option<f64>,
    /// Save the trained weights here (.safetensors, atomically; also on Ctrl-C/SIGTERM and on errors
    /// after training started; never untrained or non-finite weights, nor the ones that gave a NaN loss).
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Also save every N steps: the training state (FILE.state.safetensors beside --save FILE:
    /// weights, optimizer state, step counter), then the weights; --resume continues from it.
    #[arg(long, value_name = "N", requires = "save", value_parser = clap::value_parser!(u64).range(1..))]
    pub save_every: Option<u64>,
    /// --save FILE holds the weights of the lowest validation loss (written after each epoch's
    /// validation that improves on it, not at the end); needs --val or --val-split.
    #[arg(long, requires = "save")]
    pub save_best: bool,
    /// Continue the run whose training state is beside --save (FILE.state.safetensors): weights,
    /// optimizer state, step counter and data order; the same command with --resume ends with the
    /// weights an uninterrupted run would have (bit for bit). --steps/--epochs count from step 0.
    #[arg(long, requires = "save", conflicts_with = "init")]
    pub resume: bool,
    /// Keep the data in file order: every epoch is the same batches in the same order (by default
    /// every epoch reshuffles, seeded). Overrides the program's `train { shuffle: true }`.
    #[arg(long, conflicts_with = "shuffle")]
    pub no_shuffle: bool,
    /// Reshuffle every epoch even if the program says `train { shuffle: false }`.
    #[arg(long)]
    pub shuffle: bool,
    /// Samples in the synthetic data set used without --data.
    #[arg(long, default_value_t = SYNTHETIC_SAMPLES)]
    pub synthetic_samples: usize,
    /// Write one line per training step to FILE: `step loss ms` (step from 1, the step's loss as
    /// the shortest round-trip decimal, the step's wall time in milliseconds). For benchmarks and
    /// parity checks (bench/).
    #[arg(long, value_name = "FILE")]
    pub loss_log: Option<PathBuf>,
    /// Write the run's summary as JSON to FILE: steps, final loss, ms per step, the last epoch's
    /// train and validation accuracy (and --top-k accuracy), and the planned
    /// arena, the measured peak (arena + other allocations) and the cap in exact bytes (for
    /// benchmarks: the printed lines round to one unit).
    #[arg(long, value_name = "FILE.json")]
    pub summary_json: Option<PathBuf>,
    /// Time every kernel launch and print, after training, a table per plan kernel: launches per
    /// step, µs per step, share of the step (each kernel's median over the steps after the first:
    /// a step stalled by the machine does not move it), and the
    /// performance model's prediction. On the CPU the wall clock around each step; on CUDA
    /// events, launching kernel by kernel (no CUDA graph). Not on the CUDA emulator.
    #[arg(long, conflicts_with = "cuda_graph")]
    pub profile: bool,
    /// Capture each step's launches once into CUDA graphs and replay them (one graph launch per
    /// step, two with the NaN halt's loss read between them) instead of one launch per kernel;
    /// same kernels, same order, same results. Needs --device cuda.
    #[arg(long)]
    pub cuda_graph: bool,
    /// Print nothing (a data-parallel rank other than 0: rank 0 reports for all).
    #[arg(skip)]
    pub silent: bool,
}

#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Also report top-K accuracy beside the accuracy (a classifier's: `cross_entropy`): the
    /// fraction of samples whose label is among the K largest outputs (ties go to the lower class
    /// index, so `--top-k 1` is the accuracy); K from 1 to the number of classes.
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Samples in the synthetic data set used without --data.
    #[arg(long, default_value_t = 1024)]
    pub synthetic_samples: usize,
}

#[derive(Debug, Clone, Args)]
pub struct PredictArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Where to write the outputs (.safetensors or .npy), one row per input sample.
    #[arg(long, short, value_name = "FILE")]
    pub output: PathBuf,
    /// Samples in the synthetic data set used without --data.
    #[arg(long, default_value_t = 64)]
    pub synthetic_samples: usize,
    /// Write probabilities (the softmax of each output row) instead of the raw outputs (logits).
    #[arg(long)]
    pub softmax: bool,
}

impl RunArgs {
    /// The flags that shape the training step.
    pub fn plan(&self) -> PlanArgs {
        PlanArgs::from_parts(&self.common.step, &self.train)
    }
}

impl CommonArgs {
    /// The flags that shape an eval or predict step; `--seed` refused when it would change
    /// nothing (weights from --init and data from --data).
    pub fn inference_plan(&self, command: &str) -> Result<PlanArgs, crate::report::CliError> {
        if let (Some(seed), Some(_), Some(_)) = (self.seed, &self.init, &self.data) {
            return Err(crate::report::CliError::Usage(format!(
                "--seed {seed}: `dmc {command}` seeds only the fresh weights used without --init and the synthetic data used without --data; with both given it changes nothing: drop --seed"
            )));
        }
        Ok(PlanArgs::from_parts(&self.step, &TrainStepArgs::default()))
    }
}
