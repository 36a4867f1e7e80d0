//! Convolution layers: `conv2d`.

use super::args::{ArgKind as K, ArgValue as V, Args, Param};
use super::build::{first, image, weight_and_bias, Built, Input};
use super::def::{Build, Inputs, LayerDef};
use crate::diag::{Error, Kind};
use crate::limits::elems;
use crate::model::{Layer, Padding};

/// The entries of this family, in the language reference's order.
pub(super) fn defs() -> Vec<LayerDef> {
    vec![LayerDef {
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
        build: Build::Layer(conv2d),
        example: Some("x |> conv2d(64, 3)   # filters, kernel"),
        doc: "2-D convolution over an image [h, w, c], square kernel, weight [k, k, c, filters]",
        summary: "Conv2D",
        aliases: &["convolution2d"],
    }]
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
