//! Metrics over a data set: mean loss and (for classification) accuracy and `--top-k` accuracy,
//! from the network's outputs, for `dmc eval` and the validation of `dmc run`.

use dmc_compiler::plan::Plan;
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
    /// `--top-k K`: `(K, the fraction of samples whose label is among the K best outputs)`.
    pub top_k: Option<(usize, f64)>,
    pub samples: usize,
}

/// Refuses a `--top-k K` that cannot be computed: K = 0, K above the number of classes (the
/// outputs per sample), or a loss without class labels.
pub fn check_top_k(top_k: Option<usize>, model: &Model, plan: &Plan) -> Result<(), CliError> {
    let Some(k) = top_k else { return Ok(()) };
    if model.loss.classifier().is_none() {
        let names: Vec<&str> = model.loss.terms.iter().map(|t| t.kind.name()).collect();
        return Err(CliError::Usage(format!(
            "--top-k {k}: top-K accuracy needs class labels, and the loss `{}` compares with float targets; use it with `cross_entropy`",
            names.join(" + ")
        )));
    }
    let classes = plan.output.shape[1..].iter().product::<usize>().max(1);
    if k == 0 || k > classes {
        return Err(CliError::Usage(format!(
            "--top-k {k}: K must be between 1 and the number of classes, {classes} (the outputs per sample)"
        )));
    }
    Ok(())
}

/// Runs `be` (an eval plan) over `ds` in order, in batches of `batch` (the last one padded), with
/// the top-K accuracy too for `top_k` = Some(K) (checked by [`check_top_k`]).
pub fn evaluate(
    be: &mut dyn Backend,
    model: &Model,
    ds: &Dataset,
    batch: usize,
    top_k: Option<usize>,
) -> Result<Metrics, CliError> {
    evaluate_shared(be, model, ds, batch, top_k, None)
}

/// [`evaluate`], the batches shared among the ranks of `group` (data parallel: rank r runs
/// batches r, r + N, ...; the sums are then the ranks' together, the same on every rank).
pub fn evaluate_shared(
    be: &mut dyn Backend,
    model: &Model,
    ds: &Dataset,
    batch: usize,
    top_k: Option<usize>,
    group: Option<&dyn dmc_runtime::comm::Collective>,
) -> Result<Metrics, CliError> {
    let (rank, world) = group.map_or((0, 1), |g| (g.rank(), g.world()));
    let plan = be.plan().clone();
    let mut feeder = Feeder::new(&plan, true);
    let epoch = ds.in_order_padded(batch)?;
    let term = model.loss.output_term();
    let target = model
        .target_name(term.target)
        .unwrap_or(&plan.targets[0].name)
        .to_string();
    let per = plan.output.shape[1..].iter().product::<usize>().max(1);
    let (mut loss_sum, mut correct, mut in_top, mut n) = (0f64, 0usize, 0usize, 0usize);
    // labels per sample: 1, or one per position of a sequence (logits [T, C], labels int[T])
    let lps = label_positions(ds, &target, per);
    let mut positions = 0usize;
    // Regression targets (held in memory: only inputs are read in place from a mapped file).
    let targets_f32 = ds.tensor_f32(&target);
    let labels = ds.tensor_i32(&target);
    // A weighted sum of losses over several predictions: the loss of a full batch is the plan's
    // (every loss is a mean over the samples); the samples of the padded last batch are each run
    // as a batch of copies of themselves (whose loss is that sample's).
    let summed = !model.loss.is_single();
    let mut alone = vec![0usize; batch];
    for b in (rank..epoch.num_batches()).step_by(world) {
        let idx = epoch.batch(b);
        feeder.feed(be, ds, idx)?;
        let batch_loss = be.run(1, 0)?;
        let out = be.output()?.into_owned();
        let valid = epoch.valid(b);
        if summed && valid == idx.len() {
            loss_sum += batch_loss as f64 * valid as f64;
        }
        for (j, &sample) in idx.iter().enumerate().take(valid) {
            let row = &out[j * per..(j + 1) * per];
            if let LossKind::CrossEntropy { label_smoothing } = term.kind {
                let c = per / lps;
                let mut sample_loss = 0f64;
                for p in 0..lps {
                    let row = &row[p * c..(p + 1) * c];
                    let label = labels.unwrap_or(&[])[sample * lps + p] as usize;
                    sample_loss += cross_entropy(row, label, label_smoothing as f64);
                    correct += usize::from(argmax(row) == label);
                    in_top += usize::from(in_top_k(row, label, top_k.unwrap_or(1)));
                }
                positions += lps;
                if !summed {
                    loss_sum += sample_loss / lps as f64;
                }
            } else if !summed {
                let t = targets_f32.as_deref().unwrap_or(&[]);
                let tr = &t[sample * per..(sample + 1) * per];
                let sum: f64 = row
                    .iter()
                    .zip(tr)
                    .map(|(&a, &b)| elementwise_loss(term.kind, a as f64, b as f64))
                    .sum();
                loss_sum += sum / per as f64;
            }
            n += 1;
        }
        if summed && valid < idx.len() {
            for &sample in idx.iter().take(valid) {
                alone.fill(sample);
                feeder.feed(be, ds, &alone)?;
                loss_sum += be.run(1, 0)? as f64;
            }
        }
    }
    if let Some(g) = group.filter(|g| g.world() > 1) {
        let mut v = [
            loss_sum,
            correct as f64,
            in_top as f64,
            n as f64,
            positions as f64,
        ];
        dmc_runtime::comm::all_reduce_sum_f64(g, &mut v)?;
        loss_sum = v[0];
        (correct, in_top, n, positions) =
            (v[1] as usize, v[2] as usize, v[3] as usize, v[4] as usize);
    }
    let labels = model.loss.classifier().is_some();
    let accuracy = labels.then(|| correct as f64 / positions.max(1) as f64);
    let top_k = top_k
        .filter(|_| labels)
        .map(|k| (k, in_top as f64 / positions.max(1) as f64));
    Ok(Metrics {
        loss: loss_sum / n.max(1) as f64,
        accuracy,
        top_k,
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

/// Whether `label` is among the `k` best of `row`: fewer than `k` outputs rank above it, an output
/// ranking above it when it is strictly greater, or equal and at a lower index (ties go to the
/// lower index, as in [`argmax`], so that K = 1 is the accuracy). A label outside the row is not.
pub fn in_top_k(row: &[f32], label: usize, k: usize) -> bool {
    let Some(&v) = row.get(label) else {
        return false;
    };
    let above = row
        .iter()
        .enumerate()
        .filter(|&(i, &x)| x > v || (x == v && i < label))
        .count();
    above < k
}

/// Classified-right counts of a training batch: top-1 and (with `--top-k`) top-K.
#[derive(Debug, Clone, Copy, Default)]
pub struct Correct {
    pub top1: usize,
    pub top_k: usize,
    /// Labels counted (a sample's, or one per position of a sequence).
    pub positions: usize,
}

/// How many samples of a training batch the network classified right (and had their label among
/// the `top_k` best outputs), from the output of the step that trained on them (computed before
/// that step's update): `None` when the loss is not a classification loss.
pub fn batch_correct(
    be: &dyn Backend,
    model: &Model,
    ds: &Dataset,
    batch: &[usize],
    top_k: Option<usize>,
) -> Result<Option<Correct>, CliError> {
    let Some(term) = model.loss.classifier() else {
        return Ok(None);
    };
    let plan = be.plan();
    let per = plan.output.shape[1..].iter().product::<usize>().max(1);
    let target = model
        .target_name(term.target)
        .unwrap_or(&plan.targets[0].name);
    let labels = ds.tensor_i32(target).unwrap_or(&[]);
    let lps = label_positions(ds, target, per);
    let cls = per / lps;
    let out = be.output()?;
    let mut c = Correct::default();
    for (j, &sample) in batch.iter().enumerate() {
        for p in 0..lps {
            let row = &out[j * per + p * cls..j * per + (p + 1) * cls];
            let Some(label) = labels.get(sample * lps + p).map(|&l| l as usize) else {
                continue;
            };
            c.top1 += usize::from(argmax(row) == label);
            c.top_k += usize::from(in_top_k(row, label, top_k.unwrap_or(1)));
            c.positions += 1;
        }
    }
    Ok(Some(c))
}

/// Labels per sample of the label tensor `target` (1, or T for per-position labels `int[T]` of
/// logits `[T, C]`), given `per` output values per sample (a divisor of it).
fn label_positions(ds: &Dataset, target: &str, per: usize) -> usize {
    let lps = ds
        .specs()
        .iter()
        .find(|s| s.name == target)
        .map_or(1, |s| s.sample_len().max(1));
    if per.is_multiple_of(lps) {
        lps
    } else {
        1
    }
}

/// `loss 0.123456, accuracy 97.50% (400 samples)`; with `--top-k 5`
/// `loss 0.123456, accuracy 97.50%, top-5 99.75% (400 samples)`.
pub fn fmt_metrics(m: &Metrics) -> String {
    match m.accuracy {
        Some(a) => format!(
            "loss {:.6}, accuracy {:.2}%{} ({} samples)",
            m.loss,
            a * 100.0,
            fmt_top_k(m.top_k),
            m.samples
        ),
        None => format!("loss {:.6} ({} samples)", m.loss, m.samples),
    }
}

/// `, top-5 99.75%` (empty without `--top-k`).
pub fn fmt_top_k(top_k: Option<(usize, f64)>) -> String {
    top_k
        .map(|(k, a)| format!(", top-{k} {:.2}%", a * 100.0))
        .unwrap_or_default()
}
