//! "Did you mean" suggestions that keep the meaning: another framework's spelling of a built-in,
//! the same name in another case or without `_`, or a typo (a swap of two neighbouring letters,
//! or a few edits on a long enough name) — never another real concept (`elu` is not `gelu`, `mae`
//! is not `mse`). Names of well-known layers, activations, losses and optimizers that dmc does
//! not have are recognised and said to be unsupported instead.

use super::names::{LOSSES, OPTIMIZERS};
use crate::layers;
use crate::model::Activation;

/// Keras / PyTorch spellings of the built-ins besides the layers' (compared in lower case,
/// without `_`); the layers' are in their table entries.
const ALIASES: &[(&str, &str)] = &[
    ("meansquarederror", "mse"),
    ("mseloss", "mse"),
    ("crossentropyloss", "cross_entropy"),
    ("sparsecategoricalcrossentropy", "cross_entropy"),
    ("categoricalcrossentropy", "cross_entropy"),
    ("crossentropy", "cross_entropy"),
    ("nllloss", "cross_entropy"),
    ("swish", "silu"),
    ("l1loss", "mae"),
    ("l1", "mae"),
    ("meanabsoluteerror", "mae"),
    ("huberloss", "huber"),
    ("bcewithlogitsloss", "bce_with_logits"),
    ("bcewithlogits", "bce_with_logits"),
    ("leakyrelu", "leaky_relu"),
];

/// What a well-known name that dmc does not have is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Concept {
    Activation,
    Layer,
    Loss,
    Optimizer,
}

/// Well-known names from Keras and PyTorch that dmc does not have (yet), in lower case without
/// `_`: they are never "corrected" to a built-in of similar spelling.
const UNSUPPORTED: &[(&str, Concept)] = &[
    ("selu", Concept::Activation),
    ("celu", Concept::Activation),
    ("prelu", Concept::Activation),
    ("rrelu", Concept::Activation),
    ("relu6", Concept::Activation),
    ("logsoftmax", Concept::Activation),
    ("softsign", Concept::Activation),
    ("mish", Concept::Activation),
    ("hardtanh", Concept::Activation),
    ("hardsigmoid", Concept::Activation),
    ("hardswish", Concept::Activation),
    ("tanhshrink", Concept::Activation),
    ("exponential", Concept::Activation),
    ("glu", Concept::Activation),
    ("groupnorm", Concept::Layer),
    ("instancenorm", Concept::Layer),
    ("instancenorm2d", Concept::Layer),
    ("conv1d", Concept::Layer),
    ("conv3d", Concept::Layer),
    ("separableconv2d", Concept::Layer),
    ("maxpool1d", Concept::Layer),
    ("maxpool3d", Concept::Layer),
    ("avgpool1d", Concept::Layer),
    ("avgpool3d", Concept::Layer),
    ("lstm", Concept::Layer),
    ("gru", Concept::Layer),
    ("rnn", Concept::Layer),
    ("simplernn", Concept::Layer),
    ("transformer", Concept::Layer),
    ("permute", Concept::Layer),
    ("zeropadding2d", Concept::Layer),
    ("smoothl1", Concept::Loss),
    ("smoothl1loss", Concept::Loss),
    ("bce", Concept::Loss),
    ("bceloss", Concept::Loss),
    ("binarycrossentropy", Concept::Loss),
    ("kldiv", Concept::Loss),
    ("kldivloss", Concept::Loss),
    ("kld", Concept::Loss),
    ("kullbackleiblerdivergence", Concept::Loss),
    ("hinge", Concept::Loss),
    ("squaredhinge", Concept::Loss),
    ("poisson", Concept::Loss),
    ("logcosh", Concept::Loss),
    ("msle", Concept::Loss),
    ("cosinesimilarity", Concept::Loss),
    ("focal", Concept::Loss),
    ("ctc", Concept::Loss),
    ("adagrad", Concept::Optimizer),
    ("adadelta", Concept::Optimizer),
    ("adamax", Concept::Optimizer),
    ("nadam", Concept::Optimizer),
    ("radam", Concept::Optimizer),
    ("lamb", Concept::Optimizer),
    ("lbfgs", Concept::Optimizer),
    ("ftrl", Concept::Optimizer),
    ("asgd", Concept::Optimizer),
    ("rprop", Concept::Optimizer),
];

/// `name` in lower case without `_` (how aliases and unsupported names are compared).
fn key(name: &str) -> String {
    name.to_lowercase().chars().filter(|c| *c != '_').collect()
}

/// What `name` is when it is a well-known name dmc does not have.
pub(super) fn unsupported(name: &str) -> Option<Concept> {
    let k = key(name);
    UNSUPPORTED.iter().find(|(n, _)| *n == k).map(|(_, c)| *c)
}

/// The help for an unsupported `name`: what it is, and what dmc has instead.
pub(super) fn unsupported_help(name: &str) -> Option<String> {
    let concept = unsupported(name)?;
    let (what, list): (&str, Vec<&str>) = match concept {
        Concept::Activation => (
            "activations",
            Activation::ALL.map(Activation::name).to_vec(),
        ),
        Concept::Layer => ("operations", layers::names().collect()),
        Concept::Loss => ("losses", LOSSES.to_vec()),
        Concept::Optimizer => ("optimizers", OPTIMIZERS.to_vec()),
    };
    Some(format!(
        "`{name}` is not supported yet (supported {what}: {})",
        list.join(", ")
    ))
}

/// The built-in name another framework spells `key` (lower case, without `_`).
fn alias(key: &str) -> Option<&'static str> {
    let layer = layers::layers()
        .iter()
        .find(|d| d.aliases.contains(&key))
        .map(|d| d.name);
    layer.or_else(|| ALIASES.iter().find(|(a, _)| *a == key).map(|(_, t)| *t))
}

/// The digits of a name (`conv1d` and `conv2d` differ in meaning, not by a typo).
fn digits(s: &str) -> String {
    s.chars().filter(char::is_ascii_digit).collect()
}

/// How far `cand` is from the written `name` (both in lower case) when `name` is plausibly a typo
/// of it: a swap of two neighbouring letters at any length; otherwise, without changing the
/// digits, at most 1 edit for names of up to 5 letters (keeping the first letter; for up to 3
/// letters only an inserted or dropped letter), 2 up to 8 letters and 3 beyond.
fn typo_distance(name: &str, cand: &str) -> Option<usize> {
    let d = strsim::osa_distance(name, cand);
    if d == 0 {
        return Some(0);
    }
    // A swap counts 1 in `osa_distance` and 2 in `levenshtein`.
    if d == 1 && strsim::levenshtein(name, cand) == 2 {
        return Some(1);
    }
    if digits(name) != digits(cand) {
        return None;
    }
    let (n, m) = (name.chars().count(), cand.chars().count());
    let allowed = match n {
        0..=5 => 1,
        6..=8 => 2,
        _ => 3,
    };
    if d > allowed || d >= m || d >= n {
        return None;
    }
    if n <= 5 {
        // A short word: a changed first letter or a substitution in three letters makes another
        // word (`elu`/`gelu`, `selu`/`relu`, `mae`/`mse`).
        if name.chars().next() != cand.chars().next() || (n <= 3 && n == m) {
            return None;
        }
    }
    Some(d)
}

/// The candidate `name` most likely stands for (see the module's documentation), if any.
pub(super) fn suggest<'x>(name: &str, cands: impl IntoIterator<Item = &'x str>) -> Option<String> {
    let cands: Vec<&str> = cands.into_iter().collect();
    let k = key(name);
    if let Some(target) = alias(&k) {
        if cands.contains(&target) {
            return Some(target.to_string());
        }
    }
    if let Some(c) = cands.iter().find(|c| c.replace('_', "") == k) {
        return Some(c.to_string());
    }
    if unsupported(name).is_some() {
        return None;
    }
    let lower = name.to_lowercase();
    cands
        .into_iter()
        .filter_map(|c| typo_distance(&lower, &c.to_lowercase()).map(|d| (d, c)))
        .min()
        .map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: &[&str] = &[
        "dense", "relu", "gelu", "silu", "conv2d", "maxpool", "flatten",
    ];

    #[test]
    fn typos_are_corrected() {
        let s = |n: &str, c: &[&str]| suggest(n, c.iter().copied());
        assert_eq!(s("dens", OPS).as_deref(), Some("dense"));
        assert_eq!(s("rleu", OPS).as_deref(), Some("relu"));
        assert_eq!(s("adma", OPTIMIZERS).as_deref(), Some("adam"));
        assert_eq!(s("flaten", OPS).as_deref(), Some("flatten"));
        assert_eq!(s("conv2", OPS).as_deref(), Some("conv2d"));
        assert_eq!(s("Dense", OPS).as_deref(), Some("dense"));
        assert_eq!(s("sme", &["same", "valid"]).as_deref(), Some("same"));
        assert_eq!(s("mes", LOSSES).as_deref(), Some("mse"));
        assert_eq!(
            s("optimiser", &["batch", "optimizer"]).as_deref(),
            Some("optimizer")
        );
        assert_eq!(s("swish", OPS).as_deref(), Some("silu"));
    }

    #[test]
    fn other_concepts_are_not_corrected() {
        let s = |n: &str, c: &[&str]| suggest(n, c.iter().copied());
        for n in [
            "selu",
            "celu",
            "relu6",
            "prelu",
            "logsoftmax",
            "conv1d",
            "conv3d",
        ] {
            assert_eq!(s(n, OPS), None, "{n}");
            assert!(unsupported(n).is_some(), "{n}");
        }
        assert_eq!(s("mae", &["mse", "cross_entropy"]), None);
        assert_eq!(s("nadam", OPTIMIZERS), None);
        // Not in the list, but still another word.
        assert_eq!(s("mle", LOSSES), None);
        assert_eq!(s("xelu", OPS), None);
        assert_eq!(s("conv4d", OPS), None);
    }

    #[test]
    fn unsupported_names_list_what_exists() {
        let h = unsupported_help("selu").unwrap_or_default();
        assert!(
            h.starts_with("`selu` is not supported yet (supported activations: relu"),
            "{h}"
        );
        let h = unsupported_help("hinge").unwrap_or_default();
        assert!(
            h.contains("supported losses: mse, cross_entropy, mae"),
            "{h}"
        );
        assert!(unsupported_help("dense").is_none());
        // No entry of the list is a built-in.
        for (n, _) in UNSUPPORTED {
            assert!(layers::find(n).is_none() && !LOSSES.contains(n) && !OPTIMIZERS.contains(n));
        }
    }
}
