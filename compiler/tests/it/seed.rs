//! The seed network: parameter bytes, update count, kernel dedupe, cap errors, serde.

use std::collections::BTreeSet;

use dmc_compiler::op::{ConvOp, Op, OptimOp, UpdateRule};
use dmc_compiler::plan::{BufferKind, Mode, Plan};
use dmc_compiler::testutil::seed;
use dmc_compiler::{check_plan, compile, CompileError, CompileOptions};

/// The unfused plan: one SGD `Update` per parameter, the weight gradients as their own kernels.
fn plan(mode: Mode) -> Plan {
    compile(
        &seed(),
        &CompileOptions {
            mode,
            verify: true,
            fuse: false,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn seed_train_plan() {
    let m = seed();
    assert_eq!(m.param_count(), 206_538_153);
    let p = plan(Mode::Train);
    check_plan(&p).unwrap();
    let param_bytes: u64 = p.params.iter().map(|b| p.buffers[b.buffer].bytes).sum();
    assert_eq!(param_bytes, 826_152_612);
    assert!(p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::Parameter)
        .all(|b| b.persistent));
    // 26 convs + 2 dense layers, each with a weight and a bias: 56 SGD updates, no state.
    let updates = p
        .steps
        .iter()
        .filter(|s| {
            matches!(
                p.kernels[s.kernel].op,
                Op::Optim(OptimOp::Update {
                    rule: UpdateRule::Sgd { .. },
                    ..
                })
            )
        })
        .count();
    assert_eq!(p.params.len(), 56);
    assert_eq!(updates, 56);
    assert!(p.opt_state.is_empty());
    // The 21 identical 1024->1024 convs (conv2d_4 .. conv2d_24) share their kernels.
    let kernel_of = |label: String| {
        p.steps
            .iter()
            .find(|s| s.label == label)
            .map(|s| s.kernel)
            .unwrap()
    };
    let fwd: BTreeSet<usize> = (4..=24)
        .map(|i| kernel_of(format!("conv2d_{i} forward")))
        .collect();
    let dw: BTreeSet<usize> = (4..=24)
        .map(|i| kernel_of(format!("grad conv2d_{i}.weight")))
        .collect();
    let dx: BTreeSet<usize> = (4..=24)
        .map(|i| kernel_of(format!("grad conv2d_{}", i - 1)))
        .collect();
    assert_eq!((fwd.len(), dw.len(), dx.len()), (1, 1, 1));
    assert_ne!(kernel_of("conv2d_3 forward".into()), *fwd.first().unwrap());
    assert!(
        p.kernels.len() < p.steps.len() / 2,
        "{} kernels for {} steps",
        p.kernels.len(),
        p.steps.len()
    );
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<Plan>(&json).unwrap(), p);
}

#[test]
fn seed_eval_and_predict_plans() {
    for mode in [Mode::Eval, Mode::Predict] {
        let p = plan(mode);
        check_plan(&p).unwrap();
        assert!(p.steps.iter().all(|s| !matches!(
            p.kernels[s.kernel].op,
            Op::Optim(OptimOp::Update {
                rule: UpdateRule::Sgd { .. },
                ..
            }) | Op::Conv(ConvOp::Conv2dBwdData { .. })
        )));
        assert_eq!(p.targets.is_empty(), mode == Mode::Predict);
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Plan>(&json).unwrap(), p);
    }
}

#[test]
fn seed_over_a_cap_is_a_structured_error() {
    let cap = 1 << 29;
    match compile(
        &seed(),
        &CompileOptions {
            cap: Some(cap),
            verify: true,
            // resident: what the parameters and optimizer state alone need
            stream: false,
            ..Default::default()
        },
    ) {
        Err(e @ CompileError::CapExceeded { .. }) => {
            let CompileError::CapExceeded {
                needed,
                cap: c,
                params,
                opt_state,
                working_set,
                host: 0,
            } = e.clone()
            else {
                unreachable!()
            };
            assert_eq!(c, cap);
            assert!(needed > cap);
            assert!(params >= 826_152_612);
            assert_eq!(opt_state, 0);
            assert_eq!(params + opt_state + working_set, needed);
            let _ = BufferKind::Parameter;
            println!("{e}");
        }
        other => panic!("expected CapExceeded, got {other:?}"),
    }
}
