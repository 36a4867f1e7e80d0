//! Recursive-descent parser of the `.dm` language.
//!
//! The parser pulls tokens from the lexer ([`crate::lexer`]) on demand (one token of lookahead
//! beyond the current one), so it stops reading at a lexical error, and produces precise,
//! user-facing errors ("expected `)` to close the call started at 3:14"). After a syntax error it
//! goes on at the next statement that begins a line (`recover`).

mod recover;

use crate::ast::*;
use crate::diag::{line_col, Error, Kind};
use crate::lexer::{describe, is_keyword};
pub use crate::lexer::{lex, Lexer, Tok, Token};

/// Parses a whole program; the error is the first one (see [`parse_all`]).
pub fn parse(src: &str) -> Result<Program, Error> {
    parse_all(src).map_err(|errs| {
        errs.into_iter().next().unwrap_or_else(|| {
            Error::new(
                Kind::Syntax,
                Span::default(),
                "internal error: no syntax error reported",
            )
        })
    })
}

/// Parses a whole program, lexing on demand, or returns its syntax errors (at least one, in source
/// order): one per statement in error, the parser going on at the next statement that begins a
/// line. A lexical error ends the text: it is reported when the parser reaches it, instead of
/// the syntax error it causes.
pub fn parse_all(src: &str) -> Result<Program, Vec<Error>> {
    let mut lexer = Lexer::new(src);
    let mut lex_error = None;
    let first = pull(&mut lexer, &mut lex_error);
    let second = if first.tok == Tok::Eof {
        first.clone()
    } else {
        pull(&mut lexer, &mut lex_error)
    };
    let mut p = P {
        src,
        lexer,
        la: [first, second],
        prev: None,
        lex_error,
        depth: 0,
    };
    let r = p.program();
    // The parser saw the lexical error as the end of the file; report the error itself.
    match p.lex_error.take() {
        Some(e) => {
            let mut errs = r.err().unwrap_or_default();
            errs.push(e);
            Err(errs)
        }
        None => r,
    }
}

/// The next token; a lexical error is recorded and becomes an `Eof` token at its position, which
/// the parser cannot get past.
fn pull(lexer: &mut Lexer<'_>, lex_error: &mut Option<Error>) -> Token {
    match lexer.next() {
        Some(Ok(t)) => t,
        Some(Err(e)) => {
            let span = Span::new(e.span.start, e.span.start);
            *lex_error = Some(e);
            Token {
                tok: Tok::Eof,
                span,
            }
        }
        None => {
            let len = lexer.source_len();
            Token {
                tok: Tok::Eof,
                span: Span::new(len, len),
            }
        }
    }
}

const MAX_DEPTH: usize = 200;

struct P<'s> {
    src: &'s str,
    lexer: Lexer<'s>,
    /// The current token and the next one (both `Eof` at the end).
    la: [Token; 2],
    /// Span of the token before the current one.
    prev: Option<Span>,
    lex_error: Option<Error>,
    depth: usize,
}

type R<T> = Result<T, Error>;

impl<'s> P<'s> {
    fn peek(&self) -> &Token {
        &self.la[0]
    }
    /// The token `k` places ahead (`k` ≤ 1; further is the next one).
    fn peek_at(&self, k: usize) -> &Token {
        &self.la[k.min(1)]
    }
    /// Moves on by one token (not past the end) and returns the current one.
    fn bump(&mut self) -> Token {
        let t = self.la[0].clone();
        if t.tok == Tok::Eof {
            return t;
        }
        self.prev = Some(t.span);
        let next = if self.la[1].tok == Tok::Eof {
            self.la[1].clone()
        } else {
            pull(&mut self.lexer, &mut self.lex_error)
        };
        self.la[0] = std::mem::replace(&mut self.la[1], next);
        t
    }
    fn prev_end(&self) -> usize {
        self.prev.map_or(0, |s| s.end)
    }
    fn is_punct(&self, p: &str) -> bool {
        matches!(&self.peek().tok, Tok::Punct(q) if *q == p)
    }
    fn is_kw(&self, k: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(s) if s == k)
    }
    fn eat_punct(&mut self, p: &str) -> bool {
        if self.is_punct(p) {
            self.bump();
            true
        } else {
            false
        }
    }
    fn at(&self, span: Span) -> String {
        let (l, c) = line_col(self.src, span.start);
        format!("{l}:{c}")
    }
    /// Whether the next token starts on a later line than the previous one ends (or is the end of
    /// file): errors are then shown after the previous token, where the missing text belongs.
    fn after_prev(&self) -> Option<Span> {
        let prev = self.prev?;
        let next = self.peek();
        let gap = &self.src[prev.end.min(self.src.len())
            ..next
                .span
                .start
                .min(self.src.len())
                .max(prev.end.min(self.src.len()))];
        if next.tok == Tok::Eof || gap.contains('\n') {
            Some(prev)
        } else {
            None
        }
    }
    fn unexpected(&self, expected: &str) -> Error {
        let t = self.peek();
        let found = describe(&t.tok);
        match self.after_prev() {
            Some(prev) => Error::new(
                Kind::Syntax,
                prev,
                format!("expected {expected}, found {found}"),
            )
            .label(format!("expected {expected} after this")),
            None => Error::new(
                Kind::Syntax,
                t.span,
                format!("expected {expected}, found {found}"),
            )
            .label(format!("expected {expected}")),
        }
    }
    /// Expects the closing delimiter of a group opened at `open`.
    fn expect_close(&mut self, close: &str, open: Span, what: &str) -> R<Span> {
        if self.is_punct(close) {
            return Ok(self.bump().span);
        }
        Err(self.close_error(close, open, what))
    }
    /// The error for a missing closing delimiter of a group opened at `open`.
    fn close_error(&self, close: &str, open: Span, what: &str) -> Error {
        let t = self.peek().clone();
        let at = self.at(open);
        let mut e = if t.tok == Tok::Eof {
            Error::new(
                Kind::Syntax,
                t.span,
                format!(
                    "unterminated {what}: expected `{close}` to close the {what} started at {at}"
                ),
            )
        } else {
            Error::new(
                Kind::Syntax,
                t.span,
                format!(
                    "expected `{close}` to close the {what} started at {at}, found {}",
                    describe(&t.tok)
                ),
            )
        };
        let list = matches!(what, "call" | "parenthesis" | "shape" | "parameter list");
        e.label = if list {
            format!("expected `,` or `{close}`")
        } else {
            format!("expected `{close}`")
        };
        if let Some(prev) = self.after_prev() {
            e.span = prev;
            e.label = format!("expected `{close}` after this");
        }
        e.note(open, format!("{what} started here"))
    }
    fn ident(&mut self, what: &str) -> R<Ident> {
        match self.peek().tok.clone() {
            Tok::Ident(s) if !is_keyword(&s) => {
                let t = self.bump();
                Ok(Ident {
                    name: s,
                    span: t.span,
                })
            }
            Tok::Ident(s) => {
                let t = self.peek().clone();
                Err(Error::new(
                    Kind::Syntax,
                    t.span,
                    format!("expected {what}, found keyword `{s}`"),
                )
                .label("this is a reserved word")
                .help(format!("`{s}` is reserved; choose another name")))
            }
            _ => Err(self.unexpected(what)),
        }
    }
    fn enter(&mut self) -> R<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            let t = self.peek().span;
            return Err(
                Error::new(Kind::Syntax, t, "expression nested too deeply").label("too deep")
            );
        }
        Ok(())
    }

    fn item(&mut self) -> R<Item> {
        let t = self.peek().clone();
        match &t.tok {
            Tok::Ident(k) if is_keyword(k) && self.peek_at(1).tok == Tok::Punct("=") => {
                Err(Error::new(
                    Kind::Syntax,
                    t.span,
                    format!("`{k}` is a reserved word and cannot name a value"),
                )
                .label("reserved word")
                .help(format!("choose another name, e.g. `{k}_value = ...`")))
            }
            Tok::Ident(k) if k == "input" || k == "target" => {
                self.bump();
                let d = self.decl(t.span, k == "input")?;
                Ok(if k == "input" {
                    Item::Input(d)
                } else {
                    Item::Target(d)
                })
            }
            Tok::Ident(k) if k == "block" => self.block(),
            Tok::Ident(k) if k == "loss" => {
                self.bump();
                let mut terms = vec![self.loss_call()?];
                while self.eat_punct("+") {
                    let term_starts = match &self.peek().tok {
                        Tok::Ident(k) => !is_keyword(k),
                        Tok::Int(_) | Tok::Float(_) | Tok::Punct("-") => true,
                        _ => false,
                    };
                    if !term_starts {
                        return Err(self
                            .unexpected("a loss term")
                            .help("join weighted losses with `+`: `loss 0.5 * mse(recon, x) + cross_entropy(logits, label)`"));
                    }
                    terms.push(self.loss_call()?);
                }
                Ok(Item::Loss(LossStmt {
                    terms,
                    span: Span::new(t.span.start, self.prev_end()),
                }))
            }
            Tok::Ident(k) if k == "train" => self.train(),
            Tok::Ident(k) if k == "return" => {
                Err(
                    Error::new(Kind::Syntax, t.span, "`return` outside of a block")
                        .label("only blocks return a value")
                        .help("the model's output is the prediction given to `loss`"),
                )
            }
            Tok::Ident(k) if !is_keyword(k) => Ok(Item::Let(self.let_stmt()?)),
            _ => {
                let mut e = Error::new(
                    Kind::Syntax,
                    t.span,
                    format!(
                        "expected a statement (`input`, `target`, `name = ...`, `block`, `loss` or `train`), found {}",
                        describe(&t.tok)
                    ),
                )
                .label("expected a statement");
                if matches!(&t.tok, Tok::Ident(k) if k == "repeat") {
                    e = e.help("`repeat` is a pipeline stage: did you forget `|>` before it?");
                }
                if matches!(t.tok, Tok::Punct("|>")) {
                    e = e.help("a pipeline continues a value: write `name = value |> ...`");
                }
                Err(e)
            }
        }
    }

    /// One term of a `loss`: `[NUMBER *] NAME(args)`.
    fn loss_call(&mut self) -> R<LossCall> {
        let start = self.peek().span.start;
        let number = matches!(
            (&self.peek().tok, &self.peek_at(1).tok),
            (Tok::Int(_) | Tok::Float(_), _) | (Tok::Punct("-"), Tok::Int(_) | Tok::Float(_))
        );
        let weight = if number {
            let w = self.primary()?;
            if !self.eat_punct("*") {
                return Err(self
                    .unexpected("`*` after the loss weight")
                    .help("write a weighted term as `0.5 * mse(out, y)`"));
            }
            Some(w)
        } else {
            None
        };
        if let (Tok::Ident(n), Tok::Punct("*")) = (&self.peek().tok, &self.peek_at(1).tok) {
            if !is_keyword(n) {
                let t = self.peek().clone();
                return Err(Error::new(
                    Kind::Syntax,
                    t.span,
                    format!("a loss weight must be a number, found the name `{n}`"),
                )
                .label("not a number")
                .help("write the weight as a number literal, e.g. `loss 0.5 * mse(out, y) + cross_entropy(logits, label)`"));
            }
        }
        let func = self.ident("a loss function such as `mse` or `cross_entropy`")?;
        if !self.is_punct("(") {
            return Err(self.unexpected("`(` after the loss function"));
        }
        let open = self.bump().span;
        let args = self.args(open)?;
        Ok(LossCall {
            weight,
            func,
            args,
            span: Span::new(start, self.prev_end()),
        })
    }

    fn let_stmt(&mut self) -> R<Let> {
        let name = self.ident("a name")?;
        if !self.is_punct("=") {
            let mut e = self.unexpected("`=`");
            if self.is_punct("(") || self.is_punct("|>") {
                e = e.help(format!(
                    "a statement must name its value, e.g. `out = {}(...)`",
                    name.name
                ));
            } else if self.is_punct(":") {
                e = e.help(format!(
                    "to declare an input write `input {}: [...]`",
                    name.name
                ));
            }
            return Err(e);
        }
        self.bump();
        let value = self.expr()?;
        Ok(Let {
            span: Span::new(name.span.start, value.span.end),
            name,
            value,
        })
    }

    fn decl(&mut self, kw: Span, kw_input: bool) -> R<Decl> {
        let name = self.ident("a name")?;
        if !self.eat_punct(":") {
            return Err(self.unexpected("`:` and a shape").help(format!(
                "declare it like `{} {}: [16, 16, 1]`",
                if kw_input { "input" } else { "target" },
                name.name
            )));
        }
        let tstart = self.peek().span.start;
        let mut int = false;
        if self.is_kw("int") {
            self.bump();
            int = true;
        } else if self.is_kw("float") {
            self.bump();
        }
        let mut dims = Vec::new();
        if self.is_punct("[") {
            let open = self.bump().span;
            loop {
                if self.is_punct("]") {
                    break;
                }
                let minus = self.is_punct("-").then(|| self.bump().span);
                let neg = minus.is_some();
                let t = self.peek().clone();
                match t.tok {
                    Tok::Int(v) => {
                        self.bump();
                        let start = minus.map_or(t.span.start, |m| m.start);
                        dims.push((
                            if neg { -v } else { v },
                            Span::new(start.min(t.span.start), t.span.end),
                        ));
                    }
                    Tok::Float(_) => {
                        return Err(Error::new(
                            Kind::Syntax,
                            t.span,
                            "dimensions must be whole numbers",
                        )
                        .label("not an integer"))
                    }
                    _ if t.tok == Tok::Eof => return Err(self.close_error("]", open, "shape")),
                    _ => return Err(self.unexpected("a dimension (a whole number)")),
                }
                if !self.eat_punct(",") {
                    break;
                }
            }
            self.expect_close("]", open, "shape")?;
        } else if !int {
            let mut e = self.unexpected("a shape such as `[16, 16, 1]`, or `int` for class labels");
            e.label = "expected a shape".into();
            return Err(e);
        }
        let span = Span::new(tstart, self.prev_end());
        Ok(Decl {
            span: Span::new(kw.start, span.end),
            name,
            ty: TypeExpr { int, dims, span },
        })
    }

    fn block(&mut self) -> R<Item> {
        let kw = self.bump().span;
        let name = self.ident("the block's name")?;
        if !self.is_punct("(") {
            let mut e =
                self.unexpected(&format!("`(` and the parameters of block `{}`", name.name));
            e = e.help(format!("write `block {}(x, ...) {{ ... return ... }}`; the first parameter receives the piped value", name.name));
            return Err(e);
        }
        let open = self.bump().span;
        let mut params = Vec::new();
        loop {
            if self.is_punct(")") {
                break;
            }
            let pname = self.ident("a parameter name")?;
            let default = if self.eat_punct(":") || self.eat_punct("=") {
                Some(self.expr()?)
            } else {
                None
            };
            params.push(Param {
                name: pname,
                default,
            });
            if !self.eat_punct(",") {
                break;
            }
        }
        self.expect_close(")", open, "parameter list")?;
        if !self.is_punct("{") {
            return Err(self.unexpected("`{` to start the block's body"));
        }
        let bopen = self.bump().span;
        let mut body = Vec::new();
        let ret;
        loop {
            while self.eat_punct(";") {}
            if self.is_kw("return") {
                self.bump();
                ret = self.expr()?;
                while self.eat_punct(";") {}
                break;
            }
            if self.is_punct("}") || self.peek().tok == Tok::Eof {
                let t = self.peek().clone();
                if t.tok == Tok::Eof {
                    return Err(self.close_error("}", bopen, "block"));
                }
                return Err(Error::new(
                    Kind::Syntax,
                    t.span,
                    format!("block `{}` does not return a value", name.name),
                )
                .label("expected `return ...` before the end of the block")
                .help("end the block with `return <value>`"));
            }
            match &self.peek().tok {
                Tok::Ident(k) if !is_keyword(k) => body.push(self.let_stmt()?),
                _ => {
                    let mut e = self.unexpected("`name = ...` or `return ...` in the block");
                    e.label = "expected a statement".into();
                    return Err(e);
                }
            }
        }
        if !self.is_punct("}") {
            let t = self.peek().clone();
            if t.tok == Tok::Eof {
                return Err(self.close_error("}", bopen, "block"));
            }
            return Err(Error::new(
                Kind::Syntax,
                t.span,
                format!(
                    "expected `}}` after the `return` of block `{}`, found {}",
                    name.name,
                    describe(&t.tok)
                ),
            )
            .label("`return` must be the block's last statement")
            .note(bopen, "block started here"));
        }
        let close = self.bump().span;
        Ok(Item::Block(BlockDef {
            name,
            params,
            body,
            ret,
            span: Span::new(kw.start, close.end),
        }))
    }

    fn train(&mut self) -> R<Item> {
        let kw = self.bump().span;
        if !self.is_punct("{") {
            let mut e = self.unexpected("`{` after `train`");
            e = e.help("write `train { batch: 32, optimizer: sgd(lr: 0.01) }`");
            return Err(e);
        }
        let open = self.bump().span;
        let mut fields = Vec::new();
        loop {
            while self.eat_punct(",") || self.eat_punct(";") {}
            if self.is_punct("}") || self.peek().tok == Tok::Eof {
                break;
            }
            let name = self.ident("a setting name such as `batch` or `optimizer`")?;
            if !(self.eat_punct(":") || self.eat_punct("=")) {
                let mut e = self.unexpected(&format!("`:` after `{}`", name.name));
                e = e.help(format!("write `{}: <value>`", name.name));
                return Err(e);
            }
            let value = self.expr()?;
            fields.push(Field { name, value });
            if !(self.is_punct(",") || self.is_punct(";") || self.is_punct("}")) {
                if let Tok::Ident(_) = self.peek().tok {
                    // newline-separated fields
                    continue;
                }
                if self.peek().tok != Tok::Eof {
                    return Err(self.unexpected("`,` or `}` after the setting"));
                }
            }
        }
        let close = self.expect_close("}", open, "section")?;
        Ok(Item::Train(TrainSection {
            fields,
            span: Span::new(kw.start, close.end),
        }))
    }

    /// expr := sum ( `|>` stage )*  (`*` binds tighter than `+`, which binds tighter than `|>`)
    fn expr(&mut self) -> R<Expr> {
        self.enter()?;
        let first = self.sum()?;
        let mut stages = vec![];
        while self.is_punct("|>") {
            self.bump();
            stages.push(self.stage()?);
        }
        self.depth -= 1;
        match stages.last() {
            None => Ok(first),
            Some(last) => Ok(Expr {
                span: Span::new(first.span.start, last.span.end),
                kind: ExprKind::Pipe(Box::new(first), stages),
            }),
        }
    }

    /// sum := product ( `+` product )*
    fn sum(&mut self) -> R<Expr> {
        let first = self.product()?;
        if !self.is_punct("+") {
            return Ok(first);
        }
        let mut terms = vec![first];
        while self.is_punct("+") {
            self.bump();
            terms.push(self.product()?);
        }
        let span = Span::new(terms[0].span.start, terms[terms.len() - 1].span.end);
        Ok(Expr {
            kind: ExprKind::Add(terms),
            span,
        })
    }

    /// product := postfix ( `*` postfix )*
    fn product(&mut self) -> R<Expr> {
        let first = self.postfix()?;
        if !self.is_punct("*") {
            return Ok(first);
        }
        let mut factors = vec![first];
        while self.is_punct("*") {
            self.bump();
            factors.push(self.postfix()?);
        }
        let span = Span::new(factors[0].span.start, factors[factors.len() - 1].span.end);
        Ok(Expr {
            kind: ExprKind::Mul(factors),
            span,
        })
    }

    /// A pipeline stage: `op`, `op(args)`, `op(args) as name`, `block(args)` or `repeat N { stages }`.
    fn stage(&mut self) -> R<Expr> {
        if self.is_kw("repeat") {
            return self.repeat();
        }
        match self.peek().tok.clone() {
            Tok::Ident(s) if !is_keyword(&s) => self.postfix(),
            _ => {
                let mut e = self.unexpected("an operation after `|>`");
                e.label = "expected an operation such as `conv2d(64, 3)` or `flatten`".into();
                Err(e)
            }
        }
    }

    fn repeat(&mut self) -> R<Expr> {
        let kw = self.bump().span;
        self.enter()?;
        let count = self.postfix()?;
        if !self.is_punct("{") {
            let mut e = self.unexpected("`{` to start the repeated stages");
            e = e.help("write `repeat 3 { conv2d(64, 3) |> relu }`");
            return Err(e);
        }
        let open = self.bump().span;
        let mut body = Vec::new();
        if self.is_punct("}") {
            let t = self.peek().span;
            return Err(Error::new(Kind::Syntax, t, "empty `repeat` body")
                .label("expected at least one stage")
                .help("write the stages to repeat, e.g. `repeat 3 { conv2d(64, 3) }`"));
        }
        self.eat_punct("|>");
        loop {
            if self.peek().tok == Tok::Eof {
                return Err(self.close_error("}", open, "repeat body"));
            }
            body.push(self.stage()?);
            if !self.eat_punct("|>") {
                break;
            }
        }
        let close = self.expect_close("}", open, "repeat body")?;
        self.depth -= 1;
        Ok(Expr {
            kind: ExprKind::Repeat {
                count: Box::new(count),
                body,
            },
            span: Span::new(kw.start, close.end),
        })
    }

    /// postfix := primary [ `(` args `)` ] [ `as` name ]
    fn postfix(&mut self) -> R<Expr> {
        let e = self.primary()?;
        if self.is_kw("as") {
            let as_span = self.bump().span;
            let label = self.ident("a layer name after `as`")?;
            return match e.kind {
                ExprKind::Call {
                    func,
                    args,
                    label: None,
                } => Ok(Expr {
                    kind: ExprKind::Call {
                        func,
                        args,
                        label: Some(label.clone()),
                    },
                    span: Span::new(e.span.start, label.span.end),
                }),
                ExprKind::Name(n) => Ok(Expr {
                    kind: ExprKind::Call {
                        func: Ident {
                            name: n,
                            span: e.span,
                        },
                        args: vec![],
                        label: Some(label.clone()),
                    },
                    span: Span::new(e.span.start, label.span.end),
                }),
                _ => Err(Error::new(
                    Kind::Syntax,
                    as_span,
                    "only a layer or block call can be named with `as`",
                )
                .label("nothing to name here")),
            };
        }
        Ok(e)
    }

    fn primary(&mut self) -> R<Expr> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Int(v) => {
                self.bump();
                Ok(Expr {
                    kind: ExprKind::Int(v),
                    span: t.span,
                })
            }
            Tok::Float(v) => {
                self.bump();
                Ok(Expr {
                    kind: ExprKind::Float(v),
                    span: t.span,
                })
            }
            Tok::Punct("-") => {
                self.bump();
                let n = self.peek().clone();
                let span = Span::new(t.span.start, n.span.end);
                match n.tok {
                    Tok::Int(v) => {
                        self.bump();
                        Ok(Expr {
                            kind: ExprKind::Int(-v),
                            span,
                        })
                    }
                    Tok::Float(v) => {
                        self.bump();
                        Ok(Expr {
                            kind: ExprKind::Float(-v),
                            span,
                        })
                    }
                    _ => Err(self.unexpected("a number after `-`")),
                }
            }
            Tok::Punct("(") => {
                self.bump();
                self.enter()?;
                let first = self.expr()?;
                if self.is_punct(",") {
                    let mut items = vec![first];
                    while self.eat_punct(",") {
                        if self.is_punct(")") {
                            break;
                        }
                        items.push(self.expr()?);
                    }
                    let close = self.expect_close(")", t.span, "parenthesis")?;
                    self.depth -= 1;
                    return Ok(Expr {
                        kind: ExprKind::Tuple(items),
                        span: Span::new(t.span.start, close.end),
                    });
                }
                let close = self.expect_close(")", t.span, "parenthesis")?;
                self.depth -= 1;
                Ok(Expr {
                    kind: first.kind,
                    span: Span::new(t.span.start, close.end),
                })
            }
            // `[d1, d2, ...]`: a list of values (`reshape([4, -1])`), read as a tuple
            Tok::Punct("[") => {
                self.bump();
                self.enter()?;
                let mut items = vec![];
                while !self.is_punct("]") {
                    if self.peek().tok == Tok::Eof {
                        return Err(self.close_error("]", t.span, "list"));
                    }
                    items.push(self.expr()?);
                    if !self.eat_punct(",") {
                        break;
                    }
                }
                let close = self.expect_close("]", t.span, "list")?;
                self.depth -= 1;
                Ok(Expr {
                    kind: ExprKind::Tuple(items),
                    span: Span::new(t.span.start, close.end),
                })
            }
            Tok::Ident(ref s) if s == "repeat" => Err(Error::new(
                Kind::Syntax,
                t.span,
                "`repeat` can only be used as a pipeline stage",
            )
            .label("not after `|>`")
            .help("write `x |> repeat 3 { ... }`")),
            Tok::Ident(ref s) if !is_keyword(s) => {
                self.bump();
                let func = Ident {
                    name: s.clone(),
                    span: t.span,
                };
                if self.is_punct("(") {
                    let open = self.bump().span;
                    let args = self.args(open)?;
                    let span = Span::new(t.span.start, self.prev_end());
                    return Ok(Expr {
                        kind: ExprKind::Call {
                            func,
                            args,
                            label: None,
                        },
                        span,
                    });
                }
                Ok(Expr {
                    kind: ExprKind::Name(s.clone()),
                    span: t.span,
                })
            }
            _ => {
                let mut e = self.unexpected("a value");
                e.label = "expected a name, a number or a call".into();
                Err(e)
            }
        }
    }

    /// Arguments after `(` up to and including the closing `)`.
    fn args(&mut self, open: Span) -> R<Vec<Arg>> {
        self.enter()?;
        let mut args = Vec::new();
        loop {
            if self.is_punct(")") || self.peek().tok == Tok::Eof {
                break;
            }
            let start = self.peek().span.start;
            let is_kw = matches!(&self.peek().tok, Tok::Ident(s) if !is_keyword(s))
                && matches!(self.peek_at(1).tok, Tok::Punct(":") | Tok::Punct("="));
            let name = if is_kw {
                let n = self.ident("an argument name")?;
                self.bump();
                Some(n)
            } else {
                None
            };
            let value = self.expr()?;
            args.push(Arg {
                name,
                span: Span::new(start, value.span.end),
                value,
            });
            if !self.eat_punct(",") {
                break;
            }
        }
        self.expect_close(")", open, "call")?;
        self.depth -= 1;
        Ok(args)
    }
}
