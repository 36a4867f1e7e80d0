//! The closed set of operations of the IR. Every IR node after autodiff is one kernel launch; the
//! same `Op` value travels in the execution plan, and every backend matches on it exhaustively.
//!
//! Shapes below are *full* shapes, batch first (NHWC for images). All tensors are f32 unless
//! stated otherwise. Argument order in the comments is the order of the node's inputs and of the
//! kernel signature ([`Op::signature`]).

mod conv;
mod dense;
mod elementwise;
mod epilogue;
mod facts;
mod loss;
mod norm;
mod optim;
mod pool;
mod seq;
pub mod shape;
pub mod split;
mod transfer;

use serde::{Deserialize, Serialize};

pub use facts::{
    fmt_types, ConvGeom, DType, OpFacts, ParamKind, PoolGeom, Role, ShapeError, SigParam,
    Signature, TensorType,
};

pub use conv::{bwd_data_tile_rows, conv_workspace_elems, ConvOp, BWD_DATA_TILE, CONV_CHUNK_ROWS};
pub use dense::DenseOp;
pub use elementwise::ElementwiseOp;
pub use epilogue::{Epilogue, EpilogueSide};
pub use loss::LossOp;
pub use norm::{NormOp, BN_SUM_BLOCK};
pub use optim::{bias_chunks, OptimOp, BIAS_CHUNK_ROWS};
pub use pool::{PoolOp, MAX_ARGMAX_WINDOW};
pub use seq::{attention_dims, attention_pairs, SeqOp, ATTN_TILE};
use shape::{err, need_hint, numel};
pub use transfer::TransferOp;

pub use crate::unary::UnaryKind;
/// The optimizer a program names: the update rule of its update ops (the language's name for it).
pub use crate::update::UpdateRule as Optimizer;
pub use crate::update::UpdateRule;

/// The closed set of operations. Leaves and `Reshape` have no kernel; every other op belongs to
/// one family, whose enum lists its ops and whose [`OpFacts`] give their facts (signature,
/// aliasing, workspaces, kernel name, shape rule, FLOPs) in one file each: `conv.rs`, `dense.rs`,
/// `pool.rs`, `elementwise.rs`, `loss.rs`, `optim.rs`. Code generation and the CPU backend are
/// organised by the same families.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    // ---- leaves (no kernel: their buffers are filled by the runtime) ----
    /// A batch input or target, fed by the runtime before each step.
    Input { name: String },
    /// A trainable parameter; persistent across steps.
    Param { name: String },
    /// Optimizer state (velocity, Adam moments); persistent, zero-initialised.
    OptState { name: String },
    /// Persistent state that is not trained (batchnorm's running mean and variance): saved and
    /// loaded with the weights, written by an update op, never given a gradient or optimizer state.
    RunStat { name: String },
    /// A parameter's accumulated gradient (`train { accumulate: N }`): persistent across the
    /// micro-batches of an optimizer step, zero-initialised, added to by `GradAccum` and read (then
    /// zeroed) by the parameter's update.
    GradBuf { name: String },
    /// Same elements, another shape: no kernel, the output aliases the input's buffer.
    Reshape,

    // ---- kernels, by family ----
    /// 2-D convolutions: forward, both gradients, the weight gradient fused with its update.
    Conv(ConvOp),
    /// Matrix products of dense layers: forward, both gradients, the fused weight update.
    Dense(DenseOp),
    /// Pooling windows and their backward.
    Pool(PoolOp),
    /// Elementwise maps (activations, add, dropout), out of place and in place, and backward.
    Elementwise(ElementwiseOp),
    /// Losses and their gradients.
    Loss(LossOp),
    /// The optimizer's update and the bias gradient (alone or fused with its update).
    Optim(OptimOp),
    /// Normalisation (batchnorm), its running statistics' update and its backward.
    Norm(NormOp),
    /// Token and position embeddings and fused attention (transformers).
    Seq(SeqOp),
    /// Copies between the host store and the arena (streamed parameters and optimizer state,
    /// offloaded activations):
    /// plan steps only, never IR nodes; no CUDA kernel (the CUDA backend copies asynchronously).
    Transfer(TransferOp),
}
impl UpdateRule {
    /// The rule of an unfused update op (`None` for any other op).
    pub fn of(op: &Op) -> Option<UpdateRule> {
        match op {
            Op::Optim(OptimOp::Update { rule, .. }) => Some(*rule),
            _ => None,
        }
    }
}
impl Op {
    /// The ranks among which this op's optimizer state is sharded (data parallel,
    /// [`crate::shard`]); 1 for every op that is not a sharded update.
    pub fn shards(&self) -> usize {
        match self {
            Op::Optim(
                OptimOp::Update { shards, .. }
                | OptimOp::BiasGradUpdate { shards, .. }
                | OptimOp::GradAllReduce { shards },
            )
            | Op::Dense(DenseOp::DenseBwdWeightUpdate { shards, .. })
            | Op::Conv(ConvOp::Conv2dBwdWeightUpdate { shards, .. }) => *shards,
            Op::Optim(OptimOp::GatherShard { layout } | OptimOp::KeepShard { layout }) => {
                layout.world
            }
            _ => 1,
        }
    }

    /// Whether this sharded update keeps only this rank's rows of what it updates (sharded
    /// parameters: a window of which `KeepShard` keeps those rows), gathering no other rank's.
    pub fn keeps_rows(&self) -> bool {
        match self {
            Op::Optim(
                OptimOp::Update { keep_rows, .. } | OptimOp::BiasGradUpdate { keep_rows, .. },
            )
            | Op::Dense(DenseOp::DenseBwdWeightUpdate { keep_rows, .. })
            | Op::Conv(ConvOp::Conv2dBwdWeightUpdate { keep_rows, .. }) => *keep_rows,
            _ => false,
        }
    }

    /// The family facts of a kernel op; `None` for leaves and `Reshape`, which have no kernel.
    pub fn facts(&self) -> Option<&dyn OpFacts> {
        match self {
            Op::Input { .. }
            | Op::Param { .. }
            | Op::OptState { .. }
            | Op::RunStat { .. }
            | Op::GradBuf { .. }
            | Op::Reshape => None,
            Op::Conv(o) => Some(o),
            Op::Dense(o) => Some(o),
            Op::Pool(o) => Some(o),
            Op::Elementwise(o) => Some(o),
            Op::Loss(o) => Some(o),
            Op::Optim(o) => Some(o),
            Op::Norm(o) => Some(o),
            Op::Seq(o) => Some(o),
            Op::Transfer(o) => Some(o),
        }
    }

    /// Leaves have no kernel: their buffers are filled by the runtime.
    pub fn is_leaf(&self) -> bool {
        matches!(
            self,
            Op::Input { .. }
                | Op::Param { .. }
                | Op::OptState { .. }
                | Op::RunStat { .. }
                | Op::GradBuf { .. }
        )
    }

    /// Outputs that must be written into the buffer of an input (`(output, input)` pairs):
    /// the in-place ops, the optimizer updates, and `Reshape`, which is a view.
    pub fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        match (self, self.facts()) {
            (Op::Reshape, _) => vec![(0, 0)],
            (_, Some(f)) => f.aliased_outputs(),
            (_, None) => vec![],
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
        self.facts().map(|f| f.params()).unwrap_or_default()
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
            Op::Input { .. }
            | Op::Param { .. }
            | Op::OptState { .. }
            | Op::RunStat { .. }
            | Op::GradBuf { .. }
            | Op::Reshape => 1,
            _ => params
                .iter()
                .filter(|(_, role, _)| matches!(role, Role::Out | Role::InOut))
                .count(),
        }
    }

    /// Whether the op overwrites persistent state (a parameter with its update, the running
    /// statistics, the norm pass's stored norm): a root of the training step.
    pub fn is_update(&self) -> bool {
        matches!(
            self,
            Op::Optim(
                OptimOp::Update { .. } | OptimOp::BiasGradUpdate { .. } | OptimOp::GradNormStore
            ) | Op::Norm(NormOp::BatchNormStats { .. })
                | Op::Conv(ConvOp::Conv2dBwdWeightUpdate { .. })
                | Op::Dense(DenseOp::DenseBwdWeightUpdate { .. })
        )
    }

    /// Elements (f32) of each `Workspace` parameter of the signature, in order, given the full
    /// shapes of the other signature parameters (signature order, workspaces left out). Shared by
    /// the planner (workspace buffer sizes) and the backends (checking them).
    pub fn workspace_elems(&self, s: &[Vec<usize>]) -> Vec<usize> {
        self.facts()
            .map(|f| f.workspace_elems(s))
            .unwrap_or_default()
    }

    /// [`Op::workspace_elems`] without a GPU split-K's room ([`OpFacts::workspace_elems_unsplit`]).
    pub fn workspace_elems_unsplit(&self, s: &[Vec<usize>]) -> Vec<usize> {
        self.facts()
            .map(|f| f.workspace_elems_unsplit(s))
            .unwrap_or_default()
    }

    /// Short kernel-style name, e.g. `conv2d`, `sgd_update`.
    pub fn kind_name(&self) -> &'static str {
        match (self, self.facts()) {
            (Op::Input { .. }, _) => "input",
            (Op::Param { .. }, _) => "param",
            (Op::OptState { .. }, _) => "opt_state",
            (Op::RunStat { .. }, _) => "run_stat",
            (Op::GradBuf { .. }, _) => "grad_buf",
            (Op::Reshape, _) => "reshape",
            (_, Some(f)) => f.kind_name(),
            (_, None) => "none",
        }
    }

    /// FLOPs of one launch, given the full shapes of the node's inputs (slot order) and outputs;
    /// 0 for leaves and views.
    pub fn flops(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> u64 {
        self.facts().map(|f| f.flops(ins, outs)).unwrap_or(0)
    }

    /// Output types of the op applied to values of types `inputs`: the one shape rule, used by
    /// the compiler's IR and, through [`Op::check_args`], by every backend's plan check.
    ///
    /// `hint` is the expected type of output 0. Most ops ignore it; it is required by the ops whose
    /// output shape is not a function of their inputs (leaves, `Reshape`, the pooling/conv
    /// backward-data ops, whose input extent is lost by the floor division, and the convolution,
    /// whose bottom padding is implicit) — for those, the hint is checked for consistency with the
    /// inputs and returned.
    pub fn infer_outputs(
        &self,
        inputs: &[TensorType],
        hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError> {
        self.infer_outputs_with(&self.params(), inputs, hint)
    }

    /// [`Op::infer_outputs`], given the op's signature parameters [`Op::params`] (for the
    /// compiler's verifier, which builds them once per node for the arity checks too).
    pub fn infer_outputs_with(
        &self,
        params: &[ParamKind],
        inputs: &[TensorType],
        hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError> {
        let Some(facts) = self.facts() else {
            if matches!(self, Op::Reshape) {
                if inputs.len() != 1 {
                    return err(format!("expects 1 input, got {}", inputs.len()));
                }
                let h = need_hint(hint, self.kind_name())?;
                if h.numel() != inputs[0].numel() || h.dtype != inputs[0].dtype {
                    return err(format!("cannot reshape {} to {h}", inputs[0]));
                }
                return Ok(vec![h.clone()]);
            }
            if !inputs.is_empty() {
                return err("a leaf has no inputs");
            }
            return Ok(vec![need_hint(hint, self.kind_name())?.clone()]);
        };
        // Arity and dtypes from the signature (the single source of truth for both).
        // (An iterator, not a vector: this runs for every node a pass adds.)
        let ins = params
            .iter()
            .filter(|(_, role, _)| matches!(role, Role::In | Role::InOut));
        let nins = ins.clone().count();
        if nins != inputs.len() {
            return err(format!("expects {nins} inputs, got {}", inputs.len()));
        }
        for ((name, _, dtype), t) in ins.zip(inputs) {
            if *dtype != t.dtype {
                return err(format!("input `{name}` must be {dtype:?}, got {t}"));
            }
        }
        facts.infer(inputs, hint)
    }

    /// The runtime's shape check of one kernel of a plan: `shapes` holds one shape per signature
    /// parameter (signature order). The outputs must be what [`Op::infer_outputs`] gives for the
    /// inputs (output 0 as the hint), and each workspace at least [`Op::workspace_elems`].
    /// Leaves and `Reshape` (no kernel) pass.
    pub fn check_args(&self, shapes: &[Vec<usize>]) -> Result<(), ShapeError> {
        if self.facts().is_none() {
            return Ok(());
        }
        let params = self.params();
        if shapes.len() != params.len() {
            return err(format!(
                "{} argument shapes for {} signature parameters",
                shapes.len(),
                params.len()
            ));
        }
        let mut inputs = vec![];
        let mut outputs = vec![];
        let mut first_ws = params.len();
        for (i, ((_, role, dtype), s)) in params.iter().zip(shapes).enumerate() {
            let t = TensorType::new(s.clone(), *dtype);
            match role {
                Role::In => inputs.push(t),
                Role::InOut => {
                    inputs.push(t.clone());
                    outputs.push(t);
                }
                Role::Out => outputs.push(t),
                Role::Workspace => first_ws = first_ws.min(i),
            }
        }
        let inferred = self.infer_outputs_with(&params, &inputs, outputs.first())?;
        if inferred != outputs {
            return err(format!(
                "outputs {}, but the inputs {} give {}",
                fmt_types(&outputs),
                fmt_types(&inputs),
                fmt_types(&inferred)
            ));
        }
        // at least what the CPU needs: a plan fitted to a tight cap leaves out the GPU split-K's
        // room (its GEMMs then run unsplit)
        let need = self.workspace_elems_unsplit(&shapes[..first_ws]);
        if shapes.len() - first_ws != need.len() {
            return err(format!(
                "{} workspaces, expected {}",
                shapes.len() - first_ws,
                need.len()
            ));
        }
        for (s, n) in shapes[first_ws..].iter().zip(&need) {
            if (numel(s) as usize) < *n {
                return err(format!("workspace {s:?} < {n} elements"));
            }
        }
        Ok(())
    }
}
