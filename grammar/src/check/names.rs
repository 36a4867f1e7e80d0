//! Names: the built-in names besides the layers (losses, optimizers) and the errors about
//! unknown, misplaced or clashing names (their "did you mean" hints are in `suggest`).

use super::scope::Scope;
use super::state::{err, Checker};
pub(super) use super::suggest::suggest;
use crate::ast::Ident;
use crate::diag::{Error, Kind};
use crate::layers;
use crate::model::Span;

/// The losses (`loss mse(out, y)`).
pub(super) const LOSSES: &[&str] = &["mse", "cross_entropy", "mae", "huber", "bce_with_logits"];
/// The optimizers (`optimizer: sgd(lr: 0.01)`).
pub(super) const OPTIMIZERS: &[&str] = &["sgd", "adam", "adamw", "rmsprop", "lion"];

/// Whether `name` is a layer, a loss or an optimizer.
pub(super) fn is_builtin(name: &str) -> bool {
    layers::find(name).is_some() || LOSSES.contains(&name) || OPTIMIZERS.contains(&name)
}

impl Checker<'_> {
    pub(super) fn no_block_clash(&self, name: &Ident) -> Result<(), Error> {
        if let Some(b) = self.blocks.get(&name.name) {
            return Err(err(
                Kind::Name,
                name.span,
                format!("`{}` is already the name of a block", name.name),
            )
            .label("value named like a block")
            .note(b.name.span, "block defined here")
            .help("values and blocks share one namespace; rename one of them"));
        }
        if layers::find(&name.name).is_some() || LOSSES.contains(&name.name.as_str()) {
            return Err(err(
                Kind::Name,
                name.span,
                format!("`{}` is a built-in operation", name.name),
            )
            .label("cannot be used as a value name")
            .help("choose another name"));
        }
        Ok(())
    }

    pub(super) fn unknown_name(&self, name: &str, span: Span, scope: Option<&Scope>) -> Error {
        let mut e = err(Kind::Name, span, format!("unknown name `{name}`")).label("not defined");
        if layers::find(name).is_some() || self.blocks.contains_key(name) {
            return e.label("an operation, not a value").help(format!(
                "`{name}` is an operation; apply it to a value: `x |> {name}` or `{name}(x)`"
            ));
        }
        if let Some(s) = scope {
            if let Some(later) = s.later.get(name) {
                if later.start > span.start {
                    return self.before_definition(name, span, *later);
                }
            }
            if let Some(b) = &s.in_block {
                if let Some(def) = self.top_names.get(name) {
                    return self.not_in_block(name, b, span, *def);
                }
            }
            if let Some(sg) = suggest(name, s.vars.keys().map(|k| k.as_str())) {
                e = e.help(format!("did you mean `{sg}`?"));
            } else if let Some(b) = &s.in_block {
                e = e.help(format!(
                    "a block sees only its parameters and its own values; to use a value from outside, pass it to block `{b}` as a parameter"
                ));
            }
        }
        e
    }

    /// A use inside block `block` of `name`, a top-level value (defined at `def`).
    fn not_in_block(&self, name: &str, block: &str, used: Span, def: Span) -> Error {
        err(
            Kind::Name,
            used,
            format!("`{name}` is not visible inside the block `{block}`"),
        )
        .label("defined outside the block")
        .note(def, format!("`{name}` is defined here, at the top level"))
        .help(format!(
            "blocks see only their parameters and their own values; pass it as a parameter: add `{name}` to the parameters of `block {block}(...)` and give it at each use, e.g. `{block}(..., {name}: {name})`"
        ))
    }

    /// A use of `name` at `used` before its definition at `def`.
    pub(super) fn before_definition(&self, name: &str, used: Span, def: Span) -> Error {
        err(
            Kind::Name,
            used,
            format!("`{name}` is used before it is defined"),
        )
        .label("used here")
        .note(def, format!("`{name}` is defined here, below its use"))
        .help(format!(
            "move the definition of `{name}` above its first use: values are defined before they are used"
        ))
    }
}
