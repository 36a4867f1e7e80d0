//! Evaluation of expressions: names, numbers, tuples, sums and pipelines (with `repeat`), down to
//! the calls of layers and blocks.

use super::scope::{describe, is_option_word, Scope, Val};
use super::state::{err, Checker, NO_VALUE};
use crate::ast::*;
use crate::diag::{Error, Kind};
use crate::model::ValueRef;

impl Checker<'_> {
    /// What may be bound to a name: tensors and numbers.
    pub(super) fn storable(&self, v: Val, e: &Expr, scope: &Scope) -> Result<Val, Error> {
        match v {
            Val::Sym(s) => Err(self.unknown_name(&s, e.span, Some(scope))),
            Val::Tuple(_) => Err(
                err(Kind::Argument, e.span, "a tuple cannot be given a name")
                    .label("tuples are only used as arguments (e.g. `betas: (0.9, 0.999)`)"),
            ),
            v => Ok(v),
        }
    }

    pub(super) fn expect_tensor(
        &self,
        v: &Val,
        span: Span,
        what: &str,
        scope: &Scope,
    ) -> Result<ValueRef, Error> {
        match v {
            Val::Tensor(r) => {
                if let ValueRef::Target(i) = r {
                    return Err(err(
                        Kind::Name,
                        span,
                        format!(
                            "target `{}` cannot be fed to a layer",
                            self.targets[*i].name
                        ),
                    )
                    .label("a target")
                    .help("targets are only used in the `loss`"));
                }
                Ok(*r)
            }
            Val::Sym(s) => Err(self.unknown_name(s, span, Some(scope))),
            Val::Poison => Err(Error::follow_on(span)),
            other => Err(err(
                Kind::Argument,
                span,
                format!("{what} must be a tensor value, found {}", describe(other)),
            )
            .label("not a tensor")),
        }
    }

    pub(super) fn eval(&mut self, e: &Expr, scope: &mut Scope) -> Result<Val, Error> {
        self.step(e.span)?;
        match &e.kind {
            ExprKind::Int(i) => Ok(Val::Int(*i)),
            ExprKind::Float(f) => Ok(Val::Float(*f)),
            ExprKind::Name(n) => {
                let horizon = scope.horizon;
                match scope.vars.get_mut(n) {
                    Some(b) if !matches!(horizon, Some(h) if b.span.start > h) => {
                        b.used = true;
                        return Ok(b.val.clone());
                    }
                    _ => {}
                }
                // A name defined further down (not an option word such as `relu`, which may
                // also name a value).
                if let Some(def) = scope.later.get(n) {
                    if def.start > e.span.start && !is_option_word(n) {
                        return Err(self.before_definition(n, e.span, *def));
                    }
                }
                Ok(Val::Sym(n.clone()))
            }
            ExprKind::Tuple(items) => {
                let mut out = vec![];
                for it in items {
                    out.push((self.eval(it, scope)?, it.span));
                }
                Ok(Val::Tuple(out))
            }
            ExprKind::Add(terms) | ExprKind::Mul(terms) => {
                let (op, layer) = match &e.kind {
                    ExprKind::Mul(_) => ("*", "multiply"),
                    _ => ("+", "add"),
                };
                let Some(first) = terms.first() else {
                    return Err(err(Kind::Syntax, e.span, "empty sum").label("nothing to add"));
                };
                // Every term is checked, also when one is in error.
                let mut refs = vec![];
                let mut poisoned = false;
                for (i, t) in terms.iter().enumerate() {
                    let v = self.eval(t, scope)?;
                    let side = if i == 0 { "left" } else { "right" };
                    match v {
                        Val::Poison => poisoned = true,
                        v => refs.push(self.expect_tensor(
                            &v,
                            t.span,
                            &format!("the {side} side of `{op}`"),
                            scope,
                        )?),
                    }
                }
                if poisoned {
                    return Ok(Val::Poison);
                }
                let mut acc = refs[0];
                for (i, t) in terms.iter().enumerate().skip(1) {
                    let rb = refs[i];
                    let left = Span::new(first.span.start, terms[i - 1].span.end);
                    let span = Span::new(first.span.start, t.span.end);
                    acc = match self.binary(layer, acc, left, rb, t.span, span)? {
                        Val::Tensor(r) => r,
                        _ => {
                            return Err(err(
                                Kind::Shape,
                                span,
                                format!("cannot `{op}` these values"),
                            ))
                        }
                    };
                }
                Ok(Val::Tensor(acc))
            }
            ExprKind::Pipe(input, stages) => {
                let v = self.eval(input, scope)?;
                if v == Val::Poison {
                    self.detached_stages(stages, scope)?;
                    return Ok(Val::Poison);
                }
                let mut r = self.expect_tensor(&v, input.span, "the input of a pipeline", scope)?;
                let mut out = Val::Tensor(r);
                for (i, st) in stages.iter().enumerate() {
                    out = match self.stage(st, r, scope) {
                        Ok(v) => v,
                        Err(e) if e.is_follow_on() => return Err(e),
                        Err(e) => {
                            // The stages after one in error are checked as after a value in
                            // error.
                            self.report(e);
                            self.detached_stages(&stages[i + 1..], scope)?;
                            return Err(Error::follow_on(st.span));
                        }
                    };
                    r = self.expect_tensor(&out, st.span, "a stage's result", scope)?;
                }
                Ok(out)
            }
            ExprKind::Call { func, args, label } => {
                self.call(func, args, label.as_ref(), None, e.span, scope)
            }
            ExprKind::Repeat { .. } => Err(err(
                Kind::Syntax,
                e.span,
                "`repeat` can only be used as a pipeline stage",
            )
            .label("not after `|>`")),
        }
    }

    pub(super) fn stage(
        &mut self,
        st: &Expr,
        input: ValueRef,
        scope: &mut Scope,
    ) -> Result<Val, Error> {
        self.step(st.span)?;
        match &st.kind {
            ExprKind::Name(n) => {
                if scope.vars.contains_key(n) {
                    return Err(err(
                        Kind::Name,
                        st.span,
                        format!("`{n}` is a value, not an operation"),
                    )
                    .label("cannot be applied with `|>`")
                    .help("stages after `|>` must be operations or blocks, e.g. `|> relu`"));
                }
                let func = Ident {
                    name: n.clone(),
                    span: st.span,
                };
                self.call(&func, &[], None, Some(input), st.span, scope)
            }
            ExprKind::Call { func, args, label } => {
                self.call(func, args, label.as_ref(), Some(input), st.span, scope)
            }
            ExprKind::Repeat { count, body } => {
                let cv = self.eval(count, scope)?;
                let n = match cv {
                    Val::Int(n) if n >= 1 => n as usize,
                    Val::Poison => return Err(Error::follow_on(count.span)),
                    Val::Int(n) => {
                        return Err(err(
                            Kind::Argument,
                            count.span,
                            format!("repeat count must be at least 1, found {n}"),
                        )
                        .label("out of range"))
                    }
                    other => {
                        return Err(err(
                            Kind::Argument,
                            count.span,
                            format!(
                                "repeat count must be a whole number, found {}",
                                describe(&other)
                            ),
                        )
                        .label("expected an integer"))
                    }
                };
                let mut cur = input;
                for i in 1..=n {
                    self.frame().repeat.push(i);
                    let r = self.repeat_body(body, cur, scope);
                    self.frame().repeat.pop();
                    cur = r?;
                }
                Ok(Val::Tensor(cur))
            }
            _ => Err(
                err(Kind::Syntax, st.span, "expected an operation after `|>`")
                    .label("not an operation"),
            ),
        }
    }

    /// The stages of a pipeline whose input is in error: what they say without the input (unknown
    /// operations, wrong arguments) is an error; what needs the input is not checked.
    fn detached_stages(&mut self, stages: &[Expr], scope: &mut Scope) -> Result<(), Error> {
        let was = std::mem::replace(&mut self.detached, true);
        let mut r = Ok(());
        for st in stages {
            if let Err(e) = self.stage(st, NO_VALUE, scope) {
                if !e.is_follow_on() {
                    r = Err(e);
                    break;
                }
            }
        }
        self.detached = was;
        r
    }

    /// One iteration of a `repeat`'s stages, from `input`.
    fn repeat_body(
        &mut self,
        body: &[Expr],
        input: ValueRef,
        scope: &mut Scope,
    ) -> Result<ValueRef, Error> {
        let mut cur = input;
        for s in body {
            let v = self.stage(s, cur, scope)?;
            cur = self.expect_tensor(&v, s.span, "a stage's result", scope)?;
        }
        Ok(cur)
    }
}
