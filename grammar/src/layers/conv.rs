//! Convolution layers: `conv2d`, `conv_transpose2d`.

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
                Param::required("kernel", K::Pair),
                Param::optional("stride", K::Pair, V::Pair(1, 1)),
                Param::optional(
                    "padding",
                    K::Padding(&["same", "valid"]),
                    V::Padding(Padding::Same),
                ),
                Param::optional("bias", K::Flag, V::Flag(true)),
                Param::optional("activation", K::Activation, V::Activation(None)),
                Param::optional("dilation", K::Pair, V::Pair(1, 1)),
                Param::optional("groups", K::Count, V::Count(1)),
                Param::optional("init", K::Init, V::Init(None)),
                Param::optional("bias_init", K::Init, V::Init(None)),
            ]
        },
        build: Build::Layer(conv2d),
        example: Some("x |> conv2d(64, 3)   # filters, kernel"),
        doc: "2-D convolution over an image [h, w, c], weight [kh, kw, c / groups, filters]",
        summary: "Conv2D",
        aliases: &["convolution2d", "depthwiseconv2d"],
    },
    LayerDef {
        name: "conv_transpose2d",
        inputs: Inputs::One,
        params: const {
            &[
                Param::required("filters", K::Count),
                Param::required("kernel", K::Pair),
                Param::optional("stride", K::Pair, V::Pair(1, 1)),
                Param::optional("padding", K::Padding(&["same", "valid"]), V::Padding(NO_PADDING)),
                Param::optional("output_padding", K::Padding(&[]), V::Padding(NO_PADDING)),
                Param::optional("bias", K::Flag, V::Flag(true)),
                Param::optional("activation", K::Activation, V::Activation(None)),
                Param::optional("dilation", K::Pair, V::Pair(1, 1)),
                Param::optional("groups", K::Count, V::Count(1)),
                Param::optional("init", K::Init, V::Init(None)),
                Param::optional("bias_init", K::Init, V::Init(None)),
            ]
        },
        build: Build::Layer(conv_transpose2d),
        example: Some("x |> conv_transpose2d(32, 2, stride: 2)   # filters, kernel"),
        doc: "2-D transposed convolution (PyTorch's ConvTranspose2d) over an image [h, w, c], weight [kh, kw, filters / groups, c]",
        summary: "Conv2DTranspose",
        aliases: &["convtranspose2d", "conv2dtranspose", "deconv2d", "deconvolution2d"],
    }]
}

/// No padding on any side (the default of `conv_transpose2d`'s `padding` and `output_padding`).
const NO_PADDING: Padding = Padding::Explicit {
    top: 0,
    bottom: 0,
    left: 0,
    right: 0,
};

/// The extent of a `k`-tap kernel dilated by `d`: `d*(k-1) + 1`.
pub fn dilated(k: usize, d: usize) -> usize {
    d.saturating_mul(k - 1).saturating_add(1)
}

pub fn conv2d(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let filters = b.count("filters")?;
    let (kh, kw) = b.pair("kernel")?;
    let (sh, sw) = b.pair("stride")?;
    let padding = b.padding("padding")?;
    let bias = b.flag("bias")?;
    let activation = b.activation("activation")?;
    let (dh, dw) = b.pair("dilation")?;
    let groups = b.count("groups")?;
    let (h, w, c) = image("conv2d", first(inputs, b)?)?;
    if c % groups != 0 || filters % groups != 0 {
        return Err(Error::new(
            Kind::Shape,
            b.span("groups"),
            format!(
                "{groups} groups must divide both the {c} input channels and the {filters} filters"
            ),
        )
        .label("groups do not divide the channels")
        .help(format!(
            "each group convolves c / groups inputs into filters / groups outputs; a depthwise convolution is `groups: {c}` with filters a multiple of {c}"
        )));
    }
    let (spanh, spanw) = (dilated(kh, dh), dilated(kw, dw));
    let (pt, pb) = padding.axis(true, h, spanh, sh);
    let (pl, pr) = padding.axis(false, w, spanw, sw);
    let (oh, ow) = match padding {
        Padding::Same => (h.div_ceil(sh), w.div_ceil(sw)),
        Padding::Valid | Padding::Explicit { .. } => {
            let (ph, pw) = (
                h.saturating_add(pt).saturating_add(pb),
                w.saturating_add(pl).saturating_add(pr),
            );
            if spanh > ph || spanw > pw {
                let what = if padding == Padding::Valid {
                    format!("{h}x{w} input (padding: valid)")
                } else {
                    format!("{ph}x{pw} padded input")
                };
                let dil = if dh > 1 || dw > 1 {
                    format!(" (dilated to {spanh}x{spanw})")
                } else {
                    String::new()
                };
                return Err(Error::new(
                    Kind::Shape,
                    b.span("kernel"),
                    format!("kernel {kh}x{kw}{dil} is larger than its {what}"),
                )
                .label("kernel too large")
                .help("use a smaller kernel or dilation, more padding, or `padding: same`"));
            }
            ((ph - spanh) / sh + 1, (pw - spanw) / sw + 1)
        }
    };
    // Checked first: the weight's element count bounds every product below.
    let cin = c / groups;
    elems(&[kh, kw, cin, filters], b.call)?;
    let fan_in = kh * kw * cin;
    // PyTorch's fan-out (weight.size(0) * receptive field), groups or not
    let fan_out = kh * kw * filters;
    Ok(Built {
        layer: Layer::Conv2d {
            filters,
            kernel: (kh, kw),
            stride: (sh, sw),
            padding,
            dilation: (dh, dw),
            groups,
            bias,
        },
        shape: vec![oh, ow, filters],
        params: weight_and_bias(vec![kh, kw, cin, filters], filters, fan_in, fan_out, bias),
        activation,
    })
}

/// Keras' `Conv2DTranspose(padding="same")` along one axis, as TensorFlow computes it (the
/// gradient of a `same` convolution of the `input·stride` output): `(before, after, output
/// padding)` for a kernel spanning `span` cells moved by `s`. The full output `(h - 1)·s + span`
/// loses `span - s` cells, `floor` of half before and the rest after (TF's `same` split, the odd
/// cell at the bottom / right); a kernel shorter than its stride loses none and gains `s - span`
/// cells of output padding (bias only).
pub fn same_transposed(span: usize, s: usize) -> (usize, usize, usize) {
    if span >= s {
        let total = span - s;
        (total / 2, total - total / 2, 0)
    } else {
        (0, 0, s - span)
    }
}

/// `conv_transpose2d`: the output extent is `(h - 1)*stride - top - bottom + span + output_padding`
/// (PyTorch's), `span` the dilated kernel's extent.
pub fn conv_transpose2d(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let filters = b.count("filters")?;
    let (kh, kw) = b.pair("kernel")?;
    let (sh, sw) = b.pair("stride")?;
    let bias = b.flag("bias")?;
    let activation = b.activation("activation")?;
    let groups = b.count("groups")?;
    let cells = |k: &str| match b.padding(k)? {
        Padding::Explicit {
            top,
            bottom,
            left,
            right,
        } => Ok((top, bottom, left, right)),
        // Keras' `valid`: nothing taken off
        Padding::Valid => Ok((0, 0, 0, 0)),
        // `same` is read apart; no other word reaches here
        Padding::Same => Err(Error::new(
            Kind::Argument,
            b.span(k),
            format!("`{k}` of conv_transpose2d is a number of cells"),
        )
        .label("expected a number")),
    };
    let same = b.padding("padding")? == Padding::Same;
    let (ot, ob, ol, or) = cells("output_padding")?;
    if same && (ot, ob, ol, or) != (0, 0, 0, 0) {
        return Err(Error::new(
            Kind::Argument,
            b.span("output_padding"),
            "`padding: same` chooses the output padding itself".to_string(),
        )
        .label("not with `padding: same`")
        .help("`same` makes the output input·stride; for another size give `padding` and `output_padding` in cells, as PyTorch's"));
    }
    let (dh, dw) = b.pair("dilation")?;
    let (spanh, spanw) = (dilated(kh, dh), dilated(kw, dw));
    let ((pt, pb, pl, pr), (ot, ob, ol, or)) = if same {
        let ((pt, pb, oph), (pl, pr, opw)) =
            (same_transposed(spanh, sh), same_transposed(spanw, sw));
        ((pt, pb, pl, pr), (oph, oph, opw, opw))
    } else {
        (cells("padding")?, (ot, ob, ol, or))
    };
    if ot != ob || ol != or {
        return Err(Error::new(
            Kind::Argument,
            b.span("output_padding"),
            "`output_padding` takes a number or (height, width)".to_string(),
        )
        .label("expected 1 or 2 numbers")
        .help("`output_padding: (1, 0)` adds one row at the bottom and no column, as PyTorch's `output_padding=(1, 0)`"));
    }
    let (oph, opw) = (ob, or);
    if oph >= sh || opw >= sw {
        return Err(Error::new(
            Kind::Shape,
            b.span("output_padding"),
            format!("output padding ({oph}, {opw}) must be smaller than the stride ({sh}, {sw})"),
        )
        .label("output padding not below the stride")
        .help("output padding picks one of the `stride` output sizes that convolve back to the input's size: use 0 up to stride - 1"));
    }
    let (h, w, c) = image("conv_transpose2d", first(inputs, b)?)?;
    if c % groups != 0 || filters % groups != 0 {
        return Err(Error::new(
            Kind::Shape,
            b.span("groups"),
            format!(
                "{groups} groups must divide both the {c} input channels and the {filters} filters"
            ),
        )
        .label("groups do not divide the channels"));
    }
    let ext = |n: usize, s: usize, span: usize, op: usize, p: usize| {
        n.saturating_sub(1)
            .saturating_mul(s)
            .saturating_add(span)
            .saturating_add(op)
            .checked_sub(p)
            .filter(|&e| e >= 1)
    };
    let (Some(oh), Some(ow)) = (
        ext(h, sh, spanh, oph, pt.saturating_add(pb)),
        ext(w, sw, spanw, opw, pl.saturating_add(pr)),
    ) else {
        return Err(Error::new(
            Kind::Shape,
            b.span("padding"),
            format!(
                "padding ({pt}, {pb}, {pl}, {pr}) leaves no output of the {h}x{w} input (the output is (h - 1)*stride + kernel - padding)"
            ),
        )
        .label("padding too large")
        .help("use less padding, or a larger kernel or stride"));
    };
    let cout = filters / groups;
    elems(&[kh, kw, cout, c], b.call)?;
    elems(&[oh, ow, filters], b.call)?;
    // PyTorch's fans for ConvTranspose2d.weight [c, filters / groups, kh, kw]: fan_in is
    // size(1) * receptive field, fan_out size(0) * receptive field
    let fan_in = kh * kw * cout;
    let fan_out = kh * kw * c;
    Ok(Built {
        layer: Layer::ConvTranspose2d {
            filters,
            kernel: (kh, kw),
            stride: (sh, sw),
            padding: (pt, pb, pl, pr),
            output_padding: (oph, opw),
            dilation: (dh, dw),
            groups,
            bias,
        },
        shape: vec![oh, ow, filters],
        params: weight_and_bias(vec![kh, kw, cout, c], filters, fan_in, fan_out, bias),
        activation,
    })
}
