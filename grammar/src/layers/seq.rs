//! Sequence layers (transformers): `embedding` (integer tokens to vectors), `pos_embedding`
//! (learned position embeddings) and `attention` (multi-head self-attention, fused: the `t x t`
//! scores are never held).

use super::args::{ArgKind as K, ArgValue as V, Args, Param};
use super::build::{first, Built, Input, ParamDraft};
use super::def::{Build, Inputs, LayerDef};
use crate::diag::{Error, Kind};
use crate::limits::fmt_shape;
use crate::model::Layer;

/// The entries of this family, in the language reference's order.
pub(super) fn defs() -> Vec<LayerDef> {
    vec![
        LayerDef {
            name: "embedding",
            inputs: Inputs::One,
            params: const {
                &[
                    Param::required("vocab", K::Count),
                    Param::required("dim", K::Count),
                    Param::optional("init", K::Init, V::Init(None)),
                ]
            },
            build: Build::Layer(embedding),
            example: Some("x |> embedding(256, 128)   # x: int[t] -> [t, 128]"),
            doc: "integer tokens int[..] in 0..vocab to vectors [.., dim], weight [vocab, dim]",
            summary: "Embedding",
            aliases: &["embed", "tokenembedding", "wte"],
        },
        LayerDef {
            name: "pos_embedding",
            inputs: Inputs::One,
            params: const { &[Param::optional("init", K::Init, V::Init(None))] },
            build: Build::Layer(pos_embedding),
            example: Some("x |> pos_embedding   # x: [t, d]"),
            doc: "learned position embeddings: adds weight [t, d] (row i at position i) to [t, d]",
            summary: "PositionEmbedding",
            aliases: &["positionembedding", "posembedding", "wpe", "positional"],
        },
        LayerDef {
            name: "attention",
            inputs: Inputs::One,
            params: const {
                &[
                    Param::required("heads", K::Count),
                    Param::optional("causal", K::Flag, V::Flag(true)),
                    Param::optional("bias", K::Flag, V::Flag(true)),
                    Param::optional("init", K::Init, V::Init(None)),
                    Param::optional("bias_init", K::Init, V::Init(None)),
                ]
            },
            build: Build::Layer(attention),
            example: Some("x |> attention(4)   # x: [t, d], d a multiple of the heads"),
            doc:
                "multi-head self-attention over [t, d] (causal by default), fused: memory O(t d), \
                  weights qkv_weight [d, 3d], out_weight [d, d]",
            summary: "MultiHeadAttention",
            aliases: &[
                "multiheadattention",
                "selfattention",
                "mha",
                "causalselfattention",
            ],
        },
    ]
}

/// The `[t, d]` input of the sequence layer `layer`, or an error.
fn sequence(x: &Input<'_>, layer: &str) -> Result<(usize, usize), Error> {
    match *x.shape {
        [t, d] if !x.int => Ok((t, d)),
        _ => Err(Error::new(
            Kind::Shape,
            x.span,
            format!(
                "`{layer}` expects a sequence of vectors [positions, features], got {}{}",
                if x.int { "int" } else { "" },
                fmt_shape(x.shape)
            ),
        )
        .label(format!("input is {}", fmt_shape(x.shape)))
        .help(
            "a sequence comes from `tokens |> embedding(vocab, dim)` with `input tokens: int[t]`",
        )),
    }
}

/// `embedding(vocab, dim)`: `int[..] -> [.., dim]`.
pub fn embedding(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let vocab = b.count("vocab")?;
    let dim = b.count("dim")?;
    let x = first(inputs, b)?;
    if !x.int {
        return Err(Error::new(
            Kind::Shape,
            x.span,
            format!(
                "`embedding` looks up integer tokens, but its input is a float value {}",
                fmt_shape(x.shape)
            ),
        )
        .label("float input")
        .help("declare the tokens as integers, e.g. `input tokens: int[256]`"));
    }
    let mut shape = x.shape.to_vec();
    shape.push(dim);
    Ok(Built {
        layer: Layer::Embedding { vocab, dim },
        shape,
        params: vec![ParamDraft {
            suffix: "weight",
            shape: vec![vocab, dim],
            fan_in: vocab,
            fan_out: dim,
            is_bias: false,
        }],
        activation: None,
    })
}

/// `pos_embedding`: `[t, d] -> [t, d]`, weight `[t, d]`.
pub fn pos_embedding(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let x = first(inputs, b)?;
    let (t, d) = sequence(&x, "pos_embedding")?;
    Ok(Built {
        layer: Layer::PosEmbedding,
        shape: vec![t, d],
        params: vec![ParamDraft {
            suffix: "weight",
            shape: vec![t, d],
            fan_in: t,
            fan_out: d,
            is_bias: false,
        }],
        activation: None,
    })
}

/// `attention(heads, causal, bias)`: `[t, d] -> [t, d]`, d a multiple of heads.
pub fn attention(inputs: &[Input<'_>], b: &Args) -> Result<Built, Error> {
    let heads = b.count("heads")?;
    let causal = b.flag("causal")?;
    let bias = b.flag("bias")?;
    let x = first(inputs, b)?;
    let (t, d) = sequence(&x, "attention")?;
    if d % heads != 0 {
        return Err(Error::new(
            Kind::Argument,
            b.span("heads"),
            format!("{heads} heads do not divide the {d} features of each position"),
        )
        .label(format!("{d} is not a multiple of {heads}"))
        .help(
            "each head gets d / heads features: pick heads dividing d (e.g. 4 or 8 for d = 256)",
        ));
    }
    let draft = |suffix, shape: Vec<usize>, fan_out, is_bias| ParamDraft {
        suffix,
        shape,
        fan_in: d,
        fan_out,
        is_bias,
    };
    let mut params = vec![draft("qkv_weight", vec![d, 3 * d], 3 * d, false)];
    if bias {
        params.push(draft("qkv_bias", vec![3 * d], 3 * d, true));
    }
    params.push(draft("out_weight", vec![d, d], d, false));
    if bias {
        params.push(draft("out_bias", vec![d], d, true));
    }
    Ok(Built {
        layer: Layer::Attention {
            heads,
            causal,
            bias,
        },
        shape: vec![t, d],
        params,
        activation: None,
    })
}
