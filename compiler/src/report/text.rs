//! The memory report and the sweep as text: aligned columns, exact bytes and binary units,
//! deterministic (no timings, no addresses); and the report as JSON.

use std::fmt::Write as _;

use super::{recompute_pct, MemoryReport, CATEGORIES};
use crate::plan::{BufferKind, Mode, StepPhase};
use crate::sweep::Sweep;

/// `826152612` -> `826,152,612`: how dmc writes every large count (the `thousands` crate).
pub fn thousands(n: u64) -> String {
    use ::thousands::Separable;
    n.separate_with_commas()
}

/// Binary units with one decimal: `612 B`, `1.5 KiB`, `787.9 MiB`, `2.3 GiB`: how dmc writes
/// every byte size (the `bytesize` crate's IEC form).
pub fn human(n: u64) -> String {
    bytesize::ByteSize(n).display().iec().to_string()
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

pub(super) fn mode_name(m: Mode) -> &'static str {
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

/// The verdict of the report, at most ten lines: the arena against the cap (fits or not, spare),
/// the peak's moment and its main categories, what rematerialization chose and what it costs, the
/// arena against the keep-everything baseline, the kernels of a step; and where the details are.
pub fn render_verdict(r: &MemoryReport, cap: Option<u64>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} step, batch {}{}: arena {} ({} B), {:.2}% above the lower bound of any arena",
        mode_name(r.mode),
        r.batch,
        if r.accumulate > 1 {
            format!(
                " x {} accumulated micro-batches (effective batch {})",
                r.accumulate,
                r.batch * r.accumulate
            )
        } else {
            String::new()
        },
        human(r.arena_bytes),
        thousands(r.arena_bytes),
        r.fragmentation * 100.0
    );
    if let Some(c) = &r.clip_norm {
        let _ = writeln!(
            s,
            "  clip_norm {}: {}, +{} ({} B) and +{} FLOPs per step, {} extra forward/backward pass{}",
            c.max_norm,
            match c.method {
                crate::plan::ClipNormMethod::HeldGradients =>
                    "held gradients (every gradient kept until the global norm is summed)",
                crate::plan::ClipNormMethod::NormPass =>
                    "norm pass (a first forward/backward only sums the global norm; no gradient held)",
            },
            human(c.extra_bytes),
            thousands(c.extra_bytes),
            thousands(c.extra_flops),
            c.extra_passes,
            if c.extra_passes == 1 { "" } else { "es" }
        );
    }
    let _ = match cap {
        Some(cap) if r.arena_bytes <= cap => writeln!(
            s,
            "  fits the cap of {}: {} spare",
            human(cap),
            human(cap - r.arena_bytes)
        ),
        Some(cap) => writeln!(
            s,
            "  does NOT fit the cap of {}: over by {}",
            human(cap),
            human(r.arena_bytes - cap)
        ),
        None => writeln!(s, "  no cap given (--vram-cap SIZE plans for one)"),
    };
    let p = &r.peak;
    // The categories of the peak, largest first, those under 1% of it left out.
    let mut cats: Vec<(&str, u64)> = CATEGORIES
        .iter()
        .map(|(k, name)| (*name, p.by_category.get(*k)))
        .filter(|&(_, b)| b > 0 && b * 100 >= p.bytes)
        .collect();
    cats.sort_by_key(|b| std::cmp::Reverse(b.1));
    let cats: Vec<String> = cats
        .iter()
        .map(|(n, b)| format!("{n} {}", human(*b)))
        .collect();
    let _ = writeln!(
        s,
        "  peak {} at step {} `{}` ({}): {}",
        human(p.bytes),
        p.step,
        p.label,
        phase_name(p.phase),
        if cats.is_empty() {
            "-".to_string()
        } else {
            cats.join(", ")
        }
    );
    let _ = match &r.remat {
        Some(m) => writeln!(
            s,
            "  recomputation: {} saves {} (arena without it {}) for {:.1}% more FLOPs",
            m.strategy,
            human(m.saved_bytes),
            human(m.no_remat_arena),
            recompute_pct(r)
        ),
        None if r.recompute_flops > 0 => writeln!(
            s,
            "  recomputation: {} FLOPs ({:.1}% more)",
            thousands(r.recompute_flops),
            recompute_pct(r)
        ),
        None if r.mode == Mode::Train => writeln!(s, "  recomputation: none needed"),
        None => Ok(()),
    };
    if let Some(st) = &r.streaming {
        render_streaming(&mut s, st);
    }
    if r.conventional.total > 0 {
        let _ = writeln!(
            s,
            "  keep-everything baseline {} (every parameter gradient and saved activation at once): the arena is {} of it",
            human(r.conventional.total),
            pct(r.arena_bytes, r.conventional.total)
        );
    }
    if let Some(a) = &r.attention {
        let _ = writeln!(
            s,
            "  attention: {} fused layer(s) keep {} of log-sum-exps; a plain implementation would also keep {} of T x T attention probabilities",
            a.layers,
            human(a.fused_bytes),
            human(a.plain_bytes)
        );
    }
    if let Some(d) = &r.data_parallel {
        let _ = writeln!(
            s,
            "  data parallel: {} ranks, each on {} of every batch of {} and holding {} of the {} optimizer state (1/{}){}; each rank sends {} a step ({})",
            d.ranks,
            d.batch,
            d.batch * d.ranks,
            human(d.state_bytes_per_rank),
            human(d.state_bytes_whole),
            d.ranks,
            if d.param_bytes_per_rank < d.param_bytes_whole {
                format!(
                    " and {} of the {} parameters (sharded, each gathered whole for its uses)",
                    human(d.param_bytes_per_rank),
                    human(d.param_bytes_whole)
                )
            } else {
                String::new()
            },
            human(d.sent_bytes_per_rank),
            d.link_seconds
                .iter()
                .map(|(l, t)| format!("{:.2} ms on {l}", t * 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let t = &r.traffic;
    let _ = write!(
        s,
        "  kernels per step: {}, moving at least {}",
        t.kernels,
        human(t.bytes)
    );
    let _ = match &r.unfused_traffic {
        Some(u) => writeln!(
            s,
            " (without fusion: {} kernels, {})",
            u.kernels,
            human(u.bytes)
        ),
        None => writeln!(s),
    };
    s
}

/// The streaming lines of the verdict: what lives in the host store, the windows, the copies.
fn render_streaming(s: &mut String, st: &super::Streaming) {
    let t = &st.totals;
    let offloaded = if st.offloaded_tensors > 0 {
        format!(
            " and {} activations offloaded between forward and backward ({})",
            st.offloaded_tensors,
            human(st.offloaded_bytes)
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "  streaming: {} parameter / optimizer state tensors ({}){offloaded} live in the host store ({} with alignment), {} of the parameters and optimizer state stay resident; {} windows, at most {} of them in the arena at once",
        st.streamed_tensors,
        human(st.streamed_bytes),
        human(t.host_store),
        human(t.resident),
        st.windows,
        human(st.window_peak)
    );
    let times: Vec<String> = st
        .transfer_s
        .iter()
        .map(|(l, sec)| format!("{:.1} ms on {l}", sec * 1e3))
        .collect();
    let _ = writeln!(
        s,
        "  copies per step: {} host->device + {} device->host in {} copies: {}",
        human(t.host_to_device),
        human(t.device_to_host),
        t.copies,
        times.join(", ")
    );
}

/// The report as readable text: the [`render_verdict`], then (with `verbose`) the details in aligned
/// columns, sizes as exact bytes and in binary units. Deterministic (no timings, no addresses).
/// With `cap`, says whether the arena and the keep-everything baseline fit in it.
pub fn render_text(r: &MemoryReport, cap: Option<u64>, verbose: bool) -> String {
    let mut s = render_verdict(r, cap);
    if !verbose {
        s.push_str("  details (buffers at the peak, per layer, per step): --verbose; all of it as JSON: --json\n");
        return s;
    }
    s.push('\n');
    let _ = writeln!(
        s,
        "dmc memory report: {} mode, batch {}, {} steps, {} buffers",
        mode_name(r.mode),
        r.batch,
        r.steps,
        r.buffers
    );
    let t = &r.traffic;
    let _ = write!(
        s,
        "kernels per step: {}, moving at least {} ({} B: each kernel argument once)",
        t.kernels,
        human(t.bytes),
        thousands(t.bytes)
    );
    match &r.unfused_traffic {
        Some(u) => {
            let _ = writeln!(
                s,
                "; without fusion (--no-fuse): {} kernels, {} ({} B)",
                u.kernels,
                human(u.bytes),
                thousands(u.bytes)
            );
        }
        None => s.push('\n'),
    }
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
        if matches!(k, BufferKind::RunningStat | BufferKind::GradAccum) && b == 0 {
            continue;
        }
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
    let _ = writeln!(
        s,
        "Keep-everything baseline, same program (a model of a framework's step, not a measurement)"
    );
    let mut t = Table::new("<>><");
    t.row(["", "keep-everything", "", "dmc at its peak"]);
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
            "  dmc's lower bound is {} of the baseline; its arena is {}.",
            pct(r.lower_bound_bytes, c.total),
            pct(r.arena_bytes, c.total)
        );
    }
    if let Some(cap) = cap {
        let _ = writeln!(
            s,
            "  against the cap of {}: the baseline {}, dmc's arena {}.",
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
        "  The baseline: all parameters and optimizer state; a whole gradient for every parameter,\n  \
         all alive at once; every activation the backward reads, kept from the forward (no in-place\n  \
         updates, no recomputation); the inputs; the largest single workspace. A model, not a bound:\n  \
         a real framework holds more where it caches allocations or keeps activation gradients in\n  \
         flight, and less where it frees gradients early (PyTorch with its optimizer step in the\n  \
         backward measured below it: BENCHMARKS.md). The dmc column is the breakdown at dmc's peak\n  \
         step (gradients there include activation gradients, activations include transient ones)."
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

/// [`render_json`] written to `w` as it is serialised (the same bytes; no string of the whole
/// report, which is hundreds of MB for a deep network), the buffers live at the peak, the
/// per-layer rows and the timeline each on two threads ([`crate::json`]; taken out of `r`
/// meanwhile, and put back).
pub fn write_json(w: &mut impl std::io::Write, r: &mut MemoryReport) -> std::io::Result<()> {
    use crate::json::{write_array, write_pretty_with};
    let live = std::mem::take(&mut r.peak.live);
    let layers = std::mem::take(&mut r.layers);
    let timeline = std::mem::take(&mut r.timeline);
    let written = write_pretty_with(
        w,
        r,
        &mut [
            ("peak.live", &mut |w| write_array(w, &live, 2)),
            ("layers", &mut |w| write_array(w, &layers, 1)),
            ("timeline", &mut |w| write_array(w, &timeline, 1)),
        ],
    );
    r.peak.live = live;
    r.layers = layers;
    r.timeline = timeline;
    written
}

/// The sweep as text: one row per cap, dmc's recompute and predicted step time against sqrt(n)
/// and checkpoint-all.
pub fn render_sweep_text(sw: &Sweep) -> String {
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
    let _ = writeln!(
        s,
        "step = dmc's step time predicted by the CPU time model at {}, and its ratio to the step without a cap ({:.2} ms)",
        sw.rates,
        sw.no_remat_s * 1e3
    );
    let mut t = Table::new(">>>>>>>>>>");
    t.row([
        "cap",
        "",
        "% of no-remat",
        "dmc arena",
        "dmc",
        "step",
        "x uncapped",
        "sqrt(n)",
        "checkpoint-all",
        "host store",
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
            format!("{:.2} ms", p.predicted_s * 1e3),
            format!("{:.2}x", p.predicted_s / sw.no_remat_s.max(1e-12)),
            opt(p.sqrt_pct),
            opt(p.keep_all_pct),
            if p.host == 0 {
                "-".into()
            } else {
                human(p.host)
            },
        ]);
    }
    t.render(&mut s);
    s
}
