//! Lowering: TF 'same' padding, stable dropout salts, initializers by following activation, conv
//! geometry and label reshapes; malformed models are errors, not panics.

use dmc_compiler::error::CompileError;
use dmc_compiler::ir::TensorType;
use dmc_compiler::lower::{lower, pad_before, stable_hash};
use dmc_compiler::op::{ConvGeom, ConvOp, DType, Op};
use dmc_compiler::plan::Init;
use dmc_compiler::testutil::{convnet, mlp, residual, sgd};
use dmc_grammar::model::{Padding, ValueRef};

#[test]
fn same_padding_follows_tf() {
    // pad_total = max((out-1)*stride + k - in, 0), pad_top = pad_total/2
    assert_eq!(pad_before(Padding::Same, 16, 3, 1), 1);
    assert_eq!(pad_before(Padding::Same, 16, 2, 1), 0); // total 1: the extra row at the bottom
    assert_eq!(pad_before(Padding::Same, 12, 3, 2), 0); // out 6, total 1
    assert_eq!(pad_before(Padding::Same, 7, 3, 2), 1); // out 4, total 2
    assert_eq!(pad_before(Padding::Same, 5, 5, 1), 2);
    assert_eq!(pad_before(Padding::Same, 4, 1, 2), 0);
    assert_eq!(pad_before(Padding::Valid, 16, 3, 1), 0);
}

#[test]
fn dropout_salt_is_a_stable_hash_of_the_name() {
    assert_eq!(stable_hash("dropout_1"), stable_hash("dropout_1"));
    assert_ne!(stable_hash("dropout_1"), stable_hash("dropout_2"));
    // FNV-1a of the empty string is the offset basis: the hash must never change.
    assert_eq!(stable_hash(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(stable_hash("a"), 0xaf63_dc4c_8601_ec8c);
}

#[test]
fn init_is_he_before_relu_gelu_glorot_otherwise_zeros_for_biases() {
    let g = lower(&mlp(sgd(0.1)), 2).unwrap();
    let init = |name: &str| {
        g.params
            .iter()
            .find(|(_, m)| m.name == name)
            .map(|(_, m)| m.init)
            .unwrap()
    };
    assert_eq!(init("dense_1.weight"), Init::HeUniform { fan_in: 8 });
    assert_eq!(init("dense_1.bias"), Init::Zeros);
    assert_eq!(
        init("dense_2.weight"),
        Init::GlorotUniform {
            fan_in: 16,
            fan_out: 8
        }
    );
    let g = lower(&convnet(sgd(0.1)), 2).unwrap();
    let init = |name: &str| {
        g.params
            .iter()
            .find(|(_, m)| m.name == name)
            .map(|(_, m)| m.init)
            .unwrap()
    };
    assert_eq!(init("conv2d_1.weight"), Init::HeUniform { fan_in: 27 });
    assert_eq!(init("conv2d_2.weight"), Init::HeUniform { fan_in: 16 }); // gelu
    assert_eq!(
        init("dense_1.weight"),
        Init::GlorotUniform {
            fan_in: 8,
            fan_out: 5
        }
    );
}

/// A layer's `init:` / `bias_init:` replace the default (also before a ReLU), with the parameter's
/// fans; a bias takes its weight's.
#[test]
fn chosen_initialisers_carry_the_fans() {
    let src = "input x: [6, 6, 2]
target y: [3]
out = x
  |> conv2d(4, 3, init: glorot_normal, bias_init: torch_default) |> relu
  |> conv_transpose2d(5, 2, stride: 2, init: lecun_uniform)
  |> flatten |> dense(3, init: normal(std: 0.5), bias_init: ones)
loss mse(out, y)
";
    let g = lower(&dmc_compiler::testutil::checked_with(src, 2, &sgd(0.1)), 2).unwrap();
    let init = |name: &str| {
        g.params
            .iter()
            .find(|(_, m)| m.name == name)
            .map(|(_, m)| m.init)
            .unwrap()
    };
    assert_eq!(
        init("conv2d_1.weight"),
        Init::GlorotNormal {
            fan_in: 18,
            fan_out: 36
        }
    );
    assert_eq!(init("conv2d_1.bias"), Init::TorchDefault { fan_in: 18 });
    // PyTorch's fans of ConvTranspose2d: fan_in kh·kw·filters
    assert_eq!(
        init("conv_transpose2d_1.weight"),
        Init::LecunUniform { fan_in: 20 }
    );
    assert_eq!(init("conv_transpose2d_1.bias"), Init::Zeros);
    assert_eq!(init("dense_1.weight"), Init::Normal { std: 0.5 });
    assert_eq!(init("dense_1.bias"), Init::Ones);
}

#[test]
fn conv_geometry_and_label_reshape() {
    let g = lower(&residual(sgd(0.1)), 3).unwrap();
    let conv2 = g
        .nodes()
        .into_iter()
        .find(|n| g.node(*n).name == "conv2d_2")
        .unwrap();
    // k=2 'same' on 6: pad_total 1, all of it at the bottom/right.
    assert_eq!(
        g.node(conv2).op,
        Op::Conv(ConvOp::Conv2d {
            geom: ConvGeom {
                pad_bottom: 1,
                pad_right: 1,
                ..ConvGeom::square(2, 1, 0)
            },
            bias: true,
            epi: Default::default(),
        })
    );
    assert_eq!(g.node(conv2).outputs[0].shape, vec![3, 6, 6, 4]);
    // i32 labels declared [1] are reshaped to [N] for cross-entropy.
    let (l, _) = g.loss.unwrap();
    let labels = g.input(l, 1).unwrap();
    assert_eq!(g.node(labels.0).op, Op::Reshape);
    assert_eq!(g.ty(labels), &TensorType::new(vec![3], DType::I32));
}

#[test]
fn bad_models_are_errors_not_panics() {
    let mut m = mlp(sgd(0.1));
    m.nodes[0].inputs = vec![ValueRef::Node(99)];
    assert!(matches!(lower(&m, 2), Err(CompileError::InvalidModel(_))));
    let mut m = mlp(sgd(0.1));
    m.nodes[0].shape = vec![17];
    assert!(lower(&m, 2).is_err());
    let mut m = mlp(sgd(0.1));
    m.nodes[0].params.pop();
    assert!(matches!(lower(&m, 2), Err(CompileError::InvalidModel(_))));
    let mut m = mlp(sgd(0.1));
    m.targets[0].shape = vec![5];
    assert!(matches!(lower(&m, 2), Err(CompileError::Shape { .. })));
    assert!(lower(&mlp(sgd(0.1)), 0).is_err());
}

#[test]
fn layernorm_is_one_node_with_scale_ones_shift_zeros_and_no_running_statistics() {
    let m = dmc_compiler::testutil::checked(
        "input x: [4, 4, 3]
         target y: [2]
         out = x |> layernorm(eps: 1e-3) |> flatten |> dense(2) |> layernorm
         loss mse(out, y)
         train { batch: 2, optimizer: sgd(lr: 0.1) }",
    );
    let g = lower(&m, 2).expect("lowers");
    let init = |name: &str| {
        g.params
            .iter()
            .find(|(_, p)| p.name == name)
            .map(|(_, p)| p.init)
    };
    for l in ["layernorm_1", "layernorm_2"] {
        assert_eq!(init(&format!("{l}.weight")), Some(Init::Ones), "{l}");
        assert_eq!(init(&format!("{l}.bias")), Some(Init::Zeros), "{l}");
    }
    // PyTorch's names and nothing else: no running statistics
    assert_eq!(g.params.len(), 6);
    assert!(g.params.iter().all(|(_, p)| !p.name.contains("running")));
}
