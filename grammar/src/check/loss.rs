//! The `loss` statement: its kind, prediction and target, and whether their shapes and types
//! fit the loss.

use super::names::LOSSES;
use super::scope::{Scope, Val};
use super::state::{err, Checker};
use super::suggest::{suggest, unsupported_help};
use crate::ast::LossStmt;
use crate::diag::{Error, Kind};
use crate::limits::fmt_shape;
use crate::model::*;

impl Checker<'_> {
    pub(super) fn loss(&mut self, l: &LossStmt, scope: &mut Scope) -> Result<Loss, Error> {
        let kind = match l.func.name.as_str() {
            "mse" => LossKind::Mse,
            "cross_entropy" => LossKind::CrossEntropy,
            other => {
                let mut e = err(
                    Kind::Training,
                    l.func.span,
                    format!("unknown loss `{other}`"),
                )
                .label("not a loss");
                e = match (suggest(other, LOSSES.iter().copied()), unsupported_help(other)) {
                    (Some(s), _) => e.help(format!("did you mean `{s}`? the losses are `mse` and `cross_entropy`")),
                    (None, Some(h)) => e.label("not a loss of dmc").help(h),
                    (None, None) => e.help("the losses are `mse(prediction, target)` and `cross_entropy(logits, labels)`"),
                };
                return Err(e);
            }
        };
        let fname = &l.func.name;
        if let Some(a) = l.args.iter().find(|a| a.name.is_some()) {
            let n = a.name.as_ref().map(|n| n.name.clone()).unwrap_or_default();
            return Err(err(
                Kind::Argument,
                a.span,
                format!("`{fname}` has no argument `{n}`"),
            )
            .label("unknown argument")
            .help(format!("write `loss {fname}(prediction, target)`")));
        }
        if l.args.len() != 2 {
            return Err(err(
                Kind::Argument,
                l.span,
                format!(
                    "`{fname}` takes 2 arguments (prediction, target), got {}",
                    l.args.len()
                ),
            )
            .label("wrong number of arguments")
            .help(format!("write `loss {fname}(prediction, target)`")));
        }
        let pv = self.eval(&l.args[0].value, scope)?;
        let pspan = l.args[0].value.span;
        let pred = match pv {
            Val::Tensor(ValueRef::Target(_)) => {
                return Err(err(
                    Kind::Training,
                    pspan,
                    "the prediction of the loss is a target",
                )
                .label("this is a target")
                .help(format!(
                    "write `loss {fname}(prediction, target)` with the prediction first"
                )))
            }
            v => self.expect_tensor(&v, pspan, "the prediction", scope)?,
        };
        if !matches!(pred, ValueRef::Node(_)) {
            return Err(err(
                Kind::Training,
                pspan,
                "the loss' prediction must be computed by layers",
            )
            .label("this is an input")
            .help("apply at least one layer, e.g. `out = x |> dense(1)`"));
        }
        let tspan = l.args[1].value.span;
        let tv = self.eval(&l.args[1].value, scope)?;
        let target = match tv {
            Val::Tensor(r @ ValueRef::Target(_)) => r,
            Val::Sym(s) => return Err(self.unknown_name(&s, tspan, Some(scope))),
            Val::Poison => return Err(Error::follow_on(tspan)),
            _ => {
                return Err(err(
                    Kind::Training,
                    tspan,
                    format!("the second argument of `{fname}` must be a declared `target`"),
                )
                .label("not a target")
                .help("declare it, e.g. `target y: [1]`, and pass its name"))
            }
        };
        let ps = self.shape_of(pred).clone();
        let ValueRef::Target(ti) = target else {
            return Err(err(Kind::Training, tspan, "not a target"));
        };
        let t = self.targets[ti].clone();
        match kind {
            LossKind::Mse => {
                if t.dtype == DType::I32 {
                    return Err(err(Kind::Training, tspan, format!("`mse` needs a float target, but `{}` is declared `int`", t.name))
                        .label("integer labels")
                        .note(t.span, "declared here")
                        .help("use `cross_entropy` for class labels, or declare the target with a shape like `[1]`"));
                }
                if ps != t.shape {
                    return Err(err(Kind::Shape, pspan, format!("`mse` compares a prediction of shape {} with a target of shape {}", fmt_shape(&ps), fmt_shape(&t.shape)))
                        .label(format!("prediction is {}", fmt_shape(&ps)))
                        .note(t.span, format!("target is {}", fmt_shape(&t.shape)))
                        .help("make the last layer produce the target's shape (e.g. `dense(1)` for `[1]`)"));
                }
            }
            LossKind::CrossEntropy => {
                if t.dtype != DType::I32 {
                    return Err(err(Kind::Training, tspan, format!("`cross_entropy` needs integer class labels, but `{}` is a float target", t.name))
                        .label("float target")
                        .note(t.span, "declared here")
                        .help(format!("declare it as `target {}: int`", t.name)));
                }
                if !(t.shape.is_empty() || t.shape == [1]) {
                    return Err(err(
                        Kind::Shape,
                        t.span,
                        format!(
                            "class labels must be one integer per sample, but `{}` is {}",
                            t.name,
                            fmt_shape(&t.shape)
                        ),
                    )
                    .label("wrong label shape")
                    .help(format!("declare it as `target {}: int`", t.name)));
                }
                if ps.len() != 1 {
                    return Err(err(Kind::Shape, pspan, format!("`cross_entropy` expects logits of shape [classes], got {}", fmt_shape(&ps)))
                        .label(format!("prediction is {}", fmt_shape(&ps)))
                        .help("end the network with `|> flatten |> dense(classes)` or `|> global_avgpool |> dense(classes)`"));
                }
                if ps[0] < 2 {
                    return Err(err(
                        Kind::Shape,
                        pspan,
                        "`cross_entropy` needs at least 2 classes, the prediction has 1",
                    )
                    .label("one logit")
                    .help("use `mse` (or a `sigmoid` output) for a single output"));
                }
            }
        }
        Ok(Loss {
            kind,
            pred,
            target,
            span: l.span,
        })
    }
}
