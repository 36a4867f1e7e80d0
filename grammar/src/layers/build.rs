//! What the builders of the layer table share: each builder (in the module of its family:
//! `conv.rs`, `pool.rs`, `dense.rs`, `elementwise.rs`) turns a call's input shapes and bound
//! arguments into a [`Built`] — the [`Layer`], its output shape and its parameters — or a
//! diagnostic.

use super::args::Args;
use crate::diag::{Error, Kind};
use crate::limits::fmt_shape;
use crate::model::{Activation, Layer, Shape, Span};

/// One input value of a call: its per-sample shape and the span errors about it point at (the
/// call for single-input layers, the operand for `+`).
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub shape: &'a [usize],
    pub span: Span,
    /// An integer value (a declared `int` input: tokens), which only `embedding` reads.
    pub int: bool,
}

/// A parameter before it is named: suffix (`weight`), shape, fan-in, fan-out.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamDraft {
    pub suffix: &'static str,
    pub shape: Shape,
    pub fan_in: usize,
    pub fan_out: usize,
    pub is_bias: bool,
}

/// What a builder returns: the layer, its per-sample output shape, its parameters, and the
/// activation (`activation: relu`) the checker appends as a separate `Layer::Act` node.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    pub layer: Layer,
    pub shape: Shape,
    pub params: Vec<ParamDraft>,
    pub activation: Option<Activation>,
}

impl Built {
    /// A layer without parameters or activation.
    pub(super) fn plain(layer: Layer, shape: Shape) -> Built {
        Built {
            layer,
            shape,
            params: vec![],
            activation: None,
        }
    }
}

/// The signature of every builder of the table.
pub type Builder = fn(&[Input<'_>], &Args) -> Result<Built, Error>;

/// The first input (the table gives every layer as many inputs as its builder reads).
pub(super) fn first<'a>(inputs: &[Input<'a>], b: &Args) -> Result<Input<'a>, Error> {
    inputs.first().copied().ok_or_else(|| {
        Error::new(
            Kind::Argument,
            b.call,
            "internal error: a layer was built without its input",
        )
        .label("while checking this call")
    })
}

/// `[h, w, c]` of an image input, or an error saying what `op` expected.
pub(super) fn image(op: &str, input: Input<'_>) -> Result<(usize, usize, usize), Error> {
    let s = input.shape;
    if let [h, w, c] = *s {
        return Ok((h, w, c));
    }
    let mut e = Error::new(
        Kind::Shape,
        input.span,
        format!(
            "`{op}` expects an image [height, width, channels], got {}",
            fmt_shape(s)
        ),
    )
    .label(format!("input is {}", fmt_shape(s)));
    if s.len() == 2 {
        e = e.help("declare images with a channel dimension, e.g. `input x: [28, 28, 1]`");
    } else if s.len() == 1 {
        e = e.help(format!(
            "`{op}` works on images; the input has already been flattened"
        ));
    }
    Err(e)
}

/// A weight and, with `bias`, a bias of `outputs` elements, sharing fan-in and fan-out.
pub(super) fn weight_and_bias(
    weight: Shape,
    outputs: usize,
    fan_in: usize,
    fan_out: usize,
    bias: bool,
) -> Vec<ParamDraft> {
    let mut ps = vec![ParamDraft {
        suffix: "weight",
        shape: weight,
        fan_in,
        fan_out,
        is_bias: false,
    }];
    if bias {
        ps.push(ParamDraft {
            suffix: "bias",
            shape: vec![outputs],
            fan_in,
            fan_out,
            is_bias: true,
        });
    }
    ps
}

/// The builder of every activation layer: the shape is unchanged; an activation with a parameter
/// takes it from its argument.
pub fn activation(a: Activation, inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let shape = first(inputs, b)?.shape.to_vec();
    let a = match a.param() {
        Some(p) => a.with_param(b.number(p.name)?).map_err(|reason| {
            Error::new(Kind::Argument, b.span(p.name), reason)
                .label("out of range")
                .help(format!(
                    "for example: `{}({})`",
                    a.name(),
                    a.param().map_or(0.0, |p| p.default)
                ))
        })?,
        None => a,
    };
    Ok(Built::plain(Layer::Act(a), shape))
}
