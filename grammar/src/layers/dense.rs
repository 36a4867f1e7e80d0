//! Flat layers: `dense` and `flatten`.

use super::args::{ArgKind as K, ArgValue as V, Args, Param};
use super::build::{first, weight_and_bias, Built, Input};
use super::def::{Build, Inputs, LayerDef};
use crate::diag::{Error, Kind};
use crate::limits::{elems, fmt_shape};
use crate::model::Layer;

/// The entries of this family, in the language reference's order.
pub(super) fn defs() -> Vec<LayerDef> {
    vec![
        LayerDef {
            name: "dense",
            inputs: Inputs::One,
            params: const {
                &[
                    Param::required("units", K::Count),
                    Param::optional("bias", K::Flag, V::Flag(true)),
                    Param::optional("activation", K::Activation, V::Activation(None)),
                    Param::optional("init", K::Init, V::Init(None)),
                    Param::optional("bias_init", K::Init, V::Init(None)),
                    Param::optional("tie", K::Value, V::Value(None)),
                ]
            },
            build: Build::Layer(dense),
            example: Some("x |> dense(10)"),
            doc: "fully connected layer on flat features [n] (or each position of [t, n]), weight [n, units]",
            summary: "Dense",
            aliases: &["linear", "fullyconnected", "fc"],
        },
        LayerDef {
            name: "flatten",
            inputs: Inputs::One,
            params: &[],
            build: Build::Layer(flatten),
            example: None,
            doc: "all dimensions into one: [d1, ..., dk] -> [d1 * ... * dk]",
            summary: "Flatten",
            aliases: &[],
        },
        LayerDef {
            name: "reshape",
            inputs: Inputs::One,
            params: const { &[Param::required("shape", K::Shape)] },
            build: Build::Layer(reshape),
            example: Some("x |> reshape([4, -1])   # [n]: also flatten"),
            doc: "the same elements in a new shape, row-major over [h, w, c]; one `-1` is inferred",
            summary: "Reshape",
            aliases: &["view"],
        },
    ]
}

pub fn dense(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let units = b.count("units")?;
    let bias = b.flag("bias")?;
    let activation = b.activation("activation")?;
    let tied = b.value("tie")?;
    let input = first(inputs, b)?;
    // flat features [n], or a sequence of them [t, n] (each position alike, as Keras' Dense)
    let (&fin, lead) = match input.shape {
        [n] | [_, n] => (n, &input.shape[..input.shape.len() - 1]),
        _ => {
            return Err(Error::new(
                Kind::Shape,
                input.span,
                format!(
                    "`dense` expects flat features [n] or a sequence of them [t, n], got {}",
                    fmt_shape(input.shape)
                ),
            )
            .label(format!("input is {}", fmt_shape(input.shape)))
            .help("add `|> flatten` (or `|> global_avgpool`) before it"))
        }
    };
    let mut shape = lead.to_vec();
    shape.push(units);
    Ok(Built {
        layer: Layer::Dense { units, bias, tied },
        shape,
        params: weight_and_bias(vec![fin, units], units, fin, units, bias),
        activation,
    })
}

/// `reshape([d1, ..., dk])`: the element count is kept; one `-1` takes what the others leave.
pub fn reshape(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let dims = b.dims("shape")?;
    let input = first(inputs, b)?;
    let n = elems(input.shape, b.call)?;
    let known = dims
        .as_slice()
        .iter()
        .filter(|&&d| d != -1)
        .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?));
    let infers = dims.as_slice().contains(&-1);
    let fail = |why: String| {
        Error::new(
            Kind::Shape,
            b.span("shape"),
            format!(
                "cannot reshape {} ({n} elements) into {}: {why}",
                fmt_shape(input.shape),
                dims.text()
            ),
        )
        .label("element counts differ")
        .help("a reshape keeps every element: the dimensions must multiply to the input's count (one may be `-1`)")
    };
    let shape: Vec<usize> = match known {
        Some(k) if infers && k > 0 && n % k == 0 => dims
            .as_slice()
            .iter()
            .map(|&d| if d == -1 { n / k } else { d as usize })
            .collect(),
        Some(k) if infers => return Err(fail(format!("{n} is not a multiple of {k}"))),
        Some(k) if k == n => dims.as_slice().iter().map(|&d| d as usize).collect(),
        Some(k) => return Err(fail(format!("the new shape has {k} elements"))),
        None => return Err(fail("the new shape has too many elements".to_string())),
    };
    Ok(Built::plain(Layer::Reshape, shape))
}

pub fn flatten(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let n = elems(first(inputs, b)?.shape, b.call)?;
    Ok(Built::plain(Layer::Flatten, vec![n]))
}
