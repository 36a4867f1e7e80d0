//! The flags that shape a plan, declared once and flattened into every command that compiles one
//! (`compile`, `plan`, `run`, `eval`, `predict`, `emu-check`, `gpu-selftest`), and the one function
//! that turns them into [`CompileOptions`].

use dmc_compiler::plan::{LearningRate, Mode};
use dmc_compiler::CompileOptions;

use crate::report::CliError;
use crate::size::parse_size;

/// Whether `compile`, `plan`, `emu-check` and `gpu-selftest` verify the IR after every pass and
/// check the emitted plan (`run`, `eval` and `predict` do with `--verify`, and always in checked
/// builds; `dmc data` and `plan --sweep` never do).
pub const VERIFY: bool = true;

/// `--batch`, `--vram-cap`, `--no-fuse`, `--remat`, `--lr`: what every plan-compiling command takes
/// (`eval` and `predict` take only [`StepArgs`]: the others shape a training step).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub step: StepArgs,
    #[command(flatten)]
    pub train: TrainStepArgs,
}

/// `--batch`, `--vram-cap` and `--no-stream`: the plan flags of `eval` and `predict`, whose steps have no backward
/// (so nothing to recompute, no update to fuse, no learning rate).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StepArgs {
    /// Batch size (overrides the program's `train { batch }`).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Memory cap for the planned arena, e.g. `900MB`, `1GiB`, `1.5G` or bytes.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub vram_cap: Option<u64>,
    /// Keep every parameter and optimizer state tensor in the arena: refuse a `--vram-cap` they
    /// do not fit, instead of streaming some of them through the arena from a host store.
    #[arg(long)]
    pub no_stream: bool,
    /// Keep every activation in the arena: under a `--vram-cap`, recompute forward values rather
    /// than offload them to the host store between the forward and the backward.
    #[arg(long)]
    pub no_offload: bool,
}

/// `--no-fuse`, `--remat`, `--clip-norm-method`, `--lr`: what shapes a training step beyond [`StepArgs`] (`dmc run`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TrainStepArgs {
    /// Keep whole per-layer weight gradients and unfused epilogues (no optimizer update fused
    /// into the backward), for comparison with the default fused step.
    #[arg(long)]
    pub no_fuse: bool,
    /// Recompute forward values in the backward to fit `--vram-cap` (auto: only when needed).
    #[arg(long, value_enum, default_value_t = RematArg::Auto)]
    pub remat: RematArg,
    /// How `clip_norm` gets the global gradient norm before any update (auto: held gradients,
    /// or the norm pass when they do not fit `--vram-cap`).
    #[arg(long, value_enum, default_value_t = ClipNormArg::Auto)]
    pub clip_norm_method: ClipNormArg,
    /// Learning rate of the training step's optimizer update (overrides the program's): a positive
    /// number such as 0.01.
    #[arg(long, value_parser = parse_lr)]
    pub lr: Option<LearningRate>,
    /// Data parallel over RANKS processes (ZeRO-1: each keeps 1/RANKS of the optimizer state and
    /// trains on its part of every batch): `dmc plan`/`compile` plan one rank's step; `dmc run`
    /// runs as one rank of the launcher's group (`mpirun -np N dmc run net.dm --data-parallel`;
    /// the number may be left out there).
    #[arg(long, value_name = "RANKS", num_args = 0..=1, default_missing_value = "0")]
    pub data_parallel: Option<usize>,
    /// With --data-parallel, shard the parameters too (ZeRO-3): each rank keeps 1/RANKS of every
    /// updated parameter, and gathers a parameter whole into a transient buffer for each use.
    #[arg(long, requires = "data_parallel")]
    pub shard_parameters: bool,
}

impl PlanArgs {
    /// The plan flags of `step` with the training flags `train` (the defaults for eval/predict).
    pub fn from_parts(step: &StepArgs, train: &TrainStepArgs) -> PlanArgs {
        PlanArgs {
            step: step.clone(),
            train: train.clone(),
        }
    }

    /// The compile options of the `mode` step. `verify` checks the IR after every pass and the
    /// emitted plan (each command says whether it wants that). `--lr` names the training step's
    /// optimizer update, so it is refused for an eval or predict step, which has none.
    pub fn options(&self, mode: Mode, verify: bool) -> Result<CompileOptions, CliError> {
        if let (Some(lr), Mode::Eval | Mode::Predict) = (self.train.lr, mode) {
            return Err(CliError::Usage(format!(
                "--lr {lr}: the learning rate belongs to the training step's optimizer update, and the {} step has none; drop --lr",
                mode_name(mode)
            )));
        }
        let ranks = match (self.train.data_parallel, mode) {
            (None, _) | (Some(_), Mode::Eval | Mode::Predict) => 1,
            (Some(0), Mode::Train) => {
                return Err(CliError::Usage(
                    "--data-parallel needs the number of ranks here (e.g. `--data-parallel 2`); `dmc run` under mpirun takes the launcher's".into(),
                ))
            }
            (Some(n), Mode::Train) => n,
        };
        // Under a cap the fitter ranks its plans by the CPU time model at this machine's rates
        // (measured once and cached); without one nothing is ranked.
        let rates = match self.step.vram_cap {
            Some(_) => cpu_rates()?,
            None => dmc_plan::cpu::CpuRates::nominal(),
        };
        Ok(CompileOptions {
            mode,
            batch: self.step.batch,
            lr: self.train.lr,
            cap: self.step.vram_cap,
            rates,
            fuse: !self.train.no_fuse,
            remat: self.train.remat.into(),
            clip_method: self.train.clip_norm_method.into(),
            stream: !self.step.no_stream,
            offload: !self.step.no_offload,
            verify,
            ranks,
            shard_params: self.train.shard_parameters,
            ..CompileOptions::default()
        })
    }

    /// These flags for a plan a command compiles beside its training step (the validation plan of
    /// `dmc run`, the eval kernels of `gpu-selftest`): everything but `--lr`, which only the
    /// training step has.
    pub fn beside_training(&self) -> PlanArgs {
        PlanArgs {
            train: TrainStepArgs {
                lr: None,
                data_parallel: None,
                shard_parameters: false,
                ..self.train.clone()
            },
            ..self.clone()
        }
    }
}

/// The step's name as `--mode` spells it.
fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Train => "train",
        Mode::Eval => "eval",
        Mode::Predict => "predict",
    }
}

/// `--mode`, for the commands that compile any of the three steps (`compile`, `emu-check`).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ModeArgs {
    /// Which step to compile.
    #[arg(long, value_enum, default_value_t = ModeArg::Train)]
    pub mode: ModeArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Forward, loss, backward, optimizer update.
    Train,
    /// Forward and loss.
    Eval,
    /// Forward to the output.
    Predict,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Train => Mode::Train,
            ModeArg::Eval => Mode::Eval,
            ModeArg::Predict => Mode::Predict,
        }
    }
}

/// `--remat`: whether to recompute forward values to fit `--vram-cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RematArg {
    /// Never recompute; refuse a cap that only recomputation could meet.
    Off,
    /// Recompute only when the plan does not fit the cap otherwise, as little as possible.
    #[default]
    Auto,
}

/// `--clip-norm-method`: how `clip_norm` gets the global norm before any update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ClipNormArg {
    /// Held gradients, or the norm pass when the held gradients do not fit `--vram-cap`.
    #[default]
    Auto,
    /// Every gradient held until the norm is summed (no extra pass; the gradients' memory).
    Held,
    /// A first forward/backward that only sums the norm, then the step (no gradient held).
    NormPass,
}

impl From<ClipNormArg> for Option<dmc_plan::plan::ClipNormMethod> {
    fn from(c: ClipNormArg) -> Self {
        match c {
            ClipNormArg::Auto => None,
            ClipNormArg::Held => Some(dmc_plan::plan::ClipNormMethod::HeldGradients),
            ClipNormArg::NormPass => Some(dmc_plan::plan::ClipNormMethod::NormPass),
        }
    }
}

impl From<RematArg> for dmc_compiler::RematMode {
    fn from(r: RematArg) -> Self {
        match r {
            RematArg::Off => dmc_compiler::RematMode::Off,
            RematArg::Auto => dmc_compiler::RematMode::Auto,
        }
    }
}

/// `--lr`: through the one validated learning-rate type.
fn parse_lr(s: &str) -> Result<LearningRate, String> {
    s.parse::<LearningRate>()
        .map_err(|e| format!("{e}; pass a positive number such as 0.01 (written `--lr=1e-3`)"))
}

/// This machine's CPU rates for the time model (`$DMC_CPU_RATES`: `nominal` or a JSON file of
/// rates; else measured once by a micro-benchmark and cached in the dmc cache directory).
pub fn cpu_rates() -> Result<dmc_plan::cpu::CpuRates, CliError> {
    super::calibrate::rates().map_err(CliError::Usage)
}
