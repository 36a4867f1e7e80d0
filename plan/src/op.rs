//! The closed set of operations of the IR. Every IR node after autodiff is one kernel launch; the
//! same `Op` value travels in the execution plan, and every backend matches on it exhaustively.
//!
//! Shapes below are *full* shapes, batch first (NHWC for images). All tensors are f32 unless
//! stated otherwise. Argument order in the comments is the order of the node's inputs and of the
//! kernel signature ([`Op::signature`]).

use serde::{Deserialize, Serialize};

pub use crate::unary::UnaryKind;
/// The optimizer a program names: the update rule of its update ops (the language's name for it).
pub use crate::update::UpdateRule as Optimizer;
pub use crate::update::UpdateRule;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    I32,
    /// Compact indices (max-pool argmax within its window).
    U8,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::U8 => 1,
        }
    }
}

/// 2-D convolution geometry shared by the forward and the two backward ops.
/// Padding is explicit (top/left); bottom/right padding follows from the output size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvGeom {
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
    pub pad_top: usize,
    pub pad_left: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolGeom {
    pub size: usize,
    pub stride: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    // ---- leaves (no kernel: their buffers are filled by the runtime) ----
    /// A batch input or target, fed by the runtime before each step.
    Input { name: String },
    /// A trainable parameter; persistent across steps.
    Param { name: String },
    /// Optimizer state (velocity, Adam moments); persistent, zero-initialised.
    OptState { name: String },

    // ---- forward ----
    /// x[N,H,W,Ci], w[kh,kw,Ci,Co], (b[Co] if bias) -> y[N,Ho,Wo,Co].
    /// Workspace: [`Op::workspace_elems`] f32 (im2col rows of a chunk).
    Conv2d { geom: ConvGeom, bias: bool },
    /// x[N,K], w[K,M], (b[M] if bias) -> y[N,M].
    Dense { bias: bool },
    /// x[N,H,W,C] -> y[N,Ho,Wo,C], argmax u8[N,Ho,Wo,C] (row-major index dy*size+dx inside the
    /// window of the maximum; first maximum wins). Windows are 'valid' (floor).
    MaxPool { geom: PoolGeom },
    /// x[N,H,W,C] -> y[N,Ho,Wo,C], mean over each valid window.
    AvgPool { geom: PoolGeom },
    /// x[N,H,W,C] -> y[N,C]
    GlobalAvgPool,
    /// Same elements, another shape: no kernel, the output aliases the input's buffer.
    Reshape,
    /// y = f(x) elementwise.
    Unary(UnaryKind),
    /// y = a + b (same shapes). Also used to accumulate gradients of values used twice.
    Add,
    /// y = x * keep / (1-p), keep = (hash(seed, step, salt, index) >= p): the mask is regenerated
    /// from a counter-based RNG in backward, never stored.
    Dropout { p: f32, salt: u64 },
    /// pred[N,..], target[N,..] -> loss[1] = mean((pred - target)^2)
    MseLoss,
    /// logits[N,C], labels i32[N] -> loss[1] = mean_n(logsumexp(logits_n) - logits_n[label_n])
    CrossEntropyLoss,

    // ---- backward ----
    /// dy[N,Ho,Wo,Co], w[kh,kw,Ci,Co] -> dx[N,H,W,Ci] (reads w in place, flipped: no transposed copy)
    Conv2dBwdData { geom: ConvGeom },
    /// x[N,H,W,Ci], dy[N,Ho,Wo,Co] -> dw[kh,kw,Ci,Co]. Workspace as for Conv2d.
    Conv2dBwdWeight { geom: ConvGeom },
    /// dy[.., C] -> db[C] = sum over every leading axis
    BiasGrad,
    /// dy[N,M], w[K,M] -> dx[N,K] = dy w^T
    DenseBwdData,
    /// x[N,K], dy[N,M] -> dw[K,M] = x^T dy
    DenseBwdWeight,
    /// dy[N,Ho,Wo,C], argmax u8[N,Ho,Wo,C] -> dx[N,H,W,C] (scatter-add into the argmax position)
    MaxPoolBwd { geom: PoolGeom },
    /// dy[N,Ho,Wo,C] -> dx[N,H,W,C]
    AvgPoolBwd { geom: PoolGeom },
    /// dy[N,C] -> dx[N,H,W,C] = dy / (H*W) broadcast
    GlobalAvgPoolBwd,
    /// (saved, dy) -> dx, `saved` being what [`UnaryKind::saved`] names: y for relu, tanh, sigmoid
    /// (from the *output*, so the input need not be kept), x for gelu.
    UnaryBwd(UnaryKind),
    /// dy -> dx = dy * keep / (1-p), same mask as the forward.
    DropoutBwd { p: f32, salt: u64 },
    /// pred, target -> dpred = 2 (pred - target) / numel
    MseLossBwd,
    /// logits[N,C], labels i32[N] -> dlogits = (softmax(logits) - onehot(label)) / N
    CrossEntropyLossBwd,

    // ---- optimizer (in place: the outputs alias the first inputs) ----
    /// The update `rule` of one parameter: w, g, state.. -> w', state'.. with w' aliasing w and
    /// each state' its state ([`UpdateRule::state_names`]: none, v, or m and v).
    /// SGD, PyTorch semantics: g' = g + wd*w; v = momentum*v + g'; step = nesterov ? g' + momentum*v
    /// : v; w -= lr*step. Momentum 0: w -= lr*g' (no state).
    /// Adam: t = the runtime's 1-based step counter. decoupled (AdamW): w -= lr*wd*w first; else
    /// g += wd*w. m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; mh = m/(1-b1^t); vh = v/(1-b2^t);
    /// w -= lr * mh / (sqrt(vh) + eps)
    Update { rule: UpdateRule },

    // ---- in place (made by the `inplace_elementwise` pass: the written input dies there) ----
    /// x -> x = f(x) (x is `InOut`: one buffer).
    UnaryInPlace(UnaryKind),
    /// a, b -> a = a + b (a is `InOut`). Also the in-place gradient accumulation.
    AddInPlace,
    /// x -> x = x * keep / (1-p), the mask of `Dropout`.
    DropoutInPlace { p: f32, salt: u64 },
    /// saved, dy -> dy = f'(saved) * dy (dy is `InOut`); `saved` as for `UnaryBwd`.
    UnaryBwdInPlace(UnaryKind),
    /// dy -> dy = dy * keep / (1-p).
    DropoutBwdInPlace { p: f32, salt: u64 },

    // ---- weight gradient fused with the optimizer update (the `fuse_weight_update` pass) ----
    /// x[N,H,W,Ci], dy[N,Ho,Wo,Co], w[kh,kw,Ci,Co] (InOut), state.. (InOut) -> w', state'..
    /// For each block of `chunk` output channels (columns of the [K, Co] weight matrix,
    /// K = kh*kw*Ci): the gradient of that block into the workspace `gw` [K x chunk], then the
    /// update `rule` on that block of w and its state. Workspaces: `gw` (K*chunk), `cols` (as for
    /// `Conv2d`). No whole-layer gradient is ever held.
    Conv2dBwdWeightUpdate {
        geom: ConvGeom,
        rule: UpdateRule,
        chunk: usize,
    },
    /// x[N,K], dy[N,M], w[K,M] (InOut), state.. (InOut) -> w', state'..; gradient in blocks of
    /// `chunk` columns into the workspace `gw` [K x chunk], each block updated at once.
    DenseBwdWeightUpdate { rule: UpdateRule, chunk: usize },
    /// dy[.., C], b[C] (InOut), state.. (InOut) -> b', state'..; db (workspace [C]) = sum dy, then
    /// the update.
    BiasGradUpdate { rule: UpdateRule },
}

impl UpdateRule {
    /// The rule of an unfused update op (`None` for any other op).
    pub fn of(op: &Op) -> Option<UpdateRule> {
        match op {
            Op::Update { rule } => Some(*rule),
            _ => None,
        }
    }
}

/// How a kernel uses one of its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    In,
    Out,
    /// Read and overwritten in place (optimizer updates).
    InOut,
    /// Scratch, dead after the kernel.
    Workspace,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SigParam {
    pub name: String,
    pub role: Role,
    pub dtype: DType,
}

/// The one description of a kernel's arguments: the CPU backend binds buffers in this order, and the
/// CUDA backend derives both the generated parameter list and the launch arguments from it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Signature {
    pub params: Vec<SigParam>,
}

/// One parameter of a kernel signature as [`Op::params`] describes it: name, role, dtype (the
/// [`SigParam`] of the plan, without allocating its name).
pub type ParamKind = (&'static str, Role, DType);

fn p(name: &'static str, role: Role, dtype: DType) -> ParamKind {
    (name, role, dtype)
}

impl Op {
    /// Leaves have no kernel: their buffers are filled by the runtime.
    pub fn is_leaf(&self) -> bool {
        matches!(
            self,
            Op::Input { .. } | Op::Param { .. } | Op::OptState { .. }
        )
    }

    /// Outputs that must be written into the buffer of an input (`(output, input)` pairs):
    /// the optimizer updates, and `Reshape`, which is a view.
    pub fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        match self {
            Op::Reshape => vec![(0, 0)],
            Op::Update { rule } => (0..=rule.state_names().len())
                .map(|o| (o, if o == 0 { 0 } else { o + 1 }))
                .collect(),
            Op::UnaryInPlace(_)
            | Op::AddInPlace
            | Op::DropoutInPlace { .. }
            | Op::DropoutBwdInPlace { .. } => vec![(0, 0)],
            Op::UnaryBwdInPlace(_) => vec![(0, 1)],
            Op::Conv2dBwdWeightUpdate { rule, .. } | Op::DenseBwdWeightUpdate { rule, .. } => {
                (0..=rule.state_names().len()).map(|o| (o, o + 2)).collect()
            }
            Op::BiasGradUpdate { rule } => {
                (0..=rule.state_names().len()).map(|o| (o, o + 1)).collect()
            }
            _ => vec![],
        }
    }

    /// The kernel signature: inputs in node-input order (`In`, or `InOut` when an output aliases
    /// them), then the outputs that have their own buffer (`Out`), then the workspace, if any.
    /// Leaves and `Reshape` have no kernel and an empty signature.
    pub fn signature(&self) -> Signature {
        Signature {
            params: self
                .params()
                .into_iter()
                .map(|(name, role, dtype)| SigParam {
                    name: name.to_string(),
                    role,
                    dtype,
                })
                .collect(),
        }
    }

    /// The parameters of [`Op::signature`] (the one table of them), for the callers that only
    /// need roles and dtypes: the arity checks of every node, many times per compilation.
    pub fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        let params = match self {
            Op::Input { .. } | Op::Param { .. } | Op::OptState { .. } | Op::Reshape => vec![],
            Op::Conv2d { bias, .. } => {
                let mut v = vec![p("x", In, F32), p("w", In, F32)];
                if *bias {
                    v.push(p("b", In, F32));
                }
                v.push(p("y", Out, F32));
                v.push(p("cols", Workspace, F32));
                v
            }
            Op::Dense { bias } => {
                let mut v = vec![p("x", In, F32), p("w", In, F32)];
                if *bias {
                    v.push(p("b", In, F32));
                }
                v.push(p("y", Out, F32));
                v
            }
            Op::MaxPool { .. } => vec![p("x", In, F32), p("y", Out, F32), p("argmax", Out, U8)],
            Op::AvgPool { .. } | Op::GlobalAvgPool | Op::Unary(_) | Op::Dropout { .. } => {
                vec![p("x", In, F32), p("y", Out, F32)]
            }
            Op::Add => vec![p("a", In, F32), p("b", In, F32), p("y", Out, F32)],
            Op::MseLoss => vec![
                p("pred", In, F32),
                p("target", In, F32),
                p("loss", Out, F32),
            ],
            Op::CrossEntropyLoss => {
                vec![
                    p("logits", In, F32),
                    p("labels", In, I32),
                    p("loss", Out, F32),
                ]
            }
            Op::Conv2dBwdData { .. } => vec![p("dy", In, F32), p("w", In, F32), p("dx", Out, F32)],
            Op::Conv2dBwdWeight { .. } => vec![
                p("x", In, F32),
                p("dy", In, F32),
                p("dw", Out, F32),
                p("cols", Workspace, F32),
            ],
            Op::BiasGrad => vec![p("dy", In, F32), p("db", Out, F32)],
            Op::DenseBwdData => vec![p("dy", In, F32), p("w", In, F32), p("dx", Out, F32)],
            Op::DenseBwdWeight => vec![p("x", In, F32), p("dy", In, F32), p("dw", Out, F32)],
            Op::MaxPoolBwd { .. } => vec![p("dy", In, F32), p("argmax", In, U8), p("dx", Out, F32)],
            Op::AvgPoolBwd { .. } | Op::GlobalAvgPoolBwd | Op::DropoutBwd { .. } => {
                vec![p("dy", In, F32), p("dx", Out, F32)]
            }
            Op::UnaryBwd(k) => {
                let saved = k.saved().param_name();
                vec![p(saved, In, F32), p("dy", In, F32), p("dx", Out, F32)]
            }
            Op::MseLossBwd => vec![
                p("pred", In, F32),
                p("target", In, F32),
                p("dpred", Out, F32),
            ],
            Op::CrossEntropyLossBwd => {
                vec![
                    p("logits", In, F32),
                    p("labels", In, I32),
                    p("dlogits", Out, F32),
                ]
            }
            Op::Update { rule } => {
                let mut v = vec![p("w", InOut, F32), p("g", In, F32)];
                v.extend(rule.state_names().iter().map(|s| p(s, InOut, F32)));
                v
            }
            Op::UnaryInPlace(_) | Op::DropoutInPlace { .. } => vec![p("x", InOut, F32)],
            Op::AddInPlace => vec![p("a", InOut, F32), p("b", In, F32)],
            Op::UnaryBwdInPlace(k) => {
                let saved = k.saved().param_name();
                vec![p(saved, In, F32), p("dy", InOut, F32)]
            }
            Op::DropoutBwdInPlace { .. } => vec![p("dy", InOut, F32)],
            Op::Conv2dBwdWeightUpdate { rule, .. } | Op::DenseBwdWeightUpdate { rule, .. } => {
                let mut v = vec![p("x", In, F32), p("dy", In, F32), p("w", InOut, F32)];
                v.extend(rule.state_names().iter().map(|s| p(s, InOut, F32)));
                v.push(p("gw", Workspace, F32));
                if matches!(self, Op::Conv2dBwdWeightUpdate { .. }) {
                    v.push(p("cols", Workspace, F32));
                }
                v
            }
            Op::BiasGradUpdate { rule } => {
                let mut v = vec![p("dy", In, F32), p("b", InOut, F32)];
                v.extend(rule.state_names().iter().map(|s| p(s, InOut, F32)));
                v.push(p("db", Workspace, F32));
                v
            }
        };
        params
    }

    /// Number of node inputs (= the `In`/`InOut` params of the signature, or 1 for `Reshape`).
    pub fn num_inputs(&self) -> usize {
        self.num_inputs_of(&self.params())
    }

    /// [`Op::num_inputs`], given the op's [`Op::params`] (for callers that already built them).
    pub fn num_inputs_of(&self, params: &[ParamKind]) -> usize {
        match self {
            Op::Reshape => 1,
            _ => params
                .iter()
                .filter(|(_, role, _)| matches!(role, Role::In | Role::InOut))
                .count(),
        }
    }

    /// Number of node outputs (`Out` + `InOut` params, or 1 for leaves and `Reshape`).
    pub fn num_outputs(&self) -> usize {
        self.num_outputs_of(&self.params())
    }

    /// [`Op::num_outputs`], given the op's [`Op::params`].
    pub fn num_outputs_of(&self, params: &[ParamKind]) -> usize {
        match self {
            Op::Input { .. } | Op::Param { .. } | Op::OptState { .. } | Op::Reshape => 1,
            _ => params
                .iter()
                .filter(|(_, role, _)| matches!(role, Role::Out | Role::InOut))
                .count(),
        }
    }

    /// Whether the op overwrites a parameter with its update (a root of the training step).
    pub fn is_update(&self) -> bool {
        matches!(
            self,
            Op::Update { .. }
                | Op::Conv2dBwdWeightUpdate { .. }
                | Op::DenseBwdWeightUpdate { .. }
                | Op::BiasGradUpdate { .. }
        )
    }

    /// Elements (f32) of each `Workspace` parameter of the signature, in order, given the full
    /// shapes of the other signature parameters (signature order, workspaces left out). Shared by
    /// the planner (workspace buffer sizes) and the backends (checking them).
    pub fn workspace_elems(&self, s: &[Vec<usize>]) -> Vec<usize> {
        let k_of =
            |geom: &ConvGeom, x: &[usize]| geom.kh * geom.kw * x.get(3).copied().unwrap_or(0);
        match self {
            Op::Conv2d { geom, bias } => {
                let yi = if *bias { 3 } else { 2 };
                match (s.first(), s.get(yi)) {
                    (Some(x), Some(y)) if x.len() == 4 && y.len() == 4 => {
                        vec![conv_workspace_elems(geom, x, y)]
                    }
                    _ => vec![0],
                }
            }
            Op::Conv2dBwdWeight { geom } => match (s.first(), s.get(1)) {
                (Some(x), Some(dy)) if x.len() == 4 && dy.len() == 4 => {
                    vec![conv_workspace_elems(geom, x, dy)]
                }
                _ => vec![0],
            },
            Op::Conv2dBwdWeightUpdate { geom, chunk, .. } => match (s.first(), s.get(1)) {
                (Some(x), Some(dy)) if x.len() == 4 && dy.len() == 4 => {
                    vec![k_of(geom, x) * chunk, conv_workspace_elems(geom, x, dy)]
                }
                _ => vec![0, 0],
            },
            Op::DenseBwdWeightUpdate { chunk, .. } => {
                vec![s.get(2).and_then(|w| w.first()).copied().unwrap_or(0) * chunk]
            }
            Op::BiasGradUpdate { .. } => {
                vec![s.get(1).map(|b| b.iter().product()).unwrap_or(0)]
            }
            _ => vec![],
        }
    }

    /// Short kernel-style name, e.g. `conv2d`, `sgd_update`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Param { .. } => "param",
            Op::OptState { .. } => "opt_state",
            Op::Conv2d { .. } => "conv2d",
            Op::Dense { .. } => "dense",
            Op::MaxPool { .. } => "maxpool",
            Op::AvgPool { .. } => "avgpool",
            Op::GlobalAvgPool => "global_avgpool",
            Op::Reshape => "reshape",
            Op::Unary(k) => k.op_names().forward,
            Op::Add => "add",
            Op::Dropout { .. } => "dropout",
            Op::MseLoss => "mse_loss",
            Op::CrossEntropyLoss => "cross_entropy_loss",
            Op::Conv2dBwdData { .. } => "conv2d_bwd_data",
            Op::Conv2dBwdWeight { .. } => "conv2d_bwd_weight",
            Op::BiasGrad => "bias_grad",
            Op::DenseBwdData => "dense_bwd_data",
            Op::DenseBwdWeight => "dense_bwd_weight",
            Op::MaxPoolBwd { .. } => "maxpool_bwd",
            Op::AvgPoolBwd { .. } => "avgpool_bwd",
            Op::GlobalAvgPoolBwd => "global_avgpool_bwd",
            Op::UnaryBwd(k) => k.op_names().backward,
            Op::DropoutBwd { .. } => "dropout_bwd",
            Op::MseLossBwd => "mse_loss_bwd",
            Op::CrossEntropyLossBwd => "cross_entropy_loss_bwd",
            Op::Update { rule } => rule.op_name(),
            Op::UnaryInPlace(k) => k.op_names().forward_inplace,
            Op::AddInPlace => "add_inplace",
            Op::DropoutInPlace { .. } => "dropout_inplace",
            Op::UnaryBwdInPlace(k) => k.op_names().backward_inplace,
            Op::DropoutBwdInPlace { .. } => "dropout_bwd_inplace",
            Op::Conv2dBwdWeightUpdate { .. } => "conv2d_bwd_weight_update",
            Op::DenseBwdWeightUpdate { .. } => "dense_bwd_weight_update",
            Op::BiasGradUpdate { .. } => "bias_grad_update",
        }
    }
}

/// Rows of im2col processed per chunk by convolution kernels: the workspace holds
/// `CONV_CHUNK_ROWS x (kh*kw*Ci)` f32 (or fewer rows when the whole problem is smaller).
pub const CONV_CHUNK_ROWS: usize = 256;

/// Workspace elements (f32) a convolution kernel needs, given x's full shape [N,H,W,Ci] and the
/// output's [N,Ho,Wo,Co]. Shared by the planner (size of the workspace buffer) and the backends.
pub fn conv_workspace_elems(geom: &ConvGeom, x_shape: &[usize], y_shape: &[usize]) -> usize {
    let rows = y_shape[0] * y_shape[1] * y_shape[2];
    let k = geom.kh * geom.kw * x_shape[3];
    rows.min(CONV_CHUNK_ROWS) * k
}
