//! `dmc summary FILE [--json]`

use super::program::load_model;
use crate::report::CliError;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The .dm program.
    pub file: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<(), CliError> {
    let model = load_model(&args.file)?;
    if args.json {
        let v = dmc_grammar::summary_json(&model);
        let text =
            serde_json::to_string_pretty(&v).map_err(|e| CliError::Message(e.to_string()))?;
        println!("{text}");
    } else {
        print!("{}", dmc_grammar::summary_text(&model));
    }
    Ok(())
}
