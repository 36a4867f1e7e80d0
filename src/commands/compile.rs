//! `dmc compile FILE -o DIR`: writes the execution plan (`plan.json`) of the training step.

use std::fs;
use std::path::{Path, PathBuf};

use dmc_codegen::CodegenOptions;
use dmc_compiler::plan::Mode;
use dmc_compiler::CompileOptions;

use crate::report::CliError;
use crate::size::{human, parse_size};

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

impl From<RematArg> for dmc_compiler::RematMode {
    fn from(r: RematArg) -> Self {
        match r {
            RematArg::Off => dmc_compiler::RematMode::Off,
            RematArg::Auto => dmc_compiler::RematMode::Auto,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The .dm program.
    pub file: PathBuf,
    /// Output directory (created if missing).
    #[arg(long, short, value_name = "DIR", default_value = "dmc-out")]
    pub out: PathBuf,
    /// Batch size (overrides the program's).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Memory cap for the planned arena, e.g. `900MB`, `1GiB`, `1.5G` or bytes.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub vram_cap: Option<u64>,
    /// Keep whole per-layer weight gradients (no optimizer update fused into the backward), for
    /// comparison with the default fused, chunked update.
    #[arg(long)]
    pub no_fuse: bool,
    /// Recompute forward values in the backward to fit `--vram-cap` (auto: only when needed).
    #[arg(long, value_enum, default_value_t = RematArg::Auto)]
    pub remat: RematArg,
    /// Which step to compile.
    #[arg(long, value_enum, default_value_t = ModeArg::Train)]
    pub mode: ModeArg,
    /// Also print the IR after the pass pipeline.
    #[arg(long)]
    pub dump_ir: bool,
    /// Render every GEMM kernel unsplit (no split-K): the baseline of a split-K comparison.
    #[arg(long)]
    pub no_split_k: bool,
    /// Compile the generated CUDA kernels with NVRTC for this GPU architecture (e.g. sm_80, sm_90)
    /// and print each kernel's registers, shared memory and spills. Needs NVRTC, not a GPU.
    #[arg(long, value_name = "ARCH")]
    pub arch: Option<String>,
}

/// Writes `bytes` to `path` atomically (the runtime's one atomic write: temp file, fsync, rename;
/// never over a non-regular file; no temp file left behind).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    Ok(dmc_runtime::io::write_file_atomic(path, bytes)?)
}

pub fn run(args: Args) -> Result<(), CliError> {
    let model = super::load_model(&args.file)?;
    let mode = Mode::from(args.mode);
    let opts = CompileOptions {
        mode,
        batch: args.batch,
        cap: args.vram_cap,
        fuse: !args.no_fuse,
        remat: args.remat.into(),
        verify: true,
        ..CompileOptions::default()
    };
    if args.dump_ir {
        print!(
            "{}",
            dmc_compiler::graph_dump(&dmc_compiler::compile_graph(&model, &opts)?)
        );
    }
    let plan = dmc_compiler::compile(&model, &opts)?;
    fs::create_dir_all(&args.out).map_err(|e| {
        CliError::Message(format!(
            "cannot create the output directory `{}`: {e}",
            args.out.display()
        ))
    })?;
    let json = serde_json::to_vec_pretty(&plan)
        .map_err(|e| CliError::Message(format!("cannot serialise the plan: {e}")))?;
    let path = args.out.join("plan.json");
    write_atomic(&path, &json)?;
    let codegen = CodegenOptions {
        split_k: !args.no_split_k,
    };
    super::cuda::write_kernels(&plan, &args.out, args.arch.as_deref(), &codegen)?;
    println!(
        "{}: {} kernels, {} steps, {} buffers, arena {} ({} bytes) -> {}",
        args.file.display(),
        plan.kernels.len(),
        plan.steps.len(),
        plan.buffers.len(),
        human(plan.arena_bytes),
        plan.arena_bytes,
        path.display()
    );
    Ok(())
}
