//! The program's layers that hold parameters, as another framework sees them: for each conv2d,
//! conv_transpose2d, dense, batchnorm, layernorm, embedding, pos_embedding and attention layer
//! (program order) its parameters (batchnorm: also its running statistics), which of the other
//! framework's tensors each one is made of (its [`Role`]s: one tensor, or Keras attention's query,
//! key and value side by side) and the layout conversion between them ([`Layout`]). A dense layer
//! after a `flatten` of an image knows the image's shape (PyTorch flattens it C,H,W; dmc and Keras
//! H,W,C); a dense layer tied to an embedding (`tie: e`) has only its bias, and may meet the
//! other framework's copy of the table it reads ([`Tied`]).
//!
//! Every parameter of the program belongs to one of these layers: a layer with parameters of a
//! kind not listed here is refused by [`param_layers`], so that no tensor is silently left out.

use std::fmt::Write as _;

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

    pub fn other(self) -> Framework {
        match self {
            Framework::Torch => Framework::Keras,
            Framework::Keras => Framework::Torch,
        }
    }
}

/// The role of a tensor of the other framework in its module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// `weight`, `kernel`, `gamma`, `embeddings` (or a bare parameter, `pos_embed`).
    Weight,
    /// `bias`, `beta`.
    Bias,
    RunningMean,
    RunningVar,
    /// PyTorch `nn.MultiheadAttention`: `in_proj_weight [3d, d]`, `in_proj_bias [3d]`,
    /// `out_proj.weight [d, d]`, `out_proj.bias [d]`.
    InProjWeight,
    InProjBias,
    OutProjWeight,
    OutProjBias,
    /// Keras `MultiHeadAttention`: the `query`, `key`, `value` kernels `[d, heads, dh]` and biases
    /// `[heads, dh]`, the `attention_output` kernel `[heads, dh, d]` and bias `[d]`.
    QueryKernel,
    QueryBias,
    KeyKernel,
    KeyBias,
    ValueKernel,
    ValueBias,
    OutputKernel,
    OutputBias,
}

impl Role {
    /// In words, for errors: `weight`, `running mean`, `in_proj_weight`, `query kernel`.
    pub fn describe(self) -> &'static str {
        match self {
            Role::Weight => "weight",
            Role::Bias => "bias",
            Role::RunningMean => "running mean",
            Role::RunningVar => "running variance",
            Role::InProjWeight => "in_proj_weight",
            Role::InProjBias => "in_proj_bias",
            Role::OutProjWeight => "out_proj.weight",
            Role::OutProjBias => "out_proj.bias",
            Role::QueryKernel => "query kernel",
            Role::QueryBias => "query bias",
            Role::KeyKernel => "key kernel",
            Role::KeyBias => "key bias",
            Role::ValueKernel => "value kernel",
            Role::ValueBias => "value bias",
            Role::OutputKernel => "attention_output kernel",
            Role::OutputBias => "attention_output bias",
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
    /// `dense(units, tie: e)`: no weight of its own (the embedding's table, transposed), only its
    /// bias if it has one.
    TiedDense,
    /// Per-channel scale and shift `[c]` (Keras `gamma`, `beta`) and the running statistics
    /// `running_mean`, `running_var` `[c]` (Keras `moving_mean`, `moving_variance`).
    BatchNorm,
    /// Per-channel scale and shift `[c]`, no statistics.
    LayerNorm,
    /// `weight [vocab, dim]`: PyTorch's `nn.Embedding.weight`, Keras's `embeddings`, as is.
    Embedding,
    /// `weight [t, d]`: an `nn.Embedding(t, d)` weight (GPT-2's `wpe`) or an `nn.Parameter`
    /// `[t, d]` / `[1, t, d]`; Keras `embeddings`.
    PosEmbedding,
    /// `qkv_weight [d, 3d]`, `qkv_bias [3d]`, `out_weight [d, d]`, `out_bias [d]`.
    Attention,
}

/// How one dmc tensor is laid out in the other framework.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// One tensor, converted by the runtime's [`Conversion`].
    One(Conversion),
    /// A position table `[t, d]`, as is; import also takes an `nn.Parameter` of shape
    /// `[1, t, d]`.
    Positions,
    /// One tensor of the same values in another shape (Keras attention's output kernel
    /// `[heads, dh, d]` for `[d, d]`).
    Reshape(Vec<usize>),
    /// Several tensors of these shapes (Keras attention's query, key and value kernels
    /// `[d, heads, dh]`, or biases `[heads, dh]`), each read as `rows x (its size / rows)` (rows:
    /// the dmc shape but its last axis) and set side by side along dmc's last axis.
    Join(Vec<Vec<usize>>),
}

fn shape_str(s: &[usize]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(","))
}

impl Layout {
    /// The other framework's shape of each of its tensors, for a dmc tensor of shape `dmc`.
    pub fn foreign_shapes(&self, dmc: &[usize]) -> Vec<Vec<usize>> {
        match self {
            Layout::One(c) => vec![c.foreign_shape(dmc)],
            Layout::Positions => vec![dmc.to_vec()],
            Layout::Reshape(s) => vec![s.clone()],
            Layout::Join(parts) => parts.clone(),
        }
    }

    /// Whether a tensor of shape `found` can be the other framework's tensor `i` (of
    /// [`Layout::foreign_shapes`]) for a dmc tensor of shape `dmc`.
    pub fn accepts(&self, dmc: &[usize], i: usize, found: &[usize]) -> bool {
        match (self, dmc, found) {
            (Layout::Positions, &[t, d], &[1, ft, fd]) => (t, d) == (ft, fd),
            _ => self.foreign_shapes(dmc).get(i).is_some_and(|s| s == found),
        }
    }

    /// The column range of part `i` of a [`Layout::Join`] in dmc's last axis, and the rows.
    fn join_span(parts: &[Vec<usize>], dmc: &[usize], i: usize) -> (usize, usize, usize) {
        let rows: usize = dmc[..dmc.len().saturating_sub(1)].iter().product();
        let cols = |p: &Vec<usize>| p.iter().product::<usize>() / rows.max(1);
        let start: usize = parts[..i].iter().map(cols).sum();
        (rows, start, start + cols(&parts[i]))
    }

    /// The conversion of the other framework's tensor `i` (shape `found`), in words, for the
    /// table.
    pub fn describe(&self, dmc: &[usize], i: usize, found: &[usize]) -> String {
        match self {
            Layout::One(c) => c.to_string(),
            Layout::Positions if found.len() == 3 => {
                format!("{} <-> {} (batch axis)", shape_str(found), shape_str(dmc))
            }
            Layout::Positions => Conversion::Same.to_string(),
            Layout::Reshape(_) => format!("reshape {} <-> {}", shape_str(found), shape_str(dmc)),
            Layout::Join(parts) => {
                let (_, a, b) = Self::join_span(parts, dmc, i);
                let what = if dmc.len() == 1 {
                    "elements"
                } else {
                    "columns"
                };
                format!("reshaped, {what} {a}..{b}")
            }
        }
    }

    /// The other framework's tensors (in [`Layout::foreign_shapes`]' order) in dmc's layout:
    /// the values of the dmc tensor of shape `dmc`.
    pub fn to_dmc(&self, dmc: &[usize], parts: &[(&[usize], &[f32])]) -> Result<Vec<f32>, String> {
        let n: usize = dmc.iter().product();
        let bad = |found: &[usize]| {
            format!(
                "shape {} does not fit {} (dmc {})",
                shape_str(found),
                self.describe(dmc, 0, found),
                shape_str(dmc)
            )
        };
        for (i, (shape, data)) in parts.iter().enumerate() {
            if !self.accepts(dmc, i, shape) || shape.iter().product::<usize>() != data.len() {
                return Err(bad(shape));
            }
        }
        match self {
            Layout::One(c) => {
                let (shape, data) = parts.first().ok_or_else(|| bad(&[]))?;
                let (s, v) = c.to_dmc(shape, data).map_err(|e| e.to_string())?;
                if s != dmc {
                    return Err(bad(shape));
                }
                Ok(v)
            }
            Layout::Positions | Layout::Reshape(_) => {
                let (shape, data) = parts.first().ok_or_else(|| bad(&[]))?;
                if data.len() != n {
                    return Err(bad(shape));
                }
                Ok(data.to_vec())
            }
            Layout::Join(shapes) => {
                if parts.len() != shapes.len() {
                    return Err(bad(&[]));
                }
                let width = *dmc.last().unwrap_or(&1);
                let mut out = vec![0f32; n];
                for (i, (_, data)) in parts.iter().enumerate() {
                    let (rows, a, b) = Self::join_span(shapes, dmc, i);
                    let w = b - a;
                    if rows * w != data.len() || b > width {
                        return Err(bad(parts[i].0));
                    }
                    for r in 0..rows {
                        out[r * width + a..r * width + b]
                            .copy_from_slice(&data[r * w..(r + 1) * w]);
                    }
                }
                Ok(out)
            }
        }
    }

    /// A dmc tensor (shape `dmc`) as the other framework's tensors: (shape, values) of each, in
    /// [`Layout::foreign_shapes`]' order.
    #[allow(clippy::type_complexity)]
    pub fn to_foreign(
        &self,
        dmc: &[usize],
        data: &[f32],
    ) -> Result<Vec<(Vec<usize>, Vec<f32>)>, String> {
        if dmc.iter().product::<usize>() != data.len() {
            return Err(format!(
                "{} values for shape {}",
                data.len(),
                shape_str(dmc)
            ));
        }
        match self {
            Layout::One(c) => Ok(vec![c.from_dmc(dmc, data).map_err(|e| e.to_string())?]),
            Layout::Positions => Ok(vec![(dmc.to_vec(), data.to_vec())]),
            Layout::Reshape(s) => {
                if s.iter().product::<usize>() != data.len() {
                    return Err(format!(
                        "cannot reshape {} into {}",
                        shape_str(dmc),
                        shape_str(s)
                    ));
                }
                Ok(vec![(s.clone(), data.to_vec())])
            }
            Layout::Join(shapes) => {
                let width = *dmc.last().unwrap_or(&1);
                let mut out = Vec::with_capacity(shapes.len());
                for (i, s) in shapes.iter().enumerate() {
                    let (rows, a, b) = Self::join_span(shapes, dmc, i);
                    if rows * (b - a) != s.iter().product::<usize>() || b > width {
                        return Err(format!(
                            "cannot split {} into {}",
                            shape_str(dmc),
                            shapes
                                .iter()
                                .map(|s| shape_str(s))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                    let mut v = Vec::with_capacity(rows * (b - a));
                    for r in 0..rows {
                        v.extend_from_slice(&data[r * width + a..r * width + b]);
                    }
                    out.push((s.clone(), v));
                }
                Ok(out)
            }
        }
    }
}

/// One dmc tensor of a layer and the other framework's tensors it is made of.
#[derive(Debug, Clone)]
pub struct Slot {
    pub param: ParamSpec,
    /// The roles of the other framework's tensors, in [`Layout::foreign_shapes`]' order.
    pub roles: Vec<Role>,
    pub layout: Layout,
    /// A batchnorm's running statistic (saved with the weights, never trained).
    pub stat: bool,
}

/// A dense layer tied to an embedding: the table it reads.
#[derive(Debug, Clone)]
pub struct Tied {
    /// The embedding layer's name.
    pub embedding: String,
    /// Its table `[vocab, dim]`.
    pub table: ParamSpec,
}

/// One parameter-holding layer of the program.
#[derive(Debug, Clone)]
pub struct ParamLayer {
    /// The dmc layer name (`hidden1`, `res_1.conv2d_2`).
    pub name: String,
    pub kind: Kind,
    /// The layer's parameters, as the program declares them.
    pub params: Vec<ParamSpec>,
    /// For a batchnorm: `running_mean` and `running_var` (saved with the weights, never trained).
    pub stats: Option<[ParamSpec; 2]>,
    /// For a dense layer: the `[h, w, c]` image whose flatten feeds it, if any.
    pub flattened_image: Option<[usize; 3]>,
    /// For an attention layer: its heads.
    pub heads: usize,
    /// For a tied dense layer: the embedding's table.
    pub tied: Option<Tied>,
}

impl ParamLayer {
    /// The parameter `<name>.<suffix>`.
    fn param(&self, suffix: &str) -> Option<&ParamSpec> {
        let name = format!("{}.{suffix}", self.name);
        self.params.iter().find(|p| p.name == name)
    }

    /// The dense / convolution weight's layout in `fw`.
    fn weight_conversion(&self, fw: Framework) -> Conversion {
        match (fw, self.kind, self.flattened_image) {
            (Framework::Keras, _, _) => Conversion::Same,
            (Framework::Torch, Kind::Conv2d | Kind::ConvTranspose2d, _) => Conversion::ConvOihw,
            (Framework::Torch, Kind::Dense, Some([h, w, c])) if h * w > 1 && c > 1 => {
                Conversion::LinearFlattenChw { h, w, c }
            }
            (Framework::Torch, Kind::Dense, _) => Conversion::LinearTranspose,
            _ => Conversion::Same,
        }
    }

    /// The layer's tensors as `fw` holds them, in the order they are listed and written.
    pub fn slots(&self, fw: Framework) -> Vec<Slot> {
        let slot = |p: Option<&ParamSpec>, roles: Vec<Role>, layout: Layout| {
            p.map(|p| Slot {
                param: p.clone(),
                roles,
                layout,
                stat: false,
            })
        };
        let same = || Layout::One(Conversion::Same);
        let mut out: Vec<Option<Slot>> = match (self.kind, fw) {
            (Kind::Conv2d | Kind::ConvTranspose2d | Kind::Dense, _) => vec![
                slot(
                    self.param("weight"),
                    vec![Role::Weight],
                    Layout::One(self.weight_conversion(fw)),
                ),
                slot(self.param("bias"), vec![Role::Bias], same()),
            ],
            (Kind::TiedDense, _) => vec![slot(self.param("bias"), vec![Role::Bias], same())],
            (Kind::BatchNorm | Kind::LayerNorm, _) => vec![
                slot(self.param("weight"), vec![Role::Weight], same()),
                slot(self.param("bias"), vec![Role::Bias], same()),
            ],
            (Kind::Embedding, _) => vec![slot(self.param("weight"), vec![Role::Weight], same())],
            (Kind::PosEmbedding, _) => vec![slot(
                self.param("weight"),
                vec![Role::Weight],
                Layout::Positions,
            )],
            (Kind::Attention, Framework::Torch) => {
                let t = || Layout::One(Conversion::LinearTranspose);
                vec![
                    slot(self.param("qkv_weight"), vec![Role::InProjWeight], t()),
                    slot(self.param("qkv_bias"), vec![Role::InProjBias], same()),
                    slot(self.param("out_weight"), vec![Role::OutProjWeight], t()),
                    slot(self.param("out_bias"), vec![Role::OutProjBias], same()),
                ]
            }
            (Kind::Attention, Framework::Keras) => {
                let d = self.param("out_weight").map_or(0, |p| p.shape[0]);
                let (h, dh) = (self.heads, d / self.heads.max(1));
                vec![
                    slot(
                        self.param("qkv_weight"),
                        vec![Role::QueryKernel, Role::KeyKernel, Role::ValueKernel],
                        Layout::Join(vec![vec![d, h, dh]; 3]),
                    ),
                    slot(
                        self.param("qkv_bias"),
                        vec![Role::QueryBias, Role::KeyBias, Role::ValueBias],
                        Layout::Join(vec![vec![h, dh]; 3]),
                    ),
                    slot(
                        self.param("out_weight"),
                        vec![Role::OutputKernel],
                        Layout::Reshape(vec![h, dh, d]),
                    ),
                    slot(self.param("out_bias"), vec![Role::OutputBias], same()),
                ]
            }
        };
        if let Some([mean, var]) = &self.stats {
            for (p, role) in [(mean, Role::RunningMean), (var, Role::RunningVar)] {
                out.push(Some(Slot {
                    param: p.clone(),
                    roles: vec![role],
                    layout: same(),
                    stat: true,
                }));
            }
        }
        out.into_iter().flatten().collect()
    }

    /// For a tied dense layer: the other framework's copy of the table it may hold (PyTorch's
    /// `lm_head.weight [vocab, dim]`, the same tensor as the embedding's; Keras a kernel
    /// `[dim, vocab]`): its role, shape and the conversion to the table's layout.
    pub fn tied_weight(&self, fw: Framework) -> Option<(Role, Vec<usize>, Conversion)> {
        let t = self.tied.as_ref()?;
        let s = &t.table.shape;
        Some(match fw {
            Framework::Torch => (Role::Weight, s.clone(), Conversion::Same),
            // `[dim, vocab]`, read as `[out, in]` of a transpose: `[vocab, dim]`
            Framework::Keras => (
                Role::Weight,
                s.iter().rev().copied().collect(),
                Conversion::LinearTranspose,
            ),
        })
    }

    /// Whether the layer may go without a module in the other framework's file: a tied head
    /// with no bias has no tensor of its own.
    pub fn optional(&self) -> bool {
        self.kind == Kind::TiedDense && self.params.is_empty()
    }

    /// The layer in words: `conv2d 3x3, 16 -> 32` / `dense 784 -> 256`.
    pub fn describe(&self) -> String {
        let s = self
            .params
            .first()
            .map(|p| p.shape.clone())
            .unwrap_or_default();
        match (self.kind, s.as_slice()) {
            (Kind::Conv2d, [kh, kw, i, o]) => format!("conv2d {kh}x{kw}, {i} -> {o}"),
            (Kind::ConvTranspose2d, [kh, kw, o, i]) => {
                format!("conv_transpose2d {kh}x{kw}, {i} -> {o}")
            }
            (Kind::Dense, [i, o]) => format!("dense {i} -> {o}"),
            (Kind::BatchNorm, [c]) => format!("batchnorm {c}"),
            (Kind::LayerNorm, [c]) => format!("layernorm {c}"),
            (Kind::Embedding, [v, d]) => format!("embedding {v} x {d}"),
            (Kind::PosEmbedding, [t, d]) => format!("pos_embedding {t} x {d}"),
            (Kind::Attention, [d, _]) => {
                let mut s = format!("attention {d}, {} heads", self.heads);
                if self.param("qkv_bias").is_none() {
                    s.push_str(", no bias");
                }
                s
            }
            _ => match (&self.kind, &self.tied) {
                (Kind::TiedDense, Some(t)) => {
                    let (v, d) = (t.table.shape[0], t.table.shape[1]);
                    let mut s = format!("dense {d} -> {v} tied to `{}`", t.embedding);
                    if self.params.is_empty() {
                        s.push_str(", no bias");
                    }
                    s
                }
                _ => format!("{:?} {:?}", self.kind, s),
            },
        }
    }
}

/// The parameter-holding layers of `model`, in program order. A layer with parameters that
/// `dmc weights` cannot convert is an error naming it, never skipped.
pub fn param_layers(model: &Model) -> Result<Vec<ParamLayer>, CliError> {
    let mut out = Vec::new();
    for node in &model.nodes {
        let (kind, tied) = match node.layer {
            Layer::Conv2d { .. } => (Kind::Conv2d, None),
            Layer::ConvTranspose2d { .. } => (Kind::ConvTranspose2d, None),
            Layer::Dense { tied: Some(e), .. } => {
                let emb = model.nodes.get(e);
                let table = emb.and_then(|n| n.params.iter().find(|p| !p.is_bias));
                let (Some(emb), Some(table)) = (emb, table) else {
                    return Err(CliError::Message(format!(
                        "dense layer `{}` is tied to node {e}, which holds no table (internal error: a bug in dmc)",
                        node.name
                    )));
                };
                (
                    Kind::TiedDense,
                    Some(Tied {
                        embedding: emb.name.clone(),
                        table: table.clone(),
                    }),
                )
            }
            Layer::Dense { .. } => (Kind::Dense, None),
            Layer::BatchNorm { .. } => (Kind::BatchNorm, None),
            Layer::LayerNorm { .. } => (Kind::LayerNorm, None),
            Layer::Embedding { .. } => (Kind::Embedding, None),
            Layer::PosEmbedding => (Kind::PosEmbedding, None),
            Layer::Attention { .. } => (Kind::Attention, None),
            _ if node.params.is_empty() => continue,
            _ => {
                return Err(CliError::Usage(format!(
                    "layer `{}` ({}) has parameters ({}) that `dmc weights` cannot convert yet; convert them by hand (the dmc weights file names them so)",
                    node.name,
                    node.layer.entry_name(),
                    param_names(&node.params)
                )))
            }
        };
        let heads = match node.layer {
            Layer::Attention { heads, .. } => heads,
            _ => 0,
        };
        // The running statistics, under the names the compiler gives them (`<layer>.running_mean`).
        let stats = (kind == Kind::BatchNorm).then(|| {
            let shape = node
                .params
                .first()
                .map(|p| p.shape.clone())
                .unwrap_or_default();
            ["running_mean", "running_var"].map(|suffix| ParamSpec {
                name: format!("{}.{suffix}", node.name),
                shape: shape.clone(),
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
        let layer = ParamLayer {
            name: node.name.clone(),
            kind,
            params: node.params.clone(),
            stats,
            flattened_image,
            heads,
            tied,
        };
        // Every parameter must have its place in both frameworks' tensors.
        for fw in [Framework::Torch, Framework::Keras] {
            let slots = layer.slots(fw);
            let missing: Vec<ParamSpec> = node
                .params
                .iter()
                .filter(|p| !slots.iter().any(|s| s.param.name == p.name))
                .cloned()
                .collect();
            let weightless = matches!(kind, Kind::Conv2d | Kind::ConvTranspose2d | Kind::Dense)
                && layer.param("weight").is_none();
            if !missing.is_empty() || weightless {
                return Err(CliError::Message(format!(
                    "layer `{}` ({}): parameter(s) {} have no {} tensor (internal error: a bug in dmc)",
                    node.name,
                    node.layer.entry_name(),
                    if weightless {
                        "`weight`".to_string()
                    } else {
                        param_names(&missing)
                    },
                    fw.name()
                )));
            }
        }
        out.push(layer);
    }
    Ok(out)
}

fn param_names(params: &[ParamSpec]) -> String {
    let mut s = String::new();
    for (i, p) in params.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "`{}` {}", p.name, shape_str(&p.shape));
    }
    s
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_splits_and_joins_columns() {
        // dmc [2, 6] from three [2, 1, 2] parts: part i is columns 2i..2i+2 of each row.
        let l = Layout::Join(vec![vec![2, 1, 2]; 3]);
        let parts: Vec<Vec<f32>> = (0..3)
            .map(|p| (0..4).map(|k| (p * 10 + k) as f32).collect())
            .collect();
        let refs: Vec<(&[usize], &[f32])> = parts
            .iter()
            .map(|v| (&[2usize, 1, 2][..], v.as_slice()))
            .collect();
        let v = l.to_dmc(&[2, 6], &refs).unwrap();
        assert_eq!(
            v,
            vec![0., 1., 10., 11., 20., 21., 2., 3., 12., 13., 22., 23.]
        );
        let back = l.to_foreign(&[2, 6], &v).unwrap();
        for (p, (s, b)) in parts.iter().zip(back) {
            assert_eq!((s, &b), (vec![2, 1, 2], p));
        }
        // Biases: rank 1.
        let l = Layout::Join(vec![vec![1, 2]; 3]);
        let v = l
            .to_dmc(
                &[6],
                &[
                    (&[1, 2], &[0., 1.]),
                    (&[1, 2], &[2., 3.]),
                    (&[1, 2], &[4., 5.]),
                ],
            )
            .unwrap();
        assert_eq!(v, vec![0., 1., 2., 3., 4., 5.]);
        assert!(l.to_dmc(&[6], &[(&[2, 1], &[0., 1.])]).is_err());
    }

    #[test]
    fn positions_take_a_batch_axis() {
        let l = Layout::Positions;
        assert!(l.accepts(&[3, 2], 0, &[1, 3, 2]));
        assert!(l.accepts(&[3, 2], 0, &[3, 2]));
        assert!(!l.accepts(&[3, 2], 0, &[2, 3]));
        let v: Vec<f32> = (0..6).map(|x| x as f32).collect();
        assert_eq!(l.to_dmc(&[3, 2], &[(&[1, 3, 2], &v)]).unwrap(), v);
        assert_eq!(l.to_foreign(&[3, 2], &v).unwrap(), vec![(vec![3, 2], v)]);
    }
}
