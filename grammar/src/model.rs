//! The checked program: what the parser + shape checker hand to the compiler.
//!
//! This is the contract between `dmc-grammar` and `dmc-compiler`. Everything in it has been checked:
//! names are unique, shapes are consistent, sizes are positive. Shapes here are *per sample*
//! (NHWC without the N); the batch size lives in [`TrainConfig`].

use serde::{Deserialize, Serialize};

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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Activation {
    Relu,
    Tanh,
    Sigmoid,
    Gelu,
}

impl Activation {
    /// Every activation, in the order the language documents them.
    pub const ALL: [Activation; 4] = [
        Activation::Relu,
        Activation::Tanh,
        Activation::Sigmoid,
        Activation::Gelu,
    ];

    /// The name a `.dm` program uses, as a layer and as `activation: NAME`.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Tanh => "tanh",
            Activation::Sigmoid => "sigmoid",
            Activation::Gelu => "gelu",
        }
    }

    /// The activation a `.dm` name stands for.
    pub fn from_name(name: &str) -> Option<Activation> {
        Activation::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// One primitive layer. `activation:` arguments are expanded by the checker into separate
/// `Layer::Act` nodes, so the compiler only ever sees primitive layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Layer {
    /// weight `[k, k, c_in, filters]` (HWIO, as Keras/TF), bias `[filters]`.
    Conv2d {
        filters: usize,
        kernel: usize,
        stride: usize,
        padding: Padding,
        bias: bool,
    },
    MaxPool {
        size: usize,
        stride: usize,
    },
    AvgPool {
        size: usize,
        stride: usize,
    },
    /// `[h, w, c] -> [c]`
    GlobalAvgPool,
    /// weight `[in, units]`, bias `[units]`; input must be flat `[in]`.
    Dense {
        units: usize,
        bias: bool,
    },
    /// `[..] -> [prod(..)]`
    Flatten,
    Act(Activation),
    /// Elementwise sum of two values of the same shape.
    Add,
    /// Inverted dropout with drop probability `p` in [0, 1).
    Dropout {
        p: f32,
    },
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LossKind {
    /// mean over batch and elements of (pred - target)^2
    Mse,
    /// softmax cross-entropy over the last axis of `pred` (logits `[classes]`), integer labels
    /// (target declared `[1]` or `[]`, dtype i32), mean over the batch.
    CrossEntropy,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Loss {
    pub kind: LossKind,
    pub pred: ValueRef,
    pub target: ValueRef,
    pub span: Span,
}

/// A learning rate training can use: a finite, positive number that is a normal `f32` (so it is
/// neither rounded to 0 nor to infinity where the update uses it). The one type through which every
/// learning rate enters dmc: the `.dm` optimizer, `dmc run --lr`, [`CompileOptions`]'s override and
/// the runtime's check of a plan.
///
/// [`CompileOptions`]: https://docs.rs/dmc-compiler
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct LearningRate(f32);

impl LearningRate {
    /// Validates `v`; the error says what is wrong with it (without the "what to do", which
    /// depends on where the value came from).
    pub fn new(v: f64) -> Result<Self, String> {
        // 1e39, not 1000000000000000000000000000000000000000
        let show = |v: f64| {
            if v != 0.0 && (v.abs() >= 1e6 || v.abs() < 1e-4) {
                format!("{v:e}")
            } else {
                format!("{v}")
            }
        };
        if v.is_nan() {
            return Err("the learning rate must be a number, found NaN".into());
        }
        if v <= 0.0 {
            return Err(format!(
                "the learning rate must be positive, found {}",
                show(v)
            ));
        }
        if v.is_infinite() || v > f32::MAX as f64 {
            return Err(format!(
                "the learning rate {} is too large: it becomes infinite as f32 (largest {:e})",
                show(v),
                f32::MAX
            ));
        }
        let f = v as f32;
        if !f.is_normal() {
            return Err(format!(
                "the learning rate {} is too small: as f32 it becomes {f:e} (smallest usable {:e})",
                show(v),
                f32::MIN_POSITIVE
            ));
        }
        Ok(LearningRate(f))
    }

    /// The value as used by the update.
    pub fn get(self) -> f32 {
        self.0
    }
}

impl std::str::FromStr for LearningRate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a number"))?;
        LearningRate::new(v)
    }
}

impl std::fmt::Display for LearningRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Optimizer {
    /// v = momentum*v + g + wd*w ; w -= lr * (nesterov ? g + wd*w + momentum*v : v)
    /// (PyTorch's formulation; momentum 0 is plain SGD and keeps no state).
    Sgd {
        lr: f32,
        momentum: f32,
        weight_decay: f32,
        nesterov: bool,
    },
    /// Adam with bias correction. `decoupled` = AdamW (weight decay applied to the weights directly,
    /// w -= lr*wd*w), otherwise L2 added to the gradient (as torch.optim.Adam).
    Adam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        decoupled: bool,
    },
}

impl Optimizer {
    pub fn lr(&self) -> f32 {
        match self {
            Optimizer::Sgd { lr, .. } | Optimizer::Adam { lr, .. } => *lr,
        }
    }
    /// Number of per-parameter state tensors the optimizer keeps (velocity; or m and v).
    pub fn state_slots(&self) -> usize {
        match self {
            Optimizer::Sgd { momentum, .. } => usize::from(*momentum != 0.0),
            Optimizer::Adam { .. } => 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub batch: usize,
    pub optimizer: Optimizer,
    /// Optional defaults a `.dm` file may give for the CLI (`--epochs`, `--seed`).
    pub epochs: Option<usize>,
    pub seed: Option<u64>,
}

/// A checked program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    pub inputs: Vec<TensorDecl>,
    pub targets: Vec<TensorDecl>,
    /// Topologically ordered: a node's inputs refer only to earlier nodes, inputs or targets.
    pub nodes: Vec<Node>,
    /// The value the user calls the output (the loss' prediction).
    pub output: ValueRef,
    pub loss: Loss,
    pub train: TrainConfig,
}

impl Model {
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
