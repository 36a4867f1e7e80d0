//! Normalisation layers: `batchnorm` (over the channels of an image `[h, w, c]` or the features
//! of a flat value `[n]`, with running statistics for eval and predict) and `layernorm` (over the
//! last axis of each position, the same in train and eval).

use super::args::{ArgKind as K, ArgValue as V, Args, Param};
use super::build::{first, Built, Input, ParamDraft};
use super::def::{Build, Inputs, LayerDef};
use crate::diag::{Error, Kind};
use crate::limits::fmt_shape;
use crate::model::Layer;

/// PyTorch's defaults (`nn.BatchNorm2d(momentum=0.1, eps=1e-5)`).
pub const BATCHNORM_MOMENTUM: f64 = 0.1;
pub const BATCHNORM_EPS: f64 = 1e-5;
/// PyTorch's default (`nn.LayerNorm(c, eps=1e-5)`; Keras' `LayerNormalization` uses 1e-3).
pub const LAYERNORM_EPS: f64 = 1e-5;

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
    },
    LayerDef {
        name: "layernorm",
        inputs: Inputs::One,
        params: const { &[Param::optional("eps", K::Number, V::Number(LAYERNORM_EPS))] },
        build: Build::Layer(layernorm),
        example: Some("x |> layernorm"),
        doc: "layer normalisation over the last axis of each position (features of [n] or [t, n], \
              channels of [h, w, c]), the same in train and eval",
        summary: "LayerNorm",
        aliases: &["layernormalization", "ln"],
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
    let eps = eps_arg(b, "batchnorm")?;
    let x = first(inputs, b)?;
    let c = last_axis(
        &x,
        "batchnorm",
        "it normalises each channel (the last axis) over the batch and the positions",
    )?;
    Ok(Built {
        layer: Layer::BatchNorm {
            momentum: momentum as f32,
            eps: eps as f32,
        },
        shape: x.shape.to_vec(),
        params: scale_and_shift(c),
        activation: None,
    })
}

/// `layernorm(eps)`: `[n]`, `[t, n]` or `[h, w, c]`, each position normalised over its last axis; scale
/// `weight` and shift `bias` of one element per feature (PyTorch's names), eps > 0.
pub fn layernorm(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let eps = eps_arg(b, "layernorm")?;
    let x = first(inputs, b)?;
    let c = match *x.shape {
        // each position of a sequence [t, d]
        [_, d] if d > 0 => d,
        _ => last_axis(
            &x,
            "layernorm",
            "it normalises each position over its last axis (the channels of an image, the features of [n] or of each position of [t, n])",
        )?,
    };
    Ok(Built {
        layer: Layer::LayerNorm { eps: eps as f32 },
        shape: x.shape.to_vec(),
        params: scale_and_shift(c),
        activation: None,
    })
}

/// The `eps` argument of the normalisation `layer`: a positive finite number.
fn eps_arg(b: &Args, layer: &str) -> Result<f64, Error> {
    let eps = b.number("eps")?;
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(Error::new(
            Kind::Argument,
            b.span("eps"),
            format!("{layer} eps must be a positive number, found {eps:?}"),
        )
        .label("out of range")
        .help("eps is added to the variance, e.g. `eps: 1e-5` (PyTorch) or `eps: 1e-3` (Keras)"));
    }
    Ok(eps)
}

/// The size of the last axis of the input of `layer`, an image `[h, w, c]` or flat features `[n]`;
/// `help` says what is normalised over what (the error's help).
fn last_axis(x: &Input<'_>, layer: &str, help: &str) -> Result<usize, Error> {
    match *x.shape {
        [n] | [_, _, n] if n > 0 => Ok(n),
        _ => Err(Error::new(
            Kind::Shape,
            x.span,
            format!(
                "`{layer}` expects an image [height, width, channels] or flat features [n], got {}",
                fmt_shape(x.shape)
            ),
        )
        .label(format!("input is {}", fmt_shape(x.shape)))
        .help(help.to_string())),
    }
}

/// The scale `weight` and shift `bias` of one element per channel.
fn scale_and_shift(c: usize) -> Vec<ParamDraft> {
    let per_channel = |suffix, is_bias| ParamDraft {
        suffix,
        shape: vec![c],
        fan_in: c,
        fan_out: c,
        is_bias,
    };
    vec![per_channel("weight", false), per_channel("bias", true)]
}
