//! Diagnostics: what the parser and checker report, in user terms, with source spans.

use crate::model::Span;
use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, SourceCode};
use std::fmt;

/// Category of a diagnostic; shown as its code (`dmc::syntax`, `dmc::shape`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The text does not follow the grammar.
    Syntax,
    /// Unknown or duplicate names, recursion.
    Name,
    /// Wrong arguments: count, type, unknown keyword, out-of-range value.
    Argument,
    /// Shapes that do not fit together.
    Shape,
    /// Loss and train section.
    Training,
}

impl Kind {
    pub fn code(self) -> &'static str {
        match self {
            Kind::Syntax => "dmc::syntax",
            Kind::Name => "dmc::name",
            Kind::Argument => "dmc::argument",
            Kind::Shape => "dmc::shape",
            Kind::Training => "dmc::training",
        }
    }
}

/// An error found in a program, before it is attached to its file (see [`Diagnostic`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    pub kind: Kind,
    pub message: String,
    pub span: Span,
    /// Text under the caret.
    pub label: String,
    pub help: Option<String>,
    /// Secondary spans ("the call started here", "first defined here").
    pub notes: Vec<(Span, String)>,
}

impl Error {
    pub fn new(kind: Kind, span: Span, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            span,
            label: String::new(),
            help: None,
            notes: Vec::new(),
        }
    }
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
    pub fn note(mut self, span: Span, text: impl Into<String>) -> Self {
        self.notes.push((span, text.into()));
        self
    }
}

/// A diagnostic attached to its source file: implements [`miette::Diagnostic`] and
/// [`std::error::Error`]. Render it with [`render_plain`] or any miette handler.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Diagnostic {
    pub kind: Kind,
    pub message: String,
    pub file: String,
    pub span: Span,
    /// 1-based line and column (in characters) of `span.start`.
    pub line: usize,
    pub col: usize,
    pub label: String,
    pub help: Option<String>,
    pub notes: Vec<(Span, String)>,
    src_code: NamedSource<String>,
}

impl Diagnostic {
    /// Attaches an [`Error`] to its file. Spans are clamped into the source and onto char boundaries.
    pub fn from_error(err: Error, src: &str, file: &str) -> Self {
        let span = clamp(err.span, src);
        let (line, col) = line_col(src, span.start);
        Diagnostic {
            kind: err.kind,
            message: err.message,
            file: file.to_string(),
            span,
            line,
            col,
            label: err.label,
            help: err.help,
            notes: err
                .notes
                .into_iter()
                .map(|(s, t)| (clamp(s, src), t))
                .collect(),
            src_code: NamedSource::new(file, src.to_string()),
        }
    }

    /// The source text the diagnostic refers to.
    pub fn source_text(&self) -> &str {
        self.src_code.inner()
    }
}

impl miette::Diagnostic for Diagnostic {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.kind.code()))
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }
    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(&self.src_code)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let label = if self.label.is_empty() {
            None
        } else {
            Some(self.label.clone())
        };
        let primary = LabeledSpan::new_primary_with_span(label, (self.span.start, self.span.len()));
        let notes = self
            .notes
            .iter()
            .map(|(s, t)| LabeledSpan::new_with_span(Some(t.clone()), (s.start, s.len())));
        Some(Box::new(std::iter::once(primary).chain(notes)))
    }
}

/// 1-based (line, column) of a byte offset; the column counts characters.
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = floor_boundary(src, offset.min(src.len()));
    let before = &src[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

fn floor_boundary(src: &str, mut i: usize) -> usize {
    while i > 0 && !src.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn clamp(span: Span, src: &str) -> Span {
    let start = floor_boundary(src, span.start.min(src.len()));
    let end = floor_boundary(src, span.end.min(src.len())).max(start);
    Span::new(start, end)
}

/// Renders a diagnostic as plain text: no colours, no terminal detection, fixed width (100).
/// Contains `file:line:col`, the source line with an underline, the message, the labels and the help.
pub fn render_plain(diag: &Diagnostic) -> String {
    render_with(diag, GraphicalTheme::unicode_nocolor())
}

/// Renders a diagnostic with a given miette theme (e.g. coloured for a terminal).
pub fn render_with(diag: &Diagnostic, theme: GraphicalTheme) -> String {
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(100)
        .with_links(false)
        .without_syntax_highlighting();
    let mut out = String::new();
    if handler.render_report(&mut out, diag).is_err() {
        out = format!("{}:{}:{}: {}", diag.file, diag.line, diag.col, diag.message);
    }
    out
}
