//! The checker: expands blocks and `repeat`, resolves names, infers shapes and produces a
//! [`Model`]. Every error is reported as a [`diag::Error`](crate::diag::Error) with a span.
//!
//! This file walks the program's statements; the other modules of `check/` do one job each:
//! `state` (the checker's state and the nodes it emits), `scope` (values and their bindings),
//! `eval` (expressions and pipelines), `names` (built-in names and "did you mean"), `args`
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
mod scope;
mod state;
mod train;

use crate::ast::*;
use crate::diag::{Error, Kind};
use crate::limits::{elems, MAX_DIM};
use crate::model::*;
use scope::{Scope, Val};
use state::{err, Checker};

/// Checks a parsed program and builds the [`Model`].
pub fn check(prog: &Program, src: &str) -> Result<Model, Error> {
    let mut c = Checker::new(last_char(src));
    c.collect_blocks(prog)?;
    let mut scope = Scope::default();
    // Where values are defined: a use before the definition is an error.
    let mut loss: Option<&LossStmt> = None;
    let mut train: Option<&TrainSection> = None;
    for item in &prog.items {
        let name = match item {
            Item::Let(l) => &l.name,
            Item::Input(d) | Item::Target(d) => &d.name,
            _ => continue,
        };
        scope.later.entry(name.name.clone()).or_insert(name.span);
    }
    for item in &prog.items {
        match item {
            Item::Input(d) | Item::Target(d) => {
                let is_input = matches!(item, Item::Input(_));
                let decl = c.decl(d, is_input)?;
                let v = if is_input {
                    c.inputs.push(decl);
                    Val::Tensor(ValueRef::Input(c.inputs.len() - 1))
                } else {
                    c.targets.push(decl);
                    Val::Tensor(ValueRef::Target(c.targets.len() - 1))
                };
                c.no_block_clash(&d.name)?;
                scope.define(&d.name, v, if is_input { "input" } else { "target" })?;
            }
            Item::Let(l) => {
                c.no_block_clash(&l.name)?;
                let v = c.eval(&l.value, &mut scope)?;
                let v = c.storable(v, &l.value, &scope)?;
                scope.define(&l.name, v, "value")?;
            }
            Item::Block(_) => {}
            Item::Loss(l) => {
                if let Some(prev) = loss {
                    return Err(err(
                        Kind::Training,
                        l.span,
                        "the program has more than one `loss`",
                    )
                    .label("second loss")
                    .note(prev.span, "first loss here")
                    .help("a model is trained on one loss; remove one of them"));
                }
                loss = Some(l);
            }
            Item::Train(t) => {
                if let Some(prev) = train {
                    return Err(err(
                        Kind::Training,
                        t.span,
                        "the program has more than one `train` section",
                    )
                    .label("second section")
                    .note(prev.span, "first section here")
                    .help("merge the settings into one `train { ... }`"));
                }
                train = Some(t);
            }
        }
    }
    if c.inputs.is_empty() {
        return Err(
            err(Kind::Name, Span::new(0, 0), "the program declares no input")
                .label("expected `input name: [dims]`")
                .help("declare the network's input first, e.g. `input x: [28, 28, 1]`"),
        );
    }
    let Some(loss_stmt) = loss else {
        return Err(err(Kind::Training, c.eof, "the program has no `loss`")
            .label("expected a `loss` statement after this")
            .help("add e.g. `loss mse(out, y)` or `loss cross_entropy(logits, label)`"));
    };
    // The loss is checked last (its layers are numbered after the program's), but sees only the
    // values defined above it.
    scope.horizon = Some(loss_stmt.span.start);
    let loss = c.loss(loss_stmt, &mut scope)?;
    scope.horizon = None;
    let Some(train) = train else {
        return Err(err(
            Kind::Training,
            c.eof,
            "the program has no `train { ... }` section",
        )
        .label("expected a `train` section after this")
        .help("add e.g. `train { batch: 32, optimizer: sgd(lr: 0.01) }`"));
    };
    let train = c.train(train)?;
    c.check_unused(&scope, "")?;
    c.check_dead(loss.pred)?;
    c.check_trainable(&loss)?;
    Ok(Model {
        inputs: c.inputs,
        targets: c.targets,
        nodes: c.nodes,
        output: loss.pred,
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
        if is_input && dtype == DType::I32 {
            return Err(err(Kind::Shape, d.ty.span, "inputs must be float tensors")
                .label("`int` is only for class-label targets")
                .help("write e.g. `input x: [784]`"));
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

/// Span of the last non-blank character of the source (where "missing ..." errors point).
fn last_char(src: &str) -> Span {
    let trimmed = src.trim_end();
    match trimmed.char_indices().last() {
        Some((i, c)) => Span::new(i, i + c.len_utf8()),
        None => Span::new(0, 0),
    }
}
