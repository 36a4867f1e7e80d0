//! dmc compiler: lowers a checked model to the IR, differentiates it, runs the pass pipeline and
//! emits the execution plan.
//!
//! `model -> lower -> PIPELINE (autodiff, optimizer, fusion, DCE, rematerialization, in place) ->
//! schedule -> chunk selection + remat search (cap) -> emit (place) -> Plan`,
//! with the IR verifier between passes and the independent plan checker at the end when
//! `CompileOptions::verify` is set.

pub mod alias;
pub mod autodiff;
pub mod check;
pub mod cost;
pub mod emit;
pub mod error;
pub mod ir;
pub mod lower;
pub mod optimizer;
pub mod passes;
pub mod placement;
pub mod planner;
pub mod remat;
pub mod report;
pub mod schedule;
#[doc(hidden)]
pub mod testutil;
pub mod verify;

/// The plan's ops and the plan itself, from `dmc-plan` (the contract the compiler writes).
pub use dmc_plan::{op, plan};
use std::fmt::Write as _;

use dmc_grammar::model::{Model, Optimizer};

pub use check::{check_plan, PlanCheckError};
pub use error::{CompileError, ShapeError};
pub use ir::Graph;
pub use plan::{Mode, Plan};
pub use planner::PlannerKind;
pub use remat::{RematMode, Strategy as RematStrategy};
pub use verify::VerifyError;

use petgraph::stable_graph::NodeIndex;
use plan::BufferKind;

/// How to compile.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileOptions {
    pub mode: Mode,
    /// Overrides the model's batch size.
    pub batch: Option<usize>,
    /// Overrides the optimizer's learning rate.
    pub lr: Option<dmc_grammar::model::LearningRate>,
    /// Maximum arena size in bytes: the fused weight-gradient chunks shrink until the plan fits,
    /// else `compile` fails with [`CompileError::CapExceeded`].
    pub cap: Option<u64>,
    /// Verify the IR before/after every pass and check the emitted plan.
    pub verify: bool,
    /// Placement strategy (best-fit by default; `Trivial` for comparisons).
    pub planner: PlannerKind,
    /// Fuse each weight gradient with its optimizer update (`--no-fuse` clears it).
    pub fuse: bool,
    /// Rewrite elementwise ops in place where their input dies.
    pub inplace: bool,
    /// Whether to recompute forward values to fit the cap (`--remat off|auto`).
    pub remat: RematMode,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            mode: Mode::Train,
            batch: None,
            lr: None,
            cap: None,
            verify: cfg!(debug_assertions),
            planner: PlannerKind::BestFit,
            fuse: true,
            inplace: true,
            remat: RematMode::Auto,
        }
    }
}

/// The pass context for `model` under `opts`.
pub fn context(model: &Model, opts: &CompileOptions) -> passes::Ctx {
    let mut optimizer = model.train.optimizer;
    if let Some(new) = opts.lr {
        match &mut optimizer {
            Optimizer::Sgd { lr, .. } | Optimizer::Adam { lr, .. } => *lr = new.get(),
        }
    }
    passes::Ctx {
        mode: opts.mode,
        optimizer,
        batch: opts.batch.unwrap_or(model.train.batch),
        verify: opts.verify,
        fuse: opts.fuse,
        inplace: opts.inplace,
        remat: remat::Strategy::KeepAll,
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
///
/// Chunks of the fused weight-gradient ops: without a cap, each op's gradient workspace is halved
/// until it is at most [`default_chunk_bytes`] of the persistent state (or one column); with a
/// cap, every op starts from its whole layer and the chunks of the ops with the largest
/// workspaces are halved until the (best-fit) plan fits or no chunk can shrink. If the plan does
/// not fit then, the error gives the smallest cap that works (the plan with one-column chunks).
///
/// With `opts.remat == Auto`, a training step that does not fit the cap is rematerialized (see
/// [`compile_explained`]).
pub fn compile(model: &Model, opts: &CompileOptions) -> Result<Plan, CompileError> {
    compile_explained(model, opts).map(|(p, _)| p)
}

/// What rematerialization did to fit the cap.
#[derive(Debug, Clone, PartialEq)]
pub struct RematInfo {
    /// The smallest arena without recomputation (what did not fit).
    pub no_remat_arena: u64,
    /// Stages of the forward chain the strategy works on.
    pub stages: usize,
    /// The strategy that won, e.g. `optimal (DP budget 212/512)` or `sqrt(n)`.
    pub strategy: String,
    /// Plans tried (each one a full schedule and placement).
    pub probes: usize,
    /// The strategy's checkpoints and sequence ([`remat::describe`]).
    pub sequence: String,
}

/// FLOPs of the recomputed steps of `plan` (labels marked `(recompute k)`).
pub fn recompute_flops(plan: &Plan) -> u64 {
    (0..plan.steps.len())
        .filter(|s| cost::is_recompute(&plan.steps[*s].label))
        .map(|s| cost::step_flops(plan, s))
        .sum()
}

/// [`compile`], and what rematerialization did, if it was needed.
///
/// Search: plans without recomputation first (`CapExceeded` -> remat). Then the optimal DP
/// strategy at a memory budget (in [`remat::BUCKETS`] buckets) is planned for real (schedule +
/// placement), binary-searching the largest budget whose arena fits the cap; the sqrt(n)
/// strategy is planned too, and the plan with the least recompute FLOPs that fits wins. If even
/// the smallest-memory strategy (with one-column gradient chunks) does not fit, the error names
/// its arena as the smallest cap that works.
pub fn compile_explained(
    model: &Model,
    opts: &CompileOptions,
) -> Result<(Plan, Option<RematInfo>), CompileError> {
    let ctx = context(model, opts);
    let err = match compile_with(model, opts, &ctx) {
        Err(e @ CompileError::CapExceeded { .. }) => e,
        r => return r.map(|p| (p, None)),
    };
    let (Some(cap), RematMode::Auto, Mode::Train) = (opts.cap, opts.remat, ctx.mode) else {
        return Err(err);
    };
    let CompileError::CapExceeded {
        needed: no_remat, ..
    } = err
    else {
        return Err(err);
    };
    let free = CompileOptions {
        cap: None,
        verify: false,
        planner: PlannerKind::BestFit,
        ..opts.clone()
    };
    let mut probes = 0usize;
    let mut probe = |strategy: remat::Strategy| -> Result<Option<u64>, CompileError> {
        probes += 1;
        let c = passes::Ctx {
            remat: strategy,
            verify: false,
            ..ctx.clone()
        };
        let p = compile_with(model, &free, &c)?;
        Ok((p.arena_bytes <= cap).then(|| recompute_flops(&p)))
    };
    // (recompute FLOPs, strategy) of every plan that fits.
    let mut fits: Vec<(u64, remat::Strategy)> = vec![];
    let (mut lo, mut hi) = (0u64, remat::BUCKETS);
    match probe(remat::Strategy::Budget(0))? {
        Some(f) => fits.push((f, remat::Strategy::Budget(0))),
        None => hi = 0,
    }
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        match probe(remat::Strategy::Budget(mid))? {
            Some(f) => {
                fits.push((f, remat::Strategy::Budget(mid)));
                lo = mid;
            }
            None => hi = mid - 1,
        }
    }
    if let Some(f) = probe(remat::Strategy::SqrtN)? {
        fits.push((f, remat::Strategy::SqrtN));
    }
    let best = fits
        .iter()
        .min_by_key(|(f, s)| (*f, matches!(s, remat::Strategy::SqrtN)))
        .map(|(_, s)| *s)
        .unwrap_or(remat::Strategy::Budget(0));
    let c = passes::Ctx {
        remat: best,
        ..ctx.clone()
    };
    let (stages, sequence) = {
        let mut g = lower::lower(model, ctx.batch)?;
        passes::run_passes(&mut g, &c, &passes::PIPELINE[..passes::PIPELINE.len() - 2])?;
        match remat::chain(&g) {
            Some((st, costs)) => {
                let names: Vec<String> = st.iter().map(|s| g.node(s.out.0).name.clone()).collect();
                let seq = remat::plan_actions(&costs, best)
                    .map(|a| remat::describe(&a, &names))
                    .unwrap_or_default();
                (st.len(), seq)
            }
            None => (0, String::new()),
        }
    };
    let plan = match compile_with(model, opts, &c) {
        Ok(p) => p,
        Err(CompileError::CapExceeded {
            needed,
            cap,
            params,
            opt_state,
            working_set,
        }) => {
            return Err(CompileError::CapExceeded {
                needed: needed.min(no_remat),
                cap,
                params,
                opt_state,
                working_set: working_set.min(no_remat.saturating_sub(params + opt_state)),
            })
        }
        Err(e) => return Err(e),
    };
    let strategy = match best {
        remat::Strategy::SqrtN => "sqrt(n) segments".to_string(),
        remat::Strategy::Budget(b) if stages > remat::MAX_DP_STAGES => format!(
            "optimal over {} groups of stages (DP memory budget {b}/{} buckets)",
            remat::MAX_DP_STAGES,
            remat::BUCKETS
        ),
        remat::Strategy::Budget(b) => {
            format!("optimal (DP memory budget {b}/{} buckets)", remat::BUCKETS)
        }
        remat::Strategy::KeepAll => "none".to_string(),
    };
    Ok((
        plan,
        Some(RematInfo {
            no_remat_arena: no_remat,
            stages,
            strategy,
            probes,
            sequence,
        }),
    ))
}

/// [`compile`] with a given pass context (no rematerialization search).
pub fn compile_with(
    model: &Model,
    opts: &CompileOptions,
    ctx: &passes::Ctx,
) -> Result<Plan, CompileError> {
    let ctx = ctx.clone();
    let mut g = lower::lower(model, ctx.batch)?;
    passes::run_pipeline(&mut g, &ctx)?;
    let order = schedule::schedule(&g)?;
    match opts.cap {
        None => {
            let budget = default_chunk_bytes(persistent_bytes(&g));
            for n in g.nodes() {
                while chunk_grad_bytes(&g, n).is_some_and(|b| b > budget) && halve_chunk(&mut g, n)
                {
                }
            }
        }
        Some(cap) => loop {
            let p = emit::emit(&g, &order, &ctx, PlannerKind::BestFit)?;
            if p.arena_bytes <= cap || !shrink_dominant(&mut g) {
                break;
            }
        },
    }
    if opts.verify {
        verify::verify(&g, "chunk selection")?;
    }
    let plan = emit::emit(&g, &order, &ctx, opts.planner)?;
    if let Some(cap) = opts.cap {
        if plan.arena_bytes > cap {
            // The smallest plan: every chunk one column.
            for n in g.nodes() {
                while halve_chunk(&mut g, n) {}
            }
            let small = emit::emit(&g, &order, &ctx, opts.planner)?;
            let sum = |k: BufferKind| -> u64 {
                small
                    .buffers
                    .iter()
                    .filter(|b| b.kind == k && b.persistent)
                    .map(|b| planner::align_up(b.bytes))
                    .sum()
            };
            let (params, opt_state) = (sum(BufferKind::Parameter), sum(BufferKind::OptimizerState));
            if small.arena_bytes <= cap {
                if opts.verify {
                    check_plan(&small)?;
                }
                return Ok(small);
            }
            let needed = small.arena_bytes;
            return Err(CompileError::CapExceeded {
                needed,
                cap,
                params,
                opt_state,
                working_set: needed.saturating_sub(params + opt_state),
            });
        }
    }
    if opts.verify {
        check_plan(&plan)?;
    }
    Ok(plan)
}

/// The largest gradient workspace a fused op gets without a cap: 1/256 of the persistent bytes
/// (parameters and optimizer state), at least 256 KiB.
pub fn default_chunk_bytes(persistent: u64) -> u64 {
    (persistent / 256).max(256 << 10)
}

/// Bytes of the parameters and optimizer state of `g`.
fn persistent_bytes(g: &Graph) -> u64 {
    g.nodes()
        .into_iter()
        .filter(|n| {
            matches!(
                g.node(*n).op,
                op::Op::Param { .. } | op::Op::OptState { .. }
            )
        })
        .map(|n| g.ty((n, 0)).bytes())
        .sum()
}

/// Bytes of the gradient workspace (`gw`) of a chunked fused op, if `n` is one.
fn chunk_grad_bytes(g: &Graph, n: NodeIndex) -> Option<u64> {
    let rows = match &g.node(n).op {
        op::Op::Conv2dBwdWeightUpdate { chunk, .. }
        | op::Op::DenseBwdWeightUpdate { chunk, .. } => {
            let w = g.input(n, 2)?;
            let s = &g.ty(w).shape;
            (s.iter().product::<usize>() / s.last().copied().unwrap_or(1).max(1)) * chunk
        }
        _ => return None,
    };
    Some(rows as u64 * 4)
}

/// Halves (rounding up) the chunk of a fused op; false if `n` is not one or its chunk is 1.
fn halve_chunk(g: &mut Graph, n: NodeIndex) -> bool {
    match g.g.node_weight_mut(n).map(|node| &mut node.op) {
        Some(op::Op::Conv2dBwdWeightUpdate { chunk, .. })
        | Some(op::Op::DenseBwdWeightUpdate { chunk, .. })
            if *chunk > 1 =>
        {
            *chunk = chunk.div_ceil(2);
            true
        }
        _ => false,
    }
}

/// Halves the chunks of the fused ops whose gradient workspace is more than half the largest
/// one (among those that can still shrink). False when none can.
fn shrink_dominant(g: &mut Graph) -> bool {
    let can: Vec<(NodeIndex, u64)> = g
        .nodes()
        .into_iter()
        .filter_map(|n| {
            let b = chunk_grad_bytes(g, n)?;
            let c = match &g.node(n).op {
                op::Op::Conv2dBwdWeightUpdate { chunk, .. }
                | op::Op::DenseBwdWeightUpdate { chunk, .. } => *chunk,
                _ => 1,
            };
            (c > 1).then_some((n, b))
        })
        .collect();
    let Some(max) = can.iter().map(|(_, b)| *b).max() else {
        return false;
    };
    for (n, b) in can {
        if b * 2 > max {
            halve_chunk(g, n);
        }
    }
    true
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

/// One point of the memory / recompute trade-off ([`sweep`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SweepPoint {
    pub cap: u64,
    /// dmc's plan at this cap: its arena and recompute FLOPs in % of the step.
    pub arena: u64,
    pub recompute_pct: f64,
    /// sqrt(n) checkpointing at this cap (`None`: does not fit).
    pub sqrt_pct: Option<f64>,
    /// Checkpoint-all (no recomputation): 0 when it fits.
    pub keep_all_pct: Option<f64>,
}

/// The trade-off curve.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Sweep {
    /// The arena without recomputation (checkpoint-all).
    pub no_remat_arena: u64,
    /// The smallest arena rematerialization reaches.
    pub min_arena: u64,
    /// The arena and recompute % of sqrt(n) checkpointing.
    pub sqrt_arena: u64,
    pub sqrt_pct: f64,
    /// The step's FLOPs without recomputation.
    pub step_flops: u64,
    pub points: Vec<SweepPoint>,
}

fn pct_of(plan: &Plan) -> (f64, u64) {
    let all: u64 = (0..plan.steps.len())
        .map(|s| cost::step_flops(plan, s))
        .sum();
    let re = recompute_flops(plan);
    let base = all - re;
    (100.0 * re as f64 / base.max(1) as f64, base)
}

/// Compiles `model` at `points` caps from the smallest feasible arena to the arena without
/// recomputation, with sqrt(n) and checkpoint-all evaluated by the same cost model.
pub fn sweep(model: &Model, opts: &CompileOptions, points: usize) -> Result<Sweep, CompileError> {
    let off = CompileOptions {
        cap: None,
        remat: RematMode::Off,
        ..opts.clone()
    };
    let full = compile(model, &off)?;
    let (_, step_flops) = pct_of(&full);
    let min_arena = match compile(
        model,
        &CompileOptions {
            cap: Some(1),
            remat: RematMode::Auto,
            ..opts.clone()
        },
    ) {
        Err(CompileError::CapExceeded { needed, .. }) => needed,
        Err(e) => return Err(e),
        Ok(p) => p.arena_bytes,
    };
    let ctx = passes::Ctx {
        remat: remat::Strategy::SqrtN,
        ..context(model, opts)
    };
    let sq = compile_with(model, &off, &ctx)?;
    let (sqrt_pct, _) = pct_of(&sq);
    let mut out = vec![];
    let n = points.max(2);
    for i in 0..n {
        let cap = min_arena
            + (full.arena_bytes - min_arena.min(full.arena_bytes)) * i as u64 / (n as u64 - 1);
        let p = compile(
            model,
            &CompileOptions {
                cap: Some(cap),
                remat: RematMode::Auto,
                ..opts.clone()
            },
        )?;
        out.push(SweepPoint {
            cap,
            arena: p.arena_bytes,
            recompute_pct: pct_of(&p).0,
            sqrt_pct: (sq.arena_bytes <= cap).then_some(sqrt_pct),
            keep_all_pct: (full.arena_bytes <= cap).then_some(0.0),
        });
    }
    Ok(Sweep {
        no_remat_arena: full.arena_bytes,
        min_arena,
        sqrt_arena: sq.arena_bytes,
        sqrt_pct,
        step_flops,
        points: out,
    })
}

/// The largest batch whose training step fits `opts.cap`, with its plan's arena. There is no
/// ceiling but the one every compile has ([`CompileError::TooLarge`], which counts as not fitting).
pub fn max_batch(
    model: &Model,
    opts: &CompileOptions,
) -> Result<Option<(usize, u64)>, CompileError> {
    let fits = |b: usize| -> Result<Option<u64>, CompileError> {
        match compile(
            model,
            &CompileOptions {
                batch: Some(b),
                verify: false,
                ..opts.clone()
            },
        ) {
            Ok(p) => Ok(Some(p.arena_bytes)),
            Err(CompileError::CapExceeded { .. } | CompileError::TooLarge { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    };
    let Some(mut best) = fits(1)?.map(|a| (1usize, a)) else {
        return Ok(None);
    };
    // Doubling, then bisection between the last batch that fits and the first that does not.
    let mut hi = None;
    while hi.is_none() {
        let Some(b) = best.0.checked_mul(2) else {
            break;
        };
        match fits(b)? {
            Some(a) => best = (b, a),
            None => hi = Some(b),
        }
    }
    if let Some(mut hi) = hi {
        while hi - best.0 > 1 {
            let mid = (best.0 + hi) / 2;
            match fits(mid)? {
                Some(a) => best = (mid, a),
                None => hi = mid,
            }
        }
    }
    Ok(Some(best))
}
