//! The `schedule:` setting of the train section: the learning-rate schedule
//! (`cosine(warmup: 100)`, `step(every: 1000, gamma: 0.1)`, `linear(steps: 5000)`,
//! `warmup(200)`, `constant`), checked against the optimizer's learning rate.

use super::args::{bind, Sig};
use super::state::{err, Checker};
use super::suggest::suggest;
use crate::ast::*;
use crate::diag::{Error, Kind};
use crate::model::{Decay, LrSchedule};

/// The schedules, as written.
pub(super) const SCHEDULES: &[&str] = &["constant", "warmup", "step", "cosine", "linear"];

impl Checker<'_> {
    /// The schedule `e` names, for an optimizer whose learning rate is `lr`.
    pub(super) fn schedule(&self, e: &Expr, lr: f32) -> Result<LrSchedule, Error> {
        let Some((func, args)) = super::train::setting_call(e) else {
            return Err(err(Kind::Training, e.span, "expected a learning-rate schedule")
                .label("not a schedule")
                .help("write e.g. `schedule: cosine(warmup: 100)` or `schedule: step(every: 1000, gamma: 0.1)`"));
        };
        let Some(op) = SCHEDULES.iter().copied().find(|s| *s == func.name) else {
            let mut er = err(
                Kind::Training,
                func.span,
                format!("unknown learning-rate schedule `{}`", func.name),
            )
            .label("not a schedule");
            er = match suggest(&func.name, SCHEDULES.iter().copied()) {
                Some(s) => er.help(format!(
                    "did you mean `{s}`? the schedules are constant, warmup, step, cosine and linear"
                )),
                None => er.help("the schedules are constant, warmup, step, cosine and linear"),
            };
            return Err(er);
        };
        // (name, has a default); the first is the one that may be given positionally.
        let (params, example): (&[(&str, bool)], &str) = match op {
            "constant" => (&[("warmup", true)], "constant(warmup: 100)"),
            "warmup" => (&[("warmup", false)], "warmup(100)"),
            "step" => (
                &[("every", false), ("gamma", true), ("warmup", true)],
                "step(every: 1000, gamma: 0.1)",
            ),
            _ => (
                &[("warmup", true), ("steps", true), ("min_lr", true)],
                "cosine(warmup: 100, steps: 10000)",
            ),
        };
        let sig = Sig {
            op,
            params: params.to_vec(),
            example: Some(example),
        };
        let mut positional = vec![];
        let mut kw = vec![];
        for a in args {
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
                    .label("positional"))
                }
            }
        }
        let b = bind(&sig, positional, kw, &func, e.span)?;
        let warmup = b.int("warmup", 0, 0)? as u64;
        let span_of = |k: &str| b.get(k).map_or(e.span, |x| x.1);
        let min_lr = |b: &super::args::Bound| -> Result<f32, Error> {
            let m = b.float("min_lr", 0.0)?;
            if !(m >= 0.0 && m < lr as f64) {
                return Err(err(
                    Kind::Training,
                    span_of("min_lr"),
                    format!("`min_lr` must be at least 0 and below the optimizer's learning rate {lr}, found {m:?}"),
                )
                .label("out of range")
                .help("the schedule decays from the learning rate down to `min_lr`; 0 is the usual choice"));
            }
            Ok(m as f32)
        };
        let steps = |b: &super::args::Bound| -> Result<Option<u64>, Error> {
            if b.get("steps").is_none() {
                return Ok(None);
            }
            let s = b.int("steps", 1, 1)? as u64;
            if s <= warmup {
                return Err(err(
                    Kind::Training,
                    span_of("steps"),
                    format!("the schedule's {s} steps leave nothing after its warmup of {warmup} steps"),
                )
                .label("not more than the warmup")
                .help("`steps` counts the warmup too: make it larger than `warmup`, or leave it out to decay over the whole run"));
            }
            Ok(Some(s))
        };
        let decay = match op {
            "constant" | "warmup" => Decay::Constant,
            "step" => {
                let every = b.int("every", 1, 1)? as u64;
                let gamma = b.float("gamma", 0.1)?;
                if !(gamma > 0.0 && gamma <= 1.0) {
                    return Err(err(
                        Kind::Training,
                        span_of("gamma"),
                        format!("`gamma` must be in (0, 1], found {gamma:?}"),
                    )
                    .label("out of range")
                    .help(
                        "the rate is multiplied by `gamma` every `every` steps, e.g. `gamma: 0.1`",
                    ));
                }
                Decay::Step {
                    every,
                    gamma: gamma as f32,
                }
            }
            "cosine" => Decay::Cosine {
                steps: steps(&b)?,
                min_lr: min_lr(&b)?,
            },
            _ => Decay::Linear {
                steps: steps(&b)?,
                min_lr: min_lr(&b)?,
            },
        };
        if op == "warmup" && warmup == 0 {
            return Err(err(
                Kind::Training,
                span_of("warmup"),
                "a warmup of 0 steps does nothing",
            )
            .label("0 steps")
            .help(
                "give the number of warmup steps, e.g. `warmup(100)`, or leave the schedule out",
            ));
        }
        Ok(LrSchedule { warmup, decay })
    }
}
