//! The data-parallel (sharded, ZeRO stage 1) steps of the optimizer (`shard.cu.tera`): each is a
//! program of launches and collectives ([`Phase`]) that mirrors the CPU backend's
//! `runtime/src/cpu/shard.rs` step for step, on the same planned buffers:
//!
//! * a fused weight-gradient + update (`Dense`/`Conv2dBwdWeightUpdate`): per chunk of columns, the
//!   chunk's gradient into `gw`, its rows of this rank summed over the ranks, those rows updated;
//!   then every rank's rows gathered into the weight; with a bias, its column sums into `db`,
//!   summed on this rank's elements, updated and gathered;
//! * an unfused `Update`: this rank's elements of the gradient summed over the ranks into `gs`
//!   (unless already summed), updated, gathered;
//! * a `BiasGradUpdate`: as the fused bias;
//! * a `GradAllReduce` (clip_norm's): the all-reduce alone;
//! * sharded parameters (ZeRO stage 3): a `GatherShard`, this rank's rows of the parameter's home
//!   placed in the window, then every rank's gathered into it; a `KeepShard`, this rank's rows of
//!   an updated window copied back to the home.
//!
//! The gradient kernels here are plain one-thread-per-element sums in a fixed order: correct and
//! deterministic, not yet the tiled GEMMs of the single-process kernels.

use tera::Context;

use dmc_plan::op::{bias_chunks, ConvOp, DenseOp, Op, OptimOp, BIAS_CHUNK_ROWS};
use dmc_plan::shard::max_rows;
use dmc_plan::update::UpdateRule;

use super::common::{blocks, f32_lit, numel, Site, Spec};
use super::optim::rule_ctx;
use crate::error::CodegenError;
use crate::kernel::{Collective, Launch, Phase, Region};

const THREADS: u32 = 256;

/// A launch of entry `<entry>_<suffix>` over `n` threads (at least one block), at column `col0`.
fn launch(s: &Site, suffix: &str, n: usize, col0: usize) -> Result<Phase, CodegenError> {
    Ok(Phase::Launch(Launch {
        entry: suffix.into(),
        grid: [blocks(n, THREADS, s.name())?, 1, 1],
        block: [THREADS, 1, 1],
        col0: col0 as u64,
    }))
}

/// A grid dimension of `n` blocks (at least one), or the error of a grid too large.
fn grid_dim(n: usize, s: &Site) -> Result<u32, CodegenError> {
    u32::try_from(n.max(1))
        .ok()
        .filter(|&b| b <= 65535)
        .ok_or_else(|| CodegenError::Grid {
            kernel: s.name().into(),
            message: format!("{n} blocks of a tiled gradient"),
        })
}

fn spec_of(ctx: Context, program: Vec<Phase>) -> Spec {
    Spec {
        template: "shard.cu.tera",
        ctx,
        grid: [1, 1, 1],
        block: [THREADS, 1, 1],
        split: 1,
        outputs: 0,
        gemm: None,
        passes: Vec::new(),
        program,
        ranked: true,
    }
}

fn base_ctx(s: &Site, mode: &str, world: usize) -> Context {
    let mut ctx = Context::new();
    ctx.insert("kind", s.kind());
    ctx.insert("mode", mode);
    ctx.insert("world", &world);
    ctx.insert("threads", &THREADS);
    ctx.insert("bias", &false);
    ctx.insert("keep_old", &false);
    ctx
}

/// The context of a bias' column sums over `dy` (`[rows, c]` seen flat) in the plan's two-level
/// order.
fn bias_sum_ctx(ctx: &mut Context, dy: &[usize], c: usize) {
    let rows = numel(dy) / c.max(1);
    ctx.insert("c", &c);
    ctx.insert("rows", &rows);
    ctx.insert("rc", &BIAS_CHUNK_ROWS);
    ctx.insert("chunks", &bias_chunks(rows));
}

/// The bias' part of a program: its column sums into `db`, summed on this rank's elements (peers'
/// parts into `comm`), updated, gathered into `b` (unless `keep_rows`: sharded parameters).
fn bias_program(
    s: &Site,
    c: usize,
    world: usize,
    (b, db, comm): (usize, usize, usize),
    keep_rows: bool,
) -> Result<Vec<Phase>, CodegenError> {
    let mut program = vec![
        launch(s, "bias", c, 0)?,
        Phase::Collective(Collective::ReduceScatterRows {
            buf: Region::of(db),
            rows: c,
            cols: 1,
            tmp: Region::of(comm),
        }),
        launch(s, "bias_rows", max_rows(c, world), 0)?,
    ];
    if !keep_rows {
        program.push(Phase::Collective(Collective::AllGatherRows {
            buf: Region::of(b),
            rows: c,
            cols: 1,
        }));
    }
    Ok(program)
}

/// A fused weight-gradient + update of a weight seen as `[k, c]`, in chunks of `chunk` columns:
/// the slots are x, dy, w, the states, (b, the bias states), (w_old), gw, (cols), (db), comm.
#[allow(clippy::too_many_arguments)]
fn fused(
    s: &Site,
    mut ctx: Context,
    rule: &UpdateRule,
    (k, c, chunk): (usize, usize, usize),
    (bias, keep_old, cols_ws): (bool, bool, bool),
    (world, keep_rows): (usize, bool),
) -> Result<Spec, CodegenError> {
    let ns = rule.state_names().len();
    let b = 3 + ns;
    let after = b + if bias { 1 + ns } else { 0 };
    let gw = after + keep_old as usize;
    let db = gw + 1 + cols_ws as usize;
    let comm = db + bias as usize;
    let chunk = chunk.clamp(1, c.max(1));
    rule_ctx(&mut ctx, rule, "w", true);
    ctx.insert("mode", "fused");
    ctx.insert("k", &k);
    ctx.insert("c", &c);
    ctx.insert("chunk", &chunk);
    ctx.insert("bias", &bias);
    ctx.insert("keep_old", &keep_old);
    ctx.insert("bias_states", rule.bias_state_names());
    bias_sum_ctx(&mut ctx, s.shape(1)?, c);
    // the tiled gradient (one group) or one thread per element (grouped convolutions, whose
    // rows differ by the column's group)
    let tiled = !matches!(ctx.get("groups").and_then(|g| g.as_u64()), Some(g) if g != 1);
    ctx.insert("tiled", &tiled);
    let mut program = Vec::new();
    for c0 in (0..c).step_by(chunk) {
        let nc = chunk.min(c - c0);
        program.push(if tiled {
            Phase::Launch(Launch {
                entry: "grad".into(),
                grid: [
                    grid_dim(k.div_ceil(64), s)?,
                    grid_dim(chunk.div_ceil(64), s)?,
                    1,
                ],
                block: [256, 1, 1],
                col0: c0 as u64,
            })
        } else {
            launch(s, "grad", k * nc, c0)?
        });
        program.push(Phase::Collective(Collective::ReduceScatterRows {
            buf: Region::of(gw),
            rows: k,
            cols: nc,
            tmp: Region::of(comm),
        }));
        program.push(launch(s, "rows", max_rows(k, world) * nc, c0)?);
    }
    if !keep_rows {
        program.push(Phase::Collective(Collective::AllGatherRows {
            buf: Region::of(2),
            rows: k,
            cols: c,
        }));
    }
    if bias {
        program.extend(bias_program(s, c, world, (b, db, comm), keep_rows)?);
    }
    Ok(spec_of(ctx, program))
}

/// The program of a sharded step (`op.shards() > 1`, or a `GradAllReduce`).
pub(crate) fn spec(s: &Site) -> Result<Spec, CodegenError> {
    let world = s.k.op.shards();
    match &s.k.op {
        Op::Dense(DenseOp::DenseBwdWeightUpdate {
            rule,
            chunk,
            bias,
            keep_rows,
            ..
        }) => {
            let (x, w) = (s.shape(0)?, s.shape(2)?);
            s.rank(w, 2, "w")?;
            let mut ctx = base_ctx(s, "fused", world);
            ctx.insert("family", "dense");
            ctx.insert("m", &x.first().copied().unwrap_or(0));
            ctx.insert("mr", &x.first().copied().unwrap_or(0));
            fused(
                s,
                ctx,
                rule,
                (w[0], w[1], *chunk),
                (*bias, false, false),
                (world, *keep_rows),
            )
        }
        Op::Conv(ConvOp::Conv2dBwdWeightUpdate {
            geom,
            rule,
            chunk,
            bias,
            keep_old,
            keep_rows,
            ..
        }) => {
            let (x, dy, w) = (s.shape(0)?, s.shape(1)?, s.shape(2)?);
            s.rank(x, 4, "x")?;
            s.rank(dy, 4, "dy")?;
            s.rank(w, 4, "w")?;
            let groups = geom.groups.max(1);
            let mut ctx = base_ctx(s, "fused", world);
            for (name, v) in [
                ("nb", x[0]),
                ("h", x[1]),
                ("w", x[2]),
                ("ci", x[3]),
                ("ho", dy[1]),
                ("wo", dy[2]),
                ("kw", geom.kw),
                ("stride_h", geom.stride_h),
                ("stride_w", geom.stride_w),
                ("dil_h", geom.dil_h),
                ("dil_w", geom.dil_w),
                ("pad_top", geom.pad_top),
                ("pad_left", geom.pad_left),
                ("cig", x[3] / groups),
                ("cog", dy[3] / groups),
            ] {
                ctx.insert(name, &v);
            }
            ctx.insert("family", "conv");
            ctx.insert("groups", &groups);
            ctx.insert("mr", &(dy[0] * dy[1] * dy[2]));
            let c = w[3];
            fused(
                s,
                ctx,
                rule,
                (numel(w) / c.max(1), c, *chunk),
                (*bias, *keep_old, true),
                (world, *keep_rows),
            )
        }
        Op::Optim(OptimOp::Update {
            rule,
            zero_grad,
            summed,
            keep_rows,
            ..
        }) => {
            let n = numel(s.shape(0)?);
            let ns = rule.state_names().len();
            let clip = rule.clip_norm();
            let gs = 2 + ns + clip.is_some() as usize;
            let shard = max_rows(n, world);
            let mut ctx = base_ctx(s, "update", world);
            rule_ctx(&mut ctx, rule, "w", false);
            ctx.insert("n", &n);
            ctx.insert("summed", summed);
            ctx.insert("zero_grad", zero_grad);
            match clip {
                Some(m) => ctx.insert("clip_norm", &f32_lit(m)),
                None => ctx.insert("clip_norm", &false),
            }
            let mut program = Vec::new();
            if !summed {
                program.push(Phase::Collective(Collective::ReduceInto {
                    src: Region::of(1),
                    n,
                    dst: Region::of(gs),
                    tmp: Region {
                        slot: gs,
                        at: shard,
                    },
                }));
            }
            program.push(launch(s, "rows", shard, 0)?);
            if *zero_grad {
                program.push(launch(s, "zero", n, 0)?);
            }
            if !keep_rows {
                program.push(Phase::Collective(Collective::AllGatherRows {
                    buf: Region::of(0),
                    rows: n,
                    cols: 1,
                }));
            }
            Ok(spec_of(ctx, program))
        }
        Op::Optim(OptimOp::BiasGradUpdate {
            rule, keep_rows, ..
        }) => {
            let c = numel(s.shape(1)?);
            let ns = rule.state_names().len();
            let mut ctx = base_ctx(s, "bias", world);
            rule_ctx(&mut ctx, rule, "b", false);
            ctx.insert("bias_states", rule.state_names());
            bias_sum_ctx(&mut ctx, s.shape(0)?, c);
            let program = bias_program(s, c, world, (1, 2 + ns, 3 + ns), *keep_rows)?;
            Ok(spec_of(ctx, program))
        }
        Op::Optim(OptimOp::GradAllReduce { .. }) => {
            let n = numel(s.shape(0)?);
            let mut ctx = base_ctx(s, "all_reduce", world);
            ctx.insert("n", &n);
            Ok(spec_of(
                ctx,
                vec![Phase::Collective(Collective::AllReduce {
                    buf: Region::of(0),
                    n,
                    tmp: Region::of(1),
                })],
            ))
        }
        Op::Optim(OptimOp::GatherShard { layout }) => {
            let mut ctx = base_ctx(s, "gather", world);
            ctx.insert("rows", &layout.rows);
            ctx.insert("cols", &layout.cols);
            let own = max_rows(layout.rows, world) * layout.cols;
            let program = vec![
                launch(s, "place", own, 0)?,
                Phase::Collective(Collective::AllGatherRows {
                    buf: Region::of(1),
                    rows: layout.rows,
                    cols: layout.cols,
                }),
            ];
            Ok(spec_of(ctx, program))
        }
        Op::Optim(OptimOp::KeepShard { layout }) => {
            let mut ctx = base_ctx(s, "keep", world);
            ctx.insert("rows", &layout.rows);
            ctx.insert("cols", &layout.cols);
            let own = max_rows(layout.rows, world) * layout.cols;
            Ok(spec_of(ctx, vec![launch(s, "keep", own, 0)?]))
        }
        _ => Err(CodegenError::Shape {
            kernel: s.name().into(),
            message: format!(
                "a sharded step of op `{}` (only optimizer updates and parameter shards are sharded)",
                s.kind()
            ),
        }),
    }
}
