//! The checked program: what the parser + shape checker hand to the compiler.
//!
//! This is the contract between `dmc-grammar` and `dmc-compiler`. Everything in it has been checked:
//! names are unique, shapes are consistent, sizes are positive. Shapes here are *per sample*
//! (NHWC without the N); the batch size lives in [`TrainConfig`].

use serde::{Deserialize, Serialize};

pub use crate::init::Initializer;
pub use dmc_plan::op::PoolGeom;
pub use dmc_plan::schedule::{Decay, LrSchedule};
/// The activations, the optimizers and the learning rate are the execution plan's own types: a
/// program's optimizer is the rule its update ops carry, and an activation's facts (its name, what
/// its backward reads, its formulas) live in one place.
pub use dmc_plan::unary::UnaryKind as Activation;
pub use dmc_plan::update::{LearningRate, UpdateRule as Optimizer};

/// Byte range into the source file (start inclusive, end exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Self {
        Span { start, end }
    }
    pub fn len(&self) -> usize {
        self.end - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// Per-sample shape, e.g. `[16, 16, 1]` for an NHWC image without the batch dimension.
pub type Shape = Vec<usize>;

/// Element type of a declared tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    /// Integer class labels (targets of `cross_entropy`).
    I32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorDecl {
    pub name: String,
    pub shape: Shape,
    pub dtype: DType,
    pub span: Span,
}

/// A reference to a value of the dataflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ValueRef {
    /// `model.inputs[i]`
    Input(usize),
    /// `model.targets[i]`
    Target(usize),
    /// `model.nodes[i]`
    Node(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Padding {
    /// Output spatial size = ceil(in / stride); padding split as TF/Keras do (extra on the bottom/right).
    Same,
    /// No padding: out = (in - kernel) / stride + 1.
    Valid,
    /// Zeros on each side (PyTorch's `padding`): out = (in + before + after - span) / stride + 1,
    /// `span` the dilated kernel's extent.
    Explicit {
        top: usize,
        bottom: usize,
        left: usize,
        right: usize,
    },
}

impl Padding {
    /// The padding (before, after) along one axis of `input` cells, for a dilated kernel extent
    /// `span` and `stride`: `same` pads `max((ceil(in/stride) - 1)*stride + span - in, 0)` in
    /// total, the smaller half first (as TF/Keras); `valid` nothing; explicit padding as given
    /// (`first`: the height's top/bottom, else the width's left/right).
    pub fn axis(self, first: bool, input: usize, span: usize, stride: usize) -> (usize, usize) {
        match self {
            Padding::Valid => (0, 0),
            Padding::Same => {
                let out = input.div_ceil(stride.max(1));
                let total = (out.saturating_sub(1) * stride + span).saturating_sub(input);
                (total / 2, total - total / 2)
            }
            Padding::Explicit {
                top,
                bottom,
                left,
                right,
            } => {
                if first {
                    (top, bottom)
                } else {
                    (left, right)
                }
            }
        }
    }
}

/// One primitive layer. `activation:` arguments are expanded by the checker into separate
/// `Layer::Act` nodes, so the compiler only ever sees primitive layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Layer {
    /// weight `[kh, kw, c_in / groups, filters]` (HWIO, as Keras/TF), bias `[filters]`;
    /// `kernel`, `stride` and `dilation` are (height, width).
    Conv2d {
        filters: usize,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: Padding,
        dilation: (usize, usize),
        groups: usize,
        bias: bool,
    },
    /// The transposed convolution (PyTorch's `ConvTranspose2d`): weight `[kh, kw, filters / groups,
    /// c_in]` (the HWIO weight of the convolution it transposes, from `filters` channels to
    /// `c_in`; Keras' `Conv2DTranspose` kernel), bias `[filters]`; `padding` is (top, bottom, left,
    /// right) cells taken off the output, `output_padding` (height, width) cells added at the
    /// bottom and right, each below its stride.
    ConvTranspose2d {
        filters: usize,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize, usize, usize),
        output_padding: (usize, usize),
        dilation: (usize, usize),
        groups: usize,
        bias: bool,
    },
    /// The window's padded cells are never the maximum.
    MaxPool {
        geom: PoolGeom,
    },
    /// Padded cells count as zeros; the divisor is the window's cells inside the padded input
    /// ([`PoolGeom::divisor`]).
    AvgPool {
        geom: PoolGeom,
    },
    /// `[h, w, c] -> [c]`
    GlobalAvgPool,
    /// `[h, w, c] -> [c]`, the maximum.
    GlobalMaxPool,
    /// Nearest-neighbour upsampling: `[h, w, c] -> [h * factor, w * factor, c]`.
    Upsample {
        factor: usize,
    },
    /// weight `[in, units]`, bias `[units]`; over the last axis of its input `[.., in] -> [..,
    /// units]` (each position of a sequence alike, as Keras' `Dense`).
    Dense {
        units: usize,
        bias: bool,
        /// `tie: e`: no weight of its own; it reads the table `[units, in]` of the embedding whose
        /// output is model node `e`, transposed (GPT-2's tied output head).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tied: Option<usize>,
    },
    /// `[..] -> [prod(..)]`
    Flatten,
    /// `[..] -> ` the node's shape (same element count): a row-major view, as `flatten`.
    Reshape,
    Act(Activation),
    /// Elementwise sum of two values of the same shape.
    Add,
    /// Elementwise product of two values of the same shape.
    Mul,
    /// Two or more values joined along the last axis (all other axes equal), in input order.
    Concat,
    /// Inverted dropout with drop probability `p` in [0, 1).
    Dropout {
        p: f32,
    },
    /// Softmax over the last axis (same shape).
    Softmax,
    /// Batch normalisation over the last axis (same shape): weight (scale) and bias (shift)
    /// `[c]`; running statistics with PyTorch's `momentum` (0 < momentum <= 1) and `eps`.
    BatchNorm {
        momentum: f32,
        eps: f32,
    },
    /// Layer normalisation over the last axis (same shape): each position's `c` values are
    /// normalised with their own mean and biased variance (`eps` added), then scaled by weight and
    /// shifted by bias `[c]`. No running statistics: train and eval compute the same.
    LayerNorm {
        eps: f32,
    },
    /// Token embedding: `int[..] -> [.., dim]`, weight `[vocab, dim]` (PyTorch's `nn.Embedding`).
    Embedding {
        vocab: usize,
        dim: usize,
    },
    /// Learned position embeddings: `[t, d] -> [t, d]`, adding weight `[t, d]` (row i to position
    /// i) to every sample.
    PosEmbedding,
    /// Multi-head self-attention over `[t, d]`: `qkv_weight [d, 3d]` (+ `qkv_bias [3d]`) projects
    /// each position to every head's query, key and value, fused attention (causal: position i
    /// attends to j <= i), then `out_weight [d, d]` (+ `out_bias [d]`).
    Attention {
        heads: usize,
        causal: bool,
        bias: bool,
    },
}

impl Layer {
    /// The name of the layer-table entry that builds this layer: what its automatic names are
    /// numbered by (`conv2d_3`). Each arm must name the entry whose builder makes that variant;
    /// the table's tests check it.
    pub fn entry_name(&self) -> &'static str {
        match self {
            Layer::Conv2d { .. } => "conv2d",
            Layer::ConvTranspose2d { .. } => "conv_transpose2d",
            Layer::MaxPool { .. } => "maxpool",
            Layer::AvgPool { .. } => "avgpool",
            Layer::GlobalAvgPool => "global_avgpool",
            Layer::GlobalMaxPool => "global_maxpool",
            Layer::Upsample { .. } => "upsample",
            Layer::Dense { .. } => "dense",
            Layer::Flatten => "flatten",
            Layer::Reshape => "reshape",
            Layer::Act(a) => a.name(),
            Layer::Add => "add",
            Layer::Mul => "multiply",
            Layer::Concat => "concat",
            Layer::Dropout { .. } => "dropout",
            Layer::Softmax => "softmax",
            Layer::BatchNorm { .. } => "batchnorm",
            Layer::LayerNorm { .. } => "layernorm",
            Layer::Embedding { .. } => "embedding",
            Layer::PosEmbedding => "pos_embedding",
            Layer::Attention { .. } => "attention",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamSpec {
    /// Full parameter name, e.g. `conv3.weight`.
    pub name: String,
    pub shape: Shape,
    /// Fan-in and fan-out, for He/Glorot initialisation.
    pub fan_in: usize,
    pub fan_out: usize,
    pub is_bias: bool,
    /// The layer's `init:` (weights) or `bias_init:` (biases); `None`: dmc's default (zero
    /// biases, He uniform for a weight read by a ReLU-like activation, else Glorot uniform).
    #[serde(default)]
    pub init: Option<Initializer>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Unique layer name: the user's label, or `<op><k>` (e.g. `conv2d_3`, 1-based per op kind,
    /// as Keras numbers its layers).
    pub name: String,
    pub layer: Layer,
    pub inputs: Vec<ValueRef>,
    /// Per-sample output shape.
    pub shape: Shape,
    /// Parameters of this layer (empty for parameter-free layers), named `<name>.weight` / `<name>.bias`.
    pub params: Vec<ParamSpec>,
    /// Where the layer was written.
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum LossKind {
    /// mean over batch and elements of (pred - target)^2
    Mse,
    /// softmax cross-entropy over the last axis of `pred` (logits `[classes]`), integer labels
    /// (target declared `[1]` or `[]`, dtype i32), mean over the batch; against the smoothed
    /// target `(1 - label_smoothing) onehot + label_smoothing / classes` (PyTorch's), 0 by default.
    CrossEntropy { label_smoothing: f32 },
    /// mean over batch and elements of |pred - target| (PyTorch's `L1Loss`)
    Mae,
    /// mean of d^2/2 where |d| <= delta, else delta (|d| - delta/2), d = pred - target
    /// (PyTorch's `HuberLoss`)
    Huber { delta: f32 },
    /// mean over batch and elements of the binary cross-entropy of sigmoid(logits) with float
    /// targets of the prediction's shape (binary and multi-label; PyTorch's `BCEWithLogitsLoss`)
    BceWithLogits,
}

impl LossKind {
    /// Whether the loss takes integer class labels (a classification) rather than float targets
    /// of the prediction's shape.
    pub fn takes_labels(&self) -> bool {
        matches!(self, LossKind::CrossEntropy { .. })
    }

    /// The loss' name in the language.
    pub fn name(&self) -> &'static str {
        match self {
            LossKind::Mse => "mse",
            LossKind::CrossEntropy { .. } => "cross_entropy",
            LossKind::Mae => "mae",
            LossKind::Huber { .. } => "huber",
            LossKind::BceWithLogits => "bce_with_logits",
        }
    }
}

/// One term of the loss: `weight * kind(pred, target)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossTerm {
    pub kind: LossKind,
    pub pred: ValueRef,
    pub target: ValueRef,
    /// A positive finite factor (1 when the term has none).
    pub weight: f32,
    /// The term as written (its weight, name and arguments).
    pub span: Span,
}

/// The loss: the sum of its terms, `w1 * l1(p1, t1) + w2 * l2(p2, t2) + ...` (at least one; a
/// single term without a weight is that loss).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Loss {
    pub terms: Vec<LossTerm>,
    /// The whole `loss` statement.
    pub span: Span,
}

impl Loss {
    /// The term classification metrics (accuracy, top-k) are measured on: the first
    /// `cross_entropy` term, if any.
    pub fn classifier(&self) -> Option<&LossTerm> {
        self.terms.iter().find(|t| t.kind.takes_labels())
    }

    /// The term whose prediction is the model's output (what `predict` writes, what accuracy is
    /// measured on): the classifier if there is one, else the first term.
    pub fn output_term(&self) -> &LossTerm {
        self.classifier().unwrap_or(&self.terms[0])
    }

    /// Whether the loss is one term of weight 1 (what a program without weights means).
    pub fn is_single(&self) -> bool {
        self.terms.len() == 1 && self.terms[0].weight == 1.0
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub batch: usize,
    pub optimizer: Optimizer,
    /// Optional defaults a `.dm` file may give for the CLI (`--epochs`, `--seed`).
    pub epochs: Option<usize>,
    pub seed: Option<u64>,
    /// `shuffle: false` keeps the data in file order every epoch (the CLI's `--no-shuffle`);
    /// unset (`None`) or `true` reshuffles every epoch.
    #[serde(default)]
    pub shuffle: Option<bool>,
    /// `schedule: cosine(warmup: 100)`: the learning rate of each step (constant when unset).
    #[serde(default)]
    pub schedule: LrSchedule,
    /// `accumulate: N`: one optimizer step per N micro-batches of `batch` samples, with the mean
    /// of their gradients (1: no accumulation). `clip_value` is in the optimizer
    /// ([`Optimizer::clip_value`]).
    #[serde(default = "one")]
    pub accumulate: usize,
    /// `precision: tf32`: the GEMMs on TF32 tensor cores on a GPU (fp32 when unset).
    #[serde(default)]
    pub precision: dmc_plan::plan::Precision,
}

fn one() -> usize {
    1
}

/// A checked program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    pub inputs: Vec<TensorDecl>,
    pub targets: Vec<TensorDecl>,
    /// Topologically ordered: a node's inputs refer only to earlier nodes, inputs or targets.
    pub nodes: Vec<Node>,
    /// The value the user calls the output: the prediction of [`Loss::output_term`] (what
    /// `predict` writes).
    pub output: ValueRef,
    pub loss: Loss,
    pub train: TrainConfig,
}

impl Model {
    /// The name of a target (`None` for another value).
    pub fn target_name(&self, v: ValueRef) -> Option<&str> {
        match v {
            ValueRef::Target(i) => self.targets.get(i).map(|t| t.name.as_str()),
            _ => None,
        }
    }

    /// Per-sample shape of a value.
    pub fn shape(&self, v: ValueRef) -> &Shape {
        match v {
            ValueRef::Input(i) => &self.inputs[i].shape,
            ValueRef::Target(i) => &self.targets[i].shape,
            ValueRef::Node(i) => &self.nodes[i].shape,
        }
    }
    pub fn params(&self) -> impl Iterator<Item = &ParamSpec> {
        self.nodes.iter().flat_map(|n| n.params.iter())
    }
    pub fn param_count(&self) -> usize {
        self.params()
            .map(|p| p.shape.iter().product::<usize>())
            .sum()
    }
}
