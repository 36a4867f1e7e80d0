//! The memory report: where the bytes of one training step go, computed from a [`Plan`] alone.
//!
//! [`memory_report`] is a pure function of the plan. It finds the *peak of live bytes* — the
//! largest, over the step indices `t`, sum of the bytes of the buffers live at `t` (persistent
//! buffers are always live). No placement of the same buffers with the same live ranges can use
//! less arena than that, so it is the lower bound the arena is measured against. The report
//! breaks the peak down by category (the [`BufferKind`]s), names the step where it happens and the
//! buffers live there, compares the arena to the bound, sets a *conventional framework* estimate
//! for the same program beside it (see [`Conventional`]), lists per-layer rows and a per-step
//! timeline.
//!
//! This module is the model (the numbers); the renderers are [`text`] ([`render_text`]: aligned
//! columns, exact bytes and human units, deterministic; [`render_json`]: serde) and [`svg`]
//! ([`render_svg`]: live bytes over the step, stacked by category, with the arena size and an
//! optional cap as horizontal lines), which also draw the memory / recompute sweep.

use serde::{Deserialize, Serialize};

use crate::fxhash::FxHashMap;
use crate::plan::{layer_of, BufferId, BufferKind, Mode, Plan, StepPhase};

mod data_parallel;
pub use data_parallel::{data_parallel, DataParallel};
pub mod svg;
pub mod text;

pub use svg::{render_svg, render_sweep_svg, RenderError};
pub use text::{human, render_json, render_sweep_text, render_text, thousands, write_json};

/// Bytes per category: one field per [`BufferKind`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByCategory {
    pub parameters: u64,
    pub optimizer_state: u64,
    pub inputs: u64,
    /// Forward values (saved for backward or transient), including the loss.
    pub activations: u64,
    /// Gradients in flight.
    pub gradients: u64,
    pub workspace: u64,
    /// Batchnorm's running statistics (absent from the JSON when zero, as in plans without them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub running_stats: u64,
    /// The accumulated gradients of `accumulate: N` (absent from the JSON when zero).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gradient_accumulators: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

/// The categories in report order, with their display names (the running statistics last: the
/// renderers leave that category out where it is zero).
pub const CATEGORIES: [(BufferKind, &str); 8] = [
    (BufferKind::Parameter, "parameters"),
    (BufferKind::OptimizerState, "optimizer state"),
    (BufferKind::Input, "inputs"),
    (BufferKind::Activation, "activations"),
    (BufferKind::Gradient, "gradients"),
    (BufferKind::Workspace, "workspace"),
    (BufferKind::RunningStat, "running statistics"),
    (BufferKind::GradAccum, "gradient buffers"),
];

impl ByCategory {
    pub fn get(&self, kind: BufferKind) -> u64 {
        match kind {
            BufferKind::Parameter => self.parameters,
            BufferKind::OptimizerState => self.optimizer_state,
            BufferKind::Input => self.inputs,
            BufferKind::Activation => self.activations,
            BufferKind::Gradient => self.gradients,
            BufferKind::Workspace => self.workspace,
            BufferKind::RunningStat => self.running_stats,
            BufferKind::GradAccum => self.gradient_accumulators,
        }
    }
    fn slot(&mut self, kind: BufferKind) -> &mut u64 {
        match kind {
            BufferKind::Parameter => &mut self.parameters,
            BufferKind::OptimizerState => &mut self.optimizer_state,
            BufferKind::Input => &mut self.inputs,
            BufferKind::Activation => &mut self.activations,
            BufferKind::Gradient => &mut self.gradients,
            BufferKind::Workspace => &mut self.workspace,
            BufferKind::RunningStat => &mut self.running_stats,
            BufferKind::GradAccum => &mut self.gradient_accumulators,
        }
    }
    pub fn add(&mut self, kind: BufferKind, bytes: u64) {
        *self.slot(kind) += bytes;
    }
    pub fn total(&self) -> u64 {
        CATEGORIES.iter().map(|(k, _)| self.get(*k)).sum()
    }
}

/// One buffer live at the peak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveBuffer {
    pub id: BufferId,
    pub name: String,
    pub kind: BufferKind,
    pub bytes: u64,
    pub layer: String,
}

/// The moment of the peak of live bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peak {
    /// Step index (the first one, if several reach the peak); 0 in a plan without steps.
    pub step: usize,
    /// The step's label, e.g. `grad conv2d_5`.
    pub label: String,
    /// The step's kernel name (e.g. `conv2d_bwd_data_1`) and op kind (e.g. `conv2d_bwd_data`).
    pub kernel: String,
    pub op: String,
    pub phase: StepPhase,
    /// Live bytes at the peak: the lower bound for the arena.
    pub bytes: u64,
    pub by_category: ByCategory,
    /// Of the live activations, the bytes kept from the forward for the backward.
    pub saved_activations: u64,
    /// Every buffer live at the peak step, largest first.
    pub live: Vec<LiveBuffer>,
}

/// What a conventional framework would hold for the same program, at once.
///
/// The model: every parameter and every optimizer state tensor; a gradient for every parameter,
/// all alive together (parameter gradient bytes = parameter bytes); every activation the backward
/// reads, kept from the forward (no in-place updates, no recomputation, no freeing before the
/// backward); the batch inputs and targets; the largest single kernel workspace. It leaves out what
/// such a framework needs on top (activation gradients in flight, allocator caching and
/// fragmentation, the framework's own overhead), so it is an optimistic estimate for it. In a plan
/// without a backward (eval, predict) the gradient and saved-activation terms are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conventional {
    pub parameters: u64,
    pub optimizer_state: u64,
    pub parameter_gradients: u64,
    pub saved_activations: u64,
    pub inputs: u64,
    pub largest_workspace: u64,
    pub total: u64,
}

/// One model layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRow {
    pub layer: String,
    /// Activations the layer produces in the forward that the backward reads.
    pub kept_for_backward: u64,
    pub parameters: u64,
    pub optimizer_state: u64,
    /// The layer's largest non-persistent buffer (activation, gradient or workspace), by name.
    pub largest_transient: u64,
    pub largest_transient_name: String,
}

/// Live bytes during one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelinePoint {
    pub step: usize,
    pub label: String,
    pub phase: StepPhase,
    pub by_category: ByCategory,
    pub total: u64,
}

/// A buffer at exactly the bytes of another while both are live: a view of the other's value.
/// Its bytes are counted once, under the other buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alias {
    pub buffer: BufferId,
    pub name: String,
    pub of: BufferId,
    pub of_name: String,
}

/// The memory report of one plan; see the module docs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryReport {
    pub mode: Mode,
    pub batch: usize,
    /// Micro-batches of `batch` per optimizer step (`accumulate: N`; absent from the JSON when 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub accumulate: usize,
    /// How `clip_norm` is done and its cost (absent without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_norm: Option<crate::plan::ClipNormPlan>,
    pub steps: usize,
    pub buffers: usize,
    pub arena_bytes: u64,
    /// The peak of live bytes: no arena for these buffers and live ranges can be smaller.
    pub lower_bound_bytes: u64,
    /// `arena_bytes / lower_bound_bytes - 1` (0 when the bound is 0).
    pub fragmentation: f64,
    /// The bytes of all buffers, by category, as if none shared memory.
    pub all_buffers: ByCategory,
    /// Index of the first backward step, if any: where the forward/backward boundary lies.
    pub backward_starts: Option<usize>,
    pub peak: Peak,
    pub conventional: Conventional,
    /// Layers in the order their first buffer is written.
    pub layers: Vec<LayerRow>,
    pub timeline: Vec<TimelinePoint>,
    /// Buffers counted under another one (views); empty when every buffer has its own bytes.
    #[serde(default)]
    pub aliases: Vec<Alias>,
    /// FLOPs of the whole step by the cost model ([`crate::cost`]), recomputation included.
    #[serde(default)]
    pub step_flops: u64,
    /// FLOPs of the recomputed forward steps (rematerialization).
    #[serde(default)]
    pub recompute_flops: u64,
    /// The recomputed forward values, in order of first recomputation.
    #[serde(default)]
    pub recomputed: Vec<Recomputed>,
    /// Why and how rematerialization was applied (filled by the caller that compiled the plan).
    #[serde(default)]
    pub remat: Option<RematSummary>,
    /// Kernel launches and the bytes they move, by [`traffic`].
    #[serde(default)]
    pub traffic: Traffic,
    /// The same for the program's plan without fusion (`--no-fuse`), when the caller compiled it
    /// for comparison.
    #[serde(default)]
    pub unfused_traffic: Option<Traffic>,
    /// What streams through the arena from the host store, and its copies (absent when every
    /// parameter and optimizer state tensor is resident).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming: Option<Streaming>,
    /// The fused attention layers and what a plain implementation would hold (absent without
    /// attention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<AttentionMemory>,
    /// A data-parallel plan's ranks, their optimizer state and what each sends a step (absent
    /// with one rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<DataParallel>,
}

/// Fused attention against a plain implementation: per layer the fused kernels save one
/// log-sum-exp per query row (`B·H·T` floats) beside `qkv` and the output, which any
/// implementation keeps; a plain one (scores, softmax, product by the values, as autograd runs
/// it) also keeps each layer's `B·H·T²` attention probabilities for its backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttentionMemory {
    pub layers: usize,
    /// Bytes of the log-sum-exps of every layer.
    pub fused_bytes: u64,
    /// Bytes of every layer's `T x T` probabilities in a plain implementation.
    pub plain_bytes: u64,
}

/// The [`AttentionMemory`] of `plan`'s forward attention steps (none recomputed).
pub fn attention_memory(plan: &Plan) -> Option<AttentionMemory> {
    use crate::op::{Op, SeqOp};
    let mut m = AttentionMemory {
        layers: 0,
        fused_bytes: 0,
        plain_bytes: 0,
    };
    for st in plan
        .steps
        .iter()
        .filter(|st| !crate::cost::is_recompute(&st.label))
    {
        let Some(k) = plan.kernels.get(st.kernel) else {
            continue;
        };
        if let (Op::Seq(SeqOp::Attention { heads, .. }), Some(&[b, t, _])) =
            (&k.op, k.arg_shapes.first().map(|s| s.as_slice()))
        {
            let (b, t, h) = (b as u64, t as u64, *heads as u64);
            m.layers += 1;
            m.fused_bytes += 4 * b * h * t;
            m.plain_bytes += 4 * b * h * t * t;
        }
    }
    (m.layers > 0).then_some(m)
}

/// Streaming in one plan: the parameters and optimizer state split between the arena (resident)
/// and the host store (streamed), the copies of one run, and their predicted time on each link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Streaming {
    pub totals: dmc_plan::plan::TransferTotals,
    /// Parameters and optimizer state tensors whose home is the host store.
    pub streamed_tensors: usize,
    /// Their bytes.
    pub streamed_bytes: u64,
    /// Activations offloaded to the host store between their forward and backward uses.
    pub offloaded_tensors: usize,
    /// Their bytes (with `streamed_bytes`, `totals.host_store` but for alignment).
    pub offloaded_bytes: u64,
    /// Windows in the arena (each filled by a copy in, or written back).
    pub windows: usize,
    /// The most window bytes live at one step.
    pub window_peak: u64,
    /// Seconds of one run's copies on each of [`dmc_plan::link::LINKS`]: (link, seconds).
    pub transfer_s: Vec<(String, f64)>,
}

/// The [`Streaming`] of `plan`, if it streams.
pub fn streaming(plan: &Plan) -> Option<Streaming> {
    if !plan.streams() {
        return None;
    }
    let totals = plan.transfer_totals();
    let homes: Vec<&crate::plan::Buffer> = plan
        .buffers
        .iter()
        .filter(|b| !b.store.is_arena())
        .collect();
    // every window: filled by a copy in, or (an offloaded activation's first) written back
    let mut windows = vec![];
    for (si, s) in plan.steps.iter().enumerate() {
        match plan.transfer_op(si) {
            Some(crate::op::TransferOp::HostToDevice) => windows.extend(s.args.get(1).copied()),
            Some(crate::op::TransferOp::DeviceToHost) => windows.extend(s.args.first().copied()),
            None => {}
        }
    }
    windows.sort_unstable();
    windows.dedup();
    // live window bytes per step, by a difference array over their live ranges
    let mut delta = vec![0i128; plan.steps.len() + 1];
    for b in windows.iter().map(|&w| &plan.buffers[w]) {
        let (lo, hi) = (
            b.live.0.min(plan.steps.len()),
            b.live.1.min(plan.steps.len()),
        );
        if lo <= hi {
            delta[lo] += b.bytes as i128;
            delta[(hi + 1).min(plan.steps.len())] -= b.bytes as i128;
        }
    }
    let window_peak = delta
        .iter()
        .scan(0i128, |live, d| {
            *live += d;
            Some(*live)
        })
        .max()
        .unwrap_or(0)
        .max(0) as u64;
    Some(Streaming {
        streamed_tensors: homes.iter().filter(|b| b.persistent).count(),
        streamed_bytes: homes.iter().filter(|b| b.persistent).map(|b| b.bytes).sum(),
        offloaded_tensors: homes.iter().filter(|b| !b.persistent).count(),
        offloaded_bytes: homes
            .iter()
            .filter(|b| !b.persistent)
            .map(|b| b.bytes)
            .sum(),
        windows: windows.len(),
        window_peak,
        transfer_s: dmc_plan::link::LINKS
            .iter()
            .map(|l| {
                (
                    l.name.to_string(),
                    dmc_plan::link::transfer_seconds(&totals, l),
                )
            })
            .collect(),
        totals,
    })
}

/// Kernel launches of one step and the global-memory bytes they move at least: every argument
/// of every kernel once (an input read, an output written, an in-place argument read and
/// written; workspaces not counted). Fusion lowers both: a folded elementwise op no longer
/// reads and writes its activation-sized operands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Traffic {
    pub kernels: usize,
    pub bytes: u64,
}

/// The [`Traffic`] of one step of `plan`.
pub fn traffic(plan: &Plan) -> Traffic {
    use crate::op::Role;
    let mut bytes = 0u64;
    let mut kernels = 0;
    for st in &plan.steps {
        let Some(k) = plan.kernels.get(st.kernel) else {
            continue;
        };
        // streaming's copies are not kernels (see `Streaming`)
        if matches!(k.op, crate::op::Op::Transfer(_)) {
            continue;
        }
        kernels += 1;
        for (p, b) in k.signature.params.iter().zip(&st.args) {
            let n = plan.buffers.get(*b).map_or(0, |b| b.bytes);
            bytes += match p.role {
                Role::In | Role::Out => n,
                Role::InOut => 2 * n,
                Role::Workspace => 0,
            };
        }
    }
    Traffic { kernels, bytes }
}

/// One forward node that is recomputed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recomputed {
    /// The forward node, e.g. `conv2d_3`.
    pub name: String,
    /// How many extra times it runs.
    pub times: usize,
    /// FLOPs of those extra runs.
    pub flops: u64,
}

/// What rematerialization bought.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RematSummary {
    /// The smallest arena without recomputation.
    pub no_remat_arena: u64,
    /// `no_remat_arena - arena_bytes`.
    pub saved_bytes: u64,
    /// Stages of the forward chain.
    pub stages: usize,
    /// The winning strategy, in words.
    pub strategy: String,
    /// Its checkpoints and sequence of stage forwards / backwards.
    #[serde(default)]
    pub sequence: String,
}

/// Recomputation FLOPs of the report's plan relative to the step without them, in percent.
pub fn recompute_pct(r: &MemoryReport) -> f64 {
    let base = r.step_flops.saturating_sub(r.recompute_flops);
    if base == 0 {
        0.0
    } else {
        100.0 * r.recompute_flops as f64 / base as f64
    }
}

/// Computes the memory report of `plan`.
pub fn memory_report(plan: &Plan) -> MemoryReport {
    let nsteps = plan.steps.len();
    let npoints = nsteps.max(1);

    // The step range over which each buffer's bytes are occupied (persistent: all steps). A
    // buffer at exactly the bytes of an earlier one while both are live is a view of that one's
    // value (e.g. a `Reshape` output given its own entry): its bytes are counted once, with the
    // earlier buffer's kind, over the union of both ranges.
    let full = |b: &crate::plan::Buffer| {
        if b.persistent {
            (0, usize::MAX)
        } else {
            b.live
        }
    };
    // (the host store is not the arena: its buffers occupy none of it)
    let mut occupied: Vec<Option<(usize, usize)>> = plan
        .buffers
        .iter()
        .map(|b| b.store.is_arena().then(|| full(b)))
        .collect();
    let mut root_of: Vec<BufferId> = (0..plan.buffers.len()).collect();
    let mut aliases: Vec<Alias> = vec![];
    // Per (offset, bytes): the buffers first seen there, and the latest step any of them is
    // occupied (a buffer starting after it overlaps none of them: no scan; in a plan, buffers
    // reusing the same bytes come in step order, so that is the common case).
    // (The first buffer is kept apart from the rest: most places hold one, and a vector each
    // would be a million allocations in a deep network.)
    let mut at_bytes: FxHashMap<(u64, u64), (usize, Vec<usize>, usize)> =
        FxHashMap::with_capacity_and_hasher(plan.buffers.len(), Default::default());
    for (i, b) in plan.buffers.iter().enumerate() {
        if b.bytes == 0 || !b.store.is_arena() {
            continue;
        }
        let (lo, hi) = full(b);
        let (first, more, last) =
            at_bytes
                .entry((b.offset, b.bytes))
                .or_insert((usize::MAX, vec![], 0));
        let root = if *first == usize::MAX || lo > *last {
            None
        } else {
            std::iter::once(*first)
                .chain(more.iter().copied())
                .find(|&k| matches!(occupied[k], Some((l, h)) if l <= hi && lo <= h))
        };
        *last = (*last).max(hi);
        match root {
            Some(k) => {
                if let Some((l, h)) = occupied[k] {
                    occupied[k] = Some((l.min(lo), h.max(hi)));
                }
                occupied[i] = None;
                root_of[i] = k;
                aliases.push(Alias {
                    buffer: i,
                    name: b.name.clone(),
                    of: k,
                    of_name: plan.buffers[k].name.clone(),
                });
            }
            None if *first == usize::MAX => *first = i,
            None => more.push(i),
        }
    }
    let live_at = |i: usize, t: usize| matches!(occupied[i], Some((l, h)) if l <= t && t <= h);

    // Timeline by difference arrays over the occupied ranges.
    let mut delta: Vec<[i128; CATEGORIES.len()]> = vec![[0; CATEGORIES.len()]; npoints + 1];
    let idx = |k: BufferKind| CATEGORIES.iter().position(|(c, _)| *c == k).unwrap_or(0);
    for (b, occ) in plan.buffers.iter().zip(&occupied) {
        let Some((lo, hi)) = *occ else { continue };
        if lo > hi || lo >= npoints {
            continue;
        }
        let hi = hi.min(npoints - 1);
        delta[lo][idx(b.kind)] += b.bytes as i128;
        delta[hi + 1][idx(b.kind)] -= b.bytes as i128;
    }
    let mut running = [0i128; CATEGORIES.len()];
    let mut timeline = Vec::with_capacity(npoints);
    for (t, d) in delta.iter().enumerate().take(npoints) {
        let mut by = ByCategory::default();
        for (i, (k, _)) in CATEGORIES.iter().enumerate() {
            running[i] += d[i];
            by.add(*k, running[i] as u64);
        }
        let step = plan.steps.get(t);
        timeline.push(TimelinePoint {
            step: t,
            label: step.map(|s| s.label.clone()).unwrap_or_default(),
            phase: step.map(|s| s.phase).unwrap_or_default(),
            total: by.total(),
            by_category: by,
        });
    }
    if nsteps == 0 {
        timeline.clear();
    }

    // The peak: the first step with the most live bytes.
    let (peak_t, peak_by) = if nsteps == 0 {
        let mut by = ByCategory::default();
        for (i, b) in plan.buffers.iter().enumerate() {
            if b.persistent && occupied[i].is_some() {
                by.add(b.kind, b.bytes);
            }
        }
        (0, by)
    } else {
        let mut best = 0;
        for (t, p) in timeline.iter().enumerate() {
            if p.total > timeline[best].total {
                best = t;
            }
        }
        (best, timeline[best].by_category)
    };

    // The forward/backward boundary and the activations the backward reads.
    let backward_starts = plan
        .steps
        .iter()
        .position(|s| s.phase == StepPhase::Backward);
    // Whether each buffer is a forward activation the backward reads.
    let mut saved: Vec<bool> = vec![false; plan.buffers.len()];
    for (s, step) in plan.steps.iter().enumerate() {
        // Fused weight-gradient + update kernels (phase Update) read forward values too.
        if !matches!(step.phase, StepPhase::Backward | StepPhase::Update) {
            continue;
        }
        for &a in &step.args {
            let Some(&a) = root_of.get(a) else { continue };
            let b = &plan.buffers[a];
            if b.kind == BufferKind::Activation && !b.persistent && b.live.0 < s {
                saved[a] = true;
            }
        }
    }

    fn layer_name(b: &crate::plan::Buffer) -> &str {
        if b.layer.is_empty() {
            layer_of(&b.name)
        } else {
            &b.layer
        }
    }

    let mut live: Vec<LiveBuffer> = plan
        .buffers
        .iter()
        .enumerate()
        .filter(|(i, b)| {
            if nsteps == 0 {
                b.persistent && occupied[*i].is_some()
            } else {
                live_at(*i, peak_t)
            }
        })
        .map(|(_, b)| b)
        .map(|b| LiveBuffer {
            id: b.id,
            name: b.name.clone(),
            kind: b.kind,
            bytes: b.bytes,
            layer: layer_name(b).to_string(),
        })
        .collect();
    live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.id.cmp(&b.id)));
    let saved_at_peak = live
        .iter()
        .filter(|l| saved.get(l.id).copied().unwrap_or(false))
        .map(|l| l.bytes)
        .sum();
    let (label, kernel, op, phase) = match plan.steps.get(peak_t) {
        Some(s) => {
            let k = plan.kernels.get(s.kernel);
            (
                s.label.clone(),
                k.map(|k| k.name.clone()).unwrap_or_default(),
                k.map(|k| k.op.kind_name().to_string()).unwrap_or_default(),
                s.phase,
            )
        }
        None => (
            "(no steps)".into(),
            String::new(),
            String::new(),
            StepPhase::Forward,
        ),
    };
    let peak = Peak {
        step: peak_t,
        label,
        kernel,
        op,
        phase,
        bytes: peak_by.total(),
        by_category: peak_by,
        saved_activations: saved_at_peak,
        live,
    };

    let mut all_buffers = ByCategory::default();
    for b in &plan.buffers {
        // a streamed tensor counts once, as its home (not its windows)
        let window =
            !b.persistent && matches!(b.kind, BufferKind::Parameter | BufferKind::OptimizerState);
        if !window {
            all_buffers.add(b.kind, b.bytes);
        }
    }
    let has_backward = backward_starts.is_some();
    // A recomputed value counts once, as the forward value it is a copy of.
    let mut saved_values: FxHashMap<&str, u64> = FxHashMap::default();
    for i in (0..saved.len()).filter(|&i| saved[i]) {
        let b = &plan.buffers[i];
        let name = b.name.split(" (recompute ").next().unwrap_or(&b.name);
        saved_values.insert(name, b.bytes);
    }
    let saved_bytes: u64 = saved_values.values().sum();
    let largest_workspace = plan
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::Workspace)
        .map(|b| b.bytes)
        .max()
        .unwrap_or(0);
    let mut conventional = Conventional {
        parameters: all_buffers.parameters,
        optimizer_state: all_buffers.optimizer_state,
        parameter_gradients: if has_backward {
            all_buffers.parameters
        } else {
            0
        },
        saved_activations: saved_bytes,
        inputs: all_buffers.inputs,
        largest_workspace,
        total: 0,
    };
    // (the running statistics, persistent in any framework, count in the total)
    conventional.total = all_buffers.running_stats
        + all_buffers.gradient_accumulators
        + conventional.parameters
        + conventional.optimizer_state
        + conventional.parameter_gradients
        + conventional.saved_activations
        + conventional.inputs
        + conventional.largest_workspace;

    // Per-layer rows, in the order their first buffer is written (persistent buffers count from
    // the first step that reads them).
    // A layer's first use is the first step any of its buffers is an argument of: per buffer by
    // one pass over the steps, then the least over the layer's buffers.
    let mut first_step: Vec<usize> = vec![usize::MAX; plan.buffers.len()];
    for (s, step) in plan.steps.iter().enumerate() {
        for &a in &step.args {
            if let Some(f) = first_step.get_mut(a) {
                *f = (*f).min(s);
            }
        }
    }
    // layer -> (first use, row)
    let mut rows: FxHashMap<&str, (usize, LayerRow)> = FxHashMap::default();
    for (i, b) in plan.buffers.iter().enumerate() {
        if b.kind == BufferKind::Input {
            continue;
        }
        let name = layer_name(b);
        let (first, row) = rows.entry(name).or_insert_with(|| {
            (
                usize::MAX,
                LayerRow {
                    layer: name.to_string(),
                    kept_for_backward: 0,
                    parameters: 0,
                    optimizer_state: 0,
                    largest_transient: 0,
                    largest_transient_name: String::new(),
                },
            )
        });
        *first = (*first).min(first_step[i]);
        match b.kind {
            BufferKind::Parameter => row.parameters += b.bytes,
            BufferKind::OptimizerState => row.optimizer_state += b.bytes,
            _ => {
                if saved.get(b.id).copied().unwrap_or(false) {
                    row.kept_for_backward += b.bytes;
                }
                if !b.persistent
                    && (b.bytes > row.largest_transient || row.largest_transient_name.is_empty())
                {
                    row.largest_transient = b.bytes;
                    row.largest_transient_name = b.name.clone();
                }
            }
        }
    }
    // (first use, row): layer names are distinct, so the order is total.
    let mut layers: Vec<(usize, LayerRow)> = rows.into_values().collect();
    layers.sort_unstable_by(|(fa, a), (fb, b)| (fa, &a.layer).cmp(&(fb, &b.layer)));
    let layers: Vec<LayerRow> = layers.into_iter().map(|(_, r)| r).collect();

    let lower_bound_bytes = peak.bytes;
    let fragmentation = if lower_bound_bytes == 0 {
        0.0
    } else {
        plan.arena_bytes as f64 / lower_bound_bytes as f64 - 1.0
    };
    // Per kernel (a step costs its kernel's FLOPs; many steps share a kernel).
    let kflops: Vec<u64> = plan.kernels.iter().map(crate::cost::kernel_flops).collect();
    let flops_of = |st: &crate::plan::Step| kflops.get(st.kernel).copied().unwrap_or(0);
    let step_flops: u64 = plan.steps.iter().map(flops_of).sum();
    let mut recomputed: Vec<Recomputed> = vec![];
    // Index in `recomputed` of each name.
    let mut recomputed_at: FxHashMap<String, usize> = FxHashMap::default();
    let mut recompute_flops = 0u64;
    for st in &plan.steps {
        if !crate::cost::is_recompute(&st.label) {
            continue;
        }
        let f = flops_of(st);
        recompute_flops += f;
        let name = st
            .label
            .split(" (recompute ")
            .next()
            .unwrap_or("")
            .to_string();
        match recomputed_at.get(&name) {
            Some(&k) => {
                recomputed[k].times += 1;
                recomputed[k].flops += f;
            }
            None => {
                recomputed_at.insert(name.clone(), recomputed.len());
                recomputed.push(Recomputed {
                    name,
                    times: 1,
                    flops: f,
                });
            }
        }
    }
    MemoryReport {
        mode: plan.mode,
        batch: plan.batch,
        accumulate: plan.accumulate,
        clip_norm: plan.clip_norm.clone(),
        steps: nsteps,
        buffers: plan.buffers.len(),
        arena_bytes: plan.arena_bytes,
        lower_bound_bytes,
        fragmentation,
        all_buffers,
        backward_starts,
        peak,
        conventional,
        layers,
        timeline,
        aliases,
        step_flops,
        recompute_flops,
        recomputed,
        remat: None,
        traffic: traffic(plan),
        unfused_traffic: None,
        streaming: streaming(plan),
        attention: attention_memory(plan),
        data_parallel: data_parallel(plan),
    }
}
