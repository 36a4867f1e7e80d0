//! Calls of the table's layers: dispatching a call to a block, a layer or an error, binding its
//! arguments, building the layer through its table entry and emitting its node(s).

use super::args::{bind, layer_args, Bound, Sig};
use super::names::{LOSSES, OPTIMIZERS};
use super::scope::{is_option_word, Scope, Val};
use super::state::{err, Checker, NO_VALUE};
use super::suggest::{suggest, unsupported_help};
use crate::ast::*;
use crate::diag::{Error, Kind};
use crate::init::WITH_PARAM;
use crate::layers::args::{ArgKind, Args};
use crate::layers::build::Input;
use crate::layers::{self, Inputs, LayerDef};
use crate::limits::elems;
use crate::model::*;

impl Checker<'_> {
    /// `a + b` / `a * b`: the table's layer `layer` (`add`, `multiply`) of two values, `sa` and
    /// `sb` where they are written.
    pub(super) fn binary(
        &mut self,
        layer: &str,
        a: ValueRef,
        sa: Span,
        b: ValueRef,
        sb: Span,
        span: Span,
    ) -> Result<Val, Error> {
        let Some(def) = layers::operator(layer) else {
            return Err(err(
                Kind::Name,
                span,
                format!("internal error: the layer table has no operator `{layer}`"),
            )
            .label("while checking this expression"));
        };
        let args = Args {
            call: span,
            vals: vec![],
        };
        self.apply(def, &args, &[(a, sa), (b, sb)], None, span)
    }

    /// A call `func(args)` (or a bare stage `|> func`), `piped` the value from `|>`.
    pub(super) fn call(
        &mut self,
        func: &Ident,
        args: &[Arg],
        label: Option<&Ident>,
        piped: Option<ValueRef>,
        span: Span,
        scope: &mut Scope,
    ) -> Result<Val, Error> {
        let name = func.name.as_str();
        if let Some(b) = self.blocks.get(name).copied() {
            return self.expand_block(b, func, args, label, piped, span, scope);
        }
        if scope.vars.contains_key(name) {
            return Err(err(
                Kind::Name,
                func.span,
                format!("`{name}` is a value, not an operation"),
            )
            .label("cannot be called"));
        }
        if LOSSES.contains(&name) {
            return Err(err(
                Kind::Name,
                func.span,
                format!("`{name}` is a loss, not a layer"),
            )
            .label("used as a layer")
            .help(format!(
                "losses go in a `loss` statement: `loss {name}(prediction, target)`"
            )));
        }
        if OPTIMIZERS.contains(&name) {
            return Err(err(
                Kind::Name,
                func.span,
                format!("`{name}` is an optimizer, not a layer"),
            )
            .label("used as a layer")
            .help(format!(
                "optimizers go in the train section: `train {{ optimizer: {name}(...) }}`"
            )));
        }
        let Some(def) = layers::find(name) else {
            let mut e = err(Kind::Name, func.span, format!("unknown operation `{name}`"))
                .label("not an operation or block");
            let mut cands: Vec<&str> = vec![];
            for n in layers::names() {
                cands.push(n);
            }
            cands.extend(self.blocks.keys().map(|s| s.as_str()));
            e = match (suggest(name, cands.iter().copied()), unsupported_help(name)) {
                (Some(s), _) => e.help(format!("did you mean `{s}`?")),
                (None, Some(h)) => e.label("not an operation of dmc").help(h),
                (None, None) => e.help(format!(
                    "the operations are: {}",
                    layers::names().collect::<Vec<_>>().join(", ")
                )),
            };
            return Err(e);
        };
        if def.inputs != Inputs::One {
            return self.values_call(def, func, args, label, piped, span, scope);
        }
        // Input value.
        let mut positional: Vec<(Val, Span)> = vec![];
        let mut kw: Vec<(&Ident, Val, Span)> = vec![];
        for a in args {
            let v = match self.activation_value(&a.value, scope) {
                Some(v) => v?,
                None => match self.init_value(&a.value, scope) {
                    Some(v) => v?,
                    None => self.eval(&a.value, scope)?,
                },
            };
            match &a.name {
                Some(n) => kw.push((n, v, a.value.span)),
                None => {
                    if !kw.is_empty() {
                        return Err(err(
                            Kind::Argument,
                            a.span,
                            "positional argument after a keyword argument",
                        )
                        .label("positional")
                        .help("put positional arguments first"));
                    }
                    positional.push((v, a.value.span));
                }
            }
        }
        let mut no_input = false;
        let input = match piped {
            Some(r) => {
                if let Some((Val::Tensor(_), s)) = positional.first() {
                    return Err(err(
                        Kind::Argument,
                        *s,
                        format!("`{name}` gets its input from `|>` and cannot take another"),
                    )
                    .label("second input")
                    .help(format!(
                        "remove this argument, or write `{name}(...)` without the pipe"
                    )));
                }
                r
            }
            None => match positional.first() {
                Some((Val::Poison, _)) => {
                    // In error: the arguments are checked, nothing is built.
                    positional.remove(0);
                    no_input = true;
                    NO_VALUE
                }
                Some((Val::Tensor(_) | Val::Sym(_), _)) => {
                    let (v, s) = positional.remove(0);
                    self.expect_tensor(&v, s, &format!("the input of `{name}`"), scope)?
                }
                _ => {
                    let shown = if args.is_empty() {
                        String::new()
                    } else {
                        "...".to_string()
                    };
                    return Err(err(Kind::Argument, span, format!("`{name}` has no input value"))
                        .label("input missing")
                        .help(format!("pipe a value into it (`x |> {name}({shown})`) or pass it first (`{name}(x{})`)", if shown.is_empty() { "" } else { ", ..." })));
                }
            },
        };
        let bound = bind(&Sig::of_layer(def), positional, kw, func, span)?;
        self.resolve_names(def, &bound, scope)?;
        let args = layer_args(def, &bound)?;
        if no_input {
            return Err(Error::follow_on(span));
        }
        self.apply(def, &args, &[(input, span)], label, span)
    }
    /// An activation with its parameter written as an argument, `activation: leaky_relu(0.2)`: a
    /// call of an activation with numbers only (a layer call would have an input value). `None`
    /// when `e` is not one.
    fn activation_value(&mut self, e: &Expr, scope: &Scope) -> Option<Result<Val, Error>> {
        let ExprKind::Call {
            func,
            args,
            label: None,
        } = &e.kind
        else {
            return None;
        };
        let a = Activation::from_name(&func.name)?;
        if self.blocks.contains_key(func.name.as_str()) || scope.vars.contains_key(&func.name) {
            return None;
        }
        let numbers = |x: &Arg| matches!(x.value.kind, ExprKind::Int(_) | ExprKind::Float(_));
        if !args.iter().all(numbers) {
            return None;
        }
        let Some(p) = a.param() else {
            if args.is_empty() {
                return Some(Ok(Val::Act(a)));
            }
            return Some(Err(err(
                Kind::Argument,
                args[0].span,
                format!("the activation `{}` takes no parameter", a.name()),
            )
            .label("unexpected argument")
            .help(format!("write `activation: {}`", a.name()))));
        };
        Some(self.activation_with_param(a, p, func, args, e.span))
    }

    /// An initialiser with its parameter, `init: normal(std: 0.02)` / `uniform(0.05)`: a call of
    /// `normal` or `uniform` with numbers only. `None` when `e` is not one.
    fn init_value(&mut self, e: &Expr, scope: &Scope) -> Option<Result<Val, Error>> {
        let ExprKind::Call {
            func,
            args,
            label: None,
        } = &e.kind
        else {
            return None;
        };
        let &(name, pname) = WITH_PARAM.iter().find(|(n, _)| *n == func.name)?;
        if self.blocks.contains_key(func.name.as_str()) || scope.vars.contains_key(&func.name) {
            return None;
        }
        let numbers = |x: &Arg| matches!(x.value.kind, ExprKind::Int(_) | ExprKind::Float(_));
        if !args.iter().all(numbers) {
            return None;
        }
        let sig = Sig {
            op: name,
            params: vec![(pname, false)],
            example: None,
        };
        let (positional, kw) = numeric_args(args);
        let r = (|| {
            let b = bind(&sig, positional, kw, func, e.span)?;
            let v = b.float(pname, 0.0)?;
            let at = b.get(pname).map_or(e.span, |(_, s)| *s);
            Initializer::with_param(name, v)
                .map(Val::Init)
                .map_err(|reason| {
                    err(Kind::Argument, at, reason)
                        .label("out of range")
                        .help(format!("for example: `{name}({pname}: 0.02)`"))
                })
        })();
        Some(r)
    }

    /// `leaky_relu(0.2)` / `leaky_relu(alpha: 0.2)` as an argument: binds and checks the parameter.
    fn activation_with_param(
        &mut self,
        a: Activation,
        p: dmc_plan::unary::UnaryParam,
        func: &Ident,
        args: &[Arg],
        span: Span,
    ) -> Result<Val, Error> {
        let sig = Sig {
            op: a.name(),
            params: vec![(p.name, true)],
            example: None,
        };
        let (positional, kw) = numeric_args(args);
        let b = bind(&sig, positional, kw, func, span)?;
        let v = b.float(p.name, p.default)?;
        let at = b.get(p.name).map_or(span, |(_, s)| *s);
        a.with_param(v).map(Val::Act).map_err(|reason| {
            err(Kind::Argument, at, reason)
                .label("out of range")
                .help(format!(
                    "for example: `activation: {}({})`",
                    a.name(),
                    p.default
                ))
        })
    }

    /// A bare name given for an argument that is not an option word is a value the call cannot
    /// see: unknown, defined below, or (in a block) a top-level value. Said so, rather than that
    /// the argument has the wrong type; for options (`padding: sme`) the option's error lists the
    /// choices, unless the name is a top-level value used in a block.
    fn resolve_names(&self, def: &LayerDef, bound: &Bound, scope: &Scope) -> Result<(), Error> {
        for p in def.params {
            let Some((Val::Sym(s), span)) = bound.get(p.name) else {
                continue;
            };
            if is_option_word(s) {
                continue;
            }
            let value_kind = matches!(
                p.kind,
                ArgKind::Count
                    | ArgKind::Natural
                    | ArgKind::Pair
                    | ArgKind::Number
                    | ArgKind::Shape
                    | ArgKind::Value
            );
            let outside = scope.in_block.is_some() && self.top_names.contains_key(s);
            if value_kind || outside {
                return Err(self.unknown_name(s, *span, Some(scope)));
            }
        }
        Ok(())
    }

    /// `dense(units, tie: e)` on `fin` features: `e` must be the output of an `embedding` of
    /// `units` tokens and `fin` dimensions (whose table `[units, fin]` the layer reads transposed).
    fn check_tie(&self, e: usize, units: usize, fin: usize, span: Span) -> Result<(), Error> {
        let node = self.nodes.get(e);
        match node.map(|n| &n.layer) {
            Some(&Layer::Embedding { vocab, dim }) if vocab == units && dim == fin => Ok(()),
            Some(&Layer::Embedding { vocab, dim }) => Err(err(
                Kind::Shape,
                span,
                format!(
                    "a dense layer tied to an embedding reads its table [{vocab}, {dim}] transposed, as a weight [{dim}, {vocab}], but this one maps {fin} features to {units}"
                ),
            )
            .label(format!("table [{vocab}, {dim}]"))
            .help(format!("a tied output head has `dense({vocab}, tie: ...)` on inputs of {dim} features"))),
            _ => Err(err(
                Kind::Argument,
                span,
                format!(
                    "`tie` names the output of `{}`, not of an `embedding` layer",
                    node.map_or("?", |n| n.name.as_str())
                ),
            )
            .label("not an embedding's output")
            .help("pass the value an `embedding` layer computes: `e = tokens |> embedding(256, 128)` ... `dense(256, tie: e)`")),
        }
    }

    /// A layer of values only: `add(a, b)` or `a |> add(b)` (exactly two), `concat(a, b, ...)` or
    /// `a |> concat(b, ...)` (two or more).
    #[allow(clippy::too_many_arguments)]
    fn values_call(
        &mut self,
        def: &LayerDef,
        func: &Ident,
        args: &[Arg],
        label: Option<&Ident>,
        piped: Option<ValueRef>,
        span: Span,
        scope: &mut Scope,
    ) -> Result<Val, Error> {
        let name = def.name;
        let usage = match (def.inputs, name) {
            (Inputs::Pair, "add") => "write `add(a, b)`, `a |> add(b)` or `a + b`".to_string(),
            (Inputs::Pair, "multiply") => {
                "write `multiply(a, b)`, `a |> multiply(b)` or `a * b`".to_string()
            }
            (Inputs::Pair, _) => format!("write `{name}(a, b)` or `a |> {name}(b)`"),
            (Inputs::Many | Inputs::One, _) => {
                format!("write `{name}(a, b, ...)` or `a |> {name}(b, ...)`")
            }
        };
        let mut vals = vec![];
        if let Some(p) = piped {
            vals.push((p, func.span));
        }
        for a in args {
            if let Some(n) = &a.name {
                return Err(err(
                    Kind::Argument,
                    n.span,
                    format!("`{name}` has no argument `{}`", n.name),
                )
                .label("unknown argument")
                .help(usage));
            }
            let v = self.eval(&a.value, scope)?;
            let r =
                self.expect_tensor(&v, a.value.span, &format!("an argument of `{name}`"), scope)?;
            vals.push((r, a.value.span));
        }
        let (ok, want) = match def.inputs {
            Inputs::Many => (vals.len() >= 2, "at least 2"),
            Inputs::Pair | Inputs::One => (vals.len() == 2, "exactly 2"),
        };
        if !ok {
            return Err(err(
                Kind::Argument,
                span,
                format!("`{name}` takes {want} values, got {}", vals.len()),
            )
            .label("wrong number of values")
            .help(usage));
        }
        let args = Args {
            call: span,
            vals: vec![],
        };
        self.apply(def, &args, &vals, label, span)
    }

    /// Builds `def` for `inputs` (each with the span its errors point at) and emits its node, and
    /// the node of its `activation:` if it has one.
    fn apply(
        &mut self,
        def: &LayerDef,
        args: &Args,
        inputs: &[(ValueRef, Span)],
        label: Option<&Ident>,
        span: Span,
    ) -> Result<Val, Error> {
        if self.detached || inputs.iter().any(|(r, _)| *r == NO_VALUE) {
            return Err(Error::follow_on(span));
        }
        let shapes: Vec<Shape> = inputs
            .iter()
            .map(|(r, _)| self.shape_of(*r).clone())
            .collect();
        let ins: Vec<Input<'_>> = shapes
            .iter()
            .zip(inputs)
            .map(|(shape, (r, s))| Input {
                shape,
                span: *s,
                int: self.is_int(*r),
            })
            .collect();
        if let Some(x) = ins.iter().find(|x| x.int && !def.reads_tokens()) {
            return Err(err(
                Kind::Shape,
                x.span,
                format!(
                    "`{}` computes on floats, but its input is integer tokens int{}",
                    def.name,
                    crate::limits::fmt_shape(x.shape)
                ),
            )
            .label("integer input")
            .help("integer inputs are tokens: turn them into vectors first, e.g. `tokens |> embedding(256, 128)`"));
        }
        let mut built = def.build(&ins, args)?;
        if let Layer::Dense {
            units,
            tied: Some(e),
            ..
        } = built.layer
        {
            let fin = ins
                .first()
                .and_then(|x| x.shape.last())
                .copied()
                .unwrap_or(0);
            self.check_tie(e, units, fin, args.span("tie"))?;
            // the embedding's table is the weight: only the bias is this layer's own
            built.params.retain(|p| p.is_bias);
        }
        let (name, ns) = self.layer_name(def.name, label);
        let mut specs = vec![];
        for p in built.params {
            elems(&p.shape, span)?;
            // `init:` / `bias_init:`, for the layers whose signature has them
            let init = args.init(if p.is_bias { "bias_init" } else { "init" });
            specs.push(ParamSpec {
                name: format!("{name}.{}", p.suffix),
                shape: p.shape,
                fan_in: p.fan_in,
                fan_out: p.fan_out,
                is_bias: p.is_bias,
                init,
            });
        }
        let r = self.push_node(
            name.clone(),
            ns.unwrap_or(span),
            built.layer,
            inputs.iter().map(|(r, _)| *r).collect(),
            built.shape.clone(),
            specs,
            span,
        )?;
        if let Some(a) = built.activation {
            let an = format!("{name}_{}", a.name());
            let r2 = self.push_node(
                an,
                ns.unwrap_or(span),
                Layer::Act(a),
                vec![r],
                built.shape,
                vec![],
                span,
            )?;
            return Ok(Val::Tensor(r2));
        }
        Ok(Val::Tensor(r))
    }
}

/// The literal numbers of a call's arguments (anything else poisoned), split into positional and
/// keyword ones, for [`bind`].
fn numeric_args(args: &[Arg]) -> NumericArgs<'_> {
    let mut positional = vec![];
    let mut kw = vec![];
    for x in args {
        let v = match x.value.kind {
            ExprKind::Int(i) => Val::Int(i),
            ExprKind::Float(f) => Val::Float(f),
            _ => Val::Poison,
        };
        match &x.name {
            Some(n) => kw.push((n, v, x.value.span)),
            None => positional.push((v, x.value.span)),
        }
    }
    (positional, kw)
}

/// Positional (value, span) and keyword (name, value, span) arguments.
type NumericArgs<'a> = (Vec<(Val, Span)>, Vec<(&'a Ident, Val, Span)>);
