//! dmc compiler: lowers a checked model to the IR, differentiates it, runs the pass pipeline and
//! emits the execution plan.
//!
//! `model -> lower -> PIPELINE (BUILD_STEP: autodiff, optimizer, fusion, DCE; MEMORY:
//! rematerialization, in place) -> schedule -> chunk selection + remat search (cap, [`fit`]) ->
//! emit (place) -> Plan`, with the IR verifier between passes and the independent plan checker at
//! the end when `CompileOptions::verify` is set.
//!
//! This file is the facade: the modules, and the names a driver needs at the crate root.

pub mod alias;
pub mod autodiff;
pub mod check;
pub mod cost;
pub mod ctx;
pub mod data_parallel;
pub mod dump;
pub mod emit;
pub mod error;
pub mod fit;
pub mod fuse;
pub mod fxhash;
mod gate_order;
pub mod ir;
pub mod json;
pub mod lower;
pub mod optimizer;
pub mod options;
pub mod passes;
pub mod placement;
pub mod remat;
pub mod report;
pub mod schedule;
pub mod shard_params;
pub mod stream;
pub mod sweep;
pub mod tensor;
#[doc(hidden)]
pub mod testutil;
pub mod verify;

use dmc_grammar::model::Model;
/// The plan's ops and the plan itself, from `dmc-plan` (the contract the compiler writes).
pub use dmc_plan::{op, plan};

pub use check::{check_plan, check_plan_alongside};
pub use ctx::{RematMode, Strategy as RematStrategy};
pub use dump::graph_dump;
pub use error::{CompileError, PlanCheckError, ShapeError, VerifyError};
pub use fit::{
    compile, compile_explained, compile_explained_alongside, compile_with, default_chunk_bytes,
    recompute_flops, RematInfo,
};
pub use ir::Graph;
pub use options::{context, CompileOptions, CHECKED_BUILD};
pub use placement::PlannerKind;
pub use plan::{Mode, Plan};
pub use sweep::{max_batch, sweep, Sweep, SweepPoint};

/// Lowers `model` and runs the pass pipeline: the final IR (for `--dump-ir` and tests).
pub fn compile_graph(model: &Model, opts: &CompileOptions) -> Result<Graph, CompileError> {
    let ctx = context(model, opts);
    let mut g = lower::lower(model, ctx.batch)?;
    passes::run_pipeline(&mut g, &ctx)?;
    Ok(g)
}
