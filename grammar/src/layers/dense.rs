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
                ]
            },
            build: Build::Layer(dense),
            example: Some("x |> dense(10)"),
            doc: "fully connected layer on a flat input [n], weight [n, units]",
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
            aliases: &["reshape"],
        },
    ]
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
