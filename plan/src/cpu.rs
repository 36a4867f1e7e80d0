//! The CPU backend's time model: what one launch of a kernel does on the CPU ([`CpuWork`]: its
//! GEMM calls, im2col/col2im gathers, streamed bytes and parallel loops, each op family's fact
//! [`OpFacts::cpu_work`](crate::op::OpFacts::cpu_work)), the machine's rates ([`CpuRates`],
//! measured by the runtime's micro-benchmark and cached) and the predicted time of a launch, a
//! kernel and a plan's step ([`plan_time`]).
//!
//! The GEMM term follows the backend's GEMM ([`gemm_split`] is the one split both use): each
//! block of output rows or columns is one single-threaded matrixmultiply call, costing its
//! arithmetic on whole 8x8 micro-tiles (a 1-column block pays for 8), the packing of its operands
//! and a fixed call overhead; the blocks run in waves over the threads. A fused weight-gradient
//! update in chunks of `c` columns makes `Co/c` GEMMs of `c` columns and redoes im2col per chunk:
//! that is what makes small chunks slow, and what the cap fitter weighs against recomputation.

use serde::{Deserialize, Serialize};

use crate::plan::Plan;
use crate::unary::UnaryKind;

/// How many terms the time of a launch has ([`CpuRates::terms`]).
pub const TERMS: usize = 12;

/// Multiply-adds (m*n*k) below which a GEMM runs on the calling thread.
pub const PAR_WORK: usize = 1 << 20;
/// Smallest block of output rows (columns) per task.
pub const MIN_BLOCK: usize = 32;
/// matrixmultiply's sgemm `nc`: each call packs up to `kc x min(n, nc)` of B in its own buffer.
pub const MM_NC: usize = 1024;
/// The shortest run of contiguous elements a gather is costed at (a 64-byte line of f32): a
/// shorter run costs its copy's overhead more than its elements.
pub const MIN_RUN_ELEMS: usize = 16;
/// A GEMM block's B operand beyond this many bytes comes from memory, not a cache: its bytes
/// also count as streamed ([`dram_bytes`]). Few rows against a large weight (the seed network's
/// 37.7 MB 3x3 convolutions at 4x4 pixels, 16 rows) are bound by that read.
pub const CACHED_OPERAND_BYTES: usize = 4 << 20;

/// Bytes one wave of a GEMM's blocks reads from memory: each of the `concurrent` blocks' B
/// (`k x n` floats) when the whole B (`k x whole_n`) is larger than [`CACHED_OPERAND_BYTES`]
/// (each block reads its own columns of it, none of them in a cache), else nothing.
pub fn dram_bytes(n: usize, whole_n: usize, k: usize, concurrent: usize) -> f64 {
    if 4 * k * whole_n.max(n) > CACHED_OPERAND_BYTES {
        (4 * k * n * concurrent) as f64
    } else {
        0.0
    }
}

/// Elements of a block of a fused update (a chunk's columns times the weight's rows) below which
/// the CPU backend updates it on the calling thread: handing a parallel loop to the pool costs
/// more than the loop (measured: ~17 µs against ~6 µs for a 784-row one-column block).
pub const SERIAL_UPDATE_ELEMS: usize = 16 << 10;

/// Bytes a kernel's loops stream below which they run as one task on the calling thread: a
/// parallel loop of the CPU backend splits only beyond its chunk (8192 elements of the
/// elementwise kernels), and a loop that does not split hands nothing to the pool.
pub const SPLIT_BYTES: u64 = 64 << 10;

/// How the CPU backend splits one `m x k` by `k x n` GEMM over `threads`: into `parts` blocks of
/// at most `per` rows (`rows`) or columns of the output, each one single-threaded call. Every
/// block packs its own operands, so rows are split only while all of B's columns fit a thread's
/// share of [`MM_NC`]; otherwise columns, in blocks of at most that share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmSplit {
    pub rows: bool,
    pub per: usize,
    pub parts: usize,
}

/// The split of an `m x n` (inner `k`) GEMM on `threads` threads ([`GemmSplit`]).
pub fn gemm_split(m: usize, n: usize, k: usize, threads: usize) -> GemmSplit {
    let share = (MM_NC / threads.max(1)).max(MIN_BLOCK);
    let (rows, len, per) = if threads < 2 || m * n * k < PAR_WORK {
        (true, m, m)
    } else if n <= share && m >= 2 * MIN_BLOCK {
        let parts = threads.min(m / MIN_BLOCK);
        (true, m, m.div_ceil(parts))
    } else if n >= 2 * MIN_BLOCK {
        (false, n, n.div_ceil(threads).min(share))
    } else {
        (true, m, m)
    };
    GemmSplit {
        rows,
        per: per.max(1),
        parts: len.div_ceil(per.max(1)).max(1),
    }
}

/// `calls` GEMMs of `m x n` outputs over an inner dimension `k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmCalls {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub calls: u64,
    /// Independent items of an outer parallel loop the calls are spread over (the images of a
    /// data gradient); 1: the calls run one after the other, each split by [`gemm_split`].
    pub outer: u64,
    /// Whether C is read (accumulated into) as well as written.
    pub accumulate: bool,
    /// Whether the caller runs a row split of each call ([`gemm_split`]) as its own per-thread
    /// tasks, each doing all of its rows' work (a convolution's forward): no loop of the GEMM's.
    #[serde(default)]
    pub per_thread_rows: bool,
    /// Whether A is a row-major array read transposed (a weight gradient's `x^T`): its packing
    /// reads runs of each column, like a row-major B's ([`CpuRates::gemm_terms_of`]).
    #[serde(default)]
    pub a_t: bool,
    /// Whether B is a row-major array read transposed (a data gradient's `w^T`): its packing
    /// gathers across rows, like a row-major A's.
    #[serde(default)]
    pub b_t: bool,
}

/// What one launch of a kernel does on the CPU backend, in the terms of [`CpuRates`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuWork {
    pub gemms: Vec<GemmCalls>,
    /// Elements the weight gradient's im2col gathers (row-major rows of the chunk).
    pub im2col: u64,
    /// Elements the forward's im2col gathers (row-major, each thread its own rows of the chunk,
    /// right before its GEMM reads them).
    pub im2col_fwd: u64,
    /// Elements the data gradient's col2im scatter-adds.
    pub col2im: u64,
    /// Multiply-adds done directly, a vector of channels at a time, outside any GEMM (the
    /// depthwise convolutions').
    #[serde(default)]
    pub direct: u64,
    /// Bytes the rest of the kernel streams through memory (read + written).
    pub streamed: u64,
    /// Bytes it streams on one thread (a loop it does not split: the batchnorms' sums over the
    /// rows in order): weighed as `threads` times as many bytes streamed.
    #[serde(default)]
    pub serial: u64,
    /// Bytes it reads and writes in memory on one thread whatever the arena (a copy to or from
    /// the host store larger than a cache): weighed as `threads` times as many bytes streamed
    /// through memory, never at the cached rate.
    #[serde(default)]
    pub from_memory: u64,
    /// Parallel loops it starts (each a dispatch to the thread pool and a join).
    pub loops: u64,
    /// Transcendental work beyond the bytes it streams: elements of an activation's formula (its
    /// exponentials, erfc, logarithms), or attention's exponentials, each at its own measured
    /// cost ([`CpuRates::special_s`]; not one of the fitted [`TERMS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub special: Vec<(Special, u64)>,
}

/// What a kernel evaluates per element beyond streaming it ([`CpuWork::special`]): an
/// activation's forward or backward formula (the backward's reads the saved value), or one
/// `exp` of attention's softmax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Special {
    Forward(UnaryKind),
    Backward(UnaryKind),
    AttentionExp,
    /// An element of a batchnorm's forward (its sums in f64, in row order per channel, and its
    /// normalisation), or of its backward: measured at 64 channels in the caches, less the
    /// streaming of its passes (mobilenet's batchnorms, costed as streaming alone, were
    /// predicted 3-5x fast once a cached arena streamed at the cached rate).
    BatchNorm,
    BatchNormBwd,
    /// An element of a layernorm's forward or backward (its row sums in f64).
    LayerNorm,
    LayerNormBwd,
    /// A logit of a cross-entropy loss's forward or backward (its softmax's `exp` in f64).
    CrossEntropy,
    CrossEntropyBwd,
    /// An element of a bias gradient (column sums in f64, in row order).
    BiasGrad,
}

impl Special {
    /// Its key in [`CpuRates::special_s`]: `gelu`, `gelu_bwd`, `attention_exp`.
    pub fn key(&self) -> String {
        match self {
            Special::Forward(k) => k.name().to_string(),
            Special::Backward(k) => format!("{}_bwd", k.name()),
            Special::AttentionExp => "attention_exp".into(),
            Special::BatchNorm => "batchnorm".into(),
            Special::BatchNormBwd => "batchnorm_bwd".into(),
            Special::LayerNorm => "layernorm".into(),
            Special::LayerNormBwd => "layernorm_bwd".into(),
            Special::CrossEntropy => "cross_entropy".into(),
            Special::CrossEntropyBwd => "cross_entropy_bwd".into(),
            Special::BiasGrad => "bias_grad".into(),
        }
    }

    /// Every kind the micro-benchmark measures: each activation's forward and backward, and
    /// attention's `exp`.
    pub fn all() -> Vec<Special> {
        let mut v: Vec<Special> = UnaryKind::ALL
            .iter()
            .flat_map(|k| [Special::Forward(*k), Special::Backward(*k)])
            .collect();
        v.extend([
            Special::AttentionExp,
            Special::BatchNorm,
            Special::BatchNormBwd,
            Special::LayerNorm,
            Special::LayerNormBwd,
            Special::CrossEntropy,
            Special::CrossEntropyBwd,
            Special::BiasGrad,
        ]);
        v
    }

    /// Seconds per element, all threads, of a typical 2-thread x86 machine (the nominal rates):
    /// none for the piecewise-linear activations, a few nanoseconds for the others, none for the
    /// kernels measured whole (normalisations, losses, bias gradients) beyond their streaming.
    pub fn nominal_s(&self) -> f64 {
        let k = match self {
            Special::Forward(k) | Special::Backward(k) => *k,
            Special::AttentionExp => return 1.5e-9,
            Special::BatchNorm
            | Special::BatchNormBwd
            | Special::LayerNorm
            | Special::LayerNormBwd
            | Special::CrossEntropy
            | Special::CrossEntropyBwd
            | Special::BiasGrad => return 0.0,
        };
        let fwd = match k {
            UnaryKind::Relu | UnaryKind::LeakyRelu { .. } => 0.0,
            UnaryKind::Gelu => 2e-9,
            _ => 1.5e-9,
        };
        match self {
            Special::Backward(_) => 2.0 * fwd,
            _ => fwd,
        }
    }
}

impl CpuWork {
    /// `elems` evaluations of `what`, beside this work.
    pub fn with_special(mut self, what: Special, elems: u64) -> Self {
        if elems > 0 {
            self.special.push((what, elems));
        }
        self
    }
}

impl CpuWork {
    /// A kernel that streams `bytes` in one parallel loop.
    pub fn stream(bytes: u64) -> Self {
        CpuWork {
            streamed: bytes,
            loops: 1,
            ..Default::default()
        }
    }
}

/// The lines (bytes) a column block of a row-major matrix may touch and still find them in
/// the cache when the next block, the columns beside it, reads them again.
pub const CACHED_LINES_BYTES: usize = 256 << 10;

/// Bytes a loop moves reading and writing `cols` of every row of a `rows x stride` row-major
/// f32 matrix: whole 64-byte lines once a row's run is shorter than one, unless the block's
/// lines fit [`CACHED_LINES_BYTES`] (the blocks of a chunked update then share them: only its
/// own elements count).
pub fn strided_bytes(rows: usize, cols: usize, stride: usize) -> u64 {
    let lines_cached = rows * 64 <= CACHED_LINES_BYTES;
    let run = if cols < stride && !lines_cached {
        cols.max(16)
    } else {
        cols
    };
    (rows * run.min(stride.max(cols))) as u64 * 4
}

/// What one fused update of a block of `nc` columns of a `[rows, ld]` weight does, with `arrays`
/// tensors (the weight and its optimizer states), as the CPU backend's `update_block` runs it:
/// `(streamed, loops)` of [`CpuWork`]. A block of fewer than [`SERIAL_UPDATE_ELEMS`]
/// elements runs on the calling thread, a vector of a row's elements at a time: it streams its
/// elements (read and written) and, strided, touches a line of every row of each array; a
/// larger block is one parallel loop streaming its lines ([`strided_bytes`]).
pub fn update_block_work(rows: usize, nc: usize, ld: usize, arrays: usize) -> (u64, u64) {
    let arrays = arrays as u64;
    if rows * nc < SERIAL_UPDATE_ELEMS {
        let lines = if nc < ld { rows as u64 * 64 } else { 0 };
        (arrays * lines + 2 * arrays * (rows * nc) as u64 * 4, 0)
    } else {
        (2 * arrays * strided_bytes(rows, nc, ld), 1)
    }
}

/// The machine's rates the model needs, measured by the runtime's micro-benchmark
/// (`dmc_runtime::cpu::calibrate`) on this machine with this many threads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuRates {
    /// Threads of the pool the kernels run on.
    pub threads: usize,
    /// matrixmultiply's f32 micro-tile on this CPU (8 with AVX/FMA, 16 with AVX-512): a call
    /// computes whole `tile x tile` blocks, so a 1-column GEMM pays for `tile` columns.
    pub micro_tile: usize,
    /// One thread's sgemm rate on whole micro-tiles, FLOP/s.
    pub gemm_flops: f64,
    /// Bytes per second one thread's sgemm packs by gathers (a row-major A, a transposed B:
    /// [`CpuRates::gemm_terms_of`]) and writes of C.
    pub pack_bytes: f64,
    /// Seconds one sgemm call costs beyond its arithmetic and packing.
    pub gemm_call_s: f64,
    /// Elements per second, all threads, of the weight gradient's im2col, the forward's im2col
    /// and the data gradient's col2im.
    pub im2col_elems: f64,
    pub im2col_fwd_elems: f64,
    pub col2im_elems: f64,
    /// Direct multiply-adds ([`CpuWork::direct`]) per second, all threads.
    #[serde(default = "nominal_direct_madds")]
    pub direct_madds: f64,
    /// Bytes per second streamed through memory, all threads.
    pub stream_bytes: f64,
    /// Bytes per second streamed, all threads, by a kernel whose operands stay in the caches
    /// ([`CpuRates::kernel_cached`]): mlp's 2.3 MB step streamed its updates at 2-3x the rate of
    /// arrays larger than the caches, and was predicted 1.25x slow.
    #[serde(default = "nominal_stream_bytes")]
    pub cached_stream_bytes: f64,
    /// The most bytes a kernel's operands may take and stream at
    /// [`CpuRates::cached_stream_bytes`]: half the last-level cache (the rest is the other
    /// buffers', the host data's and the machine's).
    #[serde(default = "nominal_cache_bytes")]
    pub cache_bytes: u64,
    /// Seconds per parallel loop (dispatch and join).
    pub loop_s: f64,
    /// Seconds per kernel launch beyond its work (the executor's own).
    pub launch_s: f64,
    /// Bytes per second one thread's sgemm packs in runs (a row-major B, a transposed A): every
    /// block packs all of B's rows for its columns, so a block of few rows (a dense layer's batch
    /// split over the threads) is bound by it.
    #[serde(default = "nominal_pack_run_bytes")]
    pub pack_run_bytes: f64,
    /// Seconds per element, all threads, of each [`Special`] (by [`Special::key`]) beyond its
    /// streaming: measured directly (an activation over a large array, less what the streaming
    /// term says of it), not fitted. A kind absent here costs its [`Special::nominal_s`].
    #[serde(default)]
    pub special_s: std::collections::BTreeMap<String, f64>,
    /// How much of the threads ran in parallel while the rates were measured: one thread's time
    /// on a register-bound loop over all threads' time on it at once (the least of the probes
    /// around the measurement; 1.0 when every thread had a core of its own). A shared machine
    /// may take a core for a minute at a time (this project's 2-vCPU VM: mlp's step at 289 µs,
    /// then 551 µs, minutes apart), and rates measured then predict every plan slow: below
    /// [`CpuRates::BUSY_SHARE`] they are used once and not cached ([`CpuRates::measured_busy`]).
    #[serde(default = "one")]
    pub parallel_share: f64,
    /// What measured them, e.g. `micro-benchmark, 2 threads, 0.4 s`.
    pub source: String,
}

fn nominal_stream_bytes() -> f64 {
    10e9
}

fn nominal_cache_bytes() -> u64 {
    8 << 20
}

fn nominal_direct_madds() -> f64 {
    4e9
}

fn nominal_pack_run_bytes() -> f64 {
    10e9
}

fn one() -> f64 {
    1.0
}

impl CpuRates {
    /// The least [`CpuRates::parallel_share`] of rates measured on a machine whose threads each
    /// had a core: below it, some thread waited for one while the rates were measured.
    pub const BUSY_SHARE: f64 = 0.75;

    /// Whether these rates were measured while the machine held back some of its threads
    /// ([`CpuRates::parallel_share`] under [`CpuRates::BUSY_SHARE`], more than one thread).
    pub fn measured_busy(&self) -> bool {
        self.threads > 1 && self.parallel_share < Self::BUSY_SHARE
    }

    /// Rates of a typical 2-thread x86 machine (AVX2/FMA), for plans compiled without a
    /// measurement: the defaults tests and snapshots use. `dmc` measures the machine it runs on.
    pub fn nominal() -> Self {
        CpuRates {
            threads: 2,
            micro_tile: 8,
            gemm_flops: 60e9,
            pack_bytes: 20e9,
            gemm_call_s: 2e-6,
            im2col_elems: 4e9,
            im2col_fwd_elems: 2e9,
            col2im_elems: 2e9,
            direct_madds: nominal_direct_madds(),
            stream_bytes: nominal_stream_bytes(),
            cached_stream_bytes: nominal_stream_bytes(),
            cache_bytes: nominal_cache_bytes(),
            loop_s: 5e-6,
            launch_s: 1e-6,
            pack_run_bytes: nominal_pack_run_bytes(),
            special_s: Default::default(),
            parallel_share: 1.0,
            source: "nominal rates (2 threads, 60 GFLOP/s per thread)".into(),
        }
    }

    /// The terms of one single-threaded GEMM call of row-major A and B (the micro-benchmark's):
    /// [`CpuRates::gemm_terms_of`] with neither transposed.
    pub fn gemm_terms(&self, m: usize, n: usize, k: usize, accumulate: bool) -> [f64; 4] {
        self.gemm_terms_of(m, n, k, accumulate, (false, false))
    }

    /// The terms of one single-threaded GEMM call (`a_t`, `b_t`: [`GemmCalls::a_t`],
    /// [`GemmCalls::b_t`]): FLOPs on whole micro-tiles; bytes packed by gathers (an operand
    /// whose micro-panel's elements are a row apart: a row-major A, a transposed B) and of C
    /// written (read too when accumulating); 1 (the call); bytes packed in runs (a row-major B,
    /// a transposed A). (The two packings apart: a dense layer's weight, packed in runs, costed
    /// as a gathered A predicted mlp's dense GEMMs ~1.4x slow, and its chunked weight gradients,
    /// whose A is `x^T`, 1.6x slow.)
    pub fn gemm_terms_of(
        &self,
        m: usize,
        n: usize,
        k: usize,
        accumulate: bool,
        (a_t, b_t): (bool, bool),
    ) -> [f64; 4] {
        let t = self.micro_tile.max(1);
        let rup = |x: usize| x.div_ceil(t) * t;
        let (a, b, c) = (m * k, k * n, m * n * (1 + accumulate as usize));
        let (gathered, runs) = match (a_t, b_t) {
            (false, false) => (a, b),
            (true, false) => (0, a + b),
            (false, true) => (a + b, 0),
            (true, true) => (b, a),
        };
        [
            2.0 * rup(m) as f64 * rup(n) as f64 * k as f64,
            4.0 * (gathered + c) as f64,
            1.0,
            4.0 * runs as f64,
        ]
    }

    /// [`CpuRates::terms_in`] of a kernel whose operands are larger than the caches.
    pub fn terms(&self, w: &CpuWork) -> [f64; TERMS] {
        self.terms_in(w, false)
    }

    /// Whether kernel `k`'s operands together stay in the caches ([`CpuRates::cache_bytes`]):
    /// its streamed bytes are then the cached term's. (Its operands, not the step's arena: the
    /// kernel before it wrote them; a small step whose fused update walks a 9.4 MB weight in
    /// narrow column chunks still reads it from memory.)
    pub fn kernel_cached(&self, k: &crate::plan::Kernel) -> bool {
        let bytes: usize = k
            .arg_shapes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let size = k.signature.params.get(i).map_or(4, |p| p.dtype.size());
                s.iter().product::<usize>() * size
            })
            .sum();
        bytes as u64 <= self.cache_bytes
    }

    /// The terms of one launch doing `w` that [`CpuRates::coefs`] weigh: its time is their dot
    /// product ([`CpuRates::work_s_in`]). In [`TERMS`] order: GEMM FLOPs on whole micro-tiles,
    /// GEMM bytes packed by gathers (and C), GEMM calls (each in waves over the threads), the
    /// three gathers' elements, direct multiply-adds, bytes streamed through memory (and B read
    /// from memory), parallel loops (a split GEMM's included), launches, GEMM bytes packed in
    /// runs, bytes streamed in the caches (`cached`: the kernel's operands stay in them,
    /// [`CpuRates::kernel_cached`]).
    pub fn terms_in(&self, w: &CpuWork, cached: bool) -> [f64; TERMS] {
        let mut t = [0.0; TERMS];
        let threads = self.threads.max(1) as u64;
        for g in &w.gemms {
            if g.m == 0 || g.n == 0 {
                continue;
            }
            let outer = g.outer.max(1);
            // (calls in sequence, each on `inner` threads)
            let (seq, inner) = if outer == 1 {
                (g.calls as f64, threads as usize)
            } else {
                let inner = (threads / outer).max(1);
                let waves = (outer * inner).div_ceil(threads) as f64;
                (waves * g.calls as f64 / outer as f64, inner as usize)
            };
            let sp = gemm_split(g.m, g.n, g.k, inner);
            let (mm, nn) = if sp.rows {
                (sp.per.min(g.m), g.n)
            } else {
                (g.m, sp.per.min(g.n))
            };
            let [flops, bytes, call, runs] =
                self.gemm_terms_of(mm, nn, g.k, g.accumulate, (g.a_t, g.b_t));
            let waves = sp.parts.div_ceil(inner.max(1)) as f64;
            t[0] += seq * waves * flops;
            t[1] += seq * waves * bytes;
            t[2] += seq * waves * call;
            t[7] += seq * waves * dram_bytes(nn, g.n, g.k, sp.parts.min(inner.max(1)));
            t[10] += seq * waves * runs;
            // (a row split run by the caller's own per-thread tasks is the caller's loop)
            let own_loop = sp.parts > 1 && !(g.per_thread_rows && sp.rows);
            t[8] += seq * if own_loop { 1.0 } else { 0.0 };
        }
        t[3] = w.im2col as f64;
        t[4] = w.im2col_fwd as f64;
        t[5] = w.col2im as f64;
        t[6] = w.direct as f64;
        t[if cached { 11 } else { 7 }] += (w.streamed + w.serial * threads) as f64;
        t[7] += (w.from_memory * threads) as f64;
        // a small kernel's loops do not split: they run on the calling thread, no hand-off
        let big = w.streamed + w.serial >= SPLIT_BYTES || w.im2col + w.im2col_fwd + w.col2im > 0;
        t[8] += if big { w.loops as f64 } else { 0.0 };
        t[9] = 1.0;
        t
    }

    /// What weighs each of [`CpuRates::terms`]: seconds per FLOP, per byte packed, per call, per
    /// gathered element (three), per direct multiply-add, per byte streamed, per loop, per
    /// launch, per byte packed in runs, per byte streamed in the caches.
    pub fn coefs(&self) -> [f64; TERMS] {
        let inv = |r: f64| if r > 0.0 { 1.0 / r } else { 0.0 };
        [
            inv(self.gemm_flops),
            inv(self.pack_bytes),
            self.gemm_call_s,
            inv(self.im2col_elems),
            inv(self.im2col_fwd_elems),
            inv(self.col2im_elems),
            inv(self.direct_madds),
            inv(self.stream_bytes),
            self.loop_s,
            self.launch_s,
            inv(self.pack_run_bytes),
            inv(self.cached_stream_bytes),
        ]
    }

    /// These rates with the weights `c` of [`CpuRates::coefs`] (a rate whose weight is 0 is
    /// 1e30: that work is free).
    pub fn with_coefs(&self, c: &[f64; TERMS]) -> CpuRates {
        let inv = |v: f64| if v > 0.0 { 1.0 / v } else { 1e30 };
        CpuRates {
            gemm_flops: inv(c[0]),
            pack_bytes: inv(c[1]),
            gemm_call_s: c[2],
            im2col_elems: inv(c[3]),
            im2col_fwd_elems: inv(c[4]),
            col2im_elems: inv(c[5]),
            direct_madds: inv(c[6]),
            stream_bytes: inv(c[7]),
            loop_s: c[8],
            launch_s: c[9],
            pack_run_bytes: inv(c[10]),
            cached_stream_bytes: inv(c[11]),
            ..self.clone()
        }
    }

    /// [`CpuRates::work_s_in`] of a kernel whose operands are larger than the caches.
    pub fn work_s(&self, w: &CpuWork) -> f64 {
        self.work_s_in(w, false)
    }

    /// Seconds of one launch doing `w`: its [`CpuRates::terms_in`] weighed by
    /// [`CpuRates::coefs`], and its transcendental work ([`CpuRates::special_work_s`]).
    pub fn work_s_in(&self, w: &CpuWork, cached: bool) -> f64 {
        self.terms_in(w, cached)
            .iter()
            .zip(self.coefs())
            .map(|(t, c)| t * c)
            .sum::<f64>()
            + self.special_work_s(w)
    }

    /// Seconds of `w`'s [`CpuWork::special`] work, each kind at its measured cost.
    pub fn special_work_s(&self, w: &CpuWork) -> f64 {
        w.special
            .iter()
            .map(|(what, n)| {
                let s = self
                    .special_s
                    .get(&what.key())
                    .copied()
                    .unwrap_or_else(|| what.nominal_s());
                s * *n as f64
            })
            .sum()
    }
}

/// The predicted CPU time of a plan's step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuTime {
    /// Seconds of one launch of each plan kernel (`Plan::kernels` order).
    pub kernel_s: Vec<f64>,
    /// Seconds of the whole step (every plan step once).
    pub step_s: f64,
}

/// The predicted time of every kernel of `plan` and of its step, at `rates`.
pub fn plan_time(plan: &Plan, rates: &CpuRates) -> CpuTime {
    let kernel_s: Vec<f64> = plan
        .kernels
        .iter()
        .map(|k| rates.work_s_in(&k.cpu_work(), rates.kernel_cached(k)))
        .collect();
    let step_s = plan
        .steps
        .iter()
        .map(|s| kernel_s.get(s.kernel).copied().unwrap_or(0.0))
        .sum();
    CpuTime { kernel_s, step_s }
}
