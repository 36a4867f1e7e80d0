//! `dmc check FILE`

use super::program::load_model;
use crate::report::CliError;
use std::path::PathBuf;
use thousands::Separable;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The .dm program.
    pub file: PathBuf,
}

pub fn run(args: Args) -> Result<(), CliError> {
    let model = load_model(&args.file)?;
    println!(
        "{}: ok ({} layers, {} parameters)",
        args.file.display(),
        model.nodes.len(),
        model.param_count().separate_with_commas()
    );
    Ok(())
}
