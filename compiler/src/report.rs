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
//! Renderers: [`render_text`] (aligned columns, exact bytes and human units, deterministic),
//! [`render_json`] (serde) and [`render_svg`] (live bytes over the step, stacked by category,
//! with the arena size and an optional cap as horizontal lines).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::plan::{layer_of, BufferId, BufferKind, Mode, Plan, StepPhase};

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
}

/// The categories in report order, with their display names.
pub const CATEGORIES: [(BufferKind, &str); 6] = [
    (BufferKind::Parameter, "parameters"),
    (BufferKind::OptimizerState, "optimizer state"),
    (BufferKind::Input, "inputs"),
    (BufferKind::Activation, "activations"),
    (BufferKind::Gradient, "gradients"),
    (BufferKind::Workspace, "workspace"),
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
    let mut occupied: Vec<Option<(usize, usize)>> =
        plan.buffers.iter().map(|b| Some(full(b))).collect();
    let mut root_of: Vec<BufferId> = (0..plan.buffers.len()).collect();
    let mut aliases: Vec<Alias> = vec![];
    // Per (offset, bytes): the buffers first seen there, and the latest step any of them is
    // occupied (a buffer starting after it overlaps none of them: no scan; in a plan, buffers
    // reusing the same bytes come in step order, so that is the common case).
    let mut at_bytes: BTreeMap<(u64, u64), (Vec<usize>, usize)> = BTreeMap::new();
    for (i, b) in plan.buffers.iter().enumerate() {
        if b.bytes == 0 {
            continue;
        }
        let (lo, hi) = full(b);
        let (same, last) = at_bytes.entry((b.offset, b.bytes)).or_default();
        let root = if same.is_empty() || lo > *last {
            None
        } else {
            same.iter()
                .copied()
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
            None => same.push(i),
        }
    }
    let live_at = |i: usize, t: usize| matches!(occupied[i], Some((l, h)) if l <= t && t <= h);

    // Timeline by difference arrays over the occupied ranges.
    let mut delta: Vec<[i128; 6]> = vec![[0; 6]; npoints + 1];
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
    let mut running = [0i128; 6];
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
    let mut saved: BTreeSet<BufferId> = BTreeSet::new();
    for (s, step) in plan.steps.iter().enumerate() {
        // Fused weight-gradient + update kernels (phase Update) read forward values too.
        if !matches!(step.phase, StepPhase::Backward | StepPhase::Update) {
            continue;
        }
        for &a in &step.args {
            let Some(&a) = root_of.get(a) else { continue };
            let b = &plan.buffers[a];
            if b.kind == BufferKind::Activation && !b.persistent && b.live.0 < s {
                saved.insert(a);
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
        .filter(|l| saved.contains(&l.id))
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
        all_buffers.add(b.kind, b.bytes);
    }
    let has_backward = backward_starts.is_some();
    // A recomputed value counts once, as the forward value it is a copy of.
    let mut saved_values: BTreeMap<&str, u64> = BTreeMap::new();
    for &i in &saved {
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
    conventional.total = conventional.parameters
        + conventional.optimizer_state
        + conventional.parameter_gradients
        + conventional.saved_activations
        + conventional.inputs
        + conventional.largest_workspace;

    // Per-layer rows, in the order their first buffer is written (persistent buffers count from
    // the first step that reads them).
    let mut first_use: BTreeMap<&str, usize> = BTreeMap::new();
    let mut rows: BTreeMap<&str, LayerRow> = BTreeMap::new();
    for (s, step) in plan.steps.iter().enumerate() {
        for &a in &step.args {
            if let Some(b) = plan.buffers.get(a) {
                if b.kind != BufferKind::Input {
                    first_use.entry(layer_name(b)).or_insert(s);
                }
            }
        }
    }
    for b in &plan.buffers {
        if b.kind == BufferKind::Input {
            continue;
        }
        let name = layer_name(b);
        let row = rows.entry(name).or_insert_with(|| LayerRow {
            layer: name.to_string(),
            kept_for_backward: 0,
            parameters: 0,
            optimizer_state: 0,
            largest_transient: 0,
            largest_transient_name: String::new(),
        });
        match b.kind {
            BufferKind::Parameter => row.parameters += b.bytes,
            BufferKind::OptimizerState => row.optimizer_state += b.bytes,
            _ => {
                if saved.contains(&b.id) {
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
    let mut layers: Vec<LayerRow> = rows.into_values().collect();
    let first = |r: &LayerRow| {
        first_use
            .get(r.layer.as_str())
            .copied()
            .unwrap_or(usize::MAX)
    };
    layers.sort_by(|a, b| (first(a), &a.layer).cmp(&(first(b), &b.layer)));

    let lower_bound_bytes = peak.bytes;
    let fragmentation = if lower_bound_bytes == 0 {
        0.0
    } else {
        plan.arena_bytes as f64 / lower_bound_bytes as f64 - 1.0
    };
    let step_flops: u64 = (0..nsteps).map(|t| crate::cost::step_flops(plan, t)).sum();
    let mut recomputed: Vec<Recomputed> = vec![];
    // Index in `recomputed` of each name.
    let mut recomputed_at: HashMap<String, usize> = HashMap::new();
    let mut recompute_flops = 0u64;
    for (t, st) in plan.steps.iter().enumerate() {
        if !crate::cost::is_recompute(&st.label) {
            continue;
        }
        let f = crate::cost::step_flops(plan, t);
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
    }
}

/// `826152612` -> `826,152,612`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let head = match s.len() % 3 {
        0 => 3.min(s.len()),
        r => r,
    };
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    out.push_str(&s[..head]);
    for chunk in s.as_bytes()[head..].chunks(3) {
        out.push(',');
        out.extend(chunk.iter().map(|&b| b as char));
    }
    out
}

/// Binary units with one decimal: `612 B`, `1.5 KiB`, `787.9 MiB`, `2.3 GiB`.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

fn phase_name(p: StepPhase) -> &'static str {
    match p {
        StepPhase::Forward => "forward",
        StepPhase::Loss => "loss",
        StepPhase::Backward => "backward",
        StepPhase::Update => "update",
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Train => "train",
        Mode::Eval => "eval",
        Mode::Predict => "predict",
    }
}

/// A table of left- (`<`) or right- (`>`) aligned columns, two spaces apart, indented by two.
struct Table {
    align: Vec<char>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(align: &str) -> Self {
        Table {
            align: align.chars().collect(),
            rows: vec![],
        }
    }
    fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }
    fn render(&self, out: &mut String) {
        let ncols = self.align.len();
        let mut w = vec![0; ncols];
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(ncols) {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let spaces = |line: &mut String, k: usize| line.extend(std::iter::repeat_n(' ', k));
        let mut line = String::new();
        for r in &self.rows {
            line.clear();
            line.push(' ');
            for (i, c) in r.iter().enumerate().take(ncols) {
                line.push(' ');
                let pad = w[i] - c.chars().count();
                let last = i + 1 == r.len().min(ncols);
                if self.align[i] == '>' {
                    spaces(&mut line, pad);
                    line.push_str(c);
                } else {
                    line.push_str(c);
                    if !last {
                        spaces(&mut line, pad);
                    }
                }
                if !last {
                    line.push(' ');
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

/// The report as readable text: aligned columns, sizes as exact bytes and in binary units.
/// Deterministic (no timings, no addresses). With `cap`, says whether the arena and the
/// conventional estimate fit in it.
pub fn render_text(r: &MemoryReport, cap: Option<u64>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "dmc memory report: {} mode, batch {}, {} steps, {} buffers",
        mode_name(r.mode),
        r.batch,
        r.steps,
        r.buffers
    );
    s.push('\n');

    let p = &r.peak;
    let _ = writeln!(s, "Peak of live bytes (the lower bound for any arena)");
    let _ = writeln!(
        s,
        "  at step {} `{}` ({}, kernel {}, op {})",
        p.step,
        p.label,
        phase_name(p.phase),
        if p.kernel.is_empty() { "-" } else { &p.kernel },
        if p.op.is_empty() { "-" } else { &p.op },
    );
    let mut t = Table::new("<>>>");
    t.row(["category", "bytes", "", "share"]);
    for (k, name) in CATEGORIES {
        let b = p.by_category.get(k);
        t.row([name.to_string(), thousands(b), human(b), pct(b, p.bytes)]);
    }
    t.row([
        "total".to_string(),
        thousands(p.bytes),
        human(p.bytes),
        pct(p.bytes, p.bytes),
    ]);
    t.render(&mut s);
    let _ = writeln!(
        s,
        "  of the live activations, kept from the forward for the backward: {} ({})",
        thousands(p.saved_activations),
        human(p.saved_activations)
    );
    s.push('\n');

    let _ = writeln!(s, "Arena");
    let mut t = Table::new("<>><");
    t.row([
        "arena size".to_string(),
        thousands(r.arena_bytes),
        human(r.arena_bytes),
        String::new(),
    ]);
    t.row([
        "lower bound".to_string(),
        thousands(r.lower_bound_bytes),
        human(r.lower_bound_bytes),
        "(peak of live bytes)".to_string(),
    ]);
    t.row([
        "all buffers".to_string(),
        thousands(r.all_buffers.total()),
        human(r.all_buffers.total()),
        "(if no two buffers shared bytes)".to_string(),
    ]);
    if let Some(cap) = cap {
        let verdict = if r.arena_bytes <= cap {
            format!("arena fits, {} spare", human(cap - r.arena_bytes))
        } else {
            format!("arena exceeds it by {}", human(r.arena_bytes - cap))
        };
        t.row(["cap".to_string(), thousands(cap), human(cap), verdict]);
    }
    t.render(&mut s);
    let _ = writeln!(
        s,
        "  fragmentation: {:.4} (arena / lower bound - 1 = {:.2}%)",
        r.fragmentation,
        r.fragmentation * 100.0
    );
    s.push('\n');

    let c = &r.conventional;
    let _ = writeln!(s, "Conventional framework, same program (estimate)");
    let mut t = Table::new("<>><");
    t.row(["", "conventional", "", "dmc at its peak"]);
    let dmc = |v: u64| format!("{} ({})", thousands(v), human(v));
    let rows: [(&str, u64, Option<u64>); 6] = [
        ("parameters", c.parameters, Some(p.by_category.parameters)),
        (
            "optimizer state",
            c.optimizer_state,
            Some(p.by_category.optimizer_state),
        ),
        (
            "parameter gradients",
            c.parameter_gradients,
            Some(p.by_category.gradients),
        ),
        (
            "saved activations",
            c.saved_activations,
            Some(p.by_category.activations),
        ),
        ("inputs", c.inputs, Some(p.by_category.inputs)),
        (
            "largest workspace",
            c.largest_workspace,
            Some(p.by_category.workspace),
        ),
    ];
    for (name, v, d) in rows {
        t.row([
            name.to_string(),
            thousands(v),
            human(v),
            d.map(dmc).unwrap_or_default(),
        ]);
    }
    t.row([
        "total".to_string(),
        thousands(c.total),
        human(c.total),
        dmc(p.bytes),
    ]);
    t.render(&mut s);
    if c.total > 0 {
        let _ = writeln!(
            s,
            "  dmc's lower bound is {} of the conventional estimate; its arena is {}.",
            pct(r.lower_bound_bytes, c.total),
            pct(r.arena_bytes, c.total)
        );
    }
    if let Some(cap) = cap {
        let _ = writeln!(
            s,
            "  against the cap of {}: conventional {}, dmc arena {}.",
            human(cap),
            if c.total <= cap {
                "fits"
            } else {
                "does not fit"
            },
            if r.arena_bytes <= cap {
                "fits"
            } else {
                "does not fit"
            }
        );
    }
    let _ = writeln!(
        s,
        "  The conventional model: all parameters and optimizer state; a gradient for every\n  \
         parameter, all alive at once; every activation the backward reads, kept from the forward\n  \
         (no in-place updates, no recomputation); the inputs; the largest single workspace. It\n  \
         leaves out activation gradients in flight and allocator overhead, so a real framework\n  \
         needs at least this much. The dmc column is the breakdown at dmc's peak step (gradients\n  \
         there include activation gradients, activations include transient ones)."
    );
    s.push('\n');

    let _ = writeln!(
        s,
        "Buffers live at the peak ({}, largest first)",
        p.live.len()
    );
    let mut t = Table::new(">><<");
    t.row(["bytes", "", "kind", "name"]);
    for b in &p.live {
        t.row([
            thousands(b.bytes),
            human(b.bytes),
            format!("{:?}", b.kind),
            b.name.clone(),
        ]);
    }
    t.render(&mut s);
    s.push('\n');

    if !r.aliases.is_empty() {
        let _ = writeln!(
            s,
            "Views ({}, counted under the buffer whose bytes they share)",
            r.aliases.len()
        );
        let mut t = Table::new("<<<");
        t.row(["view", "", "of"]);
        for a in &r.aliases {
            t.row([
                format!("#{} {}", a.buffer, a.name),
                "->".to_string(),
                format!("#{} {}", a.of, a.of_name),
            ]);
        }
        t.render(&mut s);
        s.push('\n');
    }

    if r.recompute_flops > 0 || r.remat.is_some() {
        let _ = writeln!(s, "Rematerialization");
        if let Some(m) = &r.remat {
            let _ = writeln!(
                s,
                "  without recomputation the arena is {} ({}){}; strategy: {} over a chain of {} stages",
                thousands(m.no_remat_arena),
                human(m.no_remat_arena),
                match cap {
                    Some(c) => format!(", over the cap of {}", human(c)),
                    None => String::new(),
                },
                m.strategy,
                m.stages
            );
            if !m.sequence.is_empty() {
                let _ = writeln!(s, "  {}", m.sequence);
                let _ = writeln!(
                    s,
                    "  (f: forward keeping only stage outputs, F: forward keeping what the backward reads, B: backward; stages numbered from the input)"
                );
            }
            let _ = writeln!(
                s,
                "  memory saved: {} ({})",
                thousands(m.saved_bytes),
                human(m.saved_bytes)
            );
        }
        let _ = writeln!(
            s,
            "  recompute: {} FLOPs = {:.1}% of the step's {} FLOPs (cost model: 2 per multiply-add)",
            thousands(r.recompute_flops),
            recompute_pct(r),
            thousands(r.step_flops.saturating_sub(r.recompute_flops))
        );
        let _ = writeln!(
            s,
            "  recomputed ({} nodes; their saved values are dropped after the forward and rebuilt before their backward):",
            r.recomputed.len()
        );
        let mut t = Table::new("<>>>");
        t.row(["  node", "extra runs", "FLOPs", "share"]);
        for x in &r.recomputed {
            t.row([
                format!("  {}", x.name),
                x.times.to_string(),
                thousands(x.flops),
                format!(
                    "{:.1}%",
                    100.0 * x.flops as f64
                        / r.step_flops.saturating_sub(r.recompute_flops).max(1) as f64
                ),
            ]);
        }
        t.render(&mut s);
        s.push('\n');
    }

    let _ = writeln!(s, "Layers ({}, in order of first use)", r.layers.len());
    let mut t = Table::new("<>>>>>><");
    t.row([
        "layer",
        "kept for backward",
        "",
        "parameters",
        "",
        "largest transient",
        "",
        "",
    ]);
    for l in &r.layers {
        t.row([
            l.layer.clone(),
            thousands(l.kept_for_backward),
            human(l.kept_for_backward),
            thousands(l.parameters),
            human(l.parameters),
            thousands(l.largest_transient),
            human(l.largest_transient),
            l.largest_transient_name.clone(),
        ]);
    }
    t.render(&mut s);
    s.push('\n');

    let _ = writeln!(s, "Timeline: live bytes per step, by category");
    let mut t = Table::new(">><>>>>>>><<");
    t.row([
        "step", "total", "", "phase", "params", "opt", "inputs", "act", "grad", "ws", "label", "",
    ]);
    for pt in &r.timeline {
        let b = &pt.by_category;
        t.row([
            pt.step.to_string(),
            thousands(pt.total),
            human(pt.total),
            phase_name(pt.phase).to_string(),
            human(b.parameters),
            human(b.optimizer_state),
            human(b.inputs),
            human(b.activations),
            human(b.gradients),
            human(b.workspace),
            pt.label.clone(),
            if pt.step == p.step && r.steps > 0 {
                "<- peak".to_string()
            } else {
                String::new()
            },
        ]);
    }
    t.render(&mut s);
    s
}

/// The report as pretty-printed JSON.
pub fn render_json(r: &MemoryReport) -> String {
    serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// Why [`render_svg`] failed (the plotting backend's error, as text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rendering the memory chart: {0}")]
pub struct RenderError(pub String);

/// The colour of each category, in [`CATEGORIES`] order.
const COLORS: [(u8, u8, u8); 6] = [
    (31, 119, 180),  // parameters: blue
    (148, 103, 189), // optimizer state: purple
    (127, 127, 127), // inputs: grey
    (44, 160, 44),   // activations: green
    (255, 127, 14),  // gradients: orange
    (188, 189, 34),  // workspace: olive
];

/// A chart of live bytes over the step (x: step index, y: MiB; KiB or bytes for small programs), stacked by category, with the
/// arena size and, when given, the cap as horizontal lines; legend and axis labels. Pure SVG:
/// text is emitted as `<text>` elements, no fonts are read.
pub fn render_svg(r: &MemoryReport, cap: Option<u64>) -> Result<String, RenderError> {
    use plotters::prelude::*;

    let err = |e: &dyn std::fmt::Display| RenderError(e.to_string());
    let xmax = r.timeline.len().max(1) as f64;
    let max_bytes = r
        .lower_bound_bytes
        .max(r.arena_bytes)
        .max(cap.unwrap_or(0))
        .max(1);
    // MiB, or a smaller unit for small programs so that the axis stays readable.
    let (unit, unit_name) = if max_bytes >= 1 << 20 {
        ((1u64 << 20) as f64, "MiB")
    } else if max_bytes >= 1 << 10 {
        (1024.0, "KiB")
    } else {
        (1.0, "bytes")
    };
    let y = |bytes: u64| bytes as f64 / unit;
    // Headroom above the highest line for the legend in the upper right corner.
    let top = y(max_bytes) * 1.45;

    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1100, 620)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let caption = format!(
            "dmc: live bytes per step ({} mode, batch {}; peak {} at step {})",
            mode_name(r.mode),
            r.batch,
            human(r.lower_bound_bytes),
            r.peak.step
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..xmax, 0f64..top)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc(format!("live {unit_name}"))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 15))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| err(&e))?;

        // Stacked areas: each category's area reaches the cumulative sum up to it; drawn from the
        // top down so each lower one covers the ones above it. Values step at step boundaries.
        for (i, (_, name)) in CATEGORIES.iter().enumerate().rev() {
            let cum = |p: &TimelinePoint| -> f64 {
                CATEGORIES[..=i]
                    .iter()
                    .map(|(k, _)| p.by_category.get(*k))
                    .sum::<u64>() as f64
                    / unit
            };
            let pts: Vec<(f64, f64)> = r
                .timeline
                .iter()
                .flat_map(|p| [(p.step as f64, cum(p)), (p.step as f64 + 1.0, cum(p))])
                .collect();
            let (cr, cg, cb) = COLORS[i];
            let color = RGBColor(cr, cg, cb);
            chart
                .draw_series(AreaSeries::new(pts, 0.0, color.filled()).border_style(color))
                .map_err(|e| err(&e))?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }

        let hline = |y: f64| vec![(0.0, y), (xmax, y)];
        let arena = RGBColor(0, 0, 0);
        chart
            .draw_series(LineSeries::new(
                hline(y(r.arena_bytes)),
                arena.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!("arena {}", human(r.arena_bytes)))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 12, y)], arena.stroke_width(2))
            });
        if let Some(cap) = cap {
            let red = RGBColor(214, 39, 40);
            chart
                .draw_series(LineSeries::new(hline(y(cap)), red.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(format!("cap {}", human(cap)))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 12, y)], red.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(out)
}

/// The sweep as text: one row per cap, dmc's recompute against sqrt(n) and checkpoint-all.
pub fn render_sweep_text(sw: &crate::Sweep) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Memory / recompute trade-off: no-remat arena {} ({}), smallest arena with remat {} ({:.1}%), sqrt(n) {} ({:.1}% recompute)",
        thousands(sw.no_remat_arena),
        human(sw.no_remat_arena),
        human(sw.min_arena),
        100.0 * sw.min_arena as f64 / sw.no_remat_arena.max(1) as f64,
        human(sw.sqrt_arena),
        sw.sqrt_pct
    );
    let _ = writeln!(
        s,
        "recompute = added FLOPs in % of the step's {} FLOPs (same cost model for all three)",
        thousands(sw.step_flops)
    );
    let mut t = Table::new(">>>>>>>");
    t.row([
        "cap",
        "",
        "% of no-remat",
        "dmc arena",
        "dmc",
        "sqrt(n)",
        "checkpoint-all",
    ]);
    let opt = |p: Option<f64>| p.map(|v| format!("{v:.1}%")).unwrap_or_else(|| "-".into());
    for p in &sw.points {
        t.row([
            thousands(p.cap),
            human(p.cap),
            format!(
                "{:.1}%",
                100.0 * p.cap as f64 / sw.no_remat_arena.max(1) as f64
            ),
            human(p.arena),
            format!("{:.1}%", p.recompute_pct),
            opt(p.sqrt_pct),
            opt(p.keep_all_pct),
        ]);
    }
    t.render(&mut s);
    s
}

/// The sweep as an SVG chart: recompute % over the cap (MiB), dmc's curve with sqrt(n) and
/// checkpoint-all (each from the cap where it fits).
pub fn render_sweep_svg(sw: &crate::Sweep) -> Result<String, RenderError> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| RenderError(e.to_string());
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let xmin = mib(sw.min_arena) * 0.95;
    let xmax = mib(sw.no_remat_arena.max(sw.sqrt_arena)) * 1.05;
    let ymax = sw
        .points
        .iter()
        .map(|p| p.recompute_pct)
        .fold(sw.sqrt_pct, f64::max)
        .max(1.0)
        * 1.3;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (900, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "dmc: recompute FLOPs (% of the step) vs. memory cap",
                ("sans-serif", 20),
            )
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d(xmin..xmax, 0f64..ymax)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("cap (MiB)")
            .y_desc("recompute (% of step FLOPs)")
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 15))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| err(&e))?;
        let blue = RGBColor(31, 119, 180);
        let pts: Vec<(f64, f64)> = sw
            .points
            .iter()
            .map(|p| (mib(p.cap), p.recompute_pct))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), blue.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label("dmc (optimal)")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 12, y)], blue.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, blue.filled())))
            .map_err(|e| err(&e))?;
        let orange = RGBColor(255, 127, 14);
        chart
            .draw_series(LineSeries::new(
                vec![(mib(sw.sqrt_arena), sw.sqrt_pct), (xmax, sw.sqrt_pct)],
                orange.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label("sqrt(n) checkpointing")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 12, y)], orange.stroke_width(2))
            });
        let green = RGBColor(44, 160, 44);
        chart
            .draw_series(std::iter::once(Circle::new(
                (mib(sw.no_remat_arena), 0.0),
                6,
                green.filled(),
            )))
            .map_err(|e| err(&e))?
            .label("checkpoint-all (no remat)")
            .legend(move |(x, y)| Circle::new((x + 6, y), 4, green.filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(826_152_612), "826,152,612");
        assert_eq!(human(612), "612 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(826_152_612), "787.9 MiB");
    }

    #[test]
    fn layer_names() {
        assert_eq!(layer_of("conv2d_3"), "conv2d_3");
        assert_eq!(layer_of("conv2d_3.weight"), "conv2d_3");
        assert_eq!(layer_of("grad conv2d_3.weight"), "conv2d_3");
        assert_eq!(layer_of("grad conv2d_3 (sum)"), "conv2d_3");
        assert_eq!(layer_of("conv2d_3 workspace"), "conv2d_3");
        assert_eq!(layer_of("conv2d_3.weight update"), "conv2d_3");
        assert_eq!(layer_of("max_pooling2d_1.argmax"), "max_pooling2d_1");
        assert_eq!(layer_of("x"), "x");
    }
}
