//! What a compilation is asked for ([`CompileOptions`], from the command line or a test) and the
//! pass context it gives ([`context`]).

use dmc_grammar::model::{Model, Optimizer};

use crate::ctx::{Ctx, RematMode, Strategy};
use crate::placement::PlannerKind;
use crate::plan::{ClipNormMethod, Mode};

/// Whether this is a checked build: debug builds, and any build with the `verify-passes` feature
/// (the workspace's tests enable it, so `cargo test --release` checks as a debug build does). A
/// checked build verifies the IR after every pass, not once after them all.
pub const CHECKED_BUILD: bool = cfg!(any(debug_assertions, feature = "verify-passes"));

/// How to compile.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileOptions {
    pub mode: Mode,
    /// Overrides the model's batch size.
    pub batch: Option<usize>,
    /// Overrides the optimizer's learning rate.
    pub lr: Option<dmc_grammar::model::LearningRate>,
    /// Maximum arena size in bytes: the fused weight-gradient chunks shrink until the plan fits,
    /// else `compile` fails with [`crate::error::CompileError::CapExceeded`].
    pub cap: Option<u64>,
    /// Verify the IR (before and after every pass in a [`CHECKED_BUILD`], once after the passes
    /// otherwise: see [`crate::passes`]) and check the emitted plan.
    pub verify: bool,
    /// Placement strategy (best-fit by default; `Trivial` for comparisons).
    pub planner: PlannerKind,
    /// Fuse each weight gradient with its optimizer update (`--no-fuse` clears it).
    pub fuse: bool,
    /// Rewrite elementwise ops in place where their input dies.
    pub inplace: bool,
    /// Whether to recompute forward values to fit the cap (`--remat off|auto`).
    pub remat: RematMode,
    /// How `clip_norm` is done: `None` lets `compile` choose (held gradients, or the norm pass
    /// when they do not fit the cap); a method forces it (`--clip-norm-method`).
    pub clip_method: Option<ClipNormMethod>,
    /// Whether parameters and optimizer state may stream through the arena from a host store
    /// when they do not fit the cap resident (`--no-stream` clears it; see [`crate::stream`]).
    pub stream: bool,
    /// Whether streaming may offload activations to the host store between their forward and
    /// backward uses, as the alternative to recomputing them (`--no-offload` clears it).
    pub offload: bool,
    /// The CPU time model's rates the cap fitter ranks its candidate plans by
    /// ([`dmc_plan::cpu`]; [`CpuRates::nominal`](dmc_plan::cpu::CpuRates::nominal) unless the
    /// caller measured the machine).
    pub rates: dmc_plan::cpu::CpuRates,
    /// Data parallel (`--data-parallel`): the ranks the global batch (the model's or `batch`)
    /// is split over; the plan is one rank's (its batch, its shards; [`crate::data_parallel`]).
    pub ranks: usize,
    /// Data parallel with sharded parameters (`--shard-parameters`, ZeRO stage 3): each rank
    /// keeps its rows of every updated parameter, gathered into a window for each cluster of
    /// uses ([`crate::shard_params`]). Nothing without `ranks` > 1.
    pub shard_params: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            mode: Mode::Train,
            batch: None,
            lr: None,
            cap: None,
            verify: CHECKED_BUILD,
            planner: PlannerKind::BestFit,
            fuse: true,
            inplace: true,
            remat: RematMode::Auto,
            clip_method: None,
            stream: true,
            offload: true,
            rates: dmc_plan::cpu::CpuRates::nominal(),
            ranks: 1,
            shard_params: false,
        }
    }
}

/// The pass context for `model` under `opts`.
pub fn context(model: &Model, opts: &CompileOptions) -> Ctx {
    // data parallel shapes the training step only (an eval step runs the whole batch)
    let ranks = match opts.mode {
        Mode::Train => opts.ranks.max(1),
        Mode::Eval | Mode::Predict => 1,
    };
    let mut optimizer = model.train.optimizer;
    if let Some(new) = opts.lr {
        match &mut optimizer {
            Optimizer::Sgd { lr, .. }
            | Optimizer::Adam { lr, .. }
            | Optimizer::RmsProp { lr, .. }
            | Optimizer::Lion { lr, .. } => *lr = new.get(),
        }
    }
    Ctx {
        mode: opts.mode,
        optimizer,
        schedule: model.train.schedule,
        precision: model.train.precision,
        batch: opts.batch.unwrap_or(model.train.batch) / ranks,
        accumulate: model.train.accumulate.max(1),
        ranks,
        clip_method: opts.clip_method.unwrap_or(ClipNormMethod::HeldGradients),
        verify: opts.verify,
        fuse: opts.fuse,
        inplace: opts.inplace,
        remat: Strategy::KeepAll,
        split_room: true,
        stream: 0,
        offload: opts.offload,
        prefetch: true,
        shard_params: opts.shard_params && ranks > 1,
    }
}
