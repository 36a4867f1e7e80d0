//! The data of `run`, `eval` and `predict` (and `dmc data`): `--data` or the seeded synthetic set,
//! the seed and the task a program implies, and feeding one batch at a time into a backend.

use std::path::Path;

use dmc_compiler::op::DType;
use dmc_compiler::plan::Plan;
use dmc_grammar::model::{Layer, LossTerm, Model, ValueRef};
use dmc_runtime::io::{Dataset, LoadOptions, Task, TensorRole, TensorSpec};
use dmc_runtime::{Backend, InputData};

use super::args::CommonArgs;
use crate::report::CliError;

const DEFAULT_SEED: u64 = 0;

/// The seed of a command: `--seed`, else the program's `train { seed }`, else 0.
pub fn seed_or_default(explicit: Option<u64>, model: &Model) -> u64 {
    explicit.or(model.train.seed).unwrap_or(DEFAULT_SEED)
}

/// What the program learns: classification (cross-entropy over its classes) or regression.
/// With several `cross_entropy` terms the labels are drawn from the fewest classes, valid for
/// every term.
pub fn task_of(model: &Model) -> Task {
    if let Some((_, vocab)) = token_inputs(model).first() {
        return Task::NextToken { vocab: *vocab };
    }
    model
        .loss
        .terms
        .iter()
        .filter(|t| t.kind.takes_labels())
        .map(|t| classes_of(model, t))
        .min()
        .map_or(Task::Regression, |classes| Task::Classification { classes })
}

/// The integer inputs (tokens) of `model` and the vocabulary of the embedding that reads each (the
/// smallest, when several do).
pub fn token_inputs(model: &Model) -> Vec<(&str, usize)> {
    let mut out: Vec<(&str, usize)> = vec![];
    for node in &model.nodes {
        if let (Layer::Embedding { vocab, .. }, [ValueRef::Input(i)]) =
            (&node.layer, &node.inputs[..])
        {
            let Some(d) = model.inputs.get(*i) else {
                continue;
            };
            match out.iter_mut().find(|(n, _)| *n == d.name) {
                Some((_, v)) => *v = (*v).min(*vocab),
                None => out.push((&d.name, *vocab)),
            }
        }
    }
    out
}

/// The class count of a classification term (its logits' last axis).
fn classes_of(model: &Model, t: &LossTerm) -> usize {
    model.shape(t.pred).last().copied().unwrap_or(1)
}

/// How [`Dataset::synthetic`] makes its data for `task`, for the messages that announce it.
pub fn describe_synthetic(task: Task) -> String {
    let targets = match task {
        Task::Classification { classes } => {
            format!("labels from a random linear teacher over {classes} classes")
        }
        Task::Regression => "targets from a random linear teacher".to_string(),
        Task::NextToken { vocab } => {
            return format!("next-token windows of a random Markov chain over {vocab} tokens")
        }
    };
    format!("inputs ~ U[0,1), {targets}")
}

/// A data set to load: `data` (the `--data` syntax) or, without it, `synthetic_samples` samples
/// of the seeded synthetic set, with the tensors `plan` binds.
#[derive(Debug, Clone, Copy)]
pub struct DataRequest<'a> {
    pub plan: &'a Plan,
    pub model: &'a Model,
    pub data: Option<&'a str>,
    /// `--scale NAME=FACTOR` of the inputs.
    pub scales: &'a [(String, f32)],
    pub synthetic_samples: usize,
    pub seed: u64,
    /// No notes on stderr.
    pub quiet: bool,
    /// Load the targets too (not for `predict`); class labels are then range-checked.
    pub with_targets: bool,
}

impl<'a> DataRequest<'a> {
    /// `--data` of `common` (else `synthetic_samples` synthetic samples), inputs and targets.
    pub fn new(
        common: &'a CommonArgs,
        plan: &'a Plan,
        model: &'a Model,
        synthetic_samples: usize,
        seed: u64,
    ) -> Self {
        DataRequest {
            plan,
            model,
            data: common.data.as_deref(),
            scales: &common.scale,
            synthetic_samples,
            seed,
            quiet: common.quiet,
            with_targets: true,
        }
    }

    /// Loads the data, or makes the seeded synthetic data set (announced).
    pub fn load(&self) -> Result<Dataset, CliError> {
        let mut specs = TensorSpec::from_plan(self.plan);
        if !self.with_targets {
            specs.retain(|s| s.role == TensorRole::Input);
        }
        let ds = match self.data {
            Some(d) => {
                let opts = LoadOptions {
                    scales: self.scales.to_vec(),
                };
                let ds = Dataset::load_with(Path::new(d), &specs, &opts)?;
                if !ds.ignored().is_empty() && !self.quiet {
                    eprintln!(
                        "note: ignoring tensors not used by the program: {}",
                        ds.ignored().join(", ")
                    );
                }
                ds
            }
            None => {
                if let Some((name, _)) = self.scales.first() {
                    return Err(CliError::Usage(format!(
                        "--scale {name}=...: there is no --data to scale (the synthetic data is f32 already); pass --data FILE or drop --scale"
                    )));
                }
                let (samples, seed) = (self.synthetic_samples, self.seed);
                let task = task_of(self.model);
                if !self.quiet {
                    eprintln!(
                        "no --data given: using a seeded synthetic data set ({samples} samples, {}, seed {seed}; `dmc data` writes it to a file)",
                        describe_synthetic(task)
                    );
                }
                Dataset::synthetic(&specs, samples, seed, task)?
            }
        };
        // Tokens against the vocabulary of the embedding that reads them.
        for (name, vocab) in token_inputs(self.model) {
            ds.check_classes(name, vocab)?;
        }
        if self.with_targets {
            // Each term's labels against its own class count.
            for t in self
                .model
                .loss
                .terms
                .iter()
                .filter(|t| t.kind.takes_labels())
            {
                let Some(name) = self.model.target_name(t.target) else {
                    continue;
                };
                if specs.iter().any(|s| {
                    s.name == name && s.role == TensorRole::Target && s.dtype == DType::I32
                }) {
                    ds.check_classes(name, classes_of(self.model, t))?;
                }
            }
        }
        Ok(ds)
    }
}

/// Feeds one batch of a data set (the samples `idx`) into the backend's input (and target) buffers.
pub struct Feeder {
    f32_buf: Vec<Vec<f32>>,
    i32_buf: Vec<Vec<i32>>,
    specs: Vec<(String, DType, usize)>,
}

impl Feeder {
    pub fn new(plan: &Plan, with_targets: bool) -> Feeder {
        let bindings = plan
            .inputs
            .iter()
            .chain(if with_targets { &plan.targets[..] } else { &[] });
        let specs: Vec<(String, DType, usize)> = bindings
            .map(|b| (b.name.clone(), b.dtype, b.shape.iter().product()))
            .collect();
        let f32_buf = specs
            .iter()
            .map(|(_, d, n)| vec![0.0; if *d == DType::F32 { *n } else { 0 }])
            .collect();
        let i32_buf = specs
            .iter()
            .map(|(_, d, n)| vec![0; if *d == DType::I32 { *n } else { 0 }])
            .collect();
        Feeder {
            f32_buf,
            i32_buf,
            specs,
        }
    }

    pub fn feed(
        &mut self,
        be: &mut dyn Backend,
        ds: &Dataset,
        idx: &[usize],
    ) -> Result<(), CliError> {
        for (i, (name, dtype, _)) in self.specs.iter().enumerate() {
            match dtype {
                DType::I32 => {
                    ds.fill_i32(name, idx, &mut self.i32_buf[i])?;
                    be.set_input(name, InputData::I32(&self.i32_buf[i]))?;
                }
                _ => {
                    ds.fill_f32(name, idx, &mut self.f32_buf[i])?;
                    be.set_input(name, InputData::F32(&self.f32_buf[i]))?;
                }
            }
        }
        Ok(())
    }
}
