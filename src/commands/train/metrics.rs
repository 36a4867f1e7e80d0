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
            match model.loss.kind {
                LossKind::Mse => {
                    let t = targets_f32.as_deref().unwrap_or(&[]);
                    let tr = &t[sample * per..(sample + 1) * per];
                    let se: f64 = row
                        .iter()
                        .zip(tr)
                        .map(|(a, b)| ((a - b) as f64).powi(2))
                        .sum();
                    loss_sum += se / per as f64;
                }
                LossKind::CrossEntropy => {
                    let label = ds.tensor_i32(target).unwrap_or(&[])[sample] as usize;
                    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
                    let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
                    loss_sum += lse - row[label] as f64;
                    let arg = argmax(row);
                    correct += usize::from(arg == label);
                }
            }
            n += 1;
        }
    }
    let accuracy =
        (model.loss.kind == LossKind::CrossEntropy).then(|| correct as f64 / n.max(1) as f64);
    Ok(Metrics {
        loss: loss_sum / n.max(1) as f64,
        accuracy,
        samples: n,
    })
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
    if model.loss.kind != LossKind::CrossEntropy {
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
