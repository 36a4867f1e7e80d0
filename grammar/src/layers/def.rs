//! What an entry of the layer table is: [`LayerDef`] (name, signature, builder, example, doc line,
//! summary name, aliases), with how it takes its inputs and how it builds its layer.

use super::args::{Args, Param};
use super::build::{self, Built, Input};
use crate::diag::Error;
use crate::model::Activation;

/// How a layer receives its input values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inputs {
    /// One value, piped in (`x |> dense(10)`) or given first (`dense(x, 10)`); the other arguments
    /// bind to the signature.
    One,
    /// Two values, as `add(a, b)`, `a |> add(b)` or an operator (`a + b`, `a * b`); no other
    /// arguments.
    Pair,
    /// Two or more values, as `concat(a, b, c)` or `a |> concat(b, c)`; no other arguments.
    Many,
}

/// How an entry builds its layer.
#[derive(Debug, Clone, Copy)]
pub enum Build {
    /// A builder of `build.rs`.
    Layer(build::Builder),
    /// An activation: same shape, [`Layer::Act`](crate::model::Layer::Act).
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
    /// Whether the layer reads integer tokens (`embedding`; every other layer computes on floats).
    pub fn reads_tokens(&self) -> bool {
        self.name == "embedding"
    }

    /// Builds the layer for `inputs` and the bound arguments.
    pub fn build(&self, inputs: &[Input<'_>], args: &Args) -> Result<Built, Error> {
        match self.build {
            Build::Layer(f) => f(inputs, args),
            Build::Activation(a) => build::activation(a, inputs, args),
        }
    }

    /// The signature as the language reference writes it:
    /// `maxpool(size, stride: size)`, `add(a, b)`, `concat(a, b, ...)`, `flatten`.
    pub fn signature_text(&self) -> String {
        let mut parts: Vec<String> = match self.inputs {
            Inputs::One => vec![],
            Inputs::Pair => vec!["a".into(), "b".into()],
            Inputs::Many => vec!["a".into(), "b".into(), "...".into()],
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
