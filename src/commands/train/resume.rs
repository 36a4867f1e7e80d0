//! `dmc run`'s saving flags as a [`SavePolicy`], and `--resume`: the training state beside
//! `--save` loaded into the backend (parameters, optimizer state) and into the loop's
//! [`Progress`] (step counter, best validation loss), after checking that it was saved by the same
//! run (program, optimizer, seed, batch, training samples, shuffling).

use dmc_compiler::plan::Plan;
use dmc_runtime::io::{self, TrainState};
use dmc_runtime::Backend;

use super::args::RunArgs;
use super::steps::Progress;
use crate::commands::checkpoint::SavePolicy;
use crate::report::CliError;

/// The saves `args` ask for, for a run of `plan` with `seed` on `samples` training samples.
pub fn save_policy(
    args: &RunArgs,
    plan: &Plan,
    samples: usize,
    seed: u64,
    shuffle: bool,
) -> Result<SavePolicy, CliError> {
    if args.save_best && args.val.is_none() && args.val_split.is_none() {
        return Err(CliError::Usage(
            "--save-best keeps the weights of the lowest validation loss, so it needs validation data: add --val FILE or --val-split FRACTION".into(),
        ));
    }
    let keep_state = args.save_every.is_some() || args.resume;
    let every = match args.save_every {
        Some(n) => Some(usize::try_from(n).map_err(|_| {
            CliError::Usage(format!("--save-every {n}: more steps than can be counted"))
        })?),
        None => None,
    };
    Ok(SavePolicy {
        weights: args.save.clone(),
        state: match (&args.save, keep_state) {
            (Some(w), true) => Some(io::state_path(w)),
            _ => None,
        },
        every,
        best: args.save_best,
        identity: TrainState {
            steps: 0,
            seed,
            // the global batch: a data-parallel run resumes at any number of ranks
            batch: plan.batch * plan.ranks,
            samples,
            // the schedule is part of the optimizer a run continues (a constant rate adds
            // nothing, so states saved before schedules existed still resume)
            // (and so is gradient accumulation: N micro-batches per step change every step;
            // `accumulate: 1` adds nothing, so states saved before it existed still resume)
            optimizer: {
                let mut o = format!("{:?}", plan.optimizer);
                if !plan.schedule.is_constant() {
                    o.push_str(&format!(", schedule {:?}", plan.schedule));
                }
                if plan.accumulate > 1 {
                    o.push_str(&format!(", accumulate {}", plan.accumulate));
                }
                o
            },
            best_val_loss: None,
            shuffle,
        },
    })
}

/// `--resume`: loads the training state of `saves` into `be` and `progress`; says so unless
/// `quiet`.
pub fn resume(
    be: &mut dyn Backend,
    saves: &SavePolicy,
    progress: &mut Progress,
    quiet: bool,
) -> Result<(), CliError> {
    let Some(path) = saves.state.as_deref() else {
        return Err(CliError::Usage("--resume needs --save FILE".into()));
    };
    if !path.exists() {
        return Err(CliError::Usage(format!(
            "--resume: there is no training state {} to resume from (a run with --save {} --save-every N writes it); run without --resume to start from step 0",
            path.display(),
            saves
                .weights
                .as_deref()
                .map(|w| w.display().to_string())
                .unwrap_or_default()
        )));
    }
    let names = |v: &[dmc_compiler::plan::ParamBinding]| -> Vec<(String, Vec<usize>)> {
        v.iter()
            .map(|p| (p.name.clone(), p.shape.clone()))
            .collect()
    };
    let (params, opt) = (names(&be.plan().params), names(&be.plan().opt_state));
    let ck = io::load_checkpoint(path, &params, &opt)?;
    let (was, now) = (&ck.state, &saves.identity);
    let mut differences = Vec::new();
    if was.optimizer != now.optimizer {
        differences.push(format!(
            "optimizer {} (now {})",
            was.optimizer, now.optimizer
        ));
    }
    for (what, a, b) in [
        ("seed", was.seed, now.seed),
        ("batch", was.batch as u64, now.batch as u64),
        ("training samples", was.samples as u64, now.samples as u64),
    ] {
        if a != b {
            differences.push(format!("{what} {a} (now {b})"));
        }
    }
    if was.shuffle != now.shuffle {
        let order = |s: bool| {
            if s {
                "shuffled"
            } else {
                "file-order (--no-shuffle)"
            }
        };
        differences.push(format!(
            "{} data (now {})",
            order(was.shuffle),
            order(now.shuffle)
        ));
    }
    if !differences.is_empty() {
        return Err(CliError::Usage(format!(
            "--resume: {} was saved by a run with {}, so this run would not continue it; pass the same --seed, --batch, --lr, --data, --val-split and --no-shuffle as that run, or start from its weights with --init instead of --resume",
            path.display(),
            differences.join(", ")
        )));
    }
    for (name, data) in &ck.params {
        be.set_param(name, data)?;
    }
    for (name, data) in &ck.opt_state {
        be.set_opt_state(name, data)?;
    }
    let steps = usize::try_from(was.steps)
        .map_err(|_| CliError::Usage(format!("--resume: {}: too many steps", path.display())))?;
    progress.steps = steps;
    progress.resumed_at = steps;
    progress.best_val_loss = was.best_val_loss;
    if !quiet {
        eprintln!(
            "resuming from {} after step {steps}{}",
            path.display(),
            was.best_val_loss
                .map(|b| format!(" (best validation loss so far {b:.6})"))
                .unwrap_or_default()
        );
    }
    Ok(())
}
