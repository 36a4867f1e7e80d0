//! The fused ops' facts: an epilogue's extra parameters and formulas (the unfused kernels', in
//! their order), the signatures, aliasing, workspaces and shape rules of the fused GEMMs, weight
//! updates and the folded pool backward, and their JSON (fields absent when off, so plans of
//! unfused ops read as before).

use dmc_plan::op::{
    ConvGeom, ConvOp, DenseOp, Epilogue, EpilogueSide, Op, PoolOp, Role, TensorType, UnaryKind,
    UpdateRule,
};

const G: ConvGeom = ConvGeom::square(3, 1, 1);

fn t(s: &[usize]) -> TensorType {
    TensorType::f32(s.to_vec())
}

fn adam() -> UpdateRule {
    UpdateRule::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled: false,
        clip_value: None,
        clip_norm: None,
    }
}

#[test]
fn epilogue_formulas_are_the_unfused_kernels_in_order() {
    for k in UnaryKind::ALL {
        let e = Epilogue {
            add: true,
            act: Some(k),
        };
        for (v, r) in [(0.3f32, -0.7f32), (-1.25, 0.5), (2.0, 1e-3)] {
            // forward: the add kernel (a + b), then the activation
            assert_eq!(e.forward(v, Some(r)).to_bits(), k.forward(v + r).to_bits());
            // data gradient: the accumulation, then the activation's backward
            let s = 0.4 * v;
            assert_eq!(
                e.backward(v, Some(r), Some(s)).to_bits(),
                k.backward(s, v + r).to_bits()
            );
        }
    }
    assert_eq!(Epilogue::NONE.forward(1.5, None), 1.5);
    assert_eq!(Epilogue::NONE.backward(-2.5, None, None), -2.5);
}

#[test]
fn fused_signatures_put_the_extra_inputs_after_the_ops_own() {
    let e = Epilogue {
        add: true,
        act: Some(UnaryKind::Relu),
    };
    let names = |op: &Op| -> Vec<(String, Role)> {
        op.signature()
            .params
            .into_iter()
            .map(|p| (p.name, p.role))
            .collect()
    };
    let conv = Op::Conv(ConvOp::Conv2d {
        geom: G,
        bias: true,
        epi: e,
    });
    let n: Vec<String> = names(&conv).into_iter().map(|p| p.0).collect();
    assert_eq!(n, ["x", "w", "b", "r", "y", "cols"]);
    assert_eq!(ConvOp::y_slot(true, &e), 4);
    let bwd = |in_place| {
        Op::Conv(ConvOp::Conv2dBwdData {
            geom: G,
            epi: e,
            in_place,
        })
    };
    let n: Vec<String> = names(&bwd(false)).into_iter().map(|p| p.0).collect();
    assert_eq!(n, ["dy", "w", "g", "saved", "dx", "partial"]);
    assert!(bwd(false).aliased_outputs().is_empty());
    // in place: dx is written over saved (InOut), no separate output (then the workspace)
    let in_place = names(&bwd(true));
    assert_eq!(
        in_place[in_place.len() - 2..],
        [
            ("saved".to_string(), Role::InOut),
            ("partial".to_string(), Role::Workspace)
        ]
    );
    assert_eq!(bwd(true).aliased_outputs(), vec![(0, 3)]);
    assert_eq!(bwd(true).num_outputs(), 1);
    assert_eq!(e.params(EpilogueSide::Forward).len(), 1);
    assert_eq!(e.params(EpilogueSide::DataGradient).len(), 2);
    let dense = Op::Dense(DenseOp::DenseBwdData { epi: e });
    let n: Vec<String> = names(&dense).into_iter().map(|p| p.0).collect();
    assert_eq!(n, ["dy", "w", "g", "saved", "dx"]);
}

#[test]
fn a_fused_weight_update_takes_the_bias_and_may_keep_the_old_weights() {
    let op = Op::Conv(ConvOp::Conv2dBwdWeightUpdate {
        shards: 1,
        keep_rows: false,
        geom: G,
        rule: adam(),
        chunk: 4,
        bias: true,
        keep_old: true,
    });
    let n: Vec<String> = op.signature().params.into_iter().map(|p| p.name).collect();
    assert_eq!(
        n,
        ["x", "dy", "w", "m", "v", "b", "b_m", "b_v", "w_old", "gw", "cols", "db"]
    );
    // w, m, v, b, b_m, b_v in place; w_old its own buffer
    assert_eq!(
        op.aliased_outputs(),
        (0..6).map(|o| (o, o + 2)).collect::<Vec<_>>()
    );
    assert_eq!(op.num_outputs(), 7);
    let (x, dy, w) = (t(&[2, 5, 5, 3]), t(&[2, 5, 5, 8]), t(&[3, 3, 3, 8]));
    let b = t(&[8]);
    let ins = [
        x.clone(),
        dy.clone(),
        w.clone(),
        w.clone(),
        w.clone(),
        b.clone(),
        b.clone(),
        b.clone(),
    ];
    let outs = op.infer_outputs(&ins, None).expect("infers");
    assert_eq!(outs.len(), 7);
    assert_eq!(outs[6], w);
    // the bias workspace holds one sum per output channel
    let ws = op.workspace_elems(&ins.iter().map(|t| t.shape.clone()).collect::<Vec<_>>());
    assert_eq!(ws, vec![27 * 4, 27 * 25 * 2, 8]);
    // a bias of the wrong size is refused
    let mut bad = ins.clone();
    bad[5] = t(&[7]);
    assert!(op.infer_outputs(&bad, None).is_err());
    assert_eq!(adam().bias_state_names(), &["b_m", "b_v"]);
}

#[test]
fn the_folded_pool_backward_reads_the_small_gradient_and_the_saved_value() {
    let op = Op::Pool(PoolOp::GlobalAvgPoolBwdAct(UnaryKind::Relu));
    let out = op
        .infer_outputs(&[t(&[2, 4]), t(&[2, 3, 3, 4])], None)
        .expect("infers");
    assert_eq!(out, vec![t(&[2, 3, 3, 4])]);
    assert!(op
        .infer_outputs(&[t(&[2, 5]), t(&[2, 3, 3, 4])], None)
        .is_err());
    let ip = Op::Pool(PoolOp::GlobalAvgPoolBwdActInPlace(UnaryKind::Relu));
    assert_eq!(ip.aliased_outputs(), vec![(0, 1)]);
}

#[test]
fn fused_fields_are_absent_from_json_when_off_and_read_back_when_on() {
    let plain = Op::Conv(ConvOp::Conv2d {
        geom: G,
        bias: true,
        epi: Epilogue::NONE,
    });
    let json = serde_json::to_string(&plain).expect("serialises");
    assert!(!json.contains("epi"), "{json}");
    // a plan written before fusion existed reads as the unfused op
    let back: Op = serde_json::from_str(&json).expect("parses");
    assert_eq!(back, plain);
    let fused = Op::Conv(ConvOp::Conv2d {
        geom: G,
        bias: true,
        epi: Epilogue {
            add: true,
            act: Some(UnaryKind::Gelu),
        },
    });
    let json = serde_json::to_string(&fused).expect("serialises");
    assert!(
        json.contains(r#""epi":{"add":true,"act":"Gelu"}"#),
        "{json}"
    );
    let back: Op = serde_json::from_str(&json).expect("parses");
    assert_eq!(back, fused);
}
