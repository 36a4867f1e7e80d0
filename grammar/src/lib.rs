//! The dmc model language: AST, parser, shape checker and diagnostics.
//!
//! Entry point: [`compile_source`] turns the text of a `.dm` file into a checked [`model::Model`]
//! or a [`Diagnostic`] (with every error of the file); [`render_plain`] renders a diagnostic; [`summary::summary_text`] and
//! [`summary::summary_json`] describe a model.
//!
//! Modules: [`lexer`] and [`parser`] (text to [`ast`]), [`check`] (AST to [`model::Model`]),
//! [`layers`] (the table of layer operations the checker builds from), [`limits`], [`diag`],
//! [`summary`].
// `Diagnostic` carries its source text so it can be rendered anywhere; it is returned by value
// because that is the crate's documented contract (`Result<Model, Diagnostic>`).
#![allow(clippy::result_large_err)]
pub mod ast;
pub mod check;
pub mod diag;
pub mod init;
pub mod layers;
pub mod lexer;
pub mod limits;
pub mod model;
pub mod parser;
pub mod summary;

pub use diag::{render_plain, render_with, Diagnostic, Kind};
pub use model::Model;
pub use summary::{summary_json, summary_text};

/// Parses and checks a program. `file` is the name shown in diagnostics. The diagnostic holds
/// every syntax error (a program with one is not checked) or every error the checker found (see
/// [`Diagnostic`]: the first, and the others in [`Diagnostic::related`]).
pub fn compile_source(src: &str, file: &str) -> Result<Model, Diagnostic> {
    let prog = parse_source(src, file)?;
    check::check_all(&prog, src).map_err(|errs| diagnostic(errs, src, file))
}

/// Parses a program without checking it; the diagnostic holds every syntax error found (one per
/// statement in error).
pub fn parse_source(src: &str, file: &str) -> Result<ast::Program, Diagnostic> {
    parser::parse_all(src).map_err(|errs| diagnostic(errs, src, file))
}

/// The diagnostic of the errors `errs` (at least one) of `src`.
fn diagnostic(errs: Vec<diag::Error>, src: &str, file: &str) -> Diagnostic {
    Diagnostic::from_errors(errs, src, file).unwrap_or_else(|| {
        let e = diag::Error::new(
            Kind::Name,
            model::Span::default(),
            "internal error: no error reported",
        );
        Diagnostic::from_error(e, src, file)
    })
}

/// The largest `.dm` program accepted, in bytes (16 MiB): a program is a few kilobytes; a larger
/// file is almost certainly not one, and reading it whole could exhaust memory.
pub const MAX_SOURCE_BYTES: u64 = 16 * 1024 * 1024;

/// Reads a `.dm` file and compiles it. Reading problems are diagnostics too (see [`read_source`]).
pub fn compile_file(path: &std::path::Path) -> Result<Model, Diagnostic> {
    let src = read_source(path)?;
    compile_source(&src, &path.display().to_string())
}

/// Reads the text of a `.dm` program, never more than [`MAX_SOURCE_BYTES`] + 1 bytes (also from a
/// FIFO or a device such as `/dev/zero`). Fails with a [`Kind::File`] diagnostic when the path
/// cannot be read or is a directory, when the file is larger than [`MAX_SOURCE_BYTES`], and when it
/// is not UTF-8 (at the line and column of the first invalid byte).
pub fn read_source(path: &std::path::Path) -> Result<String, Diagnostic> {
    read_source_limited(path, MAX_SOURCE_BYTES)
}

/// [`read_source`] with another limit (tests).
pub fn read_source_limited(path: &std::path::Path, limit: u64) -> Result<String, Diagnostic> {
    use std::io::Read;
    let file = path.display().to_string();
    let fail = |msg: String, help: &str| {
        Diagnostic::from_error(
            diag::Error::new(Kind::File, model::Span::default(), msg).help(help),
            "",
            &file,
        )
    };
    let th = |n: u64| thousands::Separable::separate_with_commas(&n);
    let too_large = |size: Option<u64>| {
        let size = match size {
            Some(n) => format!("{} bytes", th(n)),
            None => format!("more than {} bytes", th(limit)),
        };
        #[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; MSRV is 1.80
        let mib = if limit % (1 << 20) == 0 {
            format!(" ({} MiB)", limit >> 20)
        } else {
            String::new()
        };
        fail(
            format!(
                "`{file}` is too large ({size}); a .dm program is at most {} bytes{mib}",
                th(limit)
            ),
            "check that this is the .dm program you meant (a program is plain text)",
        )
    };
    let cannot = |e: std::io::Error| {
        fail(
            format!("cannot read `{file}`: {e}"),
            "check the path and its permissions",
        )
    };
    let meta = std::fs::metadata(path).map_err(cannot)?;
    if meta.is_dir() {
        return Err(fail(
            format!("`{file}` is a directory, not a .dm file"),
            "pass the path of a .dm program",
        ));
    }
    if meta.is_file() && meta.len() > limit {
        return Err(too_large(Some(meta.len())));
    }
    // Devices and FIFOs report no useful size (and a regular file may grow): read at most
    // `limit + 1` bytes, so more than `limit` is known without reading on.
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limit.saturating_add(1)).read_to_end(&mut bytes))
        .map_err(cannot)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(None));
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let bad = e.as_bytes()[at];
        // Show the text decoded lossily: up to `at` it is the file's, and the invalid byte
        // becomes the one U+FFFD replacement character the label points at.
        let shown = String::from_utf8_lossy(e.as_bytes()).into_owned();
        let (line, col) = diag::line_col(&shown, at);
        Diagnostic::from_error(
            diag::Error::new(
                Kind::File,
                model::Span::new(at, at + '\u{fffd}'.len_utf8()),
                format!(
                    "`{file}` is not valid UTF-8 (byte 0x{bad:02X} at {line}:{col}, byte offset {at})"
                ),
            )
            .label("not UTF-8")
            .help("save the file as UTF-8 (a .dm program is plain text)"),
            &shown,
            &file,
        )
    })
}
