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

/// The data's host memory, in words and one unit: `117.50 MiB (117.35 MiB mapped from the data
/// file + 0.15 MiB in memory)` (the exact bytes are in `--summary-json`).
pub fn describe_data_memory(m: &DataMemory) -> String {
    data_phrase(m, Unit::for_max(m.total()))
}

fn data_phrase(m: &DataMemory, unit: Unit) -> String {
    format!(
        "{} ({} mapped from the data file + {} in memory)",
        unit.fmt(m.total()),
        unit.fmt(m.mapped),
        unit.fmt(m.in_memory)
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
    // The host peak of the steps, taken before the final save (whose copies of the weights are
    // not part of a step; `--save-every`'s saves during the loop are counted).
    let steps_peak = dmc_runtime::alloc::peak();
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
    // The breakdown first (stderr), so that the run ends with its memory line.
    if !args.common.quiet && !args.silent {
        print_peak(plan);
    }
    print_summary(args, plan, progress, &saved, measured, steps_peak)?;
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

/// What `dmc run` measured and planned, exactly: the `--summary-json` file.
#[derive(Debug, serde::Serialize)]
pub struct Summary {
    pub steps: usize,
    pub final_loss: Option<f32>,
    pub ms_per_step: f64,
    /// The last epoch's running train accuracy and the last validation's (fractions; a
    /// classifier's, else null), and with `--top-k K` the top-K ones beside them.
    pub train_accuracy: Option<f64>,
    pub val_accuracy: Option<f64>,
    pub top_k: Option<usize>,
    pub train_top_k_accuracy: Option<f64>,
    pub val_top_k_accuracy: Option<f64>,
    /// The arena the plan asks for.
    pub planned_arena_bytes: u64,
    /// The arena as allocated (device memory on a GPU, by `cuMemGetInfo`) plus everything else
    /// the steps allocated on the host.
    pub measured_peak_bytes: u64,
    pub measured_arena_bytes: u64,
    pub other_allocation_bytes: u64,
    pub cap_bytes: Option<u64>,
    /// Host memory of the data: bytes of the data files mapped in place (each once) ...
    pub data_mapped_bytes: u64,
    /// ... and bytes held in memory (converted values, labels, a split's indices).
    pub data_in_memory_bytes: u64,
}

/// The two lines on stdout: steps, final loss, time per step and what was saved; then memory,
/// planned against measured against the cap, all in one unit.
fn print_summary(
    args: &RunArgs,
    plan: &Plan,
    progress: &Progress,
    saved: &Saved,
    measured: Measured,
    steps_peak: usize,
) -> Result<(), CliError> {
    if args.silent {
        return Ok(());
    }
    // The arena was allocated once, before the steps; everything else the steps allocated is on top.
    let extra = steps_peak.saturating_sub(measured.base) as u64;
    let total = measured.arena as u64 + extra;
    let per_step =
        progress.step_time.as_secs_f64() / (progress.steps - progress.resumed_at).max(1) as f64;
    let cap = args.common.step.vram_cap;
    println!(
        "{} steps, final loss {}, {} ms/step{}{}",
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
    let unit = Unit::for_max(
        plan.arena_bytes
            .max(total)
            .max(cap.unwrap_or(0))
            .max(measured.data.total()),
    );
    println!(
        "memory: planned {}, measured {} (arena {} + {} other allocations during steps); host data {}; {}",
        unit.fmt(plan.arena_bytes),
        unit.fmt(total),
        unit.fmt(measured.arena as u64),
        unit.fmt(extra),
        data_phrase(&measured.data, unit),
        match cap {
            // The cap caps the arena (on a GPU, the device memory it took); the host's other
            // allocations are beside it.
            Some(c) if (measured.arena as u64) <= c => format!(
                "cap {}: the arena fits, {} spare",
                unit.fmt(c),
                unit.fmt(c - measured.arena as u64)
            ),
            Some(c) => format!(
                "cap {}: the arena as allocated is over it by {}",
                unit.fmt(c),
                unit.fmt(measured.arena as u64 - c)
            ),
            None => "no --vram-cap given".to_string(),
        },
    );
    if plan.streams() {
        let t = plan.transfer_totals();
        println!(
            "streaming: host store {} (the streamed parameters, optimizer state and offloaded activations, outside the arena and the cap), {} of the parameters and optimizer state resident; per step {} copied in and {} written back in {} copies",
            unit.fmt(t.host_store),
            unit.fmt(t.resident),
            unit.fmt(t.host_to_device),
            unit.fmt(t.device_to_host),
            t.copies
        );
    }
    if let Some(path) = &args.summary_json {
        let summary = Summary {
            steps: progress.steps,
            final_loss: progress.last_loss,
            ms_per_step: per_step * 1e3,
            train_accuracy: progress.train_accuracy,
            val_accuracy: progress.val_accuracy,
            top_k: args.top_k,
            train_top_k_accuracy: progress.train_top_k_accuracy,
            val_top_k_accuracy: progress.val_top_k_accuracy,
            planned_arena_bytes: plan.arena_bytes,
            measured_peak_bytes: total,
            measured_arena_bytes: measured.arena as u64,
            other_allocation_bytes: extra,
            cap_bytes: cap,
            data_mapped_bytes: measured.data.mapped,
            data_in_memory_bytes: measured.data.in_memory,
        };
        let json = serde_json::to_string_pretty(&summary)
            .map_err(|e| CliError::Message(format!("cannot serialise the summary: {e}")))?;
        dmc_runtime::io::write_file_atomic(path, format!("{json}\n").as_bytes())?;
    }
    Ok(())
}

/// One binary unit for every number of a line, chosen by the largest: KiB under 1 MiB, MiB under
/// 10 GiB, else GiB; two decimals.
#[derive(Clone, Copy)]
struct Unit(&'static str, f64);

impl Unit {
    fn for_max(max: u64) -> Unit {
        if max < 1 << 20 {
            Unit("KiB", 1024.0)
        } else if max < 10 << 30 {
            Unit("MiB", (1u64 << 20) as f64)
        } else {
            Unit("GiB", (1u64 << 30) as f64)
        }
    }
    fn fmt(self, bytes: u64) -> String {
        format!("{:.2} {}", bytes as f64 / self.1, self.0)
    }
}

/// The planned memory at the peak by category, on stderr.
fn print_peak(plan: &Plan) {
    let r = dmc_compiler::report::memory_report(plan);
    let p = &r.peak.by_category;
    eprintln!(
        "memory at the peak (step {} `{}`): parameters {} + optimizer state {}{} + inputs {} + activations {} + gradients {} + workspace {} = {} (arena {}, {:.2}% above the lower bound); the keep-everything baseline would hold about {} (`dmc plan --verbose` explains)",
        r.peak.step,
        r.peak.label,
        human(p.parameters),
        human(p.optimizer_state),
        if p.gradient_accumulators > 0 {
            format!(" + gradient buffers {}", human(p.gradient_accumulators))
        } else {
            String::new()
        },
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
