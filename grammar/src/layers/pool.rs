//! Pooling layers: `maxpool`, `avgpool`, `global_avgpool`, `global_maxpool`, and `upsample` (the
//! inverse of a window's reduction).

use super::args::{ArgKind as K, ArgValue as V, Args, Param};
use super::build::{first, image, Built, Input};
use super::def::{Build, Inputs, LayerDef};
use crate::diag::{Error, Kind};
use crate::limits::elems;
use crate::model::{Layer, Shape};
use dmc_plan::op::MAX_ARGMAX_WINDOW;

/// `maxpool` and `avgpool`: a square window, moved by its size unless told otherwise, over the
/// image padded by `padding` cells on every side (PyTorch's `padding`).
const POOL_PARAMS: &[Param] = &[
    Param::required("size", K::Count),
    Param::same_as("stride", K::Count, "size"),
    Param::optional("padding", K::Natural, V::Natural(0)),
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
            doc: "maximum over square windows of an image (padded cells never win)",
            summary: "MaxPool",
            aliases: &["maxpooling2d", "maxpool2d"],
        },
        LayerDef {
            name: "avgpool",
            inputs: Inputs::One,
            params: POOL_PARAMS,
            build: Build::Layer(avgpool),
            example: Some("x |> avgpool(2)"),
            doc: "mean over square windows of an image (padded cells count as zeros)",
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
            name: "global_maxpool",
            inputs: Inputs::One,
            params: &[],
            build: Build::Layer(global_maxpool),
            example: None,
            doc: "maximum over the height and width of an image: [h, w, c] -> [c]",
            summary: "GlobalMaxPool",
            aliases: &["globalmaxpooling2d", "adaptivemaxpool2d", "globalmaxpool2d"],
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

/// A pooling window: its size, stride and padding.
struct Window {
    size: usize,
    stride: usize,
    padding: usize,
}

/// The window (`size` with `stride`, `padding` on every side) and output of `op` over its image
/// input.
fn pool(op: &str, inputs: &[Input<'_>], b: &Args) -> Result<(Window, Shape), Error> {
    let size = b.count("size")?;
    let stride = b.count("stride")?;
    let padding = b.natural("padding")?;
    let (h, w, c) = image(op, first(inputs, b)?)?;
    if padding > size / 2 {
        return Err(Error::new(
            Kind::Argument,
            b.span("padding"),
            format!("padding {padding} is more than half the {size}x{size} window"),
        )
        .label("too much padding")
        .help(format!("as in PyTorch, the padding is at most half the window (here {}), so every window holds an input cell", size / 2)));
    }
    let (ph, pw) = (h + 2 * padding, w + 2 * padding);
    if size > ph || size > pw {
        let what = if padding == 0 {
            format!("{h}x{w} input")
        } else {
            format!("{ph}x{pw} padded input")
        };
        return Err(Error::new(
            Kind::Shape,
            b.span("size"),
            format!("pool window {size}x{size} is larger than its {what}"),
        )
        .label("window too large")
        .help("pooling windows must fit the (padded) input; use a smaller size, `padding:`, or remove a pooling layer earlier in the network"));
    }
    let shape = vec![(ph - size) / stride + 1, (pw - size) / stride + 1, c];
    Ok((
        Window {
            size,
            stride,
            padding,
        },
        shape,
    ))
}

pub fn maxpool(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let (win, shape) = pool("maxpool", inputs, b)?;
    let size = win.size;
    if size * size > MAX_ARGMAX_WINDOW {
        return Err(Error::new(
            Kind::Argument,
            b.span("size"),
            format!("max-pool window {size}x{size} has more than {MAX_ARGMAX_WINDOW} positions"),
        )
        .label("window too large")
        .help("max pooling records where each maximum was in one byte, so a window has at most 16x16 positions; use a smaller size (or `avgpool`)"));
    }
    let layer = Layer::MaxPool {
        size,
        stride: win.stride,
        padding: win.padding,
    };
    Ok(Built::plain(layer, shape))
}

pub fn avgpool(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let (win, shape) = pool("avgpool", inputs, b)?;
    let layer = Layer::AvgPool {
        size: win.size,
        stride: win.stride,
        padding: win.padding,
    };
    Ok(Built::plain(layer, shape))
}

pub fn global_maxpool(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let (_, _, c) = image("global_maxpool", first(inputs, b)?)?;
    Ok(Built::plain(Layer::GlobalMaxPool, vec![c]))
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
