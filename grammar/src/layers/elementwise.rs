//! Elementwise layers besides the activations: `add` (also `a + b`), `multiply` (also `a * b`),
//! `concat` (along the last axis), `dropout` and `softmax` (over the last axis).

use super::args::{ArgKind as K, Args, Param};
use super::build::{first, Built, Input};
use super::def::{Build, Inputs, LayerDef};
use crate::diag::{Error, Kind};
use crate::limits::fmt_shape;
use crate::model::Layer;

/// The entries of this family, in the language reference's order.
pub(super) fn defs() -> Vec<LayerDef> {
    vec![
        LayerDef {
            name: "add",
            inputs: Inputs::Pair,
            params: &[],
            build: Build::Layer(add),
            example: None,
            doc: "elementwise sum of two values of the same shape (also written `a + b`)",
            summary: "Add",
            aliases: &[],
        },
        LayerDef {
            name: "multiply",
            inputs: Inputs::Pair,
            params: &[],
            build: Build::Layer(multiply),
            example: None,
            doc: "elementwise product of two values of the same shape (also written `a * b`)",
            summary: "Multiply",
            aliases: &["mul"],
        },
        LayerDef {
            name: "concat",
            inputs: Inputs::Many,
            params: &[],
            build: Build::Layer(concat),
            example: None,
            doc: "two or more values joined along the last axis (channels), all other axes equal",
            summary: "Concatenate",
            aliases: &["concatenate", "cat"],
        },
        LayerDef {
            name: "dropout",
            inputs: Inputs::One,
            params: const { &[Param::required("p", K::Number)] },
            build: Build::Layer(dropout),
            example: Some("x |> dropout(0.5)"),
            doc: "inverted dropout in training: drops each unit with probability p, 0 <= p < 1",
            summary: "Dropout",
            aliases: &[],
        },
        LayerDef {
            name: "softmax",
            inputs: Inputs::One,
            params: &[],
            build: Build::Layer(softmax),
            example: None,
            doc: "softmax over the last axis: e^x / sum e^x along it (each row sums to 1)",
            summary: "Softmax",
            aliases: &[],
        },
    ]
}

/// `softmax`: over the last axis, whose length must be at least 1 (of any rank).
pub fn softmax(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let x = first(inputs, b)?;
    if x.shape.last().copied().unwrap_or(0) == 0 {
        return Err(Error::new(
            Kind::Shape,
            x.span,
            format!(
                "`softmax` needs a last axis to normalise over, the input is {}",
                fmt_shape(x.shape)
            ),
        )
        .label("no last axis")
        .help("apply it to a value of shape `[n]` or `[h, w, c]`"));
    }
    Ok(Built::plain(Layer::Softmax, x.shape.to_vec()))
}

/// The two values of `name` (`add`, `multiply`), which must have the same shape: the error says
/// which shapes differ, with `help`.
fn same_shape_pair<'a>(
    name: &str,
    verb: &str,
    help: &str,
    inputs: &'a [Input<'a>],
    b: &Args,
) -> Result<&'a [usize], Error> {
    let [a, bb] = inputs else {
        return Err(Error::new(
            Kind::Argument,
            b.call,
            format!("`{name}` takes exactly 2 values, got {}", inputs.len()),
        )
        .label("wrong number of values"));
    };
    if a.shape != bb.shape {
        return Err(Error::new(
            Kind::Shape,
            bb.span,
            format!(
                "cannot {verb} values of shapes {} and {}",
                fmt_shape(a.shape),
                fmt_shape(bb.shape)
            ),
        )
        .label(format!("this is {}", fmt_shape(bb.shape)))
        .note(a.span, format!("this is {}", fmt_shape(a.shape)))
        .help(help));
    }
    Ok(a.shape)
}

/// `a + b`: two values of the same shape.
pub fn add(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let help = "`+` adds elementwise and needs equal shapes; for a residual connection, give the branch as many channels as its input (e.g. with a 1x1 `conv2d`)";
    let shape = same_shape_pair("add", "add", help, inputs, b)?;
    Ok(Built::plain(Layer::Add, shape.to_vec()))
}

/// `a * b`: two values of the same shape.
pub fn multiply(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let help = "`*` multiplies elementwise and needs equal shapes; there is no broadcasting";
    let shape = same_shape_pair("multiply", "multiply", help, inputs, b)?;
    Ok(Built::plain(Layer::Mul, shape.to_vec()))
}

/// `concat(a, b, ...)`: two or more values of the same rank (at least 1) and the same extents
/// but for the last axis, joined along it.
pub fn concat(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let Some((first, rest)) = inputs.split_first().filter(|(_, r)| !r.is_empty()) else {
        return Err(Error::new(
            Kind::Argument,
            b.call,
            format!("`concat` takes at least 2 values, got {}", inputs.len()),
        )
        .label("wrong number of values")
        .help("write `concat(a, b, ...)`"));
    };
    let Some((&c0, head)) = first.shape.split_last() else {
        return Err(Error::new(
            Kind::Shape,
            first.span,
            format!(
                "`concat` joins along the last axis, but this value is {}",
                fmt_shape(first.shape)
            ),
        )
        .label("no last axis"));
    };
    let mut c = c0;
    for x in rest {
        let same_rank = x.shape.len() == first.shape.len();
        let differs = if same_rank {
            head.iter().zip(x.shape).position(|(p, q)| p != q)
        } else {
            None
        };
        if !same_rank || differs.is_some() {
            let what = match differs {
                Some(axis) => format!("axis {axis} differs ({} vs {})", head[axis], x.shape[axis]),
                None => format!("ranks differ ({} vs {})", first.shape.len(), x.shape.len()),
            };
            let last = first.shape.len() - 1;
            return Err(Error::new(
                Kind::Shape,
                x.span,
                format!(
                    "cannot concat values of shapes {} and {}: {what}",
                    fmt_shape(first.shape),
                    fmt_shape(x.shape)
                ),
            )
            .label(format!("this is {}", fmt_shape(x.shape)))
            .note(first.span, format!("this is {}", fmt_shape(first.shape)))
            .help(format!("`concat` joins along the last axis (axis {last}): every other axis must be equal; resize one value first (e.g. with `upsample` or `maxpool`)")));
        }
        c += x.shape[x.shape.len() - 1];
    }
    let mut shape = head.to_vec();
    shape.push(c);
    Ok(Built::plain(Layer::Concat, shape))
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
