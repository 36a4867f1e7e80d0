//! dmc compiler: lowers a checked model to the IR, differentiates it, runs the pass pipeline and
//! emits the execution plan.
//!
//! `model -> lower -> PIPELINE (autodiff, optimizer, DCE, ...) -> schedule -> emit (place) -> Plan`,
//! with the IR verifier between passes and the independent plan checker at the end when
//! `CompileOptions::verify` is set.

pub mod autodiff;
pub mod check;
pub mod codegen;
pub mod emit;
pub mod error;
pub mod ir;
pub mod lower;
pub mod op;
pub mod optimizer;
pub mod passes;
pub mod placement;
pub mod plan;
pub mod planner;
pub mod schedule;
#[doc(hidden)]
pub mod testutil;
pub mod verify;

use std::fmt::Write as _;

use dmc_grammar::model::{Model, Optimizer};

pub use check::{check_plan, PlanCheckError};
pub use error::{CompileError, ShapeError};
pub use ir::Graph;
pub use plan::{Mode, Plan};
pub use verify::VerifyError;

/// How to compile.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileOptions {
    pub mode: Mode,
    /// Overrides the model's batch size.
    pub batch: Option<usize>,
    /// Overrides the optimizer's learning rate.
    pub lr: Option<f32>,
    /// Maximum arena size in bytes.
    pub cap: Option<u64>,
    /// Verify the IR before/after every pass and check the emitted plan.
    pub verify: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            mode: Mode::Train,
            batch: None,
            lr: None,
            cap: None,
            verify: cfg!(debug_assertions),
        }
    }
}

/// The pass context for `model` under `opts`.
pub fn context(model: &Model, opts: &CompileOptions) -> passes::Ctx {
    let mut optimizer = model.train.optimizer;
    if let Some(new) = opts.lr {
        match &mut optimizer {
            Optimizer::Sgd { lr, .. } | Optimizer::Adam { lr, .. } => *lr = new,
        }
    }
    passes::Ctx {
        mode: opts.mode,
        optimizer,
        batch: opts.batch.unwrap_or(model.train.batch),
        verify: opts.verify,
    }
}

/// Lowers `model` and runs the pass pipeline: the final IR (for `--dump-ir` and tests).
pub fn compile_graph(model: &Model, opts: &CompileOptions) -> Result<Graph, CompileError> {
    let ctx = context(model, opts);
    let mut g = lower::lower(model, ctx.batch)?;
    passes::run_pipeline(&mut g, &ctx)?;
    Ok(g)
}

/// Compiles `model` to an execution plan.
pub fn compile(model: &Model, opts: &CompileOptions) -> Result<Plan, CompileError> {
    let ctx = context(model, opts);
    let mut g = lower::lower(model, ctx.batch)?;
    passes::run_pipeline(&mut g, &ctx)?;
    let order = schedule::schedule(&g)?;
    let plan = emit::emit(&g, &order, &ctx, opts.cap)?;
    if opts.verify {
        check_plan(&plan)?;
    }
    Ok(plan)
}

/// A human-readable listing of the graph in topological order, one node per line:
/// `%3 = conv2d(%0:0, %1:0, %2:0) -> f32[1,16,16,256]  "conv2d_1" [Forward]`.
pub fn graph_dump(g: &Graph) -> String {
    let order = g.topo_order().unwrap_or_else(|_| g.nodes());
    let mut s = String::new();
    for n in order {
        let node = g.node(n);
        let ins: Vec<String> = g
            .inputs(n)
            .iter()
            .map(|(p, o)| format!("%{}:{o}", p.index()))
            .collect();
        let _ = writeln!(
            s,
            "%{} = {}({}) -> {}  \"{}\" [{:?}]",
            n.index(),
            node.op.kind_name(),
            ins.join(", "),
            ir::fmt_types(&node.outputs),
            node.name,
            node.phase
        );
    }
    if let Some(l) = g.loss {
        let _ = writeln!(s, "loss = %{}:{}", l.0.index(), l.1);
    }
    let _ = writeln!(s, "output = %{}:{}", g.output.0.index(), g.output.1);
    s
}
