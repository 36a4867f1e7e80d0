//! Positive tests: the examples check, and language features produce the expected Model.

use dmc_grammar::model::*;
use dmc_grammar::{compile_source, render_plain, summary_json, summary_text};

fn ok(src: &str) -> Model {
    match compile_source(src, "test.dm") {
        Ok(m) => m,
        Err(d) => panic!("expected success:\n{}", render_plain(&d)),
    }
}

fn example(name: &str) -> String {
    let path = format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn names(m: &Model) -> Vec<&str> {
    m.nodes.iter().map(|n| n.name.as_str()).collect()
}

#[test]
fn seed_matches_the_question() {
    let m = ok(&example("seed.dm"));
    // The question's Keras summary: parameter counts per layer (pools/flatten have none).
    let mut expected: Vec<(&str, Vec<usize>, usize)> = vec![
        ("conv2d_1", vec![16, 16, 256], 2560),
        ("maxpool_1", vec![8, 8, 256], 0),
        ("conv2d_2", vec![8, 8, 512], 1180160),
        ("maxpool_2", vec![4, 4, 512], 0),
        ("conv2d_3", vec![4, 4, 1024], 4719616),
    ];
    let later: Vec<String> = (4..=24).map(|i| format!("conv2d_{i}")).collect();
    for n in &later {
        expected.push((n.as_str(), vec![4, 4, 1024], 9438208));
    }
    expected.extend([
        ("maxpool_3", vec![2, 2, 1024], 0),
        ("conv2d_25", vec![2, 2, 256], 2359552),
        ("conv2d_26", vec![2, 2, 32], 73760),
        ("maxpool_4", vec![1, 1, 32], 0),
        ("flatten_1", vec![32], 0),
        ("dense_1", vec![4], 132),
        ("dense_2", vec![1], 5),
    ]);
    assert_eq!(m.nodes.len(), expected.len());
    for (node, (name, shape, params)) in m.nodes.iter().zip(&expected) {
        assert_eq!(node.name, *name);
        assert_eq!(&node.shape, shape, "{name}");
        let count: usize = node
            .params
            .iter()
            .map(|p| p.shape.iter().product::<usize>())
            .sum();
        assert_eq!(count, *params, "{name}");
    }
    assert_eq!(m.param_count(), 206_538_153);
    assert_eq!(m.param_count() * 4, 826_152_612);
    assert_eq!(m.train.batch, 1);
    assert_eq!(
        m.train.optimizer,
        Optimizer::Sgd {
            lr: 0.01,
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            clip_value: None,
            clip_norm: None,
        }
    );
    assert_eq!(m.loss.terms[0].kind, LossKind::Mse);
    assert_eq!(m.output, ValueRef::Node(m.nodes.len() - 1));
    // Parameter specs of the first conv: HWIO weight, bias, fans.
    let c1 = &m.nodes[0];
    assert_eq!(c1.params[0].name, "conv2d_1.weight");
    assert_eq!(c1.params[0].shape, vec![3, 3, 1, 256]);
    assert_eq!((c1.params[0].fan_in, c1.params[0].fan_out), (9, 9 * 256));
    assert_eq!(c1.params[1].name, "conv2d_1.bias");
    assert!(c1.params[1].is_bias);
    assert_eq!(m.nodes[31].params[0].shape, vec![32, 4]);

    let text = summary_text(&m);
    assert!(text.contains("206,538,153"));
    assert!(text.contains("826,152,612 bytes (787.9 MiB)"));
    assert!(text.contains("conv2d_1 (Conv2D)"));
    assert!(text.contains("(1, 16, 16, 256)"));
    for p in [
        "2,560",
        "1,180,160",
        "4,719,616",
        "9,438,208",
        "2,359,552",
        "73,760",
        "132",
    ] {
        assert!(text.contains(p), "{p}");
    }
    insta::assert_snapshot!("seed_summary", text);
    let j = summary_json(&m);
    assert_eq!(j["total_params"], 206_538_153);
    assert_eq!(j["param_bytes"], 826_152_612);
    assert_eq!(j["layers"].as_array().map(|a| a.len()), Some(33));
    assert_eq!(
        j["layers"][0]["output_shape"],
        serde_json::json!([1, 16, 16, 256])
    );
}

#[test]
fn all_examples_check() {
    for name in ["seed.dm", "mlp.dm", "resnet_small.dm", "deep_convnet.dm"] {
        let m = ok(&example(name));
        assert!(!m.nodes.is_empty(), "{name}");
    }
}

#[test]
fn mlp_example() {
    let m = ok(&example("mlp.dm"));
    assert_eq!(
        names(&m),
        [
            "hidden1",
            "hidden1_relu",
            "hidden2",
            "hidden2_relu",
            "classifier"
        ]
    );
    assert_eq!(m.nodes[0].params[0].name, "hidden1.weight");
    assert_eq!(m.nodes[0].params[0].shape, vec![784, 256]);
    assert_eq!(m.targets[0].dtype, DType::I32);
    assert_eq!(m.targets[0].shape, Vec::<usize>::new());
    assert_eq!(
        m.loss.terms[0].kind,
        LossKind::CrossEntropy {
            label_smoothing: 0.0
        }
    );
    assert_eq!(m.train.epochs, Some(10));
    assert_eq!(m.train.seed, Some(1));
    assert_eq!(
        m.train.optimizer,
        Optimizer::Sgd {
            lr: 0.01,
            momentum: 0.9,
            weight_decay: 0.0,
            nesterov: false,
            clip_value: None,
            clip_norm: None,
        }
    );
}

#[test]
fn resnet_uses_blocks_three_times() {
    let m = ok(&example("resnet_small.dm"));
    let adds: Vec<&Node> = m.nodes.iter().filter(|n| n.layer == Layer::Add).collect();
    assert_eq!(adds.len(), 3);
    assert_eq!(m.train.batch, 8);
    assert_eq!(m.nodes.last().map(|n| n.shape.clone()), Some(vec![10]));
    // The skip connection adds the block's input.
    assert_eq!(adds[0].inputs[0], ValueRef::Node(1));
}

#[test]
fn deep_convnet_repeat() {
    let m = ok(&example("deep_convnet.dm"));
    let convs = m
        .nodes
        .iter()
        .filter(|n| matches!(n.layer, Layer::Conv2d { .. }))
        .count();
    assert_eq!(convs, 17);
    assert_eq!(m.train.batch, 32);
    assert_eq!(
        m.param_count(),
        64 * 27 + 64 + 16 * (64 * 64 * 9 + 64) + 64 * 10 + 10
    );
}

const HEAD: &str = "input x: [8, 8, 3]\ntarget y: [1]\n";
const TAIL: &str = "loss mse(out, y)\ntrain { batch: 2, optimizer: sgd }\n";

#[test]
fn nested_calls_and_kwargs_defaults() {
    let m = ok(&format!(
        "{HEAD}out = dense(flatten(relu(conv2d(x, 4, 3, stride: 2))), 1)\n{TAIL}"
    ));
    assert_eq!(names(&m), ["conv2d_1", "relu_1", "flatten_1", "dense_1"]);
    assert_eq!(
        m.nodes[0].layer,
        Layer::Conv2d {
            filters: 4,
            kernel: (3, 3),
            stride: (2, 2),
            padding: Padding::Same,
            dilation: (1, 1),
            groups: 1,
            bias: true
        }
    );
    assert_eq!(m.nodes[0].shape, vec![4, 4, 4]);
    assert_eq!(m.nodes[2].shape, vec![64]);
}

#[test]
fn valid_padding_and_pools() {
    let m = ok(&format!(
        "{HEAD}out = x |> conv2d(4, 3, padding: valid, bias: false) |> avgpool(2, stride: 1) |> maxpool(3) |> flatten |> dense(1)\n{TAIL}"
    ));
    assert_eq!(m.nodes[0].shape, vec![6, 6, 4]);
    assert_eq!(m.nodes[0].params.len(), 1);
    assert_eq!(m.nodes[1].shape, vec![5, 5, 4]);
    assert_eq!(m.nodes[2].shape, vec![1, 1, 4]);
}

#[test]
fn blocks_with_params_names_and_defaults() {
    let src = format!(
        "{HEAD}block unit(x, c, act: relu) {{\n  y = x |> conv2d(c, 3, activation: act) as conv\n  return y\n}}\n\
         out = x |> unit(4) as first |> unit(4, act: tanh) |> flatten |> dense(1)\n{TAIL}"
    );
    let m = ok(&src);
    assert_eq!(
        names(&m),
        [
            "first.conv",
            "first.conv_relu",
            "unit_1.conv",
            "unit_1.conv_tanh",
            "flatten_1",
            "dense_1"
        ]
    );
    assert_eq!(m.nodes[2].params[0].name, "unit_1.conv.weight");
}

#[test]
fn residual_add_and_add_call() {
    let m = ok(&format!("{HEAD}a = x |> conv2d(3, 1)\nb = add(a, x) + x\nout = b |> global_avgpool |> dense(1)\n{TAIL}"));
    assert_eq!(
        names(&m),
        ["conv2d_1", "add_1", "add_2", "global_avgpool_1", "dense_1"]
    );
    assert_eq!(m.nodes[3].shape, vec![3]);
}

#[test]
fn repeat_with_named_layers_and_dropout() {
    let m = ok(&format!("{HEAD}out = x |> flatten |> repeat 2 {{ dense(8) as fc |> dropout(0.25) }} |> dense(1)\n{TAIL}"));
    assert_eq!(
        names(&m),
        [
            "flatten_1",
            "fc_1",
            "dropout_1",
            "fc_2",
            "dropout_2",
            "dense_1"
        ]
    );
    assert_eq!(m.nodes[2].layer, Layer::Dropout { p: 0.25 });
}

#[test]
fn optimizers_and_train_settings() {
    let body = "input x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\n";
    let m = ok(&format!(
        "{body}train {{ batch: 4, optimizer: adam(betas: (0.8, 0.99)), epochs: 3, seed: 7 }}"
    ));
    assert_eq!(
        m.train.optimizer,
        Optimizer::Adam {
            lr: 0.001,
            beta1: 0.8,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            clip_value: None,
            clip_norm: None,
        }
    );
    assert_eq!((m.train.epochs, m.train.seed), (Some(3), Some(7)));
    let m = ok(&format!(
        "{body}train {{\n batch = 4\n optimizer = adamw(lr = 3e-4, beta2 = 0.95)\n}}"
    ));
    assert_eq!(
        m.train.optimizer,
        Optimizer::Adam {
            lr: 3e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.01,
            decoupled: true,
            clip_value: None,
            clip_norm: None,
        }
    );
    let m = ok(&format!("{body}train {{ batch: 4, optimizer: sgd(0.1, momentum: 0.9, nesterov: true, weight_decay: 1e-4) }}"));
    assert_eq!(
        m.train.optimizer,
        Optimizer::Sgd {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 1e-4,
            nesterov: true,
            clip_value: None,
            clip_norm: None,
        }
    );
}

#[test]
fn int_labels_with_shape_one_and_number_values() {
    let m = ok("input x: [4]\ntarget t: int[1]\nwidth = 16\nout = x |> dense(width, activation: gelu) |> dense(3)\nloss cross_entropy(out, t)\ntrain { batch: 1, optimizer: sgd }");
    assert_eq!(m.targets[0].shape, vec![1]);
    assert_eq!(m.nodes[1].layer, Layer::Act(Activation::Gelu));
    assert_eq!(m.nodes[1].name, "dense_1_gelu");
}

#[test]
fn train_shuffle_setting() {
    let body = "input x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\n";
    let m = ok(&format!("{body}train {{ batch: 4, optimizer: sgd }}"));
    assert_eq!(m.train.shuffle, None);
    let m = ok(&format!(
        "{body}train {{ batch: 4, optimizer: sgd, shuffle: false }}"
    ));
    assert_eq!(m.train.shuffle, Some(false));
    let m = ok(&format!(
        "{body}train {{ batch: 4, optimizer: sgd, shuffle = true }}"
    ));
    assert_eq!(m.train.shuffle, Some(true));
    for bad in [
        "shuffle: 0",
        "shuffle: no",
        "shuffle: 1.5",
        "shuffle: (true, false)",
    ] {
        let src = format!("{body}train {{ batch: 4, optimizer: sgd, {bad} }}");
        let d = compile_source(&src, "test.dm").expect_err(bad);
        let text = render_plain(&d);
        assert!(
            text.contains("`shuffle` must be `true` or `false`"),
            "{bad}: {text}"
        );
    }
}

#[test]
fn train_clip_value_setting() {
    let body = "input x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\n";
    let opt = |s: &str| {
        ok(&format!("{body}train {{ batch: 4, {s} }}"))
            .train
            .optimizer
    };
    assert_eq!(opt("optimizer: sgd").clip_value(), None);
    // the bound travels with the rule, whatever the optimizer; integers are numbers too
    for o in ["sgd(lr: 0.1)", "adam", "adamw", "rmsprop", "lion"] {
        let r = opt(&format!("optimizer: {o}, clip_value: 0.5"));
        assert_eq!(r.clip_value(), Some(0.5), "{o}");
        assert_eq!(
            r.with_clip_value(None),
            opt(&format!("optimizer: {o}")),
            "{o}"
        );
    }
    assert_eq!(
        opt("clip_value = 2\noptimizer: sgd").clip_value(),
        Some(2.0)
    );
    // clamping: to [-v, v], NaN kept
    let r = opt("optimizer: sgd, clip_value: 0.5");
    assert_eq!(
        [r.clip(3.0), r.clip(-3.0), r.clip(0.25), r.clip(-0.5)],
        [0.5, -0.5, 0.25, -0.5]
    );
    assert!(r.clip(f32::NAN).is_nan());
    for bad in ["clip_value: -1", "clip_value: 0.0", "clip_value: 1e-50"] {
        let src = format!("{body}train {{ batch: 4, optimizer: sgd, {bad} }}");
        let d = compile_source(&src, "test.dm").expect_err(bad);
        let text = render_plain(&d);
        assert!(text.contains("`clip_value`"), "{bad}: {text}");
    }
}

#[test]
fn train_precision_setting() {
    use dmc_plan::plan::Precision;
    let body = "input x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\n";
    let m = |s: &str| ok(&format!("{body}train {{ batch: 4, optimizer: sgd{s} }}"));
    assert_eq!(m("").train.precision, Precision::Fp32);
    assert_eq!(m(", precision: fp32").train.precision, Precision::Fp32);
    assert_eq!(m(", precision: tf32").train.precision, Precision::Tf32);
    // anything else: where, what, and what to write
    let src = format!("{body}train {{ batch: 4, optimizer: sgd, precision: fp16 }}");
    let d = compile_source(&src, "test.dm").expect_err("fp16");
    let text = render_plain(&d);
    assert!(
        text.contains("`precision` must be `fp32` or `tf32`") && text.contains("test.dm:5:"),
        "{text}"
    );
    assert!(text.contains("tensor cores"), "{text}");
}

#[test]
fn train_accumulate_setting() {
    let body = "input x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\n";
    let m = |s: &str| ok(&format!("{body}train {{ batch: 4, optimizer: sgd{s} }}"));
    assert_eq!(m("").train.accumulate, 1);
    let a = m(", accumulate: 4");
    assert_eq!(a.train.accumulate, 4);
    assert!(summary_text(&a).contains("accumulated over 4 micro-batches of 4 (effective batch 16)"));
    assert_eq!(summary_json(&a)["accumulate"], 4);
    let src = format!("{body}train {{ batch: 1000000, optimizer: sgd, accumulate: 1000000000 }}");
    let d = compile_source(&src, "test.dm").expect_err("too large");
    assert!(render_plain(&d).contains("`accumulate` is too large"));
}

#[test]
fn train_schedule_setting() {
    let body = "input x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\n";
    let sched = |s: &str| {
        ok(&format!(
            "{body}train {{ batch: 4, optimizer: adam(lr: 0.01), {s} }}"
        ))
        .train
        .schedule
    };
    assert_eq!(
        ok(&format!("{body}train {{ batch: 4, optimizer: sgd }}"))
            .train
            .schedule,
        LrSchedule::default()
    );
    assert_eq!(
        sched("schedule: cosine(warmup: 100)"),
        LrSchedule {
            warmup: 100,
            decay: Decay::Cosine {
                steps: None,
                min_lr: 0.0
            }
        }
    );
    assert_eq!(
        sched("schedule: cosine(warmup: 10, steps: 1000, min_lr: 1e-4)"),
        LrSchedule {
            warmup: 10,
            decay: Decay::Cosine {
                steps: Some(1000),
                min_lr: 1e-4
            }
        }
    );
    assert_eq!(
        sched("schedule: step(every: 30, gamma: 0.5)"),
        LrSchedule {
            warmup: 0,
            decay: Decay::Step {
                every: 30,
                gamma: 0.5
            }
        }
    );
    // `step`'s positional argument is `every`; gamma defaults to StepLR's 0.1
    assert_eq!(
        sched("schedule: step(30)"),
        LrSchedule {
            warmup: 0,
            decay: Decay::Step {
                every: 30,
                gamma: 0.1
            }
        }
    );
    assert_eq!(
        sched("schedule: warmup(200)"),
        LrSchedule {
            warmup: 200,
            decay: Decay::Constant
        }
    );
    assert_eq!(sched("schedule: constant"), LrSchedule::default());
    assert_eq!(
        sched("schedule = linear(steps: 500)"),
        LrSchedule {
            warmup: 0,
            decay: Decay::Linear {
                steps: Some(500),
                min_lr: 0.0
            }
        }
    );
    for (bad, says) in [
        (
            "schedule: cosine(warmup: -1)",
            "`warmup` must be at least 0",
        ),
        ("schedule: cosine(steps: 0)", "`steps` must be positive"),
        ("schedule: step(every: 0)", "`every` must be positive"),
        (
            "schedule: step(every: 5, gamma: 0)",
            "`gamma` must be in (0, 1]",
        ),
        (
            "schedule: linear(min_lr: -0.1)",
            "`min_lr` must be at least 0",
        ),
        (
            "schedule: linear(min_lr: 0.01)",
            "below the optimizer's learning rate 0.01",
        ),
        ("schedule: warmup(0)", "a warmup of 0 steps does nothing"),
        (
            "schedule: cosine(warmup: 5, steps: 3)",
            "leave nothing after its warmup",
        ),
        ("schedule: 3", "expected a learning-rate schedule"),
        (
            "schedule: onecycle",
            "unknown learning-rate schedule `onecycle`",
        ),
        (
            "schedule: cosine(every: 3)",
            "`cosine` has no argument `every`",
        ),
        (
            "schedule: constant, schedule: cosine",
            "`schedule` is set twice",
        ),
    ] {
        let src = format!("{body}train {{ batch: 4, optimizer: adam(lr: 0.01), {bad} }}");
        let d = compile_source(&src, "t.dm").expect_err(bad);
        let text = render_plain(&d);
        assert!(text.contains(says), "{bad}: {text}");
        assert!(text.contains("t.dm:5:"), "{bad}: no position in {text}");
    }
}

/// `init:` / `bias_init:` reach each parameter of the model (and only it); unset, the default.
#[test]
fn layers_choose_their_initialisers() {
    use dmc_grammar::model::Initializer as I;
    let src = "input x: [8, 8, 3]\ntarget y: [1]\n\
        h = x |> conv2d(4, 3, init: he_normal, bias_init: torch_default) |> conv_transpose2d(2, 2, stride: 2, init: uniform(0.5))\n\
        out = h |> flatten |> dense(1, init: normal(std: 0.02))\n\
        loss mse(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n";
    let m = dmc_grammar::compile_source(src, "t.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    let inits: Vec<(String, Option<I>)> = m
        .nodes
        .iter()
        .flat_map(|n| &n.params)
        .map(|p| (p.name.clone(), p.init))
        .collect();
    assert_eq!(
        inits,
        vec![
            ("conv2d_1.weight".to_string(), Some(I::HeNormal)),
            ("conv2d_1.bias".to_string(), Some(I::TorchDefault)),
            (
                "conv_transpose2d_1.weight".to_string(),
                Some(I::Uniform { limit: 0.5 })
            ),
            ("conv_transpose2d_1.bias".to_string(), None),
            ("dense_1.weight".to_string(), Some(I::Normal { std: 0.02 })),
            ("dense_1.bias".to_string(), None),
        ]
    );
    let text = dmc_grammar::summary_text(&m);
    assert!(
        text.contains("Initialisers:       conv2d_1.weight he_normal, conv2d_1.bias torch_default, conv_transpose2d_1.weight uniform(limit: 0.5), dense_1.weight normal(std: 0.02)"),
        "{text}"
    );
    assert_eq!(
        dmc_grammar::summary_json(&m)["initializers"]["dense_1.weight"],
        "normal(std: 0.02)"
    );
}

/// `reshape([...])`: the given shape, one `-1` inferred; `[n]` as `flatten`; summary type `Reshape`.
#[test]
fn reshape_takes_the_given_shape() {
    let src = "input x: [4, 6, 2]\ntarget y: [1]\n\
        a = x |> reshape([8, -1]) as r1\n\
        b = a |> reshape([-1, 2, 3]) as r2\n\
        out = b |> reshape([48]) |> dense(1)\n\
        loss mse(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n";
    let m = dmc_grammar::compile_source(src, "t.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    let shapes: Vec<(&str, Vec<usize>)> = m
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.shape.clone()))
        .collect();
    assert_eq!(shapes[0], ("r1", vec![8, 6]));
    assert_eq!(shapes[1], ("r2", vec![8, 2, 3]));
    assert_eq!(shapes[2], ("reshape_1", vec![48]));
    let text = dmc_grammar::summary_text(&m);
    assert!(text.contains("r2 (Reshape)"), "{text}");
}

/// Pools with non-square windows and strides, per-side padding and PyTorch's ceil mode.
#[test]
fn pool_windows_strides_padding_and_ceil_mode() {
    let shape = |stage: &str| {
        let src = format!(
            "input x: [7, 6, 2]\ntarget y: [1]\nout = x |> {stage} |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd(lr: 0.01) }}\n"
        );
        let m = dmc_grammar::compile_source(&src, "t.dm")
            .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
        m.nodes[0].shape.clone()
    };
    assert_eq!(shape("maxpool(2)"), vec![3, 3, 2]);
    assert_eq!(shape("maxpool(2, ceil_mode: true)"), vec![4, 3, 2]);
    assert_eq!(shape("maxpool((2, 3), stride: (2, 1))"), vec![3, 4, 2]);
    // (7 + 0 + 1 - 2) / 2 + 1 = 4 rows, (6 + 1 + 1 - 3) / 1 + 1 = 6 columns
    assert_eq!(
        shape("avgpool((2, 3), stride: (2, 1), padding: (0, 1, 1, 1))"),
        vec![4, 6, 2]
    );
    // PyTorch's MaxPool2d(3, 2, padding=1, ceil_mode=True) on 7 x 6: 4 x 4 (floor: 4 x 3)
    assert_eq!(
        shape("maxpool(3, stride: 2, padding: 1, ceil_mode: true)"),
        vec![4, 4, 2]
    );
    assert_eq!(shape("maxpool(3, stride: 2, padding: 1)"), vec![4, 3, 2]);
}

/// `conv_transpose2d(padding: same)` is Keras' `Conv2DTranspose(padding="same")`: the output is
/// input·stride, TensorFlow's split of the `span - stride` cells taken off (the odd one at the
/// bottom / right), output padding when the kernel is shorter than the stride.
#[test]
fn transposed_same_padding_is_keras() {
    let layer = |stage: &str| {
        let src = format!(
            "input x: [5, 4, 2]\ntarget y: [1]\nout = x |> {stage} |> flatten |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd(lr: 0.01) }}\n"
        );
        let m = dmc_grammar::compile_source(&src, "t.dm")
            .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
        (m.nodes[0].layer.clone(), m.nodes[0].shape.clone())
    };
    // (kernel, stride) -> (padding (top, bottom, left, right), output padding), derived by hand
    // from TF: pad_total = max(span - stride, 0), top = pad_total / 2
    for (k, s, pad, op) in [
        ((3, 3), (2, 2), (0, 1, 0, 1), (0, 0)),
        ((4, 4), (2, 2), (1, 1, 1, 1), (0, 0)),
        ((5, 2), (2, 3), (1, 2, 0, 0), (0, 1)),
        ((1, 1), (3, 1), (0, 0, 0, 0), (2, 0)),
    ] {
        let (l, shape) = layer(&format!(
            "conv_transpose2d(3, ({}, {}), stride: ({}, {}), padding: same)",
            k.0, k.1, s.0, s.1
        ));
        assert_eq!(shape, vec![5 * s.0, 4 * s.1, 3], "{k:?} {s:?}");
        let (l2, shape2) = layer(&format!(
            "conv_transpose2d(3, ({}, {}), stride: ({}, {}), padding: ({}, {}, {}, {}), output_padding: ({}, {}))",
            k.0, k.1, s.0, s.1, pad.0, pad.1, pad.2, pad.3, op.0, op.1
        ));
        assert_eq!((l, shape), (l2, shape2), "{k:?} {s:?}");
    }
    // dilation 2 spans 5 cells: 3 taken off, (1, 2)
    let (l, shape) = layer("conv_transpose2d(2, 3, stride: 2, dilation: 2, padding: same)");
    assert_eq!(shape, vec![10, 8, 2]);
    assert!(
        matches!(
            l,
            dmc_grammar::model::Layer::ConvTranspose2d {
                padding: (1, 2, 1, 2),
                ..
            }
        ),
        "{l:?}"
    );
}
