//! The loss as a weighted sum of terms (`loss w1 * l1(..) + w2 * l2(..)`): one plain-SGD step of
//! the two-term model changes every parameter by exactly `w1 Δ1 + w2 Δ2`, where `Δi` is the change
//! the single-loss model `li` makes from the same weights on the same batch; the reported loss is
//! `w1 L1 + w2 L2`; `dmc eval` gives the same loss whatever the batch size (the padded last batch
//! counts its real samples only); the emulated CUDA kernels train it like the CPU backend.

use std::collections::BTreeMap;

use dmc_compiler::plan::Mode;
use dmc_compiler::{compile, CompileOptions};
use dmc_grammar::model::Model;
use dmc_runtime::{CpuBackend, InputData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::common::dmc;

const N: usize = 4;

fn check(src: &str) -> Model {
    dmc_grammar::compile_source(src, "t.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)))
}

/// `m` trained on its term `i` alone, unweighted (the other terms' heads are then dead: their
/// parameters stay bound and get no update).
fn single(m: &Model, i: usize) -> Model {
    let mut s = m.clone();
    let mut t = m.loss.terms[i].clone();
    t.weight = 1.0;
    s.output = t.pred;
    s.loss.terms = vec![t];
    s
}

type Params = BTreeMap<String, Vec<f64>>;

fn params(be: &CpuBackend) -> Params {
    be.params()
        .map(|(n, _, d)| (n.to_string(), d.iter().map(|&v| v as f64).collect()))
        .collect()
}

/// One training step of `m` from the weights `init` on the batch `inputs`: (the loss, the change
/// of every parameter).
fn one_step(m: &Model, init: &Params, inputs: &[(&str, InputData)]) -> (f64, Params) {
    let opts = CompileOptions {
        mode: Mode::Train,
        verify: true,
        ..CompileOptions::default()
    };
    let plan = compile(m, &opts).expect("compile");
    // A single-loss model reads only its own target.
    let bound: Vec<String> = plan
        .inputs
        .iter()
        .chain(&plan.targets)
        .map(|b| b.name.clone())
        .collect();
    let mut be = CpuBackend::new(plan).expect("backend");
    be.init_params(1);
    for (n, v) in init {
        let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        be.set_param(n, &v).expect("set param");
    }
    let before = params(&be);
    assert_eq!(&before, init, "every parameter bound and set");
    for (n, d) in inputs.iter().filter(|(n, _)| bound.iter().any(|b| b == n)) {
        be.set_input(n, *d).expect("input");
    }
    let loss = be.run(1, 1).expect("step") as f64;
    let after = params(&be);
    let delta = after
        .iter()
        .map(|(n, a)| {
            let b = &before[n];
            (n.clone(), a.iter().zip(b).map(|(x, y)| x - y).collect())
        })
        .collect();
    (loss, delta)
}

/// The two-term model's step against `w1 Δ1 + w2 Δ2` of its single-loss models.
fn weighted_step_is_the_weighted_sum(src: &str, inputs: &[(&str, InputData)]) {
    let m = check(src);
    assert_eq!(m.loss.terms.len(), 2);
    let (w1, w2) = (m.loss.terms[0].weight as f64, m.loss.terms[1].weight as f64);
    assert!(w1 != 1.0 && w2 != 1.0 && w1 != w2);
    // Initial weights: the two-term model's seeded ones, with non-zero biases.
    let init = {
        let plan = compile(&m, &CompileOptions::default()).expect("compile");
        let mut be = CpuBackend::new(plan).expect("backend");
        be.init_params(7);
        let mut r = ChaCha8Rng::seed_from_u64(3);
        params(&be)
            .into_iter()
            .map(|(n, v)| {
                let v = if n.ends_with(".bias") {
                    v.iter()
                        .map(|_| r.random_range(-0.5..0.5f32) as f64)
                        .collect()
                } else {
                    v
                };
                (n, v)
            })
            .collect::<Params>()
    };
    let (l, d) = one_step(&m, &init, inputs);
    let (l1, d1) = one_step(&single(&m, 0), &init, inputs);
    let (l2, d2) = one_step(&single(&m, 1), &init, inputs);
    let want = w1 * l1 + w2 * l2;
    assert!(
        (l - want).abs() <= 1e-6 * want.abs(),
        "loss {l} vs w1 L1 + w2 L2 = {w1} * {l1} + {w2} * {l2} = {want}"
    );
    let mut moved = 0;
    for (n, dv) in &d {
        let scale = dv.iter().fold(0f64, |a, v| a.max(v.abs()));
        assert!(scale > 0.0, "`{n}` was not updated");
        for (k, &got) in dv.iter().enumerate() {
            let want = w1 * d1[n][k] + w2 * d2[n][k];
            // f32 weights near 1 changed by about 1: a few f32 roundings of the weights and of
            // the updates.
            assert!(
                (got - want).abs() <= 1e-6 * scale,
                "`{n}`[{k}]: update {got} vs w1 Δ1 + w2 Δ2 = {want} (scale {scale})"
            );
        }
        moved += 1;
    }
    assert!(moved >= 4, "parameters compared: {moved}");
}

fn batch(x: usize, y: usize, classes: i32) -> (Vec<f32>, Vec<f32>, Vec<i32>) {
    let mut r = ChaCha8Rng::seed_from_u64(11);
    let xs = (0..N * x).map(|_| r.random_range(-1.0..1.0)).collect();
    let ys = (0..N * y).map(|_| r.random_range(-1.0..1.0)).collect();
    let ls = (0..N).map(|_| r.random_range(0..classes)).collect();
    (xs, ys, ls)
}

#[test]
fn an_sgd_step_on_two_heads_is_the_weighted_sum_of_the_single_loss_steps() {
    // An autoencoder-like regression head and a classifier head on a shared hidden layer; a
    // large learning rate so that the updates are about as large as the weights.
    let src = "input x: [5]
target r: [3]
target label: int
h = x |> dense(6, activation: tanh)
recon = h |> dense(3)
logits = h |> dense(4)
loss 0.3 * mse(recon, r) + 1.75 * cross_entropy(logits, label, label_smoothing: 0.1)
train { batch: 4, optimizer: sgd(lr: 8.0) }
";
    let (x, r, l) = batch(5, 3, 4);
    weighted_step_is_the_weighted_sum(
        src,
        &[
            ("x", InputData::F32(&x)),
            ("r", InputData::F32(&r)),
            ("label", InputData::I32(&l)),
        ],
    );
}

#[test]
fn an_sgd_step_on_one_prediction_with_two_losses_sums_their_gradients() {
    // Both terms read the same prediction: the gradients meet at one value (autodiff's fan-out).
    let src = "input x: [5]
target y: [3]
out = x |> dense(6, activation: tanh) |> dense(3)
loss 0.5 * huber(out, y, delta: 0.4) + 2.5 * bce_with_logits(out, y)
train { batch: 4, optimizer: sgd(lr: 8.0) }
";
    let (x, y, _) = batch(5, 3, 2);
    let y: Vec<f32> = y.iter().map(|v| (v + 1.0) / 2.0).collect();
    weighted_step_is_the_weighted_sum(src, &[("x", InputData::F32(&x)), ("y", InputData::F32(&y))]);
}

#[test]
fn a_loss_of_weight_one_compiles_to_the_unweighted_plan() {
    let plain = "input x: [5]\ntarget y: [3]\nout = x |> dense(3)\nloss mse(out, y)\ntrain { batch: 4, optimizer: sgd }\n";
    let one = plain.replace("loss mse", "loss 1.0 * mse");
    let opts = CompileOptions::default();
    let a = compile(&check(plain), &opts).expect("compile");
    let b = compile(&check(&one), &opts).expect("compile");
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    let weighted =
        compile(&check(&plain.replace("loss mse", "loss 0.5 * mse")), &opts).expect("compile");
    let json = serde_json::to_string(&weighted).unwrap();
    assert!(json.contains(r#"{"MseLoss":{"weight":0.5}}"#), "{json}");
    assert!(serde_json::to_string(&a)
        .unwrap()
        .contains(r#"{"MseLoss":{}}"#));
}

/// `dmc eval` of a two-term model on 10 samples: with a batch of 5 (no padding), 3 and 4 (a
/// padded last batch) the mean loss over the samples is the same.
#[test]
fn eval_of_a_weighted_loss_does_not_count_the_padding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = dir.path().join("two.dm");
    std::fs::write(
        &prog,
        "input x: [5]
target r: [3]
target label: int
h = x |> dense(6, activation: tanh)
recon = h |> dense(3)
logits = h |> dense(4)
loss 0.3 * mse(recon, r) + 1.75 * cross_entropy(logits, label)
train { batch: 4, optimizer: sgd(lr: 0.1) }
",
    )
    .unwrap();
    let data = dir.path().join("d.safetensors");
    let p = prog.to_str().unwrap();
    let (code, _, err) = dmc(&["data", p, "-o", data.to_str().unwrap(), "--samples", "10"]);
    assert_eq!(code, 0, "{err}");
    let loss_at = |b: &str| -> f64 {
        let (code, out, err) = dmc(&[
            "eval",
            p,
            "--data",
            data.to_str().unwrap(),
            "--batch",
            b,
            "-q",
        ]);
        assert_eq!(code, 0, "{err}");
        let text = format!("{out}{err}");
        let v = text
            .split("loss ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap_or_else(|| panic!("no loss in {text}"));
        assert!(text.contains("accuracy"), "{text}");
        v.trim().parse().unwrap()
    };
    let full = loss_at("5");
    for b in ["3", "4"] {
        let l = loss_at(b);
        assert!(
            (l - full).abs() <= 1e-5 * full,
            "batch {b}: loss {l} vs {full} with batch 5"
        );
    }
}

/// `dmc run`'s "final loss" of `args`.
fn final_loss(args: &[&str]) -> f64 {
    let (code, out, err) = dmc(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    let text = format!("{out}{err}");
    text.split("final loss ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("no final loss in {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// The example trains (its weighted loss falls), and through the emulated CUDA kernels its first
/// steps' loss is the CPU backend's.
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn the_autoencoder_classifier_example_trains_on_the_cpu_and_the_emulator() {
    let ex = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/autoencoder_classifier.dm"
    );
    let first = final_loss(&["run", ex, "--steps", "1", "-q"]);
    let later = final_loss(&["run", ex, "--steps", "80", "-q"]);
    assert!(
        later < 0.9 * first,
        "loss {first} after 1 step, {later} after 80"
    );
    let cpu = final_loss(&["run", ex, "--steps", "3", "-q"]);
    let emu = final_loss(&["run", ex, "--steps", "3", "-q", "--device", "cuda-emu"]);
    assert!(
        (cpu - emu).abs() <= 1e-5 * cpu,
        "3 steps: loss {cpu} on the CPU, {emu} through the emulator"
    );
}
