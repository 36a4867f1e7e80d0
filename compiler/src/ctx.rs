//! The pass context: what the passes (and emission) may depend on besides the graph, and the
//! rematerialization choices `compile` makes for them. It depends on no pass, so passes can be
//! modules of their own without importing the pipeline back.

use crate::op::Optimizer;
use crate::plan::{ClipNormMethod, Mode};
use dmc_plan::schedule::LrSchedule;

/// What the passes may depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct Ctx {
    pub mode: Mode,
    pub optimizer: Optimizer,
    /// The learning-rate schedule the plan carries to the runtime.
    pub schedule: LrSchedule,
    /// The GEMMs' arithmetic on a GPU (`train { precision }`), carried to the plan.
    pub precision: dmc_plan::plan::Precision,
    pub batch: usize,
    /// `accumulate: N`: the gradients are accumulated over N micro-batches (1: not).
    pub accumulate: usize,
    /// Data parallel: the ranks running this step, each on `batch` samples (1: one process; see
    /// [`crate::data_parallel`]).
    pub ranks: usize,
    /// How `clip_norm` (if the optimizer has it) gets the global norm before any update (chosen
    /// by `compile`: held gradients unless they do not fit the cap).
    pub clip_method: ClipNormMethod,
    /// Run the IR verifier around the passes (every pass in debug and test builds; see
    /// [`crate::passes`]).
    pub verify: bool,
    /// Fuse each weight gradient with its optimizer update (`fuse_weight_update`).
    pub fuse: bool,
    /// Rewrite elementwise ops to write into an input that dies there (`inplace_elementwise`).
    pub inplace: bool,
    /// What the `rematerialize` pass does (chosen by `compile` to fit the cap; see [`crate::remat`]).
    pub remat: Strategy,
    /// Workspaces with the GPU's split-K room (`dmc_plan::op::split`); `compile` drops it only
    /// when no plan with it fits the cap.
    pub split_room: bool,
    /// How many parameters / optimizer state tensors / activations stream through windows of the
    /// arena from the host store, in `stream::candidates`' order (0: all resident; chosen by
    /// `compile` when they do not fit the cap).
    pub stream: usize,
    /// Activations are candidates of streaming too (offloaded; see [`crate::stream`]).
    pub offload: bool,
    /// Streamed windows are copied in while the previous window's steps run (else just before
    /// their first use; see [`crate::stream`]).
    pub prefetch: bool,
    /// Data parallel with sharded parameters (ZeRO stage 3, [`crate::shard_params`]): emission
    /// keeps this rank's rows of each updated parameter and gathers windows for its uses.
    pub shard_params: bool,
}

/// `--remat`: whether `compile` may rematerialize to fit the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RematMode {
    /// Never recompute.
    Off,
    /// Recompute only when the plan does not fit the cap otherwise, as little as possible.
    #[default]
    Auto,
}

/// What the `rematerialize` pass does (chosen by `compile`'s search over budgets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Keep every saved value (checkpoint-all).
    #[default]
    KeepAll,
    /// The optimal strategy within this many of [`crate::remat::BUCKETS`] memory buckets (the smallest feasible
    /// budget when it is below it).
    Budget(u64),
    /// sqrt(n) checkpointing: segments of ceil(sqrt(L)) stages, each recomputed once.
    SqrtN,
}
