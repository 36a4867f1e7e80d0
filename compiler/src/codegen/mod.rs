//! Kernel IR -> CUDA C: one `.cu` translation unit per plan kernel, rendered from the `tera`
//! templates in `templates/` (embedded at build time).
//!
//! * Shapes are baked in as constants (the plan is static); buffer pointers are kernel parameters
//!   that the backend sets to `arena base + planned offset`.
//! * The parameter list of every kernel is rendered from [`kernel_params`], which is derived from
//!   the op's one [`Signature`] (plus the two per-step scalars `seed` and `step`); the CUDA backend
//!   builds its launch arguments by iterating the same [`kernel_params`]. Nothing is written twice.
//! * [`render_kernel`] matches every [`Op`] exhaustively: a new op does not compile until it has a
//!   template and an arm here (adding one = one template file + one arm in `spec`).

pub mod zoo;

use std::fmt::Write as _;

use serde::Serialize;
use tera::{Context, Tera};

use crate::op::{ConvGeom, DType, Op, PoolGeom, Role, Signature, UpdateRule};
use crate::plan::{Kernel, Mode, Plan};

/// The templates, embedded (name, text). `prelude.cuh.tera`, `gemm.cuh.tera` and
/// `update.cuh.tera` (the per-element optimizer update) are included by the others.
pub const TEMPLATES: &[(&str, &str)] = &[
    (
        "prelude.cuh.tera",
        include_str!("../../../templates/prelude.cuh.tera"),
    ),
    (
        "gemm.cuh.tera",
        include_str!("../../../templates/gemm.cuh.tera"),
    ),
    (
        "elementwise.cu.tera",
        include_str!("../../../templates/elementwise.cu.tera"),
    ),
    (
        "update.cuh.tera",
        include_str!("../../../templates/update.cuh.tera"),
    ),
    (
        "optim.cu.tera",
        include_str!("../../../templates/optim.cu.tera"),
    ),
    (
        "conv2d_fwd.cu.tera",
        include_str!("../../../templates/conv2d_fwd.cu.tera"),
    ),
    (
        "conv2d_bwd_data.cu.tera",
        include_str!("../../../templates/conv2d_bwd_data.cu.tera"),
    ),
    (
        "conv2d_bwd_weight.cu.tera",
        include_str!("../../../templates/conv2d_bwd_weight.cu.tera"),
    ),
    (
        "matmul.cu.tera",
        include_str!("../../../templates/matmul.cu.tera"),
    ),
    (
        "pool.cu.tera",
        include_str!("../../../templates/pool.cu.tera"),
    ),
    (
        "loss.cu.tera",
        include_str!("../../../templates/loss.cu.tera"),
    ),
    (
        "bias_grad.cu.tera",
        include_str!("../../../templates/bias_grad.cu.tera"),
    ),
];

/// Threads per block of the one-thread-per-element kernels.
pub const ELEM_THREADS: u32 = 256;
/// Threads of the single-block reductions (losses).
pub const REDUCE_THREADS: u32 = 256;

/// Tile sizes of the shared-memory GEMM (`gemm.cuh.tera`): a block computes `bm x bn` outputs
/// with `(bm/tm) * (bn/tn)` threads, stepping `bk` along the reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GemmTile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
}

/// k-tiles per partial sum of a long GEMM reduction (see `gemm.cuh.tera`).
pub const CHUNK_TILES: usize = 32;

/// The tile every GEMM-shaped kernel uses (256 threads, 4x4 outputs each).
pub const DEFAULT_TILE: GemmTile = GemmTile {
    bm: 64,
    bn: 64,
    bk: 16,
    tm: 4,
    tn: 4,
};

#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("template error in `{template}` for kernel `{kernel}`: {message}")]
    Template {
        template: String,
        kernel: String,
        message: String,
    },
    #[error("kernel `{kernel}`: {message}")]
    Shape { kernel: String, message: String },
    #[error("kernel `{kernel}`: launch grid too large ({message})")]
    Grid { kernel: String, message: String },
}

/// Where a kernel parameter's value comes from at launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ArgSource {
    /// The step's buffer for signature slot `i` (`arena base + offset`).
    Buffer(usize),
    /// The run's seed (dropout).
    Seed,
    /// The 1-based step counter (dropout, Adam's t).
    Step,
}

/// One parameter of a generated kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelParam {
    pub name: String,
    /// The C type, e.g. `const float*` or `const u64`.
    pub ty: String,
    /// The C declaration, e.g. `const float* __restrict__ x`.
    pub decl: String,
    pub source: ArgSource,
}

/// The parameters of the kernel for `sig`, in order: one pointer per signature slot (in signature
/// order; `const` for `In`), then `u64 seed, u64 step`. The single source of both the generated
/// parameter list and the backend's launch arguments.
pub fn kernel_params(sig: &Signature) -> Vec<KernelParam> {
    let mut v: Vec<KernelParam> = sig
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ty = match p.dtype {
                DType::F32 => "float",
                DType::I32 => "int",
                DType::U8 => "unsigned char",
            };
            let cst = if p.role == Role::In { "const " } else { "" };
            KernelParam {
                name: p.name.clone(),
                ty: format!("{cst}{ty}*"),
                decl: format!("{cst}{ty}* __restrict__ {}", p.name),
                source: ArgSource::Buffer(i),
            }
        })
        .collect();
    for (name, source) in [("seed", ArgSource::Seed), ("step", ArgSource::Step)] {
        v.push(KernelParam {
            name: name.into(),
            ty: "const u64".into(),
            decl: format!("const u64 {name}"),
            source,
        });
    }
    v
}

/// One launch of an entry point of a kernel's translation unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Launch {
    pub entry: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

/// A rendered kernel: its source and launch geometry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CudaKernel {
    /// The plan kernel's id and name.
    pub id: usize,
    pub name: String,
    /// The `extern "C"` entry point.
    pub entry: String,
    /// The template it was rendered from.
    pub template: &'static str,
    pub source: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Launch parameters (see [`kernel_params`]).
    pub params: Vec<KernelParam>,
    /// A second entry of the same translation unit, launched right after `entry` with the same
    /// arguments: the fixed-order reduction of a split-K GEMM's partial sums (see [`split_k`]).
    pub then: Option<Launch>,
}

impl CudaKernel {
    /// Every launch of one step, in order.
    pub fn launches(&self) -> Vec<Launch> {
        let mut v = vec![Launch {
            entry: self.entry.clone(),
            grid: self.grid,
            block: self.block,
        }];
        v.extend(self.then.clone());
        v
    }

    /// The launch arguments, one 8-byte value per parameter of [`kernel_params`] in order: the
    /// pointer of signature slot `i` from `ptrs[i]`, then `seed` and `step`. The CUDA backend and
    /// the host emulator both launch with exactly these values.
    pub fn launch_values(&self, ptrs: &[u64], seed: u64, step: u64) -> Vec<u64> {
        self.params
            .iter()
            .map(|p| match p.source {
                ArgSource::Buffer(i) => ptrs[i],
                ArgSource::Seed => seed,
                ArgSource::Step => step,
            })
            .collect()
    }
}

/// The kernel's template and its context, without the common entries.
struct Spec {
    template: &'static str,
    ctx: Context,
    grid: [u32; 3],
    block: [u32; 3],
    /// Split-K: the number of k ranges (grid z) when > 1; a `_reduce` entry follows, one thread
    /// per GEMM output.
    split: usize,
    outputs: usize,
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// A C float literal that reads back as exactly `v`.
pub fn f32_lit(v: f32) -> String {
    if v.is_nan() {
        "__int_as_float(0x7fc00000)".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "__int_as_float(0x7f800000)"
        } else {
            "(-__int_as_float(0x7f800000))"
        }
        .into()
    } else {
        let s = format!("{v:?}");
        if s.contains(['.', 'e', 'E']) {
            format!("{s}f")
        } else {
            format!("{s}.0f")
        }
    }
}

fn blocks(n: usize, per: u32, kernel: &str) -> Result<u32, CodegenError> {
    let b = n.div_ceil(per as usize).max(1);
    u32::try_from(b)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| CodegenError::Grid {
            kernel: kernel.into(),
            message: format!("{n} elements"),
        })
}

fn elementwise(
    template: &'static str,
    kind: &str,
    n: usize,
    name: &str,
) -> Result<Spec, CodegenError> {
    let mut ctx = Context::new();
    ctx.insert("kind", kind);
    ctx.insert("n", &n);
    ctx.insert("threads", &ELEM_THREADS);
    ctx.insert("fused_update", &false);
    Ok(Spec {
        template,
        ctx,
        grid: [blocks(n, ELEM_THREADS, name)?, 1, 1],
        block: [ELEM_THREADS, 1, 1],
        split: 1,
        outputs: 0,
    })
}

/// Blocks a GEMM launch should have at least before split-K is worth it (an H100/H200 has 132 SMs).
pub const SPLIT_TARGET_BLOCKS: usize = 256;
/// k-tiles per split at least, so a block's loop outweighs writing its partial tile.
pub const SPLIT_MIN_TILES: usize = 32;
/// Most splits.
pub const SPLIT_MAX: usize = 64;

/// The split-K factor of a `gm x gn x gk` GEMM whose partial sums (`split x gm x gn` floats) must
/// fit a workspace of `ws_elems` floats: 1 (no split) when the grid already has enough blocks or
/// the reduction is short, else as many splits as bring the grid to [`SPLIT_TARGET_BLOCKS`].
pub fn split_k(gm: usize, gn: usize, gk: usize, ws_elems: usize) -> usize {
    let t = DEFAULT_TILE;
    let blocks = gm.div_ceil(t.bm as usize).max(1) * gn.div_ceil(t.bn as usize).max(1);
    if blocks * 2 >= SPLIT_TARGET_BLOCKS || gm * gn == 0 {
        return 1;
    }
    let by_k = gk / (t.bk as usize * SPLIT_MIN_TILES);
    let by_ws = ws_elems / (gm * gn);
    let s = SPLIT_TARGET_BLOCKS
        .div_ceil(blocks)
        .min(by_k)
        .min(by_ws)
        .min(SPLIT_MAX);
    if s < 2 {
        return 1;
    }
    // equal k ranges of whole tiles; the last range may be shorter, none empty
    let ks = gk.div_ceil(s).div_ceil(t.bk as usize) * t.bk as usize;
    gk.div_ceil(ks)
}

/// `DMC_SPLIT_K=off` renders every GEMM unsplit: the baseline of a split-K speed comparison on a
/// GPU (`scripts/gpu-check.sh` times both in one run).
pub fn split_k_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("DMC_SPLIT_K").map_or(true, |v| v != "off"))
}

/// `split` > 1: a split-K GEMM whose partial sums go to the workspace parameter `partial`.
fn gemm(
    template: &'static str,
    mut ctx: Context,
    (gm, gn, gk): (usize, usize, usize),
    (a_k_fastest, b_k_fastest): (bool, bool),
    (split, partial): (usize, &str),
    name: &str,
) -> Result<Spec, CodegenError> {
    let t = DEFAULT_TILE;
    let split = if split_k_enabled() { split } else { 1 };
    let ks = if split > 1 {
        gk.div_ceil(split).div_ceil(t.bk as usize) * t.bk as usize
    } else {
        gk
    };
    ctx.insert("split", &split);
    ctx.insert("ks", &ks);
    ctx.insert("partial", partial);
    ctx.insert("reduce_threads", &ELEM_THREADS);
    ctx.insert("gm", &gm);
    ctx.insert("gn", &gn);
    ctx.insert("gk", &gk);
    ctx.insert("bm", &t.bm);
    ctx.insert("bn", &t.bn);
    ctx.insert("bk", &t.bk);
    ctx.insert("tm", &t.tm);
    ctx.insert("tn", &t.tn);
    ctx.insert("a_k_fastest", &a_k_fastest);
    // long reductions: two-level fp32 summation (chunks of CHUNK_TILES k-tiles)
    let chunk = if ks > CHUNK_TILES * t.bk as usize * 8 {
        CHUNK_TILES
    } else {
        0
    };
    ctx.insert("chunk_tiles", &chunk);
    // 32-bit index decomposition when every GEMM index fits (cheaper div/mod, no spills)
    let small = [gm, gn, gk].iter().all(|&v| v < (1usize << 31));
    ctx.insert("idx", if small { "unsigned" } else { "u64" });
    ctx.insert("sidx", if small { "int" } else { "i64" });
    ctx.insert("b_k_fastest", &b_k_fastest);
    // a fused weight-gradient + update kernel sets this (and the `update.cuh.tera` entries)
    ctx.insert("fused_update", &false);
    let gy = gn.div_ceil(t.bn as usize).max(1);
    if gy > 65535 {
        return Err(CodegenError::Grid {
            kernel: name.into(),
            message: format!("{gn} GEMM columns"),
        });
    }
    Ok(Spec {
        template,
        ctx,
        grid: [blocks(gm, t.bm, name)?, gy as u32, split as u32],
        block: [(t.bm / t.tm) * (t.bn / t.tn), 1, 1],
        split,
        outputs: gm * gn,
    })
}

fn conv_ctx(kind: &str, g: &ConvGeom, x: &[usize], y: &[usize], bias: bool) -> Context {
    let mut ctx = Context::new();
    ctx.insert("kind", kind);
    ctx.insert("nb", &x[0]);
    ctx.insert("h", &x[1]);
    ctx.insert("w", &x[2]);
    ctx.insert("ci", &x[3]);
    ctx.insert("ho", &y[1]);
    ctx.insert("wo", &y[2]);
    ctx.insert("co", &y[3]);
    ctx.insert("kh", &g.kh);
    ctx.insert("kw", &g.kw);
    ctx.insert("stride", &g.stride);
    ctx.insert("pad_top", &g.pad_top);
    ctx.insert("pad_left", &g.pad_left);
    ctx.insert("bias", &bias);
    ctx
}

fn pool(
    kind: &str,
    g: &PoolGeom,
    x: &[usize],
    y: &[usize],
    threads_over: usize,
    name: &str,
) -> Result<Spec, CodegenError> {
    let mut s = elementwise("pool.cu.tera", kind, threads_over, name)?;
    s.ctx.insert("nb", &x[0]);
    s.ctx.insert("h", &x[1]);
    s.ctx.insert("w", &x[2]);
    s.ctx.insert("c", &x[3]);
    s.ctx.insert("ho", &y[1]);
    s.ctx.insert("wo", &y[2]);
    s.ctx.insert("size", &g.size);
    let big = [numel(x), numel(y)].iter().any(|&v| v >= (1usize << 31));
    s.ctx.insert("idx", if big { "u64" } else { "unsigned" });
    s.ctx.insert("stride", &g.stride);
    Ok(s)
}

/// The context of `update.cuh.tera` for `rule`, updating the buffer `target` (`w` or `b`) and the
/// state slots named by [`UpdateRule::state_names`], and `fused_update` (a gradient kernel that
/// applies the update itself instead of storing the gradient).
fn rule_ctx(ctx: &mut Context, rule: &UpdateRule, target: &str, fused: bool) {
    ctx.insert("target", target);
    ctx.insert("states", rule.state_names());
    ctx.insert("fused_update", &fused);
    match *rule {
        UpdateRule::Sgd {
            lr,
            momentum,
            weight_decay,
            nesterov,
        } => {
            ctx.insert("rule", "sgd");
            ctx.insert("lr", &f32_lit(lr));
            ctx.insert("momentum", &(momentum != 0.0));
            ctx.insert("momentum_value", &f32_lit(momentum));
            ctx.insert("weight_decay", &f32_lit(weight_decay));
            ctx.insert("nesterov", &nesterov);
        }
        UpdateRule::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
        } => {
            ctx.insert("rule", "adam");
            ctx.insert("lr", &f32_lit(lr));
            ctx.insert("beta1", &f32_lit(beta1));
            ctx.insert("beta2", &f32_lit(beta2));
            ctx.insert("eps", &f32_lit(eps));
            ctx.insert("weight_decay", &f32_lit(weight_decay));
            ctx.insert("decoupled", &decoupled);
        }
    }
}

/// Index and name of the first `InOut` slot of `op`'s signature (the buffer an in-place op writes).
fn inout_slot(op: &Op) -> (usize, String) {
    op.signature()
        .params
        .into_iter()
        .enumerate()
        .find(|(_, p)| p.role == Role::InOut)
        .map(|(i, p)| (i, p.name))
        .unwrap_or_default()
}

fn rank(s: &[usize], r: usize, kernel: &str, what: &str) -> Result<(), CodegenError> {
    if s.len() != r {
        return Err(CodegenError::Shape {
            kernel: kernel.into(),
            message: format!("{what} has shape {s:?}, expected rank {r}"),
        });
    }
    Ok(())
}

/// The template and context of one kernel. Exhaustive over [`Op`]: `None` for ops without a kernel.
fn spec(k: &Kernel, mode: Mode) -> Result<Option<Spec>, CodegenError> {
    let s = &k.arg_shapes;
    let name = k.name.as_str();
    let kind = k.op.kind_name();
    let shape = |i: usize| -> Result<&[usize], CodegenError> {
        s.get(i)
            .map(|v| v.as_slice())
            .ok_or_else(|| CodegenError::Shape {
                kernel: name.into(),
                message: format!("missing the shape of argument {i}"),
            })
    };
    let spec = match &k.op {
        Op::Input { .. } | Op::Param { .. } | Op::OptState { .. } | Op::Reshape => return Ok(None),
        Op::Conv2d { geom, bias } => {
            let (x, y) = (shape(0)?, shape(if *bias { 3 } else { 2 })?);
            rank(x, 4, name, "x")?;
            rank(y, 4, name, "y")?;
            let ctx = conv_ctx(kind, geom, x, y, *bias);
            let gk = geom.kh * geom.kw * x[3];
            let gm = y[0] * y[1] * y[2];
            // the im2col workspace (the CPU's) holds the partial sums of a split-K
            let ws = numel(shape(if *bias { 4 } else { 3 })?);
            gemm(
                "conv2d_fwd.cu.tera",
                ctx,
                (gm, y[3], gk),
                (true, false),
                (split_k(gm, y[3], gk, ws), "cols"),
                name,
            )?
        }
        Op::Conv2dBwdData { geom } => {
            let (dy, dx) = (shape(0)?, shape(2)?);
            rank(dy, 4, name, "dy")?;
            rank(dx, 4, name, "dx")?;
            let ctx = conv_ctx(kind, geom, dx, dy, false);
            let gk = geom.kh * geom.kw * dy[3];
            gemm(
                "conv2d_bwd_data.cu.tera",
                ctx,
                (dx[0] * dx[1] * dx[2], dx[3], gk),
                (true, true),
                (1, ""), // no workspace in its signature
                name,
            )?
        }
        Op::Conv2dBwdWeight { geom } | Op::Conv2dBwdWeightUpdate { geom, .. } => {
            // x, dy, then dw (or the updated w): the same GEMM; the fused kernel applies the
            // update where the unfused one stores the gradient (its workspaces stay unused)
            let (x, dy) = (shape(0)?, shape(1)?);
            rank(x, 4, name, "x")?;
            rank(dy, 4, name, "dy")?;
            let ctx = conv_ctx(kind, geom, x, dy, false);
            let gm = geom.kh * geom.kw * x[3];
            let gk = dy[0] * dy[1] * dy[2];
            // the largest workspace (the CPU's im2col `cols`, or the fused op's gradient chunk `gw`)
            // holds the partial sums of a split-K
            let (ws_slot, ws) =
                k.op.signature()
                    .params
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.role == Role::Workspace)
                    .map(|(i, p)| (p.name.clone(), k.arg_shapes.get(i).map_or(0, |s| numel(s))))
                    .max_by_key(|(_, n)| *n)
                    .unwrap_or_default();
            let mut sp = gemm(
                "conv2d_bwd_weight.cu.tera",
                ctx,
                (gm, dy[3], gk),
                (false, false),
                (split_k(gm, dy[3], gk, ws), &ws_slot),
                name,
            )?;
            if let Op::Conv2dBwdWeightUpdate { rule, .. } = &k.op {
                rule_ctx(&mut sp.ctx, rule, "w", true);
            }
            sp
        }
        Op::Dense { .. }
        | Op::DenseBwdData
        | Op::DenseBwdWeight
        | Op::DenseBwdWeightUpdate { .. } => {
            let (w, xi) = match &k.op {
                Op::Dense { .. } => (shape(1)?, 0),
                Op::DenseBwdData => (shape(1)?, 2),
                _ => (shape(2)?, 0),
            };
            rank(w, 2, name, "w")?;
            let (kin, mout) = (w[0], w[1]);
            let rows = numel(shape(xi)?) / kin.max(1);
            let mut ctx = Context::new();
            ctx.insert("kind", kind);
            ctx.insert("k_in", &kin);
            ctx.insert("m_out", &mout);
            ctx.insert("rows", &rows);
            match &k.op {
                Op::Dense { bias } => {
                    ctx.insert("bias", bias);
                    gemm(
                        "matmul.cu.tera",
                        ctx,
                        (rows, mout, kin),
                        (true, false),
                        (1, ""),
                        name,
                    )?
                }
                Op::DenseBwdData => gemm(
                    "matmul.cu.tera",
                    ctx,
                    (rows, kin, mout),
                    (true, true),
                    (1, ""),
                    name,
                )?,
                _ => {
                    // dense_bwd_weight, or fused with the update (the workspace stays unused)
                    let mut sp = gemm(
                        "matmul.cu.tera",
                        ctx,
                        (kin, mout, rows),
                        (false, false),
                        (1, ""),
                        name,
                    )?;
                    if let Op::DenseBwdWeightUpdate { rule, .. } = &k.op {
                        rule_ctx(&mut sp.ctx, rule, "w", true);
                    }
                    sp
                }
            }
        }
        Op::MaxPool { geom } | Op::AvgPool { geom } => {
            let (x, y) = (shape(0)?, shape(1)?);
            rank(x, 4, name, "x")?;
            rank(y, 4, name, "y")?;
            pool(kind, geom, x, y, numel(y), name)?
        }
        Op::MaxPoolBwd { geom } | Op::AvgPoolBwd { geom } => {
            let (dy, dx) = (
                shape(0)?,
                shape(if matches!(k.op, Op::MaxPoolBwd { .. }) {
                    2
                } else {
                    1
                })?,
            );
            rank(dy, 4, name, "dy")?;
            rank(dx, 4, name, "dx")?;
            pool(kind, geom, dx, dy, numel(dx), name)?
        }
        Op::GlobalAvgPool => {
            let x = shape(0)?;
            rank(x, 4, name, "x")?;
            let g = PoolGeom { size: 1, stride: 1 };
            pool(kind, &g, x, x, x[0] * x[3], name)?
        }
        Op::GlobalAvgPoolBwd => {
            let dx = shape(1)?;
            rank(dx, 4, name, "dx")?;
            let mut sp = elementwise("elementwise.cu.tera", kind, numel(dx), name)?;
            sp.ctx.insert("c", &dx[3]);
            sp.ctx.insert("hw", &(dx[1] * dx[2]));
            sp
        }
        Op::Unary(_) | Op::UnaryBwd(_) | Op::Add | Op::MseLossBwd => {
            let out = k.arg_shapes.len() - 1;
            let mut sp = elementwise("elementwise.cu.tera", kind, numel(shape(out)?), name)?;
            let (inp, out) = match &k.op {
                Op::UnaryBwd(_) => ("dy", "dx"),
                _ => ("x", "y"),
            };
            sp.ctx.insert("inp", inp);
            sp.ctx.insert("out", out);
            sp
        }
        // in place: the out-of-place formulas with the written input as the output
        Op::UnaryInPlace(_) | Op::UnaryBwdInPlace(_) | Op::AddInPlace => {
            let (out, io) = inout_slot(&k.op);
            let mut sp = elementwise("elementwise.cu.tera", kind, numel(shape(out)?), name)?;
            sp.ctx.insert("inp", &io);
            sp.ctx.insert("out", &io);
            sp
        }
        Op::Dropout { p, salt }
        | Op::DropoutBwd { p, salt }
        | Op::DropoutInPlace { p, salt }
        | Op::DropoutBwdInPlace { p, salt } => {
            let (inp, out) = match &k.op {
                Op::Dropout { .. } => ("x", "y"),
                Op::DropoutBwd { .. } => ("dy", "dx"),
                Op::DropoutInPlace { .. } => ("x", "x"),
                _ => ("dy", "dy"),
            };
            let n = numel(shape(k.arg_shapes.len().saturating_sub(1))?);
            let mut sp = elementwise("elementwise.cu.tera", kind, n, name)?;
            sp.ctx.insert("inp", inp);
            sp.ctx.insert("out", out);
            sp.ctx.insert("p", &f32_lit(*p));
            sp.ctx.insert("salt", salt);
            sp.ctx.insert("eval", &(mode == Mode::Eval));
            sp
        }
        Op::MseLoss => {
            let mut ctx = Context::new();
            ctx.insert("kind", kind);
            ctx.insert("n", &numel(shape(0)?));
            ctx.insert("threads", &REDUCE_THREADS);
            Spec {
                template: "loss.cu.tera",
                ctx,
                grid: [1, 1, 1],
                block: [REDUCE_THREADS, 1, 1],
                split: 1,
                outputs: 0,
            }
        }
        Op::CrossEntropyLoss | Op::CrossEntropyLossBwd => {
            let l = shape(0)?;
            rank(l, 2, name, "logits")?;
            let mut sp = if matches!(k.op, Op::CrossEntropyLoss) {
                let mut ctx = Context::new();
                ctx.insert("kind", kind);
                ctx.insert("threads", &REDUCE_THREADS);
                Spec {
                    template: "loss.cu.tera",
                    ctx,
                    grid: [1, 1, 1],
                    block: [REDUCE_THREADS, 1, 1],
                    split: 1,
                    outputs: 0,
                }
            } else {
                elementwise("loss.cu.tera", kind, l[0], name)?
            };
            sp.ctx.insert("rows", &l[0]);
            sp.ctx.insert("classes", &l[1]);
            sp
        }
        Op::BiasGrad | Op::BiasGradUpdate { .. } => {
            // dy, then db (or the updated b): the fused kernel applies the update to each column
            // sum instead of storing it (its workspace `db` stays unused)
            let (dy, db) = (shape(0)?, shape(1)?);
            let c = numel(db);
            let mut sp = elementwise("bias_grad.cu.tera", kind, c, name)?;
            sp.ctx.insert("c", &c);
            sp.ctx.insert("rows", &(numel(dy) / c.max(1)));
            if let Op::BiasGradUpdate { rule } = &k.op {
                rule_ctx(&mut sp.ctx, rule, "b", true);
            }
            sp
        }
        Op::SgdUpdate { .. } | Op::AdamUpdate { .. } => {
            let mut sp = elementwise("optim.cu.tera", kind, numel(shape(0)?), name)?;
            let rule = UpdateRule::of(&k.op).expect("an update op");
            rule_ctx(&mut sp.ctx, &rule, "w", false);
            sp
        }
    };
    Ok(Some(spec))
}

fn tera() -> Result<Tera, CodegenError> {
    let mut t = Tera::default();
    t.add_raw_templates(TEMPLATES.iter().copied())
        .map_err(|e| CodegenError::Template {
            template: "(all)".into(),
            kernel: String::new(),
            message: error_chain(&e),
        })?;
    Ok(t)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let _ = write!(s, ": {c}");
        src = c.source();
    }
    s
}

/// The C identifier of a kernel's entry point.
pub fn entry_name(k: &Kernel) -> String {
    let mut s = String::from("dmc_");
    s.extend(
        k.name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
    );
    s
}

/// Renders one kernel (`None` for leaves and `Reshape`, which have no kernel). `mode` is the plan's
/// (dropout is the identity in `Eval`).
pub fn render_kernel(k: &Kernel, mode: Mode) -> Result<Option<CudaKernel>, CodegenError> {
    render_with(&tera()?, k, mode)
}

fn render_with(t: &Tera, k: &Kernel, mode: Mode) -> Result<Option<CudaKernel>, CodegenError> {
    let Some(Spec {
        template,
        mut ctx,
        grid,
        block,
        split,
        outputs,
    }) = spec(k, mode)?
    else {
        return Ok(None);
    };
    let params = kernel_params(&k.op.signature());
    let entry = entry_name(k);
    let decls: Vec<&str> = params.iter().map(|p| p.decl.as_str()).collect();
    ctx.insert("name", &k.name);
    ctx.insert("entry", &entry);
    ctx.insert("params", &decls.join(", "));
    let source = t
        .render(template, &ctx)
        .map_err(|e| CodegenError::Template {
            template: template.into(),
            kernel: k.name.clone(),
            message: error_chain(&e),
        })?;
    let then = if split > 1 {
        Some(Launch {
            entry: format!("{entry}_reduce"),
            grid: [blocks(outputs, ELEM_THREADS, &k.name)?, 1, 1],
            block: [ELEM_THREADS, 1, 1],
        })
    } else {
        None
    };
    Ok(Some(CudaKernel {
        id: k.id,
        name: k.name.clone(),
        entry,
        template,
        source,
        grid,
        block,
        params,
        then,
    }))
}

/// Renders every kernel of the plan that has one, in plan order.
pub fn render_plan(plan: &Plan) -> Result<Vec<CudaKernel>, CodegenError> {
    let t = tera()?;
    let mut out = Vec::new();
    for k in &plan.kernels {
        if let Some(c) = render_with(&t, k, plan.mode)? {
            out.push(c);
        }
    }
    Ok(out)
}
