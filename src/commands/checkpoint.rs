//! The one path by which `dmc run` writes trained weights and its training state, whatever ended
//! the training (the last step, a signal, an error after training started) or asked for a save
//! on the way (`--save-every N`, `--save-best`):
//!
//! * nothing is written before a training step has completed, so an interrupted compilation or a
//!   failure while loading never replaces a checkpoint with untrained weights; `--steps 0` asks for
//!   the initial weights explicitly (with a warning);
//! * weights holding NaN or Inf are refused (`dmc_runtime::io::save_weights`), so a diverged run
//!   never replaces a good file;
//! * the write itself is atomic, never replaces a non-regular file and leaves no temp file behind
//!   (`dmc_runtime::io::files`);
//! * the training state (`W.state.safetensors`: parameters, optimizer state, step counter; see
//!   `dmc_runtime::io::checkpoint`) is complete on its own and written before the weights file, so
//!   `--resume` reads only it and a run killed between the two writes still resumes exactly;
//! * with `--save-best` the weights file holds the weights of the best validation loss so far: it
//!   is written after an epoch's validation improves on it, and not at the end;
//! * data parallel: rank 0 alone writes, the optimizer state gathered to it whole, and every
//!   decision about a file is rank 0's, so that every rank takes part in the same gathers.

use std::path::{Path, PathBuf};

use dmc_runtime::io::{self, TrainState};
use dmc_runtime::Backend;

use crate::commands::train::data_parallel::{rank0, writes};
use crate::report::CliError;

/// What to save, and when: from `--save`, `--save-every`, `--save-best` and `--resume`.
#[derive(Debug, Clone)]
pub struct SavePolicy {
    /// `--save`: the weights file.
    pub weights: Option<PathBuf>,
    /// The training state beside it (with `--save-every` or `--resume`).
    pub state: Option<PathBuf>,
    /// `--save-every N`.
    pub every: Option<usize>,
    /// `--save-best`.
    pub best: bool,
    /// The run's identity, written into the state (its `steps` and `best_val_loss` are set at
    /// each save).
    pub identity: TrainState,
}

/// What happened to `--save`.
#[derive(Debug)]
pub enum Saved {
    /// No `--save` was given.
    NotAsked,
    /// The weights were written to this file.
    Written(PathBuf),
    /// Nothing was written, for this reason (the existing file, if any, is untouched).
    Skipped(String),
}

impl Saved {
    /// A clause for a message: "the weights were saved to w.safetensors".
    pub fn describe(&self) -> Option<String> {
        match self {
            Saved::NotAsked => None,
            Saved::Written(p) => Some(format!("the weights were saved to {}", p.display())),
            Saved::Skipped(why) => Some(why.clone()),
        }
    }
}

impl SavePolicy {
    /// The state after `steps` completed steps, with the best validation loss `best`.
    fn state_at(&self, steps: usize, best: Option<f64>) -> TrainState {
        TrainState {
            steps: steps as u64,
            best_val_loss: best,
            ..self.identity.clone()
        }
    }

    /// After completed step `step`: with `--save-every N` and `step` a multiple of N, the state
    /// and (unless `--save-best`) the weights. Returns whether it saved.
    pub fn periodic(
        &self,
        be: &dyn Backend,
        step: usize,
        best: Option<f64>,
    ) -> Result<bool, CliError> {
        #[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; MSRV is 1.80
        let due = self.every.is_some_and(|n| step > 0 && step % n == 0);
        if due {
            self.save_all(be, step, best)?;
        }
        Ok(due)
    }

    /// After an epoch's validation gave `loss`: with `--save-best` and `loss` below `best`, the
    /// weights. Returns the new best loss and whether it saved.
    pub fn after_validation(
        &self,
        be: &dyn Backend,
        loss: f64,
        best: Option<f64>,
    ) -> Result<(Option<f64>, bool), CliError> {
        let improved = loss.is_finite()
            && match best {
                None => true,
                Some(b) => loss < b,
            };
        if !improved {
            return Ok((best, false));
        }
        match (&self.weights, self.best) {
            (Some(w), true) => {
                save(be, w)?;
                Ok((Some(loss), true))
            }
            _ => Ok((Some(loss), false)),
        }
    }

    /// The state (if kept), then the weights (unless `--save-best` keeps them for the best).
    fn save_all(&self, be: &dyn Backend, steps: usize, best: Option<f64>) -> Result<(), CliError> {
        if let Some(s) = &self.state {
            save_state(be, s, &self.state_at(steps, best))?;
        }
        if let (Some(w), false) = (&self.weights, self.best) {
            save(be, w)?;
        }
        Ok(())
    }

    /// Saves after training ended, by the rules above. `steps_done` counts completed steps (a
    /// resumed run's included); `unsaved` is whether the backend holds steps not saved yet (by
    /// this process: not the last step of a periodic save, not a resumed state run no further);
    /// `zero_steps_asked` is an explicit `--steps 0`.
    pub fn after_training(
        &self,
        be: &dyn Backend,
        steps_done: usize,
        unsaved: bool,
        zero_steps_asked: bool,
        best: Option<f64>,
    ) -> Result<Saved, CliError> {
        let Some(path) = self.weights.as_deref() else {
            return Ok(Saved::NotAsked);
        };
        if steps_done == 0 {
            if !zero_steps_asked {
                return Ok(Saved::Skipped(format!(
                    "no training step completed, so {} was not written{}",
                    path.display(),
                    untouched(path)
                )));
            }
            // A warning even with --quiet: this replaces a file with untrained weights.
            eprintln!(
                "warning: --steps 0: saving the initial (untrained) weights to {}",
                path.display()
            );
        }
        if let Some(s) = &self.state {
            if unsaved || rank0(be, !s.exists())? {
                save_state(be, s, &self.state_at(steps_done, best))?;
            }
        }
        if self.best {
            return Ok(match best {
                Some(b) => Saved::Skipped(format!(
                    "{} holds the weights of the best validation loss ({b:.6}; --save-best)",
                    path.display()
                )),
                None => Saved::Skipped(format!(
                    "no epoch was validated, so --save-best did not write {}{}",
                    path.display(),
                    untouched(path)
                )),
            });
        }
        if unsaved || rank0(be, !path.exists())? {
            save(be, path)?;
        }
        Ok(Saved::Written(path.to_path_buf()))
    }
}

fn untouched(path: &Path) -> &'static str {
    if path.exists() {
        " (the existing file is untouched)"
    } else {
        ""
    }
}

/// Writes the backend's parameters (refused if any is not finite).
pub fn save(be: &dyn Backend, path: &Path) -> Result<(), CliError> {
    // data parallel: rank 0 writes the weights (every rank takes part in reading them: sharded
    // parameters are gathered from the ranks)
    let params = be.params()?;
    if !writes(be) {
        return Ok(());
    }
    let tensors: Vec<(String, Vec<usize>, &[f32])> = params
        .iter()
        .map(|(n, s, d)| (n.clone(), s.clone(), d.as_ref()))
        .collect();
    io::save_weights(path, &tensors)?;
    Ok(())
}

/// Writes the training state: parameters, optimizer state and `state` (refused if any value is
/// not finite).
fn save_state(be: &dyn Backend, path: &Path, state: &TrainState) -> Result<(), CliError> {
    // data parallel: the state is gathered to rank 0 (every rank takes part), which writes it
    let opt = be.opt_states()?;
    let params = be.params()?;
    if !writes(be) {
        return Ok(());
    }
    let p: Vec<(String, Vec<usize>, &[f32])> = params
        .iter()
        .map(|(n, s, d)| (n.clone(), s.clone(), d.as_ref()))
        .collect();
    let o: Vec<(String, Vec<usize>, &[f32])> = opt
        .iter()
        .map(|(n, s, d)| (n.clone(), s.clone(), d.as_ref()))
        .collect();
    io::save_checkpoint(path, &p, &o, state)?;
    Ok(())
}
