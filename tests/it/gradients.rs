//! Whole-network gradients, end to end (parser -> compiler -> plan -> CPU backend), against central
//! finite differences of the loss.
//!
//! The gradient is read off the training step itself: with plain SGD at lr = 1 (no momentum, no
//! weight decay) the update is `w1 = w0 - g`, so `g = w0 - w1`. The loss for the finite differences
//! comes from a second backend of the same program (its step's loss is computed before its update),
//! whose parameters are all reset to the perturbed `w0` before every run, run with the same step
//! counter and seed so that dropout draws the same mask.
//!
//! Tolerance: the loss is accumulated in f32 (relative precision ~6e-8), so with h = 3e-3 the
//! rounding error of a central difference is about 6e-8 * |L| / h ~ 2e-5 * |L|; the truncation error
//! is O(h^2 f''') ~ 1e-5 for these smooth-ish nets. We accept |fd - g| <= 2e-3 + 3e-2 |g|, and
//! indices whose perturbation crosses a kink (ReLU at 0, a max-pool tie) are avoided by a fixed seed
//! (the test is deterministic: it either always passes or always fails).

use dmc_compiler::plan::{BufferKind, Mode};
use dmc_compiler::{compile, CompileOptions};
use dmc_grammar::model::Model;
use dmc_runtime::{CpuBackend, InputData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn model(src: &str) -> Model {
    dmc_grammar::compile_source(src, "test.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)))
}

fn backend(m: &Model, lr: f32) -> CpuBackend {
    let opts = CompileOptions {
        mode: Mode::Train,
        lr: Some(dmc_grammar::model::LearningRate::new(lr as f64).expect("a usable learning rate")),
        verify: true,
        ..CompileOptions::default()
    };
    let plan = compile(m, &opts).expect("compile");
    let mut be = CpuBackend::new(plan).expect("backend");
    be.init_params(7);
    be
}

/// Feeds random inputs (and labels in 0..classes for i32 targets) into both backends.
fn feed(bes: &mut [&mut CpuBackend], classes: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let plan = bes[0].plan().clone();
    for b in plan.inputs.iter().chain(&plan.targets) {
        let n: usize = b.shape.iter().product();
        match b.dtype {
            dmc_compiler::op::DType::I32 => {
                let v: Vec<i32> = (0..n)
                    .map(|_| rng.random_range(0..classes as i32))
                    .collect();
                for be in bes.iter_mut() {
                    be.set_input(&b.name, InputData::I32(&v)).expect("set");
                }
            }
            _ => {
                let v: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
                for be in bes.iter_mut() {
                    be.set_input(&b.name, InputData::F32(&v)).expect("set");
                }
            }
        }
    }
}

fn check_gradients(src: &str, classes: usize) {
    let m = model(src);
    let mut step = backend(&m, 1.0);
    let mut probe = backend(&m, 1.0);
    feed(&mut [&mut step, &mut probe], classes);
    // The trained parameters (the running statistics change by their own update, not a gradient).
    let plan = step.plan().clone();
    let trained = |n: &str| {
        plan.params
            .iter()
            .any(|p| p.name == n && plan.buffers[p.buffer].kind == BufferKind::Parameter)
    };
    let before: Vec<(String, Vec<f32>)> = step
        .params()
        .filter(|(n, _, _)| trained(n))
        .map(|(n, _, d)| (n.to_string(), d.to_vec()))
        .collect();
    let seed = 11;
    step.run(1, seed).expect("run");
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let h = 3e-3f32;
    let mut checked = 0;
    let mut significant = 0;
    for (name, w0) in &before {
        let w1 = step.param(name).expect("param").to_vec();
        let picks: Vec<usize> = if w0.len() <= 6 {
            (0..w0.len()).collect()
        } else {
            (0..6).map(|_| rng.random_range(0..w0.len())).collect()
        };
        for i in picks {
            let g = w0[i] as f64 - w1[i] as f64;
            // The probe's own update moved its parameters: back to w0 everywhere.
            for (n, v) in &before {
                probe.set_param(n, v).expect("reset");
            }
            let mut w = w0.clone();
            w[i] = w0[i] + h;
            probe.set_param(name, &w).expect("set");
            // Inputs share arena bytes with later buffers (they die after their last read), so
            // they are fed before every run, as the CLI does.
            feed(&mut [&mut probe], classes);
            let lp = probe.run(1, seed).expect("run") as f64;
            for (n, v) in &before {
                probe.set_param(n, v).expect("reset");
            }
            w[i] = w0[i] - h;
            probe.set_param(name, &w).expect("set");
            feed(&mut [&mut probe], classes);
            let lm = probe.run(1, seed).expect("run") as f64;
            // The perturbation actually applied (f32 rounding of w0 +- h).
            let dh = (w0[i] + h) as f64 - (w0[i] - h) as f64;
            let fd = (lp - lm) / dh;
            assert!(
                (fd - g).abs() <= 2e-3 + 3e-2 * g.abs(),
                "{name}[{i}]: finite difference {fd:.6e} vs backprop {g:.6e}"
            );
            checked += 1;
            significant += usize::from(g.abs() > 1e-3);
        }
    }
    assert!(checked >= 10, "only {checked} gradient entries checked");
    assert!(
        significant * 2 >= checked,
        "most gradients are ~0: the check would be vacuous ({significant}/{checked})"
    );
}

#[test]
fn mse_net_with_convs_pools_residual_and_every_activation() {
    check_gradients(
        "input x: [9, 9, 2]
         target y: [3]
         h = x |> conv2d(4, 3, stride: 2, padding: valid, activation: tanh)
         r = h |> conv2d(4, 3, activation: sigmoid)
         s = h + r |> gelu
         out = s |> maxpool(2) |> conv2d(5, 1, activation: relu) |> avgpool(2) |> flatten |> dense(4, activation: silu) |> dense(3)
         loss mse(out, y)
         train { batch: 2, optimizer: sgd(lr: 1) }",
        0,
    );
}

#[test]
fn cross_entropy_net_with_dropout_and_global_pool() {
    check_gradients(
        "input x: [7, 7, 3]
         target label: int
         logits = x |> conv2d(6, 3, activation: relu) |> dropout(0.3) |> maxpool(2)
                    |> global_avgpool |> dense(5, activation: tanh) |> dense(4)
         loss cross_entropy(logits, label)
         train { batch: 3, optimizer: sgd(lr: 1) }",
        4,
    );
}

#[test]
fn mse_net_with_batchnorm_over_channels_and_over_features() {
    check_gradients(
        "input x: [5, 5, 2]
         target y: [3]
         h = x |> conv2d(4, 3) |> batchnorm |> relu |> maxpool(2)
         out = h |> flatten |> dense(6) |> batchnorm(momentum: 0.3, eps: 1e-3) |> tanh |> dense(3)
         loss mse(out, y)
         train { batch: 3, optimizer: sgd(lr: 1) }",
        0,
    );
}

#[test]
fn mse_net_with_layernorm_over_channels_and_over_features() {
    check_gradients(
        "input x: [5, 5, 2]
         target y: [3]
         h = x |> conv2d(4, 3) |> layernorm |> relu |> maxpool(2)
         out = h |> flatten |> dense(6) |> layernorm(eps: 1e-3) |> tanh |> dense(3)
         loss mse(out, y)
         train { batch: 3, optimizer: sgd(lr: 1) }",
        0,
    );
}

/// `reshape` regroups the channels across pixels: layernorm then normalises runs of 8 values that
/// straddle the convolution's pixels; the backward passes the gradient back through both views.
#[test]
fn mse_net_with_reshapes() {
    check_gradients(
        "input x: [4, 4, 2]
         target y: [3]
         h = x |> conv2d(4, 3) |> reshape([2, -1, 8]) |> layernorm |> tanh
         out = h |> reshape([-1]) |> dense(3)
         loss mse(out, y)
         train { batch: 2, optimizer: sgd(lr: 1) }",
        0,
    );
}

/// Non-square pools with per-side padding and ceil-mode windows that hang over the input.
#[test]
fn mse_net_with_non_square_and_ceil_mode_pools() {
    check_gradients(
        "input x: [7, 6, 2]
         target y: [3]
         h = x |> conv2d(3, 3) |> tanh |> avgpool((3, 2), stride: (2, 1), padding: (1, 0, 0, 1), ceil_mode: true)
         out = h |> maxpool(2, ceil_mode: true) |> flatten |> dense(3)
         loss mse(out, y)
         train { batch: 2, optimizer: sgd(lr: 1) }",
        0,
    );
}

#[test]
fn mse_net_with_upsampling() {
    check_gradients(
        "input x: [6, 6, 2]
         target y: [3]
         h = x |> conv2d(3, 3, activation: relu) |> maxpool(2) |> upsample(3)
         out = h |> conv2d(2, 3, stride: 2, activation: tanh) |> flatten |> dense(3)
         loss mse(out, y)
         train { batch: 2, optimizer: sgd(lr: 1) }",
        0,
    );
}

#[test]
fn mse_net_with_the_parametric_activations_and_softplus() {
    check_gradients(
        "input x: [6, 6, 2]
         target y: [3]
         h = x |> conv2d(4, 3, activation: leaky_relu(0.2)) |> elu(alpha: 0.7) |> maxpool(2)
         out = h |> flatten |> dense(5, activation: softplus) |> leaky_relu |> dense(4, activation: elu) |> dense(3)
         loss mse(out, y)
         train { batch: 2, optimizer: sgd(lr: 1) }",
        0,
    );
}

#[test]
fn softmax_over_channels_and_over_features() {
    check_gradients(
        "input x: [5, 5, 2]
         target y: [3]
         out = x |> conv2d(4, 3) |> softmax |> flatten |> dense(3)
         loss mse(out, y)
         train { batch: 3, optimizer: sgd(lr: 1) }",
        0,
    );
    check_gradients(
        "input x: [6]
         target y: [3]
         out = x |> dense(5) |> softmax |> dense(3)
         loss mse(out, y)
         train { batch: 3, optimizer: sgd(lr: 1) }",
        0,
    );
}

#[test]
fn the_new_losses() {
    let net = |target: &str, loss: &str| {
        format!(
            "input x: [5, 5, 2]
             {target}
             out = x |> conv2d(3, 3, activation: tanh) |> flatten |> dense(3)
             loss {loss}
             train {{ batch: 3, optimizer: sgd(lr: 1) }}"
        )
    };
    check_gradients(&net("target y: [3]", "huber(out, y, delta: 0.2)"), 0);
    check_gradients(&net("target y: [3]", "bce_with_logits(out, y)"), 0);
    check_gradients(&net("target y: [3]", "mae(out, y)"), 0);
    check_gradients(
        &net(
            "target y: int",
            "cross_entropy(out, y, label_smoothing: 0.3)",
        ),
        3,
    );
}

#[test]
fn cross_entropy_net_with_every_convolution_and_pooling_geometry() {
    // ResNet's stem (7x7/2 padding 3, 3x3/2 max-pool padding 1), non-square kernels and strides,
    // padding per side, dilation, a depthwise and a grouped convolution, padded average pooling and
    // global max pooling.
    check_gradients(
        "input x: [12, 11, 2]
         target y: int
         h = x |> conv2d(4, 7, stride: 2, padding: 3, activation: tanh) |> maxpool(3, stride: 2, padding: 1) |> avgpool(2, stride: 1, padding: 1)
         d = h |> conv2d(8, 3, groups: 4, padding: 1, activation: sigmoid) |> conv2d(4, (1, 3), stride: (1, 2), padding: (0, 1, 1, 0))
         e = d |> conv2d(4, 2, dilation: 2, padding: 1, groups: 2, activation: tanh)
         logits = e |> global_maxpool |> dense(3)
         loss cross_entropy(logits, y)
         train { batch: 2, optimizer: sgd(lr: 1) }",
        3,
    );
}

#[test]
fn mse_net_with_transposed_convolutions() {
    // PyTorch's upsampling 3x3/2 padding 1 with an output padding on one axis, a grouped one with a
    // non-square kernel and stride and no bias, a dilated one with padding per side
    check_gradients(
        "input x: [4, 3, 2]
         target y: [3]
         h = x |> conv2d(4, 3, stride: 2, padding: 1, activation: tanh) |> conv_transpose2d(4, 3, stride: 2, padding: 1, output_padding: (0, 1), activation: tanh)
         e = h |> conv_transpose2d(4, (2, 3), stride: (1, 2), groups: 2, bias: false) |> conv_transpose2d(2, 2, stride: 2, dilation: 2, padding: (1, 0, 0, 1))
         out = e |> flatten |> dense(3)
         loss mse(out, y)
         train { batch: 2, optimizer: sgd(lr: 1) }",
        0,
    );
}

#[test]
fn the_gradient_test_can_fail() {
    // A wrong "gradient" (the update of a different learning rate) must be caught by the same check.
    let m = model(
        "input x: [4]
         target y: [2]
         out = x |> dense(2)
         loss mse(out, y)
         train { batch: 2, optimizer: sgd(lr: 1) }",
    );
    let mut step = backend(&m, 0.5); // half the gradient
    let mut probe = backend(&m, 1.0);
    feed(&mut [&mut step, &mut probe], 0);
    let w0 = step.param("dense_1.weight").expect("w").to_vec();
    step.run(1, 0).expect("run");
    let w1 = step.param("dense_1.weight").expect("w").to_vec();
    let h = 3e-3f32;
    let mut worst = 0f64;
    for i in 0..w0.len() {
        let g = w0[i] as f64 - w1[i] as f64;
        let mut w = w0.clone();
        w[i] += h;
        probe.set_param("dense_1.weight", &w).expect("set");
        feed(&mut [&mut probe], 0);
        let lp = probe.run(1, 0).expect("run") as f64;
        w[i] = w0[i] - h;
        probe.set_param("dense_1.weight", &w).expect("set");
        feed(&mut [&mut probe], 0);
        let lm = probe.run(1, 0).expect("run") as f64;
        probe.set_param("dense_1.weight", &w0).expect("reset");
        let fd = (lp - lm) / (2.0 * h as f64);
        worst = worst.max((fd - g).abs() - (2e-3 + 3e-2 * g.abs()));
    }
    assert!(
        worst > 0.0,
        "a halved gradient passed the finite-difference check"
    );
}

#[test]
fn unet_like_skip_with_concat_and_products() {
    // a skip joined with the upsampled path (concat over channels), a gating product, `a * a`, a
    // concat of three values, and a concat of features
    check_gradients(
        "input x: [6, 6, 2]
         target y: [3]
         skip = x |> conv2d(3, 3, padding: same, activation: tanh)
         up = skip |> maxpool(2) |> conv2d(2, 1) |> upsample(2)
         j = concat(skip, up)
         g = j |> conv2d(5, 3, padding: same, activation: sigmoid)
         h = concat(j * g, x, skip * skip) |> conv2d(3, 3, stride: 2)
         f = h |> flatten
         out = concat(f |> dense(2), f |> dense(3, activation: tanh)) |> dense(3)
         loss mse(out, y)
         train { batch: 2, optimizer: sgd(lr: 1) }",
        0,
    );
}

#[test]
fn transformer_with_embeddings_causal_and_full_attention() {
    // tokens and labels both in 0..11: the vocabulary is the class count
    check_gradients(
        "input tokens: int[6]
         target next: int[6]
         x = tokens |> embedding(11, 8) |> pos_embedding
         h = x + (x |> layernorm |> attention(2))
         h2 = h + (h |> layernorm |> attention(4, causal: false, bias: false))
         logits = h2 + (h2 |> dense(12, activation: gelu) |> dense(8)) |> layernorm |> dense(11)
         loss cross_entropy(logits, next)
         train { batch: 2, optimizer: sgd(lr: 1) }",
        11,
    );
}

#[test]
fn a_tied_output_head_adds_its_gradient_to_the_embedding() {
    // the head reads the embedding's table transposed: the table's gradient is the sum of both
    // uses (the lookup's rows and the head's weight gradient)
    check_gradients(
        "input tokens: int[5]
         target next: int[5]
         e = tokens |> embedding(9, 6)
         h = e |> pos_embedding |> layernorm |> attention(2)
         logits = h |> dense(9, tie: e)
         loss cross_entropy(logits, next)
         train { batch: 2, optimizer: sgd(lr: 1) }",
        9,
    );
}
