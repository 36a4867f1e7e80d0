//! The dmc model language: AST, parser, shape checker and diagnostics.
//!
//! Entry point: [`compile_source`] turns the text of a `.dm` file into a checked [`model::Model`]
//! or a [`Diagnostic`]; [`render_plain`] renders a diagnostic; [`summary::summary_text`] and
//! [`summary::summary_json`] describe a model.
// `Diagnostic` carries its source text so it can be rendered anywhere; it is returned by value
// because that is the crate's documented contract (`Result<Model, Diagnostic>`).
#![allow(clippy::result_large_err)]
pub mod ast;
pub mod check;
pub mod diag;
pub mod model;
pub mod parser;
pub mod summary;

pub use diag::{render_plain, render_with, Diagnostic, Kind};
pub use model::Model;
pub use summary::{summary_json, summary_text};

/// Parses and checks a program. `file` is the name shown in diagnostics.
pub fn compile_source(src: &str, file: &str) -> Result<Model, Diagnostic> {
    let prog = parser::parse(src).map_err(|e| Diagnostic::from_error(e, src, file))?;
    check::check(&prog, src).map_err(|e| Diagnostic::from_error(e, src, file))
}

/// Parses a program without checking it.
pub fn parse_source(src: &str, file: &str) -> Result<ast::Program, Diagnostic> {
    parser::parse(src).map_err(|e| Diagnostic::from_error(e, src, file))
}

/// Reads a `.dm` file and compiles it. I/O errors become a diagnostic without a span.
pub fn compile_file(path: &std::path::Path) -> Result<Model, Diagnostic> {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(src) => compile_source(&src, &file),
        Err(e) => Err(Diagnostic::from_error(
            diag::Error::new(
                Kind::Syntax,
                model::Span::default(),
                format!("cannot read `{file}`: {e}"),
            ),
            "",
            &file,
        )),
    }
}
