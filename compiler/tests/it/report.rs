//! The memory report: the seed network's text report (snapshot) and invariants on every fixture.

use std::collections::BTreeSet;

use dmc_compiler::plan::{layer_of, BufferKind, Mode, Plan, StepPhase};
use dmc_compiler::report::{
    human, memory_report, render_json, render_svg, render_text, thousands, MemoryReport,
};
use dmc_compiler::testutil::{adam, seed, sgd_momentum, small_fixtures};
use dmc_compiler::{compile, CompileOptions};

fn plan_of(m: &dmc_grammar::model::Model, mode: Mode) -> Plan {
    compile(
        m,
        &CompileOptions {
            mode,
            ..Default::default()
        },
    )
    .unwrap()
}

fn seed_plan() -> Plan {
    compile(&seed(), &CompileOptions::default()).unwrap()
}

/// Recomputes the live bytes at step `t` from scratch.
fn live_bytes(p: &Plan, t: usize) -> u64 {
    p.buffers
        .iter()
        .filter(|b| b.persistent || (b.live.0 <= t && t <= b.live.1))
        .map(|b| b.bytes)
        .sum()
}

/// The invariants every report satisfies.
fn check_invariants(p: &Plan, r: &MemoryReport) {
    let peak = &r.peak;
    assert_eq!(peak.by_category.total(), peak.bytes, "category sum = peak");
    assert_eq!(r.lower_bound_bytes, peak.bytes);
    assert!(
        r.lower_bound_bytes <= r.arena_bytes,
        "{} > {}",
        r.lower_bound_bytes,
        r.arena_bytes
    );
    assert!(r.fragmentation >= 0.0 && r.fragmentation.is_finite());
    assert_eq!(
        peak.live.iter().map(|b| b.bytes).sum::<u64>(),
        peak.bytes,
        "live list sums to the peak"
    );
    assert!(peak.live.windows(2).all(|w| w[0].bytes >= w[1].bytes));
    assert!(peak.saved_activations <= peak.by_category.activations);
    // The timeline agrees with a from-scratch count, and the peak is its maximum.
    assert_eq!(r.timeline.len(), p.steps.len());
    for pt in &r.timeline {
        assert_eq!(pt.total, pt.by_category.total());
        assert_eq!(pt.total, live_bytes(p, pt.step), "step {}", pt.step);
        assert!(pt.total <= peak.bytes);
    }
    assert_eq!(r.timeline[peak.step].total, peak.bytes);
    assert!(r.timeline[..peak.step]
        .iter()
        .all(|pt| pt.total < peak.bytes));
    // Conventional: parameters (+ their gradients in training) at least.
    let params: u64 = p.params.iter().map(|b| p.buffers[b.buffer].bytes).sum();
    let c = &r.conventional;
    assert_eq!(c.parameters, params);
    assert_eq!(
        c.total,
        c.parameters
            + c.optimizer_state
            + c.parameter_gradients
            + c.saved_activations
            + c.inputs
            + c.largest_workspace
    );
    if p.mode == Mode::Train {
        assert_eq!(c.parameter_gradients, params);
        assert!(c.total >= 2 * params);
        assert!(r.backward_starts.is_some());
    } else {
        assert_eq!((c.parameter_gradients, c.saved_activations), (0, 0));
    }
    // Layers: parameter bytes add up; what a layer keeps is what the conventional model saves.
    assert_eq!(r.layers.iter().map(|l| l.parameters).sum::<u64>(), params);
    assert_eq!(
        r.layers.iter().map(|l| l.kept_for_backward).sum::<u64>(),
        c.saved_activations
    );
    let names: BTreeSet<&str> = r.layers.iter().map(|l| l.layer.as_str()).collect();
    assert_eq!(names.len(), r.layers.len(), "one row per layer");
    // JSON round-trips.
    let v = serde_json::to_value(r).unwrap();
    assert_eq!(serde_json::from_value::<MemoryReport>(v).unwrap(), *r);
    // Through text, floats may move in the last bit.
    let mut back = serde_json::from_str::<MemoryReport>(&render_json(r)).unwrap();
    assert!((back.fragmentation - r.fragmentation).abs() <= 1e-12 * r.fragmentation.max(1.0));
    back.fragmentation = r.fragmentation;
    assert_eq!(back, *r);
}

#[test]
fn seed_report_text() {
    let p = seed_plan();
    let r = memory_report(&p);
    check_invariants(&p, &r);
    insta::assert_snapshot!("seed_report", render_text(&r, Some(4 << 30), true));
}

#[test]
fn seed_report_numbers() {
    let p = seed_plan();
    let r = memory_report(&p);
    // 206,538,153 f32 parameters; SGD without momentum keeps no state.
    assert_eq!(r.conventional.parameters, 826_152_612);
    assert_eq!(r.conventional.parameter_gradients, 826_152_612);
    assert_eq!(r.conventional.optimizer_state, 0);
    assert_eq!(r.peak.by_category.parameters, 826_152_612);
    assert!(r.conventional.total >= 2 * 826_152_612);
    // Every layer of the seed network shows up, with its parameters.
    let conv = |i: usize| {
        r.layers
            .iter()
            .find(|l| l.layer == format!("conv2d_{i}"))
            .unwrap()
    };
    for i in 1..=26 {
        assert!(conv(i).parameters > 0);
    }
    // conv2d_5 (1024 -> 1024, 3x3, with bias): (9 * 1024 * 1024 + 1024) * 4 bytes.
    assert_eq!(conv(5).parameters, (9 * 1024 * 1024 + 1024) * 4);
    assert!(r.layers.iter().any(|l| l.layer == "dense_2"));
    assert!(r.layers.iter().all(|l| l.layer != "x" && l.layer != "y"));
    // The step phases are set: forward first, then the loss, the backward and the updates.
    let phases: Vec<StepPhase> = p.steps.iter().map(|s| s.phase).collect();
    assert_eq!(phases.first(), Some(&StepPhase::Forward));
    assert!(phases.contains(&StepPhase::Loss));
    assert!(phases.contains(&StepPhase::Update));
    let b = r.backward_starts.unwrap();
    assert!(phases[..b].iter().all(|ph| *ph < StepPhase::Backward));
    // Buffers carry their layer.
    assert!(p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::Parameter)
        .all(|b| b.name.starts_with(&format!("{}.", b.layer))));
}

#[test]
fn invariants_on_all_fixtures_and_modes() {
    for opt in [sgd_momentum(0.1, 0.9), adam(1e-3)] {
        for (name, m) in small_fixtures(opt) {
            for mode in [Mode::Train, Mode::Eval, Mode::Predict] {
                let p = plan_of(&m, mode);
                let r = memory_report(&p);
                check_invariants(&p, &r);
                let text = render_text(&r, None, true);
                assert!(text.contains("Peak of live bytes"), "{name} {mode:?}");
                assert_eq!(text, render_text(&r, None, true), "deterministic");
                if mode == Mode::Train {
                    // Momentum / Adam keep state: the conventional column counts it.
                    assert!(r.conventional.optimizer_state > 0, "{name}");
                    assert!(r.conventional.saved_activations > 0, "{name}");
                }
            }
        }
    }
}

fn parse_svg(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect()
}

#[test]
fn svg_is_valid_and_shows_the_cap() {
    let p = seed_plan();
    let r = memory_report(&p);
    let cap = 3u64 << 30;
    let svg = render_svg(&r, Some(cap)).unwrap();
    let texts = parse_svg(&svg);
    for want in [
        "cap 3.0 GiB",
        "kernel",
        "live MiB",
        "parameters",
        "activations",
        "gradients",
        "workspace",
    ] {
        assert!(
            texts.iter().any(|t| t.contains(want)),
            "no `{want}` in {texts:?}"
        );
    }
    assert!(texts.iter().any(|t| t.starts_with("arena ")));
    // The cap's line is drawn in its colour, on top of the areas.
    assert!(svg.contains("#D62728"), "cap line colour");
    // Without a cap: no cap line, no cap legend.
    let svg = render_svg(&r, None).unwrap();
    let texts = parse_svg(&svg);
    assert!(!texts.iter().any(|t| t.starts_with("cap ")));
    assert!(!svg.contains("#D62728"));
    assert_eq!(svg, render_svg(&r, None).unwrap(), "deterministic");
}

/// The numeric tick labels of an SVG's axes: (y-axis labels bottom to top, x-axis labels left to right).
fn axis_ticks(svg: &str) -> (Vec<f64>, Vec<f64>) {
    let doc = roxmltree::Document::parse(svg).expect("well-formed");
    let mut y: Vec<(f64, f64)> = vec![];
    let mut x: Vec<(f64, f64)> = vec![];
    for n in doc.descendants().filter(|n| n.has_tag_name("text")) {
        let Ok(v) = n.text().unwrap_or("").trim().parse::<f64>() else {
            continue;
        };
        let at = |a: &str| {
            n.attribute(a)
                .and_then(|s| s.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        match n.attribute("text-anchor") {
            Some("end") => y.push((-at("y"), v)),
            Some("middle") => x.push((at("x"), v)),
            _ => {}
        }
    }
    y.sort_by(|a, b| a.0.total_cmp(&b.0));
    x.sort_by(|a, b| a.0.total_cmp(&b.0));
    (
        y.into_iter().map(|p| p.1).collect(),
        x.into_iter().map(|p| p.1).collect(),
    )
}

#[test]
fn svg_axis_labels_are_distinct_and_increasing_for_small_programs_too() {
    let mut plans: Vec<Plan> = small_fixtures(adam(1e-3))
        .into_iter()
        .map(|(_, m)| plan_of(&m, Mode::Train))
        .collect();
    plans.push(seed_plan());
    for p in &plans {
        let r = memory_report(p);
        let svg = render_svg(&r, None).unwrap();
        let (y, x) = axis_ticks(&svg);
        assert!(y.len() >= 3, "{y:?}");
        assert!(
            y.windows(2).all(|w| w[0] < w[1]),
            "y labels repeat or fall: {y:?}"
        );
        assert!(x.len() >= 2, "{x:?}");
        assert!(
            x.windows(2).all(|w| w[0] < w[1]),
            "x labels repeat or fall: {x:?}"
        );
        assert!(
            x.iter().all(|v| v.fract() == 0.0),
            "kernel positions are whole: {x:?}"
        );
        let texts = parse_svg(&svg);
        assert!(
            texts.iter().any(|t| t.starts_with("kernel")),
            "x axis names kernels"
        );
    }
}

#[test]
fn svg_of_small_fixtures() {
    for (_, m) in small_fixtures(adam(1e-3)) {
        for mode in [Mode::Train, Mode::Predict] {
            let r = memory_report(&plan_of(&m, mode));
            parse_svg(&render_svg(&r, Some(1 << 20)).unwrap());
        }
    }
}

#[test]
fn views_are_counted_once_and_reuse_is_not_a_view() {
    let mut p = plan_of(&dmc_compiler::testutil::convnet(adam(1e-3)), Mode::Train);
    let before = memory_report(&p);
    let last = p.steps.len() - 1;
    // An activation that dies before the end.
    let a = p
        .buffers
        .iter()
        .find(|b| b.kind == BufferKind::Activation && b.live.1 + 3 <= last && b.bytes > 0)
        .unwrap()
        .clone();
    // A view of it (same bytes, overlapping and outliving it) ...
    let mut view = a.clone();
    view.id = p.buffers.len();
    view.name = format!("{} (view)", a.name);
    view.live = (a.live.1, a.live.1 + 2);
    p.buffers.push(view.clone());
    let r = memory_report(&p);
    assert_eq!(r.aliases.len(), 1);
    assert_eq!((r.aliases[0].buffer, r.aliases[0].of), (view.id, a.id));
    for t in 0..p.steps.len() {
        let extra = if t > a.live.1 && t <= a.live.1 + 2 {
            a.bytes
        } else {
            0
        };
        assert_eq!(r.timeline[t].total, before.timeline[t].total + extra, "{t}");
    }
    assert!(r.lower_bound_bytes <= r.arena_bytes);
    assert!(r.peak.live.iter().all(|b| b.id != view.id));
    assert!(render_text(&r, None, true).contains("(view)"));
    // ... while a later buffer reusing the same bytes after it died is counted on its own.
    let mut reuse = a.clone();
    reuse.name = "reuse".into();
    reuse.live = (a.live.1 + 3, a.live.1 + 3);
    p.buffers.pop();
    reuse.id = p.buffers.len();
    p.buffers.push(reuse);
    let r = memory_report(&p);
    assert!(r.aliases.is_empty());
    let t = a.live.1 + 3;
    assert_eq!(r.timeline[t].total, before.timeline[t].total + a.bytes);
}

#[test]
fn a_plan_without_steps() {
    let mut p = plan_of(&dmc_compiler::testutil::mlp(adam(1e-3)), Mode::Train);
    p.steps.clear();
    let r = memory_report(&p);
    let persistent: u64 = p
        .buffers
        .iter()
        .filter(|b| b.persistent)
        .map(|b| b.bytes)
        .sum();
    assert_eq!(r.lower_bound_bytes, persistent);
    assert_eq!(r.peak.live.iter().map(|b| b.bytes).sum::<u64>(), persistent);
    assert!(r.timeline.is_empty());
    assert_eq!(r.backward_starts, None);
    assert!(render_text(&r, Some(1), true).contains("(no steps)"));
    parse_svg(&render_svg(&r, Some(1)).unwrap());
}

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
