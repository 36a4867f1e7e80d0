//! Exploring caps: the memory / recompute trade-off curve ([`sweep`]) and the largest batch that
//! fits a cap ([`max_batch`]), each a series of compilations.

use dmc_grammar::model::Model;

use crate::cost;
use crate::ctx::{Ctx, RematMode, Strategy};
use crate::error::CompileError;
use crate::fit::{compile, compile_with, recompute_flops};
use crate::options::{context, CompileOptions};
use crate::plan::Plan;

/// One point of the memory / recompute trade-off ([`sweep`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SweepPoint {
    pub cap: u64,
    /// dmc's plan at this cap: its arena and recompute FLOPs in % of the step.
    pub arena: u64,
    pub recompute_pct: f64,
    /// dmc's plan's step time predicted by the CPU time model (`opts.rates`), in seconds.
    pub predicted_s: f64,
    /// sqrt(n) checkpointing at this cap (`None`: does not fit).
    pub sqrt_pct: Option<f64>,
    /// Checkpoint-all (no recomputation): 0 when it fits.
    pub keep_all_pct: Option<f64>,
    /// dmc's plan's host store: streamed parameters and optimizer state, offloaded activations.
    pub host: u64,
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
    /// The predicted step time without a cap (seconds), and what the rates are.
    pub no_remat_s: f64,
    pub rates: String,
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
    let time = |p: &Plan| dmc_plan::cpu::plan_time(p, &opts.rates).step_s;
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
    let ctx = Ctx {
        remat: Strategy::SqrtN,
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
            predicted_s: time(&p),
            sqrt_pct: (sq.arena_bytes <= cap).then_some(sqrt_pct),
            keep_all_pct: (full.arena_bytes <= cap).then_some(0.0),
            host: p.host_bytes,
        });
    }
    Ok(Sweep {
        no_remat_arena: full.arena_bytes,
        min_arena,
        sqrt_arena: sq.arena_bytes,
        sqrt_pct,
        step_flops,
        no_remat_s: time(&full),
        rates: opts.rates.source.clone(),
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
