//! Token data for sequence models: a program with one integer input `int[T]` (and integer labels
//! `int[T]`) trains on next-token windows of a token stream — sample n is the tokens
//! `s[n*T .. n*T + T]`, its labels `s[n*T + 1 .. n*T + T + 1]` (each position predicts the next).
//!
//! * `--data corpus.txt` reads a text file as bytes (256 symbols: any encoding, UTF-8 included).
//! * Without `--data`, the seeded synthetic stream is a random first-order Markov chain over the
//!   vocabulary: each token has three successors, drawn with probabilities 0.6, 0.3 and 0.1
//!   (1.3 bits per token: learnable, far below a uniform choice).

use std::path::Path;

use dmc_plan::op::DType;
use rand::Rng;

use super::epoch::rng;
use super::{Column, Dataset, TensorRole, TensorSpec};
use crate::io::IoError;

/// The token input and the labels (if loaded) of a next-token program, and `T`.
fn next_token_specs(specs: &[TensorSpec]) -> Result<(usize, Option<usize>, usize), String> {
    let inputs: Vec<usize> = (0..specs.len())
        .filter(|&i| specs[i].role == TensorRole::Input)
        .collect();
    let targets: Vec<usize> = (0..specs.len())
        .filter(|&i| specs[i].role == TensorRole::Target)
        .collect();
    let shape = |i: usize| &specs[i].per_sample_shape;
    let [x] = inputs[..] else {
        return Err(format!(
            "next-token windows feed one integer input `int[T]`, but the program has {} inputs",
            inputs.len()
        ));
    };
    let t = match (specs[x].dtype, shape(x).as_slice()) {
        (DType::I32, &[t]) if t > 0 => t,
        _ => {
            return Err(format!(
                "next-token windows feed an integer input `int[T]`, but `{}` is {:?}{:?}",
                specs[x].name,
                specs[x].dtype,
                shape(x)
            ))
        }
    };
    let y = match targets[..] {
        [] => None,
        [y] if specs[y].dtype == DType::I32 && *shape(y) == [t] => Some(y),
        _ => {
            return Err(format!(
                "next-token windows give one integer label per position, `int[{t}]`, but the program's targets are {}",
                targets
                    .iter()
                    .map(|&i| format!("`{}` {:?}{:?}", specs[i].name, specs[i].dtype, shape(i)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    };
    Ok((x, y, t))
}

/// The next-token windows of `stream` for `specs` (see the module's doc).
fn windows(stream: &[i32], specs: &[TensorSpec], source: String) -> Result<Dataset, String> {
    let (x, y, t) = next_token_specs(specs)?;
    let samples = stream.len().saturating_sub(1) / t;
    if samples == 0 {
        return Err(format!(
            "{} tokens make no window of {t} tokens and its next one: it needs at least {}",
            stream.len(),
            t + 1
        ));
    }
    let mut columns = vec![Column::I32(Vec::new()); specs.len()];
    columns[x] = Column::I32(stream[..samples * t].to_vec());
    if let Some(y) = y {
        columns[y] = Column::I32(stream[1..samples * t + 1].to_vec());
    }
    Ok(Dataset {
        source,
        samples,
        specs: specs.to_vec(),
        columns,
        ignored: Vec::new(),
    })
}

impl Dataset {
    /// Next-token windows of the bytes of the text file `path` (see the module's doc).
    pub fn from_text(path: &Path, specs: &[TensorSpec]) -> Result<Dataset, IoError> {
        let map = super::mapped::MappedFile::open(path, "text corpus")?;
        let stream: Vec<i32> = map.bytes().iter().map(|&b| i32::from(b)).collect();
        windows(&stream, specs, path.display().to_string()).map_err(|reason| IoError::Text {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// The seeded synthetic token stream's next-token windows over `vocab` tokens (see the
    /// module's doc).
    pub(super) fn synthetic_tokens(
        specs: &[TensorSpec],
        samples: usize,
        seed: u64,
        vocab: usize,
    ) -> Result<Dataset, IoError> {
        let fail = |reason: String| IoError::Synthetic { reason };
        if vocab == 0 || vocab > i32::MAX as usize {
            return Err(fail(format!("a vocabulary of {vocab} tokens")));
        }
        let (_, _, t) = next_token_specs(specs).map_err(|why| {
            fail(format!(
                "{why}; the synthetic data of a program with token inputs is next-token windows: for other targets pass --data (a .safetensors or .npz file with the tokens and the targets)"
            ))
        })?;
        let len = samples
            .checked_mul(t)
            .and_then(|n| n.checked_add(1))
            .filter(|&n| (n as u128) * 4 <= crate::alloc::physical_memory().unwrap_or(1 << 32) as u128 / 2)
            .ok_or_else(|| fail(format!("{samples} samples of {t} tokens do not fit in memory; pass fewer (--synthetic-samples)")))?;
        let mut r = rng(seed, 0x70c3);
        let succ: Vec<[i32; 3]> = (0..vocab)
            .map(|_| std::array::from_fn(|_| r.random_range(0..vocab) as i32))
            .collect();
        let mut stream = Vec::with_capacity(len);
        let mut cur = r.random_range(0..vocab) as i32;
        for _ in 0..len {
            stream.push(cur);
            let u: f32 = r.random();
            let k = if u < 0.6 {
                0
            } else if u < 0.9 {
                1
            } else {
                2
            };
            cur = succ[cur as usize][k];
        }
        windows(&stream, specs, format!("synthetic tokens (seed {seed})")).map_err(fail)
    }
}
