//! The one path by which `dmc run` writes trained weights, whatever ended the training (the last
//! step, a NaN loss, a signal, an error after training started):
//!
//! * nothing is written before a training step has completed, so an interrupted compilation or a
//!   failure while loading never replaces a checkpoint with untrained weights; `--steps 0` asks for
//!   the initial weights explicitly (with a warning);
//! * weights holding NaN or Inf are refused (`dmc_runtime::io::save_weights`), so a diverged run
//!   never replaces a good file;
//! * the write itself is atomic, never replaces a non-regular file and leaves no temp file behind
//!   (`dmc_runtime::io::files`).

use std::path::{Path, PathBuf};

use dmc_runtime::io;
use dmc_runtime::Backend;

use crate::report::CliError;

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

/// Saves the backend's weights to `path` after training ended, by the rules above. `steps_done`
/// counts completed steps; `zero_steps_asked` is an explicit `--steps 0`.
pub fn save_after_training(
    be: &dyn Backend,
    path: Option<&Path>,
    steps_done: usize,
    zero_steps_asked: bool,
) -> Result<Saved, CliError> {
    let Some(path) = path else {
        return Ok(Saved::NotAsked);
    };
    if steps_done == 0 {
        if !zero_steps_asked {
            return Ok(Saved::Skipped(format!(
                "no training step completed, so {} was not written{}",
                path.display(),
                if path.exists() {
                    " (the existing file is untouched)"
                } else {
                    ""
                }
            )));
        }
        // A warning even with --quiet: this replaces a file with untrained weights.
        eprintln!(
            "warning: --steps 0: saving the initial (untrained) weights to {}",
            path.display()
        );
    }
    save(be, path)?;
    Ok(Saved::Written(path.to_path_buf()))
}

/// Writes the backend's parameters (refused if any is not finite).
pub fn save(be: &dyn Backend, path: &Path) -> Result<(), CliError> {
    let params = be.params()?;
    let tensors: Vec<(String, Vec<usize>, &[f32])> = params
        .iter()
        .map(|(n, s, d)| (n.clone(), s.clone(), d.as_ref()))
        .collect();
    io::save_weights(path, &tensors)?;
    Ok(())
}
