//! Autodiff: a gradient for every parameter with its shape, every VJP arm exercised, no
//! gradients for inputs/targets, dead branches pruned, multi-use values accumulated.

use std::collections::BTreeSet;

use dmc_compiler::ir::{Graph, Phase};
use dmc_compiler::op::{
    ConvOp, DenseOp, ElementwiseOp, Op, OptimOp, PoolOp, UnaryKind, UpdateRule,
};
use dmc_compiler::plan::Mode;
use dmc_compiler::testutil::*;
use dmc_compiler::{compile, compile_graph, CompileOptions};
use dmc_grammar::model::ValueRef;

fn train(m: &dmc_grammar::model::Model) -> Graph {
    compile_graph(
        m,
        &CompileOptions {
            mode: Mode::Train,
            verify: true,
            // the autodiff output as built: no fusion, no in-place rewriting
            fuse: false,
            inplace: false,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn every_parameter_gets_a_gradient_of_its_shape() {
    let mut models: Vec<_> = small_fixtures(sgd(0.1))
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    models.push(seed());
    for m in models {
        let g = train(&m);
        assert_eq!(g.params.len(), m.params().count());
        for (p, meta) in &g.params {
            let d = g
                .grads
                .get(p)
                .unwrap_or_else(|| panic!("no gradient for {}", meta.name));
            assert_eq!(g.ty(*d).shape, meta.shape, "{}", meta.name);
            assert_eq!(g.node(d.0).phase, Phase::Backward);
        }
    }
}

#[test]
fn every_vjp_arm_is_exercised_by_some_fixture() {
    let mut seen = BTreeSet::new();
    for (_, m) in small_fixtures(sgd(0.1)) {
        let g = train(&m);
        for n in g.nodes() {
            if g.node(n).phase == Phase::Backward {
                seen.insert(g.node(n).op.kind_name());
            }
        }
    }
    for k in [
        "conv2d_bwd_data",
        "conv2d_bwd_weight",
        "bias_grad",
        "dense_bwd_data",
        "dense_bwd_weight",
        "maxpool_bwd",
        "avgpool_bwd",
        "global_avgpool_bwd",
        "reshape",
        "relu_bwd",
        "tanh_bwd",
        "sigmoid_bwd",
        "gelu_bwd",
        "dropout_bwd",
        "add",
        "mse_loss_bwd",
        "cross_entropy_loss_bwd",
    ] {
        assert!(seen.contains(k), "no fixture exercises {k}: {seen:?}");
    }
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.nodes()
        .into_iter()
        .filter(|n| pred(&g.node(*n).op))
        .count()
}

#[test]
fn no_gradients_for_inputs_and_targets() {
    // 3 dense layers, the first reads the input: only 2 backward-data ops.
    let g = train(&mlp(sgd(0.1)));
    assert_eq!(
        count(&g, |o| matches!(o, Op::Dense(DenseOp::DenseBwdData { .. }))),
        2
    );
    // 2 convs, the first reads the image: 1 backward-data op.
    let g = train(&convnet(sgd(0.1)));
    assert_eq!(
        count(&g, |o| matches!(o, Op::Conv(ConvOp::Conv2dBwdData { .. }))),
        1
    );
    for n in g.nodes() {
        let node = g.node(n);
        assert!(
            node.name != "grad image" && node.name != "grad label",
            "{}",
            node.name
        );
    }
}

#[test]
fn unary_bwd_saves_output_except_gelu_which_saves_input() {
    for (_, m) in small_fixtures(sgd(0.1)) {
        let g = train(&m);
        for n in g.nodes() {
            if let Op::Elementwise(ElementwiseOp::UnaryBwd(k)) = g.node(n).op {
                let saved = g.input(n, 0).unwrap();
                let saved_op = &g.node(saved.0).op;
                if k == UnaryKind::Gelu {
                    assert!(
                        !matches!(saved_op, Op::Elementwise(ElementwiseOp::Unary(_))),
                        "gelu_bwd must read the input"
                    );
                } else {
                    assert_eq!(
                        saved_op,
                        &Op::Elementwise(ElementwiseOp::Unary(k)),
                        "{k:?}_bwd must read the forward output"
                    );
                }
            }
            if let Op::Pool(PoolOp::MaxPoolBwd { .. }) = g.node(n).op {
                let arg = g.input(n, 1).unwrap();
                assert!(
                    matches!(g.node(arg.0).op, Op::Pool(PoolOp::MaxPool { .. })) && arg.1 == 1,
                    "maxpool_bwd reads the argmax"
                );
            }
        }
    }
}

#[test]
fn value_used_twice_gets_summed_gradient() {
    let g = train(&residual(sgd(0.1)));
    let adds: Vec<_> = g
        .nodes()
        .into_iter()
        .filter(|n| {
            g.node(*n).phase == Phase::Backward
                && matches!(g.node(*n).op, Op::Elementwise(ElementwiseOp::Add))
        })
        .collect();
    assert_eq!(
        adds.len(),
        1,
        "the relu output feeding conv2d_2 and the add is used twice"
    );
    assert!(g.node(adds[0]).name.contains("activation_1"));
}

#[test]
fn dead_branches_are_pruned() {
    // The checker rejects a layer that feeds nothing, so the model is checked with `dense_2` used
    // and then cut after `dense_3`: `dense_2` stays, feeding nothing.
    let mut m = checked_with(
        "input x: [4]
target y: [2]
h = x |> dense(6) as dense_1
u = h |> dense(7) as dense_2
v = h |> dense(2) as dense_3
out = v + (u |> dense(2) as dense_4)
loss mse(out, y)
",
        2,
        &sgd(0.1),
    );
    let dense_3 = m.nodes.iter().position(|n| n.name == "dense_3").unwrap();
    m.nodes.truncate(dense_3 + 1);
    m.output = ValueRef::Node(dense_3);
    m.loss.terms[0].pred = m.output;
    let g = train(&m);
    let dead = g
        .params
        .iter()
        .filter(|(_, m)| m.name.starts_with("dense_2"))
        .collect::<Vec<_>>();
    assert_eq!(dead.len(), 2, "parameters stay bound");
    for (p, _) in dead {
        assert!(!g.grads.contains_key(p));
    }
    assert!(
        g.nodes().iter().all(|n| g.node(*n).name != "dense_2"),
        "DCE removes the unused layer"
    );
    assert_eq!(
        count(&g, |o| matches!(
            o,
            Op::Optim(OptimOp::Update {
                rule: UpdateRule::Sgd { .. },
                ..
            })
        )),
        4
    );
    let plan = compile(
        &m,
        &CompileOptions {
            verify: true,
            fuse: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(plan.params.len(), 6);
}

/// A loss of two weighted terms over two heads: each term is a loss node of its weight, their sum
/// the loss; each term's backward (of its weight) seeds the gradient of its head, and the two heads'
/// gradients meet at the shared layer in one sum. Predict plans drop every loss node.
#[test]
fn a_weighted_loss_seeds_one_backward_per_term() {
    let m = checked(
        "input x: [6]
target r: [3]
target label: int
h = x |> dense(8, activation: tanh)
recon = h |> dense(3)
logits = h |> dense(4)
loss 0.3 * mse(recon, r) + 1.5 * cross_entropy(logits, label)
train { batch: 2, optimizer: sgd(lr: 0.1) }
",
    );
    let g = train(&m);
    let losses: Vec<_> = g
        .nodes()
        .into_iter()
        .filter_map(|n| match &g.node(n).op {
            Op::Loss(l) => Some((l.is_backward(), l.weight(), g.node(n).phase)),
            _ => None,
        })
        .collect();
    let mut fwd: Vec<f32> = losses.iter().filter(|l| !l.0).map(|l| l.1).collect();
    let mut bwd: Vec<f32> = losses.iter().filter(|l| l.0).map(|l| l.1).collect();
    fwd.sort_by(f32::total_cmp);
    bwd.sort_by(f32::total_cmp);
    assert_eq!((fwd, bwd), (vec![0.3, 1.5], vec![0.3, 1.5]));
    let loss = g.loss.expect("loss");
    assert!(matches!(
        g.node(loss.0).op,
        Op::Elementwise(ElementwiseOp::Add)
    ));
    assert_eq!(g.node(loss.0).phase, Phase::Loss);
    assert_eq!(g.ty(loss).shape, vec![1]);
    // the two heads' gradients summed at the hidden activation, once
    let sums = g
        .nodes()
        .into_iter()
        .filter(|n| g.node(*n).phase == Phase::Backward && g.node(*n).name.ends_with("(sum)"))
        .count();
    assert_eq!(sums, 1);
    assert_eq!(
        g.grads.len(),
        6,
        "every weight and bias of the three layers"
    );
    // the output is the classifier's logits
    let out = g.node(g.output.0).name.clone();
    assert_eq!(out, "dense_3");
    let p = compile_graph(
        &m,
        &CompileOptions {
            mode: Mode::Predict,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(p.loss.is_none());
    assert!(p.targets.is_empty());
    assert!(p
        .nodes()
        .into_iter()
        .all(|n| !matches!(p.node(n).op, Op::Loss(_)) && p.node(n).phase != Phase::Loss));
    // under a cap (chunked updates, recomputation when needed) the two-headed plan still plans
    let plain = compile(&m, &CompileOptions::default()).unwrap();
    let capped = compile(
        &m,
        &CompileOptions {
            cap: Some(plain.arena_bytes),
            verify: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(capped.arena_bytes <= plain.arena_bytes);
}
