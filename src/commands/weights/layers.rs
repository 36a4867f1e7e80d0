//! The program's layers that hold parameters, as another framework sees them: for each conv2d,
//! conv_transpose2d, dense, batchnorm and layernorm layer (program order) its weight and bias
//! (batchnorm: also its running statistics), the layout conversion each needs, and for a dense
//! layer after a `flatten` of an image the image's shape (PyTorch flattens it C,H,W; dmc and Keras
//! H,W,C).

use dmc_grammar::model::{Layer, Model, ParamSpec, ValueRef};
use dmc_runtime::io::Conversion;

use crate::report::CliError;

/// The framework on the other side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Framework {
    /// PyTorch: `state_dict()` saved with safetensors (OIHW convolutions, `[out, in]` Linear
    /// weights, images flattened C,H,W).
    Torch,
    /// Keras: `model.weights` saved with safetensors (`kernel`/`bias`; HWIO, `[in, out]`,
    /// channels-last, the same layouts as dmc).
    Keras,
}

impl Framework {
    pub fn name(self) -> &'static str {
        match self {
            Framework::Torch => "torch",
            Framework::Keras => "keras",
        }
    }
}

/// What kind of layer holds the parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Conv2d,
    /// Its weight `[kh, kw, out / groups, in]`: the HWIO weight of the convolution it transposes,
    /// so PyTorch's `ConvTranspose2d.weight` `[in, out / groups, kh, kw]` converts as a
    /// convolution's OIHW one does.
    ConvTranspose2d,
    Dense,
    /// Per-channel scale and shift `[c]` (Keras `gamma`, `beta`) and the running statistics
    /// `running_mean`, `running_var` `[c]` (Keras `moving_mean`, `moving_variance`).
    BatchNorm,
    /// Per-channel scale and shift `[c]`, no statistics.
    LayerNorm,
}

/// One parameter-holding layer of the program.
#[derive(Debug, Clone)]
pub struct ParamLayer {
    /// The dmc layer name (`hidden1`, `res_1.conv2d_2`).
    pub name: String,
    pub kind: Kind,
    pub weight: ParamSpec,
    pub bias: Option<ParamSpec>,
    /// For a batchnorm: `running_mean` and `running_var` (saved with the weights, never trained).
    pub stats: Option<[ParamSpec; 2]>,
    /// For a dense layer: the `[h, w, c]` image whose flatten feeds it, if any.
    pub flattened_image: Option<[usize; 3]>,
}

impl ParamLayer {
    /// How the weight's layout differs in `fw`.
    pub fn weight_conversion(&self, fw: Framework) -> Conversion {
        match (fw, self.kind, self.flattened_image) {
            (Framework::Keras, _, _) | (_, Kind::BatchNorm | Kind::LayerNorm, _) => {
                Conversion::Same
            }
            (Framework::Torch, Kind::Conv2d | Kind::ConvTranspose2d, _) => Conversion::ConvOihw,
            (Framework::Torch, Kind::Dense, Some([h, w, c])) if h * w > 1 && c > 1 => {
                Conversion::LinearFlattenChw { h, w, c }
            }
            (Framework::Torch, Kind::Dense, _) => Conversion::LinearTranspose,
        }
    }

    /// The layer in words: `conv2d 3x3, 16 -> 32` / `dense 784 -> 256`.
    pub fn describe(&self) -> String {
        let s = &self.weight.shape;
        match (self.kind, s.as_slice()) {
            (Kind::Conv2d, [kh, kw, i, o]) => format!("conv2d {kh}x{kw}, {i} -> {o}"),
            (Kind::ConvTranspose2d, [kh, kw, o, i]) => {
                format!("conv_transpose2d {kh}x{kw}, {i} -> {o}")
            }
            (Kind::Dense, [i, o]) => format!("dense {i} -> {o}"),
            (Kind::BatchNorm, [c]) => format!("batchnorm {c}"),
            (Kind::LayerNorm, [c]) => format!("layernorm {c}"),
            _ => format!("{:?} {:?}", self.kind, s),
        }
    }
}

/// The parameter-holding layers of `model`, in program order.
pub fn param_layers(model: &Model) -> Result<Vec<ParamLayer>, CliError> {
    let mut out = Vec::new();
    for node in &model.nodes {
        let kind = match node.layer {
            Layer::Conv2d { .. } => Kind::Conv2d,
            Layer::ConvTranspose2d { .. } => Kind::ConvTranspose2d,
            Layer::Dense { .. } => Kind::Dense,
            Layer::BatchNorm { .. } => Kind::BatchNorm,
            Layer::LayerNorm { .. } => Kind::LayerNorm,
            _ => continue,
        };
        let weight = node.params.iter().find(|p| !p.is_bias).cloned();
        let bias = node.params.iter().find(|p| p.is_bias).cloned();
        let Some(weight) = weight else {
            return Err(CliError::Message(format!(
                "layer `{}` has no weight parameter (internal error: a bug in dmc)",
                node.name
            )));
        };
        // The running statistics, under the names the compiler gives them (`<layer>.running_mean`).
        let stats = (kind == Kind::BatchNorm).then(|| {
            ["running_mean", "running_var"].map(|suffix| ParamSpec {
                name: format!("{}.{suffix}", node.name),
                shape: weight.shape.clone(),
                fan_in: 0,
                fan_out: 0,
                is_bias: false,
                init: None,
            })
        });
        let flattened_image = match (kind, node.inputs.first()) {
            (Kind::Dense, Some(&v)) => flatten_origin(model, v, &node.name)?,
            _ => None,
        };
        out.push(ParamLayer {
            name: node.name.clone(),
            kind,
            weight,
            bias,
            stats,
            flattened_image,
        });
    }
    Ok(out)
}

/// The `[h, w, c]` image whose flatten is the value `v` (through activations, dropout and sums
/// of values of the same origin), or `None` when `v` is not a flattened image.
fn flatten_origin(model: &Model, v: ValueRef, dense: &str) -> Result<Option<[usize; 3]>, CliError> {
    let mut v = v;
    loop {
        let ValueRef::Node(i) = v else {
            return Ok(None);
        };
        let node = &model.nodes[i];
        match &node.layer {
            // a reshape keeps the row-major order over [h, w, c], as flatten
            Layer::Flatten | Layer::Reshape => {
                let input = node.inputs[0];
                return match model.shape(input).as_slice() {
                    &[h, w, c] => Ok(Some([h, w, c])),
                    _ => flatten_origin(model, input, dense),
                };
            }
            Layer::Act(_) | Layer::Dropout { .. } | Layer::Softmax => v = node.inputs[0],
            Layer::Add | Layer::Mul => {
                let a = flatten_origin(model, node.inputs[0], dense)?;
                let b = flatten_origin(model, node.inputs[1], dense)?;
                if a != b {
                    return Err(CliError::Usage(format!(
                        "the input of dense layer `{dense}` adds values flattened from different shapes ({a:?} and {b:?}, via `{}`), so its rows have no one order in the other framework; convert this layer's weight by hand",
                        node.name
                    )));
                }
                return Ok(a);
            }
            _ => return Ok(None),
        }
    }
}
