//! One small kernel of every op variant (and both flavours of the flags that change the generated
//! code), for tests that must cover every template arm, not only what the examples happen to use.

use dmc_plan::op::{conv_workspace_elems, ConvGeom, Op, PoolGeom, UnaryKind, UpdateRule};
use dmc_plan::plan::Kernel;

fn k(id: usize, op: Op, arg_shapes: Vec<Vec<usize>>) -> Kernel {
    Kernel {
        id,
        name: format!("{}_{id}", op.kind_name()),
        signature: op.signature(),
        op,
        arg_shapes,
    }
}

/// Every kernel-bearing [`Op`] variant with small, odd shapes (tiles are partly filled).
pub fn zoo() -> Vec<Kernel> {
    let g2 = ConvGeom {
        kh: 3,
        kw: 3,
        stride: 2,
        pad_top: 1,
        pad_left: 1,
    };
    let g1 = ConvGeom {
        kh: 2,
        kw: 2,
        stride: 1,
        pad_top: 0,
        pad_left: 0,
    };
    let (x2, w2, y2) = (vec![2, 7, 9, 3], vec![3, 3, 3, 5], vec![2, 4, 5, 5]);
    let ws2 = vec![conv_workspace_elems(&g2, &x2, &y2)];
    let (x1, w1, y1) = (vec![1, 5, 5, 2], vec![2, 2, 2, 3], vec![1, 4, 4, 3]);
    let ws1 = vec![conv_workspace_elems(&g1, &x1, &y1)];
    let p2 = PoolGeom { size: 2, stride: 2 };
    let p3 = PoolGeom { size: 3, stride: 2 };
    let e = vec![3, 17];
    let mut ops: Vec<(Op, Vec<Vec<usize>>)> = vec![
        (
            Op::Conv2d {
                geom: g2,
                bias: true,
            },
            vec![x2.clone(), w2.clone(), vec![5], y2.clone(), ws2.clone()],
        ),
        (
            Op::Conv2d {
                geom: g1,
                bias: false,
            },
            vec![x1.clone(), w1.clone(), y1.clone(), ws1],
        ),
        (
            Op::Conv2dBwdData { geom: g2 },
            vec![y2.clone(), w2.clone(), x2.clone()],
        ),
        (
            Op::Conv2dBwdWeight { geom: g2 },
            vec![x2.clone(), y2.clone(), w2.clone(), ws2],
        ),
        (
            Op::Dense { bias: true },
            vec![vec![4, 6], vec![6, 3], vec![3], vec![4, 3]],
        ),
        (
            Op::Dense { bias: false },
            vec![vec![4, 6], vec![6, 3], vec![4, 3]],
        ),
        (Op::DenseBwdData, vec![vec![4, 3], vec![6, 3], vec![4, 6]]),
        (Op::DenseBwdWeight, vec![vec![4, 6], vec![4, 3], vec![6, 3]]),
        (
            Op::MaxPool { geom: p2 },
            vec![vec![2, 5, 5, 3], vec![2, 2, 2, 3], vec![2, 2, 2, 3]],
        ),
        (
            Op::MaxPool { geom: p3 },
            vec![vec![1, 7, 7, 2], vec![1, 3, 3, 2], vec![1, 3, 3, 2]],
        ),
        (
            Op::MaxPoolBwd { geom: p3 },
            vec![vec![1, 3, 3, 2], vec![1, 3, 3, 2], vec![1, 7, 7, 2]],
        ),
        (
            Op::AvgPool { geom: p3 },
            vec![vec![1, 7, 7, 2], vec![1, 3, 3, 2]],
        ),
        (
            Op::AvgPoolBwd { geom: p3 },
            vec![vec![1, 3, 3, 2], vec![1, 7, 7, 2]],
        ),
        (Op::GlobalAvgPool, vec![vec![2, 3, 4, 5], vec![2, 5]]),
        (Op::GlobalAvgPoolBwd, vec![vec![2, 5], vec![2, 3, 4, 5]]),
        (Op::Add, vec![vec![1000], vec![1000], vec![1000]]),
        (
            Op::Dropout { p: 0.3, salt: 7 },
            vec![vec![1000], vec![1000]],
        ),
        (
            Op::DropoutBwd { p: 0.3, salt: 7 },
            vec![vec![1000], vec![1000]],
        ),
        (Op::MseLoss, vec![vec![4, 3], vec![4, 3], vec![1]]),
        (Op::MseLossBwd, vec![vec![4, 3], vec![4, 3], vec![4, 3]]),
        (Op::CrossEntropyLoss, vec![vec![5, 7], vec![5], vec![1]]),
        (
            Op::CrossEntropyLossBwd,
            vec![vec![5, 7], vec![5], vec![5, 7]],
        ),
        (Op::BiasGrad, vec![vec![2, 3, 4, 5], vec![5]]),
        (
            Op::Update {
                rule: UpdateRule::Sgd {
                    lr: 0.1,
                    momentum: 0.0,
                    weight_decay: 0.0,
                    nesterov: false,
                },
            },
            vec![vec![50], vec![50]],
        ),
        (
            Op::Update {
                rule: UpdateRule::Sgd {
                    lr: 0.01,
                    momentum: 0.9,
                    weight_decay: 1e-4,
                    nesterov: true,
                },
            },
            vec![vec![50], vec![50], vec![50]],
        ),
        (
            Op::Update {
                rule: UpdateRule::Adam {
                    lr: 1e-3,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: 0.01,
                    decoupled: true,
                },
            },
            vec![vec![50]; 4],
        ),
        (
            Op::Update {
                rule: UpdateRule::Adam {
                    lr: 1e-3,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: 1e-4,
                    decoupled: false,
                },
            },
            vec![vec![50]; 4],
        ),
    ];
    for kind in UnaryKind::ALL {
        ops.push((Op::Unary(kind), vec![e.clone(), e.clone()]));
        ops.push((Op::UnaryBwd(kind), vec![e.clone(), e.clone(), e.clone()]));
    }
    // in place
    for kind in UnaryKind::ALL {
        ops.push((Op::UnaryInPlace(kind), vec![e.clone()]));
        ops.push((Op::UnaryBwdInPlace(kind), vec![e.clone(), e.clone()]));
    }
    ops.push((Op::AddInPlace, vec![vec![1000], vec![1000]]));
    ops.push((Op::DropoutInPlace { p: 0.3, salt: 7 }, vec![vec![1000]]));
    ops.push((Op::DropoutBwdInPlace { p: 0.3, salt: 7 }, vec![vec![1000]]));
    // weight gradient fused with the update: every rule flavour (SGD plain / momentum / nesterov,
    // Adam / AdamW), and a long reduction (the two-level summation)
    let sgd = |momentum: f32, nesterov: bool| UpdateRule::Sgd {
        lr: 0.01,
        momentum,
        weight_decay: 1e-4,
        nesterov,
    };
    let adam = |decoupled: bool| UpdateRule::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        decoupled,
    };
    // the signature's shapes: inputs, then as many state slots as the rule has (shaped as the
    // updated tensor), then the workspaces per `Op::workspace_elems`
    let fused = |op: Op, ins: Vec<Vec<usize>>, upd: Vec<usize>| {
        let ns = match &op {
            Op::Conv2dBwdWeightUpdate { rule, .. }
            | Op::DenseBwdWeightUpdate { rule, .. }
            | Op::BiasGradUpdate { rule } => rule.state_names().len(),
            _ => unreachable!("a fused update op"),
        };
        let mut s = ins;
        s.push(upd.clone());
        s.extend(std::iter::repeat_n(upd, ns));
        let ws = op.workspace_elems(&s);
        s.extend(ws.into_iter().map(|n| vec![n]));
        (op, s)
    };
    ops.push(fused(
        Op::Conv2dBwdWeightUpdate {
            geom: g2,
            rule: sgd(0.9, true),
            chunk: 2,
        },
        vec![x2.clone(), y2.clone()],
        w2.clone(),
    ));
    ops.push(fused(
        Op::Conv2dBwdWeightUpdate {
            geom: g1,
            rule: adam(false),
            chunk: 3,
        },
        vec![x1.clone(), y1.clone()],
        w1.clone(),
    ));
    ops.push(fused(
        Op::DenseBwdWeightUpdate {
            rule: sgd(0.0, false),
            chunk: 2,
        },
        vec![vec![4, 6], vec![4, 3]],
        vec![6, 3],
    ));
    ops.push(fused(
        Op::DenseBwdWeightUpdate {
            rule: adam(true),
            chunk: 1,
        },
        vec![vec![5000, 3], vec![5000, 2]],
        vec![3, 2],
    ));
    ops.push(fused(
        Op::BiasGradUpdate {
            rule: sgd(0.9, false),
        },
        vec![vec![2, 3, 4, 5]],
        vec![5],
    ));
    ops.push(fused(
        Op::BiasGradUpdate { rule: adam(false) },
        vec![vec![2, 3, 4, 5]],
        vec![5],
    ));
    // split-K (a small grid over a long reduction; the partial sums in the planned workspace):
    // the forward with bias, the unfused weight gradient, and both fused rules
    let g3 = ConvGeom {
        kh: 3,
        kw: 3,
        stride: 1,
        pad_top: 1,
        pad_left: 1,
    };
    let (xs, ws_, ys) = (vec![1, 4, 4, 130], vec![3, 3, 130, 7], vec![1, 4, 4, 7]);
    ops.push((
        Op::Conv2d {
            geom: g3,
            bias: true,
        },
        vec![
            xs.clone(),
            ws_,
            vec![7],
            ys,
            vec![conv_workspace_elems(&g3, &xs, &[1, 4, 4, 7])],
        ],
    ));
    let (xw, yw, ww) = (vec![5, 15, 15, 3], vec![5, 15, 15, 5], vec![3, 3, 3, 5]);
    ops.push((
        Op::Conv2dBwdWeight { geom: g3 },
        vec![
            xw.clone(),
            yw.clone(),
            ww.clone(),
            vec![conv_workspace_elems(&g3, &xw, &yw)],
        ],
    ));
    for rule in [sgd(0.9, false), adam(true)] {
        ops.push(fused(
            Op::Conv2dBwdWeightUpdate {
                geom: g3,
                rule,
                chunk: 5,
            },
            vec![xw.clone(), yw.clone()],
            ww.clone(),
        ));
    }
    ops.into_iter()
        .enumerate()
        .map(|(i, (op, s))| k(i, op, s))
        .collect()
}
