//! `dmc eval`: loss and (for classification) accuracy, and `--top-k` accuracy, of weights on a data set.

use dmc_compiler::plan::Mode;

use super::args::EvalArgs;
use super::dataset::{seed_or_default, DataRequest};
use super::metrics::{check_top_k, evaluate, fmt_metrics};
use super::setup::{compile, init_params, resolve_device};
use crate::commands::program::load_model;
use crate::report::CliError;

/// `dmc eval`.
pub fn run(args: &EvalArgs) -> Result<(), CliError> {
    let c = &args.common;
    let kind = resolve_device(c.device, c.quiet)?;
    let model = load_model(&c.file)?;
    if c.init.is_none() && !c.quiet {
        eprintln!("warning: no --init given: evaluating freshly initialised weights");
    }
    let seed = seed_or_default(c.seed, &model);
    let plan = compile(&model, c, &c.inference_plan("eval")?, Mode::Eval)?;
    check_top_k(args.top_k, &model, &plan)?;
    let batch = plan.batch;
    let ds = DataRequest::new(c, &plan, &model, args.synthetic_samples, seed).load()?;
    let cg = c.codegen.options(&plan);
    let mut be = dmc_runtime::open_backend(kind, plan, &cg)?;
    init_params(&mut be, c.init.as_deref(), seed, &c.file)?;
    let m = evaluate(&mut be, &model, &ds, batch, args.top_k)?;
    println!("{}", fmt_metrics(&m));
    Ok(())
}
