//! What `dmc run` does after its training loop, whatever ended it: save the weights by the rules
//! of `checkpoint`, then report (the summary line, the memory at the peak) or fail with a message
//! that says what was saved.

use std::path::Path;

use dmc_compiler::plan::Plan;
use dmc_runtime::io::DataMemory;
use dmc_runtime::Backend;

use super::args::RunArgs;
use super::steps::{LoopEnd, Progress};
use crate::commands::checkpoint::{SavePolicy, Saved};
use crate::report::CliError;
use crate::size::human;

/// Memory the run measured: the arena as allocated (device memory on a GPU), and the allocation
/// level just before the first step, above which the steps' own allocations are counted.
pub struct Measured {
    pub arena: usize,
    pub base: usize,
    /// The host memory of the training (and validation) data.
    pub data: DataMemory,
}

/// The data's host memory, in words: `12.0 MB (12000000 B: 11.9 MB mapped from the data file, 80.0 kB in memory)`.
pub fn describe_data_memory(m: &DataMemory) -> String {
    format!(
        "{} ({} B: {} mapped from the data file, {} in memory)",
        human(m.total()),
        m.total(),
        human(m.mapped),
        human(m.in_memory)
    )
}

/// Saves and reports after the loop ended as `ended`, having done `progress`; `loss_log_error` is
/// the first write error of `--loss-log`.
pub fn finish(
    args: &RunArgs,
    saves: &SavePolicy,
    be: &dyn Backend,
    ended: Result<LoopEnd, CliError>,
    progress: &Progress,
    loss_log_error: Option<String>,
    measured: Measured,
) -> Result<(), CliError> {
    let plan = be.plan();
    let save_path = args.save.as_deref();
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
        _ => saves.after_training(
            be,
            progress.steps,
            progress.saved_at != Some(progress.steps),
            args.steps == Some(0),
            progress.best_val_loss,
        ),
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
    print_summary(plan, progress, &saved, measured);
    if !args.common.quiet {
        print_peak(plan);
    }
    if let Some(e) = loss_log_error {
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

/// The one line on stdout: steps, final loss, time per step, planned and measured memory, saving.
fn print_summary(plan: &Plan, progress: &Progress, saved: &Saved, measured: Measured) {
    // The arena was allocated once, before the steps; everything else the steps allocated is on top.
    let extra = dmc_runtime::alloc::peak().saturating_sub(measured.base);
    let total = measured.arena as u64 + extra as u64;
    let per_step =
        progress.step_time.as_secs_f64() / (progress.steps - progress.resumed_at).max(1) as f64;
    println!(
        "{} steps, final loss {}, {} ms/step; memory: planned arena {} ({} B), measured peak {} B (arena {} B + {} B other allocations during steps), host data {}{}{}",
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
        total,
        measured.arena,
        extra,
        describe_data_memory(&measured.data),
        match saved {
            Saved::Written(p) => format!(", weights saved to {}", p.display()),
            Saved::Skipped(why) => format!("; {why}"),
            Saved::NotAsked => String::new(),
        },
        match progress.resumed_at {
            0 => String::new(),
            k => format!(
                "; resumed after step {k} ({} steps in this run)",
                progress.steps - k
            ),
        }
    );
}

/// The planned memory at the peak by category, on stderr.
fn print_peak(plan: &Plan) {
    let r = dmc_compiler::report::memory_report(plan);
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
