//! The `train { ... }` section: batch size, epochs, seed, shuffling and the optimizer with its
//! settings.

use super::args::{bind, Sig};
use super::names::{suggest, OPTIMIZERS};
use super::scope::{describe, Val};
use super::state::{err, Checker};
use crate::ast::*;
use crate::diag::{Error, Kind};
use crate::limits::MAX_DIM;
use crate::model::*;
use dmc_plan::plan::Precision;
use std::collections::HashMap;

impl Checker<'_> {
    pub(super) fn const_eval(&self, e: &Expr) -> Result<Val, Error> {
        match &e.kind {
            ExprKind::Int(i) => Ok(Val::Int(*i)),
            ExprKind::Float(f) => Ok(Val::Float(*f)),
            ExprKind::Name(n) => Ok(Val::Sym(n.clone())),
            ExprKind::Tuple(items) => {
                let mut out = vec![];
                for it in items {
                    out.push((self.const_eval(it)?, it.span));
                }
                Ok(Val::Tuple(out))
            }
            _ => Err(err(Kind::Training, e.span, "expected a constant here")
                .label("not a number or name")),
        }
    }

    pub(super) fn train(&self, t: &TrainSection) -> Result<TrainConfig, Error> {
        const FIELDS: &[&str] = &[
            "batch",
            "optimizer",
            "epochs",
            "seed",
            "shuffle",
            "schedule",
            "clip_value",
            "accumulate",
            "clip_norm",
            "precision",
        ];
        let mut seen: HashMap<&str, &Field> = HashMap::new();
        for f in &t.fields {
            let Some(key) = FIELDS.iter().find(|k| **k == f.name.name) else {
                let mut e = err(
                    Kind::Training,
                    f.name.span,
                    format!("unknown train setting `{}`", f.name.name),
                )
                .label("unknown setting");
                e = match suggest(&f.name.name, FIELDS.iter().copied()) {
                    Some(s) => e.help(format!(
                        "did you mean `{s}`? the settings are: {}",
                        FIELDS.join(", ")
                    )),
                    None => e.help(format!("the settings are: {}", FIELDS.join(", "))),
                };
                return Err(e);
            };
            if let Some(prev) = seen.get(key) {
                return Err(
                    err(Kind::Training, f.name.span, format!("`{key}` is set twice"))
                        .label("set again here")
                        .note(prev.name.span, "first set here"),
                );
            }
            seen.insert(key, f);
        }
        let missing = |k: &str, ex: &str| {
            err(
                Kind::Training,
                t.span,
                format!("the train section has no `{k}`"),
            )
            .label(format!("`{k}` missing"))
            .help(format!("add `{k}: {ex}`"))
        };
        let int_field = |k: &str, min: i64| -> Result<Option<i64>, Error> {
            let Some(f) = seen.get(k) else {
                return Ok(None);
            };
            match self.const_eval(&f.value)? {
                Val::Int(i) if i >= min => Ok(Some(i)),
                Val::Int(i) => Err(err(
                    Kind::Training,
                    f.value.span,
                    format!("`{k}` must be at least {min}, found {i}"),
                )
                .label("out of range")),
                other => Err(err(
                    Kind::Training,
                    f.value.span,
                    format!("`{k}` must be a whole number, found {}", describe(&other)),
                )
                .label("expected an integer")),
            }
        };
        let batch = int_field("batch", 1)?.ok_or_else(|| missing("batch", "32"))?;
        if batch > MAX_DIM {
            let s = seen.get("batch").map_or(t.span, |f| f.value.span);
            return Err(err(Kind::Training, s, "batch size is too large").label("too large"));
        }
        let epochs = int_field("epochs", 1)?.map(|e| e as usize);
        let accumulate = int_field("accumulate", 1)?.unwrap_or(1);
        if accumulate > MAX_DIM || (batch as u128) * (accumulate as u128) > MAX_DIM as u128 {
            let s = seen.get("accumulate").map_or(t.span, |f| f.value.span);
            return Err(err(
                Kind::Training,
                s,
                format!("`accumulate` is too large: {batch} x {accumulate} samples per step"),
            )
            .label("too large"));
        }
        let seed = int_field("seed", 0)?.map(|s| s as u64);
        let shuffle = match seen.get("shuffle") {
            None => None,
            Some(f) => match self.const_eval(&f.value)? {
                Val::Sym(s) if s == "true" => Some(true),
                Val::Sym(s) if s == "false" => Some(false),
                other => {
                    return Err(err(
                        Kind::Training,
                        f.value.span,
                        format!(
                            "`shuffle` must be `true` or `false`, found {}",
                            describe(&other)
                        ),
                    )
                    .label("expected `true` or `false`"))
                }
            },
        };
        let precision = match seen.get("precision") {
            None => Precision::Fp32,
            Some(f) => match self.const_eval(&f.value)? {
                Val::Sym(s) if s == "fp32" => Precision::Fp32,
                Val::Sym(s) if s == "tf32" => Precision::Tf32,
                other => {
                    return Err(err(
                        Kind::Training,
                        f.value.span,
                        format!(
                            "`precision` must be `fp32` or `tf32`, found {}",
                            describe(&other)
                        ),
                    )
                    .label("expected `fp32` or `tf32`")
                    .help("`tf32` runs the GEMMs on TF32 tensor cores of sm_80+ GPUs (inputs rounded to 10 mantissa bits); `fp32` keeps PyTorch's fp32 parity"))
                }
            },
        };
        let Some(of) = seen.get("optimizer") else {
            return Err(missing("optimizer", "sgd(lr: 0.01)"));
        };
        let optimizer = self.optimizer(&of.value)?;
        let clip_value = match seen.get("clip_value") {
            Some(f) => Some(self.clip_bound("clip_value", &f.value)?),
            None => None,
        };
        let clip_norm = match seen.get("clip_norm") {
            Some(f) => Some(self.clip_bound("clip_norm", &f.value)?),
            None => None,
        };
        let optimizer = optimizer
            .with_clip_value(clip_value)
            .with_clip_norm(clip_norm);
        let schedule = match seen.get("schedule") {
            Some(f) => self.schedule(&f.value, optimizer.lr())?,
            None => LrSchedule::default(),
        };
        Ok(TrainConfig {
            batch: batch as usize,
            optimizer,
            epochs,
            seed,
            shuffle,
            schedule,
            accumulate: accumulate as usize,
            precision,
        })
    }

    /// A gradient clipping bound (`clip_value: 1.0`): a positive number that stays a positive,
    /// finite f32.
    fn clip_bound(&self, k: &str, e: &Expr) -> Result<f32, Error> {
        let v = match self.const_eval(e)? {
            Val::Int(i) => i as f64,
            Val::Float(f) => f,
            other => {
                return Err(err(
                    Kind::Training,
                    e.span,
                    format!("`{k}` must be a number, found {}", describe(&other)),
                )
                .label("not a number")
                .help(format!("write e.g. `{k}: 1.0`")))
            }
        };
        if v.is_nan() || v <= 0.0 {
            return Err(err(
                Kind::Training,
                e.span,
                format!("`{k}` must be positive, found {v:?}"),
            )
            .label("out of range")
            .help(format!(
                "a bound of 0 would zero every gradient; remove `{k}` to train without clipping"
            )));
        }
        let f = v as f32;
        if !f.is_normal() {
            return Err(beyond_f32(k, v, f, e.span));
        }
        Ok(f)
    }

    fn optimizer(&self, e: &Expr) -> Result<Optimizer, Error> {
        let Some((func, args)) = setting_call(e) else {
            return Err(err(
                Kind::Training,
                e.span,
                "expected an optimizer such as `sgd(lr: 0.01)`, `adam(lr: 0.001)`, `rmsprop(lr: 0.01)` or `lion(lr: 0.0001)`",
            )
            .label("not an optimizer"));
        };
        let params: &'static [(&'static str, bool)] = match func.name.as_str() {
            "sgd" => &[
                ("lr", true),
                ("momentum", true),
                ("weight_decay", true),
                ("nesterov", true),
            ],
            "adam" | "adamw" => &[
                ("lr", true),
                ("betas", true),
                ("beta1", true),
                ("beta2", true),
                ("eps", true),
                ("weight_decay", true),
            ],
            "rmsprop" => &[
                ("lr", true),
                ("alpha", true),
                ("eps", true),
                ("weight_decay", true),
                ("momentum", true),
                ("centered", true),
            ],
            "lion" => &[
                ("lr", true),
                ("betas", true),
                ("beta1", true),
                ("beta2", true),
                ("weight_decay", true),
            ],
            other => {
                let mut er = err(
                    Kind::Training,
                    func.span,
                    format!("unknown optimizer `{other}`"),
                )
                .label("not an optimizer");
                let unsupported = super::suggest::unsupported_help(other);
                er = match (suggest(other, OPTIMIZERS.iter().copied()), unsupported) {
                    (Some(s), _) => er.help(format!(
                        "did you mean `{s}`? the optimizers are sgd, adam, adamw, rmsprop and lion"
                    )),
                    (None, Some(h)) => er.label("not an optimizer of dmc").help(h),
                    (None, None) => {
                        er.help("the optimizers are sgd, adam, adamw, rmsprop and lion")
                    }
                };
                return Err(er);
            }
        };
        let op: &'static str = OPTIMIZERS
            .iter()
            .copied()
            .find(|o| *o == func.name)
            .unwrap_or("sgd");
        let sig = Sig {
            op,
            params: params.to_vec(),
            example: Some(match op {
                "sgd" => "sgd(lr: 0.01, momentum: 0.9)",
                "rmsprop" => "rmsprop(lr: 0.01)",
                "lion" => "lion(lr: 0.0001)",
                _ => "adam(lr: 0.001)",
            }),
        };
        let mut positional = vec![];
        let mut kw = vec![];
        for a in args {
            let v = self.const_eval(&a.value)?;
            match &a.name {
                Some(n) => kw.push((n, v, a.value.span)),
                None => {
                    if !kw.is_empty() {
                        return Err(err(
                            Kind::Argument,
                            a.span,
                            "positional argument after a keyword argument",
                        )
                        .label("positional"));
                    }
                    if !positional.is_empty() {
                        return Err(err(
                            Kind::Argument,
                            a.value.span,
                            format!("`{op}` takes only the learning rate positionally"),
                        )
                        .label("unexpected argument")
                        .help("name the other settings, e.g. `momentum: 0.9`"));
                    }
                    positional.push((v, a.value.span));
                }
            }
        }
        let b = bind(&sig, positional, kw, &func, e.span)?;
        let range = |k: &str, v: f64, lo: f64, hi: f64, incl_lo: bool| -> Result<(), Error> {
            let ok = (if incl_lo { v >= lo } else { v > lo }) && v < hi;
            if ok {
                return Ok(());
            }
            let s = b.get(k).map_or(e.span, |x| x.1);
            let what = match (hi.is_infinite(), incl_lo) {
                (true, false) => "positive".to_string(),
                (true, true) => "zero or positive".to_string(),
                (false, true) => format!("in [{lo}, {hi})"),
                (false, false) => format!("in ({lo}, {hi})"),
            };
            Err(err(
                Kind::Training,
                s,
                format!("`{k}` must be {what}, found {v:?}"),
            )
            .label("out of range"))
        };
        // A value the check accepts must survive the conversion to f32 the update uses (1e39 is
        // infinite there, 1e-50 zero).
        let as_f32 = |k: &str, v: f64| -> Result<f32, Error> {
            let f = v as f32;
            if f.is_finite() && (v == 0.0 || f != 0.0) {
                return Ok(f);
            }
            let s = b.get(k).map_or(e.span, |x| x.1);
            Err(beyond_f32(k, v, f, s))
        };
        // PyTorch's defaults (lion-pytorch's for Lion)
        let lr_default = match op {
            "sgd" | "rmsprop" => 0.01,
            "lion" => 1e-4,
            _ => 0.001,
        };
        let lr = b.float("lr", lr_default)?;
        range("lr", lr, 0.0, f64::INFINITY, false)?;
        let lr = LearningRate::new(lr).map_err(|reason| {
            let s = b.get("lr").map_or(e.span, |x| x.1);
            err(Kind::Training, s, reason)
                .label("unusable learning rate")
                .help(format!(
                    "use a value between {:e} and {:e}, typically 1e-4 to 0.1",
                    f32::MIN_POSITIVE,
                    f32::MAX
                ))
        })?;
        let lr = lr.get();
        if op == "sgd" {
            let momentum = b.float("momentum", 0.0)?;
            range("momentum", momentum, 0.0, 1.0, true)?;
            let weight_decay = b.float("weight_decay", 0.0)?;
            range("weight_decay", weight_decay, 0.0, f64::INFINITY, true)?;
            let nesterov = b.boolean("nesterov", false)?;
            if nesterov && momentum == 0.0 {
                let s = b.get("nesterov").map_or(e.span, |x| x.1);
                return Err(err(
                    Kind::Training,
                    s,
                    "Nesterov momentum needs a non-zero `momentum`",
                )
                .label("nesterov without momentum")
                .help("add e.g. `momentum: 0.9`"));
            }
            return Ok(Optimizer::Sgd {
                lr: lr as f32,
                momentum: as_f32("momentum", momentum)?,
                weight_decay: as_f32("weight_decay", weight_decay)?,
                nesterov,
                clip_value: None,
                clip_norm: None,
            });
        }
        if op == "rmsprop" {
            let alpha = b.float("alpha", 0.99)?;
            range("alpha", alpha, 0.0, 1.0, true)?;
            let eps = b.float("eps", 1e-8)?;
            range("eps", eps, 0.0, f64::INFINITY, false)?;
            let weight_decay = b.float("weight_decay", 0.0)?;
            range("weight_decay", weight_decay, 0.0, f64::INFINITY, true)?;
            let momentum = b.float("momentum", 0.0)?;
            range("momentum", momentum, 0.0, 1.0, true)?;
            if b.boolean("centered", false)? {
                let s = b.get("centered").map_or(e.span, |x| x.1);
                return Err(
                    err(Kind::Training, s, "centered RMSprop is not supported yet")
                        .label("centered")
                        .help("remove `centered: true` (PyTorch's default is `centered=False`)"),
                );
            }
            return Ok(Optimizer::RmsProp {
                lr: lr as f32,
                alpha: as_f32("alpha", alpha)?,
                eps: as_f32("eps", eps)?,
                weight_decay: as_f32("weight_decay", weight_decay)?,
                momentum: as_f32("momentum", momentum)?,
                clip_value: None,
                clip_norm: None,
            });
        }
        let (mut beta1, mut beta2) = (0.9, if op == "lion" { 0.99 } else { 0.999 });
        if let Some((v, s)) = b.get("betas") {
            if b.get("beta1").is_some() || b.get("beta2").is_some() {
                return Err(err(
                    Kind::Training,
                    *s,
                    "give either `betas` or `beta1`/`beta2`, not both",
                )
                .label("conflicting settings"));
            }
            match v {
                Val::Tuple(items) if items.len() == 2 => {
                    let num = |(v, s): &(Val, Span)| match v {
                        Val::Int(i) => Ok(*i as f64),
                        Val::Float(f) => Ok(*f),
                        other => Err(err(
                            Kind::Training,
                            *s,
                            format!("expected a number, found {}", describe(other)),
                        )
                        .label("not a number")),
                    };
                    beta1 = num(&items[0])?;
                    beta2 = num(&items[1])?;
                }
                _ => {
                    return Err(err(Kind::Training, *s, "`betas` must be a pair of numbers")
                        .label("expected `(beta1, beta2)`")
                        .help("write `betas: (0.9, 0.999)`"))
                }
            }
            let s = *s;
            for bv in [beta1, beta2] {
                if !(0.0..1.0).contains(&bv) {
                    return Err(err(
                        Kind::Training,
                        s,
                        format!("betas must be in [0, 1), found {bv:?}"),
                    )
                    .label("out of range"));
                }
            }
        } else {
            beta1 = b.float("beta1", beta1)?;
            range("beta1", beta1, 0.0, 1.0, true)?;
            beta2 = b.float("beta2", beta2)?;
            range("beta2", beta2, 0.0, 1.0, true)?;
        }
        if op == "lion" {
            let weight_decay = b.float("weight_decay", 0.0)?;
            range("weight_decay", weight_decay, 0.0, f64::INFINITY, true)?;
            return Ok(Optimizer::Lion {
                lr: lr as f32,
                beta1: as_f32("beta1", beta1)?,
                beta2: as_f32("beta2", beta2)?,
                weight_decay: as_f32("weight_decay", weight_decay)?,
                clip_value: None,
                clip_norm: None,
            });
        }
        let eps = b.float("eps", 1e-8)?;
        range("eps", eps, 0.0, f64::INFINITY, false)?;
        let decoupled = op == "adamw";
        let weight_decay = b.float("weight_decay", if decoupled { 0.01 } else { 0.0 })?;
        range("weight_decay", weight_decay, 0.0, f64::INFINITY, true)?;
        Ok(Optimizer::Adam {
            lr: lr as f32,
            beta1: as_f32("beta1", beta1)?,
            beta2: as_f32("beta2", beta2)?,
            eps: as_f32("eps", eps)?,
            weight_decay: as_f32("weight_decay", weight_decay)?,
            decoupled,
            clip_value: None,
            clip_norm: None,
        })
    }
}

/// A setting's value written as a bare name (`adam`) or a call (`adam(lr: 0.01)`): the name and
/// the arguments; `None` for anything else.
pub(super) fn setting_call(e: &Expr) -> Option<(Ident, &[Arg])> {
    match &e.kind {
        ExprKind::Name(n) => Some((
            Ident {
                name: n.clone(),
                span: e.span,
            },
            &[],
        )),
        ExprKind::Call {
            func,
            args,
            label: None,
        } => Some((func.clone(), args.as_slice())),
        _ => None,
    }
}

/// `k = v` of a training setting that rounds to `f` (0, subnormal or infinite) in f32.
fn beyond_f32(k: &str, v: f64, f: f32, span: Span) -> Error {
    err(
        Kind::Training,
        span,
        format!("`{k}` = {v:?} does not fit in f32 (it would become {f})"),
    )
    .label("out of f32 range")
    .help(format!(
        "use a value between {:e} and {:e}",
        f32::MIN_POSITIVE,
        f32::MAX
    ))
}
