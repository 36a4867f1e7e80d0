//! Property test: random conv/dense chains (random kernel sizes, strides, paddings, activations,
//! pools, dropout, residual adds, batch, optimizer) compile in every mode with the verifier on
//! and produce plans the independent checker accepts.

use dmc_compiler::plan::Mode;
use dmc_compiler::testutil::*;
use dmc_compiler::{check_plan, compile, CompileOptions};
use dmc_grammar::model::{Activation, DType, LossKind, Padding};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum L {
    Conv {
        filters: usize,
        k: usize,
        stride: usize,
        same: bool,
        bias: bool,
    },
    Pool {
        max: bool,
        size: usize,
        stride: usize,
    },
    Act(u8),
    Dropout,
    Residual,
}

fn layer() -> impl Strategy<Value = L> {
    prop_oneof![
        (
            1usize..5,
            1usize..4,
            1usize..3,
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(filters, k, stride, same, bias)| L::Conv {
                filters,
                k,
                stride,
                same,
                bias
            }),
        (any::<bool>(), 1usize..3, 1usize..3).prop_map(|(max, size, stride)| L::Pool {
            max,
            size,
            stride
        }),
        (0u8..4).prop_map(L::Act),
        Just(L::Dropout),
        Just(L::Residual),
    ]
}

fn act(i: u8) -> Activation {
    [
        Activation::Relu,
        Activation::Tanh,
        Activation::Sigmoid,
        Activation::Gelu,
    ][i as usize % 4]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn random_nets_compile_and_check(
        hw in 3usize..10,
        layers in proptest::collection::vec(layer(), 1..7),
        dense in proptest::collection::vec((1usize..6, any::<bool>(), 0u8..5), 1..3),
        batch in 1usize..4,
        ce in any::<bool>(),
        opt in 0u8..3,
    ) {
        let optimizer = match opt { 0 => sgd(0.1), 1 => sgd_momentum(0.1, 0.9), _ => adam(1e-3) };
        let mut b = ModelBuilder::new();
        let x = b.input("x", &[hw, hw, 2]);
        let mut h = x;
        for l in &layers {
            let s = b.shape(h);
            h = match *l {
                L::Conv { filters, k, stride, same, bias } => {
                    if !same && s[0] < k { continue; }
                    b.conv(h, filters, k, stride, if same { Padding::Same } else { Padding::Valid }, bias)
                }
                L::Pool { max, size, stride } => {
                    if s[0] < size { continue; }
                    if max { b.maxpool(h, size, stride) } else { b.avgpool(h, size, stride) }
                }
                L::Act(a) => b.act(h, act(a)),
                L::Dropout => b.dropout(h, 0.3),
                L::Residual => {
                    let c = b.conv(h, s[2], 3, 1, Padding::Same, true);
                    b.add(h, c)
                }
            };
        }
        h = b.flatten(h);
        for (units, bias, a) in &dense {
            h = b.dense(h, *units, *bias);
            if *a < 4 { h = b.act(h, act(*a)); }
        }
        let classes = b.shape(h)[0];
        let m = if ce {
            let y = b.target("y", &[], DType::I32);
            b.build(h, LossKind::CrossEntropy, y, batch, optimizer)
        } else {
            let y = b.target("y", &[classes], DType::F32);
            b.build(h, LossKind::Mse, y, batch, optimizer)
        };
        for mode in [Mode::Train, Mode::Eval, Mode::Predict] {
            let p = compile(&m, &CompileOptions { mode, verify: true, ..Default::default() });
            let p = p.map_err(|e| TestCaseError::fail(format!("{mode:?}: {e}")))?;
            check_plan(&p).map_err(|e| TestCaseError::fail(format!("{mode:?}: {e}")))?;
            if mode == Mode::Train {
                prop_assert_eq!(p.params.len(), m.params().count());
            }
        }
    }
}
