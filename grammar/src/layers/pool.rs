//! Pooling layers: `maxpool`, `avgpool`, `global_avgpool`, and `upsample` (the inverse of a
//! window's reduction).

use super::args::{ArgKind as K, Args, Param};
use super::build::{first, image, Built, Input};
use super::def::{Build, Inputs, LayerDef};
use crate::diag::{Error, Kind};
use crate::limits::elems;
use crate::model::{Layer, Shape};
use dmc_plan::op::MAX_ARGMAX_WINDOW;

/// `maxpool` and `avgpool`: a square window, moved by its size unless told otherwise.
const POOL_PARAMS: &[Param] = &[
    Param::required("size", K::Count),
    Param::same_as("stride", K::Count, "size"),
];

/// The entries of this family, in the language reference's order.
pub(super) fn defs() -> Vec<LayerDef> {
    vec![
        LayerDef {
            name: "maxpool",
            inputs: Inputs::One,
            params: POOL_PARAMS,
            build: Build::Layer(maxpool),
            example: Some("x |> maxpool(2)"),
            doc: "maximum over square 'valid' windows of an image",
            summary: "MaxPool",
            aliases: &["maxpooling2d", "maxpool2d"],
        },
        LayerDef {
            name: "avgpool",
            inputs: Inputs::One,
            params: POOL_PARAMS,
            build: Build::Layer(avgpool),
            example: Some("x |> avgpool(2)"),
            doc: "mean over square 'valid' windows of an image",
            summary: "AvgPool",
            aliases: &["averagepooling2d", "avgpool2d"],
        },
        LayerDef {
            name: "global_avgpool",
            inputs: Inputs::One,
            params: &[],
            build: Build::Layer(global_avgpool),
            example: None,
            doc: "mean over the height and width of an image: [h, w, c] -> [c]",
            summary: "GlobalAvgPool",
            aliases: &["globalaveragepooling2d", "adaptiveavgpool2d"],
        },
        LayerDef {
            name: "upsample",
            inputs: Inputs::One,
            params: const { &[Param::required("factor", K::Count)] },
            build: Build::Layer(upsample),
            example: Some("x |> upsample(2)"),
            doc:
                "nearest-neighbour upsampling of an image: [h, w, c] -> [h * factor, w * factor, c]",
            summary: "UpSampling2D",
            aliases: &["upsampling2d", "upsamplingnearest2d"],
        },
    ]
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
    if size * size > MAX_ARGMAX_WINDOW {
        return Err(Error::new(
            Kind::Argument,
            b.span("size"),
            format!("max-pool window {size}x{size} has more than {MAX_ARGMAX_WINDOW} positions"),
        )
        .label("window too large")
        .help("max pooling records where each maximum was in one byte, so a window has at most 16x16 positions; use a smaller size (or `avgpool`)"));
    }
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

/// `upsample(factor)`: every pixel repeated `factor` times along height and width.
pub fn upsample(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let factor = b.count("factor")?;
    let (h, w, c) = image("upsample", first(inputs, b)?)?;
    let shape = vec![h.saturating_mul(factor), w.saturating_mul(factor), c];
    elems(&shape, b.span("factor"))?;
    Ok(Built::plain(Layer::Upsample { factor }, shape))
}
