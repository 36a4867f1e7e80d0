//! Error reporting for the CLI, in one place: the miette hook, and how errors are printed.

use dmc_grammar::Diagnostic;
use std::io::IsTerminal;

/// Errors a command can end with. Everything is printed to stderr and exits with code 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A problem in a `.dm` program, with its source location.
    #[error(transparent)]
    Program(Box<Diagnostic>),
    /// Anything else (I/O, bad flags), as a plain message.
    #[error("{0}")]
    Message(String),
}

impl From<Diagnostic> for CliError {
    fn from(d: Diagnostic) -> Self {
        CliError::Program(Box::new(d))
    }
}

/// Installs miette's report hook (coloured output only when stderr is a terminal).
pub fn install() {
    let color = std::io::stderr().is_terminal();
    let _ = miette::set_hook(Box::new(move |_| {
        Box::new(
            miette::MietteHandlerOpts::new()
                .color(color)
                .unicode(color)
                .width(100)
                .build(),
        )
    }));
}

/// Prints an error to stderr: a rendered diagnostic, or `error: <message>`.
pub fn print_error(e: &CliError) {
    match e {
        CliError::Program(d) => {
            let text = if std::io::stderr().is_terminal() {
                dmc_grammar::render_with(d, miette::GraphicalTheme::unicode())
            } else {
                dmc_grammar::render_plain(d)
            };
            eprint!("{text}");
            if !text.ends_with('\n') {
                eprintln!();
            }
        }
        CliError::Message(m) => eprintln!("error: {m}"),
    }
}
