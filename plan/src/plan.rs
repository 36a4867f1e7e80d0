//! The execution plan: plain serde data, the only contract between the compiler and the runtime.
//! Every backend executes the same plan: one arena of `arena_bytes`, every buffer at its offset,
//! the steps in order.

use serde::{Deserialize, Serialize};

use crate::op::{DType, Op, Role, Signature};
use crate::schedule::LrSchedule;
use crate::update::UpdateRule;
pub use crate::update::{LearningRate, UpdateRule as Optimizer};

pub type BufferId = usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BufferKind {
    Parameter,
    OptimizerState,
    /// Persistent state that is not trained: batchnorm's running mean and variance.
    RunningStat,
    /// Batch inputs and targets.
    Input,
    /// Forward values (saved for backward or transient), including the loss.
    Activation,
    /// Gradients in flight.
    Gradient,
    /// Accumulated gradients (`train { accumulate: N }`): one per parameter, persistent across
    /// the micro-batches of an optimizer step, zero-initialised and zeroed by each update.
    GradAccum,
    /// Kernel scratch, live only during its kernel.
    Workspace,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub id: BufferId,
    pub name: String,
    pub bytes: u64,
    pub dtype: DType,
    pub kind: BufferKind,
    /// Byte offset in the arena (aligned to [`ALIGN`]).
    pub offset: u64,
    /// Inclusive range of step indices during which the buffer holds a value that is still needed
    /// (first write .. last read). Persistent buffers (parameters, optimizer state) span the whole
    /// step: `(0, steps.len()-1)` and beyond, across steps.
    pub live: (usize, usize),
    pub persistent: bool,
    /// The model layer the buffer belongs to: the layer part of its IR node's name ([`layer_of`]),
    /// e.g. `conv2d_3` for `conv2d_3`, `conv2d_3.weight`, `grad conv2d_3.weight`,
    /// `conv2d_3 workspace`; an input's own name. Empty in plans written before it existed.
    #[serde(default)]
    pub layer: String,
    /// Where the buffer's bytes are: in the arena (every buffer but streamed tensors' homes) or in
    /// the host store ([`Store::Host`]: `offset` is then in the host store of
    /// [`Plan::host_bytes`]). Absent from the JSON when in the arena.
    #[serde(default, skip_serializing_if = "Store::is_arena")]
    pub store: Store,
}

/// Which memory a [`Buffer`] lives in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Store {
    /// The arena (device memory on a GPU): what the cap bounds.
    #[default]
    Arena,
    /// The host store (pinned host memory on a GPU, a second allocation on the CPU): the home of
    /// a streamed parameter or optimizer state tensor (persistent) or of an offloaded activation
    /// (transient: written back after its forward, copied in for its backward), touched only by
    /// the [`TransferOp`](crate::op::TransferOp) steps that copy it into and out of its windows.
    Host,
}

impl Store {
    pub fn is_arena(&self) -> bool {
        *self == Store::Arena
    }
}

/// The layer part of an IR node or buffer name: without a leading `grad `, up to the first space
/// or `.` (`grad conv2d_3.weight (sum)` -> `conv2d_3`).
pub fn layer_of(name: &str) -> &str {
    let s = name.strip_prefix("grad ").unwrap_or(name);
    let end = s.find([' ', '.']).unwrap_or(s.len());
    &s[..end]
}

/// Alignment of every buffer offset in the arena, in bytes.
pub const ALIGN: u64 = 64;

/// How a parameter is initialised (seeded, by the runtime). `fan_in` / `fan_out` are PyTorch's
/// (a weight's inputs / outputs times its receptive field); a bias gets its weight's fans. The
/// normal ones are untruncated (PyTorch's `kaiming_normal_` / `xavier_normal_`); Keras draws the
/// same variance from a normal truncated at 2 standard deviations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Init {
    /// He (Kaiming) uniform: U(-sqrt(6/fan_in), sqrt(6/fan_in)); used for weights followed by ReLU.
    HeUniform {
        fan_in: usize,
    },
    /// Glorot (Xavier) uniform, Keras' default: U(-sqrt(6/(fan_in+fan_out)), ..).
    GlorotUniform {
        fan_in: usize,
        fan_out: usize,
    },
    Zeros,
    /// All ones (batchnorm's scale and running variance, as PyTorch initialises them).
    Ones,
    /// He (Kaiming) normal: N(0, 2/fan_in).
    HeNormal {
        fan_in: usize,
    },
    /// Glorot (Xavier) normal: N(0, 2/(fan_in+fan_out)).
    GlorotNormal {
        fan_in: usize,
        fan_out: usize,
    },
    /// LeCun uniform: U(-sqrt(3/fan_in), sqrt(3/fan_in)).
    LecunUniform {
        fan_in: usize,
    },
    /// LeCun normal: N(0, 1/fan_in).
    LecunNormal {
        fan_in: usize,
    },
    /// PyTorch's default of `Linear` / `Conv2d` / `ConvTranspose2d`, weight and bias alike:
    /// `kaiming_uniform_(a = sqrt(5))`, i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    TorchDefault {
        fan_in: usize,
    },
    /// N(0, std^2).
    Normal {
        std: f32,
    },
    /// U(-limit, limit).
    Uniform {
        limit: f32,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamBinding {
    /// e.g. `conv3.weight`
    pub name: String,
    pub buffer: BufferId,
    pub shape: Vec<usize>,
    pub init: Init,
    /// An optimizer state of a data-parallel plan: how it is split among the ranks. The buffer
    /// holds this rank's rows ([`crate::shard::Layout::elems_of`] of the full `shape`, at the
    /// start of a buffer of [`crate::shard::Layout::shard_elems`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::shard::Layout>,
}

impl ParamBinding {
    /// The shape of what the buffer holds: `shape`, or this rank's shard of it flat
    /// (`[shard_elems]`) for a sharded optimizer state.
    pub fn buffer_shape(&self) -> Vec<usize> {
        match self.shard {
            Some(l) => vec![l.shard_elems()],
            None => self.shape.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoBinding {
    /// The program's input/target name.
    pub name: String,
    pub buffer: BufferId,
    /// Full shape including the batch.
    pub shape: Vec<usize>,
    pub dtype: DType,
}

/// A kernel: what it computes, the shapes of its arguments (signature order), its signature.
/// Identical kernels (same op, same shapes) are listed once and launched by several steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    pub id: usize,
    /// e.g. `conv2d_0`
    pub name: String,
    pub op: Op,
    /// One shape per signature parameter, in signature order.
    pub arg_shapes: Vec<Vec<usize>>,
    pub signature: Signature,
}

impl Kernel {
    /// FLOPs of one launch (every step of the kernel costs this): the op's own fact
    /// ([`Op::flops`]) on its argument shapes, `In` and `InOut` as inputs, `Out` and `InOut` as
    /// outputs.
    pub fn flops(&self) -> u64 {
        let (ins, outs) = self.ins_outs();
        self.op.flops(&ins, &outs)
    }

    /// What one launch does on the CPU backend: the op's own fact
    /// ([`OpFacts::cpu_work`](crate::op::OpFacts::cpu_work)) on its argument shapes, as
    /// [`Kernel::flops`]; nothing for an op without a kernel.
    pub fn cpu_work(&self) -> crate::cpu::CpuWork {
        let (ins, outs) = self.ins_outs();
        self.op
            .facts()
            .map(|f| f.cpu_work(&ins, &outs))
            .unwrap_or_default()
    }

    /// The argument shapes as the op's inputs (`In`, `InOut`) and outputs (`Out`, `InOut`).
    fn ins_outs(&self) -> (Vec<Vec<usize>>, Vec<Vec<usize>>) {
        let mut ins = vec![];
        let mut outs = vec![];
        for (p, shape) in self.signature.params.iter().zip(&self.arg_shapes) {
            match p.role {
                Role::In => ins.push(shape.clone()),
                Role::InOut => {
                    ins.push(shape.clone());
                    outs.push(shape.clone());
                }
                Role::Out => outs.push(shape.clone()),
                Role::Workspace => {}
            }
        }
        (ins, outs)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub kernel: usize,
    /// One buffer per signature parameter, in signature order.
    pub args: Vec<BufferId>,
    /// What this step is for, e.g. `conv3 forward`, `conv3.weight update`.
    pub label: String,
    /// The part of the training step it belongs to (its IR node's phase). `Forward` in plans
    /// written before it existed.
    #[serde(default)]
    pub phase: StepPhase,
    /// A copy step's ([`TransferOp`](crate::op::TransferOp)) completion point: the index of the
    /// first step that may depend on the copy having landed (the steps count; `steps.len()` =
    /// the end of the run). A backend may run the copy asynchronously from this step on, but it
    /// must have completed before step `ready` starts: a host-to-device copy before the first
    /// read of its window, a write-back before its window's bytes are reused (the window is live
    /// through `ready - 1`). Absent for kernel steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<usize>,
}

/// Which part of the training step a [`Step`] belongs to.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub enum StepPhase {
    #[default]
    Forward,
    Loss,
    Backward,
    Update,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Forward, loss, backward, optimizer update.
    Train,
    /// Forward and loss only (dropout is the identity).
    Eval,
    /// Forward to the output only: no targets, no loss kernel (dropout is the identity).
    /// `Plan::loss` then names a never-written placeholder `f32[1]` buffer.
    Predict,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub format_version: u32,
    pub mode: Mode,
    pub batch: usize,
    pub arena_bytes: u64,
    /// Bytes of the host store: the homes of the streamed parameters and optimizer state and of
    /// the offloaded activations ([`Store::Host`]), outside the arena and the cap. 0 (absent) when everything is resident.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_bytes: u64,
    pub buffers: Vec<Buffer>,
    pub kernels: Vec<Kernel>,
    pub steps: Vec<Step>,
    pub inputs: Vec<IoBinding>,
    pub targets: Vec<IoBinding>,
    /// Everything saved and loaded with the weights, in model order (as PyTorch's `state_dict`):
    /// the trainable parameters ([`BufferKind::Parameter`]) and the running statistics
    /// ([`BufferKind::RunningStat`], e.g. `bn_1.running_mean`), which no optimizer updates.
    pub params: Vec<ParamBinding>,
    /// Optimizer state buffers (zero-initialised), with names like `conv3.weight.momentum`.
    pub opt_state: Vec<ParamBinding>,
    /// The scalar loss buffer (f32\[1\]).
    pub loss: BufferId,
    /// The network's output (the loss' prediction), for `predict`.
    pub output: IoBinding,
    pub optimizer: UpdateRule,
    /// The learning rate of each step (from the optimizer's `lr`): the runtime passes each step's
    /// rate to the update kernels, none of which bakes one in.
    #[serde(default)]
    pub schedule: LrSchedule,
    /// Gradient accumulation (`train { accumulate: N }`): one optimizer step per `accumulate`
    /// runs of the plan on micro-batches of `batch` samples. Every run accumulates the gradients
    /// into the `GradAccum` buffers; only the last run of an optimizer step runs the steps that
    /// [`Plan::is_optimizer_update`] names (see `Backend::set_run_pass`). 1: no accumulation.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub accumulate: usize,
    /// Data parallel ([`crate::shard`]): the number of ranks (processes) that run this same plan,
    /// each on `batch` samples of a global batch of `ranks * batch`. Each rank holds its shard of
    /// every optimizer state (the bindings' [`ParamBinding::shard`]); the sharded updates sum the
    /// ranks' gradients and gather the updated weights ([`crate::op::Op::shards`]), and the runtime
    /// sums the ranks' losses (each already weighted by 1/ranks) right after the step that
    /// writes the loss, before the non-finite-loss check, so every rank sees the global loss and
    /// halts at the same step. 1: one process.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub ranks: usize,
    /// The GEMMs' arithmetic on a GPU (`train { precision: tf32 }`): fp32 FMAs (the default,
    /// PyTorch's fp32 parity), or TF32 tensor cores on sm_80+ (inputs rounded to 10 mantissa
    /// bits, fp32 accumulation). The CPU backend computes in fp32 either way. Absent when fp32.
    #[serde(default, skip_serializing_if = "Precision::is_fp32")]
    pub precision: Precision,
    /// How `clip_norm` is implemented and what it costs (absent without `clip_norm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_norm: Option<ClipNormPlan>,
    /// The liveness lower bound: max over steps of the (aligned) bytes live at that step; no
    /// placement of these buffers can use a smaller arena.
    #[serde(default)]
    pub lower_bound_bytes: u64,
    /// How the offsets were found: `trivial` or the winning best-fit strategy
    /// (see `placement::VARIANTS`).
    #[serde(default)]
    pub placement_strategy: String,
}

/// How the plan clips the gradients to a global L2 norm (`train { clip_norm: m }`), and the
/// cost of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClipNormPlan {
    pub max_norm: f32,
    pub method: ClipNormMethod,
    /// Bytes the method adds to the arena (the held gradients and the norm).
    pub extra_bytes: u64,
    /// FLOPs per optimizer step it adds (the squared norm, the scaling).
    pub extra_flops: u64,
    /// Extra forward + backward passes per optimizer step (0 with held gradients, 1 with the
    /// norm pass).
    pub extra_passes: u32,
}

/// The strategies of `clip_norm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClipNormMethod {
    /// Every gradient held (in its `GradAccum` buffer, unfused) until the squared norm of all of
    /// them is summed (`GradSqNorm` kernels); then the updates scale by it.
    HeldGradients,
    /// Two runs of the plan per optimizer step, on the same batch ([`RunPass::Norm`] then
    /// [`RunPass::Update`]): the first computes the gradients only to sum their squared norm
    /// (`GradSqNorm`) and stores it in the persistent `clip_norm.sq_norm` buffer
    /// (`GradNormStore`), skipping the updates; the second recomputes them (same dropout masks:
    /// same step counter and seed) and updates, scaled by the stored norm, skipping the norm and
    /// batchnorm's running statistics (so those are updated once). No gradient is held: each
    /// dies at its update, as without clipping. Chosen when the held gradients do not fit the
    /// cap. Needs `accumulate` 1 (accumulation holds the gradients anyway).
    NormPass,
}

/// Which steps of a plan one run executes ([`Plan::runs_step`]); the training loop sets it
/// (`Backend::set_run_pass`) before each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunPass {
    /// Every step: a whole training step (or the last micro-batch of an accumulated one).
    #[default]
    Whole,
    /// A micro-batch of `accumulate: N` but the last: it only accumulates its gradients
    /// (no update, no norm).
    Accumulate,
    /// The first run of a [`ClipNormMethod::NormPass`] step: everything but the updates.
    Norm,
    /// The second run of a [`ClipNormMethod::NormPass`] step: everything but the squared norm
    /// (its chain and store) and batchnorm's running statistics.
    Update,
}

/// The GEMMs' arithmetic on a GPU ([`Plan::precision`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// fp32 FMAs.
    #[default]
    Fp32,
    /// TF32 tensor cores (sm_80+), fp32 accumulation.
    Tf32,
}

impl Precision {
    pub fn is_fp32(&self) -> bool {
        *self == Precision::Fp32
    }
}

/// The version of plan.json's shape. 2: one `Update { rule }` op for the unfused optimizer updates
/// (was `SgdUpdate` / `AdamUpdate`). 3: ops grouped by family (`{"Optim":{"Update":..}}`,
/// `{"Conv":{"Conv2d":..}}`; see [`Op`]). 4: fused ops (`fuse_epilogues`): an
/// `epi` on the GEMMs, `bias`/`keep_old` on the fused weight updates, `in_place` on the conv data
/// gradient, `GlobalAvgPoolBwdAct`; each field absent when off, so unfused ops read as in 3.
/// 5: `CrossEntropyLoss { label_smoothing }` (was a unit variant), and the ops and rules added with
/// it (activations with a parameter, `Softmax`, the MAE / Huber / BCE losses, RMSprop and Lion).
/// 6: `ConvGeom` with a stride, padding and dilation per axis (and side) and `groups`; `PoolGeom`'s
/// `pad` (absent when 0); `GlobalMaxPool`.
/// Also `schedule` (the learning-rate schedule); kernels take the step's learning rate as an argument.
/// Also batchnorm (`Norm` ops, `RunStat` leaves, `BufferKind::RunningStat`, `Init::Ones`; running
/// statistics listed in `params` with the parameters).
/// Also the initialisers a layer may choose (`Init::HeNormal` .. `Init::Uniform`).
/// 7: gradient clipping and accumulation: the rules' `clip_value` and `clip_norm`, the plan's
/// `accumulate` and `clip_norm` (a [`ClipNormPlan`]), the `GradSqNorm` op, the
/// `GradBuf` leaves with `BufferKind::GradAccum`, the `GradAccum` op and the updates' `zero_grad`
/// (each absent when off, so plans without them read as in 6).
/// 8: `PoolGeom` with a window, stride and padding per axis (and side) and `ceil_mode` (was
/// `size`, `stride`, `pad`).
/// 9: a loss may be a weighted sum of terms: every loss op (`MseLoss`, ..) is a struct variant
/// with a `weight` (absent when 1: `{"MseLoss":{}}`, was the unit variant `"MseLoss"`); the step's
/// loss is the `Add` of the terms' losses.
/// 10: `ClipNormMethod::NormPass` and the `GradNormStore` op (plans without it read as in 9).
/// 11: `Conv2dBwdData` has a workspace (`partial`, a GPU split-K's partial sums), and the
/// convolutions' `cols` may be larger than im2col's rows ([`crate::op::split`]).
/// 12: a bias gradient is a two-level column sum (chunks of [`crate::op::BIAS_CHUNK_ROWS`] rows),
/// and a fused `Conv2dBwdWeightUpdate`'s `db` holds a split GPU kernel's chunk sums when the
/// split-K room is planned; the plan's `precision` (absent when fp32, so plans read as in 11).
/// 13: streaming: a buffer's `store` (absent in the arena), the plan's `host_bytes`, the
/// `Transfer` ops and a copy step's `ready` (each absent without streaming).
pub const FORMAT_VERSION: u32 = 13;

fn one() -> usize {
    1
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

impl Plan {
    /// Whether step `si` is an optimizer update (it consumes the gradient and changes the
    /// weights) or part of one (the squared global norm of `clip_norm`, of the accumulated
    /// gradient): with gradient accumulation, the steps run only once per optimizer step, after
    /// the last micro-batch. Batchnorm's running statistics are updated by every micro-batch
    /// (as PyTorch's, by every forward).
    pub fn is_optimizer_update(&self, si: usize) -> bool {
        matches!(self.step_role(si), Some(StepRole::Update | StepRole::Norm))
    }

    /// Whether a run in `pass` executes step `si` (see [`RunPass`]).
    pub fn runs_step(&self, si: usize, pass: RunPass) -> bool {
        let role = self.step_role(si);
        match pass {
            RunPass::Whole => true,
            RunPass::Accumulate => !matches!(role, Some(StepRole::Update | StepRole::Norm)),
            RunPass::Norm => role != Some(StepRole::Update),
            RunPass::Update => !matches!(role, Some(StepRole::Norm | StepRole::RunningStats)),
        }
    }

    /// Whether the passes a run is asked for suit this plan: a [`ClipNormMethod::NormPass`]
    /// plan runs only as a norm pass followed by an update pass (a whole run would update with
    /// the previous step's norm), and its passes mean nothing to other plans.
    pub fn check_run_pass(&self, pass: RunPass) -> Result<(), String> {
        let two_pass = matches!(
            &self.clip_norm,
            Some(ClipNormPlan {
                method: ClipNormMethod::NormPass,
                ..
            })
        );
        match (two_pass, pass) {
            (true, RunPass::Norm | RunPass::Update) | (false, RunPass::Whole) => Ok(()),
            (false, RunPass::Accumulate) if self.accumulate > 1 => Ok(()),
            (true, _) => Err(format!(
                "this plan clips the gradient norm in two passes (clip_norm {}): run each step as a norm pass, then an update pass (RunPass::Norm, RunPass::Update), not as a {pass:?} run",
                self.clip_norm.as_ref().map_or(0.0, |c| c.max_norm)
            )),
            (false, _) => Err(format!(
                "a {pass:?} run of a plan that {}",
                if self.accumulate > 1 {
                    "accumulates gradients (only Whole and Accumulate runs)"
                } else {
                    "neither accumulates nor clips in two passes (only Whole runs)"
                }
            )),
        }
    }

    fn step_role(&self, si: usize) -> Option<StepRole> {
        use crate::op::{ConvOp, DenseOp, NormOp, OptimOp};
        let k = self
            .steps
            .get(si)
            .and_then(|s| self.kernels.get(s.kernel))?;
        match k.op {
            Op::Optim(OptimOp::Update { .. } | OptimOp::BiasGradUpdate { .. })
            | Op::Conv(ConvOp::Conv2dBwdWeightUpdate { .. })
            | Op::Dense(DenseOp::DenseBwdWeightUpdate { .. }) => Some(StepRole::Update),
            // (a held gradient's sum over the ranks: before the norm, in the runs that take it)
            Op::Optim(
                OptimOp::GradSqNorm { .. } | OptimOp::GradNormStore | OptimOp::GradAllReduce { .. },
            ) => Some(StepRole::Norm),
            Op::Norm(NormOp::BatchNormStats { .. }) => Some(StepRole::RunningStats),
            _ => None,
        }
    }

    /// Whether the runtime reads buffer `id` after the last step: the output always, the loss
    /// except in predict plans (whose `loss` is a never-written placeholder).
    pub fn read_after_steps(&self, id: BufferId) -> bool {
        id == self.output.buffer || (id == self.loss && self.mode != Mode::Predict)
    }

    /// The inclusive range of steps during which the bytes of `b` must not be touched by another
    /// buffer: the one rule shared by the compiler's plan checker and the runtime's. Persistent
    /// buffers hold for ever; inputs from before the first step (`set_input` writes them); buffers
    /// the runtime reads after the last step ([`Plan::read_after_steps`]) to the end; every other
    /// buffer its declared `live` range.
    pub fn held(&self, b: &Buffer) -> (usize, usize) {
        if b.persistent || b.store == Store::Host {
            return (0, usize::MAX);
        }
        let start = if b.kind == BufferKind::Input {
            0
        } else {
            b.live.0
        };
        let end = if self.read_after_steps(b.id) {
            usize::MAX
        } else {
            b.live.1
        };
        (start, end)
    }
}

/// What a step does that some [`RunPass`]es skip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepRole {
    /// Changes the weights (and their optimizer state).
    Update,
    /// Part of `clip_norm`'s squared global norm.
    Norm,
    /// Updates batchnorm's running statistics.
    RunningStats,
}

/// What the copy steps of a plan move in one run (all zero without streaming).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferTotals {
    /// Bytes copied from the host store into windows.
    pub host_to_device: u64,
    /// Bytes written back from windows to the host store.
    pub device_to_host: u64,
    /// Copy steps.
    pub copies: usize,
    /// Bytes of the host store (the streamed tensors).
    pub host_store: u64,
    /// Of the parameters and optimizer state, the bytes that stay in the arena.
    pub resident: u64,
}

impl Plan {
    /// The copy of step `si`, if it is one.
    pub fn transfer_op(&self, si: usize) -> Option<crate::op::TransferOp> {
        let k = self.kernels.get(self.steps.get(si)?.kernel)?;
        match k.op {
            Op::Transfer(t) => Some(t),
            _ => None,
        }
    }

    /// Whether the plan streams anything (has a host store).
    pub fn streams(&self) -> bool {
        self.buffers.iter().any(|b| b.store == Store::Host)
    }

    /// What the copy steps move in one run, and how the persistent parameters and optimizer
    /// state split between the arena and the host store.
    pub fn transfer_totals(&self) -> TransferTotals {
        let mut t = TransferTotals {
            host_store: self.host_bytes,
            ..Default::default()
        };
        for (si, s) in self.steps.iter().enumerate() {
            let Some(op) = self.transfer_op(si) else {
                continue;
            };
            let bytes = s.args.first().map_or(0, |&b| self.buffers[b].bytes);
            t.copies += 1;
            match op {
                crate::op::TransferOp::HostToDevice => t.host_to_device += bytes,
                crate::op::TransferOp::DeviceToHost => t.device_to_host += bytes,
            }
        }
        t.resident = self
            .buffers
            .iter()
            .filter(|b| {
                b.persistent
                    && b.store == Store::Arena
                    && matches!(b.kind, BufferKind::Parameter | BufferKind::OptimizerState)
            })
            .map(|b| b.bytes)
            .sum();
        t
    }
}
