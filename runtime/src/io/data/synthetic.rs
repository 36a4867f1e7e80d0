//! The seeded synthetic dataset: uniform inputs and targets from a fixed random linear "teacher",
//! learnable by the program that asked for it (for `--synthetic-samples` and `dmc data`).

use std::collections::HashMap;

use dmc_plan::op::DType;
use rand::Rng;
use rayon::prelude::*;

use super::epoch::rng;
use super::{Column, Dataset, Task, TensorRole, TensorSpec};
use crate::io::IoError;

/// The bytes [`Dataset::synthetic`] allocates (inputs, targets and the teachers' weights), without
/// overflow.
fn synthetic_bytes(specs: &[TensorSpec], samples: usize, task: Task) -> u128 {
    let samples = samples as u128;
    let len = |s: &TensorSpec| {
        s.per_sample_shape
            .iter()
            .fold(1u128, |a, &d| a.saturating_mul(d as u128))
    };
    let features: u128 = specs
        .iter()
        .filter(|s| s.role == TensorRole::Input)
        .map(len)
        .fold(0, u128::saturating_add);
    let mut total = samples.saturating_mul(features);
    for s in specs.iter().filter(|s| s.role == TensorRole::Target) {
        let l = len(s);
        let (teacher, data) = match task {
            Task::NextToken { .. } => (0, samples.saturating_mul(l)),
            Task::Regression => (l.saturating_mul(features), samples.saturating_mul(l)),
            Task::Classification { classes } => {
                let c = classes as u128;
                (
                    l.saturating_mul(c).saturating_mul(features),
                    samples.saturating_mul(l.saturating_add(c)),
                )
            }
        };
        total = total.saturating_add(teacher).saturating_add(data);
    }
    total.saturating_mul(4)
}

impl Dataset {
    /// A seeded, learnable synthetic dataset: inputs ~ U[0,1); targets from a fixed random linear
    /// "teacher" of the (centred, concatenated) inputs: standardised values for
    /// [`Task::Regression`], the argmax over `classes` for [`Task::Classification`] (i32 labels, or
    /// one-hot f32 targets of `classes` values). The same `seed` gives the same data.
    pub fn synthetic(
        specs: &[TensorSpec],
        samples: usize,
        seed: u64,
        task: Task,
    ) -> Result<Dataset, IoError> {
        let fail = |reason: String| Err(IoError::Synthetic { reason });
        if samples == 0 {
            return fail("the sample count must be positive".into());
        }
        if let Task::NextToken { vocab } = task {
            return Self::synthetic_tokens(specs, samples, seed, vocab);
        }
        if !specs.iter().any(|s| s.role == TensorRole::Input) {
            return fail("the program has no inputs".into());
        }
        if let Task::Classification { classes } = task {
            if classes < 2 {
                return fail(format!(
                    "classification needs at least 2 classes, got {classes}"
                ));
            }
            if classes > i32::MAX as usize {
                return fail(format!("{classes} classes do not fit in i32 labels"));
            }
        }
        let need = synthetic_bytes(specs, samples, task);
        let limit = crate::alloc::physical_memory().map_or(1u128 << 32, |m| m as u128 / 2);
        if need > limit {
            return fail(format!(
                "{samples} samples of this program's inputs and targets (with the teacher's weights) need {need} bytes, more than half this machine's memory ({limit} bytes); pass fewer samples (--synthetic-samples; --samples for `dmc data`), or real data with --data"
            ));
        }
        let mut columns = Vec::with_capacity(specs.len());
        // Inputs first (stream 1), so that the teachers can read them.
        let mut r = rng(seed, 1);
        let mut inputs: Vec<(usize, Vec<f32>)> = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            if s.role != TensorRole::Input {
                continue;
            }
            if s.dtype != DType::F32 {
                return fail(format!("input `{}` must be f32", s.name));
            }
            let v: Vec<f32> = (0..samples * s.sample_len())
                .map(|_| r.random::<f32>())
                .collect();
            inputs.push((i, v));
        }
        let features: usize = inputs.iter().map(|(i, _)| specs[*i].sample_len()).sum();
        let x_of = |n: usize, buf: &mut Vec<f32>| {
            buf.clear();
            for (i, v) in &inputs {
                let l = specs[*i].sample_len();
                buf.extend(v[n * l..(n + 1) * l].iter().map(|x| x - 0.5));
            }
        };
        let mut targets: HashMap<usize, Column> = HashMap::new();
        for (t, s) in specs.iter().enumerate() {
            if s.role != TensorRole::Target {
                continue;
            }
            let mut tr = rng(seed, 2 + t as u64);
            let len = s.sample_len();
            // Under a classification, a float target that is not a one-hot vector of the classes
            // (another term's, `loss mse(recon, x2) + cross_entropy(logits, label)`) is a
            // regression target.
            let task_here = match (task, s.dtype) {
                (Task::Classification { classes }, DType::F32) if len != classes => {
                    Task::Regression
                }
                _ => task,
            };
            let col = match (task_here, s.dtype) {
                (Task::Regression, DType::F32) => {
                    let w: Vec<f32> = (0..len * features)
                        .map(|_| tr.random::<f32>() * 2.0 - 1.0)
                        .collect();
                    let mut y = vec![0f32; samples * len];
                    if len > 0 {
                        y.par_chunks_mut(len).enumerate().for_each_init(
                            || Vec::with_capacity(features),
                            |x, (n, out)| {
                                x_of(n, x);
                                for (o, v) in out.iter_mut().enumerate() {
                                    *v = dot(&w[o * features..(o + 1) * features], x);
                                }
                            },
                        );
                    }
                    for o in 0..len {
                        let mean = (0..samples).map(|n| y[n * len + o] as f64).sum::<f64>()
                            / samples as f64;
                        let var = (0..samples)
                            .map(|n| (y[n * len + o] as f64 - mean).powi(2))
                            .sum::<f64>()
                            / samples as f64;
                        let sd = if var > 1e-20 { var.sqrt() } else { 1.0 };
                        for n in 0..samples {
                            y[n * len + o] = ((y[n * len + o] as f64 - mean) / sd) as f32;
                        }
                    }
                    Column::F32(y)
                }
                (Task::Classification { classes }, dtype) => {
                    // i32: one label per element; f32: a one-hot vector of `classes` values.
                    let labels_per_sample = match dtype {
                        DType::I32 => len,
                        DType::F32 if len == classes => 1,
                        _ => {
                            return fail(format!(
                                "target `{}` ({:?}, {} values per sample) is neither i32 labels nor a one-hot f32 vector of {classes} classes",
                                s.name, dtype, len
                            ))
                        }
                    };
                    let w: Vec<f32> = (0..labels_per_sample * classes * features)
                        .map(|_| tr.random::<f32>() * 2.0 - 1.0)
                        .collect();
                    let mut labels = vec![0i32; samples * labels_per_sample];
                    if labels_per_sample > 0 {
                        labels
                            .par_chunks_mut(labels_per_sample)
                            .enumerate()
                            .for_each_init(
                                || Vec::with_capacity(features),
                                |x, (n, out)| {
                                    x_of(n, x);
                                    for (e, label) in out.iter_mut().enumerate() {
                                        let mut best = (f32::NEG_INFINITY, 0usize);
                                        for c in 0..classes {
                                            let row = (e * classes + c) * features;
                                            let v = dot(&w[row..row + features], x);
                                            if v > best.0 {
                                                best = (v, c);
                                            }
                                        }
                                        *label = best.1 as i32;
                                    }
                                },
                            );
                    }
                    if dtype == DType::I32 {
                        Column::I32(labels)
                    } else {
                        let mut y = vec![0f32; samples * classes];
                        for (n, &l) in labels.iter().enumerate() {
                            y[n * classes + l as usize] = 1.0;
                        }
                        Column::F32(y)
                    }
                }
                (Task::NextToken { vocab }, _) => {
                    return Self::synthetic_tokens(specs, samples, seed, vocab)
                }
                (Task::Regression, dtype) => {
                    return fail(format!(
                        "target `{}` is {:?}: class labels need Task::Classification",
                        s.name, dtype
                    ))
                }
            };
            targets.insert(t, col);
        }
        // Make classes separable: pull every input halfway towards a seeded per-class centre
        // (inputs stay in [0, 1)). The teacher alone gives labels that a small net learns slowly.
        if let Task::Classification { classes } = task {
            let first_labels = specs
                .iter()
                .enumerate()
                .find_map(|(t, s)| match targets.get(&t) {
                    Some(Column::I32(l)) if s.sample_len() == 1 => Some(l.clone()),
                    _ => None,
                });
            if let Some(labels) = first_labels {
                let mut cr = rng(seed, 0x5eed_c1a5);
                for (i, v) in inputs.iter_mut() {
                    let l = specs[*i].sample_len();
                    // Images ([h, w, c]) get one colour per class (a centre per channel, the same at
                    // every pixel), so that nets with global pooling can see it too.
                    let shape = &specs[*i].per_sample_shape;
                    let period = if shape.len() == 3 {
                        shape[2].max(1)
                    } else {
                        l.max(1)
                    };
                    let centres: Vec<f32> =
                        (0..classes * period).map(|_| cr.random::<f32>()).collect();
                    for (n, &label) in labels.iter().enumerate() {
                        let c = &centres[label as usize * period..(label as usize + 1) * period];
                        for (k, x) in v[n * l..(n + 1) * l].iter_mut().enumerate() {
                            *x = 0.5 * *x + 0.5 * c[k % period];
                        }
                    }
                }
            }
        }
        let mut inputs = inputs.into_iter();
        for (i, s) in specs.iter().enumerate() {
            if s.role == TensorRole::Input {
                columns.push(Column::F32(inputs.next().unwrap().1));
            } else {
                columns.push(targets.remove(&i).unwrap());
            }
        }
        Ok(Dataset {
            source: format!("synthetic data (seed {seed})"),
            samples,
            specs: specs.to_vec(),
            columns,
            ignored: Vec::new(),
        })
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
