//! The model of a data-parallel step's program ([`CudaKernel::program`]): each launch of the
//! sharded step's entries (`shard.cu.tera`: one thread per gradient element looping over the
//! reduction, one per updated element) and each collective at NVLink's rate within a node.

use dmc_plan::op::{ConvOp, DenseOp, Op};
use dmc_plan::plan::Kernel;

use super::{
    operand_bytes, resident_blocks, stream_time, Bound, Calibration, KernelPerf, KernelResources,
};
use crate::kernel::{Collective, CudaKernel, Phase};
use crate::perf::gpus::Gpu;

/// The bandwidth the collectives are modelled at: NVLink 4 between the GPUs of one node, per
/// direction (`dmc_plan::link::NETWORKS`).
pub const LINK_BYTES_PER_S: f64 = 450e9;
/// One collective's fixed cost: NCCL's small-message latency within a node (order of magnitude).
pub const COLLECTIVE_S: f64 = 10e-6;

/// The share of the FP32 peak the tiled gradient's FMAs reach (a plain 4 x 4 register tile, no
/// pipelining: an assumption until a GPU measures it).
pub const TILED_EFFICIENCY: f64 = 0.4;

/// Whether `k`'s gradient entry is the tiled one (`shard.cu.tera`: not a grouped convolution's).
fn tiled(k: &Kernel) -> bool {
    !matches!(&k.op, Op::Conv(ConvOp::Conv2dBwdWeightUpdate { geom, .. }) if geom.groups > 1)
}

/// The reduction length of a gradient entry's loop (`_grad`: the batch rows, or a convolution's
/// output pixels) and of a bias sum's (`_bias`: the rows of dy).
fn loop_len(k: &Kernel, entry: &str) -> f64 {
    let numel = |i: usize| -> f64 {
        k.arg_shapes
            .get(i)
            .map_or(0.0, |s| s.iter().product::<usize>() as f64)
    };
    let last = |i: usize| -> f64 {
        k.arg_shapes
            .get(i)
            .and_then(|s| s.last())
            .map_or(1.0, |&c| c.max(1) as f64)
    };
    if entry.ends_with("_grad") {
        match &k.op {
            Op::Dense(DenseOp::DenseBwdWeightUpdate { .. }) => k
                .arg_shapes
                .first()
                .and_then(|s| s.first())
                .copied()
                .unwrap_or(1) as f64,
            Op::Conv(ConvOp::Conv2dBwdWeightUpdate { .. }) => numel(1) / last(1),
            _ => 1.0,
        }
    } else if entry.ends_with("_bias") {
        // dy is argument 0 of a bias update, 1 of a fused weight update
        let dy = match &k.op {
            Op::Optim(_) => 0,
            _ => 1,
        };
        numel(dy) / last(dy)
    } else {
        1.0
    }
}

/// Bytes one rank sends in collective `c` among `world` ranks (as `dmc_plan::shard::sent_bytes`
/// counts them).
fn sent(c: &Collective, world: usize) -> f64 {
    let n = world.max(1) as f64;
    let part = |elems: usize| elems as f64 * 4.0 * (n - 1.0) / n;
    match *c {
        Collective::ReduceScatterRows { rows: r, cols, .. }
        | Collective::AllGatherRows { rows: r, cols, .. } => part(r * cols),
        Collective::ReduceInto { n: e, .. } => part(e),
        Collective::AllReduce { n: e, .. } => 2.0 * part(e),
        Collective::AllReduceF64 { n: e, .. } => 4.0 * part(e),
    }
}

/// One data-parallel step's prediction (see the module docs).
pub(super) fn program_perf(
    ck: &CudaKernel,
    k: &Kernel,
    launches: usize,
    res: Option<KernelResources>,
    gpu: &Gpu,
    cal: &Calibration,
) -> KernelPerf {
    let world = k.op.shards().max(1);
    let estimated = res.is_none();
    let res = res.unwrap_or(KernelResources {
        registers: 32,
        shared_bytes: 0,
    });
    let flops = k.flops() as f64;
    let (rd, wr) = operand_bytes(k);
    let (mut compute_s, mut network_s, mut bytes_sent) = (0.0, 0.0, 0.0);
    let (mut blocks, mut threads, mut resident, mut waves) = (0u64, 0u32, 0u32, 0.0f64);
    for p in &ck.program {
        match p {
            Phase::Launch(l) => {
                let t: u32 = l.block.iter().product();
                let b: u64 = l.grid.iter().map(|&g| u64::from(g)).product();
                let r = resident_blocks(gpu, t, res.registers, res.shared_bytes);
                let w = b as f64 / (f64::from(gpu.sms) * f64::from(r.max(1)));
                let len = loop_len(k, &l.entry);
                let body = if l.entry.ends_with("_grad") && tiled(k) {
                    // 64 x 64 tiles, the reduction in steps of 16 staged through shared memory:
                    // a round of L2 loads per step, the FMAs at TILED_EFFICIENCY of the peak
                    let (rows, cols) = (f64::from(l.grid[0]) * 64.0, f64::from(l.grid[1]) * 64.0);
                    let fl = 2.0 * rows * cols * len;
                    let lat = stream_time(w, (len / 16.0).ceil(), cal.round_l2_ns * 1e-9, 0.0);
                    lat.max(fl / (gpu.fp32_flops() * TILED_EFFICIENCY))
                } else {
                    // each thread: the loop's two loads a round (from L2: the rows are shared by
                    // a block's threads), four rounds in flight
                    stream_time(w, (len / 4.0).ceil(), cal.round_l2_ns * 1e-9, 0.0)
                };
                compute_s += cal.launch_s + body;
                if b > blocks {
                    (blocks, threads, resident, waves) = (b, t, r, w);
                }
            }
            Phase::Collective(c) => {
                let s = sent(c, world);
                bytes_sent += s;
                network_s += COLLECTIVE_S + s / LINK_BYTES_PER_S;
            }
        }
    }
    let mem_s = (rd + wr) / (gpu.dram_bw * cal.dram_efficiency);
    let body_s = compute_s.max(mem_s).max(flops / gpu.fp32_flops());
    let predicted_s = body_s + network_s;
    let bound = if network_s > body_s {
        Bound::Network
    } else if compute_s >= mem_s {
        Bound::Latency
    } else {
        Bound::Memory
    };
    KernelPerf {
        kernel: ck.name.clone(),
        kind: k.op.kind_name(),
        launches,
        flops,
        min_bytes: rd + wr,
        moved_bytes: rd + wr + bytes_sent,
        dram_bytes: rd + wr,
        blocks,
        threads,
        resident,
        occupancy: f64::from(resident * threads.div_ceil(32))
            / f64::from(gpu.max_threads_per_sm / 32),
        waves,
        registers: res.registers,
        estimated,
        floor_s: (flops / gpu.fp32_flops()).max((rd + wr) / gpu.dram_bw)
            + bytes_sent / LINK_BYTES_PER_S,
        predicted_s,
        bound,
    }
}
