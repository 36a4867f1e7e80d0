//! `dmc run`, `dmc eval`, `dmc predict`: compile a program, bind data and weights, drive the backend.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use dmc_compiler::op::DType;
use dmc_compiler::plan::{LearningRate, Mode, Plan};
use dmc_compiler::CompileOptions;
use dmc_grammar::model::{LossKind, Model};
use dmc_runtime::io::{self, Dataset, Task, TensorRole, TensorSpec};
use dmc_runtime::{open_backend, Backend, BackendKind, InputData};
use indicatif::{ProgressBar, ProgressStyle};

use super::checkpoint::{self, Saved};
use crate::report::CliError;
use crate::size::{human, parse_size};

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
    /// Batch size (overrides the program's `train { batch }`).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Device to run on.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// Memory cap for the planned arena, e.g. `900MB`, `1GiB`, `1.5G` or bytes.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub vram_cap: Option<u64>,
    /// Keep whole per-layer weight gradients (no optimizer update fused into the backward), for
    /// comparison with the default fused, chunked update.
    #[arg(long)]
    pub no_fuse: bool,
    /// Recompute forward values in the backward to fit `--vram-cap` (auto: only when needed).
    #[arg(long, value_enum, default_value_t = super::compile::RematArg::Auto)]
    pub remat: super::compile::RematArg,
    /// Weights to start from (.safetensors; names as `conv3.weight`).
    #[arg(long, value_name = "FILE")]
    pub init: Option<PathBuf>,
    /// Data: a .safetensors file, a directory of <name>.npy, or `x=a.npy,y=b.npy`; tensors named after
    /// the program's inputs and targets, first dimension = samples.
    #[arg(long, value_name = "FILE")]
    pub data: Option<String>,
    /// Seed for initialisation, synthetic data, shuffling and dropout.
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
    /// Number of training steps (default: one epoch, or the program's `epochs`).
    #[arg(long, conflicts_with = "epochs")]
    pub steps: Option<usize>,
    /// Number of epochs over the data.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Learning rate (overrides the program's optimizer): a positive number such as 0.01.
    #[arg(long, value_parser = parse_lr)]
    pub lr: Option<LearningRate>,
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
    /// Samples in the synthetic data set used without --data.
    #[arg(long, default_value_t = SYNTHETIC_SAMPLES)]
    pub synthetic_samples: usize,
    /// Write one line per training step to FILE: `step loss ms` (step from 1, the step's loss as
    /// the shortest round-trip decimal, the step's wall time in milliseconds). For benchmarks and
    /// parity checks (bench/).
    #[arg(long, value_name = "FILE")]
    pub loss_log: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub common: CommonArgs,
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
}

const DEFAULT_SEED: u64 = 0;

/// Samples in the synthetic data set `dmc run` trains on without `--data` (and `dmc data` writes).
pub(super) const SYNTHETIC_SAMPLES: usize = 1024;

/// `--lr`: through the one validated learning-rate type.
fn parse_lr(s: &str) -> Result<LearningRate, String> {
    s.parse::<LearningRate>()
        .map_err(|e| format!("{e}; pass a positive number such as 0.01 (written `--lr=1e-3`)"))
}

/// Loads and checks a program.
pub fn load_model(file: &Path) -> Result<Model, CliError> {
    super::load_model(file)
}

fn seed_of(common: &CommonArgs, model: &Model) -> u64 {
    seed_or_default(common.seed, model)
}

/// The seed of a command: `--seed`, else the program's `train { seed }`, else 0.
pub(super) fn seed_or_default(explicit: Option<u64>, model: &Model) -> u64 {
    explicit.or(model.train.seed).unwrap_or(DEFAULT_SEED)
}

/// How [`Dataset::synthetic`] makes its data for `task`, for the messages that announce it.
pub(super) fn describe_synthetic(task: Task) -> String {
    let targets = match task {
        Task::Classification { classes } => {
            format!("labels from a random linear teacher over {classes} classes")
        }
        Task::Regression => "targets from a random linear teacher".to_string(),
    };
    format!("inputs ~ U[0,1), {targets}")
}

/// Resolves `--device`: `auto` takes CUDA when a driver and a GPU are present, else the CPU (saying
/// why); `cuda` without a GPU is an error.
fn resolve_device(d: Device, quiet: bool) -> Result<BackendKind, CliError> {
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

fn compile(
    model: &Model,
    common: &CommonArgs,
    mode: Mode,
    lr: Option<LearningRate>,
) -> Result<Plan, CliError> {
    let opts = CompileOptions {
        mode,
        batch: common.batch,
        lr,
        cap: common.vram_cap,
        fuse: !common.no_fuse,
        remat: common.remat.into(),
        verify: common.verify || cfg!(debug_assertions),
        ..CompileOptions::default()
    };
    Ok(dmc_compiler::compile(model, &opts)?)
}

pub(super) fn task_of(model: &Model) -> Task {
    match model.loss.kind {
        LossKind::CrossEntropy => Task::Classification {
            classes: model.shape(model.loss.pred).last().copied().unwrap_or(1),
        },
        LossKind::Mse => Task::Regression,
    }
}

fn classes_of(model: &Model) -> Option<usize> {
    match task_of(model) {
        Task::Classification { classes } => Some(classes),
        Task::Regression => None,
    }
}

/// Loads `--data`, or makes the seeded synthetic data set (announced).
fn load_data(
    spec_src: &Plan,
    model: &Model,
    data: Option<&str>,
    samples: usize,
    seed: u64,
    quiet: bool,
    with_targets: bool,
) -> Result<Dataset, CliError> {
    let mut specs = TensorSpec::from_plan(spec_src);
    if !with_targets {
        specs.retain(|s| s.role == TensorRole::Input);
    }
    let ds = match data {
        Some(d) => {
            let ds = Dataset::load(Path::new(d), &specs)?;
            if !ds.ignored().is_empty() && !quiet {
                eprintln!(
                    "note: ignoring tensors not used by the program: {}",
                    ds.ignored().join(", ")
                );
            }
            ds
        }
        None => {
            let task = task_of(model);
            if !quiet {
                eprintln!(
                    "no --data given: using a seeded synthetic data set ({samples} samples, {}, seed {seed}; `dmc data` writes it to a file)",
                    describe_synthetic(task)
                );
            }
            Dataset::synthetic(&specs, samples, seed, task)?
        }
    };
    if with_targets {
        if let Some(classes) = classes_of(model) {
            for t in specs
                .iter()
                .filter(|s| s.role == TensorRole::Target && s.dtype == DType::I32)
            {
                ds.check_classes(&t.name, classes)?;
            }
        }
    }
    Ok(ds)
}

/// Feeds one batch of `ds` (the samples `idx`) into the backend's input (and target) buffers.
struct Feeder {
    f32_buf: Vec<Vec<f32>>,
    i32_buf: Vec<Vec<i32>>,
    specs: Vec<(String, DType, usize)>,
}

impl Feeder {
    fn new(plan: &Plan, with_targets: bool) -> Feeder {
        let mut specs = Vec::new();
        let bindings = plan
            .inputs
            .iter()
            .chain(if with_targets { &plan.targets[..] } else { &[] });
        for b in bindings {
            specs.push((b.name.clone(), b.dtype, b.shape.iter().product()));
        }
        let f32_buf = specs
            .iter()
            .map(|(_, d, n)| {
                if *d == DType::F32 {
                    vec![0.0; *n]
                } else {
                    vec![]
                }
            })
            .collect();
        let i32_buf = specs
            .iter()
            .map(|(_, d, n)| {
                if *d == DType::I32 {
                    vec![0; *n]
                } else {
                    vec![]
                }
            })
            .collect();
        Feeder {
            f32_buf,
            i32_buf,
            specs,
        }
    }

    fn feed(&mut self, be: &mut dyn Backend, ds: &Dataset, idx: &[usize]) -> Result<(), CliError> {
        for (i, (name, dtype, _)) in self.specs.iter().enumerate() {
            match dtype {
                DType::I32 => {
                    ds.fill_i32(name, idx, &mut self.i32_buf[i])?;
                    be.set_input(name, InputData::I32(&self.i32_buf[i]))?;
                }
                _ => {
                    ds.fill_f32(name, idx, &mut self.f32_buf[i])?;
                    be.set_input(name, InputData::F32(&self.f32_buf[i]))?;
                }
            }
        }
        Ok(())
    }
}

fn param_list(be: &dyn Backend) -> Vec<(String, Vec<usize>)> {
    let p = &be.plan().params;
    p.iter()
        .map(|p| (p.name.clone(), p.shape.clone()))
        .collect()
}

/// Initialise parameters: seeded He/Glorot, or from `--init`.
fn init_params(be: &mut dyn Backend, init: Option<&Path>, seed: u64) -> Result<(), CliError> {
    match init {
        None => be.init_params(seed)?,
        Some(p) => {
            be.init_params(seed)?;
            let expected = param_list(be);
            for (name, data) in io::load_weights(p, &expected)? {
                be.set_param(&name, &data)?;
            }
        }
    }
    Ok(())
}

/// Metrics over a data set: mean loss and (for classification) accuracy, computed per sample from the
/// network's outputs so that padded samples of the last batch are not counted.
pub struct Metrics {
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub samples: usize,
}

fn evaluate(
    be: &mut dyn Backend,
    model: &Model,
    ds: &Dataset,
    batch: usize,
) -> Result<Metrics, CliError> {
    let plan = be.plan().clone();
    let mut feeder = Feeder::new(&plan, true);
    let epoch = ds.in_order_padded(batch)?;
    let target = &plan.targets[0].name;
    let per = plan.output.shape[1..].iter().product::<usize>().max(1);
    let (mut loss_sum, mut correct, mut n) = (0f64, 0usize, 0usize);
    for b in 0..epoch.num_batches() {
        let idx = epoch.batch(b);
        feeder.feed(be, ds, idx)?;
        be.run(1, 0)?;
        let out = be.output()?;
        for (j, &sample) in idx.iter().enumerate().take(epoch.valid(b)) {
            let row = &out[j * per..(j + 1) * per];
            match model.loss.kind {
                LossKind::Mse => {
                    let t = ds.tensor_f32(target).unwrap_or(&[]);
                    let tr = &t[sample * per..(sample + 1) * per];
                    let se: f64 = row
                        .iter()
                        .zip(tr)
                        .map(|(a, b)| ((a - b) as f64).powi(2))
                        .sum();
                    loss_sum += se / per as f64;
                }
                LossKind::CrossEntropy => {
                    let label = ds.tensor_i32(target).unwrap_or(&[])[sample] as usize;
                    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
                    let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
                    loss_sum += lse - row[label] as f64;
                    let arg = row
                        .iter()
                        .enumerate()
                        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
                            if v > bv {
                                (i, v)
                            } else {
                                (bi, bv)
                            }
                        })
                        .0;
                    correct += usize::from(arg == label);
                }
            }
            n += 1;
        }
    }
    let accuracy =
        (model.loss.kind == LossKind::CrossEntropy).then(|| correct as f64 / n.max(1) as f64);
    Ok(Metrics {
        loss: loss_sum / n.max(1) as f64,
        accuracy,
        samples: n,
    })
}

fn fmt_metrics(m: &Metrics) -> String {
    match m.accuracy {
        Some(a) => format!(
            "loss {:.6}, accuracy {:.2}% ({} samples)",
            m.loss,
            a * 100.0,
            m.samples
        ),
        None => format!("loss {:.6} ({} samples)", m.loss, m.samples),
    }
}

/// How the training loop ended (errors aside).
enum LoopEnd {
    /// Every requested step ran.
    Finished,
    /// A signal asked to stop.
    Interrupted,
    /// The loss of this step was NaN or infinite (the step halted before its update).
    NonFinite { at: usize },
}

/// What the loop has done so far; read after it ended, whatever ended it.
#[derive(Default)]
struct Progress {
    /// Completed steps: their loss was finite and their update ran.
    steps: usize,
    last_loss: Option<f32>,
    step_time: Duration,
    /// The first write error of `--loss-log` (training goes on; reported after saving).
    loss_log_error: Option<String>,
}

/// Stops with [`CliError::Interrupted`] when a signal arrived before training started: nothing was
/// trained, so nothing is saved.
fn stop_before_training(save: Option<&Path>) -> Result<(), CliError> {
    if crate::signals::stop_requested() {
        return Err(CliError::Interrupted(match save {
            Some(p) => format!(
                "before training started: nothing was trained and {} was not written",
                p.display()
            ),
            None => "before training started".into(),
        }));
    }
    Ok(())
}

/// `dmc run`.
pub fn run(args: &RunArgs) -> Result<(), CliError> {
    // A signal from here on stops after the current step (and saves, with --save).
    crate::signals::graceful();
    let c = &args.common;
    let save_path = args.save.as_deref();
    let kind = resolve_device(c.device, c.quiet)?;
    let model = load_model(&c.file)?;
    let seed = seed_of(c, &model);
    if let Some(p) = save_path {
        io::check_writable(p)?;
    }
    let plan = compile(&model, c, Mode::Train, args.lr)?;
    stop_before_training(save_path)?;
    let batch = plan.batch;

    let data = load_data(
        &plan,
        &model,
        c.data.as_deref(),
        args.synthetic_samples,
        seed,
        c.quiet,
        true,
    )?;
    let (train, val) = match (&args.val, args.val_split) {
        (Some(v), _) => {
            let val = load_data(&plan, &model, Some(v), 0, seed, c.quiet, true)?;
            (data, Some(val))
        }
        (None, Some(f)) => {
            let (t, v) = data.split(f, seed)?;
            (t, Some(v))
        }
        (None, None) => (data, None),
    };
    if train.len() < batch {
        return Err(CliError::Usage(format!(
            "the training data has {} samples, fewer than one batch of {batch}; use a smaller --batch or more data",
            train.len()
        )));
    }
    let per_epoch = train.len() / batch;
    let (total_steps, epochs) = match (args.steps, args.epochs.or(model.train.epochs)) {
        (Some(s), _) => (s, s.div_ceil(per_epoch)),
        (None, Some(e)) => (
            e.checked_mul(per_epoch).ok_or_else(|| {
                CliError::Usage(format!(
                    "{e} epochs of {per_epoch} steps is more steps than can be counted; pass fewer --epochs or a --steps count"
                ))
            })?,
            e,
        ),
        (None, None) => (per_epoch, 1),
    };

    let before_arena = dmc_runtime::alloc::current();
    let mut be = open_backend(kind, plan.clone())?;
    let arena_measured = match be.device_arena_bytes() {
        Some(b) => b as usize, // device memory (cuMemGetInfo)
        None => dmc_runtime::alloc::current().saturating_sub(before_arena),
    };
    be.set_poison(c.poison);
    be.set_halt_on_nonfinite_loss(true);
    init_params(&mut be, c.init.as_deref(), seed)?;
    let mut val_be = match &val {
        Some(_) => Some(open_backend(kind, compile(&model, c, Mode::Eval, None)?)?),
        None => None,
    };
    let mut loss_log = match &args.loss_log {
        Some(p) => Some(std::io::BufWriter::new(std::fs::File::create(p).map_err(
            |e| CliError::Usage(format!("--loss-log {}: {e}", p.display())),
        )?)),
        None => None,
    };
    stop_before_training(save_path)?;

    if !c.quiet {
        eprintln!(
            "training {} on {} samples: {total_steps} steps of batch {batch} ({per_epoch} steps per epoch), arena {}",
            c.file.display(),
            train.len(),
            human(plan.arena_bytes)
        );
    }
    let pb = if c.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total_steps as u64)
    };
    pb.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps  {msg}  [{elapsed_precise} < {eta}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );

    dmc_runtime::alloc::reset_peak();
    let base = dmc_runtime::alloc::current();
    let mut progress = Progress::default();
    let ended = (|| -> Result<LoopEnd, CliError> {
        let mut feeder = Feeder::new(&plan, true);
        for epoch in 0..epochs {
            let order = train.epoch(batch, seed, epoch as u64)?;
            for idx in order.batches() {
                if progress.steps >= total_steps {
                    return Ok(LoopEnd::Finished);
                }
                if crate::signals::stop_requested() {
                    return Ok(LoopEnd::Interrupted);
                }
                feeder.feed(&mut be, &train, idx)?;
                let t0 = Instant::now();
                let step = progress.steps + 1;
                let loss = be.run(step as u64, seed)?;
                let dt = t0.elapsed();
                progress.step_time += dt;
                if let (Some(w), None) = (loss_log.as_mut(), &progress.loss_log_error) {
                    use std::io::Write;
                    let line = format!("{step} {loss} {:.3}\n", dt.as_secs_f64() * 1e3);
                    if let Err(e) = w.write_all(line.as_bytes()) {
                        pb.println(format!("warning: --loss-log: {e}; training goes on"));
                        progress.loss_log_error = Some(e.to_string());
                    }
                }
                if !loss.is_finite() {
                    // Halted before its update: not a completed step.
                    return Ok(LoopEnd::NonFinite { at: step });
                }
                progress.steps = step;
                progress.last_loss = Some(loss);
                let sps =
                    (progress.steps * batch) as f64 / progress.step_time.as_secs_f64().max(1e-9);
                pb.set_message(format!("loss {loss:.6}  {sps:.1} samples/s"));
                pb.inc(1);
            }
            if let (Some(vb), Some(v)) = (val_be.as_mut(), val.as_ref()) {
                for (name, _, data) in be.params()? {
                    vb.set_param(&name, &data)?;
                }
                let m = evaluate(vb, &model, v, batch)?;
                let line = format!("epoch {}: validation {}", epoch + 1, fmt_metrics(&m));
                if pb.is_hidden() {
                    eprintln!("{line}");
                } else {
                    pb.println(line);
                }
            }
        }
        Ok(LoopEnd::Finished)
    })();
    pb.finish_and_clear();
    if let Some(mut w) = loss_log.take() {
        use std::io::Write;
        if let Err(e) = w.flush() {
            progress.loss_log_error.get_or_insert(e.to_string());
        }
    }

    // Save, whatever ended the loop (the rules are in `checkpoint`), except after a non-finite
    // loss: the weights now in the arena are the ones that produced it.
    let saved = match &ended {
        Ok(LoopEnd::NonFinite { .. }) => Ok(match save_path {
            Some(p) => Saved::Skipped(format!(
                "the weights that gave this loss were NOT saved, so {} {}",
                p.display(),
                if p.exists() {
                    "is untouched: resume from it with --init and a lower --lr"
                } else {
                    "was not written"
                }
            )),
            None => Saved::NotAsked,
        }),
        _ => checkpoint::save_after_training(&be, save_path, progress.steps, args.steps == Some(0)),
    };
    let ended = match ended {
        Ok(end) => end,
        Err(e) => {
            match &saved {
                Ok(s) => {
                    if let Some(d) = s.describe() {
                        eprintln!("note: after {} completed steps {d}", progress.steps);
                    }
                }
                Err(se) => eprintln!("note: saving the weights failed too: {se}"),
            }
            return Err(e);
        }
    };
    if let LoopEnd::NonFinite { at } = ended {
        let last = match progress.last_loss {
            Some(l) => format!("last finite loss {l:.6}"),
            None => "no finite loss before it".to_string(),
        };
        let mut msg = format!(
            "training stopped: the loss became NaN or infinite at step {at} ({last}); \
             lower the learning rate (--lr) or check the data for extreme values"
        );
        if let Some(d) = saved?.describe() {
            msg.push_str(&format!("; {d}"));
        }
        return Err(CliError::Training(msg));
    }
    let saved = saved?;

    // The arena was allocated once, before the steps; everything else the steps allocated is on top.
    let extra = dmc_runtime::alloc::peak().saturating_sub(base);
    let measured = arena_measured as u64 + extra as u64;
    let per_step = progress.step_time.as_secs_f64() / progress.steps.max(1) as f64;
    println!(
        "{} steps, final loss {}, {} ms/step; memory: planned arena {} ({} B), measured peak {} B (arena {} B + {} B other allocations during steps){}",
        progress.steps,
        match progress.last_loss {
            Some(l) => format!("{l:.6}"),
            None => "none".into(),
        },
        // three significant digits at least: 0.734, 5.82, 447.9
        match per_step * 1e3 {
            ms if ms < 1.0 => format!("{ms:.3}"),
            ms if ms < 10.0 => format!("{ms:.2}"),
            ms => format!("{ms:.1}"),
        },
        human(plan.arena_bytes),
        plan.arena_bytes,
        measured,
        arena_measured,
        extra,
        match &saved {
            Saved::Written(p) => format!(", weights saved to {}", p.display()),
            Saved::Skipped(why) => format!("; {why}"),
            Saved::NotAsked => String::new(),
        }
    );
    if !c.quiet {
        let r = dmc_compiler::report::memory_report(&plan);
        let p = &r.peak.by_category;
        eprintln!(
            "memory at the peak (step {} `{}`): parameters {} + optimizer state {} + inputs {} + activations {} + gradients {} + workspace {} = {} (arena {}, {:.2}% above the lower bound); a conventional framework step would hold about {} (`dmc plan` explains)",
            r.peak.step,
            r.peak.label,
            human(p.parameters),
            human(p.optimizer_state),
            human(p.inputs),
            human(p.activations),
            human(p.gradients),
            human(p.workspace),
            human(r.lower_bound_bytes),
            human(r.arena_bytes),
            r.fragmentation * 100.0,
            human(r.conventional.total),
        );
    }
    if let Some(e) = progress.loss_log_error {
        let p = args.loss_log.as_deref().unwrap_or(Path::new("?"));
        return Err(CliError::Usage(format!(
            "--loss-log {}: writing failed ({e}), so the log is incomplete{}; free disk space or choose another path",
            p.display(),
            saved.describe().map(|d| format!(" ({d})")).unwrap_or_default()
        )));
    }
    if let LoopEnd::Interrupted = ended {
        return Err(CliError::Interrupted(format!(
            "after {} steps{}",
            progress.steps,
            saved
                .describe()
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        )));
    }
    Ok(())
}

/// `dmc eval`.
pub fn eval(args: &EvalArgs) -> Result<(), CliError> {
    let c = &args.common;
    let kind = resolve_device(c.device, c.quiet)?;
    let model = load_model(&c.file)?;
    if c.init.is_none() && !c.quiet {
        eprintln!("warning: no --init given: evaluating freshly initialised weights");
    }
    let seed = seed_of(c, &model);
    let plan = compile(&model, c, Mode::Eval, None)?;
    let batch = plan.batch;
    let ds = load_data(
        &plan,
        &model,
        c.data.as_deref(),
        args.synthetic_samples,
        seed,
        c.quiet,
        true,
    )?;
    let mut be = open_backend(kind, plan)?;
    init_params(&mut be, c.init.as_deref(), seed)?;
    let m = evaluate(&mut be, &model, &ds, batch)?;
    println!("{}", fmt_metrics(&m));
    Ok(())
}

/// `dmc predict`.
pub fn predict(args: &PredictArgs) -> Result<(), CliError> {
    let c = &args.common;
    let kind = resolve_device(c.device, c.quiet)?;
    let model = load_model(&c.file)?;
    io::check_writable(&args.output)?;
    if c.init.is_none() && !c.quiet {
        eprintln!("warning: no --init given: predicting with freshly initialised weights");
    }
    let seed = seed_of(c, &model);
    let plan = compile(&model, c, Mode::Predict, None)?;
    let batch = plan.batch;
    let ds = load_data(
        &plan,
        &model,
        c.data.as_deref(),
        args.synthetic_samples,
        seed,
        c.quiet,
        false,
    )?;
    let mut be = open_backend(kind, plan.clone())?;
    init_params(&mut be, c.init.as_deref(), seed)?;
    let mut feeder = Feeder::new(&plan, false);
    let per: usize = plan.output.shape[1..].iter().product::<usize>().max(1);
    let mut out = Vec::with_capacity(ds.len() * per);
    let epoch = ds.in_order_padded(batch)?;
    for b in 0..epoch.num_batches() {
        feeder.feed(&mut be, &ds, epoch.batch(b))?;
        be.run(1, seed)?;
        out.extend_from_slice(&be.output()?[..epoch.valid(b) * per]);
    }
    let mut shape = vec![ds.len()];
    shape.extend_from_slice(&plan.output.shape[1..]);
    io::write_tensor(&args.output, &plan.output.name, &shape, &out)?;
    println!(
        "wrote {} predictions of shape {:?} to {}",
        ds.len(),
        &shape[1..],
        args.output.display()
    );
    Ok(())
}
