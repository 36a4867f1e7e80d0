//! Diagnostics: what the parser and checker report, in user terms, with source spans.

use crate::model::Span;
use miette::{
    GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteError, MietteSpanContents,
    SourceCode, SourceSpan, SpanContents,
};
use std::fmt;
use std::sync::Arc;

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
    /// The file itself: cannot be read, too large, not UTF-8.
    File,
}

impl Kind {
    pub fn code(self) -> &'static str {
        match self {
            Kind::Syntax => "dmc::syntax",
            Kind::Name => "dmc::name",
            Kind::Argument => "dmc::argument",
            Kind::Shape => "dmc::shape",
            Kind::Training => "dmc::training",
            Kind::File => "dmc::file",
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
    /// A consequence of an error already reported (e.g. the use of a value whose definition
    /// failed): not shown, only stops the work that depended on it.
    pub(crate) follow_on: bool,
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
            follow_on: false,
        }
    }
    /// A [`follow-on`](Error::is_follow_on) error at `span`: never shown.
    pub(crate) fn follow_on(span: Span) -> Self {
        let mut e = Error::new(Kind::Name, span, "follow-on error");
        e.follow_on = true;
        e
    }
    /// Whether this error only follows from one already reported (and is not shown).
    pub fn is_follow_on(&self) -> bool {
        self.follow_on
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
///
/// One diagnostic stands for every error found in a file: its own fields are the first error's
/// (in source order), [`Diagnostic::related`] holds the others (at most [`MAX_SHOWN`] in all) and
/// [`Diagnostic::more`] counts those left out; [`render_plain`] shows them all, and miette's
/// handlers as related diagnostics.
///
/// Rendering never fails on long input: lines longer than [`MAX_LINE_CHARS`] characters are shown
/// as windows of [`WINDOW_CHARS`] characters around the labelled positions (with the real
/// `file:line:col`), and words longer than [`MAX_WORD_CHARS`] in the texts are shortened in the
/// middle (`aaaa…aaaa`).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Diagnostic {
    pub kind: Kind,
    pub message: String,
    pub file: String,
    /// Byte range in [`Diagnostic::source_text`].
    pub span: Span,
    /// 1-based line and column (in characters; a byte-order mark is not counted) of `span.start`.
    pub line: usize,
    pub col: usize,
    pub label: String,
    pub help: Option<String>,
    pub notes: Vec<(Span, String)>,
    /// The other errors of the file, in source order (without their own `related`).
    pub related: Vec<Diagnostic>,
    /// How many more errors were found than are kept (beyond [`MAX_SHOWN`]).
    pub more: usize,
    render: RenderSource,
    /// `span` and `notes` as byte ranges of the rendered text (see [`RenderSource`]).
    render_span: Span,
    render_notes: Vec<Span>,
}

impl Diagnostic {
    /// Attaches an [`Error`] to its file. Spans are clamped into the source and onto char boundaries.
    pub fn from_error(err: Error, src: &str, file: &str) -> Self {
        Self::attach(err, &Arc::from(src), file)
    }

    /// Attaches every error of a file (see [`Diagnostic`]): they are sorted by position, repeats
    /// (the same message at the same place, e.g. from two uses of a block) and
    /// [follow-on errors](Error::is_follow_on) are left out, and at most [`MAX_SHOWN`] are kept.
    /// `None` when no error is left.
    pub fn from_errors(errs: Vec<Error>, src: &str, file: &str) -> Option<Self> {
        let mut errs: Vec<Error> = errs.into_iter().filter(|e| !e.follow_on).collect();
        // Stable: errors at one place keep the order they were found in.
        errs.sort_by_key(|e| (e.span.start, e.span.end));
        let mut seen = std::collections::HashSet::new();
        errs.retain(|e| seen.insert((e.span, e.kind, e.message.clone())));
        let more = errs.len().saturating_sub(MAX_SHOWN);
        errs.truncate(MAX_SHOWN);
        let src: Arc<str> = Arc::from(src);
        let mut all = errs.into_iter().map(|e| Self::attach(e, &src, file));
        let mut first = all.next()?;
        first.related = all.collect();
        first.more = more;
        Some(first)
    }

    /// How many errors this diagnostic reports: itself, its related ones and those left out.
    pub fn count(&self) -> usize {
        1 + self.related.len() + self.more
    }

    /// This diagnostic and its related ones, in source order.
    pub fn all(&self) -> impl Iterator<Item = &Diagnostic> {
        std::iter::once(self).chain(&self.related)
    }

    fn attach(err: Error, src: &Arc<str>, file: &str) -> Self {
        let span = clamp(err.span, src);
        let (line, col) = line_col(src, span.start);
        let notes: Vec<(Span, String)> = err
            .notes
            .into_iter()
            .map(|(s, t)| (clamp(s, src), shorten_words(&t)))
            .collect();
        let spans: Vec<Span> = std::iter::once(span)
            .chain(notes.iter().map(|(s, _)| *s))
            .collect();
        let render = RenderSource::new(file, src.clone(), &spans);
        let render_span = render.map_span(span);
        let render_notes = notes.iter().map(|(s, _)| render.map_span(*s)).collect();
        // A file error names the file: keep its path whole.
        let message = if err.kind == Kind::File {
            err.message
        } else {
            shorten_words(&err.message)
        };
        Diagnostic {
            kind: err.kind,
            message,
            file: file.to_string(),
            span,
            line,
            col,
            label: shorten_words(&err.label),
            help: err.help.as_deref().map(shorten_words),
            notes,
            related: Vec::new(),
            more: 0,
            render,
            render_span,
            render_notes,
        }
    }

    /// The source text the diagnostic refers to.
    pub fn source_text(&self) -> &str {
        &self.render.orig
    }
}

impl Diagnostic {
    fn miette_help(&self) -> Option<Box<dyn fmt::Display + '_>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn miette_labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let label = if self.label.is_empty() {
            None
        } else {
            Some(self.label.clone())
        };
        let s = self.render_span;
        let primary = LabeledSpan::new_primary_with_span(label, (s.start, s.len()));
        let notes = self
            .notes
            .iter()
            .zip(&self.render_notes)
            .map(|((_, t), s)| LabeledSpan::new_with_span(Some(t.clone()), (s.start, s.len())));
        Some(Box::new(std::iter::once(primary).chain(notes)))
    }
}

impl miette::Diagnostic for Diagnostic {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.kind.code()))
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.miette_help()
    }
    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(&self.render)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        self.miette_labels()
    }
    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        if self.related.is_empty() {
            return None;
        }
        Some(Box::new(
            self.related.iter().map(|d| d as &dyn miette::Diagnostic),
        ))
    }
}

/// One error of a [`Diagnostic`], without its related ones (how [`render_with`] draws each).
#[derive(Debug)]
struct One<'a>(&'a Diagnostic);

impl fmt::Display for One<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::error::Error for One<'_> {}

impl miette::Diagnostic for One<'_> {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.0.kind.code()))
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.0.miette_help()
    }
    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(&self.0.render)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        self.0.miette_labels()
    }
}

/// The most errors of one file a [`Diagnostic`] keeps (and [`render_plain`] shows); the others
/// are counted in [`Diagnostic::more`].
pub const MAX_SHOWN: usize = 20;

/// The most errors the parser and the checker collect: beyond, they stop, and the count of
/// errors is a lower bound.
pub const MAX_COLLECTED: usize = 1000;

/// Lines longer than this (in characters) are rendered as windows around the labelled positions:
/// miette cannot draw underlines beyond column 65,535, and a window is more readable anyway.
pub const MAX_LINE_CHARS: usize = 240;
/// Characters shown on each side of a labelled position in a windowed line.
pub const WINDOW_CHARS: usize = 32;
/// Words (runs without whitespace) longer than this in messages, labels and help are shortened.
pub const MAX_WORD_CHARS: usize = 120;

/// `text[ex..ex + len]` of the rendered text is `orig[orig..orig + len]` of the source.
#[derive(Debug, Clone, Copy)]
struct Seg {
    ex: usize,
    orig: usize,
    len: usize,
}

/// The text miette renders. Usually the source itself; otherwise a copy with the byte-order mark
/// left out, lone `\r` shown as spaces (the language does not end lines there, miette would) and
/// over-long lines cut to windows around the labelled positions, with a map back to the source so
/// that the reported column is the source's.
#[derive(Debug)]
struct RenderSource {
    name: String,
    /// Shared by the diagnostics of one file.
    orig: Arc<str>,
    /// `None`: the source is rendered as it is.
    text: Option<(String, Vec<Seg>)>,
}

impl RenderSource {
    /// The ends of `spans` (the labels) stay visible.
    fn new(name: &str, orig: Arc<str>, spans: &[Span]) -> Self {
        let bom = if orig.starts_with('\u{feff}') { 3 } else { 0 };
        let long = orig
            .split('\n')
            .any(|l| l.len() > MAX_LINE_CHARS && l.chars().count() > MAX_LINE_CHARS);
        let text = if bom > 0 || long || orig.contains('\r') {
            Some(excerpt(&orig, bom, spans))
        } else {
            None
        };
        RenderSource {
            name: name.to_string(),
            orig,
            text,
        }
    }

    fn text(&self) -> &str {
        match &self.text {
            Some((t, _)) => t,
            None => &self.orig,
        }
    }

    /// Source offset → rendered offset.
    fn map(&self, o: usize) -> usize {
        let Some((_, segs)) = &self.text else {
            return o;
        };
        let i = segs.partition_point(|s| s.orig <= o);
        match i.checked_sub(1).map(|i| segs[i]) {
            Some(s) => s.ex + (o - s.orig).min(s.len),
            None => 0,
        }
    }

    /// Rendered offset → source offset.
    fn unmap(&self, q: usize) -> usize {
        let Some((_, segs)) = &self.text else {
            return q;
        };
        let i = segs.partition_point(|s| s.ex <= q);
        match i.checked_sub(1).map(|i| segs[i]) {
            Some(s) => s.orig + (q - s.ex).min(s.len),
            None => segs.first().map_or(0, |s| s.orig),
        }
    }

    fn map_span(&self, s: Span) -> Span {
        let start = self.map(s.start);
        Span::new(start, self.map(s.end).max(start))
    }
}

impl SourceCode for RenderSource {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        let inner = self
            .text()
            .read_span(span, context_lines_before, context_lines_after)?;
        // miette counts columns in bytes of the rendered text; report the source's, in characters.
        let (_, col) = line_col(&self.orig, self.unmap(span.offset()));
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.clone(),
            inner.data(),
            *inner.span(),
            inner.line(),
            col - 1,
            inner.line_count(),
        )))
    }
}

/// Builds the rendered text of [`RenderSource`] and its map (see there).
fn excerpt(orig: &str, bom: usize, spans: &[Span]) -> (String, Vec<Seg>) {
    // Around a span's start: more before it than inside it; around its end the other way round.
    let half = WINDOW_CHARS / 2;
    let points: Vec<(usize, usize, usize)> = spans
        .iter()
        .flat_map(|s| [(s.start, WINDOW_CHARS, half), (s.end, half, WINDOW_CHARS)])
        .collect();
    let mut text = String::new();
    let mut segs: Vec<Seg> = Vec::new();
    let bytes = orig.as_bytes();
    // Copies `orig[a..b]` (lone `\r` as spaces) and records where it came from.
    let mut copy = |text: &mut String, a: usize, b: usize| {
        if a >= b {
            return;
        }
        let ex = text.len();
        let piece = &orig[a..b];
        if piece.contains('\r') {
            for (i, c) in piece.char_indices() {
                let lone = c == '\r' && bytes.get(a + i + 1) != Some(&b'\n');
                text.push(if lone { ' ' } else { c });
            }
        } else {
            text.push_str(piece);
        }
        match segs.last_mut() {
            Some(s) if s.ex + s.len == ex && s.orig + s.len == a => s.len += b - a,
            _ => segs.push(Seg {
                ex,
                orig: a,
                len: b - a,
            }),
        }
    };
    let mut ls = bom;
    loop {
        let le = orig[ls..].find('\n').map_or(orig.len(), |i| ls + i);
        let line = &orig[ls..le];
        if line.len() <= MAX_LINE_CHARS || line.chars().count() <= MAX_LINE_CHARS {
            copy(&mut text, ls, le);
        } else {
            // Windows around the points on this line, merged where they touch.
            let mut wins: Vec<(usize, usize)> = points
                .iter()
                .filter(|(p, _, _)| (ls..=le).contains(p) && orig.is_char_boundary(*p))
                .map(|&(p, before, after)| {
                    let a = orig[ls..p]
                        .char_indices()
                        .rev()
                        .nth(before - 1)
                        .map_or(ls, |(i, _)| ls + i);
                    let b = orig[p..le]
                        .char_indices()
                        .nth(after)
                        .map_or(le, |(i, _)| p + i);
                    (a, b)
                })
                .collect();
            if wins.is_empty() {
                let b = line
                    .char_indices()
                    .nth(2 * WINDOW_CHARS)
                    .map_or(le, |(i, _)| ls + i);
                wins.push((ls, b));
            }
            wins.sort_unstable();
            let mut merged: Vec<(usize, usize)> = Vec::new();
            for (a, b) in wins {
                match merged.last_mut() {
                    Some(m) if a <= m.1 => m.1 = m.1.max(b),
                    _ => merged.push((a, b)),
                }
            }
            let mut at = ls;
            for (a, b) in merged {
                if a > at {
                    text.push('…');
                }
                copy(&mut text, a, b);
                at = b;
            }
            if at < le {
                text.push('…');
            }
        }
        if le >= orig.len() {
            break;
        }
        copy(&mut text, le, le + 1);
        ls = le + 1;
    }
    (text, segs)
}

/// Shortens every run of more than [`MAX_WORD_CHARS`] non-whitespace characters to its first and
/// last characters around `…`, so a 70,000-character name does not flood the terminal.
pub fn shorten_words(s: &str) -> String {
    if s.len() <= MAX_WORD_CHARS {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len().min(4 * 1024));
    let mut word: Vec<char> = Vec::new();
    let flush = |out: &mut String, word: &mut Vec<char>| {
        if word.len() > MAX_WORD_CHARS {
            let head = MAX_WORD_CHARS / 2;
            let tail = MAX_WORD_CHARS / 4;
            out.extend(&word[..head]);
            out.push('…');
            out.extend(&word[word.len() - tail..]);
        } else {
            out.extend(word.iter());
        }
        word.clear();
    };
    for c in s.chars() {
        if c.is_whitespace() {
            flush(&mut out, &mut word);
            out.push(c);
        } else {
            word.push(c);
        }
    }
    flush(&mut out, &mut word);
    out
}

/// 1-based (line, column) of a byte offset; the column counts characters, not counting a
/// byte-order mark at the start of the file.
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = floor_boundary(src, offset.min(src.len()));
    let before = &src[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let mut col = before[line_start..].chars().count() + 1;
    if line_start == 0 && before.starts_with('\u{feff}') {
        col -= 1;
    }
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

/// Renders a diagnostic with a given miette theme (e.g. coloured for a terminal). A problem with
/// the file as a whole (it cannot be read, is a directory or too large: there is no text to show)
/// is one line, `error: <message>`, and its help.
pub fn render_with(diag: &Diagnostic, theme: GraphicalTheme) -> String {
    if diag.kind == Kind::File && diag.source_text().is_empty() {
        let mut out = format!("error: {}\n", diag.message);
        if let Some(h) = &diag.help {
            out.push_str(&format!("  help: {h}\n"));
        }
        return out;
    }
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(100)
        .with_links(false)
        .without_syntax_highlighting();
    let mut out = String::new();
    for (i, d) in diag.all().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let mut one = String::new();
        if handler.render_report(&mut one, &One(d)).is_err() {
            one = format!("{}:{}:{}: {}\n", d.file, d.line, d.col, d.message);
        }
        out.push_str(&one);
    }
    let n = diag.count();
    if n > 1 {
        // Checking stopped there: there may be more.
        let least = if n >= MAX_COLLECTED { "at least " } else { "" };
        if diag.more > 0 {
            let s = if diag.more == 1 { "" } else { "s" };
            out.push_str(&format!("\n... and {least}{} more error{s}\n", diag.more));
        }
        out.push_str(&format!("\n{least}{n} errors in {}\n", diag.file));
    }
    out
}
