//! The checker: expands blocks and `repeat`, resolves names, infers shapes and produces a
//! [`Model`]. Every error is reported as a [`diag::Error`](crate::diag::Error) with a span, and
//! checking goes on after one (see [`check_all`]).
//!
//! This file walks the program's statements; the other modules of `check/` do one job each:
//! `state` (the checker's state and the nodes it emits), `scope` (values and their bindings),
//! `eval` (expressions and pipelines), `names` (built-in names), `suggest` ("did you mean", and
//! well-known names dmc does not have), `args`
//! (binding a call's arguments to a signature), `layers` (calls of the table's layers), `blocks`
//! (`block` definitions and their expansion), `loss`, `train` (the train section and optimizers)
//! and `lints` (unused values, dead layers, nothing to train).

mod args;
mod blocks;
mod eval;
mod layers;
mod lints;
mod loss;
mod names;
mod schedule;
mod scope;
mod state;
mod suggest;
mod train;

use crate::ast::*;
use crate::diag::{Error, Kind};
use crate::limits::{elems, MAX_DIM};
use crate::model::*;
use scope::{names_in, Scope, Val};
use state::{err, Checker};

/// Checks a parsed program and builds the [`Model`]; the error is the first one found (see
/// [`check_all`] for all of them).
pub fn check(prog: &Program, src: &str) -> Result<Model, Error> {
    check_all(prog, src).map_err(|errs| {
        errs.into_iter().next().unwrap_or_else(|| {
            err(
                Kind::Name,
                Span::new(0, 0),
                "internal error: no error reported",
            )
        })
    })
}

/// Checks a parsed program and builds the [`Model`], or returns every error found (at least one,
/// none of them a follow-on error; in the order found). Checking goes on after an error: a
/// statement in error defines its value as an error value, whose uses are not reported again.
pub fn check_all(prog: &Program, src: &str) -> Result<Model, Vec<Error>> {
    let mut c = Checker::new(last_char(src));
    match run(&mut c, prog) {
        Some(m) if c.errors.is_empty() => Ok(m),
        _ => {
            let mut errs = std::mem::take(&mut c.errors);
            errs.retain(|e| !e.is_follow_on());
            if errs.is_empty() {
                errs.push(err(
                    Kind::Name,
                    Span::new(0, 0),
                    "internal error: the check failed without a reported error",
                ));
            }
            Err(errs)
        }
    }
}

/// Walks the program's statements, recording errors in `c.errors`; `None` when no model can be
/// built.
fn run<'a>(c: &mut Checker<'a>, prog: &'a Program) -> Option<Model> {
    c.collect_blocks(prog);
    c.mentioned = mentioned(prog);
    let mut scope = Scope::default();
    // Where values are defined: a use before the definition is an error.
    let mut loss: Option<&LossStmt> = None;
    let mut train: Option<&TrainSection> = None;
    let mut declares_input = false;
    for item in &prog.items {
        let name = match item {
            Item::Let(l) => &l.name,
            Item::Input(d) | Item::Target(d) => &d.name,
            _ => continue,
        };
        declares_input |= matches!(item, Item::Input(_));
        scope.later.entry(name.name.clone()).or_insert(name.span);
    }
    c.top_names = scope.later.clone();
    for item in &prog.items {
        if c.stop {
            break;
        }
        match item {
            Item::Input(d) | Item::Target(d) => {
                let is_input = matches!(item, Item::Input(_));
                let what = if is_input { "input" } else { "target" };
                let r = c.decl(d, is_input);
                let Some(decl) = c.recover(r) else {
                    scope.poison(&d.name, what);
                    continue;
                };
                let v = if is_input {
                    c.inputs.push(decl);
                    Val::Tensor(ValueRef::Input(c.inputs.len() - 1))
                } else {
                    c.targets.push(decl);
                    Val::Tensor(ValueRef::Target(c.targets.len() - 1))
                };
                let r = c.no_block_clash(&d.name);
                if c.recover(r).is_some() {
                    let r = scope.define(&d.name, v, what);
                    c.recover(r);
                }
            }
            Item::Let(l) => {
                let r = c.no_block_clash(&l.name);
                if c.recover(r).is_none() {
                    scope.mark_used(&l.value);
                    continue;
                }
                let r = c
                    .eval(&l.value, &mut scope)
                    .and_then(|v| c.storable(v, &l.value, &scope));
                match c.recover(r) {
                    Some(v) => {
                        let r = scope.define(&l.name, v, "value");
                        c.recover(r);
                    }
                    None => {
                        scope.mark_used(&l.value);
                        scope.poison(&l.name, "value");
                    }
                }
            }
            Item::Block(_) => {}
            Item::Loss(l) => match loss {
                Some(prev) => c.report(
                    err(
                        Kind::Training,
                        l.span,
                        "the program has more than one `loss`",
                    )
                    .label("second loss")
                    .note(prev.span, "first loss here")
                    .help("a model is trained on one loss; to train on several, write one weighted sum: `loss 0.5 * mse(recon, x) + cross_entropy(logits, label)`"),
                ),
                None => loss = Some(l),
            },
            Item::Train(t) => match train {
                Some(prev) => c.report(
                    err(
                        Kind::Training,
                        t.span,
                        "the program has more than one `train` section",
                    )
                    .label("second section")
                    .note(prev.span, "first section here")
                    .help("merge the settings into one `train { ... }`"),
                ),
                None => train = Some(t),
            },
        }
    }
    if c.stop {
        return None;
    }
    if !declares_input {
        c.report(
            err(Kind::Name, Span::new(0, 0), "the program declares no input")
                .label("expected `input name: [dims]`")
                .help("declare the network's input first, e.g. `input x: [28, 28, 1]`"),
        );
    }
    // The loss is checked last (its layers are numbered after the program's), but sees only the
    // values defined above it.
    let loss = match loss {
        Some(l) => {
            scope.horizon = Some(l.span.start);
            let r = c.loss(l, &mut scope);
            scope.horizon = None;
            r
        }
        None => {
            c.report(
                err(Kind::Training, c.eof, "the program has no `loss`")
                    .label("expected a `loss` statement after this")
                    .help("add e.g. `loss mse(out, y)` or `loss cross_entropy(logits, label)`"),
            );
            None
        }
    };
    let train = match train {
        Some(t) => {
            let r = c.train(t);
            c.recover(r)
        }
        None => {
            c.report(
                err(
                    Kind::Training,
                    c.eof,
                    "the program has no `train { ... }` section",
                )
                .label("expected a `train` section after this")
                .help("add e.g. `train { batch: 32, optimizer: sgd(lr: 0.01) }`"),
            );
            None
        }
    };
    if c.stop {
        return None;
    }
    // Without a loss nothing is used: not worth saying.
    if loss.is_some() || c.errors.is_empty() {
        c.check_unused(&scope, "");
    }
    let (loss, train) = (loss?, train?);
    // The layers of a statement in error are missing or dangling: these lints are for programs
    // without errors.
    if !c.errors.is_empty() {
        return None;
    }
    let preds: Vec<ValueRef> = loss.terms.iter().map(|t| t.pred).collect();
    let r = c.check_dead(&preds).and_then(|()| c.check_trainable(&loss));
    c.recover(r)?;
    let output = loss.output_term().pred;
    Some(Model {
        inputs: std::mem::take(&mut c.inputs),
        targets: std::mem::take(&mut c.targets),
        nodes: std::mem::take(&mut c.nodes),
        output,
        loss,
        train,
    })
}

impl Checker<'_> {
    fn decl(&mut self, d: &Decl, is_input: bool) -> Result<TensorDecl, Error> {
        let mut shape = vec![];
        for (v, span) in &d.ty.dims {
            if *v <= 0 {
                return Err(err(Kind::Shape, *span, format!("dimension {v} of `{}` is not positive", d.name.name))
                    .label("must be at least 1")
                    .help("shapes are per sample and do not include the batch size (set it in `train { batch: ... }`)"));
            }
            if *v > MAX_DIM {
                return Err(
                    err(Kind::Shape, *span, format!("dimension {v} is too large"))
                        .label("too large"),
                );
            }
            shape.push(*v as usize);
        }
        elems(&shape, d.ty.span)?;
        let dtype = if d.ty.int { DType::I32 } else { DType::F32 };
        if is_input && dtype == DType::I32 && shape.is_empty() {
            return Err(err(
                Kind::Shape,
                d.ty.span,
                format!("`{}` needs at least one dimension", d.name.name),
            )
            .label("integer inputs are token sequences")
            .help(
                "write e.g. `input tokens: int[256]` (256 tokens per sample, read by `embedding`)",
            ));
        }
        if dtype == DType::F32 && shape.is_empty() {
            return Err(err(
                Kind::Shape,
                d.ty.span,
                format!("`{}` needs at least one dimension", d.name.name),
            )
            .label("empty shape")
            .help("a single number per sample is `[1]`"));
        }
        Ok(TensorDecl {
            name: d.name.name.clone(),
            shape,
            dtype,
            span: d.span,
        })
    }
}

/// Every name mentioned in the program's expressions.
fn mentioned(prog: &Program) -> std::collections::HashSet<String> {
    let mut out = std::collections::HashSet::new();
    let mut add = |n: &str| {
        out.insert(n.to_string());
    };
    for item in &prog.items {
        match item {
            Item::Let(l) => names_in(&l.value, &mut add),
            Item::Block(b) => {
                let defaults = b.params.iter().filter_map(|p| p.default.as_ref());
                let body = b.body.iter().map(|l| &l.value);
                for e in defaults.chain(body).chain([&b.ret]) {
                    names_in(e, &mut add);
                }
            }
            Item::Loss(l) => l
                .terms
                .iter()
                .flat_map(|t| &t.args)
                .for_each(|a| names_in(&a.value, &mut add)),
            Item::Input(_) | Item::Target(_) | Item::Train(_) => {}
        }
    }
    out
}

/// Span of the last non-blank character of the source (where "missing ..." errors point).
fn last_char(src: &str) -> Span {
    let trimmed = src.trim_end();
    match trimmed.char_indices().last() {
        Some((i, c)) => Span::new(i, i + c.len_utf8()),
        None => Span::new(0, 0),
    }
}
