//! Shape inference ([`dmc_compiler::ir::infer_outputs`]): the output types of every op from its
//! input types, and the rejections of mismatched inputs.

#![allow(clippy::cloned_ref_to_slice_refs)] // readability of the shape tables

use dmc_compiler::ir::{infer_outputs, TensorType};
use dmc_compiler::op::{
    ConvGeom, ConvOp, DType, DenseOp, ElementwiseOp, LossOp, Op, OptimOp, PoolGeom, PoolOp,
    UnaryKind, UpdateRule,
};

fn f(s: &[usize]) -> TensorType {
    TensorType::f32(s.to_vec())
}
fn shapes(op: &Op, ins: &[TensorType], hint: Option<&TensorType>) -> Vec<TensorType> {
    infer_outputs(op, ins, hint).unwrap_or_else(|e| panic!("{}: {e}", op.kind_name()))
}

const G3: ConvGeom = ConvGeom::square(3, 1, 1);
const POOL: PoolGeom = PoolGeom::square(2, 2, 0);

#[test]
fn forward_ops() {
    let x = f(&[2, 5, 5, 3]);
    let conv = Op::Conv(ConvOp::Conv2d {
        geom: G3,
        bias: true,
        epi: Default::default(),
    });
    assert_eq!(
        shapes(&conv, &[x.clone(), f(&[3, 3, 3, 8]), f(&[8])], None),
        vec![f(&[2, 5, 5, 8])]
    );
    // stride 2 'same' on 5: out 3, pad_total 2, pad_top 1.
    let s2 = Op::Conv(ConvOp::Conv2d {
        geom: ConvGeom {
            stride_h: 2,
            stride_w: 2,
            ..G3
        },
        bias: false,
        epi: Default::default(),
    });
    let y = f(&[2, 3, 3, 8]);
    assert_eq!(
        shapes(&s2, &[x.clone(), f(&[3, 3, 3, 8])], Some(&y)),
        vec![y.clone()]
    );
    assert!(infer_outputs(&s2, &[x.clone(), f(&[3, 3, 3, 8])], Some(&f(&[2, 4, 4, 8]))).is_err());
    assert!(infer_outputs(&conv, &[x.clone(), f(&[3, 3, 4, 8]), f(&[8])], None).is_err());
    assert_eq!(
        shapes(
            &Op::Pool(PoolOp::MaxPool { geom: POOL }),
            &[x.clone()],
            None
        ),
        vec![
            f(&[2, 2, 2, 3]),
            TensorType::new(vec![2, 2, 2, 3], DType::U8)
        ]
    );
    assert_eq!(
        shapes(
            &Op::Pool(PoolOp::AvgPool { geom: POOL }),
            &[x.clone()],
            None
        ),
        vec![f(&[2, 2, 2, 3])]
    );
    assert_eq!(
        shapes(&Op::Pool(PoolOp::GlobalAvgPool), &[x.clone()], None),
        vec![f(&[2, 3])]
    );
    assert_eq!(
        shapes(&Op::Reshape, &[x.clone()], Some(&f(&[2, 75]))),
        vec![f(&[2, 75])]
    );
    assert!(infer_outputs(&Op::Reshape, &[x.clone()], Some(&f(&[2, 74]))).is_err());
    assert!(infer_outputs(&Op::Reshape, &[x.clone()], None).is_err());
    let d = Op::Dense(DenseOp::Dense {
        bias: false,
        epi: Default::default(),
    });
    assert_eq!(
        shapes(&d, &[f(&[2, 4]), f(&[4, 6])], None),
        vec![f(&[2, 6])]
    );
    assert!(infer_outputs(&d, &[f(&[2, 5]), f(&[4, 6])], None).is_err());
    assert!(infer_outputs(&d, &[f(&[2, 4])], None).is_err());
    assert_eq!(
        shapes(
            &Op::Elementwise(ElementwiseOp::Unary(UnaryKind::Tanh)),
            &[x.clone()],
            None
        ),
        vec![x.clone()]
    );
    assert_eq!(
        shapes(
            &Op::Elementwise(ElementwiseOp::Dropout { p: 0.5, salt: 1 }),
            &[x.clone()],
            None
        ),
        vec![x.clone()]
    );
    assert_eq!(
        shapes(
            &Op::Elementwise(ElementwiseOp::Add),
            &[x.clone(), x.clone()],
            None
        ),
        vec![x.clone()]
    );
    assert!(infer_outputs(
        &Op::Elementwise(ElementwiseOp::Add),
        &[x.clone(), f(&[2, 5, 5, 4])],
        None
    )
    .is_err());
    assert_eq!(
        shapes(
            &Op::Loss(LossOp::MseLoss { weight: 1.0 }),
            &[f(&[2, 3]), f(&[2, 3])],
            None
        ),
        vec![f(&[1])]
    );
    let labels = TensorType::new(vec![2], DType::I32);
    assert_eq!(
        shapes(
            &Op::Loss(LossOp::CrossEntropyLoss {
                label_smoothing: 0.0,
                weight: 1.0,
            }),
            &[f(&[2, 3]), labels.clone()],
            None
        ),
        vec![f(&[1])]
    );
    assert!(infer_outputs(
        &Op::Loss(LossOp::CrossEntropyLoss {
            label_smoothing: 0.0,
            weight: 1.0,
        }),
        &[f(&[2, 3]), f(&[2])],
        None
    )
    .is_err());
    assert_eq!(
        shapes(
            &Op::Loss(LossOp::CrossEntropyLossBwd {
                label_smoothing: 0.0,
                weight: 1.0,
            }),
            &[f(&[2, 3]), labels],
            None
        ),
        vec![f(&[2, 3])]
    );
}

#[test]
fn backward_and_update_ops() {
    let x = f(&[2, 5, 5, 3]);
    let dy = f(&[2, 5, 5, 8]);
    let w = f(&[3, 3, 3, 8]);
    assert_eq!(
        shapes(
            &Op::Conv(ConvOp::Conv2dBwdData {
                geom: G3,
                epi: Default::default(),
                in_place: false,
            }),
            &[dy.clone(), w.clone()],
            Some(&x)
        ),
        vec![x.clone()]
    );
    assert!(infer_outputs(
        &Op::Conv(ConvOp::Conv2dBwdData {
            geom: G3,
            epi: Default::default(),
            in_place: false,
        }),
        &[dy.clone(), w.clone()],
        None
    )
    .is_err());
    assert_eq!(
        shapes(
            &Op::Conv(ConvOp::Conv2dBwdWeight { geom: G3 }),
            &[x.clone(), dy.clone()],
            None
        ),
        vec![w.clone()]
    );
    assert_eq!(
        shapes(&Op::Optim(OptimOp::BiasGrad), &[dy.clone()], None),
        vec![f(&[8])]
    );
    assert_eq!(
        shapes(
            &Op::Dense(DenseOp::DenseBwdData {
                epi: Default::default(),
            }),
            &[f(&[2, 6]), f(&[4, 6])],
            None
        ),
        vec![f(&[2, 4])]
    );
    assert_eq!(
        shapes(
            &Op::Dense(DenseOp::DenseBwdWeight),
            &[f(&[2, 4]), f(&[2, 6])],
            None
        ),
        vec![f(&[4, 6])]
    );
    let py = f(&[2, 2, 2, 3]);
    let am = TensorType::new(vec![2, 2, 2, 3], DType::U8);
    assert_eq!(
        shapes(
            &Op::Pool(PoolOp::MaxPoolBwd { geom: POOL }),
            &[py.clone(), am.clone()],
            Some(&x)
        ),
        vec![x.clone()]
    );
    // 4x4 also pools to 2x2 (floor): both are consistent, the hint decides.
    let x4 = f(&[2, 4, 4, 3]);
    assert_eq!(
        shapes(
            &Op::Pool(PoolOp::AvgPoolBwd { geom: POOL }),
            &[py.clone()],
            Some(&x4)
        ),
        vec![x4]
    );
    assert!(infer_outputs(
        &Op::Pool(PoolOp::AvgPoolBwd { geom: POOL }),
        &[py.clone()],
        Some(&f(&[2, 6, 6, 3]))
    )
    .is_err());
    assert!(infer_outputs(
        &Op::Pool(PoolOp::MaxPoolBwd { geom: POOL }),
        &[py.clone(), py.clone()],
        Some(&x)
    )
    .is_err());
    assert_eq!(
        shapes(&Op::Pool(PoolOp::GlobalAvgPoolBwd), &[f(&[2, 3])], Some(&x)),
        vec![x.clone()]
    );
    assert_eq!(
        shapes(
            &Op::Elementwise(ElementwiseOp::UnaryBwd(UnaryKind::Gelu)),
            &[x.clone(), x.clone()],
            None
        ),
        vec![x.clone()]
    );
    assert_eq!(
        shapes(
            &Op::Elementwise(ElementwiseOp::DropoutBwd { p: 0.1, salt: 2 }),
            &[x.clone()],
            None
        ),
        vec![x.clone()]
    );
    assert_eq!(
        shapes(
            &Op::Loss(LossOp::MseLossBwd { weight: 1.0 }),
            &[f(&[2, 3]), f(&[2, 3])],
            None
        ),
        vec![f(&[2, 3])]
    );
    let sgd = Op::Optim(OptimOp::Update {
        summed: false,
        shards: 1,
        keep_rows: false,
        rule: UpdateRule::Sgd {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.0,
            nesterov: false,
            clip_value: None,
            clip_norm: None,
        },
        zero_grad: false,
    });
    assert_eq!(
        shapes(&sgd, &[w.clone(), w.clone(), w.clone()], None),
        vec![w.clone(), w.clone()]
    );
    assert!(infer_outputs(&sgd, &[w.clone(), w.clone()], None).is_err());
    let plain = Op::Optim(OptimOp::Update {
        summed: false,
        shards: 1,
        keep_rows: false,
        rule: UpdateRule::Sgd {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            clip_value: None,
            clip_norm: None,
        },
        zero_grad: false,
    });
    assert_eq!(
        shapes(&plain, &[w.clone(), w.clone()], None),
        vec![w.clone()]
    );
    let adam = Op::Optim(OptimOp::Update {
        summed: false,
        shards: 1,
        keep_rows: false,
        rule: UpdateRule::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: true,
            clip_value: None,
            clip_norm: None,
        },
        zero_grad: false,
    });
    assert_eq!(
        shapes(&adam, &[w.clone(), w.clone(), w.clone(), w.clone()], None),
        vec![w.clone(); 3]
    );
    assert!(infer_outputs(&adam, &[w.clone(), dy, w.clone(), w.clone()], None).is_err());
}

#[test]
fn every_op_output_count_matches_num_outputs() {
    // Checked end to end by the verifier on every fixture; here the leaves.
    let leaf = Op::Param { name: "w".into() };
    assert_eq!(shapes(&leaf, &[], Some(&f(&[3]))).len(), leaf.num_outputs());
    assert!(infer_outputs(&leaf, &[f(&[1])], Some(&f(&[3]))).is_err());
}

#[test]
fn upsample_and_its_gradient() {
    let x = f(&[2, 3, 5, 4]);
    let up = Op::Pool(PoolOp::Upsample { factor: 3 });
    let y = shapes(&up, &[x.clone()], None);
    assert_eq!(y, vec![f(&[2, 9, 15, 4])]);
    let bwd = Op::Pool(PoolOp::UpsampleBwd { factor: 3 });
    assert_eq!(shapes(&bwd, &[y[0].clone()], None), vec![x.clone()]);
    // a gradient whose extents are not multiples of the factor, a flat input, a zero factor
    assert!(infer_outputs(&bwd, &[f(&[2, 9, 14, 4])], None).is_err());
    assert!(infer_outputs(&up, &[f(&[2, 60])], None).is_err());
    assert!(infer_outputs(
        &Op::Pool(PoolOp::Upsample { factor: 0 }),
        &[x.clone()],
        None
    )
    .is_err());
    // the runtime's check of a kernel's argument shapes is the same rule
    assert!(up.check_args(&[x.shape.clone(), vec![2, 9, 15, 4]]).is_ok());
    assert!(up
        .check_args(&[x.shape.clone(), vec![2, 9, 16, 4]])
        .is_err());
}

#[test]
fn max_pool_windows_fit_their_one_byte_argmax() {
    let x = f(&[1, 40, 40, 2]);
    let big = PoolGeom::square(17, 17, 0);
    assert!(infer_outputs(&Op::Pool(PoolOp::MaxPool { geom: big }), &[x.clone()], None).is_err());
    // average pooling keeps no argmax: any window
    assert_eq!(
        shapes(&Op::Pool(PoolOp::AvgPool { geom: big }), &[x], None),
        vec![f(&[1, 2, 2, 2])]
    );
}
