//! The table of layers: every layer operation of the language, in one place. Each entry gives the
//! layer's name, signature (arguments with kinds and defaults), builder, example, doc line, summary
//! type name and other spellings; the checker, the "did you mean" suggestions, the summary and the
//! fuzz tests read it. Activations get one entry each from [`Activation::ALL`].
//!
//! Adding a layer: a [`Layer`] variant in `model.rs` (with its arm in [`Layer::entry_name`]), and
//! one entry plus its builder in the module of its family (`conv.rs`, `pool.rs`, `dense.rs`,
//! `elementwise.rs`, `norm.rs`, `seq.rs`; the table concatenates them); `grammar/tests/it/layers.rs` checks every entry.

pub mod args;
pub mod build;
mod conv;
mod def;
mod dense;
mod elementwise;
mod norm;
mod pool;
mod seq;

pub use def::{Build, Inputs, LayerDef};

use crate::model::{Activation, Layer};
use std::sync::OnceLock;

/// The table, in the order the language reference lists the layers: each family's entries
/// (with their builders) are in the family's module.
fn table() -> Vec<LayerDef> {
    let mut t = conv::defs();
    t.extend(pool::defs());
    t.extend(dense::defs());
    t.extend(Activation::ALL.map(activation));
    t.extend(elementwise::defs());
    t.extend(norm::defs());
    t.extend(seq::defs());
    t
}

/// The entry of an activation layer: its parameter, if it has one, is an optional number
/// (`leaky_relu(alpha: 0.01)`).
fn activation(a: Activation) -> LayerDef {
    let params: &'static [args::Param] = match a.param() {
        // once per activation, when the table is built
        Some(p) => Box::leak(Box::new([args::Param::optional(
            p.name,
            args::ArgKind::Number,
            args::ArgValue::Number(p.default),
        )])),
        None => &[],
    };
    LayerDef {
        name: a.name(),
        inputs: Inputs::One,
        params,
        build: Build::Activation(a),
        example: None,
        doc: a.doc(),
        summary: a.display_name(),
        aliases: &[],
    }
}

/// Every layer of the language, in the reference's order.
pub fn layers() -> &'static [LayerDef] {
    static TABLE: OnceLock<Vec<LayerDef>> = OnceLock::new();
    TABLE.get_or_init(table)
}

/// The names of every layer, in the table's order.
pub fn names() -> impl Iterator<Item = &'static str> + Clone {
    layers().iter().map(|d| d.name)
}

/// The entry named `name`.
pub fn find(name: &str) -> Option<&'static LayerDef> {
    layers().iter().find(|d| d.name == name)
}

/// The entry of a layer of two values written as an operator: `add` (`a + b`), `multiply`
/// (`a * b`).
pub fn operator(name: &str) -> Option<&'static LayerDef> {
    find(name).filter(|d| d.inputs == Inputs::Pair)
}

/// The name of the entry that builds `layer`: what its automatic names are numbered by
/// (`conv2d_3`). Each arm must name the entry whose builder makes that variant; the table's tests
/// check it.
pub fn layer_name(layer: &Layer) -> &'static str {
    layer.entry_name()
}

/// The summary's type name of `layer` (`Conv2D`).
pub fn summary_type(layer: &Layer) -> &'static str {
    let name = layer_name(layer);
    find(name).map_or(name, |d| d.summary)
}
