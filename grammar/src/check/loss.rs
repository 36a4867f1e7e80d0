//! The `loss` statement: its terms (each a weight, a kind, a prediction and a target), and
//! whether their shapes and types fit each term's loss.

use super::args::{bind, Sig};
use super::names::LOSSES;
use super::scope::{Scope, Val};
use super::state::{err, Checker};
use super::suggest::{suggest, unsupported_help};
use crate::ast::{ExprKind, LossCall, LossStmt};
use crate::diag::{Error, Kind};
use crate::limits::fmt_shape;
use crate::model::*;

impl Checker<'_> {
    /// The loss: every term checked (each term's errors reported, all of them in one run); `None`
    /// when a term is in error.
    pub(super) fn loss(&mut self, l: &LossStmt, scope: &mut Scope) -> Option<Loss> {
        let mut terms = Vec::with_capacity(l.terms.len());
        let mut ok = true;
        for t in &l.terms {
            let r = self
                .loss_weight(t)
                .and_then(|w| self.loss_term(t, w, scope));
            match self.recover(r) {
                Some(term) => terms.push(term),
                None => {
                    t.args.iter().for_each(|a| scope.mark_used(&a.value));
                    ok = false;
                }
            }
        }
        (ok && !terms.is_empty()).then_some(Loss {
            terms,
            span: l.span,
        })
    }

    /// A term's weight: 1 without one, else a positive number that is finite in f32.
    fn loss_weight(&self, t: &LossCall) -> Result<f32, Error> {
        let Some(w) = &t.weight else { return Ok(1.0) };
        let v =
            match w.kind {
                ExprKind::Int(i) => i as f64,
                ExprKind::Float(f) => f,
                _ => return Err(
                    err(Kind::Argument, w.span, "a loss weight must be a number")
                        .label("not a number")
                        .help("write e.g. `loss 0.5 * mse(out, y) + cross_entropy(logits, label)`"),
                ),
            };
        let f = v as f32;
        if v.is_nan() || v <= 0.0 {
            return Err(err(
                Kind::Argument,
                w.span,
                format!("a loss weight must be positive, found {v:?}"),
            )
            .label("not positive")
            .help(format!(
                "weights scale a term's loss and gradient; drop the term instead of weighting it by {v:?}"
            )));
        }
        if !f.is_finite() || f == 0.0 {
            return Err(err(
                Kind::Argument,
                w.span,
                format!("the loss weight {v:?} does not fit in f32"),
            )
            .label("out of f32 range")
            .help("use a weight between about 1e-38 and 3.4e38"));
        }
        Ok(f)
    }

    fn loss_term(
        &mut self,
        l: &LossCall,
        weight: f32,
        scope: &mut Scope,
    ) -> Result<LossTerm, Error> {
        // The options each loss takes after (prediction, target), with their defaults.
        let options: &'static [(&'static str, bool)] = match l.func.name.as_str() {
            "mse" | "mae" | "bce_with_logits" => &[],
            "huber" => &[("delta", true)],
            "cross_entropy" => &[("label_smoothing", true)],
            other => {
                let mut e = err(
                    Kind::Training,
                    l.func.span,
                    format!("unknown loss `{other}`"),
                )
                .label("not a loss");
                let all = LOSSES
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                e = match (
                    suggest(other, LOSSES.iter().copied()),
                    unsupported_help(other),
                ) {
                    (Some(s), _) => e.help(format!("did you mean `{s}`? the losses are {all}")),
                    (None, Some(h)) => e.label("not a loss of dmc").help(h),
                    (None, None) => e.help(format!(
                        "the losses are {all}, each written `loss NAME(prediction, target)`"
                    )),
                };
                return Err(e);
            }
        };
        let fname = &l.func.name;
        let usage = match options.first() {
            Some((o, _)) => format!("write `loss {fname}(prediction, target)` or `loss {fname}(prediction, target, {o}: ...)`"),
            None => format!("write `loss {fname}(prediction, target)`"),
        };
        if let Some(a) = l.args.iter().take(2).find(|a| a.name.is_some()) {
            let n = a.name.as_ref().map(|n| n.name.clone()).unwrap_or_default();
            let known = options.iter().any(|(o, _)| *o == n);
            let msg = if known {
                format!("`{n}` comes after the prediction and the target")
            } else {
                format!("`{fname}` has no argument `{n}`")
            };
            return Err(err(Kind::Argument, a.span, msg)
                .label("unknown argument")
                .help(usage));
        }
        if let (true, Some(a)) = (options.is_empty(), l.args.get(2)) {
            if let Some(n) = &a.name {
                return Err(err(
                    Kind::Argument,
                    n.span,
                    format!("`{fname}` has no argument `{}`", n.name),
                )
                .label("unknown argument")
                .help(format!("`{fname}` takes no options: {usage}")));
            }
        }
        if l.args.len() < 2 || (options.is_empty() && l.args.len() != 2) {
            return Err(err(
                Kind::Argument,
                l.span,
                format!(
                    "`{fname}` takes 2 arguments (prediction, target), got {}",
                    l.args.len()
                ),
            )
            .label("wrong number of arguments")
            .help(usage));
        }
        let kind = self.loss_kind(l, options)?;
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
            LossKind::Mse | LossKind::Mae | LossKind::Huber { .. } | LossKind::BceWithLogits => {
                if t.dtype == DType::I32 {
                    let hint = if kind == LossKind::BceWithLogits {
                        "`bce_with_logits` takes float targets of the prediction's shape (0/1 or probabilities, one per output); for one class label per sample use `cross_entropy`".to_string()
                    } else {
                        "use `cross_entropy` for class labels, or declare the target with a shape like `[1]`".to_string()
                    };
                    return Err(err(
                        Kind::Training,
                        tspan,
                        format!(
                            "`{fname}` needs a float target, but `{}` is declared `int`",
                            t.name
                        ),
                    )
                    .label("integer labels")
                    .note(t.span, "declared here")
                    .help(hint));
                }
                if ps != t.shape {
                    return Err(err(Kind::Shape, pspan, format!("`{fname}` compares a prediction of shape {} with a target of shape {}", fmt_shape(&ps), fmt_shape(&t.shape)))
                        .label(format!("prediction is {}", fmt_shape(&ps)))
                        .note(t.span, format!("target is {}", fmt_shape(&t.shape)))
                        .help("make the last layer produce the target's shape (e.g. `dense(1)` for `[1]`)"));
                }
            }
            LossKind::CrossEntropy { .. } => {
                if t.dtype != DType::I32 {
                    return Err(err(Kind::Training, tspan, format!("`cross_entropy` needs integer class labels, but `{}` is a float target", t.name))
                        .label("float target")
                        .note(t.span, "declared here")
                        .help(format!("declare it as `target {}: int`", t.name)));
                }
                // one label per position of a sequence of logits [t, classes]: labels int[t]
                let per_position = ps.len() == 2 && t.shape == ps[..1];
                if per_position && ps[1] < 2 {
                    return Err(err(
                        Kind::Shape,
                        pspan,
                        "`cross_entropy` needs at least 2 classes, the prediction has 1",
                    )
                    .label("one logit per position")
                    .help("end the network with `dense(classes)`"));
                }
                if !(per_position || t.shape.is_empty() || t.shape == [1]) {
                    return Err(err(
                        Kind::Shape,
                        t.span,
                        format!(
                            "class labels must be one integer per sample (or per position of a sequence), but `{}` is {}",
                            t.name,
                            fmt_shape(&t.shape)
                        ),
                    )
                    .label("wrong label shape")
                    .help(if ps.len() == 2 {
                        format!(
                            "the logits are {}: one label per position is `target {}: int[{}]`",
                            fmt_shape(&ps),
                            t.name,
                            ps[0]
                        )
                    } else {
                        format!("declare it as `target {}: int`", t.name)
                    }));
                }
                if !per_position && ps.len() != 1 {
                    return Err(err(Kind::Shape, pspan, format!("`cross_entropy` expects logits of shape [classes] (or [t, classes] with labels int[t]), got {}", fmt_shape(&ps)))
                        .label(format!("prediction is {}", fmt_shape(&ps)))
                        .help("end the network with `|> flatten |> dense(classes)` or `|> global_avgpool |> dense(classes)`"));
                }
                if !per_position && ps[0] < 2 {
                    return Err(err(
                        Kind::Shape,
                        pspan,
                        "`cross_entropy` needs at least 2 classes, the prediction has 1",
                    )
                    .label("one logit")
                    .help("use `bce_with_logits` (a binary classifier's single logit) or `mse` for a single output"));
                }
            }
        }
        Ok(LossTerm {
            kind,
            pred,
            target,
            weight,
            span: l.span,
        })
    }

    /// The loss named by `l` with its options (the arguments after prediction and target, bound
    /// to `options`), checked.
    fn loss_kind(
        &self,
        l: &LossCall,
        options: &'static [(&'static str, bool)],
    ) -> Result<LossKind, Error> {
        let fname = l.func.name.as_str();
        let op = LOSSES
            .iter()
            .copied()
            .find(|n| *n == fname)
            .unwrap_or("mse");
        let sig = Sig {
            op,
            params: options.to_vec(),
            example: None,
        };
        let mut positional = vec![];
        let mut kw = vec![];
        for a in &l.args[2..] {
            let v = self.const_eval(&a.value)?;
            match &a.name {
                Some(n) => kw.push((n, v, a.value.span)),
                None if kw.is_empty() => positional.push((v, a.value.span)),
                None => {
                    return Err(err(
                        Kind::Argument,
                        a.span,
                        "positional argument after a keyword argument",
                    )
                    .label("positional")
                    .help("put positional arguments first"))
                }
            }
        }
        let b = bind(&sig, positional, kw, &l.func, l.span)?;
        let at = |k: &str| b.get(k).map_or(l.span, |(_, s)| *s);
        let finite = |k: &str, v: f64| -> Result<f32, Error> {
            let f = v as f32;
            if f.is_finite() {
                return Ok(f);
            }
            Err(err(
                Kind::Argument,
                at(k),
                format!("`{k}` = {v:?} does not fit in f32"),
            )
            .label("out of f32 range"))
        };
        Ok(match fname {
            "mae" => LossKind::Mae,
            "bce_with_logits" => LossKind::BceWithLogits,
            "huber" => {
                let delta = b.float("delta", 1.0)?;
                let d = finite("delta", delta)?;
                if d <= 0.0 || delta.is_nan() {
                    return Err(err(
                        Kind::Argument,
                        at("delta"),
                        format!("`delta` must be positive, found {delta:?}"),
                    )
                    .label("out of range")
                    .help("`delta` is where the loss turns from quadratic to linear, e.g. `delta: 1.0`"));
                }
                LossKind::Huber { delta: d }
            }
            "cross_entropy" => {
                let e = b.float("label_smoothing", 0.0)?;
                if !(0.0..=1.0).contains(&e) {
                    return Err(err(
                        Kind::Argument,
                        at("label_smoothing"),
                        format!("`label_smoothing` must be in [0, 1], found {e:?}"),
                    )
                    .label("out of range")
                    .help("a typical value is `label_smoothing: 0.1`"));
                }
                LossKind::CrossEntropy {
                    label_smoothing: e as f32,
                }
            }
            _ => LossKind::Mse,
        })
    }
}
