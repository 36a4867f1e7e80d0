//! `dmc data PROGRAM -o FILE [--samples N] [--seed S]`: writes the seeded synthetic data set that
//! `dmc run` trains on without `--data` to a file that `--data` reads, so a program can be tried
//! end to end (`run`, `eval`, `predict`) before real data exists.

use std::path::PathBuf;

use dmc_compiler::plan::Mode;
use dmc_runtime::io::{self, Dataset, TensorSpec};

use super::plan_args::PlanArgs;
use super::program::load_model;
use super::train::args::SYNTHETIC_SAMPLES;
use super::train::dataset::{describe_synthetic, seed_or_default, task_of};
use crate::report::CliError;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The program (.dm file).
    pub file: PathBuf,
    /// Where to write: a .safetensors file (every input and target, named after them) or a .npy
    /// file (one tensor: the input or target its file name names, e.g. `image.npy`).
    #[arg(long, short, value_name = "FILE")]
    pub output: PathBuf,
    /// Number of samples (`dmc run --synthetic-samples N` uses the same set).
    #[arg(long, default_value_t = SYNTHETIC_SAMPLES)]
    pub samples: usize,
    /// Seed (default: the program's `train { seed }`, else 0, as for `dmc run`). A different seed
    /// is a different task: its labels come from a different random teacher.
    #[arg(long)]
    pub seed: Option<u64>,
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let model = load_model(&args.file)?;
    // The data tensors `dmc run` binds: the program's inputs and targets, from its plan (an eval
    // plan has the same ones as the training step and is cheaper to compile; no plan flag changes
    // the per-sample shapes, so `dmc data` takes none).
    let opts = PlanArgs::default().options(Mode::Eval, false)?;
    let plan = dmc_compiler::compile(&model, &opts)?;
    let specs = TensorSpec::from_plan(&plan);
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let ext = args
        .output
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let written: Vec<&str> = match ext.as_deref() {
        Some("safetensors") => names.clone(),
        Some("npy") => {
            let stem = args
                .output
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("");
            match names.iter().find(|n| **n == stem) {
                Some(n) => vec![*n],
                None => {
                    let files: Vec<String> = names.iter().map(|n| format!("{n}.npy")).collect();
                    return Err(CliError::Usage(format!(
                        "{}: a .npy file holds one tensor, named by its file name, and {} has no input or target `{stem}`; write {} (or every tensor to one .safetensors file)",
                        args.output.display(),
                        args.file.display(),
                        files.join(" or ")
                    )));
                }
            }
        }
        _ => {
            return Err(CliError::Usage(format!(
                "{}: unsupported file type; name the output *.safetensors (every input and target) or <name>.npy (one of them)",
                args.output.display()
            )))
        }
    };
    io::check_writable(&args.output)?;
    let seed = seed_or_default(args.seed, &model);
    let task = task_of(&model);
    // All tensors are made, even for one .npy: the inputs of a classification set depend on its
    // labels, and this must be the very data `dmc run` would use.
    let ds = Dataset::synthetic(&specs, args.samples, seed, task)?;
    ds.save(&args.output, &written)?;
    let what: Vec<String> = written
        .iter()
        .filter_map(|n| specs.iter().find(|s| s.name == *n))
        .map(|s| {
            let shape: Vec<String> = std::iter::once(args.samples)
                .chain(s.per_sample_shape.iter().copied())
                .map(|d| d.to_string())
                .collect();
            let dtype = format!("{:?}", s.dtype).to_lowercase();
            format!("`{}` [{}] {dtype}", s.name, shape.join(", "))
        })
        .collect();
    println!(
        "wrote {} to {}: the seeded synthetic data set that `dmc run {}` uses without --data ({} samples, {}, seed {seed})",
        what.join(", "),
        args.output.display(),
        args.file.display(),
        args.samples,
        describe_synthetic(task),
    );
    Ok(())
}
