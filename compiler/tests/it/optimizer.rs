//! The optimizer pass: state leaves and update nodes per optimizer.

use dmc_compiler::ir::Graph;
use dmc_compiler::op::{ConvOp, DenseOp, Op, OptimOp, Role, UpdateRule};
use dmc_compiler::plan::{BufferKind, Init, Mode};
use dmc_compiler::testutil::*;
use dmc_compiler::{compile, compile_graph, CompileOptions};

fn train(m: &dmc_grammar::model::Model) -> Graph {
    compile_graph(
        m,
        &CompileOptions {
            mode: Mode::Train,
            verify: true,
            // the optimizer pass' own output (fusion is tested in `memory.rs`)
            fuse: false,
            ..Default::default()
        },
    )
    .unwrap()
}

fn check(opt: dmc_grammar::model::Optimizer, suffixes: &[&str]) {
    for (name, m) in small_fixtures(opt) {
        let g = train(&m);
        let nparams = g.params.len();
        let updates: Vec<_> = g
            .nodes()
            .into_iter()
            .filter(|n| matches!(g.node(*n).op, Op::Optim(OptimOp::Update { .. })))
            .collect();
        assert_eq!(updates.len(), nparams, "{name}: one update per parameter");
        assert_eq!(g.opt_state.len(), nparams * suffixes.len(), "{name}");
        for u in updates {
            let ins = g.inputs(u);
            assert_eq!(ins.len(), 2 + suffixes.len());
            let p = ins[0].0;
            let meta = g.param_meta(p).expect("input 0 is the parameter");
            assert_eq!(ins[1], g.grads[&p], "input 1 is the gradient");
            for (i, s) in suffixes.iter().enumerate() {
                let st = g.node(ins[2 + i].0);
                assert_eq!(
                    st.op,
                    Op::OptState {
                        name: format!("{}.{s}", meta.name)
                    }
                );
                assert_eq!(st.outputs[0].shape, meta.shape);
            }
            assert_eq!(g.node(u).outputs.len(), 1 + suffixes.len());
        }
        let plan = compile(
            &m,
            &CompileOptions {
                verify: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(plan.opt_state.len(), nparams * suffixes.len());
        for s in &plan.opt_state {
            assert_eq!(plan.buffers[s.buffer].kind, BufferKind::OptimizerState);
            assert!(plan.buffers[s.buffer].persistent);
            assert_eq!(s.init, Init::Zeros);
        }
        // Update steps pass the param and states as InOut and write nothing else.
        for st in &plan.steps {
            let k = &plan.kernels[st.kernel];
            if matches!(k.op, Op::Optim(OptimOp::Update { .. })) {
                let roles: Vec<Role> = k.signature.params.iter().map(|p| p.role).collect();
                assert_eq!(
                    roles.iter().filter(|r| **r == Role::InOut).count(),
                    1 + suffixes.len()
                );
                assert_eq!(plan.buffers[st.args[0]].kind, BufferKind::Parameter);
                assert_eq!(plan.buffers[st.args[1]].kind, BufferKind::Gradient);
            }
        }
    }
}

#[test]
fn sgd_without_momentum_keeps_no_state() {
    check(sgd(0.1), &[]);
}

#[test]
fn sgd_with_momentum_keeps_a_velocity() {
    check(sgd_momentum(0.1, 0.9), &["momentum"]);
}

#[test]
fn adam_keeps_two_moments() {
    check(adam(1e-3), &["adam_m", "adam_v"]);
}

#[test]
fn lr_override_reaches_the_update_kernels() {
    let opts = CompileOptions {
        lr: Some(dmc_grammar::model::LearningRate::new(0.5).unwrap()),
        verify: true,
        ..Default::default()
    };
    let plan = compile(&mlp(sgd(0.1)), &opts).unwrap();
    assert_eq!(plan.optimizer.lr(), 0.5);
    // Fused by default: the rule of every fused update carries the new lr.
    let lrs: Vec<f32> = plan
        .kernels
        .iter()
        .filter_map(|k| match &k.op {
            Op::Optim(OptimOp::Update {
                rule: UpdateRule::Sgd { lr, .. },
                ..
            }) => Some(*lr),
            Op::Conv(ConvOp::Conv2dBwdWeightUpdate { rule, .. })
            | Op::Dense(DenseOp::DenseBwdWeightUpdate { rule, .. })
            | Op::Optim(OptimOp::BiasGradUpdate { rule, .. }) => Some(rule.lr()),
            _ => None,
        })
        .collect();
    assert!(
        !lrs.is_empty() && lrs.iter().all(|lr| *lr == 0.5),
        "{lrs:?}"
    );
    let unfused = compile(
        &mlp(sgd(0.1)),
        &CompileOptions {
            fuse: false,
            ..opts
        },
    )
    .unwrap();
    assert!(unfused
        .kernels
        .iter()
        .any(|k| matches!(k.op, Op::Optim(OptimOp::Update { rule: UpdateRule::Sgd { lr, .. }, .. }) if lr == 0.5)));
}
