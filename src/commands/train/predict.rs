//! `dmc predict`: the network's outputs for the given inputs, written to a .safetensors or .npy
//! file, one row per sample.

use dmc_compiler::plan::Mode;
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
    let plan = compile(&model, c, &c.plan, Mode::Predict)?;
    let batch = plan.batch;
    let ds = DataRequest {
        with_targets: false,
        ..DataRequest::new(c, &plan, &model, args.synthetic_samples, seed)
    }
    .load()?;
    let mut be = dmc_runtime::open_backend(kind, plan.clone(), &c.codegen.options())?;
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
    let mut shape = vec![ds.len()];
    shape.extend_from_slice(&plan.output.shape[1..]);
    io::write_tensor(&args.output, &plan.output.name, &shape, &out)?;
    println!(
        "wrote {} predictions of shape {:?} to {}",
        ds.len(),
        &shape[1..],
        args.output.display()
    );
    Ok(())
}
