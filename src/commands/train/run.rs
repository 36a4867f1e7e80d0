//! `dmc run`: compile the training step, load the data, set up the backend (and a validation
//! backend), then train (`steps`) and save and report (`outcome`).

use std::collections::HashMap;
use std::path::Path;

use dmc_compiler::plan::Mode;
use dmc_compiler::plan::Precision;
use dmc_grammar::model::Model;
use dmc_runtime::io::{self, Dataset};
use dmc_runtime::{Backend, BackendKind};

use super::args::RunArgs;
use super::data_parallel;
use super::dataset::{seed_or_default, DataRequest};
use super::outcome::{self, Measured};
use super::progress::{self, LossLog};
use super::resume::{resume, save_policy};
use super::setup::{compile, init_params, resolve_device};
use super::steps::{self, Outputs, Progress, Schedule, Validation};
use crate::commands::program::load_model;
use crate::report::CliError;
use crate::size::human;

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

/// `--cuda-graph` is an option of the CUDA backend, `--profile` of the CUDA and CPU backends:
/// refused on another.
fn check_cuda_options(args: &RunArgs, kind: BackendKind) -> Result<(), CliError> {
    let on = match kind {
        BackendKind::Cuda => return Ok(()),
        BackendKind::Cpu => "the CPU",
        BackendKind::CudaEmu => "the CUDA emulator",
    };
    if args.profile && kind == BackendKind::CudaEmu {
        return Err(CliError::Usage(
            "--profile times each kernel on the CPU or a GPU (--device cpu or cuda), not on the CUDA emulator (its times say nothing about either); --loss-log FILE records each step's wall time on any device".into(),
        ));
    }
    if args.cuda_graph {
        return Err(CliError::Usage(format!(
            "--cuda-graph replays the step as a CUDA graph and needs --device cuda (this run is on {on}): drop it"
        )));
    }
    Ok(())
}

/// `--steps`, `--epochs` or the program's `epochs` (else one epoch) over `samples` training samples.
fn schedule(
    args: &RunArgs,
    model: &Model,
    samples: usize,
    batch: usize,
    seed: u64,
) -> Result<Schedule, CliError> {
    if samples < batch {
        return Err(CliError::Usage(format!(
            "the training data has {samples} samples, fewer than one batch of {batch}; use a smaller --batch or more data"
        )));
    }
    let accumulate = model.train.accumulate.max(1);
    if samples < batch * accumulate {
        return Err(CliError::Usage(format!(
            "the training data has {samples} samples, fewer than one step of {accumulate} micro-batches of {batch}; use a smaller --batch, a smaller `accumulate` or more data"
        )));
    }
    let per_epoch = samples / (batch * accumulate);
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
    Ok(Schedule {
        total_steps,
        epochs,
        batch,
        accumulate,
        seed,
        shuffle: shuffles(args, model),
        top_k: args.top_k,
    })
}

/// Whether every epoch reshuffles: `--no-shuffle`/`--shuffle`, else the program's
/// `train { shuffle }`, else yes.
pub fn shuffles(args: &RunArgs, model: &Model) -> bool {
    if args.no_shuffle {
        return false;
    }
    args.shuffle || model.train.shuffle.unwrap_or(true)
}

/// The host memory of the training and validation data (a file both map counted once: a
/// `--val-split` shares the file's mapping between its two parts).
fn data_memory(train: &Dataset, val: Option<&Dataset>) -> io::DataMemory {
    let mut m = train.memory();
    if let Some(v) = val {
        let vm = v.memory();
        m.in_memory += vm.in_memory;
        if !train.shares_files_with(v) {
            m.mapped += vm.mapped;
        }
    }
    m
}

/// The training data and the validation data (`--val`, `--val-split`, or none).
fn load_sets(
    args: &RunArgs,
    data: DataRequest<'_>,
) -> Result<(Dataset, Option<Dataset>), CliError> {
    let all = data.load()?;
    Ok(match (&args.val, args.val_split) {
        (Some(v), _) => {
            let val = DataRequest {
                data: Some(v),
                synthetic_samples: 0,
                ..data
            }
            .load()?;
            (all, Some(val))
        }
        (None, Some(f)) => {
            let (t, v) = all.split(f, data.seed)?;
            (t, Some(v))
        }
        (None, None) => (all, None),
    })
}

/// `dmc run`.
pub fn run(args: &RunArgs) -> Result<(), CliError> {
    // A signal from here on stops after the current step (and saves, with --save).
    crate::signals::graceful();
    // Data parallel: one rank of the launcher's group; rank 0 alone reports and writes files.
    let group = data_parallel::open(args.train.data_parallel)?;
    let r = run_in(args, group.clone());
    if let (Err(e), Some(g)) = (&r, group.filter(|g| g.world() > 1)) {
        match e {
            // every rank ends so at the same step (a stop the ranks agreed on, the ranks' summed
            // loss): rank 0 has saved and reports it, then all meet (the barrier) and end, rank
            // 0's exit code the job's and the others' 0 (a failing rank makes `mpirun` end the
            // rest at once)
            // (as are the program's and the compiler's errors: the same inputs on every rank)
            CliError::Interrupted(_)
            | CliError::Training(_)
            | CliError::Program(_)
            | CliError::Compile(_) => {
                let code = match g.rank() {
                    0 => {
                        crate::report::print_error(e);
                        e.exit_code()
                    }
                    _ => 0,
                };
                let _ = dmc_runtime::comm::barrier(g.as_ref());
                drop(g); // (MPI finalised)
                std::process::exit(code);
            }
            // the other ranks may be waiting on this one in a collective: end them all
            _ => {
                eprintln!("error: rank {} of {}: {e}", g.rank(), g.world());
                g.abort(e.exit_code());
            }
        }
    }
    r
}

fn run_in(
    args: &RunArgs,
    group: Option<std::sync::Arc<dyn dmc_runtime::comm::Collective>>,
) -> Result<(), CliError> {
    let ranked;
    let args = match &group {
        Some(g) => {
            ranked = data_parallel::rank_args(args, g.as_ref());
            &ranked
        }
        None => args,
    };
    let c = &args.common;
    let save_path = args.save.as_deref();
    // (data parallel with several ranks: `auto` means the CPU, `--device cuda` one GPU per rank)
    let ranks = group.as_ref().map_or(1, |g| g.world());
    let kind = match c.device {
        super::args::Device::Auto if ranks > 1 => BackendKind::Cpu,
        d => resolve_device(d, c.quiet)?,
    };
    check_cuda_options(args, kind)?;
    let model = load_model(&c.file)?;
    let seed = seed_or_default(c.seed, &model);
    if let Some(p) = save_path {
        io::check_writable(p)?;
    }
    let plan = compile(&model, c, &args.plan(), Mode::Train)?;
    super::metrics::check_top_k(args.top_k, &model, &plan)?;
    stop_before_training(save_path)?;

    let request = DataRequest::new(c, &plan, &model, args.synthetic_samples, seed);
    let (train, val) = load_sets(args, request)?;
    // (a data-parallel plan is one rank's: the global batch is the ranks' together)
    let schedule = schedule(args, &model, train.len(), plan.batch * plan.ranks, seed)?;
    plan.schedule
        .check(schedule.total_steps as u64)
        .map_err(|e| {
            CliError::Usage(format!(
                "{e} (the {} steps of this run); raise --steps or --epochs, or shorten the warmup in {}",
                schedule.total_steps,
                c.file.display()
            ))
        })?;
    let saves = save_policy(args, &plan, train.len(), seed, schedule.shuffle)?;
    let data_memory = data_memory(&train, val.as_ref());

    if kind == BackendKind::Cpu && c.codegen.precision(&plan) == Precision::Tf32 && !c.quiet {
        eprintln!(
            "note: precision tf32 applies to the GEMMs on a GPU (TF32 tensor cores, sm_80+); the CPU backend computes in fp32"
        );
    }
    let before_arena = dmc_runtime::alloc::current();
    let mut be = dmc_runtime::open_backend(kind, plan.clone(), &c.codegen.options(&plan))?;
    // (one rank alone runs as one process would, on any backend; on the GPU its loss still goes
    // through NCCL, the path of several ranks)
    if let Some(g) = group
        .as_ref()
        .filter(|g| g.world() > 1 || kind == BackendKind::Cuda)
    {
        be = Box::new(data_parallel::RankBackend::new(be, g.clone())?);
    }
    // The arena alone, as measured (device memory on a GPU, the counted allocation on the host):
    // the backend's own state (its copy of the plan, compiled kernels) is not what the cap caps.
    let arena = match be.measured_arena_bytes() {
        Some(b) => b as usize,
        None => dmc_runtime::alloc::current().saturating_sub(before_arena),
    };
    be.set_poison(c.poison);
    be.set_halt_on_nonfinite_loss(true);
    if args.profile {
        be.set_profile(true)?;
    }
    if args.cuda_graph {
        be.set_cuda_graph(true)?;
    }
    init_params(&mut be, c.init.as_deref(), seed, &c.file)?;
    let mut done = Progress::default();
    if args.resume {
        resume(&mut be, &saves, &mut done, c.quiet)?;
        if done.steps >= schedule.total_steps && !c.quiet {
            eprintln!(
                "note: the training state is at step {}, and {} steps were asked: nothing left to train (raise --steps or --epochs to go on)",
                done.steps, schedule.total_steps
            );
        }
    }
    let mut val_be = match &val {
        Some(_) => {
            let eval_plan = compile(&model, c, &args.plan().beside_training(), Mode::Eval)?;
            let cg = c.codegen.options(&eval_plan);
            Some(dmc_runtime::open_backend(kind, eval_plan, &cg)?)
        }
        None => None,
    };
    let mut loss_log =
        LossLog::create(args.loss_log.as_deref(), args.resume.then_some(done.steps))?;
    stop_before_training(save_path)?;

    if !c.quiet {
        eprintln!(
            "training {} on {} samples: {} steps of batch {} ({} steps per epoch{}{}), arena {}, host data {}",
            c.file.display(),
            train.len(),
            schedule.total_steps,
            if schedule.accumulate > 1 {
                format!(
                    "{} ({} micro-batches of {} accumulated)",
                    schedule.batch * schedule.accumulate,
                    schedule.accumulate,
                    schedule.batch
                )
            } else {
                schedule.batch.to_string()
            },
            train.len() / (schedule.batch * schedule.accumulate),
            if schedule.shuffle { "" } else { ", in file order" },
            if plan.schedule.is_constant() {
                String::new()
            } else {
                format!(
                    ", learning rate {} (schedule: {})",
                    plan.optimizer.lr(),
                    plan.schedule.describe()
                )
            },
            human(plan.arena_bytes),
            outcome::describe_data_memory(&data_memory),
        );
    }
    let pb = progress::bar(schedule.total_steps, c.quiet);
    pb.set_position(done.steps.min(schedule.total_steps) as u64);

    dmc_runtime::alloc::reset_peak();
    let base = dmc_runtime::alloc::current();
    let validation = match (val_be.as_mut(), val.as_ref()) {
        (Some(backend), Some(data)) => Some(Validation { backend, data }),
        _ => None,
    };
    let ended = steps::train(
        &mut be,
        &model,
        &train,
        schedule,
        validation,
        Outputs {
            pb: &pb,
            loss_log: &mut loss_log,
            saves: &saves,
        },
        &mut done,
    );
    pb.finish_and_clear();
    // data parallel: what this rank sent in its steps (before any checkpoint's gather)
    let sent = be.collective().map(|g| match be.device_collective() {
        Some(d) => (None, format!("{d}, bootstrapped over {}", g.describe())),
        None => (Some(g.sent_bytes()), g.describe()),
    });
    let loss_log_error = loss_log.finish();
    let finished = outcome::finish(
        args,
        &saves,
        &be,
        ended,
        &done,
        loss_log_error,
        Measured {
            arena,
            base,
            data: data_memory,
        },
    );
    if let (Some((sent, carrier)), false) = (sent, args.silent) {
        data_parallel::report(&plan, carrier, sent, done.steps - done.resumed_at);
    }
    if let Some(p) = be.profile() {
        // the measured column, and the performance model's prediction for this device
        let model = match kind {
            BackendKind::Cpu => cpu_predictions(&plan),
            _ => crate::commands::perf::device_predictions(&plan, &c.codegen.options(&plan)),
        };
        let f = |id: usize| -> Option<f64> {
            let k = p.kernels.iter().find(|k| k.kernel == id)?;
            model.as_ref()?.0.get(&k.name).copied()
        };
        let predicted: Option<&dyn Fn(usize) -> Option<f64>> = model.as_ref().map(|_| &f as _);
        println!("\n{}", dmc_runtime::profile::profile_table(&p, predicted));
        if let Some((_, line)) = &model {
            println!("{line}");
        }
    }
    finished
}

/// The CPU time model's time of one launch of each kernel of `plan` (by name) at this machine's
/// rates, and a line saying so: the predicted column of `dmc run --profile` on the CPU.
fn cpu_predictions(plan: &dmc_plan::plan::Plan) -> Option<(HashMap<String, f64>, String)> {
    let rates = match crate::commands::calibrate::rates() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("warning: {e}; no prediction column");
            return None;
        }
    };
    let t = dmc_plan::cpu::plan_time(plan, &rates);
    let by_name = plan
        .kernels
        .iter()
        .zip(&t.kernel_s)
        .map(|(k, s)| (k.name.clone(), *s))
        .collect();
    let line = format!(
        "predicted: the CPU time model at {}; whole step {:.1} ms predicted",
        rates.source,
        t.step_s * 1e3
    );
    Some((by_name, line))
}
