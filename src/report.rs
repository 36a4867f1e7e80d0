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
    /// The program cannot be compiled (e.g. the memory cap cannot be met).
    #[error(transparent)]
    Compile(Box<dmc_compiler::CompileError>),
    /// The backend failed.
    #[error(transparent)]
    Runtime(Box<dmc_runtime::RuntimeError>),
    /// Reading or writing data/weights failed.
    #[error(transparent)]
    Io(Box<dmc_runtime::io::IoError>),
    /// A bad combination of flags or data.
    #[error("{0}")]
    Usage(String),
    /// Training stopped (NaN/Inf loss).
    #[error("{0}")]
    Training(String),
    /// Stopped by a signal (Ctrl-C, SIGTERM, SIGHUP); says when and what was saved.
    #[error("interrupted {0}")]
    Interrupted(String),
}

impl CliError {
    /// The process exit code: 130 after a signal, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Interrupted(_) => 130,
            _ => 1,
        }
    }
}

// The large errors are boxed, so a `Result<_, CliError>` stays small.
impl From<dmc_compiler::CompileError> for CliError {
    fn from(e: dmc_compiler::CompileError) -> Self {
        CliError::Compile(Box::new(e))
    }
}

impl From<dmc_runtime::RuntimeError> for CliError {
    fn from(e: dmc_runtime::RuntimeError) -> Self {
        CliError::Runtime(Box::new(e))
    }
}

impl From<dmc_runtime::cuda::CudaError> for CliError {
    fn from(e: dmc_runtime::cuda::CudaError) -> Self {
        CliError::Runtime(Box::new(e.into()))
    }
}

impl From<dmc_runtime::io::IoError> for CliError {
    fn from(e: dmc_runtime::io::IoError) -> Self {
        CliError::Io(Box::new(e))
    }
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
        other => eprintln!("error: {other}"),
    }
}
