//! The facts the plan crate holds in one place hold together: every activation's name, kernel
//! names, saved value, Rust formulas and CUDA statements agree with each other and with the ops'
//! signatures; every update rule's state slots agree with its op's signature and aliasing; and the
//! JSON shape of an update op is the one `FORMAT_VERSION` 3 names (kept in 4 to 12: the fields added since are absent when off).

use dmc_plan::op::{ElementwiseOp, Op, OptimOp, Role, TensorType, UnaryKind, UpdateRule};
use dmc_plan::plan::FORMAT_VERSION;
use dmc_plan::unary::Saved;

#[test]
fn every_activation_is_named_once_and_its_kernels_after_it() {
    let mut names: Vec<&str> = UnaryKind::ALL.iter().map(|k| k.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), UnaryKind::ALL.len(), "duplicate names");
    for k in UnaryKind::ALL {
        let n = k.name();
        assert_eq!(UnaryKind::from_name(n), Some(k));
        let ops = k.op_names();
        assert_eq!(ops.forward, n);
        assert_eq!(ops.backward, format!("{n}_bwd"));
        assert_eq!(ops.forward_inplace, format!("{n}_inplace"));
        assert_eq!(ops.backward_inplace, format!("{n}_bwd_inplace"));
        assert_eq!(
            Op::Elementwise(ElementwiseOp::Unary(k)).kind_name(),
            ops.forward
        );
        assert_eq!(
            Op::Elementwise(ElementwiseOp::UnaryBwd(k)).kind_name(),
            ops.backward
        );
        assert_eq!(
            Op::Elementwise(ElementwiseOp::UnaryInPlace(k)).kind_name(),
            ops.forward_inplace
        );
        assert_eq!(
            Op::Elementwise(ElementwiseOp::UnaryBwdInPlace(k)).kind_name(),
            ops.backward_inplace
        );
    }
    assert_eq!(UnaryKind::from_name("swish"), None);
}

#[test]
fn the_backward_reads_the_saved_value_its_signature_names() {
    for k in UnaryKind::ALL {
        let saved = k.saved().param_name();
        let bwd = Op::Elementwise(ElementwiseOp::UnaryBwd(k)).signature();
        assert_eq!(bwd.params[0].name, saved, "{}", k.name());
        assert_eq!(bwd.params[0].role, Role::In);
        let inplace = Op::Elementwise(ElementwiseOp::UnaryBwdInPlace(k)).signature();
        assert_eq!(inplace.params[0].name, saved, "{}", k.name());
        assert_eq!(inplace.params[1].role, Role::InOut);
        // the CUDA statements read exactly what the Rust formulas read
        assert!(k.cuda_forward().contains("{in}") && k.cuda_forward().contains("{out}"));
        assert!(!k.cuda_forward().contains("{saved}"), "{}", k.name());
        let b = k.cuda_backward();
        assert!(b.contains("{saved}") && b.contains("{in}") && b.contains("{out}"));
    }
}

/// f'(x) by a central difference in f64 of the f32 forward.
fn numeric_derivative(k: UnaryKind, x: f32) -> f64 {
    let h = 1e-2f32;
    (k.forward(x + h) as f64 - k.forward(x - h) as f64) / (2.0 * h as f64)
}

#[test]
fn each_backward_is_the_derivative_of_its_forward_from_the_saved_value() {
    for k in UnaryKind::ALL {
        for x in [-3.0f32, -1.3, -0.4, 0.3, 0.9, 2.2, 4.0] {
            let s = match k.saved() {
                Saved::Input => x,
                Saved::Output => k.forward(x),
            };
            let g = 0.75f32;
            let got = k.backward(s, g) as f64;
            let want = g as f64 * numeric_derivative(k, x);
            assert!(
                (got - want).abs() <= 2e-3 * (1.0 + want.abs()),
                "{} at {x}: {got} vs {want}",
                k.name()
            );
        }
    }
}

#[test]
fn nan_propagates_through_every_activation_and_its_gradient() {
    for k in UnaryKind::ALL {
        assert!(k.forward(f32::NAN).is_nan(), "{}", k.name());
        assert!(k.backward(0.5, f32::NAN).is_nan(), "{}", k.name());
    }
}

fn rules() -> [UpdateRule; 4] {
    let sgd = |momentum| UpdateRule::Sgd {
        lr: 0.1,
        momentum,
        weight_decay: 0.0,
        nesterov: false,
        clip_value: None,
        clip_norm: None,
    };
    let adam = |decoupled| UpdateRule::Adam {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        decoupled,
        clip_value: None,
        clip_norm: None,
    };
    [sgd(0.0), sgd(0.9), adam(false), adam(true)]
}

#[test]
fn an_update_op_has_the_state_slots_of_its_rule() {
    for rule in rules() {
        let op = Op::Optim(OptimOp::Update {
            summed: false,
            shards: 1,
            keep_rows: false,
            rule,
            zero_grad: false,
        });
        let names: Vec<String> = op.signature().params.into_iter().map(|p| p.name).collect();
        let mut want = vec!["w".to_string(), "g".to_string()];
        want.extend(rule.state_names().iter().map(|s| s.to_string()));
        assert_eq!(names, want, "{rule:?}");
        // every output (the weight, then each state) aliases its own input, skipping g
        let aliases: Vec<(usize, usize)> = op.aliased_outputs();
        let mut want = vec![(0, 0)];
        want.extend((1..=rule.state_names().len()).map(|o| (o, o + 1)));
        assert_eq!(aliases, want, "{rule:?}");
        assert_eq!(op.num_outputs(), 1 + rule.state_names().len());
        assert_eq!(UpdateRule::of(&op), Some(rule));
        assert!(op.is_update());
        assert_eq!(op.kind_name(), rule.op_name());
    }
    assert_eq!(UpdateRule::of(&Op::Elementwise(ElementwiseOp::Add)), None);
    assert_eq!(rules()[0].state_names(), &[] as &[&str]);
    assert_eq!(rules()[1].state_names(), &["v"]);
    assert_eq!(rules()[2].state_names(), &["m", "v"]);
}

#[test]
fn an_update_op_in_plan_json_carries_its_rule() {
    assert_eq!(FORMAT_VERSION, 13);
    let op = Op::Optim(OptimOp::Update {
        summed: false,
        shards: 1,
        keep_rows: false,
        rule: rules()[1],
        zero_grad: false,
    });
    let json = serde_json::to_string(&op).expect("serialises");
    assert_eq!(
        json,
        r#"{"Optim":{"Update":{"rule":{"Sgd":{"lr":0.1,"momentum":0.9,"weight_decay":0.0,"nesterov":false}}}}}"#
    );
    let back: Op = serde_json::from_str(&json).expect("parses");
    assert_eq!(back, op);
    // the plan's optimizer is the same type, serialised as before
    let rule = serde_json::to_string(&rules()[2]).expect("serialises");
    assert!(rule.starts_with(r#"{"Adam":{"lr":0.001,"#), "{rule}");
}

#[test]
fn clipping_and_accumulation_in_plan_json_and_their_aliasing() {
    // `clip_value` and `zero_grad` are absent when off (above); present, they round-trip
    let op = Op::Optim(OptimOp::Update {
        summed: false,
        shards: 1,
        keep_rows: false,
        rule: rules()[1].with_clip_value(Some(0.5)),
        zero_grad: true,
    });
    let json = serde_json::to_string(&op).expect("serialises");
    assert_eq!(
        json,
        r#"{"Optim":{"Update":{"rule":{"Sgd":{"lr":0.1,"momentum":0.9,"weight_decay":0.0,"nesterov":false,"clip_value":0.5}},"zero_grad":true}}}"#
    );
    let back: Op = serde_json::from_str(&json).expect("parses");
    assert_eq!(back, op);
    // zero_grad: g is written (zeroed) too, every output aliases the input in its place
    let names: Vec<_> = op
        .signature()
        .params
        .iter()
        .map(|p| (p.name.clone(), p.role))
        .collect();
    assert_eq!(
        names,
        [
            ("w".to_string(), Role::InOut),
            ("g".into(), Role::InOut),
            ("v".into(), Role::InOut)
        ]
    );
    assert_eq!(op.aliased_outputs(), vec![(0, 0), (1, 1), (2, 2)]);
    assert!(op.is_update());
    // the accumulation: acc += scale g, in place, not an update (the update reads its result)
    let acc = Op::Optim(OptimOp::GradAccum { scale: 0.25 });
    assert_eq!(acc.aliased_outputs(), vec![(0, 0)]);
    assert_eq!(acc.kind_name(), "grad_accum");
    assert!(!acc.is_update());
    let t = TensorType::f32(vec![3, 4]);
    assert_eq!(
        acc.infer_outputs(&[t.clone(), t.clone()], None)
            .expect("infers"),
        vec![t.clone()]
    );
    assert!(acc
        .infer_outputs(&[t, TensorType::f32(vec![4, 3])], None)
        .is_err());
}

#[test]
fn the_norm_pass_store_moves_the_sum_in_place_and_is_a_root() {
    // sum, held -> sum' (zeroed), held' (the sum): both in place, both persistent state
    let op = Op::Optim(OptimOp::GradNormStore);
    assert_eq!(op.aliased_outputs(), vec![(0, 0), (1, 1)]);
    assert!(
        op.is_update(),
        "nothing reads it: it must survive dead code elimination"
    );
    let roles: Vec<Role> = op.signature().params.iter().map(|p| p.role).collect();
    assert_eq!(roles, [Role::InOut, Role::InOut]);
    let s = TensorType::f32(vec![1]);
    assert_eq!(
        op.infer_outputs(&[s.clone(), s.clone()], None)
            .expect("infers"),
        vec![s.clone(), s.clone()]
    );
    assert!(op
        .infer_outputs(&[TensorType::f32(vec![2]), s], None)
        .is_err());
    let json = serde_json::to_string(&op).expect("serialises");
    assert_eq!(json, r#"{"Optim":"GradNormStore"}"#);
}

#[test]
fn batchnorm_ops_in_plan_json_and_their_aliasing() {
    use dmc_plan::op::NormOp;
    use dmc_plan::unary::Coef;
    let bwd = |in_place| {
        Op::Norm(NormOp::BatchNormBwd {
            eps: Coef(1e-5),
            in_place,
            ranks: 1,
        })
    };
    // `in_place` is absent when off
    let json = serde_json::to_string(&bwd(false)).expect("serialises");
    assert_eq!(json, r#"{"Norm":{"BatchNormBwd":{"eps":0.00001}}}"#);
    let back: Op = serde_json::from_str(&json).expect("parses");
    assert_eq!(back, bwd(false));
    // in place: dx is dy's buffer (output 0 into slot 0), one `Out` fewer
    assert_eq!(bwd(true).aliased_outputs(), vec![(0, 0)]);
    assert_eq!(bwd(true).num_outputs(), 3);
    assert_eq!(bwd(false).num_outputs(), 3);
    assert_eq!(
        bwd(true).signature().params.len() + 1,
        bwd(false).signature().params.len()
    );
    // the running statistics' update is an update (a root), in place on both statistics
    let stats = Op::Norm(NormOp::BatchNormStats {
        momentum: Coef(0.1),
        count: 8,
    });
    assert!(stats.is_update());
    assert_eq!(stats.aliased_outputs(), vec![(0, 0), (1, 1)]);
    assert!(!Op::Norm(NormOp::BatchNorm {
        eps: Coef(1e-5),
        ranks: 1
    })
    .is_update());
    assert!(Op::RunStat {
        name: "bn.running_mean".into()
    }
    .is_leaf());
}

#[test]
fn layernorm_shape_rules_give_one_statistic_per_row() {
    use dmc_plan::op::{NormOp, TensorType};
    use dmc_plan::unary::Coef;
    let f = |s: &[usize]| TensorType::f32(s.to_vec());
    let fwd = Op::Norm(NormOp::LayerNorm { eps: Coef(1e-5) });
    let bwd = Op::Norm(NormOp::LayerNormBwd);
    // NHWC: mean and rstd per pixel, y like x
    let out = fwd
        .infer_outputs(&[f(&[2, 3, 4, 5]), f(&[5]), f(&[5])], None)
        .expect("image");
    assert_eq!(out, vec![f(&[2, 3, 4, 5]), f(&[2, 3, 4]), f(&[2, 3, 4])]);
    let out = fwd
        .infer_outputs(&[f(&[6, 9]), f(&[9]), f(&[9])], None)
        .expect("features");
    assert_eq!(out, vec![f(&[6, 9]), f(&[6]), f(&[6])]);
    // a scale of the wrong size, or an unbatched value, is refused
    assert!(fwd
        .infer_outputs(&[f(&[6, 9]), f(&[6]), f(&[9])], None)
        .is_err());
    assert!(fwd
        .infer_outputs(&[f(&[9]), f(&[9]), f(&[9])], None)
        .is_err());
    // backward: dx like x, dgamma and dbeta per channel; statistics must be per row
    let ins = |st: &[usize]| vec![f(&[6, 9]), f(&[6, 9]), f(st), f(st), f(&[9])];
    let out = bwd.infer_outputs(&ins(&[6]), None).expect("backward");
    assert_eq!(out, vec![f(&[6, 9]), f(&[9]), f(&[9])]);
    assert!(bwd.infer_outputs(&ins(&[9]), None).is_err());
    // no aliasing, no update, out of place only; the runtime's check of a whole kernel
    assert!(fwd.aliased_outputs().is_empty() && bwd.aliased_outputs().is_empty());
    assert!(!fwd.is_update() && !bwd.is_update());
    assert_eq!((fwd.num_outputs(), bwd.num_outputs()), (3, 3));
    let shapes = |st: Vec<usize>| vec![vec![6, 9], vec![9], vec![9], vec![6, 9], st.clone(), st];
    assert!(fwd.check_args(&shapes(vec![6])).is_ok());
    assert!(fwd.check_args(&shapes(vec![9])).is_err());
    assert_eq!(
        (fwd.kind_name(), bwd.kind_name()),
        ("layernorm", "layernorm_bwd")
    );
}

#[test]
fn a_loss_op_carries_its_weight_absent_when_one() {
    use dmc_plan::op::LossOp;
    let plain = Op::Loss(LossOp::MseLoss { weight: 1.0 });
    assert_eq!(
        serde_json::to_string(&plain).unwrap(),
        r#"{"Loss":{"MseLoss":{}}}"#
    );
    let w = Op::Loss(LossOp::CrossEntropyLoss {
        label_smoothing: 0.1,
        weight: 0.25,
    });
    let json = serde_json::to_string(&w).unwrap();
    assert_eq!(
        json,
        r#"{"Loss":{"CrossEntropyLoss":{"label_smoothing":0.1,"weight":0.25}}}"#
    );
    assert_eq!(serde_json::from_str::<Op>(&json).unwrap(), w);
    let back: Op = serde_json::from_str(r#"{"Loss":{"HuberLossBwd":{"delta":0.5}}}"#).unwrap();
    assert_eq!(
        back,
        Op::Loss(LossOp::HuberLossBwd {
            delta: 0.5,
            weight: 1.0
        })
    );
    // The backward keeps the weight and the options; a backward has none.
    let Op::Loss(l) = &w else { unreachable!() };
    assert_eq!(
        l.backward(),
        Some(LossOp::CrossEntropyLossBwd {
            label_smoothing: 0.1,
            weight: 0.25
        })
    );
    assert_eq!(l.backward().and_then(|b| b.backward()), None);
    assert_eq!(l.backward().map(|b| b.weight()), Some(0.25));
}
