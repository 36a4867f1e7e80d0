//! Metrics over a data set: mean loss and (for classification) accuracy, from the network's
//! outputs, for `dmc eval` and the validation of `dmc run`.

use dmc_grammar::model::{LossKind, Model};
use dmc_runtime::io::Dataset;
use dmc_runtime::Backend;

use super::dataset::Feeder;
use crate::report::CliError;

/// Metrics over a data set: mean loss and (for classification) accuracy, computed per sample from the
/// network's outputs so that padded samples of the last batch are not counted.
pub struct Metrics {
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub samples: usize,
}

/// Runs `be` (an eval plan) over `ds` in order, in batches of `batch` (the last one padded).
pub fn evaluate(
    be: &mut dyn Backend,
    model: &Model,
    ds: &Dataset,
    batch: usize,
) -> Result<Metrics, CliError> {
    let plan = be.plan().clone();
    let mut feeder = Feeder::new(&plan, true);
    let epoch = ds.in_order_padded(batch)?;
    let target = &plan.targets[0].name;
    let per = plan.output.shape[1..].iter().product::<usize>().max(1);
    let (mut loss_sum, mut correct, mut n) = (0f64, 0usize, 0usize);
    // Regression targets (held in memory: only inputs are read in place from a mapped file).
    let targets_f32 = ds.tensor_f32(target);
    for b in 0..epoch.num_batches() {
        let idx = epoch.batch(b);
        feeder.feed(be, ds, idx)?;
        be.run(1, 0)?;
        let out = be.output()?;
        for (j, &sample) in idx.iter().enumerate().take(epoch.valid(b)) {
            let row = &out[j * per..(j + 1) * per];
            if let LossKind::CrossEntropy { label_smoothing } = model.loss.kind {
                let label = ds.tensor_i32(target).unwrap_or(&[])[sample] as usize;
                loss_sum += cross_entropy(row, label, label_smoothing as f64);
                correct += usize::from(argmax(row) == label);
            } else {
                let t = targets_f32.as_deref().unwrap_or(&[]);
                let tr = &t[sample * per..(sample + 1) * per];
                let sum: f64 = row
                    .iter()
                    .zip(tr)
                    .map(|(&a, &b)| elementwise_loss(model.loss.kind, a as f64, b as f64))
                    .sum();
                loss_sum += sum / per as f64;
            }
            n += 1;
        }
    }
    let accuracy = model
        .loss
        .kind
        .takes_labels()
        .then(|| correct as f64 / n.max(1) as f64);
    Ok(Metrics {
        loss: loss_sum / n.max(1) as f64,
        accuracy,
        samples: n,
    })
}

/// One sample's cross-entropy against the smoothed target `(1-e) onehot + e/C`, in f64 (the
/// training kernel's formula).
fn cross_entropy(row: &[f32], label: usize, e: f64) -> f64 {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    let nll = lse - row[label] as f64;
    if e == 0.0 {
        return nll;
    }
    let mean = row.iter().map(|&v| v as f64).sum::<f64>() / row.len().max(1) as f64;
    (1.0 - e) * nll + e * (lse - mean)
}

/// One element's term of a loss that compares a prediction with a target of its shape.
fn elementwise_loss(kind: LossKind, p: f64, t: f64) -> f64 {
    match kind {
        LossKind::Mse => (p - t).powi(2),
        LossKind::Mae => (p - t).abs(),
        LossKind::Huber { delta } => {
            let (a, d) = ((p - t).abs(), delta as f64);
            if a <= d {
                0.5 * a * a
            } else {
                d * (a - 0.5 * d)
            }
        }
        LossKind::BceWithLogits => p.max(0.0) - p * t + (-p.abs()).exp().ln_1p(),
        LossKind::CrossEntropy { .. } => f64::NAN,
    }
}

/// The index of the largest value of `row` (the first of equal ones): a classifier's prediction.
pub fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv {
                (i, v)
            } else {
                (bi, bv)
            }
        })
        .0
}

/// How many samples of a training batch the network classified right, from the output of the
/// step that trained on them (computed before that step's update): `None` when the loss is not a
/// classification loss.
pub fn batch_correct(
    be: &dyn Backend,
    model: &Model,
    ds: &Dataset,
    batch: &[usize],
) -> Result<Option<usize>, CliError> {
    if !model.loss.kind.takes_labels() {
        return Ok(None);
    }
    let plan = be.plan();
    let per = plan.output.shape[1..].iter().product::<usize>().max(1);
    let labels = ds.tensor_i32(&plan.targets[0].name).unwrap_or(&[]);
    let out = be.output()?;
    Ok(Some(
        batch
            .iter()
            .enumerate()
            .filter(|&(j, &sample)| {
                let row = &out[j * per..(j + 1) * per];
                labels.get(sample).map(|&l| l as usize) == Some(argmax(row))
            })
            .count(),
    ))
}

/// `loss 0.123456, accuracy 97.50% (400 samples)`.
pub fn fmt_metrics(m: &Metrics) -> String {
    match m.accuracy {
        Some(a) => format!(
            "loss {:.6}, accuracy {:.2}% ({} samples)",
            m.loss,
            a * 100.0,
            m.samples
        ),
        None => format!("loss {:.6} ({} samples)", m.loss, m.samples),
    }
}
