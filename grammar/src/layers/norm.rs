//! Normalisation layers: `batchnorm` (over the channels of an image `[h, w, c]` or the features
//! of a flat value `[n]`, with running statistics for eval and predict).

use super::args::{ArgKind as K, ArgValue as V, Args, Param};
use super::build::{first, Built, Input, ParamDraft};
use super::def::{Build, Inputs, LayerDef};
use crate::diag::{Error, Kind};
use crate::limits::fmt_shape;
use crate::model::Layer;

/// PyTorch's defaults (`nn.BatchNorm2d(momentum=0.1, eps=1e-5)`).
pub const BATCHNORM_MOMENTUM: f64 = 0.1;
pub const BATCHNORM_EPS: f64 = 1e-5;

/// The entries of this family, in the language reference's order.
pub(super) fn defs() -> Vec<LayerDef> {
    vec![LayerDef {
        name: "batchnorm",
        inputs: Inputs::One,
        params: const {
            &[
                Param::optional("momentum", K::Number, V::Number(BATCHNORM_MOMENTUM)),
                Param::optional("eps", K::Number, V::Number(BATCHNORM_EPS)),
            ]
        },
        build: Build::Layer(batchnorm),
        example: Some("x |> batchnorm"),
        doc: "batch normalisation over the last axis (channels of [h, w, c], features of [n]), \
              with running statistics for eval",
        summary: "BatchNorm",
        aliases: &["batchnormalization", "batchnorm2d", "batchnorm1d", "bn"],
    }]
}

/// `batchnorm(momentum, eps)`: `[n]` or `[h, w, c]`; scale `weight` and shift `bias` of one
/// element per channel; 0 < momentum <= 1 (PyTorch's convention), eps > 0.
pub fn batchnorm(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let momentum = b.number("momentum")?;
    if !(momentum > 0.0 && momentum <= 1.0) {
        return Err(Error::new(
            Kind::Argument,
            b.span("momentum"),
            format!("batchnorm momentum must be in (0, 1], found {momentum:?}"),
        )
        .label("out of range")
        .help(
            "dmc uses PyTorch's convention, running = (1 - momentum) running + momentum batch \
             (default 0.1); Keras' momentum m is 1 - m here (Keras 0.99 is `momentum: 0.01`)",
        ));
    }
    let eps = b.number("eps")?;
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(Error::new(
            Kind::Argument,
            b.span("eps"),
            format!("batchnorm eps must be a positive number, found {eps:?}"),
        )
        .label("out of range")
        .help("eps is added to the variance, e.g. `eps: 1e-5` (PyTorch) or `eps: 1e-3` (Keras)"));
    }
    let x = first(inputs, b)?;
    let c = match *x.shape {
        [n] | [_, _, n] if n > 0 => n,
        _ => {
            return Err(Error::new(
                Kind::Shape,
                x.span,
                format!(
                    "`batchnorm` expects an image [height, width, channels] or flat features [n], got {}",
                    fmt_shape(x.shape)
                ),
            )
            .label(format!("input is {}", fmt_shape(x.shape)))
            .help("it normalises each channel (the last axis) over the batch and the positions"))
        }
    };
    let per_channel = |suffix, is_bias| ParamDraft {
        suffix,
        shape: vec![c],
        fan_in: c,
        fan_out: c,
        is_bias,
    };
    Ok(Built {
        layer: Layer::BatchNorm {
            momentum: momentum as f32,
            eps: eps as f32,
        },
        shape: x.shape.to_vec(),
        params: vec![per_channel("weight", false), per_channel("bias", true)],
        activation: None,
    })
}
