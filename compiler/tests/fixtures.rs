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
fn dump_mlp() {
    let g = compile_graph(&mlp(sgd(0.1)), &opts(Mode::Train)).unwrap();
    println!("{}", graph_dump(&g));
    let p = compile(&mlp(sgd(0.1)), &opts(Mode::Train)).unwrap();
    for s in &p.steps {
        println!("{} {} {:?}", p.kernels[s.kernel].name, s.label, s.args);
    }
}
