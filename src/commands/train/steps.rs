//! The training loop of `dmc run`: epochs of shuffled (or, `--no-shuffle`, file-order) batches through the backend, stopping at the
//! requested step count, on a signal, or at a non-finite loss, with validation after each epoch
//! and the saves of `--save-every` / `--save-best` on the way. A resumed run starts at the step
//! its state recorded: the data order of an epoch is a function of (seed, epoch), so that epoch's
//! batches are drawn again and the ones already trained on are skipped.

use std::time::{Duration, Instant};

use dmc_grammar::model::Model;
use dmc_plan::plan::{ClipNormMethod, ClipNormPlan};
use dmc_runtime::io::Dataset;
use dmc_runtime::{Backend, RunPass};
use indicatif::ProgressBar;

use super::dataset::Feeder;
use super::metrics::{batch_correct, evaluate_shared, fmt_metrics, fmt_top_k, Correct, Metrics};
use super::progress::{say, LossLog};
use crate::commands::checkpoint::SavePolicy;
use crate::report::CliError;

/// How the training loop ended (errors aside).
pub enum LoopEnd {
    /// Every requested step ran.
    Finished,
    /// A signal asked to stop.
    Interrupted,
    /// The loss of this step was NaN or infinite (the step halted before its update).
    NonFinite { at: usize },
}

/// What the loop has done so far; read after it ended, whatever ended it.
#[derive(Default)]
pub struct Progress {
    /// Completed steps: their loss was finite and their update ran (those of the run this one
    /// resumed included).
    pub steps: usize,
    /// The steps completed before this process started (a resumed run's).
    pub resumed_at: usize,
    pub last_loss: Option<f32>,
    /// Wall time of this process's steps.
    pub step_time: Duration,
    /// The lowest validation loss so far.
    pub best_val_loss: Option<f64>,
    /// The step after which this process last saved the training state and weights.
    pub saved_at: Option<usize>,
    /// The last epoch's running train accuracy and `--top-k` accuracy (fractions; a classifier's).
    pub train_accuracy: Option<f64>,
    pub train_top_k_accuracy: Option<f64>,
    /// The last validation's accuracy and `--top-k` accuracy.
    pub val_accuracy: Option<f64>,
    pub val_top_k_accuracy: Option<f64>,
}

/// How many steps, over how many epochs.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub total_steps: usize,
    pub epochs: usize,
    pub batch: usize,
    /// Micro-batches of `batch` samples per optimizer step (`accumulate: N`; 1: none).
    pub accumulate: usize,
    pub seed: u64,
    /// Reshuffle every epoch (else file order: `--no-shuffle`).
    pub shuffle: bool,
    /// `--top-k K`: top-K accuracy beside the accuracy, of the training batches and the validation.
    pub top_k: Option<usize>,
}

/// The validation of each epoch: an eval backend and its data.
pub struct Validation<'a> {
    pub backend: &'a mut dyn Backend,
    pub data: &'a Dataset,
}

/// One epoch's training metrics, from the steps as they ran: the mean of their losses and (for a
/// classifier) the fraction of their samples the forward of the step classified right, before
/// that step's update (Keras' running `accuracy`).
#[derive(Default)]
struct EpochStats {
    steps: usize,
    loss_sum: f64,
    samples: usize,
    correct: Option<Correct>,
    top_k: Option<usize>,
}

impl EpochStats {
    fn new(top_k: Option<usize>) -> EpochStats {
        EpochStats {
            top_k,
            ..EpochStats::default()
        }
    }

    fn add(&mut self, loss: f32, samples: usize, correct: Option<Correct>) {
        self.steps += 1;
        self.loss_sum += loss as f64;
        self.samples += samples;
        let sum = self.correct.unwrap_or_default();
        self.correct = correct.map(|c| Correct {
            top1: sum.top1 + c.top1,
            top_k: sum.top_k + c.top_k,
            positions: sum.positions + c.positions,
        });
    }

    /// The accuracy and (with `--top-k`) the top-K accuracy, as fractions.
    fn accuracies(&self) -> Option<(f64, Option<(usize, f64)>)> {
        self.correct.map(|c| {
            let n = c.positions.max(1) as f64;
            (
                c.top1 as f64 / n,
                self.top_k.map(|k| (k, c.top_k as f64 / n)),
            )
        })
    }

    /// `train loss 0.812345, accuracy 71.20% (768 samples)`, with `--top-k 5`
    /// `train loss 0.812345, accuracy 71.20%, top-5 93.10% (768 samples)`.
    fn text(&self) -> String {
        let loss = self.loss_sum / self.steps.max(1) as f64;
        match self.accuracies() {
            Some((a, top_k)) => format!(
                "train loss {loss:.6}, accuracy {:.2}%{} ({} samples)",
                100.0 * a,
                fmt_top_k(top_k),
                self.samples
            ),
            None => format!("train loss {loss:.6} ({} samples)", self.samples),
        }
    }

    /// Records this epoch's accuracies in `progress` (for `--summary-json`).
    fn record(&self, progress: &mut Progress) {
        if let Some((a, top_k)) = self.accuracies() {
            progress.train_accuracy = Some(a);
            progress.train_top_k_accuracy = top_k.map(|(_, a)| a);
        }
    }
}

/// Records a validation's accuracies in `progress` (for `--summary-json`).
fn record_validation(m: &Metrics, progress: &mut Progress) {
    progress.val_accuracy = m.accuracy;
    progress.val_top_k_accuracy = m.top_k.map(|(_, a)| a);
}

/// Prints the line of epoch `epoch` (from 0) of `epochs`: `partial` of `per_epoch` steps when the
/// run stops inside it, the validation metrics after it when there are some.
fn epoch_line(
    pb: &ProgressBar,
    epoch: usize,
    epochs: usize,
    stats: &EpochStats,
    partial: Option<usize>,
    validation: Option<String>,
) {
    if stats.steps == 0 && validation.is_none() {
        return;
    }
    say(
        pb,
        format!(
            "epoch {}/{epochs}{}: {}{}",
            epoch + 1,
            match partial {
                Some(per_epoch) => format!(" ({} of its {per_epoch} steps)", stats.steps),
                None => String::new(),
            },
            stats.text(),
            validation
                .map(|v| format!("; validation {v}"))
                .unwrap_or_default()
        ),
    );
}

/// Where the loop reports and saves: the bar, the loss log, the saves of `--save-every` and
/// `--save-best`.
pub struct Outputs<'a> {
    pub pb: &'a ProgressBar,
    pub loss_log: &'a mut LossLog,
    pub saves: &'a SavePolicy,
}

/// Trains `be` on `train` by `schedule`, recording into `progress` (which holds what was done
/// however the loop ends) and `out`.
pub fn train(
    be: &mut dyn Backend,
    model: &Model,
    train: &Dataset,
    schedule: Schedule,
    mut val: Option<Validation<'_>>,
    out: Outputs<'_>,
    progress: &mut Progress,
) -> Result<LoopEnd, CliError> {
    let Outputs {
        pb,
        loss_log,
        saves,
    } = out;
    let Schedule {
        total_steps,
        epochs,
        batch,
        accumulate,
        seed,
        shuffle,
        top_k,
    } = schedule;
    let accumulate = accumulate.max(1);
    let per_epoch = (train.len() / (batch * accumulate)).max(1);
    // Each step's learning rate, from the plan's schedule over this run's steps.
    let (lr_schedule, base_lr) = (be.plan().schedule, be.plan().optimizer.lr());
    let first_epoch = progress.steps / per_epoch;
    let mut feeder = Feeder::new(be.plan(), true);
    let two_pass = matches!(
        be.plan().clip_norm,
        Some(ClipNormPlan {
            method: ClipNormMethod::NormPass,
            ..
        })
    );
    for epoch in first_epoch..epochs {
        let order = if shuffle {
            train.epoch(batch, seed, epoch as u64)?
        } else {
            train.epoch_in_order(batch)?
        };
        // A resumed run goes on in the middle of the epoch it stopped in.
        let skip = if epoch == first_epoch {
            progress.steps % per_epoch
        } else {
            0
        };
        let mut stats = EpochStats::new(top_k);
        // One optimizer step per `accumulate` consecutive batches (a remainder is dropped).
        let micro: Vec<&[usize]> = order.batches().collect();
        for group in micro.chunks_exact(accumulate).skip(skip) {
            // (data parallel: every rank stops at the same step when any was signalled)
            let stop = if progress.steps >= total_steps {
                Some(LoopEnd::Finished)
            } else if super::data_parallel::any_rank(be, crate::signals::stop_requested())? {
                Some(LoopEnd::Interrupted)
            } else {
                None
            };
            if let Some(end) = stop {
                stats.record(progress);
                epoch_line(pb, epoch, epochs, &stats, Some(per_epoch), None);
                return Ok(end);
            }
            let step = progress.steps + 1;
            be.set_learning_rate(lr_schedule.lr_at(base_lr, step as u64, total_steps as u64));
            // The micro-batches of the step: each accumulates its gradient, the last one updates;
            // the step's loss is their mean.
            let (mut loss_sum, mut dt, mut halted) = (0.0f64, Duration::ZERO, None);
            let (mut samples, mut correct) = (0usize, Some(Correct::default()));
            for (j, idx) in group.iter().enumerate() {
                // data parallel: this rank's part of the global batch
                let idx = super::data_parallel::part(idx, be.collective());
                feeder.feed(be, train, idx)?;
                let t0 = Instant::now();
                // each micro-batch its own dropout masks (the first one's those of an
                // unaccumulated step)
                let micro_seed = seed.wrapping_add((j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let l = if two_pass {
                    // clip_norm's norm pass, then the update pass on the same batch (fed again: the
                    // plan reuses an input's memory after its last reader; same step counter and
                    // seed: the same dropout masks); both give the same loss
                    be.set_run_pass(RunPass::Norm);
                    let l = be.run(step as u64, micro_seed)?;
                    if l.is_finite() {
                        feeder.feed(be, train, idx)?;
                        be.set_run_pass(RunPass::Update);
                        be.run(step as u64, micro_seed)?;
                    }
                    l
                } else {
                    be.set_run_pass(if j + 1 == group.len() {
                        RunPass::Whole
                    } else {
                        RunPass::Accumulate
                    });
                    be.run(step as u64, micro_seed)?
                };
                dt += t0.elapsed();
                if !l.is_finite() {
                    halted = Some(l);
                    break;
                }
                loss_sum += l as f64;
                samples += idx.len() * be.collective().map_or(1, |c| c.world());
                let mine = super::data_parallel::sum_correct(
                    be,
                    batch_correct(be, model, train, idx, top_k)?,
                )?;
                correct = match (correct, mine) {
                    (Some(a), Some(b)) => Some(Correct {
                        top1: a.top1 + b.top1,
                        top_k: a.top_k + b.top_k,
                        positions: a.positions + b.positions,
                    }),
                    _ => None,
                };
            }
            let loss = halted.unwrap_or((loss_sum / group.len() as f64) as f32);
            progress.step_time += dt;
            loss_log.record(step, loss, dt, pb);
            if !loss.is_finite() {
                // Halted before its update: not a completed step.
                return Ok(LoopEnd::NonFinite { at: step });
            }
            progress.steps = step;
            progress.last_loss = Some(loss);
            stats.add(loss, samples, correct);
            let sps = ((progress.steps - progress.resumed_at) * batch * accumulate) as f64
                / progress.step_time.as_secs_f64().max(1e-9);
            pb.set_message(format!("loss {loss:.6}  {sps:.1} samples/s"));
            pb.inc(1);
            // The last step of an epoch is saved after the epoch's validation (below), so that
            // its state records that validation's best loss.
            #[allow(clippy::manual_is_multiple_of)]
            // `is_multiple_of` needs Rust 1.87; MSRV is 1.80
            let ends_epoch = step % per_epoch == 0;
            if !ends_epoch && saves.periodic(be, step, progress.best_val_loss)? {
                progress.saved_at = Some(step);
            }
        }
        let validation = match val.as_mut() {
            Some(v) => {
                for (name, _, data) in be.params()? {
                    v.backend.set_param(&name, &data)?;
                }
                // (data parallel: the ranks share the validation batches)
                let m = evaluate_shared(v.backend, model, v.data, batch, top_k, be.collective())?;
                record_validation(&m, progress);
                let (best, saved) = saves.after_validation(be, m.loss, progress.best_val_loss)?;
                progress.best_val_loss = best;
                Some(format!(
                    "{}{}",
                    fmt_metrics(&m),
                    if saved { " (best so far: saved)" } else { "" }
                ))
            }
            None => None,
        };
        // A resumed epoch's metrics cover only the steps this process ran.
        let partial = (skip > 0).then_some(per_epoch);
        stats.record(progress);
        epoch_line(pb, epoch, epochs, &stats, partial, validation);
        if saves.periodic(be, progress.steps, progress.best_val_loss)? {
            progress.saved_at = Some(progress.steps);
        }
    }
    Ok(LoopEnd::Finished)
}
