//! Every fixture compiles in every mode with the verifier on, and its plan passes the checker
//! and round-trips through serde_json.

use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::testutil::*;
use dmc_compiler::{check_plan, compile, compile_graph, graph_dump, CompileOptions};

fn opts(mode: Mode) -> CompileOptions {
    CompileOptions {
        mode,
        verify: true,
        ..Default::default()
    }
}

#[test]
fn every_fixture_compiles_and_checks_in_every_mode() {
    for opt in [sgd(0.1), sgd_momentum(0.1, 0.9), adam(1e-3)] {
        for (name, m) in small_fixtures(opt) {
            for mode in [Mode::Train, Mode::Eval, Mode::Predict] {
                let plan =
                    compile(&m, &opts(mode)).unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
                check_plan(&plan).unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
                let json = serde_json::to_string(&plan).unwrap();
                let back: Plan = serde_json::from_str(&json).unwrap();
                assert_eq!(back, plan, "{name} {mode:?}: serde round trip");
            }
        }
    }
}

#[test]
fn seed_schedule_lets_gradients_die_early() {
    let p = compile(&seed(), &opts(Mode::Train)).unwrap();
    // Peak bytes of simultaneously live transient buffers: the weight gradients (826 MB in all)
    // never pile up, because each update runs right after its gradient.
    let mut peak = 0u64;
    for s in 0..p.steps.len() {
        let live: u64 = p
            .buffers
            .iter()
            .filter(|b| !b.persistent && b.live.0 <= s && s <= b.live.1)
            .map(|b| b.bytes)
            .sum();
        peak = peak.max(live);
    }
    assert!(peak < 64 << 20, "peak transient bytes {peak}");
}

#[test]
fn eval_and_predict_plans_have_no_backward_no_dropout() {
    for (name, m) in small_fixtures(sgd(0.1)) {
        for mode in [Mode::Eval, Mode::Predict] {
            let p = compile(&m, &opts(mode)).unwrap();
            assert_eq!(p.mode, mode);
            for k in &p.kernels {
                let kind = k.op.kind_name();
                assert!(
                    !kind.ends_with("_bwd") && !kind.contains("bwd_") && kind != "bias_grad",
                    "{name} {mode:?}: {kind}"
                );
                assert!(
                    !kind.contains("update") && kind != "dropout",
                    "{name} {mode:?}: {kind}"
                );
            }
            let has_loss = p
                .kernels
                .iter()
                .any(|k| k.op.kind_name().ends_with("_loss"));
            assert_eq!(has_loss, mode == Mode::Eval, "{name} {mode:?}");
            assert_eq!(
                p.targets.is_empty(),
                mode == Mode::Predict,
                "{name} {mode:?}"
            );
            assert!(p.opt_state.is_empty());
            assert_eq!(p.params.len(), m.params().count());
        }
    }
}

#[test]
fn train_plans_bind_everything() {
    for (name, m) in small_fixtures(adam(1e-3)) {
        let p = compile(&m, &opts(Mode::Train)).unwrap();
        assert_eq!(p.inputs.len(), m.inputs.len(), "{name}");
        assert_eq!(p.targets.len(), m.targets.len(), "{name}");
        assert_eq!(p.params.len(), m.params().count(), "{name}");
        assert_eq!(p.opt_state.len(), 2 * p.params.len(), "{name}");
        assert_eq!(p.buffers[p.loss].bytes, 4);
        assert_eq!(p.output.shape[0], m.train.batch);
        assert_eq!(p.inputs[0].shape[0], m.train.batch);
    }
}

#[test]
fn batch_override() {
    let o = CompileOptions {
        batch: Some(7),
        ..opts(Mode::Train)
    };
    let p = compile(&convnet(sgd(0.1)), &o).unwrap();
    assert_eq!(p.batch, 7);
    assert_eq!(p.inputs[0].shape, vec![7, 12, 12, 3]);
    assert_eq!(p.targets[0].shape, vec![7]);
}

#[test]
fn graph_dump_of_the_residual_forward() {
    let g = compile_graph(&residual(sgd(0.1)), &opts(Mode::Eval)).unwrap();
    insta::assert_snapshot!("residual_eval_ir", graph_dump(&g));
}
