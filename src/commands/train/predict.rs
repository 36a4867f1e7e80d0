//! `dmc predict`: the network's outputs for the given inputs, written to a .safetensors or .npy
//! file, one row per sample.

use dmc_compiler::plan::Mode;
use dmc_grammar::model::LossKind;
use dmc_runtime::io;
use dmc_runtime::Backend;

use super::args::PredictArgs;
use super::dataset::{seed_or_default, DataRequest, Feeder};
use super::setup::{compile, init_params, resolve_device};
use crate::commands::program::load_model;
use crate::report::CliError;

/// `dmc predict`.
pub fn run(args: &PredictArgs) -> Result<(), CliError> {
    let c = &args.common;
    let kind = resolve_device(c.device, c.quiet)?;
    let model = load_model(&c.file)?;
    io::check_writable(&args.output)?;
    if c.init.is_none() && !c.quiet {
        eprintln!("warning: no --init given: predicting with freshly initialised weights");
    }
    let seed = seed_or_default(c.seed, &model);
    let plan = compile(&model, c, &c.inference_plan("predict")?, Mode::Predict)?;
    let batch = plan.batch;
    let ds = DataRequest {
        with_targets: false,
        ..DataRequest::new(c, &plan, &model, args.synthetic_samples, seed)
    }
    .load()?;
    let mut be = dmc_runtime::open_backend(kind, plan.clone(), &c.codegen.options(&plan))?;
    init_params(&mut be, c.init.as_deref(), seed, &c.file)?;
    let mut feeder = Feeder::new(&plan, false);
    let per: usize = plan.output.shape[1..].iter().product::<usize>().max(1);
    let mut out = Vec::with_capacity(ds.len() * per);
    let epoch = ds.in_order_padded(batch)?;
    for b in 0..epoch.num_batches() {
        feeder.feed(&mut be, &ds, epoch.batch(b))?;
        be.run(1, seed)?;
        out.extend_from_slice(&be.output()?[..epoch.valid(b) * per]);
    }
    if args.softmax {
        for row in out.chunks_mut(per) {
            softmax(row);
        }
    }
    let mut shape = vec![ds.len()];
    shape.extend_from_slice(&plan.output.shape[1..]);
    io::write_tensor(&args.output, &plan.output.name, &shape, &out)?;
    let what = match (args.softmax, model.loss.output_term().kind) {
        (true, _) => "probabilities: the softmax of each row".to_string(),
        (false, LossKind::CrossEntropy { .. }) => format!(
            "logits: `{}` before the softmax the loss applies; --softmax writes probabilities",
            plan.output.name
        ),
        (false, LossKind::BceWithLogits) => format!(
            "logits: `{}` before the sigmoid the loss applies",
            plan.output.name
        ),
        (false, LossKind::Mse | LossKind::Mae | LossKind::Huber { .. }) => {
            format!("the values of `{}`", plan.output.name)
        }
    };
    println!(
        "wrote {} predictions of shape {:?} to {} ({what})",
        ds.len(),
        &shape[1..],
        args.output.display()
    );
    Ok(())
}

/// `row` replaced by its softmax, computed stably (the maximum subtracted first, in f64).
fn softmax(row: &mut [f32]) {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
    for v in row.iter_mut() {
        *v = ((*v as f64 - m).exp() / sum) as f32;
    }
}
