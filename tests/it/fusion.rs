//! The `fuse_epilogues` pass, end to end: fused plans have fewer kernels (the counts issue 19 asks
//! for), never a separate bias-gradient or activation kernel where a GEMM could take it, and
//! train exactly like the unfused plans (`--no-fuse`) on the CPU backend: the same loss at every
//! step and the same weights after 5 steps, bit for bit, deterministically. Programs beyond the
//! examples exercise every epilogue path (residual adds into dense and conv layers, every
//! activation, accumulated gradients, the folded global-average-pool backward, Adam's bias state).

use std::path::Path;

use dmc_compiler::op::{ConvOp, DenseOp, ElementwiseOp, Op, OptimOp, PoolOp};
use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::compare::Batch;
use dmc_runtime::CpuBackend;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn source(example: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(format!("{example}.dm"));
    std::fs::read_to_string(path).expect("read example")
}

fn plan(src: &str, fuse: bool, batch: Option<usize>, mode: Mode) -> Plan {
    let model = dmc_grammar::compile_source(src, "t.dm").unwrap_or_else(|e| panic!("{e:?}"));
    let opts = CompileOptions {
        mode,
        batch,
        fuse,
        verify: true,
        ..Default::default()
    };
    compile(&model, &opts).unwrap_or_else(|e| panic!("{e}"))
}

fn ops(p: &Plan) -> Vec<&Op> {
    p.steps.iter().map(|s| &p.kernels[s.kernel].op).collect()
}

fn count(p: &Plan, f: impl Fn(&Op) -> bool) -> usize {
    ops(p).into_iter().filter(|o| f(o)).count()
}

/// A separate activation, activation backward, bias gradient or global-average-pool backward
/// kernel.
fn separate_elementwise(o: &Op) -> bool {
    matches!(
        o,
        Op::Elementwise(
            ElementwiseOp::Unary(_)
                | ElementwiseOp::UnaryInPlace(_)
                | ElementwiseOp::UnaryBwd(_)
                | ElementwiseOp::UnaryBwdInPlace(_)
        ) | Op::Optim(OptimOp::BiasGrad | OptimOp::BiasGradUpdate { .. })
            | Op::Pool(PoolOp::GlobalAvgPoolBwd)
    )
}

/// `steps` training steps of `p` on the CPU backend from seeded weights and batches: the loss
/// of every step and the parameters afterwards (as bits).
fn train(p: &Plan, steps: usize) -> (Vec<u32>, Vec<(String, Vec<u32>)>) {
    let seed = 3;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let batches: Vec<_> = (0..steps).map(|_| Batch::random(p, &mut rng)).collect();
    let mut cpu = CpuBackend::new(p.clone()).expect("cpu backend");
    cpu.init_params(seed);
    let mut losses = vec![];
    for (s, b) in batches.iter().enumerate() {
        b.feed(|n, d| cpu.set_input(n, d)).expect("input");
        let l = cpu.run(s as u64 + 1, seed).expect("step");
        assert!(l.is_finite(), "step {}: loss {l}", s + 1);
        losses.push(l.to_bits());
    }
    let params = cpu
        .params()
        .map(|(n, _, v)| (n.to_string(), v.iter().map(|x| x.to_bits()).collect()))
        .collect();
    (losses, params)
}

/// Fused and unfused plans of `src` train identically (bit for bit), and the fused one is
/// deterministic run to run.
fn trains_like_unfused(name: &str, src: &str, batch: Option<usize>) {
    let fused = plan(src, true, batch, Mode::Train);
    let unfused = plan(src, false, batch, Mode::Train);
    let (lf, pf) = train(&fused, 5);
    let (lu, pu) = train(&unfused, 5);
    assert_eq!(lf, lu, "{name}: losses (bits) fused vs unfused");
    assert_eq!(pf.len(), pu.len(), "{name}: parameter count");
    assert!(!pf.is_empty(), "{name}: no parameters");
    for ((nf, vf), (nu, vu)) in pf.iter().zip(&pu) {
        assert_eq!(nf, nu);
        assert!(vf == vu, "{name}: weight `{nf}` differs fused vs unfused");
    }
    assert_eq!(
        train(&fused, 5),
        (lf, pf),
        "{name}: fused run not deterministic"
    );
}

#[test]
fn deep_convnet_has_at_most_65_kernels_and_no_separate_elementwise_ones() {
    let src = source("deep_convnet");
    let fused = plan(&src, true, None, Mode::Train);
    let unfused = plan(&src, false, None, Mode::Train);
    assert!(fused.steps.len() <= 65, "{} kernels", fused.steps.len());
    assert!(unfused.steps.len() > 100, "{} kernels", unfused.steps.len());
    assert_eq!(count(&fused, separate_elementwise), 0);
    assert!(count(&unfused, separate_elementwise) > 0);
}

#[test]
fn every_example_loses_its_separate_bias_gradient_and_activation_kernels() {
    for ex in ["mlp", "resnet_small", "seed", "deep_convnet"] {
        let src = source(ex);
        let fused = plan(&src, true, Some(2), Mode::Train);
        let unfused = plan(&src, false, Some(2), Mode::Train);
        assert_eq!(count(&fused, separate_elementwise), 0, "{ex}");
        assert!(
            fused.steps.len() < unfused.steps.len(),
            "{ex}: {} fused vs {} unfused kernels",
            fused.steps.len(),
            unfused.steps.len()
        );
        // the residual adds of resnet_small are in its convolutions' epilogues too
        let adds = |p: &Plan| {
            count(p, |o| {
                matches!(
                    o,
                    Op::Elementwise(ElementwiseOp::Add | ElementwiseOp::AddInPlace)
                )
            })
        };
        assert_eq!(adds(&fused), 0, "{ex}: a separate add");
        // eval and predict plans fuse the forward too
        for mode in [Mode::Eval, Mode::Predict] {
            let p = plan(&src, true, Some(2), mode);
            assert_eq!(count(&p, separate_elementwise), 0, "{ex} {mode:?}");
        }
    }
}

#[test]
fn examples_train_exactly_like_their_unfused_plans() {
    trains_like_unfused("mlp", &source("mlp"), Some(8));
    trains_like_unfused("resnet_small", &source("resnet_small"), Some(2));
    let small_deep = source("deep_convnet")
        .replace("[64, 64, 3]", "[12, 12, 3]")
        .replace("repeat 16", "repeat 3");
    trains_like_unfused("deep_convnet (small)", &small_deep, Some(2));
}

/// A GPT (without clip_norm, which holds gradients unfused): its dense layers over sequences are
/// GEMMs on rows seen as [B, T, M], and the residual adds and the activation backward that follow
/// them are folded into their epilogues like a flat network's; it trains exactly like unfused.
#[test]
fn a_gpt_folds_its_residual_adds_and_trains_exactly_like_unfused() {
    let src = source("gpt")
        .replace(", clip_norm: 1.0", "")
        .replace("int[256]", "int[16]")
        .replace("repeat 4", "repeat 2");
    assert!(!src.contains("clip_norm"), "gpt.dm's train section changed");
    let fused = plan(&src, true, Some(2), Mode::Train);
    let unfused = plan(&src, false, Some(2), Mode::Train);
    // the forward's sums (the backward's gradient sums before a layernorm stay: not a GEMM)
    let adds = |p: &Plan| {
        p.steps
            .iter()
            .filter(|s| s.phase == dmc_compiler::plan::StepPhase::Forward)
            .filter(|s| {
                matches!(
                    p.kernels[s.kernel].op,
                    Op::Elementwise(ElementwiseOp::Add | ElementwiseOp::AddInPlace)
                )
            })
            .count()
    };
    // two residual adds a block, each after the GEMM that ends its branch
    assert_eq!(adds(&unfused), 4);
    assert_eq!(adds(&fused), 0, "a residual add left unfolded");
    let act_bwd = |p: &Plan| {
        count(p, |o| {
            matches!(
                o,
                Op::Elementwise(ElementwiseOp::UnaryBwd(_) | ElementwiseOp::UnaryBwdInPlace(_))
            )
        })
    };
    assert_eq!(act_bwd(&fused), 0, "GELU's backward left unfolded");
    trains_like_unfused("gpt (small)", &src, Some(2));
}

/// Residual dense and conv blocks, every activation (gelu and silu read their input in the
/// backward, so their forward stays a kernel of its own), Adam (bias state fused too), values
/// used twice in the backward (accumulation into a data-gradient epilogue), and a global average
/// pool and an average pool after an activation.
const EVERY_PATH: &str = "
input  x: [6, 6, 3]
target y: int
block rd(x) {
  h = x |> dense(8, activation: tanh)
  return sigmoid(x + dense(h, 8))
}
block rc(x) {
  h = x |> conv2d(4, 3, activation: sigmoid)
  return relu(x + conv2d(h, 4, 3))
}
h = x |> conv2d(4, 3, activation: gelu) |> rc |> avgpool(2) |> rc |> conv2d(4, 3) |> silu |> conv2d(4, 3) |> tanh |> global_avgpool
out = h |> dense(8, activation: relu) |> rd |> dense(3)
loss cross_entropy(out, y)
train { batch: 3, optimizer: adam(lr: 0.01, weight_decay: 0.01) }
";

#[test]
fn every_epilogue_path_trains_exactly_like_the_unfused_plan() {
    let fused = plan(EVERY_PATH, true, None, Mode::Train);
    let has = |f: &dyn Fn(&Op) -> bool| count(&fused, f) > 0;
    // each fused form is there
    assert!(has(
        &|o| matches!(o, Op::Conv(ConvOp::Conv2d { epi, .. }) if epi.add && epi.act.is_some())
    ));
    assert!(has(
        &|o| matches!(o, Op::Dense(DenseOp::Dense { epi, .. }) if epi.add && epi.act.is_some())
    ));
    assert!(has(
        &|o| matches!(o, Op::Conv(ConvOp::Conv2dBwdData { epi, .. }) if epi.add && epi.act.is_some())
    ));
    assert!(has(
        &|o| matches!(o, Op::Dense(DenseOp::DenseBwdData { epi }) if epi.act.is_some())
    ));
    assert!(has(&|o| matches!(
        o,
        Op::Conv(ConvOp::Conv2dBwdWeightUpdate { bias: true, .. })
    )));
    assert!(has(&|o| matches!(
        o,
        Op::Dense(DenseOp::DenseBwdWeightUpdate { bias: true, .. })
    )));
    assert!(has(&|o| matches!(
        o,
        Op::Pool(PoolOp::GlobalAvgPoolBwdAct(_) | PoolOp::GlobalAvgPoolBwdActInPlace(_))
    )));
    assert!(has(&|o| matches!(
        o,
        Op::Pool(PoolOp::AvgPoolBwdAct { .. })
    )));
    // gelu's backward reads its input, which the convolution's output is: that output has a
    // second reader, so the forward activation stays a kernel of its own
    assert!(has(&|o| matches!(
        o,
        Op::Elementwise(ElementwiseOp::Unary(k) | ElementwiseOp::UnaryInPlace(k))
            if k.name() == "gelu"
    )));
    trains_like_unfused("every path", EVERY_PATH, None);
}

#[test]
fn a_value_read_twice_is_not_fused_away() {
    // the convolution's output is read by the relu and by the add: it must stay in memory, so
    // the relu is not folded into the convolution
    let src = "
input  x: [5, 5, 2]
target y: [5, 5, 3]
z = x |> conv2d(3, 3)
out = relu(z) + z
loss mse(out, y)
train { batch: 2, optimizer: sgd(lr: 0.01) }
";
    let fused = plan(src, true, None, Mode::Train);
    assert!(
        count(&fused, |o| matches!(
            o,
            Op::Elementwise(ElementwiseOp::Unary(_) | ElementwiseOp::UnaryInPlace(_))
        )) == 1
    );
    assert!(
        count(
            &fused,
            |o| matches!(o, Op::Conv(ConvOp::Conv2d { epi, .. }) if !epi.is_none())
        ) == 0
    );
    trains_like_unfused("read twice", src, None);
}

#[test]
fn capped_plans_with_recomputation_fuse_and_train_exactly_like_uncapped() {
    // rematerialized copies of fused stages are fused too, and training stays bit-identical
    let src = source("deep_convnet")
        .replace("[64, 64, 3]", "[16, 16, 3]")
        .replace("repeat 16", "repeat 6");
    let model = dmc_grammar::compile_source(&src, "t.dm").expect("check");
    let free = plan(&src, true, Some(4), Mode::Train);
    let capped = (50..100)
        .rev()
        .filter_map(|pct| {
            let opts = CompileOptions {
                batch: Some(4),
                cap: Some(free.arena_bytes * pct / 100),
                verify: true,
                ..Default::default()
            };
            compile(&model, &opts).ok()
        })
        .find(|p| p.steps.iter().any(|s| s.label.contains("(recompute")))
        .expect("a cap that recomputes");
    assert!(capped.arena_bytes < free.arena_bytes);
    assert!(
        capped.steps.len() > free.steps.len(),
        "recomputes something"
    );
    // recomputed copies are fused too (a fold that would read a recomputed value the fused
    // node must wait for is left out, so a few separate kernels may remain)
    let unfused_recompute = plan(&src, false, Some(4), Mode::Train);
    assert!(
        count(&capped, separate_elementwise) * 4 < count(&unfused_recompute, separate_elementwise),
        "{} separate elementwise kernels",
        count(&capped, separate_elementwise)
    );
    assert_eq!(train(&capped, 3), train(&free, 3));
}
