//! Names: the built-in names besides the layers (losses, optimizers), "did you mean"
//! suggestions, and the errors about unknown, misplaced or clashing names.

use super::scope::Scope;
use super::state::{err, Checker};
use crate::ast::Ident;
use crate::diag::{Error, Kind};
use crate::layers;
use crate::model::Span;

/// The losses (`loss mse(out, y)`).
pub(super) const LOSSES: &[&str] = &["mse", "cross_entropy"];
/// The optimizers (`optimizer: sgd(lr: 0.01)`).
pub(super) const OPTIMIZERS: &[&str] = &["sgd", "adam", "adamw"];

/// Whether `name` is a layer, a loss or an optimizer.
pub(super) fn is_builtin(name: &str) -> bool {
    layers::find(name).is_some() || LOSSES.contains(&name) || OPTIMIZERS.contains(&name)
}

/// Edit distance for "did you mean" suggestions.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let v = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
            cur.push(v);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Keras / PyTorch spellings of the losses (compared in lower case, without `_`); the layers'
/// are in their table entries.
const LOSS_ALIASES: &[(&str, &str)] = &[
    ("meansquarederror", "mse"),
    ("mseloss", "mse"),
    ("crossentropyloss", "cross_entropy"),
    ("sparsecategoricalcrossentropy", "cross_entropy"),
    ("categoricalcrossentropy", "cross_entropy"),
    ("crossentropy", "cross_entropy"),
    ("nllloss", "cross_entropy"),
];

/// The built-in name another framework spells `key` (lower case, without `_`).
fn alias(key: &str) -> Option<&'static str> {
    let layer = layers::layers()
        .iter()
        .find(|d| d.aliases.contains(&key))
        .map(|d| d.name);
    layer.or_else(|| {
        LOSS_ALIASES
            .iter()
            .find(|(a, _)| *a == key)
            .map(|(_, t)| *t)
    })
}

/// The candidate `name` most likely stands for: another framework's spelling of it, the same
/// name without `_` or in another case, or one within a small edit distance.
pub(super) fn suggest<'x>(name: &str, cands: impl IntoIterator<Item = &'x str>) -> Option<String> {
    let cands: Vec<&str> = cands.into_iter().collect();
    let key: String = name.to_lowercase().chars().filter(|c| *c != '_').collect();
    if let Some(target) = alias(&key) {
        if cands.contains(&target) {
            return Some(target.to_string());
        }
    }
    if let Some(c) = cands.iter().find(|c| c.replace('_', "") == key) {
        return Some(c.to_string());
    }
    let best = cands
        .into_iter()
        .map(|c| (distance(name, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3) && *d < c.len())
        .min();
    best.map(|(_, c)| c.to_string())
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
                e = e.help(format!("a block only sees its parameters and its own values; pass `{name}` to block `{b}` as a parameter"));
            }
            if e.help.is_none() {
                if let Some(sg) = suggest(name, s.vars.keys().map(|k| k.as_str())) {
                    e = e.help(format!("did you mean `{sg}`?"));
                }
            }
        }
        e
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
