//! Rematerialization changes memory, never results: training the examples under caps that need
//! recomputation gives bit-identical weights and losses to training without it (the recomputed
//! kernels are the same kernels on the same inputs), under poison, and every plan checks.

use dmc_compiler::op::DType;
use dmc_compiler::plan::Plan;
use dmc_compiler::{check_plan, compile, recompute_flops, CompileError, CompileOptions, RematMode};
use dmc_runtime::{CpuBackend, InputData};

type Trained = (Vec<(String, Vec<u32>)>, Vec<u32>);

fn data(n: usize, salt: usize, step: u64) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 + salt * 11 + step as usize * 23) % 101) as f32 / 50.0 - 1.0)
        .collect()
}

fn run_plan(plan: &Plan, steps: u64, poison: bool) -> Trained {
    let classes = *plan.output.shape.last().unwrap_or(&1);
    let mut be = CpuBackend::new(plan.clone()).unwrap();
    be.init_params(7);
    be.set_poison(poison);
    let mut losses = vec![];
    for step in 1..=steps {
        for (k, io) in plan.inputs.iter().chain(&plan.targets).enumerate() {
            let n: usize = io.shape.iter().product();
            match io.dtype {
                DType::I32 => {
                    let l: Vec<i32> = (0..n)
                        .map(|i| ((i * 3 + step as usize) % classes) as i32)
                        .collect();
                    be.set_input(&io.name, InputData::I32(&l)).unwrap();
                }
                _ => be
                    .set_input(&io.name, InputData::F32(&data(n, k, step)))
                    .unwrap(),
            }
        }
        losses.push(be.run(step, 99).unwrap().to_bits());
    }
    let params = be
        .params()
        .map(|(n, _, v)| (n.to_string(), v.iter().map(|x| x.to_bits()).collect()))
        .collect();
    (params, losses)
}

fn model(src: &str) -> dmc_grammar::Model {
    dmc_grammar::compile_source(src, "test.dm").unwrap()
}

fn example(name: &str) -> String {
    std::fs::read_to_string(format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

thread_local! {
    /// Fuse weight gradients with their updates (the default); cleared by the `--no-fuse` test.
    static FUSE: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

fn opts(cap: Option<u64>, remat: RematMode) -> CompileOptions {
    CompileOptions {
        cap,
        remat,
        fuse: FUSE.with(|f| f.get()),
        verify: true,
        // recomputation under test, not its alternatives (tests/it/offload.rs, streaming.rs)
        stream: false,
        ..Default::default()
    }
}

/// Trains `m` without recomputation and under caps from 90% of its arena down to the smallest
/// one remat reaches; returns how many of the plans recompute something.
fn check_bit_identical(name: &str, m: &dmc_grammar::Model, steps: u64) -> usize {
    let base = compile(m, &opts(None, RematMode::Off)).unwrap();
    let want = run_plan(&base, steps, false);
    let min = match compile(m, &opts(Some(1), RematMode::Auto)) {
        Err(CompileError::CapExceeded { needed, .. }) => needed,
        r => panic!("{name}: {:?}", r.map(|p| p.arena_bytes)),
    };
    let mut remat = 0;
    let full = base.arena_bytes;
    let caps = [full * 9 / 10, (full + min) / 2, min + (full - min) / 5, min];
    for cap in caps {
        let p = match compile(m, &opts(Some(cap), RematMode::Auto)) {
            Ok(p) => p,
            Err(CompileError::CapExceeded { .. }) => continue,
            Err(e) => panic!("{name} cap {cap}: {e}"),
        };
        check_plan(&p).unwrap();
        assert!(p.arena_bytes <= cap, "{name}: {} > {cap}", p.arena_bytes);
        if recompute_flops(&p) > 0 {
            remat += 1;
        }
        let got = run_plan(&p, steps, true);
        assert_eq!(got.1, want.1, "{name} cap {cap}: losses differ");
        assert!(got.0 == want.0, "{name} cap {cap}: weights differ");
    }
    remat
}

/// The issue-15 examples under caps down to their minimum: the same losses and weights, bit for
/// bit, as without a cap (MobileNet's depthwise convolutions, the UNet's concat and transposed
/// convolutions, batchnorm in both).
#[test]
fn mobilenet_and_unet_train_bit_identically_under_caps() {
    for ex in ["mobilenet", "unet"] {
        let src = example(&format!("{ex}.dm"));
        check_bit_identical(ex, &model(&src), 2);
    }
}

/// A weighted loss over two heads (the autoencoder with a classifier head) under caps down to its
/// minimum: bit for bit the uncapped training.
#[test]
fn a_two_headed_weighted_loss_trains_bit_identically_under_caps() {
    let src = example("autoencoder_classifier.dm");
    check_bit_identical("autoencoder_classifier", &model(&src), 2);
}

#[test]
fn mlp_trains_bit_identically_under_remat() {
    check_bit_identical("mlp", &model(&example("mlp.dm")), 3);
}

#[test]
fn resnet_small_trains_bit_identically_under_remat() {
    let n = check_bit_identical("resnet_small", &model(&example("resnet_small.dm")), 3);
    assert!(n >= 2, "{n} plans recompute");
}

#[test]
fn small_deep_convnet_trains_bit_identically_under_remat() {
    let src = example("deep_convnet.dm")
        .replace("[64, 64, 3]", "[16, 16, 3]")
        .replace("batch: 32", "batch: 2");
    assert!(src.contains("[16, 16, 3]") && src.contains("batch: 2"));
    let n = check_bit_identical("deep_convnet 16x16 b2", &model(&src), 2);
    assert!(n >= 3, "{n} plans recompute");
}

#[test]
fn small_fixtures_train_bit_identically_under_remat_with_sgd_and_adam() {
    use dmc_compiler::testutil::{adam, sgd_momentum, small_fixtures};
    for opt in [sgd_momentum(0.1, 0.9), adam(1e-2)] {
        for (name, m) in small_fixtures(opt) {
            check_bit_identical(name, &m, 2);
        }
    }
}

#[test]
fn unfused_updates_train_bit_identically_under_remat() {
    FUSE.with(|f| f.set(false));
    let n = check_bit_identical(
        "resnet_small --no-fuse",
        &model(&example("resnet_small.dm")),
        2,
    );
    assert!(n >= 1, "{n} plans recompute");
    let src = example("deep_convnet.dm")
        .replace("[64, 64, 3]", "[8, 8, 3]")
        .replace("batch: 32", "batch: 2");
    check_bit_identical("deep_convnet 8x8 b2 --no-fuse", &model(&src), 2);
}

/// Batchnorm under caps that recompute its forward: the running statistics (compared with the
/// weights, bit for bit) are updated exactly once per step, as without a cap; at least one plan
/// recomputes a batchnorm, and every plan has one statistics update per batchnorm layer.
#[test]
fn batchnorm_running_statistics_are_updated_once_per_step_under_remat() {
    use dmc_compiler::op::{NormOp, Op};
    let m = model(&example("bn_cnn.dm"));
    let n = check_bit_identical("bn_cnn", &m, 4);
    assert!(n >= 1, "{n} plans recompute");
    let base = compile(&m, &opts(None, RematMode::Off)).unwrap();
    let min = match compile(&m, &opts(Some(1), RematMode::Auto)) {
        Err(CompileError::CapExceeded { needed, .. }) => needed,
        r => panic!("{:?}", r.map(|p| p.arena_bytes)),
    };
    let (full, mut recomputed) = (base.arena_bytes, 0);
    for cap in [full * 9 / 10, (full + min) / 2, min + (full - min) / 5, min] {
        let Ok(p) = compile(&m, &opts(Some(cap), RematMode::Auto)) else {
            continue;
        };
        let kind = |s: &dmc_compiler::plan::Step| &p.kernels[s.kernel].op;
        let stats = p
            .steps
            .iter()
            .filter(|s| matches!(kind(s), Op::Norm(NormOp::BatchNormStats { .. })))
            .count();
        assert_eq!(stats, 3, "cap {cap}: running statistics updates");
        recomputed += p
            .steps
            .iter()
            .filter(|s| {
                matches!(kind(s), Op::Norm(NormOp::BatchNorm { .. }))
                    && s.label.contains("recompute")
            })
            .count();
    }
    assert!(recomputed >= 1, "no plan recomputes a batchnorm");
    // the compared state includes the running statistics
    assert!(run_plan(&base, 1, false)
        .0
        .iter()
        .any(|(n, _)| n == "batchnorm_1.running_var"));
}

/// A small GPT (pre-norm transformer blocks, each a stage: the layernorm that starts it reads the
/// previous block's output) under caps down to its minimum: bit for bit the uncapped training.
/// (The layernorm's backward, named after its input, was once put in the previous stage, and
/// its weight's update then gated the recomputation the backward waits for: a cycle.)
#[test]
fn a_small_gpt_trains_bit_identically_under_remat() {
    let src = "input tokens: int[16]
target next: int[16]
block transformer(x) {
  h = x + (x |> layernorm |> attention(2))
  return h + (h |> layernorm |> dense(64, activation: gelu) |> dense(16))
}
x = tokens |> embedding(12, 16) |> pos_embedding
h = x |> repeat 3 { transformer }
logits = h |> layernorm |> dense(12)
loss cross_entropy(logits, next)
train { batch: 2, optimizer: adamw(lr: 0.01) }";
    let n = check_bit_identical("gpt", &model(src), 2);
    assert!(n >= 2, "{n} plans recompute");
}

/// A chain of layernorms and dense layers (each layernorm starts a stage) plans under every cap
/// down to its minimum.
#[test]
fn layernorm_chains_plan_under_remat() {
    let src = "input x: [64]
target y: [64]
h = x |> layernorm |> dense(64) |> layernorm |> dense(64) |> layernorm |> dense(64) |> layernorm |> dense(64)
loss mse(h, y)
train { batch: 4, optimizer: adam(lr: 0.001) }";
    let n = check_bit_identical("layernorm chain", &model(src), 2);
    assert!(n >= 1, "{n} plans recompute");
}
