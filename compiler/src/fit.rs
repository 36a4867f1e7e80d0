//! Fitting a cap: the search over fused weight-gradient chunk sizes and rematerialization
//! strategies that makes the plan fit `--vram-cap` ([`compile_explained`], [`compile_with`]).
//!
//! Chunks: without a cap, each fused op's gradient workspace is halved until it is at most
//! [`default_chunk_bytes`] of the persistent state; with a cap, the chunks of the ops with the
//! largest workspaces are halved until the plan fits or none can shrink. Rematerialization
//! (`--remat auto`, train only): when no chunking fits, the DP strategy is planned at a binary
//! search of memory budgets, and sqrt(n) too; the fitting plan with the least recompute wins.

use dmc_grammar::model::Model;
use petgraph::stable_graph::NodeIndex;

use crate::check::check_plan;
use crate::ctx::{Ctx, RematMode, Strategy};
use crate::error::CompileError;
use crate::ir::Graph;
use crate::op::{ConvOp, DenseOp, Op};
use crate::options::{context, CompileOptions};
use crate::placement::{align_up, PlannerKind};
use crate::plan::{BufferKind, ClipNormMethod, Mode, Plan};
use crate::{cost, emit, lower, passes, remat, schedule, verify};

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
///
/// `clip_norm`: with held gradients unless `opts.clip_method` says otherwise; when no plan with
/// held gradients fits the cap (even rematerialized), the norm pass
/// ([`ClipNormMethod::NormPass`]: no gradient held, one more forward/backward per step) is
/// fitted the same way, and the error of both failing names the smaller cap.
pub fn compile_explained(
    model: &Model,
    opts: &CompileOptions,
) -> Result<(Plan, Option<RematInfo>), CompileError> {
    explained(model, opts, true)
}

/// [`compile_explained`], then `alongside(&plan)` on this thread while the plan checker
/// ([`check_plan`], when `opts.verify`) checks the plan on another: for the work a caller does
/// with the plan next (its memory report, its serialisation into a temp file), which then
/// overlaps the check. A check error wins over `alongside`'s result, as if the check had run
/// first (see [`crate::check::check_plan_alongside`]): `alongside` must not make the plan
/// visible (write it where a reader finds it) before it returns.
pub fn compile_explained_alongside<T>(
    model: &Model,
    opts: &CompileOptions,
    alongside: impl FnOnce(&Plan) -> T,
) -> Result<(Plan, Option<RematInfo>, T), CompileError> {
    let (plan, info) = explained(model, opts, false)?;
    let t = if opts.verify {
        crate::check::check_plan_alongside(&plan, alongside)?
    } else {
        alongside(&plan)
    };
    Ok((plan, info, t))
}

/// [`compile_explained`]; the plan returned is checked (when `opts.verify`) only if `check`.
/// The workspaces carry the GPU's split-K room unless no plan with it fits the cap: then the
/// whole fit is redone without it (the CPU never needs it; the GPU then runs those GEMMs
/// unsplit), so a cap's floor is what it is without the room.
fn explained(
    model: &Model,
    opts: &CompileOptions,
    check: bool,
) -> Result<(Plan, Option<RematInfo>), CompileError> {
    let model = &*crate::data_parallel::rank_model(model, opts)?;
    // (sharded parameters do not stream: their homes are shards, their windows gathered)
    let can_stream = opts.stream && opts.cap.is_some() && !(opts.shard_params && opts.ranks > 1);
    match resident_or_streamed(model, opts, check, NO_STREAM) {
        Err(e @ CompileError::CapExceeded { .. }) if can_stream => {
            stream_fit(model, opts, check, e)
        }
        Ok(resident) if can_stream => faster_streamed(model, opts, check, resident),
        r => r,
    }
}

/// A resident plan predicted this much slower than the step without a cap is compared with
/// streamed ones ([`faster_streamed`]).
const SLOW: f64 = 1.05;

/// Near its floor a resident plan fits only by one-column weight-gradient chunks (each redoing
/// its im2col) or heavy recomputation; streaming a few tensors frees arena for larger chunks and
/// less recomputation. When the resident plan is predicted more than [`SLOW`] times the uncapped
/// step (the CPU time model, copies included), the plans streaming 1/8, 1/4, 1/2 and all of
/// [`crate::stream::candidates`] are fitted and predicted too; the fastest wins, the resident
/// plan unless a streamed one is predicted at least 5% faster.
fn faster_streamed(
    model: &Model,
    opts: &CompileOptions,
    check: bool,
    resident: (Plan, Option<RematInfo>),
) -> Result<(Plan, Option<RematInfo>), CompileError> {
    let time = |p: &Plan| dmc_plan::cpu::plan_time(p, &opts.rates).step_s;
    let free = CompileOptions {
        cap: None,
        verify: false,
        ..opts.clone()
    };
    let t_resident = time(&resident.0);
    if t_resident <= SLOW * time(&compile_with(model, &free, &context(model, opts))?) {
        return Ok(resident);
    }
    let all = candidates(model, opts)?;
    let mut counts: Vec<usize> = [8, 4, 2, 1].iter().map(|d| all.div_ceil(*d)).collect();
    counts.dedup();
    let mut best: Option<(f64, usize)> = None;
    for count in counts.into_iter().filter(|&c| c > 0) {
        let stream = Streaming {
            count,
            prefetch: false,
        };
        match resident_or_streamed(model, opts, false, stream) {
            Ok((p, _)) => {
                let t = time(&p);
                if t < 0.95 * best.map_or(t_resident, |b| b.0) {
                    best = Some((t, count));
                }
            }
            Err(CompileError::CapExceeded { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let Some((t_plain, count)) = best else {
        return Ok(resident);
    };
    // with prefetch when that fits and is not predicted slower (it may fit only by recomputing)
    let prefetch = match resident_or_streamed(
        model,
        opts,
        false,
        Streaming {
            count,
            prefetch: true,
        },
    ) {
        Ok((p, _)) => time(&p) <= t_plain,
        Err(CompileError::CapExceeded { .. }) => false,
        Err(e) => return Err(e),
    };
    resident_or_streamed(model, opts, check, Streaming { count, prefetch })
}

/// How many tensors may stream ([`crate::stream::candidates`] of the uncapped plan).
fn candidates(model: &Model, opts: &CompileOptions) -> Result<usize, CompileError> {
    let free = CompileOptions {
        cap: None,
        verify: false,
        ..opts.clone()
    };
    let ctx = Ctx {
        stream: usize::MAX,
        ..context(model, opts)
    };
    Ok(compile_with(model, &free, &ctx)?
        .buffers
        .iter()
        .filter(|b| !b.store.is_arena())
        .count())
}

/// Nothing streamed (see [`Streaming`]).
const NO_STREAM: Streaming = Streaming {
    count: 0,
    prefetch: false,
};

/// What streams: the first `count` tensors of [`crate::stream::candidates`], with or without
/// prefetch.
#[derive(Debug, Clone, Copy)]
struct Streaming {
    count: usize,
    prefetch: bool,
}

/// [`explained_in`] with the GPU's split-K room, else (nothing fits with it) without.
fn resident_or_streamed(
    model: &Model,
    opts: &CompileOptions,
    check: bool,
    stream: Streaming,
) -> Result<(Plan, Option<RematInfo>), CompileError> {
    match explained_in(model, opts, check, true, stream) {
        Err(CompileError::CapExceeded { .. }) => explained_in(model, opts, check, false, stream),
        r => r,
    }
}

/// When the parameters and optimizer state do not fit the cap resident: the fewest tensors
/// streamed that fit (a binary search over the count, in [`crate::stream::candidates`]' order;
/// feasibility only grows with it), with prefetch when that fits too. If even streaming all of
/// them does not fit, the error names the smaller of the two smallest caps.
fn stream_fit(
    model: &Model,
    opts: &CompileOptions,
    check: bool,
    resident: CompileError,
) -> Result<(Plan, Option<RematInfo>), CompileError> {
    let all = candidates(model, opts)?;
    if all == 0 {
        return Err(resident);
    }
    let fit = |count: usize, prefetch: bool, check: bool| {
        resident_or_streamed(model, opts, check, Streaming { count, prefetch })
    };
    // The search probes without recomputation (one plan each, not a remat search each):
    // offloading the activations is what recomputation would otherwise buy.
    let no_remat = CompileOptions {
        remat: RematMode::Off,
        ..opts.clone()
    };
    let fits_plain = |count: usize| {
        resident_or_streamed(
            model,
            &no_remat,
            false,
            Streaming {
                count,
                prefetch: false,
            },
        )
    };
    if fits_plain(all).is_err() {
        return stream_fit_remat(model, opts, check, resident, all);
    }
    // the smallest count that fits: `lo` does not, `hi` does
    let (mut lo, mut hi) = (0, all);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match fits_plain(mid) {
            Ok(_) => hi = mid,
            Err(CompileError::CapExceeded { .. }) => lo = mid,
            Err(e) => return Err(e),
        }
    }
    let prefetched = resident_or_streamed(
        model,
        &no_remat,
        false,
        Streaming {
            count: hi,
            prefetch: true,
        },
    );
    fit(hi, prefetched.is_ok(), check)
}

/// [`stream_fit`] when even streaming everything does not fit without recomputation: the same
/// search, each probe with it.
fn stream_fit_remat(
    model: &Model,
    opts: &CompileOptions,
    check: bool,
    resident: CompileError,
    all: usize,
) -> Result<(Plan, Option<RematInfo>), CompileError> {
    let fit = |count: usize, prefetch: bool, check: bool| {
        resident_or_streamed(model, opts, check, Streaming { count, prefetch })
    };
    match fit(all, false, false) {
        Ok(_) => {}
        Err(e @ CompileError::CapExceeded { .. }) => {
            let needed = |e: &CompileError| match e {
                CompileError::CapExceeded { needed, .. } => *needed,
                _ => u64::MAX,
            };
            return Err(if needed(&e) < needed(&resident) {
                e
            } else {
                resident
            });
        }
        Err(e) => return Err(e),
    }
    // the smallest count that fits: `lo` does not, `hi` does
    let (mut lo, mut hi) = (0, all);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match fit(mid, false, false) {
            Ok(_) => hi = mid,
            Err(CompileError::CapExceeded { .. }) => lo = mid,
            Err(e) => return Err(e),
        }
    }
    match fit(hi, true, check) {
        Err(CompileError::CapExceeded { .. }) => fit(hi, false, check),
        r => r,
    }
}

fn explained_in(
    model: &Model,
    opts: &CompileOptions,
    check: bool,
    split_room: bool,
    stream: Streaming,
) -> Result<(Plan, Option<RematInfo>), CompileError> {
    let ctx = Ctx {
        split_room,
        stream: stream.count,
        prefetch: stream.prefetch,
        ..context(model, opts)
    };
    if let (Some(m), None, Mode::Train) = (opts.clip_method, ctx.optimizer.clip_norm(), ctx.mode) {
        return Err(CompileError::InvalidModel(format!(
            "a global-norm clipping method was chosen ({}), but the train block has no clip_norm: add `clip_norm: 1.0` (the largest gradient norm) to `train {{ ... }}`, or drop the method",
            match m {
                ClipNormMethod::HeldGradients => "held gradients",
                ClipNormMethod::NormPass => "the norm pass",
            }
        )));
    }
    let held = match fit_cap(model, opts, &ctx, check) {
        Err(e @ CompileError::CapExceeded { .. }) => e,
        r => return r,
    };
    let lean = ctx.optimizer.clip_norm().is_some()
        && opts.clip_method.is_none()
        && ctx.accumulate == 1
        && ctx.mode == Mode::Train;
    if !lean {
        return Err(held);
    }
    let c = Ctx {
        clip_method: ClipNormMethod::NormPass,
        ..ctx
    };
    match fit_cap(model, opts, &c, check) {
        Err(e @ CompileError::CapExceeded { .. }) => {
            let needed = |e: &CompileError| match e {
                CompileError::CapExceeded { needed, .. } => *needed,
                _ => u64::MAX,
            };
            Err(if needed(&e) < needed(&held) { e } else { held })
        }
        r => r,
    }
}

/// [`compile_explained`] for one pass context: without recomputation, else (`CapExceeded`,
/// `--remat auto`, train) the rematerialization search.
fn fit_cap(
    model: &Model,
    opts: &CompileOptions,
    ctx: &Ctx,
    check: bool,
) -> Result<(Plan, Option<RematInfo>), CompileError> {
    let ctx = ctx.clone();
    let time = |p: &Plan| dmc_plan::cpu::plan_time(p, &opts.rates).step_s;
    let free = CompileOptions {
        cap: None,
        verify: false,
        planner: PlannerKind::BestFit,
        ..opts.clone()
    };
    // Without recomputation: the plan that fits by shrinking chunks, unless recomputing is
    // predicted faster (small chunks redo im2col and run narrow GEMMs per chunk: see
    // `dmc_plan::cpu`), which the search below decides when the chunks cost over 10%.
    let (err, chunked) = match compile_with_check(model, opts, &ctx, check) {
        Err(e @ CompileError::CapExceeded { .. }) => (e, None),
        Ok(p) => {
            let (Some(cap), RematMode::Auto, Mode::Train) = (opts.cap, opts.remat, ctx.mode) else {
                return Ok((p, None));
            };
            let t = time(&p);
            let unchunked = compile_with(model, &free, &ctx)?;
            if t <= 1.1 * time(&unchunked) {
                return Ok((p, None));
            }
            let needed = unchunked.arena_bytes.max(p.arena_bytes);
            (
                CompileError::CapExceeded {
                    needed,
                    cap,
                    params: 0,
                    opt_state: 0,
                    working_set: 0,
                    host: 0,
                },
                Some((t, p)),
            )
        }
        Err(e) => return Err(e),
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
    let mut probes = 0usize;
    let mut probe = |strategy: Strategy| -> Result<Option<(f64, u64)>, CompileError> {
        probes += 1;
        let c = Ctx {
            remat: strategy,
            verify: false,
            ..ctx.clone()
        };
        let p = compile_with(model, &free, &c)?;
        Ok((p.arena_bytes <= cap).then(|| (time(&p), recompute_flops(&p))))
    };
    // ((predicted time, recompute FLOPs), strategy) of every plan that fits.
    let mut fits: Vec<((f64, u64), Strategy)> = vec![];
    let (mut lo, mut hi) = (0u64, remat::BUCKETS);
    match probe(Strategy::Budget(0))? {
        Some(f) => fits.push((f, Strategy::Budget(0))),
        None => hi = 0,
    }
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        match probe(Strategy::Budget(mid))? {
            Some(f) => {
                fits.push((f, Strategy::Budget(mid)));
                lo = mid;
            }
            None => hi = mid - 1,
        }
    }
    if let Some(f) = probe(Strategy::SqrtN)? {
        fits.push((f, Strategy::SqrtN));
    }
    // the fastest predicted (then the least recompute, then the DP over sqrt(n))
    let best = fits
        .iter()
        .min_by(|(a, s), (b, t)| {
            a.0.total_cmp(&b.0)
                .then(a.1.cmp(&b.1))
                .then(matches!(s, Strategy::SqrtN).cmp(&matches!(t, Strategy::SqrtN)))
        })
        .copied();
    if let Some((t, p)) = chunked {
        // recompute only if some strategy is predicted faster than the chunks
        if best.is_none_or(|((bt, _), _)| bt >= t) {
            return Ok((p, None));
        }
    }
    let best = best.map(|(_, s)| s).unwrap_or(Strategy::Budget(0));
    let c = Ctx {
        remat: best,
        ..ctx.clone()
    };
    let (stages, sequence) = {
        let mut g = lower::lower(model, ctx.batch)?;
        passes::run_passes(&mut g, &c, passes::BUILD_STEP)?;
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
    let plan = match compile_with_check(model, opts, &c, check) {
        Ok(p) => p,
        Err(CompileError::CapExceeded {
            needed,
            cap,
            params,
            opt_state,
            working_set,
            host,
        }) => {
            return Err(CompileError::CapExceeded {
                needed: needed.min(no_remat),
                cap,
                params,
                opt_state,
                working_set: working_set.min(no_remat.saturating_sub(params + opt_state)),
                host,
            })
        }
        Err(e) => return Err(e),
    };
    let strategy = match best {
        Strategy::SqrtN => "sqrt(n) segments".to_string(),
        Strategy::Budget(b) if stages > remat::MAX_DP_STAGES => format!(
            "optimal over {} groups of stages (DP memory budget {b}/{} buckets)",
            remat::MAX_DP_STAGES,
            remat::BUCKETS
        ),
        Strategy::Budget(b) => {
            format!("optimal (DP memory budget {b}/{} buckets)", remat::BUCKETS)
        }
        Strategy::KeepAll => "none".to_string(),
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
pub fn compile_with(model: &Model, opts: &CompileOptions, ctx: &Ctx) -> Result<Plan, CompileError> {
    compile_with_check(model, opts, ctx, true)
}

/// [`compile_with`]; the plan returned is checked (when `opts.verify`) only if `check`.
fn compile_with_check(
    model: &Model,
    opts: &CompileOptions,
    ctx: &Ctx,
    check: bool,
) -> Result<Plan, CompileError> {
    let ctx = ctx.clone();
    let mut g = lower::lower(model, ctx.batch)?;
    // (The scheduler runs while unchecked builds verify the graph the passes left.)
    let order = passes::run_pipeline_then(&mut g, &ctx, schedule::schedule)?;
    // Whether a chunk changed: as after a pass that changed nothing, unchecked builds do not verify
    // the graph again unless it did (checked builds, `CHECKED_BUILD`, always do).
    let mut changed = false;
    match opts.cap {
        None => {
            let budget = default_chunk_bytes(persistent_bytes(&g));
            for n in g.nodes() {
                while chunk_grad_bytes(&g, n).is_some_and(|b| b > budget) && halve_chunk(&mut g, n)
                {
                    changed = true;
                }
            }
        }
        Some(cap) => loop {
            let p = emit::emit(&g, &order, &ctx, PlannerKind::BestFit)?;
            if p.arena_bytes <= cap || !shrink_dominant(&mut g) {
                break;
            }
            changed = true;
        },
    }
    if opts.verify && (changed || crate::options::CHECKED_BUILD) {
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
                    .filter(|b| b.kind == k && b.persistent && b.store.is_arena())
                    .map(|b| align_up(b.bytes))
                    .sum()
            };
            let (params, opt_state) = (sum(BufferKind::Parameter), sum(BufferKind::OptimizerState));
            if small.arena_bytes <= cap {
                if opts.verify && check {
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
                host: small.host_bytes,
            });
        }
    }
    // Freed before the check (its memory is then reused rather than fresh pages faulted in).
    drop(g);
    if opts.verify && check {
        check_plan(&plan)?;
    }
    Ok(plan)
}

/// The largest gradient workspace a fused op gets without a cap: 1/256 of the persistent bytes
/// (parameters and optimizer state), at least 256 KiB.
pub fn default_chunk_bytes(persistent: u64) -> u64 {
    (persistent / 256).max(256 << 10)
}

/// Bytes of the parameters, optimizer state and accumulated gradients of `g`.
fn persistent_bytes(g: &Graph) -> u64 {
    g.nodes()
        .into_iter()
        .filter(|n| {
            matches!(
                g.node(*n).op,
                Op::Param { .. } | Op::OptState { .. } | Op::GradBuf { .. }
            )
        })
        .map(|n| g.ty((n, 0)).bytes())
        .sum()
}

/// Bytes of the gradient workspace (`gw`) of a chunked fused op, if `n` is one.
fn chunk_grad_bytes(g: &Graph, n: NodeIndex) -> Option<u64> {
    let rows = match &g.node(n).op {
        Op::Conv(ConvOp::Conv2dBwdWeightUpdate { chunk, .. })
        | Op::Dense(DenseOp::DenseBwdWeightUpdate { chunk, .. }) => {
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
        Some(Op::Conv(ConvOp::Conv2dBwdWeightUpdate { chunk, .. }))
        | Some(Op::Dense(DenseOp::DenseBwdWeightUpdate { chunk, .. }))
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
                Op::Conv(ConvOp::Conv2dBwdWeightUpdate { chunk, .. })
                | Op::Dense(DenseOp::DenseBwdWeightUpdate { chunk, .. }) => *chunk,
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
