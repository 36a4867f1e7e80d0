//! Arguments: binding a call's positional and keyword arguments to a signature, and reading the
//! bound values as whole numbers, numbers, flags or choices.

use super::scope::{describe, Val};
use super::state::err;
use super::suggest::{suggest, unsupported_help};
use crate::ast::Ident;
use crate::diag::{Error, Kind};
use crate::init::{Initializer, NAMED, WITH_PARAM};
use crate::layers::args::{ArgDefault, ArgKind, ArgValue, Args, Dims, MAX_RANK};
use crate::layers::LayerDef;
use crate::limits::MAX_DIM;
use crate::model::{Activation, Padding, Span, ValueRef};
use std::collections::HashMap;

/// A signature to bind a call to: the operation's name, its arguments (name, has a default), and
/// an example shown when a required argument is missing.
pub(super) struct Sig {
    pub(super) op: &'static str,
    pub(super) params: Vec<(&'static str, bool)>,
    pub(super) example: Option<&'static str>,
}

impl Sig {
    /// The signature of a layer of the table.
    pub(super) fn of_layer(def: &LayerDef) -> Sig {
        Sig {
            op: def.name,
            params: def
                .params
                .iter()
                .map(|p| (p.name, p.default != ArgDefault::Required))
                .collect(),
            example: def.example,
        }
    }
}

/// Arguments of a call after binding to a signature.
pub(super) struct Bound {
    pub(super) vals: HashMap<&'static str, (Val, Span)>,
    pub(super) call: Span,
}

impl Bound {
    pub(super) fn get(&self, k: &str) -> Option<&(Val, Span)> {
        self.vals.get(k)
    }
    pub(super) fn int(&self, k: &str, default: i64, min: i64) -> Result<i64, Error> {
        let Some((v, span)) = self.get(k) else {
            return Ok(default);
        };
        int_of(k, v, *span, min)
    }
    /// A whole number `>= min`, or a pair of them `(height, width)` (`kernel: (1, 7)`).
    pub(super) fn pair(&self, k: &str, min: i64) -> Result<(usize, usize), Error> {
        let Some((v, span)) = self.get(k) else {
            return Err(err(Kind::Argument, self.call, format!("`{k}` is missing")));
        };
        match v {
            Val::Tuple(items) if items.len() == 2 => {
                let a = self.tuple_item(k, &items[0], min)?;
                let b = self.tuple_item(k, &items[1], min)?;
                Ok((a, b))
            }
            Val::Tuple(items) => Err(err(
                Kind::Argument,
                *span,
                format!(
                    "`{k}` takes one number or a pair (height, width), found {} numbers",
                    items.len()
                ),
            )
            .label("expected 1 or 2 numbers")
            .help(format!("e.g. `{k}: 3` or `{k}: (1, 7)`"))),
            _ => {
                let n = self.int(k, 0, min)? as usize;
                Ok((n, n))
            }
        }
    }
    /// One number of a tuple argument, checked as [`Bound::int`] checks a whole argument.
    fn tuple_item(&self, k: &str, item: &(Val, Span), min: i64) -> Result<usize, Error> {
        Ok(int_of(k, &item.0, item.1, min)? as usize)
    }
    /// A convolution's padding: `same` / `valid` (one of `words`), a number for every side, a
    /// pair (height, width) each on both sides, or four numbers (top, bottom, left, right).
    pub(super) fn padding(&self, k: &str, words: &[&'static str]) -> Result<Padding, Error> {
        let Some((v, span)) = self.get(k) else {
            return Ok(Padding::Same);
        };
        let sym = |p: usize| Padding::Explicit {
            top: p,
            bottom: p,
            left: p,
            right: p,
        };
        match v {
            Val::Sym(_) => Ok(match self.choice(k, words, "same")? {
                "valid" => Padding::Valid,
                _ => Padding::Same,
            }),
            Val::Tuple(items) if items.len() == 2 => {
                let h = self.tuple_item(k, &items[0], 0)?;
                let w = self.tuple_item(k, &items[1], 0)?;
                Ok(Padding::Explicit {
                    top: h,
                    bottom: h,
                    left: w,
                    right: w,
                })
            }
            Val::Tuple(items) if items.len() == 4 => {
                let mut p = [0; 4];
                for (o, it) in p.iter_mut().zip(items) {
                    *o = self.tuple_item(k, it, 0)?;
                }
                Ok(Padding::Explicit {
                    top: p[0],
                    bottom: p[1],
                    left: p[2],
                    right: p[3],
                })
            }
            Val::Tuple(items) => Err(err(
                Kind::Argument,
                *span,
                format!("`{k}` takes 1, 2 or 4 numbers, found {}", items.len()),
            )
            .label("expected 1, 2 or 4 numbers")
            .help(format!("`{k}: 1` pads every side by 1, `{k}: (1, 2)` pads the height by 1 and the width by 2 on both sides, `{k}: (0, 1, 0, 1)` is (top, bottom, left, right)"))),
            Val::Poison => Err(Error::follow_on(*span)),
            Val::Tensor(_) => Err(err(
                Kind::Argument,
                *span,
                format!("`{k}` must be `same`, `valid` or a number of cells, found {}", describe(v)),
            )
            .label("expected padding")),
            _ => Ok(sym(self.int(k, 0, 0)? as usize)),
        }
    }
    pub(super) fn float(&self, k: &str, default: f64) -> Result<f64, Error> {
        let Some((v, span)) = self.get(k) else {
            return Ok(default);
        };
        match v {
            Val::Int(i) => Ok(*i as f64),
            Val::Float(f) => Ok(*f),
            Val::Poison => Err(Error::follow_on(*span)),
            other => Err(err(
                Kind::Argument,
                *span,
                format!("`{k}` must be a number, found {}", describe(other)),
            )
            .label("expected a number")),
        }
    }
    pub(super) fn boolean(&self, k: &str, default: bool) -> Result<bool, Error> {
        let Some((v, span)) = self.get(k) else {
            return Ok(default);
        };
        match v {
            Val::Sym(s) if s == "true" => Ok(true),
            Val::Sym(s) if s == "false" => Ok(false),
            Val::Poison => Err(Error::follow_on(*span)),
            other => Err(err(
                Kind::Argument,
                *span,
                format!("`{k}` must be `true` or `false`, found {}", describe(other)),
            )
            .label("expected `true` or `false`")),
        }
    }
    /// An initialiser: a bare name (`he_normal`) or `normal(std: s)` / `uniform(limit: a)`
    /// (already read as [`Val::Init`]).
    pub(super) fn init(&self, k: &str) -> Result<Initializer, Error> {
        let Some((v, span)) = self.get(k) else {
            return Err(err(Kind::Argument, self.call, format!("`{k}` is missing")));
        };
        let help = format!("the initialisers are {}", Initializer::list());
        match v {
            Val::Init(i) => Ok(*i),
            Val::Sym(s) => {
                if let Some(i) = Initializer::from_name(s) {
                    return Ok(i);
                }
                if let Some((n, p)) = WITH_PARAM.iter().find(|(n, _)| *n == s) {
                    return Err(err(
                        Kind::Argument,
                        *span,
                        format!("the initialiser `{n}` needs its `{p}`"),
                    )
                    .label(format!("`{p}` not given"))
                    .help(format!("for example: `{k}: {n}({p}: 0.02)`")));
                }
                let names = NAMED
                    .iter()
                    .map(|i| i.name())
                    .chain(WITH_PARAM.iter().map(|(n, _)| *n));
                let help = match suggest(s, names) {
                    Some(sg) => format!("did you mean `{sg}`? {help}"),
                    None => help,
                };
                Err(
                    err(Kind::Argument, *span, format!("unknown initialiser `{s}`"))
                        .label("not an initialiser")
                        .help(help),
                )
            }
            Val::Poison => Err(Error::follow_on(*span)),
            other => Err(err(
                Kind::Argument,
                *span,
                format!("`{k}` must be an initialiser, found {}", describe(other)),
            )
            .label("expected an initialiser")
            .help(help)),
        }
    }
    /// A shape `[d1, d2, ...]` (or one number for `[n]`): whole numbers >= 1, at most one `-1`.
    pub(super) fn dims(&self, k: &str) -> Result<Dims, Error> {
        let Some((v, span)) = self.get(k) else {
            return Err(err(Kind::Argument, self.call, format!("`{k}` is missing")));
        };
        let example = format!("e.g. `{k}: [4, -1]` or `[8, 8, 2]`");
        let items: Vec<(Val, Span)> = match v {
            Val::Tuple(items) => items.clone(),
            Val::Int(_) | Val::Float(_) => vec![(v.clone(), *span)],
            Val::Poison => return Err(Error::follow_on(*span)),
            other => {
                return Err(err(
                    Kind::Argument,
                    *span,
                    format!(
                        "`{k}` must be a shape `[d1, d2, ...]`, found {}",
                        describe(other)
                    ),
                )
                .label("expected a shape")
                .help(example))
            }
        };
        if items.is_empty() || items.len() > MAX_RANK {
            return Err(err(
                Kind::Argument,
                *span,
                format!(
                    "`{k}` takes 1 to {MAX_RANK} dimensions, found {}",
                    items.len()
                ),
            )
            .label("no dimensions")
            .help(example));
        }
        let mut dims = vec![];
        let mut inferred: Option<Span> = None;
        for (iv, ispan) in &items {
            if matches!(iv, Val::Int(-1)) {
                if let Some(first) = inferred {
                    return Err(err(
                        Kind::Argument,
                        *ispan,
                        format!("`{k}` may infer one dimension (`-1`), found a second"),
                    )
                    .label("second `-1`")
                    .note(first, "the first `-1`")
                    .help("give every other dimension; the `-1` one is what is left"));
                }
                inferred = Some(*ispan);
                dims.push(-1);
                continue;
            }
            dims.push(int_of(k, iv, *ispan, 1).map_err(|e| {
                if matches!(iv, Val::Int(i) if *i <= 0) {
                    e.help("a dimension is a whole number >= 1, or `-1` for the one inferred")
                } else {
                    e
                }
            })?);
        }
        Dims::new(&dims).ok_or_else(|| err(Kind::Argument, *span, "too many dimensions"))
    }
    pub(super) fn choice(
        &self,
        k: &str,
        options: &[&'static str],
        default: &'static str,
    ) -> Result<&'static str, Error> {
        let Some((v, span)) = self.get(k) else {
            return Ok(default);
        };
        let list = options
            .iter()
            .map(|o| format!("`{o}`"))
            .collect::<Vec<_>>()
            .join(", ");
        match v {
            Val::Sym(s) => {
                if let Some(o) = options.iter().find(|o| *o == s) {
                    return Ok(o);
                }
                let mut e = err(Kind::Argument, *span, format!("unknown {k} `{s}`"))
                    .label(format!("expected one of {list}"));
                if let Some(sg) = suggest(s, options.iter().copied()) {
                    e = e.help(format!("did you mean `{sg}`?"));
                } else if let Some(h) = unsupported_help(s) {
                    e = e.help(h);
                }
                Err(e)
            }
            Val::Poison => Err(Error::follow_on(*span)),
            other => Err(err(
                Kind::Argument,
                *span,
                format!("`{k}` must be one of {list}, found {}", describe(other)),
            )
            .label("expected a name")),
        }
    }
}

/// Binds a call's arguments to `sig`: positional ones in order, keyword ones by name; every
/// argument without a default must be given.
pub(super) fn bind(
    sig: &Sig,
    positional: Vec<(Val, Span)>,
    kw: Vec<(&Ident, Val, Span)>,
    func: &Ident,
    span: Span,
) -> Result<Bound, Error> {
    let op = sig.op;
    let mut vals: HashMap<&'static str, (Val, Span)> = HashMap::new();
    let nparams = sig.params.len();
    for (i, (v, s)) in positional.into_iter().enumerate() {
        if i >= nparams {
            let list: Vec<String> = sig.params.iter().map(|(n, _)| n.to_string()).collect();
            let msg = if nparams == 0 {
                format!("`{op}` takes no arguments besides its input")
            } else {
                format!("too many arguments for `{op}`: it takes at most {nparams} after its input ({})", list.join(", "))
            };
            let mut e = err(Kind::Argument, s, msg).label("unexpected argument");
            if let Val::Tensor(_) = v {
                e = e.help(format!(
                    "`{op}` takes one input value; to combine two values use `a + b`"
                ));
            }
            return Err(e);
        }
        vals.insert(sig.params[i].0, (v, s));
    }
    for (n, v, s) in kw {
        let Some((pname, _)) = sig.params.iter().find(|(p, _)| *p == n.name) else {
            let mut e = err(
                Kind::Argument,
                n.span,
                format!("`{op}` has no argument `{}`", n.name),
            )
            .label("unknown argument");
            let list: Vec<&str> = sig.params.iter().map(|(p, _)| *p).collect();
            e = match suggest(&n.name, list.iter().copied()) {
                Some(sg) => e.help(format!("did you mean `{sg}`?")),
                None if list.is_empty() => e.help(format!("`{op}` takes no arguments")),
                None => e.help(format!("`{op}` accepts: {}", list.join(", "))),
            };
            return Err(e);
        };
        if let Some((_, prev)) = vals.get(pname) {
            return Err(err(
                Kind::Argument,
                n.span,
                format!("argument `{pname}` is given twice"),
            )
            .label("given again here")
            .note(*prev, "first given here"));
        }
        vals.insert(pname, (v, s));
    }
    for (p, has_default) in &sig.params {
        if !has_default && !vals.contains_key(p) {
            let req: Vec<&str> = sig
                .params
                .iter()
                .filter(|(_, d)| !d)
                .map(|(n, _)| *n)
                .collect();
            return Err(err(
                Kind::Argument,
                span,
                format!("`{op}` is missing its `{p}` argument"),
            )
            .label(format!("`{p}` not given"))
            .note(func.span, format!("`{op}` needs: {}", req.join(", ")))
            .help(match sig.example {
                Some(ex) => format!("for example: `{ex}`"),
                None => format!("see the reference of `{op}` in docs/LANGUAGE.md"),
            }));
        }
    }
    Ok(Bound { vals, call: span })
}

/// Reads the arguments bound to a layer's signature by their kinds, filling in the defaults, in
/// the signature's order (so the first wrong argument is the one reported).
pub(super) fn layer_args(def: &LayerDef, b: &Bound) -> Result<Args, Error> {
    let mut vals: Vec<(&'static str, ArgValue, Option<Span>)> = vec![];
    for p in def.params {
        let k = p.name;
        let Some((_, span)) = b.get(k) else {
            let v = match p.default {
                ArgDefault::Value(v) => v,
                ArgDefault::SameAs(other) => match vals.iter().find(|(n, _, _)| *n == other) {
                    Some((_, v, _)) => *v,
                    None => return Err(internal(def, k, b.call)),
                },
                ArgDefault::Required => return Err(internal(def, k, b.call)),
            };
            vals.push((k, v, None));
            continue;
        };
        let v = match p.kind {
            ArgKind::Count => ArgValue::Count(b.int(k, 0, 1)? as usize),
            ArgKind::Natural => ArgValue::Natural(b.int(k, 0, 0)? as usize),
            ArgKind::Pair => {
                let (h, w) = b.pair(k, 1)?;
                ArgValue::Pair(h, w)
            }
            ArgKind::Padding(words) => ArgValue::Padding(b.padding(k, words)?),
            ArgKind::Number => ArgValue::Number(b.float(k, 0.0)?),
            ArgKind::Flag => ArgValue::Flag(b.boolean(k, false)?),
            ArgKind::Choice(options) => ArgValue::Choice(b.choice(k, options, "")?),
            ArgKind::Activation if matches!(b.get(k), Some((Val::Act(_), _))) => match b.get(k) {
                Some((Val::Act(a), _)) => ArgValue::Activation(Some(*a)),
                _ => return Err(internal(def, k, b.call)),
            },
            ArgKind::Activation => {
                let mut choices = vec!["none"];
                choices.extend(Activation::ALL.map(Activation::name));
                ArgValue::Activation(Activation::from_name(b.choice(k, &choices, "none")?))
            }
            ArgKind::Init => ArgValue::Init(Some(b.init(k)?)),
            ArgKind::Shape => ArgValue::Shape(b.dims(k)?),
            ArgKind::Value => match b.get(k) {
                Some((Val::Tensor(ValueRef::Node(i)), _)) => ArgValue::Value(Some(*i)),
                Some((Val::Sym(s), _)) if s == "none" => ArgValue::Value(None),
                Some((Val::Poison, s)) => return Err(Error::follow_on(*s)),
                Some((v, s)) => {
                    return Err(err(
                        Kind::Argument,
                        *s,
                        format!(
                            "`{k}` takes a value computed by a layer, found {}",
                            describe(v)
                        ),
                    )
                    .label("not a layer's output")
                    .help(format!(
                        "name the layer's output and pass it: `e = tokens |> embedding(256, 128)` ... `dense(256, {k}: e)`"
                    )))
                }
                None => return Err(internal(def, k, b.call)),
            },
        };
        vals.push((k, v, Some(*span)));
    }
    Ok(Args { call: b.call, vals })
}

/// A default the table cannot give (a defect of the table, which its tests check).
fn internal(def: &LayerDef, k: &str, call: Span) -> Error {
    err(
        Kind::Argument,
        call,
        format!(
            "internal error: `{}`'s argument `{k}` has no usable default",
            def.name
        ),
    )
    .label("while checking this call")
}

/// A bound value read as a whole number `>= min` (`k` names the argument in errors).
fn int_of(k: &str, v: &Val, span: Span, min: i64) -> Result<i64, Error> {
    let i = match v {
        Val::Int(i) => *i,
        Val::Float(f) if f.fract() == 0.0 && f.abs() < 1e15 => *f as i64,
        Val::Poison => return Err(Error::follow_on(span)),
        other => {
            return Err(err(
                Kind::Argument,
                span,
                format!("`{k}` must be a whole number, found {}", describe(other)),
            )
            .label("expected an integer"));
        }
    };
    if i < min {
        let what = if min == 1 {
            "positive (at least 1)"
        } else {
            "at least 0"
        };
        return Err(err(
            Kind::Argument,
            span,
            format!("`{k}` must be {what}, found {i}"),
        )
        .label("out of range"));
    }
    if i > MAX_DIM {
        return Err(
            err(Kind::Argument, span, format!("`{k}` = {i} is too large")).label("too large"),
        );
    }
    Ok(i)
}
