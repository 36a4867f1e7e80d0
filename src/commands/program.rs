//! Reading a `.dm` program, for every command that takes one.

use std::path::Path;

use crate::report::CliError;

/// Reads and checks a `.dm` file. Reading is bounded (`dmc_grammar::MAX_SOURCE_BYTES`); unreadable,
/// oversized and non-UTF-8 files are diagnostics.
pub fn load_model(path: &Path) -> Result<dmc_grammar::Model, CliError> {
    Ok(dmc_grammar::compile_file(path)?)
}
