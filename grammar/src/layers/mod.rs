//! The table of layers: every layer operation of the language, in one place. Each entry gives the
//! layer's name, signature (arguments with kinds and defaults), builder, example, doc line, summary
//! type name and other spellings; the checker, the "did you mean" suggestions, the summary and the
//! fuzz tests read it. Activations get one entry each from [`Activation::ALL`].
//!
//! Adding a layer: a [`Layer`] variant in `model.rs` (with its arm in [`Layer::entry_name`]), and
//! one entry plus its builder in the module of its family (`conv.rs`, `pool.rs`, `dense.rs`,
//! `elementwise.rs`; the table concatenates them); `grammar/tests/layers.rs` checks every entry.

pub mod args;
pub mod build;
mod conv;
mod dense;
mod elementwise;
mod pool;

use args::{Args, Param};
use build::{Built, Input};

use crate::diag::Error;
use crate::model::{Activation, Layer};
use std::sync::OnceLock;

/// How a layer receives its input values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inputs {
    /// One value, piped in (`x |> dense(10)`) or given first (`dense(x, 10)`); the other arguments
    /// bind to the signature.
    One,
    /// The elementwise sum: two values, as `add(a, b)`, `a |> add(b)` or `a + b`; no other
    /// arguments.
    Sum,
}

/// How an entry builds its layer.
#[derive(Debug, Clone, Copy)]
pub enum Build {
    /// A builder of `build.rs`.
    Layer(build::Builder),
    /// An activation: same shape, [`Layer::Act`].
    Activation(Activation),
}

/// One layer operation of the language.
#[derive(Debug, Clone, Copy)]
pub struct LayerDef {
    /// The name a program writes (`conv2d`); also the prefix of its automatic layer names
    /// (`conv2d_1`).
    pub name: &'static str,
    pub inputs: Inputs,
    /// Arguments after the input value(s), in positional order.
    pub params: &'static [Param],
    pub build: Build,
    /// A use of the layer, shown when a required argument is missing (`None`: the layer has no
    /// required argument). Written as a pipeline stage applied to `x`; anything after `#` is a
    /// comment.
    pub example: Option<&'static str>,
    /// One line saying what the layer computes.
    pub doc: &'static str,
    /// Type name in `dmc summary` (Keras' name where there is one).
    pub summary: &'static str,
    /// Other frameworks' spellings, lower case without `_`, suggested as this layer.
    pub aliases: &'static [&'static str],
}

impl LayerDef {
    /// Builds the layer for `inputs` and the bound arguments.
    pub fn build(&self, inputs: &[Input<'_>], args: &Args) -> Result<Built, Error> {
        match self.build {
            Build::Layer(f) => f(inputs, args),
            Build::Activation(a) => build::activation(a, inputs, args),
        }
    }

    /// The signature as the language reference writes it:
    /// `maxpool(size, stride: size)`, `add(a, b)`, `flatten`.
    pub fn signature_text(&self) -> String {
        let mut parts: Vec<String> = match self.inputs {
            Inputs::One => vec![],
            Inputs::Sum => vec!["a".into(), "b".into()],
        };
        parts.extend(self.params.iter().map(|p| match p.default_text() {
            Some(d) => format!("{}: {d}", p.name),
            None => p.name.to_string(),
        }));
        if parts.is_empty() {
            self.name.to_string()
        } else {
            format!("{}({})", self.name, parts.join(", "))
        }
    }
}

/// The table, in the order the language reference lists the layers: each family's entries
/// (with their builders) are in the family's module.
fn table() -> Vec<LayerDef> {
    let mut t = conv::defs();
    t.extend(pool::defs());
    t.extend(dense::defs());
    t.extend(Activation::ALL.map(activation));
    t.extend(elementwise::defs());
    t
}

/// The entry of an activation layer.
fn activation(a: Activation) -> LayerDef {
    LayerDef {
        name: a.name(),
        inputs: Inputs::One,
        params: &[],
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

/// The entry of the elementwise sum (`a + b`).
pub fn sum() -> Option<&'static LayerDef> {
    layers().iter().find(|d| d.inputs == Inputs::Sum)
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
