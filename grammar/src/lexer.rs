//! Lexer of the `.dm` language (nom 8): tokens with their byte spans, produced one at a time on
//! demand.
//!
//! The lexer uses nom combinators over `&str` and records byte spans as
//! `original_len - rest_len`.

use crate::ast::Span;
use crate::diag::{Error, Kind};
use nom::branch::alt;
use nom::bytes::complete::{tag, take_while, take_while1};
use nom::character::complete::{char as ch, digit0, digit1, one_of};
use nom::combinator::{opt, recognize};
use nom::{IResult, Parser};

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Ident(String),
    Int(i64),
    Float(f64),
    /// Punctuation: `(` `)` `[` `]` `{` `}` `,` `:` `=` `+` `-` `;` `|>`
    Punct(&'static str),
    Eof,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub tok: Tok,
    pub span: Span,
}

pub(crate) fn describe(t: &Tok) -> String {
    match t {
        Tok::Ident(s) if is_keyword(s) => format!("keyword `{s}`"),
        Tok::Ident(s) => format!("`{s}`"),
        Tok::Int(i) => format!("number `{i}`"),
        Tok::Float(f) => format!("number `{f:?}`"),
        Tok::Punct(p) => format!("`{p}`"),
        Tok::Eof => "end of file".to_string(),
    }
}

const KEYWORDS: &[&str] = &[
    "input", "target", "block", "return", "loss", "train", "repeat", "as",
];

pub(crate) fn is_keyword(s: &str) -> bool {
    KEYWORDS.contains(&s)
}

fn ident(i: &str) -> IResult<&str, &str> {
    recognize((
        take_while1(|c: char| c.is_ascii_alphabetic() || c == '_'),
        take_while(|c: char| c.is_ascii_alphanumeric() || c == '_'),
    ))
    .parse(i)
}

fn number(i: &str) -> IResult<&str, &str> {
    recognize((
        digit1,
        opt((ch('.'), digit0)),
        opt((one_of("eE"), opt(one_of("+-")), digit1)),
    ))
    .parse(i)
}

fn punct(i: &str) -> IResult<&str, &str> {
    alt((
        tag("|>"),
        tag("("),
        tag(")"),
        tag("["),
        tag("]"),
        tag("{"),
        tag("}"),
        tag(","),
        tag(":"),
        tag("="),
        tag("+"),
        tag("*"),
        tag("-"),
        tag(";"),
    ))
    .parse(i)
}

/// Whitespace and `#` comments.
fn trivia(i: &str) -> IResult<&str, ()> {
    let mut rest = i;
    loop {
        let (r, _) = take_while(|c: char| c.is_whitespace()).parse(rest)?;
        rest = r;
        if rest.starts_with('#') {
            let (r, _) = take_while(|c: char| c != '\n').parse(rest)?;
            rest = r;
        } else {
            return Ok((rest, ()));
        }
    }
}

fn intern_punct(p: &str) -> &'static str {
    const ALL: &[&str] = &[
        "|>", "(", ")", "[", "]", "{", "}", ",", ":", "=", "+", "*", "-", ";",
    ];
    ALL.iter().copied().find(|q| *q == p).unwrap_or("?")
}

/// The tokens of a source, one at a time, on demand: the parser pulls them, so an error near the
/// start of a large input is found without reading (or storing) the rest. After the `Eof` token or
/// an error it yields nothing more.
pub struct Lexer<'s> {
    src: &'s str,
    /// Byte offset of the rest.
    pos: usize,
    done: bool,
}

impl<'s> Lexer<'s> {
    /// A byte-order mark (U+FEFF) at the very start is skipped like whitespace.
    pub fn new(src: &'s str) -> Self {
        let pos = if src.starts_with('\u{feff}') { 3 } else { 0 };
        Lexer {
            src,
            pos,
            done: false,
        }
    }

    /// The length of the whole source, in bytes.
    pub fn source_len(&self) -> usize {
        self.src.len()
    }

    /// The next token (`Eof` at the end).
    fn token(&mut self) -> Result<Token, Error> {
        let len = self.src.len();
        let mut rest = &self.src[self.pos..];
        if let Ok((r, ())) = trivia(rest) {
            rest = r;
        }
        let start = len - rest.len();
        self.pos = start;
        if rest.is_empty() {
            return Ok(Token {
                tok: Tok::Eof,
                span: Span::new(len, len),
            });
        }
        let (r, tok) = if let Ok((r, s)) = ident(rest) {
            (r, Tok::Ident(s.to_string()))
        } else if let Ok((r, s)) = number(rest) {
            let span = Span::new(start, len - r.len());
            let is_float = s.contains(['.', 'e', 'E']);
            let tok = if is_float {
                match s.parse::<f64>() {
                    Ok(f) if f.is_finite() => Tok::Float(f),
                    _ => {
                        return Err(Error::new(
                            Kind::Syntax,
                            span,
                            format!("number `{s}` is out of range"),
                        )
                        .label("too large"))
                    }
                }
            } else {
                match s.parse::<i64>() {
                    Ok(v) => Tok::Int(v),
                    Err(_) => {
                        return Err(Error::new(
                            Kind::Syntax,
                            span,
                            format!("number `{s}` is too large"),
                        )
                        .label("does not fit in 64 bits"))
                    }
                }
            };
            (r, tok)
        } else if let Ok((r, s)) = punct(rest) {
            (r, Tok::Punct(intern_punct(s)))
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            let span = Span::new(start, start + c.len_utf8());
            let mut e = Error::new(
                Kind::Syntax,
                span,
                format!("unexpected character `{}`", c.escape_debug()),
            )
            .label("not part of the language");
            e = match c {
                '|' => e.help("the pipeline operator is `|>`"),
                '.' => e.help("numbers start with a digit: write `0.5`, not `.5`"),
                '"' | '\'' => {
                    e.help("there are no strings: write options as names, e.g. `padding: valid`")
                }
                '/' => e.help(
                    "only `+` (elementwise add) and `*` (elementwise multiply) are operators; use layers for the rest",
                ),
                '\u{feff}' => e.help("a byte-order mark is only allowed at the start of the file"),
                _ => e,
            };
            return Err(e);
        };
        let end = len - r.len();
        self.pos = end;
        Ok(Token {
            tok,
            span: Span::new(start, end),
        })
    }
}

impl Iterator for Lexer<'_> {
    type Item = Result<Token, Error>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let t = self.token();
        self.done = !matches!(&t, Ok(t) if t.tok != Tok::Eof);
        Some(t)
    }
}

/// Splits a whole source into tokens (ending with `Eof`); stops at the first error.
pub fn lex(src: &str) -> Result<Vec<Token>, Error> {
    Lexer::new(src).collect()
}
