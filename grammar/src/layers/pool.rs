//! Pooling layers: `maxpool`, `avgpool`, `global_avgpool`, `global_maxpool`, and `upsample` (the
//! inverse of a window's reduction).

use super::args::{ArgKind as K, ArgValue as V, Args, Param};
use super::build::{first, image, Built, Input};
use super::def::{Build, Inputs, LayerDef};
use crate::diag::{Error, Kind};
use crate::limits::elems;
use crate::model::{Layer, Padding, PoolGeom, Shape};
use dmc_plan::op::MAX_ARGMAX_WINDOW;

/// `maxpool` and `avgpool`: a window (`size`, or `(height, width)`), moved by its size unless told
/// otherwise, over the image padded by `padding` cells (PyTorch's `padding`: a number, `(h, w)`
/// or `(top, bottom, left, right)`); `ceil_mode` rounds the output up as PyTorch's.
const POOL_PARAMS: &[Param] = &[
    Param::required("size", K::Pair),
    Param::same_as("stride", K::Pair, "size"),
    Param::optional("padding", K::Padding(&[]), V::Padding(NO_PADDING)),
    Param::optional("ceil_mode", K::Flag, V::Flag(false)),
];

/// No padding on any side (the default of a pool's `padding`).
const NO_PADDING: Padding = Padding::Explicit {
    top: 0,
    bottom: 0,
    left: 0,
    right: 0,
};

/// The entries of this family, in the language reference's order.
pub(super) fn defs() -> Vec<LayerDef> {
    vec![
        LayerDef {
            name: "maxpool",
            inputs: Inputs::One,
            params: POOL_PARAMS,
            build: Build::Layer(maxpool),
            example: Some("x |> maxpool(2)"),
            doc: "maximum over windows of an image (padded cells never win)",
            summary: "MaxPool",
            aliases: &["maxpooling2d", "maxpool2d"],
        },
        LayerDef {
            name: "avgpool",
            inputs: Inputs::One,
            params: POOL_PARAMS,
            build: Build::Layer(avgpool),
            example: Some("x |> avgpool(2)"),
            doc: "mean over windows of an image (padded cells count as zeros)",
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

/// The window of `op` (size, stride, padding per side, ceil mode) and its output over the image
/// input.
fn pool(op: &str, inputs: &[Input<'_>], b: &Args) -> Result<(PoolGeom, Shape), Error> {
    let (kh, kw) = b.pair("size")?;
    let (sh, sw) = b.pair("stride")?;
    let (pt, pb, pl, pr) = match b.padding("padding")? {
        Padding::Explicit {
            top,
            bottom,
            left,
            right,
        } => (top, bottom, left, right),
        // the checker reads no words for this argument: a defect of the table
        Padding::Same | Padding::Valid => {
            return Err(Error::new(
                Kind::Argument,
                b.span("padding"),
                format!("`padding` of {op} is a number of cells"),
            )
            .label("expected a number"))
        }
    };
    let ceil_mode = b.flag("ceil_mode")?;
    let (h, w, c) = image(op, first(inputs, b)?)?;
    if pt > kh / 2 || pb > kh / 2 || pl > kw / 2 || pr > kw / 2 {
        return Err(Error::new(
            Kind::Argument,
            b.span("padding"),
            format!("padding ({pt}, {pb}, {pl}, {pr}) is more than half the {kh}x{kw} window"),
        )
        .label("too much padding")
        .help(format!("as in PyTorch, each side's padding is at most half the window (here {} above and below, {} left and right), so every window holds an input cell", kh / 2, kw / 2)));
    }
    let (ph, pw) = (h + pt + pb, w + pl + pr);
    if kh > ph || kw > pw {
        let what = if pt + pb + pl + pr == 0 {
            format!("{h}x{w} input")
        } else {
            format!("{ph}x{pw} padded input")
        };
        return Err(Error::new(
            Kind::Shape,
            b.span("size"),
            format!("pool window {kh}x{kw} is larger than its {what}"),
        )
        .label("window too large")
        .help("pooling windows must fit the (padded) input; use a smaller size, `padding:`, or remove a pooling layer earlier in the network"));
    }
    let geom = PoolGeom {
        kh,
        kw,
        stride_h: sh,
        stride_w: sw,
        pad_top: pt,
        pad_bottom: pb,
        pad_left: pl,
        pad_right: pr,
        ceil_mode,
    };
    let (ho, wo) = geom.out_hw(h, w).map_err(|reason| {
        Error::new(Kind::Shape, b.call, reason).label("while checking this pool")
    })?;
    Ok((geom, vec![ho, wo, c]))
}

pub fn maxpool(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let (geom, shape) = pool("maxpool", inputs, b)?;
    let (kh, kw) = (geom.kh, geom.kw);
    if kh * kw > MAX_ARGMAX_WINDOW {
        return Err(Error::new(
            Kind::Argument,
            b.span("size"),
            format!("max-pool window {kh}x{kw} has more than {MAX_ARGMAX_WINDOW} positions"),
        )
        .label("window too large")
        .help("max pooling records where each maximum was in one byte, so a window has at most 256 positions (16x16); use a smaller size (or `avgpool`)"));
    }
    Ok(Built::plain(Layer::MaxPool { geom }, shape))
}

pub fn avgpool(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let (geom, shape) = pool("avgpool", inputs, b)?;
    Ok(Built::plain(Layer::AvgPool { geom }, shape))
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
