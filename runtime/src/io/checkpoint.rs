//! Training checkpoints, for `dmc run --resume`: one `.safetensors` file that holds everything a
//! training step carries to the next one — the parameters (`param/<name>`), the optimizer state
//! (`opt/<name>`: momentum, Adam's moments) and, in the header's metadata (one entry,
//! `dmc_train_state`, of JSON), the step counter (Adam's `t`, the dropout key and, with the seed,
//! the position in the data order) and what the run was (seed, batch, training samples,
//! optimizer, best validation loss). `dmc run --save W` writes it
//! to `W.state.safetensors` ([`state_path`]) with `--save-every`.
//!
//! The checkpoint is complete on its own: resuming reads only it, never the weights file beside
//! it, so the pair can never be inconsistent however a run is killed (the checkpoint is written,
//! atomically, before the weights file).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::weights::{read_tensors, save_tensors};
use super::IoError;

/// The `format` of a checkpoint's metadata.
pub const STATE_FORMAT: &str = "dmc-train-state/1";

/// The one metadata entry of a checkpoint: JSON of [`Header`].
const META_KEY: &str = "dmc_train_state";

/// What the metadata entry holds.
#[derive(Serialize, Deserialize)]
struct Header {
    format: String,
    #[serde(flatten)]
    state: TrainState,
}

/// A training run's position and identity, beside the tensors of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Completed training steps.
    pub steps: u64,
    pub seed: u64,
    pub batch: usize,
    /// Samples in the training set (after a validation split).
    pub samples: usize,
    /// The optimizer with its hyper-parameters, as `dmc` describes it.
    pub optimizer: String,
    /// The lowest validation loss seen so far (for `--save-best`).
    pub best_val_loss: Option<f64>,
    /// Whether every epoch reshuffles the data (`false`: file order, `--no-shuffle`). States
    /// written before the setting existed were shuffled runs.
    #[serde(default = "shuffled")]
    pub shuffle: bool,
}

fn shuffled() -> bool {
    true
}

/// Tensors of a checkpoint: (name, shape, values).
pub type StateTensors<'a> = [(String, Vec<usize>, &'a [f32])];

/// A loaded checkpoint: the state, then the parameters and the optimizer state in the order asked.
pub struct Checkpoint {
    pub state: TrainState,
    pub params: Vec<(String, Vec<f32>)>,
    pub opt_state: Vec<(String, Vec<f32>)>,
}

/// The checkpoint beside weights file `weights`: `w.safetensors` -> `w.state.safetensors`
/// (another name gets `.state.safetensors` appended).
pub fn state_path(weights: &Path) -> PathBuf {
    let name = weights
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".safetensors").unwrap_or(&name);
    weights.with_file_name(format!("{stem}.state.safetensors"))
}

/// Writes a checkpoint atomically (refused, leaving `path` untouched, if any value is not finite).
pub fn save_checkpoint(
    path: &Path,
    params: &StateTensors<'_>,
    opt_state: &StateTensors<'_>,
    state: &TrainState,
) -> Result<(), IoError> {
    let mut tensors = Vec::with_capacity(params.len() + opt_state.len());
    for (prefix, list) in [("param/", params), ("opt/", opt_state)] {
        for (n, s, d) in list {
            tensors.push((format!("{prefix}{n}"), s.clone(), *d));
        }
    }
    // One metadata entry holding JSON of fixed field order: the file's bytes depend only on
    // its contents (safetensors writes several entries in hash-map order).
    let header = Header {
        format: STATE_FORMAT.to_string(),
        state: state.clone(),
    };
    let json = serde_json::to_string(&header).map_err(|e| IoError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let meta = HashMap::from([(META_KEY.to_string(), json)]);
    save_tensors(path, &tensors, Some(meta))
}

/// Reads a checkpoint and checks its tensors against the program: exactly the parameters
/// `params` and the optimizer state `opt_state` (names and shapes), in that order.
pub fn load_checkpoint(
    path: &Path,
    params: &[(String, Vec<usize>)],
    opt_state: &[(String, Vec<usize>)],
) -> Result<Checkpoint, IoError> {
    let bad = |reason: String| IoError::BadCheckpoint {
        path: path.to_path_buf(),
        reason,
    };
    let file = read_tensors(path, "training checkpoint")?;
    let Some(json) = file.metadata.get(META_KEY) else {
        return Err(bad(format!(
            "it has no `{META_KEY}` entry: it is not a dmc training checkpoint (a weights file is loaded with --init, not --resume)"
        )));
    };
    let header: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| bad(format!("its `{META_KEY}` entry is not valid JSON ({e})")))?;
    match header.get("format").and_then(|f| f.as_str()) {
        Some(STATE_FORMAT) => {}
        Some(f) => {
            return Err(bad(format!(
                "its format is `{f}`, this dmc reads `{STATE_FORMAT}`"
            )))
        }
        None => return Err(bad(format!("its `{META_KEY}` entry has no `format`"))),
    }
    let Header { state, .. } = serde_json::from_value(header)
        .map_err(|e| bad(format!("its `{META_KEY}` entry is incomplete ({e})")))?;
    let mut by_name: HashMap<String, (Vec<usize>, Vec<f32>)> = file
        .tensors
        .into_iter()
        .map(|(n, s, v)| (n, (s, v)))
        .collect();
    let mut take = |prefix: &str, list: &[(String, Vec<usize>)]| {
        let mut out = Vec::with_capacity(list.len());
        for (name, shape) in list {
            let key = format!("{prefix}{name}");
            let Some((found, values)) = by_name.remove(&key) else {
                return Err(bad(format!(
                    "it has no `{key}`: it was saved by a run of another program or optimizer"
                )));
            };
            if &found != shape {
                return Err(bad(format!(
                    "`{key}` has shape {found:?}, the program expects {shape:?}: it was saved by a run of another program"
                )));
            }
            out.push((name.clone(), values));
        }
        Ok(out)
    };
    let params = take("param/", params)?;
    let opt_state = take("opt/", opt_state)?;
    if let Some(extra) = by_name.keys().min() {
        return Err(bad(format!(
            "it has `{extra}`, which this program and optimizer do not have: it was saved by a run of another program or optimizer"
        )));
    }
    Ok(Checkpoint {
        state,
        params,
        opt_state,
    })
}
