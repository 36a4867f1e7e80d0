//! Going on after a syntax error: the tokens up to the next statement that begins a line are
//! skipped (after an error in a `block`, those up to its closing `}` at the start of a line), so
//! that the mistakes of separate statements are reported in one run.

use super::P;
use crate::ast::Program;
use crate::diag::Error;
use crate::lexer::{is_keyword, Tok};

/// The most syntax errors collected before parsing stops.
pub(super) const MAX_SYNTAX_ERRORS: usize = crate::diag::MAX_COLLECTED;

impl P<'_> {
    /// The statements of the program, going on after an error (see the module's documentation).
    pub(super) fn program(&mut self) -> Result<Program, Vec<Error>> {
        let mut items = Vec::new();
        let mut errors = Vec::new();
        loop {
            while self.eat_punct(";") {}
            if self.peek().tok == Tok::Eof {
                break;
            }
            let (start, block) = (self.peek().span.start, self.is_kw("block"));
            match self.item() {
                Ok(item) => items.push(item),
                // Reached a lexical error: that is reported instead.
                Err(_) if self.lex_error.is_some() => break,
                Err(e) => {
                    errors.push(e);
                    if errors.len() >= MAX_SYNTAX_ERRORS {
                        break;
                    }
                    self.resync(start, block);
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Program {
            items,
            len: self.src.len(),
        })
    }

    /// Whether the current token is the first of its line.
    fn at_line_start(&self) -> bool {
        let before = self.src.get(..self.peek().span.start).unwrap_or("");
        let line = before.rfind('\n').map_or(before, |i| &before[i + 1..]);
        line.trim_start_matches('\u{feff}').trim().is_empty()
    }

    /// Whether the current token begins a line and a statement: `input`, `target`, `block`,
    /// `loss`, `train` (`keyword`), or `name =` (a definition, unless only `keywords`).
    fn at_statement(&self, keywords: bool) -> bool {
        if !self.at_line_start() {
            return false;
        }
        match &self.peek().tok {
            Tok::Ident(k)
                if matches!(k.as_str(), "input" | "target" | "block" | "loss" | "train") =>
            {
                true
            }
            Tok::Ident(k) => !keywords && !is_keyword(k) && self.peek_at(1).tok == Tok::Punct("="),
            _ => false,
        }
    }

    /// After an error in the statement that began at byte `start` (`block`: a block definition):
    /// moves to the next statement that begins a line, or to the end.
    pub(super) fn resync(&mut self, start: usize, block: bool) {
        self.depth = 0;
        if self.peek().span.start == start {
            self.bump();
        }
        let end = |p: &Self| p.peek().tok == Tok::Eof;
        if block {
            // A block's body may hold definitions at the start of a line: go past its end.
            while !end(self) && !self.at_statement(true) {
                let close = self.at_line_start() && self.is_punct("}");
                self.bump();
                if close {
                    break;
                }
            }
        }
        while !end(self) && !self.at_statement(false) {
            self.bump();
        }
    }
}
