//! The static performance model: for every kernel of a plan, on a named GPU ([`gpus`]), its FLOPs,
//! the fewest global bytes it could move (each operand once), the bytes its tiling does move,
//! blocks, occupancy (from NVRTC's registers and shared memory, or estimated from the tile), waves,
//! the roofline floor and a predicted time; per step, the sum, the floor and their ratio. No GPU is
//! needed: it is how kernels are chosen and how a plan's step time is told before running it.
//!
//! The model is a latency-aware roofline. A GEMM kernel (`gemm.cuh.tera`) runs k-tiles one after
//! the other in each block: a tile's global loads cost a memory latency per dependent round of
//! loads, its inner loop costs the cycles of the SM's busiest pipe (FFMA issue, shared memory, or
//! instruction issue, with each operand's index arithmetic); the blocks resident on an SM hide each
//! other's latency. The baseline kernel (`--baseline-gemm`) alternates a tile's loads (a round per
//! element a thread loads: its load loops are not unrolled) and its arithmetic; the pipelined one
//! issues the next tile's staged loads together (one round) during the current one's arithmetic,
//! so a tile costs the longer of the two. The compiler ranks each GEMM's
//! candidate tiles and splits with this model (`spec::gemm::choose`, [`gemm_launch_s`]). An
//! attention kernel (`seq.cu.tera`) takes its FLOPs at a share of the FP32 peak
//! ([`Calibration::attention_efficiency`]), its blocks' rounds of L2 loads per pair of tiles, or
//! its operands' DRAM traffic, whichever is slowest. Every other kernel streams its operands:
//! dependent rounds of loads per thread, each a memory latency, or the DRAM bandwidth, whichever
//! is slower. Each launch adds a launch overhead. Re-reads of an
//! operand hit L2 when it fits in half of it and go to DRAM otherwise.
//!
//! The latencies and the launch overhead are not on any data sheet: they are [`CALIBRATION`],
//! fitted to the three H200 step times of docs/gpu-check-h200.log (seed 77.8 ms, deep_convnet
//! 529.7 ms, resnet_small 2.6 ms, measured with the baseline kernels, so against
//! `--baseline-gemm` renderings: the model gives 77.9, 464.5 and 3.2 ms; BENCHMARKS.md). The
//! pipelined kernels were first measured per kernel on an H200 on 2026-12-04 (`dmc run --device
//! cuda --profile`, docs/gpu-check-h200-2026-12-04.log): they took 1.6-2.2x the ideal above, so
//! their body is scaled by one fitted factor ([`Calibration::pipelined_factor`]); a cp.async
//! kernel's stages hide a share of a tile's latency each ([`gemm_time`]). Recalibrate on the
//! per-kernel table whenever a GPU measures it.

pub mod gpus;
pub mod program;
mod skinny;

use serde::Serialize;

use dmc_plan::op::Role;
use dmc_plan::plan::{Kernel, Plan};

use crate::kernel::CudaKernel;
use crate::spec::common::ELEM_THREADS;
use crate::spec::gemm::{grid_blocks, GemmGeom, GemmKind};
pub use crate::spec::seq::AttnGeom;
pub use gpus::{gpu, gpu_names, gpu_of_device, sm_of, Gpu, GPUS};

/// The model's constants that no data sheet gives (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Calibration {
    /// Latency of a streaming kernel's round of loads (DRAM), ns.
    pub dram_latency_ns: f64,
    /// The wait of one round of a GEMM block's tile loads, when its operands come from L2 and
    /// when they come from DRAM, ns: the loads' latency, their address arithmetic and the store to
    /// shared memory that waits on them. The baseline kernel's load loops (not unrolled: each
    /// store waits for its load before the next load issues) make one round per element a thread
    /// loads per tile, 8 for its 64x64x16 tile; a pipelined kernel issues all of a tile's staged
    /// loads at once: one round. Fitted on the baseline's step times (a tile's 800 and 2600 ns
    /// over its 8 rounds), not measured: see the module doc.
    pub round_l2_ns: f64,
    pub round_dram_ns: f64,
    /// Cost of one kernel launch issued by the host, s (the smallest kernels of the H200's
    /// per-kernel tables take 4-9 µs a launch; the first fit, on step totals, gave 3).
    pub launch_s: f64,
    /// Integer instructions per element a convolution's implicit-GEMM load spends on its index
    /// (the im2col decomposition: divisions and bounds), and a dense GEMM's.
    pub implicit_index_instrs: f64,
    pub dense_index_instrs: f64,
    /// The fraction of peak DRAM bandwidth a streaming kernel reaches.
    pub dram_efficiency: f64,
    /// How much longer a pipelined GEMM's body (its tiles, not the launch or the split-K
    /// reduction) takes than the latency-aware roofline above says: fitted to the six GEMM
    /// kernels that take 95% of the seed's and deep_convnet's H200 steps, measured per kernel by
    /// `dmc run --device cuda --profile` (BENCHMARKS.md, docs/gpu-check-h200-2026-12-04.log):
    /// seed's measured 1.95x the unscaled model, deep_convnet's 1.67x.
    pub pipelined_factor: f64,
    /// The fraction of the FP32 peak the attention kernels reach (`seq.cu.tera`: FFMA on 4 x 4
    /// micro-tiles read from shared memory, two loads per four FMAs at best, plus the softmax,
    /// the staging and the barriers). An estimate, not fitted: no GPU has measured them yet.
    pub attention_efficiency: f64,
}

/// The constants in use (fitted as the module doc says).
pub const CALIBRATION: Calibration = Calibration {
    dram_latency_ns: 600.0,
    round_l2_ns: 100.0,
    round_dram_ns: 325.0,
    launch_s: 5.0e-6,
    implicit_index_instrs: 24.0,
    dense_index_instrs: 6.0,
    dram_efficiency: 0.85,
    pipelined_factor: 1.8,
    attention_efficiency: 0.25,
};

/// A compiled kernel's resources, as NVRTC reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KernelResources {
    pub registers: u32,
    pub shared_bytes: u32,
}

/// What bounds a kernel's predicted time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Bound {
    /// DRAM bandwidth.
    Memory,
    /// Memory latency not hidden by the resident blocks (too few blocks or tiles in flight).
    Latency,
    /// The SM's pipes (FFMA, shared memory, issue).
    Compute,
    /// The launch overhead.
    Launch,
    /// A data-parallel step's collectives (NVLink, [`program::LINK_BYTES_PER_S`]).
    Network,
}

impl Bound {
    pub fn name(self) -> &'static str {
        match self {
            Bound::Memory => "memory",
            Bound::Latency => "latency",
            Bound::Compute => "compute",
            Bound::Launch => "launch",
            Bound::Network => "network",
        }
    }
}

/// One kernel's prediction (one launch of it; `launches` per step).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelPerf {
    pub kernel: String,
    pub kind: &'static str,
    /// Steps of the plan that launch it.
    pub launches: usize,
    pub flops: f64,
    /// Each operand read once, each output written once (bytes).
    pub min_bytes: f64,
    /// What the tiling reads and writes in global memory (L2 or DRAM), bytes.
    pub moved_bytes: f64,
    /// What of that reaches DRAM (re-reads of an operand larger than half the L2), bytes.
    pub dram_bytes: f64,
    /// Blocks of its main launch (of an attention backward, its tiled passes'), threads per block.
    pub blocks: u64,
    pub threads: u32,
    /// Blocks resident per SM, and the resulting warps over the SM's maximum.
    pub resident: u32,
    pub occupancy: f64,
    /// Blocks over the blocks one wave holds (SMs x resident).
    pub waves: f64,
    pub registers: u32,
    /// The registers are an estimate (no NVRTC report).
    pub estimated: bool,
    /// The roofline of `flops` and `min_bytes` at the GPU's peaks, s.
    pub floor_s: f64,
    /// Predicted time of one launch, s.
    pub predicted_s: f64,
    pub bound: Bound,
}

/// A step's prediction: every kernel, and the totals over the plan's steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepPerf {
    pub gpu: &'static str,
    pub kernels: Vec<KernelPerf>,
    /// Sum over steps of the predicted times, s.
    pub predicted_s: f64,
    /// Sum over steps of the floors, s.
    pub floor_s: f64,
    pub launches: usize,
    pub flops: f64,
    pub min_bytes: f64,
    /// Some kernel's registers were estimated.
    pub estimated: bool,
    /// Some GEMM runs on TF32 tensor cores (`precision: tf32`).
    pub tf32: bool,
}

impl StepPerf {
    /// Predicted over floor.
    pub fn ratio(&self) -> f64 {
        if self.floor_s > 0.0 {
            self.predicted_s / self.floor_s
        } else {
            1.0
        }
    }
}

/// Registers a kernel `k` of kind `kind` is assumed to take when NVRTC has not compiled it: a
/// GEMM's ([`gemm_registers`]), 32 for the others.
pub fn estimated_registers(k: &CudaKernel, kind: &str) -> u32 {
    match &k.gemm {
        Some(g) => gemm_registers(g, kind.ends_with("update")),
        None => 32,
    }
}

/// Registers of a GEMM kernel: its accumulators and fragments, the staged loads of a pipelined
/// one, plus a fixed overhead; about 88 more for an optimizer update in the epilogue of an unsplit
/// kernel (as NVRTC gives for sm_90; a split one updates in its reduction entry); never more than
/// its launch bounds allow.
pub fn gemm_registers(g: &GemmGeom, update: bool) -> u32 {
    if g.kind != GemmKind::Tiled {
        return crate::spec::skinny::registers(g, update);
    }
    let t = g.tile;
    let extra = if update && g.split <= 1 { 88 } else { 0 };
    if !g.pipelined {
        return (t.tm * t.tn + t.tm + t.tn + 40 + extra).min(255);
    }
    // pipelined: the staged loads (none with cp.async: they go to shared memory), and the
    // fragments of the unrolled k loop that NVRTC hoists (fitted to NVRTC's sm_90 counts), up to
    // the launch bounds' cap
    let (sa, sb) = if g.stages > 1 { (0, 0) } else { t.staged() };
    let hoisted = (t.bk * (t.tm + t.tn)) * 2 / 5;
    let cap = (65536 / (t.threads() * g.min_blocks.max(1))).min(255);
    (t.tm * t.tn + sa + sb + hoisted + 40 + extra).min(cap)
}

/// Shared memory of a kernel of `k` when NVRTC has not reported it: a GEMM's two tiles.
fn estimated_shared(k: &CudaKernel) -> u32 {
    match &k.gemm {
        Some(g) => g.shared_bytes(),
        None => 2048,
    }
}

/// The model's time of one launch of the GEMM `g` (with its split-K reduction and the launch
/// overheads), registers and shared memory estimated from the tile, its operands counted as A, B
/// and C once each: how the compiler ranks a GEMM's tiles and splits (`spec::gemm::choose`).
pub fn gemm_launch_s(g: &GemmGeom, update: bool, gpu: &Gpu, cal: &Calibration) -> f64 {
    let threads = g.threads();
    let resident = resident_blocks(gpu, threads, gemm_registers(g, update), g.shared_bytes());
    let gr = g.groups.max(1) as f64;
    let rd = ((g.gm * g.gk + g.gk * g.gn) as f64) * 4.0 * gr;
    let wr = (g.gm * g.gn) as f64 * 4.0 * gr;
    let (_, _, body, _) = gemm_time(g, (rd, wr), threads, resident, gpu, cal);
    let reduce = if g.split > 1 {
        let outs = (g.gm * g.gn * g.groups.max(1)) as u64;
        reduce_time(
            g,
            outs.div_ceil(u64::from(ELEM_THREADS)),
            ELEM_THREADS,
            gpu,
            cal,
        )
    } else {
        0.0
    };
    cal.launch_s + body + reduce
}

/// A split-K reduction launch of `blocks` blocks of `threads`: each output's `split` partial sums
/// read, the output written (a streaming kernel), plus its launch.
fn reduce_time(g: &GemmGeom, blocks: u64, threads: u32, gpu: &Gpu, cal: &Calibration) -> f64 {
    let outs = (g.gm * g.gn * g.groups.max(1)) as f64;
    let bytes = outs * 4.0 * (g.split as f64 + 1.0);
    let r = resident_blocks(gpu, threads, 32, 0);
    let w = blocks as f64 / (u64::from(gpu.sms) * u64::from(r)) as f64;
    let dram_lat = cal.dram_latency_ns * 1e-9;
    // its loop is unrolled 8 deep: 8 partial sums' loads a round
    let lat = stream_time(
        w,
        (g.split as f64 / 8.0).ceil(),
        dram_lat,
        32.0 * gpu.cycle_s(),
    );
    cal.launch_s + lat.max(bytes / (gpu.dram_bw * cal.dram_efficiency))
}

/// Blocks of `threads` threads with `regs` registers and `smem` bytes of shared memory that one
/// SM of `gpu` holds at once (the CUDA occupancy rules: registers allocated per warp in units of
/// 256, at least one block).
pub fn resident_blocks(gpu: &Gpu, threads: u32, regs: u32, smem: u32) -> u32 {
    let warps = threads.div_ceil(32).max(1);
    let by_threads = gpu.max_threads_per_sm / (warps * 32);
    let regs_per_warp = (regs.max(1) * 32).div_ceil(256) * 256;
    let by_regs = gpu.regs_per_sm / (regs_per_warp * warps);
    // the driver reserves 1 KiB of shared memory per block
    let by_smem = gpu.smem_per_sm / (smem + 1024);
    by_threads
        .min(by_regs)
        .min(by_smem)
        .min(gpu.max_blocks_per_sm)
        .max(1)
}

/// Bytes of argument `i` of `k`.
fn arg_bytes(k: &Kernel, i: usize) -> f64 {
    let n: usize = k.arg_shapes.get(i).map_or(0, |s| s.iter().product());
    (n * k.signature.params[i].dtype.size()) as f64
}

/// (bytes read, bytes written) of `k`'s operands, each once (workspaces not counted).
fn operand_bytes(k: &Kernel) -> (f64, f64) {
    let (mut r, mut w) = (0.0, 0.0);
    for (i, p) in k.signature.params.iter().enumerate() {
        let b = arg_bytes(k, i);
        match p.role {
            Role::In => r += b,
            Role::Out => w += b,
            Role::InOut => {
                r += b;
                w += b;
            }
            Role::Workspace => {}
        }
    }
    (r, w)
}

/// Time of `waves` waves of blocks that each make `rounds` dependent rounds of loads
/// (`latency_s` each) plus `compute_s` of work per round.
fn stream_time(waves: f64, rounds: f64, latency_s: f64, compute_s: f64) -> f64 {
    waves.ceil().max(1.0) * rounds.max(1.0) * (latency_s + compute_s)
}

/// The prediction for one rendered kernel `ck` of plan kernel `k` (`launches` steps run it), with
/// NVRTC's `res` when known.
pub fn kernel_perf(
    ck: &CudaKernel,
    k: &Kernel,
    launches: usize,
    res: Option<KernelResources>,
    gpu: &Gpu,
    cal: &Calibration,
) -> KernelPerf {
    if !ck.program.is_empty() {
        return program::program_perf(ck, k, launches, res, gpu, cal);
    }
    let attn = match &k.op {
        dmc_plan::op::Op::Seq(op) => k.arg_shapes.first().and_then(|s| AttnGeom::of(op, s)),
        _ => None,
    };
    // an attention backward's main launch is its `delta` pass: its tiled passes are the model's
    let (grid, block) = match (&attn, ck.after.first()) {
        (Some(_), Some(l)) => (l.grid, l.block),
        _ => (ck.grid, ck.block),
    };
    let threads: u32 = block.iter().product();
    let blocks: u64 = grid.iter().map(|&g| u64::from(g)).product();
    let estimated = res.is_none();
    let res = res.unwrap_or(match &attn {
        Some(g) => KernelResources {
            registers: g.registers(),
            shared_bytes: g.shared_bytes(),
        },
        None => KernelResources {
            registers: estimated_registers(ck, k.op.kind_name()),
            shared_bytes: estimated_shared(ck),
        },
    });
    let resident = resident_blocks(gpu, threads, res.registers, res.shared_bytes);
    let per_wave = u64::from(gpu.sms) * u64::from(resident);
    let waves = blocks as f64 / per_wave as f64;
    let occupancy =
        f64::from(resident * threads.div_ceil(32)) / f64::from(gpu.max_threads_per_sm / 32);
    let flops = k.flops() as f64;
    let (rd, wr) = operand_bytes(k);
    let min_bytes = rd + wr;
    // a TF32 GEMM's FLOPs at the tensor cores' peak
    let peak = match &ck.gemm {
        Some(g) if g.tf32 && gpu.tf32_flops > 0.0 => gpu.tf32_flops,
        _ => gpu.fp32_flops(),
    };
    let floor_s = (flops / peak).max(min_bytes / gpu.dram_bw);
    let cyc = gpu.cycle_s();
    let dram_lat = cal.dram_latency_ns * 1e-9;
    let (moved, dram, body_s, bound_body) = match (&ck.gemm, &attn) {
        (Some(g), _) => gemm_time(g, (rd, wr), threads, resident, gpu, cal),
        (None, Some(a)) => attention_time(a, flops, min_bytes, (blocks, resident), gpu, cal),
        (None, None) => {
            // streaming: each thread reads its share of the inputs in rounds of a few
            // independent loads (4 B each, 4 in flight); the embedding backward's blocks scan
            // every token, a round per chunk of a block's threads
            let t = (blocks * u64::from(threads)).max(1) as f64;
            let rounds = match &k.op {
                dmc_plan::op::Op::Seq(dmc_plan::op::SeqOp::EmbeddingBwd { .. }) => {
                    let tokens = arg_bytes(k, 0) / 4.0;
                    (tokens / f64::from(threads.max(1))).ceil()
                }
                _ => (rd / t / 16.0).ceil(),
            };
            let lat = stream_time(waves, rounds, dram_lat, 64.0 * cyc);
            let mem = min_bytes / (gpu.dram_bw * cal.dram_efficiency);
            if lat > mem {
                (min_bytes, min_bytes, lat, Bound::Latency)
            } else {
                (min_bytes, min_bytes, mem, Bound::Memory)
            }
        }
    };
    // the split-K reduction: a second, streaming launch over the partial sums
    let reduce_s = match (&ck.gemm, &ck.then) {
        (Some(g), Some(l)) if g.split > 1 => {
            let rb: u64 = l.grid.iter().map(|&x| u64::from(x)).product();
            reduce_time(g, rb, l.block.iter().product(), gpu, cal)
        }
        _ => 0.0,
    };
    // the later passes of a multi-pass kernel: a launch each (their work is in the body)
    let passes_s = cal.launch_s * ck.after.len() as f64;
    let predicted_s = cal.launch_s + body_s + reduce_s + passes_s;
    let bound = if cal.launch_s + reduce_s + passes_s > body_s {
        Bound::Launch
    } else {
        bound_body
    };
    KernelPerf {
        kernel: ck.name.clone(),
        kind: k.op.kind_name(),
        launches,
        flops,
        min_bytes,
        moved_bytes: moved,
        dram_bytes: dram,
        blocks,
        threads,
        resident,
        occupancy,
        waves,
        registers: res.registers,
        estimated,
        floor_s,
        predicted_s,
        bound,
    }
}

/// An attention kernel's (moved bytes, DRAM bytes, time, bound): its `flops` (the backward's
/// recomputed products too: 7 tile products where [`Kernel::flops`] counts 5) at
/// [`Calibration::attention_efficiency`] of the FP32 peak of the SMs its blocks occupy; a round
/// of L2 loads per staged chunk of each pair of tiles a block folds, in order, its resident
/// blocks hiding each other's; and its operands once from DRAM. Each pair of tiles reads its
/// query, key and value tiles (and `do`'s) from L2 again.
fn attention_time(
    g: &AttnGeom,
    flops: f64,
    min_bytes: f64,
    (blocks, resident): (u64, u32),
    gpu: &Gpu,
    cal: &Calibration,
) -> (f64, f64, f64, Bound) {
    let tiles = g.tiles() as f64;
    let pairs = if g.causal {
        tiles * (tiles + 1.0) / 2.0
    } else {
        tiles * tiles
    } * (g.b * g.heads) as f64;
    let tile_bytes = (dmc_plan::op::ATTN_TILE * g.dh * 4) as f64;
    // tile reads per pair: the forward's q, k and v; the backward's q, k, do and v for the
    // scores in both passes, then do and q (dk, dv) and k (dq)
    let (reads, products) = if g.bwd { (11.0, 7.0 / 5.0) } else { (3.0, 1.0) };
    let moved = min_bytes + pairs * reads * tile_bytes;
    let busy = (blocks as f64).min(f64::from(gpu.sms)) / f64::from(gpu.sms);
    let compute_s = flops * products / (gpu.fp32_flops() * cal.attention_efficiency * busy);
    // rounds of dependent loads per pair (both passes of the backward): the chunks of the score
    // products, the staged rows; the longest block folds every tile of its row or column
    let chunks = g.dh.div_ceil(g.kc()) as f64;
    let rows = (dmc_plan::op::ATTN_TILE / g.rc()) as f64;
    let rounds = if g.bwd {
        2.0 * chunks + 3.0 * rows
    } else {
        chunks + rows
    };
    let per_wave = (u64::from(gpu.sms) * u64::from(resident.max(1))) as f64;
    let waves = (blocks as f64 / per_wave).ceil().max(1.0);
    let latency_s = waves * tiles * rounds * cal.round_l2_ns * 1e-9;
    let mem_s = min_bytes / (gpu.dram_bw * cal.dram_efficiency);
    let body = compute_s.max(latency_s).max(mem_s);
    let bound = if body == mem_s {
        Bound::Memory
    } else if body == compute_s {
        Bound::Compute
    } else {
        Bound::Latency
    };
    (moved, min_bytes, body, bound)
}

/// A GEMM kernel's (moved bytes, DRAM bytes, time, bound): see the module doc. `(rd, wr)` are its
/// operands' bytes; `resident` its blocks per SM.
fn gemm_time(
    g: &GemmGeom,
    (rd, wr): (f64, f64),
    threads: u32,
    resident: u32,
    gpu: &Gpu,
    cal: &Calibration,
) -> (f64, f64, f64, Bound) {
    if g.kind != GemmKind::Tiled {
        return skinny::skinny_time(g, (rd, wr), resident, gpu, cal);
    }
    let t = g.tile;
    let (bm, bn, bk) = (t.bm as usize, t.bn as usize, t.bk as usize);
    let tiles_m = g.gm.div_ceil(bm).max(1);
    let tiles_n = g.gn.div_ceil(bn).max(1);
    let gr = g.groups.max(1) as f64;
    // A (gm x gk) is read once per column of tiles, B (gk x gn) once per row of tiles
    let a = (g.gm * g.gk) as f64 * 4.0 * gr;
    let b = (g.gk * g.gn) as f64 * 4.0 * gr;
    let c = (g.gm * g.gn) as f64 * 4.0 * gr;
    let partials = if g.split > 1 { c * g.split as f64 } else { 0.0 };
    // the other operands (epilogue inputs, optimizer state, bias): streamed once
    let rest = (rd + wr - a - b - c).max(0.0);
    let moved = a * tiles_n as f64 + b * tiles_m as f64 + c + partials + rest;
    let l2_half = gpu.l2_bytes as f64 / 2.0;
    let reread = |x: f64, r: usize| if x <= l2_half { x } else { x * r as f64 };
    let dram = reread(a, tiles_n) + reread(b, tiles_m) + c + partials + rest;
    // one k-tile of one block, in SM cycles: the FFMA pipe, shared memory (one warp-wide 4-byte
    // access per cycle) and instruction issue (4 schedulers)
    let warps = f64::from(threads.div_ceil(32));
    let (tm, tn, bkf) = (f64::from(t.tm), f64::from(t.tn), bk as f64);
    let fma = warps * bkf * tm * tn;
    // shared-memory loads of the fragments: one per element, or per float4 / float2 (pipelined)
    let (va, vb) = if g.pipelined { t.frag_width() } else { (1, 1) };
    let lds = warps * bkf * (tm / f64::from(va) + tn / f64::from(vb));
    // global loads of a tile per warp (a 128-bit one per 4 elements where the kernel has them),
    // each with its index arithmetic: an implicit-GEMM operand's (the im2col decomposition) or a
    // row-major one's
    let per_warp = |n: usize| warps * ((bk * n) as f64 / f64::from(threads)).ceil();
    let idx = |implicit: bool| {
        if implicit {
            cal.implicit_index_instrs
        } else {
            cal.dense_index_instrs
        }
    };
    let vec = |v: bool| if v { 4.0 } else { 1.0 };
    let (ldg_a, ldg_b) = (per_warp(bm) / vec(g.vec_a), per_warp(bn) / vec(g.vec_b));
    let ldg = ldg_a + ldg_b;
    let index = ldg_a * (2.0 + idx(g.implicit)) + ldg_b * (2.0 + idx(g.b_implicit));
    let (fma, lds, fma_pipe) = match t.mma_per_warp().filter(|_| g.tf32) {
        // TF32 tensor cores: the tile's MMAs at the SM's share of the TF32 peak, each reading 6
        // fragment words from shared memory and converting them (cvt) per lane
        Some(mpw) => {
            let mmas = warps * (bkf / 8.0) * f64::from(mpw);
            let per_sm_cycle = gpu.tf32_flops / f64::from(gpu.sms) / (gpu.clock_ghz * 1e9);
            let tc_cycles = 2.0 * (bm * bn * bk) as f64 / per_sm_cycle.max(1.0);
            (mmas * 7.0, mmas * 6.0, tc_cycles)
        }
        None => (fma, lds, fma * 32.0 / f64::from(gpu.fp32_lanes)),
    };
    let issue = (fma + lds + index + warps * bkf * 2.0) / 4.0;
    let smem = lds + ldg;
    let tc = issue.max(fma_pipe).max(smem);
    // a tile's loads wait a latency per round: L2's for re-read operands, DRAM's for the first
    // reads; dependent rounds of one element per thread in the baseline, one in a pipelined kernel
    let frac_dram = (dram / moved.max(1.0)).clamp(0.0, 1.0);
    let round_ns = cal.round_l2_ns + frac_dram * (cal.round_dram_ns - cal.round_l2_ns);
    let rounds = if g.pipelined {
        1.0
    } else {
        let per = |n: usize| (bk * n).div_ceil(threads.max(1) as usize) as f64;
        per(bm) + per(bn)
    };
    let lat = rounds * round_ns * 1e-9 / gpu.cycle_s();
    let ks = g.gk.div_ceil(g.split.max(1));
    let ktiles = ks.div_ceil(bk).max(1) as f64;
    // waves: full ones with `resident` blocks per SM, then the rest spread over the SMs
    let blocks = grid_blocks(g) as u64;
    let per_wave = u64::from(gpu.sms) * u64::from(resident);
    let full = blocks / per_wave;
    let rest_blocks = blocks % per_wave;
    // unpipelined, a tile's loads and its arithmetic alternate (the other resident blocks fill
    // the gaps); pipelined, the next tile's loads fly during the arithmetic, so a tile takes the
    // longer of the two, plus the first tile's loads once
    // with cp.async, the copies of `stages - 1` tiles fly at once: a tile waits a share of a
    // latency
    let in_flight = if g.stages > 1 {
        f64::from(g.stages - 1)
    } else {
        1.0
    };
    let wave = |r: f64| {
        if g.pipelined {
            lat + ktiles * (lat / in_flight).max(r * tc)
        } else {
            ktiles * (lat + tc).max(r * tc)
        }
    };
    let busy = |r: f64| ktiles * r * tc;
    let mut cycles = full as f64 * wave(f64::from(resident));
    let mut busy_cycles = full as f64 * busy(f64::from(resident));
    if rest_blocks > 0 {
        let r = rest_blocks.div_ceil(u64::from(gpu.sms)) as f64;
        cycles += wave(r);
        busy_cycles += busy(r);
    }
    // a pipelined kernel reaches 1 / pipelined_factor of the model's ideal (fitted, see
    // `Calibration`); the baseline kernel's constants were fitted as they are
    let fit = if g.pipelined {
        cal.pipelined_factor
    } else {
        1.0
    };
    let compute_s = cycles * gpu.cycle_s() * fit;
    let mem_s = dram / (gpu.dram_bw * cal.dram_efficiency) * fit;
    let hidden = busy_cycles * gpu.cycle_s();
    if mem_s >= compute_s {
        (moved, dram, mem_s, Bound::Memory)
    } else if hidden >= 0.8 * compute_s {
        (moved, dram, compute_s, Bound::Compute)
    } else {
        (moved, dram, compute_s, Bound::Latency)
    }
}

/// The prediction for every kernel of `plan` (rendered as `kernels`, with NVRTC's `resources` by
/// kernel name where known) and the step's totals.
pub fn step_perf(
    plan: &Plan,
    kernels: &[CudaKernel],
    resources: &dyn Fn(&str) -> Option<KernelResources>,
    gpu: &'static Gpu,
    cal: &Calibration,
) -> StepPerf {
    let mut launches = vec![0usize; plan.kernels.len()];
    for s in &plan.steps {
        if let Some(n) = launches.get_mut(s.kernel) {
            *n += 1;
        }
    }
    let by_id: std::collections::HashMap<usize, usize> = plan
        .kernels
        .iter()
        .enumerate()
        .map(|(i, k)| (k.id, i))
        .collect();
    let mut out = StepPerf {
        gpu: gpu.name,
        kernels: Vec::with_capacity(kernels.len()),
        predicted_s: 0.0,
        floor_s: 0.0,
        launches: 0,
        flops: 0.0,
        min_bytes: 0.0,
        estimated: false,
        tf32: kernels.iter().any(|k| k.gemm.is_some_and(|g| g.tf32)),
    };
    for ck in kernels {
        let Some(&i) = by_id.get(&ck.id) else {
            continue;
        };
        let n = launches[i];
        let p = kernel_perf(ck, &plan.kernels[i], n, resources(&ck.name), gpu, cal);
        let nf = n as f64;
        out.predicted_s += p.predicted_s * nf;
        out.floor_s += p.floor_s * nf;
        out.flops += p.flops * nf;
        out.min_bytes += p.min_bytes * nf;
        out.launches += n * ck.launches().len();
        out.estimated |= p.estimated;
        out.kernels.push(p);
    }
    out
}
