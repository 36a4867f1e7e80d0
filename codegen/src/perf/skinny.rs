//! The model of the skinny GEMM kernels (`spec::skinny`, `gemm_skinny.cuh.tera`): streaming
//! kernels, priced as the model prices every streaming kernel (the elementwise ones measured on the
//! H200 at 1.0-1.2x of it), not as the tiled GEMM (whose fitted [`Calibration::pipelined_factor`]
//! is the tiled kernel's own): the slowest of
//! - DRAM: each operand once (B, the large one, read by one thread; A's rows re-read from L2 by
//!   each column block; the split's partial sums written), at [`Calibration::dram_efficiency`];
//! - the SMs: FFMA issue, shared-memory loads and the loads' issue on the SMs its blocks occupy;
//! - latency: each thread's dependent rounds of loads (a rows thread keeps
//!   [`UNROLL`] float4s of B in flight; an outer thread its unrolled rows' updates), a DRAM
//!   latency each, waves of resident blocks one after the other;
//!
//! plus, per wave, the rounds of L2 loads that fill a block's A rows and, for a rows kernel, the
//! barriers of its partial sums' tree. Not yet measured on a GPU: `scripts/gpu-check.sh` times
//! them against the tiled kernels (`--no-skinny`) and per kernel.

use super::{stream_time, Bound, Calibration, Gpu};
use crate::spec::gemm::grid_blocks;
use crate::spec::gemm::{GemmGeom, GemmKind};
use crate::spec::skinny::{block_cols, OUTER_ROWS, OUTER_UNROLL, THREADS, UNROLL};

/// A skinny GEMM's (moved bytes, DRAM bytes, time, bound); `(rd, wr)` its operands' bytes,
/// `resident` its blocks per SM.
pub(super) fn skinny_time(
    g: &GemmGeom,
    (rd, wr): (f64, f64),
    resident: u32,
    gpu: &Gpu,
    cal: &Calibration,
) -> (f64, f64, f64, Bound) {
    let (gm, gn, gk) = (g.gm as f64, g.gn as f64, g.gk as f64);
    // row and column blocks (the tile is a block's outputs)
    let bx = g.gm.div_ceil(g.tile.bm as usize).max(1);
    let by = g.gn.div_ceil(g.tile.bn as usize).max(1);
    let blocks = grid_blocks(g) as f64;
    let per_wave = f64::from(gpu.sms) * f64::from(resident.max(1));
    let waves = (blocks / per_wave).ceil().max(1.0);
    let sms = blocks.min(f64::from(gpu.sms)).max(1.0);
    let dram_lat = cal.dram_latency_ns * 1e-9;
    let l2_round = cal.round_l2_ns * 1e-9;
    let c = gm * gn * 4.0;
    let (moved, dram, issue_per_sm, rounds, fill_rounds, tail_rounds) = match g.kind {
        GemmKind::Outer => {
            // every operand once from DRAM (the outputs, their optimizer state), A's rows and B's
            // columns re-read from L2 by the other blocks of their row and column
            let a = gm * gk * 4.0;
            let b = gk * gn * 4.0;
            let moved = rd + wr + a * (by as f64 - 1.0).max(0.0) + b * (bx as f64 - 1.0).max(0.0);
            // per output: its FMAs, A's row from shared memory as float4s, and the store (an
            // update's loads, arithmetic and stores)
            let per_out = gk + (gk / 4.0).ceil() + 8.0 + if rd + wr > 2.0 * c { 8.0 } else { 0.0 };
            let issue = gm * gn / 32.0 * per_out / sms / 4.0;
            let rows = f64::from(OUTER_ROWS / OUTER_UNROLL);
            // A's rows (a thread's few elements) and B's column: one round each
            (moved, rd + wr, issue, rows, 2.0, 0.0)
        }
        _ => {
            let a = gm * gk * 4.0;
            let b = gk * gn * 4.0;
            let partials = if g.split > 1 { c * g.split as f64 } else { c };
            let rest = (rd + wr - a - b - c).max(0.0);
            let cols = by as f64;
            let l2_half = gpu.l2_bytes as f64 / 2.0;
            let a_dram = if a <= l2_half { a } else { a * cols };
            let moved = a * cols + b + partials + rest;
            // per float4 of B a lane loads: the load, A's rows from shared memory (a k row's GM
            // floats as float4s along n; a float4 per row along k), 4 FMAs per row, the loop
            let lds = if g.b_k_fastest { gm } else { (gm / 4.0).ceil() };
            let per_vec = 1.0 + lds + 4.0 * gm + 3.0;
            let issue = gk * gn / 4.0 / 32.0 * per_vec / sms / 4.0;
            // a lane's float4s of its block's k range, UNROLL a round
            let ks = g.ks() as f64;
            let per_lane = ks * block_cols(g) as f64 / 4.0 / f64::from(THREADS);
            let rounds = (per_lane / f64::from(UNROLL)).ceil();
            // A's rows: a thread's share of float4s, 4 in flight; the tree's levels (log2 of the
            // k groups along n: 3 or 4) or the lanes' sums (one level along k)
            let fill = (gm * ks / 4.0 / f64::from(THREADS) / 4.0).ceil().max(1.0);
            let groups = f64::from(THREADS) / (block_cols(g) as f64 / 4.0);
            let tail = if g.b_k_fastest { 1.0 } else { groups.log2() };
            (
                moved,
                a_dram + b + partials + rest,
                issue,
                rounds,
                fill,
                tail,
            )
        }
    };
    let fma = gm * gn * gk / (sms * f64::from(gpu.fp32_lanes));
    let compute_s = issue_per_sm.max(fma) * gpu.cycle_s();
    let mem_s = dram / (gpu.dram_bw * cal.dram_efficiency);
    let lat_s = stream_time(waves, rounds, dram_lat, 0.0);
    let fixed = waves * (fill_rounds + tail_rounds) * l2_round;
    let body = mem_s.max(compute_s).max(lat_s) + fixed;
    let bound = if body - fixed == mem_s {
        Bound::Memory
    } else if body - fixed == compute_s {
        Bound::Compute
    } else {
        Bound::Latency
    };
    (moved, dram, body, bound)
}
