//! The table of layers: every layer operation of the language, in one place. Each entry gives the
//! layer's name, signature (arguments with kinds and defaults), builder, example, doc line, summary
//! type name and other spellings; the checker, the "did you mean" suggestions, the summary and the
//! fuzz tests read it. Activations get one entry each from [`Activation::ALL`].
//!
//! Adding a layer: a [`Layer`] variant in `model.rs`, one entry in [`table`], its builder in
//! `build.rs`, and its arm in [`layer_name`]; `grammar/tests/layers.rs` checks every entry.

pub mod args;
pub mod build;

use args::{ArgKind as K, ArgValue as V, Args, Param};
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

/// `maxpool` and `avgpool`: a square window, moved by its size unless told otherwise.
const POOL_PARAMS: &[Param] = &[
    Param::required("size", K::Count),
    Param::same_as("stride", K::Count, "size"),
];

/// The table, in the order the language reference lists the layers.
fn table() -> Vec<LayerDef> {
    let mut t = vec![
        LayerDef {
            name: "conv2d",
            inputs: Inputs::One,
            params: const {
                &[
                    Param::required("filters", K::Count),
                    Param::required("kernel", K::Count),
                    Param::optional("stride", K::Count, V::Count(1)),
                    Param::optional("padding", K::Choice(&["same", "valid"]), V::Choice("same")),
                    Param::optional("bias", K::Flag, V::Flag(true)),
                    Param::optional("activation", K::Activation, V::Activation(None)),
                ]
            },
            build: Build::Layer(build::conv2d),
            example: Some("x |> conv2d(64, 3)   # filters, kernel"),
            doc:
                "2-D convolution over an image [h, w, c], square kernel, weight [k, k, c, filters]",
            summary: "Conv2D",
            aliases: &["convolution2d"],
        },
        LayerDef {
            name: "maxpool",
            inputs: Inputs::One,
            params: POOL_PARAMS,
            build: Build::Layer(build::maxpool),
            example: Some("x |> maxpool(2)"),
            doc: "maximum over square 'valid' windows of an image",
            summary: "MaxPool",
            aliases: &["maxpooling2d", "maxpool2d"],
        },
        LayerDef {
            name: "avgpool",
            inputs: Inputs::One,
            params: POOL_PARAMS,
            build: Build::Layer(build::avgpool),
            example: Some("x |> avgpool(2)"),
            doc: "mean over square 'valid' windows of an image",
            summary: "AvgPool",
            aliases: &["averagepooling2d", "avgpool2d"],
        },
        LayerDef {
            name: "global_avgpool",
            inputs: Inputs::One,
            params: &[],
            build: Build::Layer(build::global_avgpool),
            example: None,
            doc: "mean over the height and width of an image: [h, w, c] -> [c]",
            summary: "GlobalAvgPool",
            aliases: &["globalaveragepooling2d", "adaptiveavgpool2d"],
        },
        LayerDef {
            name: "dense",
            inputs: Inputs::One,
            params: const {
                &[
                    Param::required("units", K::Count),
                    Param::optional("bias", K::Flag, V::Flag(true)),
                    Param::optional("activation", K::Activation, V::Activation(None)),
                ]
            },
            build: Build::Layer(build::dense),
            example: Some("x |> dense(10)"),
            doc: "fully connected layer on a flat input [n], weight [n, units]",
            summary: "Dense",
            aliases: &["linear", "fullyconnected", "fc"],
        },
        LayerDef {
            name: "flatten",
            inputs: Inputs::One,
            params: &[],
            build: Build::Layer(build::flatten),
            example: None,
            doc: "all dimensions into one: [d1, ..., dk] -> [d1 * ... * dk]",
            summary: "Flatten",
            aliases: &["reshape"],
        },
    ];
    t.extend(Activation::ALL.map(activation));
    t.extend([
        LayerDef {
            name: "add",
            inputs: Inputs::Sum,
            params: &[],
            build: Build::Layer(build::add),
            example: None,
            doc: "elementwise sum of two values of the same shape (also written `a + b`)",
            summary: "Add",
            aliases: &[],
        },
        LayerDef {
            name: "dropout",
            inputs: Inputs::One,
            params: const { &[Param::required("p", K::Number)] },
            build: Build::Layer(build::dropout),
            example: Some("x |> dropout(0.5)"),
            doc: "inverted dropout in training: drops each unit with probability p, 0 <= p < 1",
            summary: "Dropout",
            aliases: &[],
        },
    ]);
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
    match layer {
        Layer::Conv2d { .. } => "conv2d",
        Layer::MaxPool { .. } => "maxpool",
        Layer::AvgPool { .. } => "avgpool",
        Layer::GlobalAvgPool => "global_avgpool",
        Layer::Dense { .. } => "dense",
        Layer::Flatten => "flatten",
        Layer::Act(a) => a.name(),
        Layer::Add => "add",
        Layer::Dropout { .. } => "dropout",
    }
}

/// The summary's type name of `layer` (`Conv2D`).
pub fn summary_type(layer: &Layer) -> &'static str {
    let name = layer_name(layer);
    find(name).map_or(name, |d| d.summary)
}
