//! `dmc compile FILE -o DIR`: writes the execution plan (`plan.json`) of the training step.

use std::fs;
use std::path::PathBuf;

use dmc_compiler::plan::Mode;
use dmc_runtime::io;

use super::kernels::{write_kernels, CodegenArgs};
use super::perf::{predict, resources_for, table, GpuArg};
use super::plan_args::{ModeArgs, PlanArgs, VERIFY};
use super::program::load_model;
use crate::report::CliError;
use crate::size::human;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The .dm program.
    pub file: PathBuf,
    /// Output directory (created if missing).
    #[arg(long, short, value_name = "DIR", default_value = "dmc-out")]
    pub out: PathBuf,
    #[command(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    pub mode: ModeArgs,
    #[command(flatten)]
    pub codegen: CodegenArgs,
    /// Also print the IR after the pass pipeline.
    #[arg(long)]
    pub dump_ir: bool,
    /// Compile the generated CUDA kernels with NVRTC for this GPU architecture (e.g. sm_80, sm_90)
    /// and print each kernel's registers, shared memory and spills. Needs NVRTC, not a GPU.
    #[arg(long, value_name = "ARCH")]
    pub arch: Option<String>,
    /// Print the performance model's table: per kernel FLOPs, bytes, blocks, occupancy, waves,
    /// roofline floor and predicted time on `--gpu`, and the step's total (registers from NVRTC
    /// for `--arch` or the GPU's architecture where NVRTC loads; estimated otherwise). No GPU needed.
    #[arg(long)]
    pub perf: bool,
    #[command(flatten)]
    pub gpu: GpuArg,
}

pub fn run(args: Args) -> Result<(), CliError> {
    let model = load_model(&args.file)?;
    let gpu = args.gpu.gpu()?;
    let opts = args.plan.options(Mode::from(args.mode.mode), VERIFY)?;
    if args.dump_ir {
        print!(
            "{}",
            dmc_compiler::graph_dump(&dmc_compiler::compile_graph(&model, &opts)?)
        );
    }
    let mut plan = dmc_compiler::compile(&model, &opts)?;
    fs::create_dir_all(&args.out).map_err(|e| {
        CliError::Message(format!(
            "cannot create the output directory `{}`: {e}",
            args.out.display()
        ))
    })?;
    let path = args.out.join("plan.json");
    // the runtime's one atomic write: temp file, fsync, rename; never over a non-regular file.
    // Serialised straight into the file: the plan of a deep network is hundreds of MB of JSON
    // (`serde_json::to_writer_pretty`'s bytes, its largest arrays on two threads).
    io::write_file_atomic_with(&path, |w| dmc_compiler::json::write_plan(w, &mut plan))?;
    // the GEMM tiles and splits are chosen for the named GPU (the H200 by default)
    let cg = dmc_codegen::CodegenOptions {
        gpu: gpu.name,
        ..args.codegen.options(&plan)
    };
    // (a data-parallel plan's sharded updates are programs of launches and NCCL collectives)
    write_kernels(&plan, &args.out, args.arch.as_deref(), &cg)?;
    if args.perf {
        let (res, src) = resources_for(&plan, args.arch.as_deref(), gpu, &cg);
        print!("{}", table(&predict(&plan, &cg, &res, gpu)?, gpu, &src));
    }
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
    // The process ends next: freeing the plan's and the model's millions of allocations (a deep
    // network's) one by one would only cost time.
    std::mem::forget(plan);
    std::mem::forget(model);
    Ok(())
}
