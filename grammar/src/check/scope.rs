//! Values during checking and the scopes that bind names to them.

use crate::ast::{Expr, ExprKind, Ident};
use crate::diag::{Error, Kind};
use crate::layers::{self, args::ArgKind};
use crate::model::{Activation, Initializer, Span, ValueRef};
use std::collections::HashMap;

/// Whether a bare name is an option value (`padding: same`, `activation: relu`, `bias: false`):
/// `true`, `false`, `none`, an activation, or a word some layer argument chooses from.
pub(super) fn is_option_word(s: &str) -> bool {
    matches!(s, "true" | "false" | "none")
        || Activation::from_name(s).is_some()
        || Initializer::from_name(s).is_some()
        || layers::layers().iter().any(|d| {
            d.params
                .iter()
                .any(|p| matches!(p.kind, ArgKind::Choice(options) | ArgKind::Padding(options) if options.contains(&s)))
        })
}

/// A checked value during expansion.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Val {
    Tensor(ValueRef),
    Int(i64),
    Float(f64),
    /// An unbound bare name: an option (`same`, `relu`, `true`) or an unknown name.
    Sym(String),
    Tuple(Vec<(Val, Span)>),
    /// An activation with its parameter written as an argument (`activation: leaky_relu(0.2)`).
    Act(Activation),
    /// An initialiser with its parameter written as an argument (`init: normal(std: 0.02)`).
    Init(Initializer),
    /// The value of a definition that failed (its error is reported): what uses it fails as a
    /// follow-on error, so one mistake is reported once.
    Poison,
}

/// How a value is named in diagnostics ("found the integer 3").
pub(super) fn describe(v: &Val) -> String {
    match v {
        Val::Tensor(_) => "a tensor value".into(),
        Val::Int(i) => format!("the integer {i}"),
        Val::Float(f) => format!("the number {f:?}"),
        Val::Sym(s) => format!("`{s}`"),
        Val::Tuple(_) => "a tuple".into(),
        Val::Act(a) => match a.param_value() {
            Some(v) => format!("the activation `{}({v})`", a.name()),
            None => format!("the activation `{}`", a.name()),
        },
        Val::Init(i) => format!("the initialiser `{}`", i.text()),
        Val::Poison => "a value in error".into(),
    }
}

/// A name's value and where it was defined.
#[derive(Debug, Clone)]
pub(super) struct Binding {
    pub(super) val: Val,
    pub(super) span: Span,
    pub(super) used: bool,
    /// Inputs and targets are reported differently when unused.
    pub(super) what: &'static str,
}

/// The names visible at one point: the program's, or those of one block instance.
#[derive(Default)]
pub(super) struct Scope {
    pub(super) vars: HashMap<String, Binding>,
    pub(super) order: Vec<String>,
    /// Where every name of this scope is (first) defined: a use of a name before its definition
    /// is an error.
    pub(super) later: HashMap<String, Span>,
    /// Only definitions starting before this offset are visible (the `loss`, checked after the
    /// whole program, sees only what is defined above it).
    pub(super) horizon: Option<usize>,
    pub(super) in_block: Option<String>,
}

impl Scope {
    pub(super) fn define(
        &mut self,
        name: &Ident,
        val: Val,
        what: &'static str,
    ) -> Result<(), Error> {
        if let Some(prev) = self.vars.get(&name.name) {
            return Err(Error::new(
                Kind::Name,
                name.span,
                format!("`{}` is already defined", name.name),
            )
            .label("defined again here")
            .note(prev.span, "first defined here")
            .help("every value has one definition; choose a new name (e.g. `h2`)"));
        }
        self.vars.insert(
            name.name.clone(),
            Binding {
                val,
                span: name.span,
                used: false,
                what,
            },
        );
        self.order.push(name.name.clone());
        Ok(())
    }

    /// After an error in a definition: binds `name` to [`Val::Poison`] (unless it is bound
    /// already), so its uses are not reported again.
    pub(super) fn poison(&mut self, name: &Ident, what: &'static str) {
        if !self.vars.contains_key(&name.name) {
            let _ = self.define(name, Val::Poison, what);
        }
    }

    /// After an error in `e`: counts the names it mentions as used (what the failed statement
    /// would have used is not reported as unused).
    pub(super) fn mark_used(&mut self, e: &Expr) {
        names_in(e, &mut |n| {
            if let Some(b) = self.vars.get_mut(n) {
                b.used = true;
            }
        });
    }
}

/// Calls `f` with every bare name in `e` (values, options, bare stages).
pub(super) fn names_in(e: &Expr, f: &mut dyn FnMut(&str)) {
    match &e.kind {
        ExprKind::Name(n) => f(n),
        ExprKind::Call { args, .. } => args.iter().for_each(|a| names_in(&a.value, f)),
        ExprKind::Tuple(items) | ExprKind::Add(items) | ExprKind::Mul(items) => {
            items.iter().for_each(|i| names_in(i, f))
        }
        ExprKind::Pipe(a, stages) => {
            names_in(a, f);
            stages.iter().for_each(|i| names_in(i, f));
        }
        ExprKind::Repeat { count, body } => {
            names_in(count, f);
            body.iter().for_each(|i| names_in(i, f));
        }
        ExprKind::Int(_) | ExprKind::Float(_) => {}
    }
}
