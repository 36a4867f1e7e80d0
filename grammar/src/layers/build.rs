//! The builders of the layer table: each turns a call's input shapes and bound arguments into a
//! [`Layer`], its output shape and its parameters, or a diagnostic.

use super::args::Args;
use crate::diag::{Error, Kind};
use crate::limits::{elems, fmt_shape};
use crate::model::{Activation, Layer, Padding, Shape, Span};

/// One input value of a call: its per-sample shape and the span errors about it point at (the
/// call for single-input layers, the operand for `+`).
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub shape: &'a [usize],
    pub span: Span,
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
    fn plain(layer: Layer, shape: Shape) -> Built {
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
fn first<'a>(inputs: &[Input<'a>], b: &Args) -> Result<Input<'a>, Error> {
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
fn image(op: &str, input: Input<'_>) -> Result<(usize, usize, usize), Error> {
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
fn weight_and_bias(
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

pub fn conv2d(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let filters = b.count("filters")?;
    let kernel = b.count("kernel")?;
    let stride = b.count("stride")?;
    let padding = match b.choice("padding")? {
        "valid" => Padding::Valid,
        _ => Padding::Same,
    };
    let bias = b.flag("bias")?;
    let activation = b.activation("activation")?;
    let (h, w, c) = image("conv2d", first(inputs, b)?)?;
    let (oh, ow) = match padding {
        Padding::Same => (h.div_ceil(stride), w.div_ceil(stride)),
        Padding::Valid => {
            if kernel > h || kernel > w {
                return Err(Error::new(
                    Kind::Shape,
                    b.span("kernel"),
                    format!(
                        "kernel {kernel}x{kernel} is larger than its {h}x{w} input (padding: valid)"
                    ),
                )
                .label("kernel too large")
                .help("use a smaller kernel, or `padding: same`"));
            }
            ((h - kernel) / stride + 1, (w - kernel) / stride + 1)
        }
    };
    // Checked first: the weight's element count bounds every product below.
    elems(&[kernel, kernel, c, filters], b.call)?;
    let fan_in = kernel * kernel * c;
    let fan_out = kernel * kernel * filters;
    Ok(Built {
        layer: Layer::Conv2d {
            filters,
            kernel,
            stride,
            padding,
            bias,
        },
        shape: vec![oh, ow, filters],
        params: weight_and_bias(
            vec![kernel, kernel, c, filters],
            filters,
            fan_in,
            fan_out,
            bias,
        ),
        activation,
    })
}

/// The output of a pooling window `size` with `stride` over `op`'s image input.
fn pool(op: &str, inputs: &[Input<'_>], b: &Args) -> Result<(usize, usize, Shape), Error> {
    let size = b.count("size")?;
    let stride = b.count("stride")?;
    let (h, w, c) = image(op, first(inputs, b)?)?;
    if size > h || size > w {
        return Err(Error::new(
            Kind::Shape,
            b.span("size"),
            format!("pool window {size}x{size} is larger than its {h}x{w} input"),
        )
        .label("window too large")
        .help("pooling uses 'valid' windows; use a smaller size or remove a pooling layer earlier in the network"));
    }
    let shape = vec![(h - size) / stride + 1, (w - size) / stride + 1, c];
    Ok((size, stride, shape))
}

pub fn maxpool(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let (size, stride, shape) = pool("maxpool", inputs, b)?;
    Ok(Built::plain(Layer::MaxPool { size, stride }, shape))
}

pub fn avgpool(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let (size, stride, shape) = pool("avgpool", inputs, b)?;
    Ok(Built::plain(Layer::AvgPool { size, stride }, shape))
}

pub fn global_avgpool(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let (_, _, c) = image("global_avgpool", first(inputs, b)?)?;
    Ok(Built::plain(Layer::GlobalAvgPool, vec![c]))
}

pub fn dense(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let units = b.count("units")?;
    let bias = b.flag("bias")?;
    let activation = b.activation("activation")?;
    let input = first(inputs, b)?;
    let [fin] = *input.shape else {
        return Err(Error::new(
            Kind::Shape,
            input.span,
            format!(
                "`dense` expects a flat input [features], got {}",
                fmt_shape(input.shape)
            ),
        )
        .label(format!("input is {}", fmt_shape(input.shape)))
        .help("add `|> flatten` (or `|> global_avgpool`) before it"));
    };
    Ok(Built {
        layer: Layer::Dense { units, bias },
        shape: vec![units],
        params: weight_and_bias(vec![fin, units], units, fin, units, bias),
        activation,
    })
}

pub fn flatten(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let n = elems(first(inputs, b)?.shape, b.call)?;
    Ok(Built::plain(Layer::Flatten, vec![n]))
}

/// The builder of every activation layer: the shape is unchanged.
pub fn activation(a: Activation, inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let shape = first(inputs, b)?.shape.to_vec();
    Ok(Built::plain(Layer::Act(a), shape))
}

/// `a + b`: two values of the same shape.
pub fn add(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let [a, bb] = inputs else {
        return Err(Error::new(
            Kind::Argument,
            b.call,
            format!("`add` takes exactly 2 values, got {}", inputs.len()),
        )
        .label("wrong number of values"));
    };
    if a.shape != bb.shape {
        return Err(Error::new(Kind::Shape, bb.span, format!("cannot add values of shapes {} and {}", fmt_shape(a.shape), fmt_shape(bb.shape)))
            .label(format!("this is {}", fmt_shape(bb.shape)))
            .note(a.span, format!("this is {}", fmt_shape(a.shape)))
            .help("`+` adds elementwise and needs equal shapes; for a residual connection, give the branch as many channels as its input (e.g. with a 1x1 `conv2d`)"));
    }
    Ok(Built::plain(Layer::Add, a.shape.to_vec()))
}

pub fn dropout(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let p = b.number("p")?;
    if !(0.0..1.0).contains(&p) {
        return Err(Error::new(
            Kind::Argument,
            b.span("p"),
            format!("dropout probability must be in [0, 1), found {p:?}"),
        )
        .label("out of range")
        .help("`p` is the probability of dropping a unit, e.g. `dropout(0.5)`"));
    }
    let shape = first(inputs, b)?.shape.to_vec();
    Ok(Built::plain(Layer::Dropout { p: p as f32 }, shape))
}
